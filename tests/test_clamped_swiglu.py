"""GPT-OSS's clamped SwiGLU (tigon.functional.clamped_swiglu) against transformers' GptOssExperts._apply_gate: fp32
and bf16 (error no worse than HF's own against float64), values on and beyond the clamp (the gradient at exactly
+-limit passes, as torch.clamp's does), odd sizes, non-contiguous input, bad input."""

from types import SimpleNamespace

import pytest
import torch

from tigon import functional as F
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference import glu as ref


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


# ---- DeepSeek-V4's clamped SwiGLU: tigon.functional.swiglu / glu_linear with limit= -----------------------------
def hf_v4_gate():
    """transformers' DeepseekV4Experts._apply_gate (the chunked halves clamped, then act_fn(gate) * up: the same
    formula as DeepseekV4MLP.forward on its projections' outputs), taking swiglu's (gate, up, limit)."""
    mod = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

    def original(gate, up, limit):
        experts = SimpleNamespace(limit=limit, act_fn=torch.nn.SiLU())
        return mod.DeepseekV4Experts._apply_gate(experts, torch.cat([gate, up], dim=-1))
    return original


def on_the_clamps(shape, dtype, device, limit=7.0, std=5.0):
    """gate, up with std 5 (a share beyond +-limit) and values exactly on the clamps and just beyond them."""
    gate = (torch.randn(shape, device=device) * std).to(dtype)
    up = (torch.randn(shape, device=device) * std).to(dtype)
    edge = torch.tensor([limit, -limit, limit * 2, -limit * 2, limit, 1.0], device=device).to(dtype)
    gate.view(-1, shape[-1])[0, :6] = edge
    up.view(-1, shape[-1])[0, :6] = edge.flip(0)
    return gate, up


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_limit_matches_deepseek_v4(device, dtype):
    # the error against float64 no worse than HF's own at the input dtype (fp32: ~1e-7, checked by compare's floor)
    gate, up = on_the_clamps((3, 5, 37), dtype, device)
    inputs = dict(gate=gate, up=up, limit=7.0)
    checks = compare(F.swiglu, hf_v4_gate(), inputs, ["gate", "up"])
    assert {c.tensor for c in checks} == {"out", "grad_gate", "grad_up"}
    assert_close_to_truth(checks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("limit", [7.0, 7.3])
def test_swiglu_limit_gradient_zero_exactly_where_torch_clamps(device, dtype, limit):
    """torch.clamp passes the gradient inside the closed interval (at exactly the bound too) and 0 beyond; the bound is
    rounded to the tensor's dtype (bf16(7.3) = 7.3125). The kernel's zeros fall exactly where torch's do, and its
    values agree with torch's clamped SwiGLU (fp32: 1e-5 relative; bf16: two of its rounding steps)."""
    gate, up = on_the_clamps((4, 64), dtype, device, limit=limit)
    gate[1, :3] = up[1, :3] = torch.tensor([7.3125, 7.28125, -7.3125], device=device).to(dtype)  # around bf16(7.3)
    gate[2, 0] = float("nan")
    dy = torch.randn(4, 64, device=device).to(dtype)
    grads = []
    for fn in (F.swiglu, ref.swiglu):
        g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
        out = fn(g, u, limit=limit)
        out.backward(dy)
        grads.append((out.detach(), g.grad, u.grad))
    (out, dg, du), (t_out, t_dg, t_du) = grads
    assert torch.equal(out.isnan(), t_out.isnan())
    assert torch.equal(du == 0, t_du == 0) and torch.equal(dg == 0, t_dg == 0)
    # row 0: gate (7, -7, 14, -14, 7, 1), up (1, 7, -14, 14, -7, 7): up beyond the clamp at 2 and 3, gate at 2
    assert torch.equal(du[0, :6] == 0, torch.tensor([False, False, True, True, False, False], device=device))
    assert torch.equal(dg[0, :6] == 0, torch.tensor([False, False, True, False, False, False], device=device))
    tol = 1e-5 if dtype == torch.float32 else 2 ** -7
    for a, b in ((out, t_out), (dg, t_dg), (du, t_du)):
        keep = ~b.isnan()
        assert ((a - b)[keep].float().norm() / b[keep].float().norm()).item() <= tol


def test_swiglu_limit_strided_with_multipliers(device):
    """gate / up sliced in place from one (..., 2I) projection, and the clamp before the multipliers:
    ``silu(gm * min(gate, limit)) * clamp(up) * dm``."""
    fused = torch.randn(6, 2 * 33, device=device) * 4
    inputs = dict(gate=fused[:, :33], up=fused[:, 33:], limit=3.0, gate_multiplier=1.5, down_multiplier=0.5)
    assert_close_to_truth(compare(F.swiglu, ref.swiglu, inputs, ["gate", "up"]))


def test_swiglu_limit_none_is_the_unclamped_op(device):
    gate, up = on_the_clamps((5, 40), torch.float32, device)
    assert torch.equal(F.swiglu(gate, up, limit=None), F.swiglu(gate, up))
    assert not torch.equal(F.swiglu(gate, up, limit=7.0), F.swiglu(gate, up))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_glu_linear_limit_matches_deepseek_v4_mlp(device, dtype):
    """DeepseekV4MLP.forward from its projections' outputs on: down_proj(act_fn(gate.clamp(max=limit)) *
    up.clamp(-limit, limit)), the product recomputed in the backward."""
    gate, up = on_the_clamps((2, 7, 41), dtype, device)
    weight = (torch.randn(23, 41, device=device) / 6).to(dtype)
    inputs = dict(gate=gate, up=up, weight=weight, limit=7.0)
    original = hf_v4_gate()
    checks = compare(F.glu_linear, lambda gate, up, weight, limit: torch.nn.functional.linear(
        original(gate, up, limit), weight), inputs, ["gate", "up", "weight"], factor=1.1 if dtype != torch.float32
        else 1.0)
    assert_close_to_truth(checks)


@pytest.mark.parametrize("op", ["swiglu", "glu_linear"])
def test_limit_bad_input(device, op):
    gate = torch.randn(4, 6, device=device)
    args = (gate, gate.clone()) + ((torch.randn(3, 6, device=device),) if op == "glu_linear" else ())
    fn = getattr(F, op)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="limit must be a positive finite number"):
            fn(*args, limit=bad)
    for bad in ("7", True, torch.tensor(7.0), [7.0]):
        with pytest.raises(TypeError, match="limit must be a real number or None"):
            fn(*args, limit=bad)
    if op == "glu_linear":
        with pytest.raises(ValueError, match="limit .* needs activation='silu'"):
            fn(*args, activation="gelu_tanh", limit=7.0)
