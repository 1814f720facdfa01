import pytest
import torch

from tigon import functional as F
from tigon import nn as TN
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.softmax import softmax as ref_softmax

# bf16/fp16: torch's softmax computes in fp32 and rounds once, as the kernel does; they differ by the exp and the
# summation order only. 1.1 absorbs the sampling noise of a relative-L2 estimate over a few thousand elements.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}
# A row of all -inf is 0/0 by design (NaN, as torch's); the interpreter's numpy warns about it.
NAN_ROW = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 7, 96), (33, 301), (5, 1)])
def test_softmax_matches_float64(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    checks = compare(F.softmax, ref_softmax, dict(x=x), ["x"], factor=FACTOR[dtype])
    assert {c.tensor for c in checks} == {"out", "grad_x"}
    assert_close_to_truth(checks)
    if dtype == torch.float32:
        assert all(c.tigon_err < 1e-6 for c in checks), checks


@NAN_ROW
@pytest.mark.parametrize("chunk", [16, 64])
def test_softmax_wide_rows_chunked(device, monkeypatch, chunk):
    # The chunked kernels (one row a program, an online max / sum), forced on small rows: a partial last chunk, a row
    # whose max comes late, -inf entries, and a row of all -inf (NaN, as torch).
    from tigon.kernels import softmax as k

    monkeypatch.setattr(k, "REGISTER_ROW", 8)
    monkeypatch.setattr(k, "WIDE_CHUNK", chunk)
    x = torch.randn(6, 150, device=device) * 3
    x[1, 140:] += 20.0
    x[2, ::3] = float("-inf")
    assert_close_to_truth(compare(F.softmax, ref_softmax, dict(x=x), ["x"]))
    assert_close_to_truth(compare(F.softmax, ref_softmax, dict(x=x.to(torch.bfloat16)), ["x"],
                                  factor=FACTOR[torch.bfloat16]))
    x[3] = float("-inf")
    torch.testing.assert_close(F.softmax(x), ref_softmax(x), equal_nan=True)


@NAN_ROW
def test_softmax_masked_entries_and_extremes(device):
    # -inf logits (an attention mask) get probability 0; a row of all -inf gives NaN as torch's; huge logits do not
    # overflow (the max is subtracted first).
    x = torch.randn(5, 40, device=device)
    x[0, :30] = float("-inf")
    x[1] = float("-inf")
    x[2, 7] = 1e30
    x[3] *= 1e4
    torch.testing.assert_close(F.softmax(x), ref_softmax(x), equal_nan=True)
    keep = torch.tensor([0, 2, 3, 4])
    assert_close_to_truth(compare(F.softmax, ref_softmax, dict(x=x[keep]), ["x"]))


def test_softmax_non_contiguous_and_not_mutated(device):
    base = torch.randn(16, 6, 130, device=device) * 2
    for x in (base.transpose(0, 1), base[..., 3:-2], base.transpose(1, 2)):  # strided rows; a strided last dim
        before = x.clone()
        assert_close_to_truth(compare(F.softmax, ref_softmax, dict(x=x), ["x"]))
        assert torch.equal(x, before)


def test_softmax_shift_invariance_and_module(device):
    x = torch.randn(7, 33, device=device)
    torch.testing.assert_close(F.softmax(x + 100.0), F.softmax(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(F.softmax(x).sum(-1), torch.ones(7, device=device))
    m = TN.Softmax()
    assert list(m.parameters()) == []
    xb = x.to(torch.bfloat16)
    torch.testing.assert_close(m(xb), ref_softmax(xb))


def test_softmax_empty_batch(device):
    x = torch.randn(0, 9, device=device, requires_grad=True)
    F.softmax(x).sum().backward()
    assert x.grad.shape == (0, 9)


def test_softmax_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.softmax(torch.randn(3, 8, device=device))
    assert set(support.backend_usage()["softmax"]) == {"triton" if device == "cuda" else "interpreter"}


def test_softmax_bad_input():
    with pytest.raises(TypeError, match="x must be a floating-point"):
        F.softmax(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(ValueError, match="x must have a non-empty last dimension"):
        F.softmax(torch.tensor(1.0))
    with pytest.raises(ValueError, match="x must have a non-empty last dimension"):
        F.softmax(torch.ones(3, 0))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        F.softmax([1.0])


def test_softmax_double_backward_raises(device):
    x = torch.randn(4, 8, device=device, requires_grad=True)
    (dx,) = torch.autograd.grad((F.softmax(x) * torch.arange(8.0, device=device)).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dx.sum(), x)
