import pytest
import torch

from tigon import functional as F
from tigon import nn as TN
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.poly_norm import poly_norm as ref_poly_norm

from _memory import in_place_saving

# The original (PolyCom's layer as Liger's benchmark runs it: fp32 math, cast to the input dtype) and the kernel do the
# same fp32 math and round once: bf16 / fp16 errors agree but for the summation order; 1.1 absorbs that noise.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}
GRADS = ["X", "W", "B"]


def make(shape, dtype, device):
    return dict(X=torch.randn(shape, device=device, dtype=dtype),
                W=(torch.rand(3, device=device) * 0.3 + 0.2).to(dtype), B=torch.randn((), device=device).to(dtype))


def plain_poly_norm(X, W, B, eps=1e-6, in_place=False):
    """PolyCom's layer at the input dtype, no upcast (Liger's test module): the loosest plain-PyTorch baseline."""
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    return W[0] * norm(X ** 3) + W[1] * norm(X ** 2) + W[2] * norm(X) + B


def _assert_close(checks, dtype):
    """assert_close_to_truth, but W's and B's gradients (3 and 1 values) in bf16 / fp16 may be up to two finfo.eps
    (relative) off: every implementation sums them in fp32 from the same rounded upstream gradient and rounds once,
    so they differ by which neighbour a value rounds to, and three values give no error ratio to judge."""
    few = {"grad_W", "grad_B"} if dtype != torch.float32 else set()
    assert all(c.tigon_err <= max(c.bound, 2 * torch.finfo(dtype).eps) for c in checks if c.tensor in few), checks
    assert_close_to_truth([c for c in checks if c.tensor not in few])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 7, 96), (33, 301)])
def test_poly_norm_matches_float64(device, dtype, shape):
    inputs = make(shape, dtype, device)
    checks = compare(F.poly_norm, ref_poly_norm, inputs, GRADS, factor=FACTOR[dtype])
    assert {c.tensor for c in checks} == {"out", "grad_X", "grad_W", "grad_B"}
    _assert_close(checks, dtype)
    if dtype == torch.float32:  # dB = sum(dy) over every element cancels: a few 1e-6 relative, as any fp32 sum
        assert all(c.tigon_err < 5e-6 for c in checks), checks
    else:  # and better than the layer computed at the input dtype
        _assert_close(compare(F.poly_norm, plain_poly_norm, inputs, GRADS), dtype)


@pytest.mark.parametrize("in_place", [False, True])
def test_poly_norm_in_place_and_b_shapes(device, in_place):
    # B may be 0-d (Liger's module) or (1,); in_place changes no value
    inputs = make((5, 3, 50), torch.float32, device)
    for b in (inputs["B"], inputs["B"].reshape(1)):
        checks = compare(lambda **kw: F.poly_norm(**kw, in_place=in_place), ref_poly_norm, dict(inputs, B=b), GRADS)
        assert_close_to_truth(checks)


