"""A gated MLP with LoRA adapters on gate, up and down (LoRA, Hu et al. 2021; GLU variants, Shazeer 2020) as one
autograd node: the public op and its record.

The one-projection form of Phi-3 / GLM-4 (``gate_up_proj``): :func:`lora_gate_up_mlp`. Kernels:
:mod:`tigon.kernels.lora_mlp` (cuBLAS matmuls around the GLU kernels of :mod:`tigon.kernels.glu`; the
bytes saved for the backward and the passes over (tokens, intermediate) tensors are counted there). Specification:
:mod:`tigon.reference.lora`.
"""

from __future__ import annotations

import math

import torch

from ..reference import lora as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn


def _same_dtype_outside_autocast(x: torch.Tensor, tensors: dict) -> bool:
    """Whether autocast is on for x's device; outside it, raises TypeError for a tensor of another dtype than x's."""
    dev = x.device.type
    autocast = dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev)  # (meta, ...: no autocast to ask about)
    if not autocast:
        for name, t in tensors.items():
            if t is not None and t.dtype != x.dtype:
                raise TypeError(f"{name} must have x's dtype {x.dtype} outside autocast, got {t.dtype}")
    return autocast


def lora_glu_mlp(x: torch.Tensor, gate_weight: torch.Tensor, gate_a: torch.Tensor, gate_b: torch.Tensor,
                 up_weight: torch.Tensor, up_a: torch.Tensor, up_b: torch.Tensor, down_weight: torch.Tensor,
                 down_a: torch.Tensor, down_b: torch.Tensor, *, gate_bias: torch.Tensor | None = None,
                 up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                 gate_scaling: float = 1.0, up_scaling: float = 1.0, down_scaling: float = 1.0,
                 activation: str = "silu") -> torch.Tensor:
    """``down(act(gate(x)) * up(x))`` where each projection is a linear layer plus its LoRA adapter, ``y = u W^T +
    b + s (u A^T) B^T``, as one autograd node.

    HF LlamaMLP (``activation="silu"``) or GemmaMLP (``"gelu_tanh"``) after PEFT wraps gate_proj, up_proj and
    down_proj in ``lora.Linear`` layers (one active adapter, no dropout, no DoRA). The (..., I) product is not kept
    for the backward (recomputed there by the pass that forms the GLU's gradients, as
    :func:`tigon.functional.glu_linear` does), the two A products of gate and up run as one matmul of stacked A's,
    and base weights that do not require grad (PEFT freezes them) get no gradient and cost no matmul. Kept for the
    backward: x, gate, up and three r-wide products; :mod:`tigon.kernels.lora_mlp` counts the bytes and passes
    against the three layers fused one by one. Under ``torch.compile`` this runs the reference (Inductor schedules
    the matmuls and the product itself).

    Args:
        x: (..., H) float32 / bfloat16 / float16 (other float dtypes run the reference).
        gate_weight, up_weight: (I, H) base weights; down_weight: (H, I); x's dtype outside autocast (as every
            weight, adapter and bias here).
        gate_a, up_a: (r_g, H), (r_u, H) adapters A; gate_b, up_b: (I, r_g), (I, r_u) adapters B; down_a: (r_d, I);
            down_b: (H, r_d). The ranks may differ (PEFT's ``rank_pattern``).
        gate_bias, up_bias: (I,) or None; down_bias: (H,) or None.
        gate_scaling, up_scaling, down_scaling: each adapter's s, PEFT's ``scaling[adapter]`` (``lora_alpha / r``).
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh-approximate GELU).

    Returns:
        (..., H) in x's dtype (the autocast dtype under autocast, where the matmuls run in that dtype as
        ``F.linear`` does); gradients in each input's dtype.

    Raises:
        TypeError: a non-floating tensor, a scaling that is not a real number, or (outside autocast) a weight,
            adapter or bias of another dtype than x's.
        ValueError: shapes that do not fit (the message names the argument), tensors on different devices, a
            scaling that is not finite, or an unknown activation.
    """
    scalings = ref.check_mlp_inputs(x, gate_weight, gate_a, gate_b, up_weight, up_a, up_b, down_weight, down_a,
                                    down_b, gate_bias, up_bias, down_bias, gate_scaling, up_scaling, down_scaling,
                                    activation)
    tensors = dict(gate_weight=gate_weight, gate_a=gate_a, gate_b=gate_b, up_weight=up_weight, up_a=up_a, up_b=up_b,
                   down_weight=down_weight, down_a=down_a, down_b=down_b, gate_bias=gate_bias, up_bias=up_bias,
                   down_bias=down_bias)
    autocast = _same_dtype_outside_autocast(x, tensors)
    if select_backend("lora_glu_mlp", x) in TORCH_CODE or torch.compiler.is_compiling():
        s_g, s_u, s_d = scalings
        return ref.lora_glu_mlp(x, **tensors, gate_scaling=s_g, up_scaling=s_u, down_scaling=s_d,
                                activation=activation)
    from ..kernels import lora_mlp as k
    from ..kernels.lora import with_leading_dims

    cd = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
    return with_leading_dims(k.LoRAGLUMLPFunction.apply(x, *tensors.values(), *scalings, activation, cd), x)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, hidden); base weights with std 1/sqrt(fan-in); A with std 1/sqrt(fan-in), B with std 1/sqrt(rank)
    (trained adapters: PEFT starts B at zero); s = 2 on every projection."""
    t, h, i, r = s["tokens"], s["hidden"], s["intermediate"], s["rank"]
    out = dict(x=randn(gen, (t, h), dtype, device))
    for name, n, k in (("gate", i, h), ("up", i, h), ("down", h, i)):
        out[f"{name}_weight"] = randn(gen, (n, k), dtype, device, 1.0 / math.sqrt(k))
        out[f"{name}_a"] = randn(gen, (r, k), dtype, device, 1.0 / math.sqrt(k))
        out[f"{name}_b"] = randn(gen, (n, r), dtype, device, 1.0 / math.sqrt(r))
    return dict(out, gate_scaling=2.0, up_scaling=2.0, down_scaling=2.0)


def _flops(s: dict, mode: str) -> float:
    """Three LoRA projections (see :func:`tigon.ops.lora._flops`): forward 3 base matmuls and 6 low-rank products;
    backward (base weights frozen) 3 base matmuls for dx and 9 low-rank products."""
    t, h, i, r = s["tokens"], s["hidden"], s["intermediate"], s["rank"]
    base = 3 * 2 * t * h * i
    low = 3 * 2 * t * r * (h + i)
    return base + low if mode == "fwd" else 2 * base + 3 * low


RECORDS = (OpSpec(
    name="lora_glu_mlp",
    summary="a gated MLP with LoRA on gate / up / down, down(act(gate(x)) * up(x)), as one autograd node (PEFT LoRA)",
    fn=lora_glu_mlp,
    reference=ref.lora_glu_mlp,
    original=ref.lora_glu_mlp,
    original_name="HF LlamaMLP over PEFT lora.Linear gate_proj / up_proj / down_proj",
    make_inputs=_inputs,
    shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden, "intermediate": m.intermediate, "rank": m.lora_rank},
    size_format="tokens x hidden x intermediate, rank",
    size_label=lambda s: f"{s['tokens']}x{s['hidden']}x{s['intermediate']} r{s['rank']}",
    grad_inputs=("x", "gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b"),
    category="lora",
    flops=_flops,
    cases=(Case("activation=silu", options={"activation": "silu"}),
           Case("activation=gelu_tanh", options={"activation": "gelu_tanh"})),
    under_compile="inductor", custom_op=False,  # (no custom op: its reference is traced)
    leading_dims=("x",),
),)


def lora_gate_up_mlp(x: torch.Tensor, gate_up_weight: torch.Tensor, gate_up_a: torch.Tensor,
                     gate_up_b: torch.Tensor, down_weight: torch.Tensor, down_a: torch.Tensor, down_b: torch.Tensor,
                     *, gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                     gate_up_scaling: float = 1.0, down_scaling: float = 1.0, activation: str = "silu") -> torch.Tensor:
    """``down(act(gate) * up)`` with ``gate, up = gate_up(x).chunk(2, -1)``, where the fused gate-up projection and
    the down projection are each a linear layer plus its LoRA adapter, ``y = u W^T + b + s (u A^T) B^T``, as one
    autograd node.

    HF Phi3MLP / Glm4MLP after PEFT wraps gate_up_proj and down_proj in ``lora.Linear`` layers (one active adapter,
    no dropout, no DoRA). As :func:`lora_glu_mlp`: the (..., I) product is not kept for the backward, base weights
    that do not require grad get no gradient and cost no matmul; the (..., 2I) gate-up output is one buffer whose
    halves the GLU reads in place and over which the backward writes their gradients
    (:class:`tigon.kernels.lora_mlp.LoRAGateUpMLPFunction`). Under ``torch.compile`` this runs the reference.

    Args:
        x: (..., H) float32 / bfloat16 / float16 (other float dtypes run the reference).
        gate_up_weight: (2I, H) base weight, gate's I rows then up's; down_weight: (H, I); x's dtype outside
            autocast (as every weight, adapter and bias here).
        gate_up_a: (r_gu, H), gate_up_b: (2I, r_gu) the gate-up adapter; down_a: (r_d, I), down_b: (H, r_d).
        gate_up_bias: (2I,) or None; down_bias: (H,) or None.
        gate_up_scaling, down_scaling: each adapter's s, PEFT's ``scaling[adapter]`` (``lora_alpha / r``).
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh-approximate GELU).

    Returns:
        (..., H) in x's dtype (the autocast dtype under autocast); gradients in each input's dtype.

    Raises:
        TypeError: a non-floating tensor, a scaling that is not a real number, or (outside autocast) a weight,
            adapter or bias of another dtype than x's.
        ValueError: shapes that do not fit (the message names the argument; gate_up_weight's rows must be even),
            tensors on different devices, a scaling that is not finite, or an unknown activation.
    """
    s_gu, s_d = ref.check_gate_up_mlp_inputs(x, gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b,
                                             gate_up_bias, down_bias, gate_up_scaling, down_scaling, activation)
    tensors = dict(gate_up_weight=gate_up_weight, gate_up_a=gate_up_a, gate_up_b=gate_up_b, down_weight=down_weight,
                   down_a=down_a, down_b=down_b, gate_up_bias=gate_up_bias, down_bias=down_bias)
    autocast = _same_dtype_outside_autocast(x, tensors)
    if select_backend("lora_gate_up_mlp", x) in TORCH_CODE or torch.compiler.is_compiling():
        return ref.lora_gate_up_mlp(x, **tensors, gate_up_scaling=s_gu, down_scaling=s_d, activation=activation)
    from ..kernels import lora_mlp as k
    from ..kernels.lora import with_leading_dims

    cd = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
    return with_leading_dims(k.LoRAGateUpMLPFunction.apply(x, *tensors.values(), s_gu, s_d, activation, cd), x)


def _gate_up_inputs(s: dict, dtype, device, gen) -> dict:
    """As :func:`_inputs`, with the gate and up base weights and B's as one (2I, ...) projection and one A."""
    t, h, i, r = s["tokens"], s["hidden"], s["intermediate"], s["rank"]
    return dict(x=randn(gen, (t, h), dtype, device),
                gate_up_weight=randn(gen, (2 * i, h), dtype, device, 1.0 / math.sqrt(h)),
                gate_up_a=randn(gen, (r, h), dtype, device, 1.0 / math.sqrt(h)),
                gate_up_b=randn(gen, (2 * i, r), dtype, device, 1.0 / math.sqrt(r)),
                down_weight=randn(gen, (h, i), dtype, device, 1.0 / math.sqrt(i)),
                down_a=randn(gen, (r, i), dtype, device, 1.0 / math.sqrt(i)),
                down_b=randn(gen, (h, r), dtype, device, 1.0 / math.sqrt(r)),
                gate_up_scaling=2.0, down_scaling=2.0)


def _gate_up_flops(s: dict, mode: str) -> float:
    """Two LoRA projections (see :func:`tigon.ops.lora._flops`), the gate-up one of width 2I."""
    t, h, i, r = s["tokens"], s["hidden"], s["intermediate"], s["rank"]
    base = 3 * 2 * t * h * i
    low = 2 * t * r * (h + 2 * i) + 2 * t * r * (i + h)
    return base + low if mode == "fwd" else 2 * base + 3 * low


RECORDS += (OpSpec(
    name="lora_gate_up_mlp",
    summary="a gated MLP with one fused gate_up projection, LoRA on gate_up / down, as one autograd node (PEFT LoRA)",
    fn=lora_gate_up_mlp,
    reference=ref.lora_gate_up_mlp,
    original=ref.lora_gate_up_mlp,
    original_name="HF Phi3MLP over PEFT lora.Linear gate_up_proj / down_proj",
    make_inputs=_gate_up_inputs,
    shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden, "intermediate": m.intermediate, "rank": m.lora_rank},
    size_format="tokens x hidden x intermediate, rank",
    size_label=lambda s: f"{s['tokens']}x{s['hidden']}x{s['intermediate']} r{s['rank']}",
    grad_inputs=("x", "gate_up_a", "gate_up_b", "down_a", "down_b"),
    category="lora",
    flops=_gate_up_flops,
    under_compile="inductor", custom_op=False,  # (no custom op: its reference is traced)
    leading_dims=("x",),
),)
