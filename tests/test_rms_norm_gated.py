"""Gated RMSNorm (tigon.functional.rms_norm_gated) against transformers' Qwen3NextRMSNormGated ("llama" casting) and
FalconH1RMSNormGated ("gemma"): output and every gradient (x, gate, weight) in fp32 and bf16, error no worse than
HF's own against float64; odd width, non-contiguous x and gate, bad input."""

import pytest
import torch

from tigon import functional as F
from tigon.numerics import assert_close_to_truth, compare


def hf_norm(module: str, cls: str, weight: torch.Tensor):
    """``original(x, gate, weight, ...)`` running the HF module with ``weight`` as its parameter (a float64 copy for
    the truth), so compare() gets HF's gradient of the weight too."""
    mod = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    norm = getattr(mod, cls)(weight.shape[0], eps=1e-6)

    def original(x, gate, weight, eps, offset, casting_mode):
        norm.weight = weight if isinstance(weight, torch.nn.Parameter) else None
        if norm.weight is None:  # a plain tensor (requires grad): keep its graph
            del norm.weight
            norm.weight = weight
        return norm(x, gate)

    return original


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("module, cls, mode", [("qwen3_next", "Qwen3NextRMSNormGated", "llama"),
                                               ("falcon_h1", "FalconH1RMSNormGated", "gemma")],
                         ids=["qwen3_next", "falcon_h1"])
def test_rms_norm_gated_matches_hf(device, dtype, module, cls, mode):
    x = (torch.randn(5, 3, 41, device=device) * 3 + 0.5).to(dtype).transpose(0, 1)  # (3, 5, 41), non-contiguous
    gate = (torch.randn(3, 5, 41, device=device) * 2).to(dtype)
    weight = (torch.rand(41, device=device) + 0.5).to(dtype)
    inputs = dict(x=x, gate=gate, weight=weight, eps=1e-6, offset=0.0, casting_mode=mode)
    # verify's rule (factor 2): the weight gradient's error over 15 rows of 41 is a noisy estimate (on 256 x 64 rows
    # Tigon's bf16 errors are 0.6-0.8x HF's for every tensor, dW included)
    checks = compare(F.rms_norm_gated, hf_norm(module, cls, weight), inputs, ["x", "gate", "weight"],
                     factor=1.0 if dtype == torch.float32 else 2.0)
    assert {c.tensor for c in checks} == {"out", "grad_x", "grad_gate", "grad_weight"}
    assert_close_to_truth(checks)


def test_rms_norm_gated_bad_input(device):
    x, w = torch.randn(4, 8, device=device), torch.ones(8, device=device)
    with pytest.raises(ValueError, match="gate must have x's shape"):
        F.rms_norm_gated(x, torch.randn(4, 7, device=device), w)
    with pytest.raises(TypeError, match="gate"):
        F.rms_norm_gated(x, torch.ones(4, 8, dtype=torch.int32, device=device), w)
    with pytest.raises(ValueError, match="weight's size"):
        F.rms_norm_gated(x, x, torch.ones(7, device=device))
    with pytest.raises(ValueError, match="casting_mode"):
        F.rms_norm_gated(x, x, w, casting_mode="fp8")