def _grads(inputs, in_place, tail):
    """X's, W's and B's gradients of ``tail(poly_norm(X, W, B))``, and whether X's gradient is the memory of the
    output's incoming one (dX written over dY: the (..., N) buffer in_place saves)."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items()}
    seen = []
    y = F.poly_norm(**leaves, in_place=in_place)
    y.register_hook(lambda g: seen.append(g.data_ptr()))  # keeps no reference to g
    tail(y).backward()
    return [leaves[k].grad for k in GRADS], leaves["X"].grad.data_ptr() == seen[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_poly_norm_in_place_only_over_an_owned_gradient(device, dtype):
    # Liger's in_place (its default, and Tigon's): dX over dY, but only where nothing else reads dY
    inputs = make((5, 3, 50), dtype, device)
    c = torch.randn(5, 3, 50, device=device, dtype=dtype)
    want, over = _grads(inputs, False, lambda y: (y * c).sum())
    got, over_in_place = _grads(inputs, True, lambda y: (y * c).sum())  # dY: MulBackward's fresh tensor, owned
    assert over_in_place and not over
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # dY shared with r's branch, which runs after this op's backward: never written
    r = torch.randn_like(c, requires_grad=True)
    r2 = r * 1.0
    shared, over_shared = _grads(inputs, True, lambda y: ((y + r2) * c).sum())
    assert not over_shared and all(torch.equal(a, b) for a, b in zip(shared, want)) and torch.equal(r.grad, c)
    # a gradient the caller passes (backward or autograd.grad), or keeps from a hook, is never written
    g = torch.randn_like(c)
    g0 = g.clone()
    x = inputs["X"].clone().requires_grad_()
    F.poly_norm(x, inputs["W"], inputs["B"], in_place=True).backward(g)
    torch.autograd.grad(F.poly_norm(x, inputs["W"], inputs["B"]), x, g)
    kept = []
    y = F.poly_norm(x, inputs["W"], inputs["B"])
    y.register_hook(kept.append)
    (y * c).sum().backward()
    assert torch.equal(g, g0) and torch.equal(kept[0], c)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured with the CUDA allocator's stats")
def test_poly_norm_in_place_saves_one_buffer():
    # the backward's peak is one (M, N) buffer lower with in_place (CPU: the data_ptr check above shows the reuse)
    inputs = make((4096, 1024), torch.bfloat16, "cuda")
    c = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)

    def loss_of(in_place):
        y = F.poly_norm(inputs["X"].clone().requires_grad_(), inputs["W"], inputs["B"], in_place=in_place)
        return (y * c).sum()

    saved = in_place_saving(loss_of)
    buffer = inputs["X"].numel() * inputs["X"].element_size()
    assert buffer * 0.9 <= saved <= buffer * 1.1, (saved, buffer)


def test_poly_norm_non_contiguous_and_not_mutated(device):
    base = make((16, 6, 130), torch.float32, device)
    inputs = dict(base, X=base["X"].transpose(0, 1), W=torch.randn(6, device=device)[::2])
    before = {k: v.clone() for k, v in inputs.items()}
    assert_close_to_truth(compare(F.poly_norm, ref_poly_norm, inputs, GRADS))
    assert all(torch.equal(inputs[k], before[k]) for k in inputs)


def test_poly_norm_strided_weight(device):
    # Found by tests/test_properties.py: a strided W (a view of every other element) was read as if dense. compare()
    # clones its inputs (which makes them dense), so this calls the op on the view itself.
    inputs = make((5, 40), torch.float32, device)
    w = torch.zeros(6, device=device)
    w[::2] = inputs["W"]
    leaves = [inputs["X"].clone().requires_grad_(), w[::2].detach().requires_grad_(), inputs["B"]]
    dense = [inputs["X"].clone().requires_grad_(), inputs["W"].clone().requires_grad_(), inputs["B"]]
    for args in (leaves, dense):
        F.poly_norm(*args).pow(2).sum().backward()
    torch.testing.assert_close(F.poly_norm(*leaves), F.poly_norm(*dense))
    torch.testing.assert_close(leaves[0].grad, dense[0].grad)
    torch.testing.assert_close(leaves[1].grad, dense[1].grad)


def test_poly_norm_several_programs(device, monkeypatch):
    # The backward's persistent grid with several programs (a partial last one): the W / B partial sums of each.
    from tigon.kernels import poly_norm as k

    monkeypatch.setattr(k, "bwd_config", lambda M, block_n, dev: (2, 3, 4))
    for shape in [(11, 100), (2, 5, 40)]:
        assert_close_to_truth(compare(F.poly_norm, ref_poly_norm, make(shape, torch.float32, device), GRADS))


def test_poly_norm_module_matches_liger_layout(device):
    m = TN.PolyNorm()
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
    assert torch.allclose(m.weight.detach(), torch.full((3,), 1 / 3))
    assert m.bias.shape == () and float(m.bias.detach()) == 1.0
    # Liger: True; opt-in here until the CUDA in-place tests pass
    assert m.variance_epsilon == 1e-6 and m.in_place is False
    m = m.to(device)
    x = torch.randn(3, 4, 48, device=device)
    torch.testing.assert_close(m(x), ref_poly_norm(x, m.weight, m.bias))


def test_poly_norm_empty_batch(device):
    leaves = {k: v.requires_grad_() for k, v in make((0, 9), torch.float32, device).items()}
    F.poly_norm(**leaves).sum().backward()
    assert leaves["X"].grad.shape == (0, 9) and leaves["W"].grad.abs().sum() == 0 and leaves["B"].grad == 0


def test_poly_norm_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.poly_norm(**make((3, 8), torch.float32, device))
    assert set(support.backend_usage()["poly_norm"]) == {"triton" if device == "cuda" else "interpreter"}


def test_poly_norm_empty_last_dimension_raises_on_every_path():
    with pytest.raises(ValueError, match="X must have a non-empty last"):
        F.poly_norm(torch.randn(2, 0), torch.ones(3), torch.ones(1))
    with support.force_reference(), pytest.raises(ValueError, match="X must have a non-empty last"):
        F.poly_norm(torch.randn(2, 0), torch.ones(3), torch.ones(1))


def test_poly_norm_bad_input(device):
    x, w, b = torch.randn(2, 8, device=device), torch.ones(3, device=device), torch.tensor(0.5, device=device)
    with pytest.raises(ValueError, match=r"W must have shape \(3,\)"):
        F.poly_norm(x, torch.ones(4, device=device), b)
    with pytest.raises(ValueError, match="W must have 1 dimension"):
        F.poly_norm(x, torch.ones(1, 3, device=device), b)
    with pytest.raises(ValueError, match="B must have exactly one element"):
        F.poly_norm(x, w, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="X must have at least one dimension"):
        F.poly_norm(torch.tensor(1.0, device=device), w, b)
    with pytest.raises(TypeError, match="X must be a floating-point"):
        F.poly_norm(x.long(), w, b)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        F.poly_norm(x, w, b, eps=-1.0)
    with pytest.raises(TypeError, match="in_place must be a bool"):
        F.poly_norm(x, w, b, in_place=1)
    # the kernel path's limit (a CUDA tensor, or a CPU one under the interpreter), as the norms' (norm_forward)
    with pytest.raises(ValueError, match="exceeds the fused-row limit"):
        F.poly_norm(torch.randn(1, 65537, device=device), w, b)


def test_poly_norm_double_backward_raises(device):
    leaves = {k: v.requires_grad_() for k, v in make((4, 8), torch.float32, device).items()}
    (dx,) = torch.autograd.grad(F.poly_norm(**leaves).pow(2).sum(), leaves["X"], create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dx.sum(), leaves["W"])


@pytest.mark.parametrize("prefetch", [True, False])
@pytest.mark.parametrize("one_reduce", [True, False])
def test_poly_norm_backward_paths(device, monkeypatch, prefetch, one_reduce):
    # The backward with and without the next tile prefetched, the four row sums as one tl.reduce (the compiled path)
    # or four tl.sum (the interpreter's), over several programs of several row tiles each (a partial last one),
    # an odd width, a non-contiguous x, and in place over dy (each tile read before it is written, the prefetch
    # reading the next rows first)
    from tigon.kernels import poly_norm as k

    monkeypatch.setattr(k, "BWD_PREFETCH", prefetch)
    monkeypatch.setattr(k, "compiled_cuda", lambda dev: one_reduce)
    monkeypatch.setattr(k, "bwd_config", lambda M, block_n, dev: (2, 3, 4))
    for shape in [(11, 37), (2, 7, 40)]:
        inputs = make(shape, torch.float32, device)
        if len(shape) == 3:
            inputs["X"] = inputs["X"].transpose(0, 1).contiguous().transpose(0, 1)
        checks = compare(F.poly_norm, ref_poly_norm, inputs, GRADS)
        assert_close_to_truth(checks)
        assert all(c.tigon_err < 5e-6 for c in checks), checks
    x = torch.randn(13, 50, device=device)
    w, b = torch.rand(3, device=device) + 0.2, torch.randn((), device=device)
    y, x2, rstd = k.poly_norm_forward(x, w, b, 1e-6)
    dy = torch.randn_like(x)
    dx, dw, db = k.poly_norm_backward(dy.clone(), x2, w, b, rstd, False)
    dy_own = dy.clone()
    dx_in, dw_in, db_in = k.poly_norm_backward(dy_own, x2, w, b, rstd, True)
    assert dx_in.data_ptr() == dy_own.data_ptr()
    torch.testing.assert_close(dx_in, dx, rtol=0, atol=0)
    torch.testing.assert_close((dw_in, db_in), (dw, db), rtol=0, atol=0)
