"""GPT-OSS's clamped SwiGLU (tigon.functional.clamped_swiglu) against transformers' GptOssExperts._apply_gate: fp32
and bf16 (error no worse than HF's own against float64), values on and beyond the clamp (the gradient at exactly
+-limit passes, as torch.clamp's does), odd sizes, non-contiguous input, bad input."""

from types import SimpleNamespace

import pytest
import torch

from tigon import functional as F
from tigon.numerics import assert_close_to_truth, compare


def hf_gate(alpha=1.702, limit=7.0):
    mod = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
    experts = SimpleNamespace(alpha=alpha, limit=limit)
    return lambda gate_up, alpha, limit: mod.GptOssExperts._apply_gate(experts, gate_up)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_clamped_swiglu_matches_gpt_oss(device, dtype):
    gate_up = (torch.randn(3, 5, 2 * 9, device=device) * 5).to(dtype)  # I = 9, a share beyond +-7
    gate_up[0, 0, :4] = torch.tensor([7.0, 7.0, 8.0, -7.0])  # on the clamps (gate, up) and beyond (gate)
    inputs = dict(gate_up=gate_up, alpha=1.702, limit=7.0)
    assert_close_to_truth(compare(F.clamped_swiglu, hf_gate(), inputs, ["gate_up"]))


def test_clamped_swiglu_strided_and_other_constants(device):
    """A transposed (non-contiguous) gate_up, another alpha / limit, and a last dim read with stride 2 (copied)."""
    gate_up = torch.randn(5, 4, 2 * 7, device=device).transpose(0, 1) * 3
    inputs = dict(gate_up=gate_up, alpha=1.0, limit=2.5)
    assert_close_to_truth(compare(F.clamped_swiglu, hf_gate(1.0, 2.5), inputs, ["gate_up"]))
    wide = torch.randn(6, 2 * 2 * 5, device=device)[:, ::2]
    inputs = dict(gate_up=wide, alpha=1.702, limit=7.0)
    assert_close_to_truth(compare(F.clamped_swiglu, hf_gate(), inputs, ["gate_up"]))


def test_clamped_swiglu_bad_input(device):
    x = torch.randn(4, 6, device=device)
    with pytest.raises(ValueError, match="gate_up's last dimension must be even"):
        F.clamped_swiglu(torch.randn(4, 5, device=device))
    with pytest.raises(TypeError, match="gate_up"):
        F.clamped_swiglu(torch.ones(4, 6, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="limit must be positive and finite"):
        F.clamped_swiglu(x, limit=0.0)
    with pytest.raises(ValueError, match="alpha must be finite"):
        F.clamped_swiglu(x, alpha=float("nan"))
    with pytest.raises(TypeError, match="alpha must be a real number"):
        F.clamped_swiglu(x, alpha=torch.tensor(1.0))
