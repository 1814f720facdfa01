import pytest
import torch

from tigon import functional as F
from tigon import nn as TN
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference import dyt as ref

# bf16/fp16: the kernel rounds once (the output; each gradient once), the plain DyT module at least three times
# (alpha * x, tanh, the product, the sum), so it is usually clearly better; dbeta = sum(dy) is rounded once by both
# (to the parameter's dtype), equal up to the summation order: 1.1 absorbs that.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}
GRADS = ["x", "alpha", "gamma", "beta"]


def make(shape, dtype, device, beta=True):
    n = shape[-1]
    return dict(x=torch.randn(shape, device=device, dtype=dtype) * 3 + 0.5,
                alpha=(torch.rand(1, device=device) * 0.5 + 0.3).to(dtype),
                gamma=(torch.rand(n, device=device) + 0.5).to(dtype),
                beta=(torch.randn(n, device=device) * 0.5).to(dtype) if beta else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 7, 96), (33, 301)])
def test_dyt_matches_float64(device, dtype, shape):
    inputs = make(shape, dtype, device)
    checks = compare(F.dyt, ref.dyt_original, inputs, GRADS, factor=FACTOR[dtype])
    assert {c.tensor for c in checks} == {"out"} | {f"grad_{g}" for g in GRADS}
    assert_close_to_truth(checks)
    if dtype == torch.float32:  # the policy's fp32 bar: dalpha sums x * dy over every element (a few 1e-6 on a GPU)
        assert all(c.tigon_err < 1e-5 for c in checks), checks


def test_dyt_without_beta(device):
    inputs = make((5, 3, 50), torch.float32, device, beta=False)
    checks = compare(F.dyt, ref.dyt_original, inputs, ["x", "alpha", "gamma"])
    assert {c.tensor for c in checks} == {"out", "grad_x", "grad_alpha", "grad_gamma"}
    assert_close_to_truth(checks)


def test_dyt_mixed_dtypes_and_scalar_alpha(device):
    # bf16 activations with fp32 parameters (a bf16 autocast model's weights): the output stays in x's dtype, as
    # Liger's; each gradient comes back in its parameter's dtype. A 0-d alpha is taken as the (1,) one.
    inputs = make((6, 40), torch.float32, device)
    x = inputs["x"].to(torch.bfloat16).requires_grad_()
    alpha, gamma, beta = (inputs[k].clone().requires_grad_() for k in ("alpha", "gamma", "beta"))
    y = F.dyt(x, alpha, gamma, beta)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and alpha.grad.dtype == gamma.grad.dtype == beta.grad.dtype == torch.float32
    assert alpha.grad.shape == (1,)
    a0 = inputs["alpha"].reshape(()).requires_grad_()
    y0 = F.dyt(inputs["x"], a0, inputs["gamma"], inputs["beta"])
    torch.testing.assert_close(y0, ref.dyt(inputs["x"], inputs["alpha"], inputs["gamma"], inputs["beta"]))
    y0.sum().backward()
    assert a0.grad.shape == ()


def test_dyt_non_contiguous_and_not_mutated(device):
    base = make((16, 6, 130), torch.float32, device)
    inputs = dict(base, x=base["x"].transpose(0, 1), gamma=torch.randn(2 * 130, device=device)[::2])
    before = {k: v.clone() for k, v in inputs.items()}
    assert_close_to_truth(compare(F.dyt, ref.dyt_original, inputs, GRADS))
    assert all(torch.equal(inputs[k], before[k]) for k in inputs)


def test_dyt_strided_parameters(device):
    # gamma and beta views of every other element (compare() clones its inputs dense, so the op gets the views here)
    inputs = make((5, 40), torch.float32, device)
    buf = torch.zeros(2, 80, device=device)
    buf[0, ::2], buf[1, ::2] = inputs["gamma"], inputs["beta"]
    strided = dict(inputs, gamma=buf[0, ::2], beta=buf[1, ::2])
    torch.testing.assert_close(F.dyt(**strided), F.dyt(**inputs))


def test_dyt_several_programs_and_column_blocks(device, monkeypatch):
    # The backward's persistent grid with several row programs (a partial last one) each walking several column
    # chunks (and prefetching past its last row), so every partial column (dgamma, dbeta, dalpha) sums more than one
    # program; small forward tiles too.
    from tigon.kernels import dyt, elementwise

    monkeypatch.setattr(dyt, "bwd_config", lambda M, N, dev: (2, 3, 4, 32))
    monkeypatch.setattr(elementwise, "tile_elems", lambda dev: 64)
    for shape in [(11, 100), (2, 5, 40)]:
        assert_close_to_truth(compare(F.dyt, ref.dyt_original, make(shape, torch.float32, device), GRADS))


def test_dyt_module_matches_liger_layout(device):
    m = TN.DyT(48)
    assert [n for n, _ in m.named_parameters()] == ["alpha", "gamma", "beta"]
    assert m.alpha.shape == (1,) and float(m.alpha.detach()) == 0.5 and torch.equal(m.gamma, torch.ones(48))
    assert torch.equal(m.beta, torch.zeros(48))
    m2 = TN.DyT(48, beta=False, init_alpha=1.5)
    assert m2.beta is None and float(m2.alpha.detach()) == 1.5 and "beta=False" in repr(m2)
    m = m.to(device)
    x = torch.randn(3, 4, 48, device=device)
    torch.testing.assert_close(m(x), ref.dyt(x, m.alpha, m.gamma, m.beta))


