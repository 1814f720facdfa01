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


def test_sparsemax_wide_rows_chunked(device, monkeypatch):
    # rows wider than the register path (forced small): one program a row, the bisection over column chunks
    from tigon.kernels import softmax as k

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
