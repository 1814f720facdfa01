import pytest
import torch

from tigon import functional as F
from tigon import nn as TN
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.sparsemax import sparsemax as ref_sparsemax


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 37), (2, 1)])
def test_sparsemax_matches_float64(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 2
    checks = compare(F.sparsemax, ref_sparsemax, dict(input=x), ["input"])
    assert {c.tensor for c in checks} == {"out", "grad_input"}
    assert_close_to_truth(checks)


def test_sparsemax_is_the_simplex_projection(device):
    # rows sum to 1, are sparse, equal the sort-based tau exactly in fp32 terms; ties and a one-hot row included
    x = torch.tensor([[0.1, 0.1, 0.1, 0.1], [5.0, 0.0, -1.0, 2.0], [0.3, 0.2, 0.9, 0.9]], device=device)
    y = F.sparsemax(x)
    torch.testing.assert_close(y, ref_sparsemax(x.double()).float(), rtol=0, atol=1e-7)
    torch.testing.assert_close(y.sum(-1), torch.ones(3, device=device))
    assert torch.equal(y[1], torch.tensor([1.0, 0.0, 0.0, 0.0], device=device))


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_sparsemax_dim_and_strided_input(device, dim):
    base = torch.randn(6, 5, 8, device=device)
    x = base[::2].transpose(1, 2)  # (3, 8, 5), non-contiguous
    before = x.clone()
    support.backend_usage(reset=True)
    assert_close_to_truth(compare(lambda input: F.sparsemax(input, dim), lambda input: ref_sparsemax(input, dim),
                                  dict(input=x), ["input"]))
    assert set(support.backend_usage()["sparsemax"]) == {"triton" if device == "cuda" else "interpreter"}
    assert torch.equal(x, before)
    assert TN.Sparsemax(dim)(x).shape == x.shape and "dim=" in repr(TN.Sparsemax(dim))


@pytest.mark.parametrize("top2", [False, True], ids=["max_start", "top2_start"])
def test_sparsemax_wide_rows_chunked(device, monkeypatch, top2):
    # rows wider than the register path (forced small): one program a row, the bisection over column chunks; from
    # max - 1 and from the top two's bound (START_TOP2)
    from tigon.kernels import softmax as k
    from tigon.kernels import sparsemax as ks

    monkeypatch.setattr(ks, "START_TOP2", top2)
    monkeypatch.setattr(k, "REGISTER_ROW", 8)
    monkeypatch.setattr(k, "WIDE_CHUNK", 8)
    x = torch.randn(2, 21, device=device) * 3
    assert_close_to_truth(compare(F.sparsemax, ref_sparsemax, dict(input=x), ["input"]))


def test_sparsemax_bad_input(device):
    x = torch.randn(2, 3, device=device)
    with pytest.raises(ValueError, match=r"dim must be in \[-2, 2\)"):
        F.sparsemax(x, 2)
    with pytest.raises(TypeError, match="dim must be an int"):
        F.sparsemax(x, 1.0)
    with pytest.raises(TypeError, match="input must be a floating-point tensor"):
        F.sparsemax(x.long())
    with pytest.raises(ValueError, match="at least one dimension"):
        F.sparsemax(x[0, 0])
    with pytest.raises(ValueError, match="must be non-empty"):
        F.sparsemax(x[:, :0])


# Rows that stress the forward's stopping rule (Michelot's step from max - 1 until the support stops shrinking; see
# tigon.kernels.sparsemax). Each family runs in registers and, with REGISTER_ROW forced small, on the chunked path.
def _special_rows(device):
    g = torch.Generator().manual_seed(0)
    rows = {}
    # ties at tau: support {1.25, 0.75}, tau = 0.5 exactly, and copies of 0.5 (y = 0 there); ties inside the support
    rows["ties_at_tau"] = torch.tensor([[1.25, 0.5, 0.75, 0.5, 0.5, -2.0, 0.5],
                                        [1.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5],
                                        [0.3, 0.3, 0.3, -1.0, 0.3, -1.0, 0.3]])
    # many values within 1e-7 of tau (above and below): the support's edge is a cloud of near-ties
    base = torch.randn(4, 61, generator=g, dtype=torch.float64) * 2
    tau = _tau64(base)
    near = tau[:, None] + (torch.rand(4, 60, generator=g, dtype=torch.float64) * 2 - 1) * 1e-7
    rows["near_tau"] = torch.cat([base, near], 1)
    # one huge value (support of size 1), also where the runner-up sits exactly at max - 1
    huge = torch.randn(3, 45, generator=g, dtype=torch.float64).clamp(-3, 1.5)
    huge[0, 7], huge[1, 0], huge[2, 44] = 1e4, 50.0, 3.0
    huge[2, 3] = 2.0
    rows["one_huge"] = huge
    # constant rows: the support is the whole row, y = 1 / N
    rows["constant"] = torch.cat([torch.full((1, 37), 0.25), torch.full((1, 37), -3.0), torch.zeros(1, 37)])
    # -inf padding (masked positions), odd width, a row with a single finite value
    pad = torch.randn(3, 53, generator=g, dtype=torch.float64) * 3
    pad[0, 40:] = float("-inf")
    pad[1, ::2] = float("-inf")
    pad[2, :] = float("-inf")
    pad[2, 17] = -5.0
    rows["neg_inf_padding"] = pad
    # near-uniform and spread-out rows: large supports (many passes) and supports of one or two
    rows["scale_0.01"] = torch.randn(2, 301, generator=g, dtype=torch.float64) * 0.01
    rows["scale_30"] = torch.randn(2, 301, generator=g, dtype=torch.float64) * 30
    return {k: v.float().to(device) for k, v in rows.items()}


def _tau64(x):
    zs = torch.sort(x.double(), dim=-1, descending=True).values
    cs = zs.cumsum(-1)
    k = torch.arange(1, x.shape[-1] + 1, dtype=torch.float64)
    kz = (1 + k * zs > cs).sum(-1, keepdim=True)
    return ((cs.gather(-1, kz - 1) - 1) / kz).squeeze(-1)


@pytest.mark.parametrize("top2", [False, True], ids=["max_start", "top2_start"])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("case", ["ties_at_tau", "near_tau", "one_huge", "constant", "neg_inf_padding",
                                  "scale_0.01", "scale_30"])
def test_sparsemax_exact_on_hard_rows(device, monkeypatch, case, chunked, top2):
    # (top2: Michelot's loop started from the top two values' bound, START_TOP2, rather than max - 1)
    from tigon.kernels import softmax as k
    from tigon.kernels import sparsemax as ks

    monkeypatch.setattr(ks, "START_TOP2", top2)
    if chunked:
        monkeypatch.setattr(k, "REGISTER_ROW", 16)
        monkeypatch.setattr(k, "WIDE_CHUNK", 16)
    x = _special_rows(device)[case]
    y = F.sparsemax(x)
    truth = ref_sparsemax(x.double())
    # tau as the sort-based Algorithm 1's up to fp32 rounding: the error of y is that of tau, a few ulps of x
    atol = 4 * torch.finfo(torch.float32).eps * max(1.0, x[x.isfinite()].abs().max().item())
    torch.testing.assert_close(y.double(), truth, rtol=0, atol=atol)
    torch.testing.assert_close(y.double().sum(-1), torch.ones(x.shape[0], dtype=torch.float64, device=device), rtol=0,
                               atol=1e-5)
    assert (y >= 0).all()
    if case == "ties_at_tau":  # the ties sit at y = 0 exactly; the support's ties share one value
        assert torch.equal(y[0], torch.tensor([0.75, 0, 0.25, 0, 0, 0, 0], device=device))
        assert torch.equal(y[1], torch.tensor([1.0, 0, 0, 0, 0, 0, 0], device=device))
    if case == "one_huge":
        assert torch.equal(y, torch.nn.functional.one_hot(x.argmax(-1), x.shape[-1]).float())
    if case == "constant":
        torch.testing.assert_close(y, torch.full_like(y, 1 / 37), rtol=0, atol=atol)  # x - tau: x rounds to ulp(3)
    if case == "neg_inf_padding":
        assert (y[x == float("-inf")] == 0).all() and y[2, 17] == 1
    assert_close_to_truth(compare(F.sparsemax, ref_sparsemax, dict(input=x), ["input"]))


@pytest.mark.parametrize("top2", [False, True], ids=["max_start", "top2_start"])
@pytest.mark.parametrize("N", [4097, 32000])
def test_sparsemax_wide_logits(device, monkeypatch, N, top2):
    # rows of a vocabulary (register path up to 32768), bf16 logits at scales 1 and 10; from max - 1 and from the
    # top two's bound (START_TOP2)
    from tigon.kernels import sparsemax as ks

    monkeypatch.setattr(ks, "START_TOP2", top2)
    x = torch.randn(2, N, device=device) * torch.tensor([[1.0], [10.0]], device=device)
    assert_close_to_truth(compare(F.sparsemax, ref_sparsemax, dict(input=x.bfloat16()), ["input"]))
    # tau up to fp32 rounding, a few ulps of the largest logit (|x| ~ 40 at scale 10): the hard rows' bound; the CUDA
    # kernel's reduction order differs from the interpreter's, so 1e-6 absolute held on the CPU only
    atol = 4 * torch.finfo(torch.float32).eps * x.abs().max().item()
    torch.testing.assert_close(F.sparsemax(x).double(), ref_sparsemax(x.double()), rtol=0, atol=atol)


# ---- rows of non-finite or far-offset values ------------------------------------------------------------------------
_NAN, _INF = float("nan"), float("inf")


@pytest.mark.parametrize("chunked", [False, True], ids=["registers", "chunked"])
@pytest.mark.parametrize("path", ["kernel", "reference"])
def test_sparsemax_non_finite_rows_give_nan_as_softmax(device, monkeypatch, path, chunked):
    # a NaN, a +inf or an all -inf row is NaN throughout, as torch.softmax's (the kernel dropped a NaN as if it were
    # -inf and gave 0 or 1 for the rest; the reference's Algorithm 1 found an empty support and gathered at index -1,
    # a RuntimeError on the CPU, a device assert on CUDA); -inf entries beside finite ones are plain zeros
    from tigon.kernels import softmax as k

    if chunked:
        monkeypatch.setattr(k, "REGISTER_ROW", 2)
        monkeypatch.setattr(k, "WIDE_CHUNK", 2)
    x = torch.tensor([[_NAN, 1.0, 2.0], [1.0, _NAN, 2.0], [_INF, 1.0, 2.0], [-_INF, -_INF, -_INF],
                      [-_INF, 1.0, 2.0], [0.5, 0.25, 0.0]], device=device)
    y = (F.sparsemax if path == "kernel" else ref_sparsemax)(x)
    assert torch.isnan(y[:4]).all(), y
    torch.testing.assert_close(y[4:], ref_sparsemax(x[4:].double()).float(), rtol=0, atol=1e-7)
    assert torch.equal(y[4], torch.tensor([0.0, 0.0, 1.0], device=device))


@pytest.mark.parametrize("chunked", [False, True], ids=["registers", "chunked"])
@pytest.mark.parametrize("offset", [3000.0, 1e30])
def test_sparsemax_is_shift_invariant(device, monkeypatch, offset, chunked):
    # sparsemax(x + c) = sparsemax(x): rows far from 0 are projected relative to their max (x - max exact there), so
    # fp32 keeps its 1e-5 (at c = 3000 the kernel was 8e-5 off, the fp32 reference 2e-4; at 1e30 both gave zeros or
    # crashed: the float64 Algorithm 1 as well, 1 + z_(1) == z_(1); there fp32 rows are all equal: uniform)
    from tigon.kernels import softmax as k

    if chunked:
        monkeypatch.setattr(k, "REGISTER_ROW", 8)
        monkeypatch.setattr(k, "WIDE_CHUNK", 8)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 33, generator=g) * 0.5
    x = (z.double() + offset).float().to(device)
    want = ref_sparsemax((x.double() - x.double().amax(-1, keepdim=True)).cpu())
    for fn in (F.sparsemax, ref_sparsemax):
        y = fn(x).double().cpu()
        assert (y - want).abs().max() < 1e-6, fn
        torch.testing.assert_close(y.sum(-1), torch.ones(4, dtype=torch.float64), rtol=0, atol=2e-6)