def test_dyt_empty_batch(device):
    inputs = make((0, 9), torch.float32, device)
    leaves = {k: v.requires_grad_() for k, v in inputs.items()}
    F.dyt(**leaves).sum().backward()
    assert leaves["x"].grad.shape == (0, 9) and leaves["alpha"].grad.abs().sum() == 0
    assert leaves["gamma"].grad.abs().sum() == 0 and leaves["beta"].grad.abs().sum() == 0


def test_dyt_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.dyt(**make((3, 8), torch.float32, device))
    assert set(support.backend_usage()["dyt"]) == {"triton" if device == "cuda" else "interpreter"}


def test_dyt_empty_last_dimension_raises_on_every_path():
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        F.dyt(torch.randn(2, 0), torch.ones(1), torch.ones(0), None)
    with support.force_reference(), pytest.raises(ValueError, match="x must have a non-empty last"):
        F.dyt(torch.randn(2, 0), torch.ones(1), torch.ones(0), None)


def test_dyt_bad_input():
    x, a, g, b = torch.randn(2, 8), torch.ones(1), torch.ones(8), torch.zeros(8)
    with pytest.raises(ValueError, match=r"alpha must have exactly one element"):
        F.dyt(x, torch.ones(2), g, b)
    with pytest.raises(ValueError, match=r"gamma must have shape \(8,\)"):
        F.dyt(x, a, torch.ones(7), b)
    with pytest.raises(ValueError, match=r"beta must have shape \(8,\)"):
        F.dyt(x, a, g, torch.zeros(9))
    with pytest.raises(ValueError, match="gamma must have 1 dimension"):
        F.dyt(x, a, torch.ones(1, 8), b)
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        F.dyt(torch.tensor(1.0), a, g, b)
    with pytest.raises(TypeError, match="x must be a floating-point"):
        F.dyt(x.long(), a, g, b)
    with pytest.raises(TypeError, match="beta must be a torch.Tensor"):
        F.dyt(x, a, g, 0.0)
    with pytest.raises(TypeError, match="alpha must be a torch.Tensor"):
        F.dyt(x, 0.5, g, b)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'beta'"):
        F.dyt(x, a, g)  # as Liger's liger_dyt: beta is required (None for none)


def test_dyt_double_backward_raises(device):
    leaves = {k: v.requires_grad_() for k, v in make((4, 8), torch.float32, device).items()}
    (dx,) = torch.autograd.grad(F.dyt(**leaves).pow(2).sum(), leaves["x"], create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dx.sum(), leaves["gamma"])


def test_dyt_issues_only_its_kernels(device, kernel_count):
    # the forward is 1 Triton launch, the backward 2 (the pass over x and dy, the partial rows' sum into dalpha, dgamma
    # and dbeta), and no ATen operation runs a kernel (before: dalpha's sum and cast, 2 more)
    from tigon.kernels import dyt as k

    kernel_count.stub(k, "_dyt_fwd", "_dyt_bwd", "_sum_segments")
    inputs = make((6, 40), torch.bfloat16, device)
    leaves = [t.requires_grad_() for t in inputs.values()]
    with kernel_count as c:
        y = F.dyt(**inputs)
    assert (c.launches, c.aten) == (["_dyt_fwd"], [])
    dy = torch.ones_like(y)
    with kernel_count as c:
        torch.autograd.grad(y, leaves, dy)
    assert (c.launches, c.aten) == (["_dyt_bwd", "_sum_segments"], [])


@pytest.mark.parametrize("evict", ["", "evict_first"])
def test_dyt_backward_grid_of_row_ranges_and_column_chunks(device, monkeypatch, evict):
    # The backward's 2-D grid: several row ranges (a partial last one, rows spanning several programs) times column
    # chunks (odd N, a partial last chunk); BLOCK_N of 2 is raised so that the dalpha partials of a row range (one a
    # chunk) fit one slab of the partial sum (N = 100: 25 chunks of 4). A transposed (non-contiguous) x; negative and
    # zero alpha (sign(alpha) folded into gamma's factors); the streaming hints (no-ops in the interpreter).
    from tigon.kernels import dyt

    monkeypatch.setattr(dyt, "BWD_EVICT", evict)
    for block_n, progs in [(2, 200), (32, 8), (64, 3)]:
        monkeypatch.setattr(dyt, "bwd_config", lambda M, N, dev, b=block_n, p=progs: (2, p, 4, b))
        for shape, alpha in [((11, 100), 0.7), ((3, 5, 33), -0.4), ((6, 37), 0.0)]:
            inputs = make(shape, torch.float32, device)
            inputs["alpha"] = torch.full((1,), alpha, device=device)
            if len(shape) == 3:
                inputs["x"] = inputs["x"].transpose(0, 1).contiguous().transpose(0, 1)
            checks = compare(F.dyt, ref.dyt_original, inputs, GRADS)
            assert_close_to_truth(checks)
            if alpha != 0.0:
                assert all(c.tigon_err < 1e-5 for c in checks), checks


def test_dyt_module_constructor_checks():
    # hidden_size -2 / True failed inside torch ("negative dimension", "must be tuple of ints"), 0 built an empty
    # module; init_alpha NaN / inf made every output NaN, True was taken for 1.0; beta=1 for True
    for bad, error in ((0, ValueError), (-2, ValueError), (True, TypeError), (4.0, TypeError)):
        with pytest.raises(error, match="hidden_size must be a positive int"):
            TN.DyT(bad)
    for bad, error in ((float("nan"), ValueError), (float("inf"), ValueError), (True, TypeError)):
        with pytest.raises(error, match="init_alpha must be a"):
            TN.DyT(4, init_alpha=bad)
    with pytest.raises(TypeError, match="beta must be a bool"):
        TN.DyT(4, beta=1)
    assert TN.DyT(4, False, 2).alpha.item() == 2.0
