"""A gated MLP with LoRA adapters on gate, up and down (LoRA, Hu et al. 2021; GLU variants, Shazeer 2020) as one
autograd node: the public op and its record.

Kernels: :mod:`tigon.kernels.lora_mlp` (cuBLAS matmuls around the GLU kernels of :mod:`tigon.kernels.glu`; the
bytes saved for the backward and the passes over (tokens, intermediate) tensors are counted there). Specification:
:mod:`tigon.reference.lora`.
"""

from __future__ import annotations

import math

import torch

from ..reference import lora as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn
from .lora import RANK


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
    dev = x.device.type
    autocast = dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev)  # (meta, ...: no autocast to ask about)
    if not autocast:
        for name, t in tensors.items():
            if t is not None and t.dtype != x.dtype:
                raise TypeError(f"{name} must have x's dtype {x.dtype} outside autocast, got {t.dtype}")
    if select_backend("lora_glu_mlp", x) in TORCH_CODE or torch.compiler.is_compiling():
        s_g, s_u, s_d = scalings
        return ref.lora_glu_mlp(x, **tensors, gate_scaling=s_g, up_scaling=s_u, down_scaling=s_d,
                                activation=activation)
    from ..kernels import lora_mlp as k

    cd = torch.get_autocast_dtype(dev) if autocast else x.dtype
    return k.LoRAGLUMLPFunction.apply(x, *tensors.values(), *scalings, activation, cd)


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
    shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden, "intermediate": m.intermediate, "rank": RANK},
    size_format="tokens x hidden x intermediate, rank",
    size_label=lambda s: f"{s['tokens']}x{s['hidden']}x{s['intermediate']} r{s['rank']}",
    grad_inputs=("x", "gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b"),
    category="lora",
    flops=_flops,
    cases=(Case("activation=silu", options={"activation": "silu"}),
           Case("activation=gelu_tanh", options={"activation": "gelu_tanh"})),
    under_compile="inductor",
    leading_dims=("x",),
),)
