import pytest
import torch

from tigon import functional as F
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.rms_norm import rms_norm as ref_rms_norm

# bf16/fp16: the original's error is dominated by the final rounding to the output dtype, which Tigon shares;
# factor 1.1 absorbs the sampling noise of a relative-L2 estimate over a few thousand elements.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("casting_mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)])
@pytest.mark.parametrize("shape", [(4, 7, 96), (33, 300)])
def test_rms_norm_matches_float64(device, dtype, casting_mode, offset, shape):
    hidden = shape[-1]
    x = torch.randn(shape, device=device, dtype=dtype) * 3 + 0.5
    w = (torch.rand(hidden, device=device, dtype=dtype) + 0.5)
    inputs = dict(x=x, weight=w, eps=1e-6, offset=offset, casting_mode=casting_mode)
    checks = compare(F.rms_norm, ref_rms_norm, inputs, ["x", "weight"], factor=FACTOR[dtype])
    assert {c.tensor for c in checks} == {"out", "grad_x", "grad_weight"}
    assert_close_to_truth(checks)


def test_rms_norm_reference_is_float64_for_float64_input():
    # Found by tests/test_properties.py: the "llama" and "gemma" casting modes cast x to float32 even for float64 x,
    # so the float64 "truth" of every RMSNorm comparison (the tests, tigon verify) had fp32 precision: a one-column
    # RMSNorm's gradient (an eps term after a cancellation) was 14% off, as torch's fp32 evaluation, which it matched.
    x = torch.tensor([[0.7], [-2.0], [3.1]], dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.2], dtype=torch.float64)
    exact = 1.2 * 1e-5 / (x.detach() ** 2 + 1e-5) ** 1.5  # d/dx of w x / sqrt(x^2 + eps)
    for mode in ("llama", "gemma", "none"):
        (grad,) = torch.autograd.grad(ref_rms_norm(x, w, 1e-5, casting_mode=mode).sum(), x)
        torch.testing.assert_close(grad, exact, rtol=1e-9, atol=0)  # float64's own cancellation: ~1e-11


def test_rms_norm_non_contiguous_and_not_mutated(device):
    base = torch.randn(64, 6, 130, device=device)
    x = base.transpose(0, 1)  # (6, 64, 130), non-contiguous rows
    w = torch.randn(130, device=device)
    before = x.clone()
    checks = compare(F.rms_norm, ref_rms_norm, dict(x=x, weight=w), ["x", "weight"])
    assert_close_to_truth(checks)
    assert torch.equal(x, before)


def test_rms_norm_fp32_weight_bf16_input_promotes(device):
    x = torch.randn(5, 64, device=device, dtype=torch.bfloat16)
    w = torch.randn(64, device=device)
    assert F.rms_norm(x, w).dtype == torch.float32
    assert F.rms_norm(x, w, casting_mode="gemma").dtype == torch.bfloat16


def test_rms_norm_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.rms_norm(torch.randn(3, 8, device=device), torch.ones(8, device=device))
    used = support.backend_usage()["rms_norm"]
    assert set(used) == {"triton" if device == "cuda" else "interpreter"}


@pytest.mark.parametrize("weight", [torch.ones(0), None])
def test_rms_norm_empty_last_dimension_raises_on_every_path(weight):
    # the kernels refused hidden 0 and the reference returned an empty result: one error on both paths now
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        F.rms_norm(torch.randn(2, 0), weight)
    with support.force_reference(), pytest.raises(ValueError, match="x must have a non-empty last"):
        F.rms_norm(torch.randn(2, 0), weight)


def test_rms_norm_bad_input():
    with pytest.raises(ValueError, match=r"x.s last dimension \(8\) must equal weight.s size \(7\)"):
        F.rms_norm(torch.randn(2, 8), torch.ones(7))
    with pytest.raises(ValueError, match="casting_mode"):
        F.rms_norm(torch.randn(2, 8), torch.ones(8), casting_mode="t5")
    with pytest.raises(ValueError, match="x must have at least one dimension"):
        F.rms_norm(torch.tensor(1.0), torch.ones(8))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        F.rms_norm(torch.ones(2, 8, dtype=torch.long), torch.ones(8))
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        F.rms_norm(torch.randn(2, 8), torch.ones(8), eps=-1.0)
    with pytest.raises(TypeError, match="eps must be a real number"):
        F.rms_norm(torch.randn(2, 8), torch.ones(8), eps="a")
    with pytest.raises(ValueError, match="offset must be a finite number"):
        F.rms_norm(torch.randn(2, 8), torch.ones(8), offset=float("nan"))
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        F.layer_norm(torch.randn(2, 8), None, None, eps=float("inf"))


@pytest.mark.parametrize("wide", ["registers", "chunked"])
@pytest.mark.parametrize("casting_mode,offset", [("llama", 0.0), ("gemma", 1.0)])
def test_rms_norm_wide_row_and_many_programs(device, monkeypatch, casting_mode, offset, wide):
    # The backward kernels shared with LayerNorm (tigon.kernels.norm): force the wide-row variants (whole rows without
    # prefetch, column chunks) and, separately, several persistent programs with a partial last one, so every dW
    # reduction is exercised.
    from tigon.kernels import norm

    inputs = dict(x=torch.randn(5, 6, 300, device=device), weight=torch.randn(300, device=device), eps=1e-6,
                  offset=offset, casting_mode=casting_mode)
    monkeypatch.setattr(norm, "WIDE_ROW", 64)  # whole rows without the prefetch
    monkeypatch.setattr(norm, "REGISTER_ROW", 64 if wide == "chunked" else 1 << 20)
    assert_close_to_truth(compare(F.rms_norm, ref_rms_norm, inputs, ["x", "weight"]))
    monkeypatch.setattr(norm, "WIDE_ROW", 1 << 20)
    monkeypatch.setattr(norm, "REGISTER_ROW", 1 << 20)
    monkeypatch.setattr(norm, "rows_per_program", lambda n, dev, target_elems=0: 4)
    monkeypatch.setattr(norm, "num_programs_hint", lambda dev: 3)
    assert_close_to_truth(compare(F.rms_norm, ref_rms_norm, inputs, ["x", "weight"]))


@pytest.mark.parametrize("hold", [0, 2])
def test_rms_norm_weight_held_in_fp32_or_reread(device, monkeypatch, hold):
    # _norm_bwd's W_HOLD variants of whole rows without the prefetch (the weight row held in fp32 + offset, or
    # re-read every row; rows of 16384 re-read it by default), in fp32 with Gemma's offset and bf16.
    from tigon.kernels import norm

    monkeypatch.setattr(norm, "W_HOLD", hold)
    monkeypatch.setattr(norm, "W_HOLD_ROW", 512)  # the rows below: 300 elements, a 512-wide block
    monkeypatch.setattr(norm, "WIDE_ROW", 64)
    for dtype, offset in ((torch.float32, 1.0), (torch.bfloat16, 0.0)):
        inputs = dict(x=torch.randn(7, 300, device=device, dtype=dtype),
                      weight=torch.randn(300, device=device, dtype=dtype), eps=1e-6, offset=offset,
                      casting_mode="gemma" if offset else "llama")
        assert_close_to_truth(compare(F.rms_norm, ref_rms_norm, inputs, ["x", "weight"]))
