"""Gated linear unit activations (Shazeer 2020, "GLU Variants Improve Transformer"): SwiGLU and GeGLU.

These are the products HF MLPs form between the gate and up projections, e.g. LlamaMLP's
``act_fn(gate_proj(x)) * up_proj(x)`` with ``act_fn`` SiLU (Llama, Mistral, Qwen) or tanh-GELU (Gemma).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GELU_APPROXIMATIONS = ("tanh", "none")


def _scaled(x: torch.Tensor, multiplier: float) -> torch.Tensor:
    return x if multiplier == 1.0 else x * multiplier


def clamp_gate_up(gate: torch.Tensor, up: torch.Tensor, limit: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4's clamps of a SwiGLU's inputs (transformers ``modeling_deepseek_v4.py``: ``DeepseekV4MLP.forward``
    clamps ``gate_proj(x).clamp(max=limit)`` and ``up_proj(x).clamp(min=-limit, max=limit)``,
    ``DeepseekV4Experts._apply_gate`` the chunked halves alike): ``(gate.clamp(max=limit), up.clamp(-limit, limit))``,
    or the two unchanged when ``limit`` is None. torch.clamp's semantics: the bound rounded to the tensors' dtype, NaN
    kept, gradient 1 inside the closed interval (at the bound too) and 0 outside."""
    if limit is None:
        return gate, up
    return gate.clamp(max=limit), up.clamp(min=-limit, max=limit)


def swiglu(gate: torch.Tensor, up: torch.Tensor, gate_multiplier: float = 1.0,
           down_multiplier: float = 1.0, limit: float | None = None) -> torch.Tensor:
    """``silu(gate_multiplier * gate) * up * down_multiplier`` with ``silu(x) = x * sigmoid(x)``, elementwise.

    The multipliers are HF FalconH1MLP's (``config.mlp_multipliers``): its forward is ``down_proj(up_proj(x) *
    act(gate_proj(x) * gate_multiplier)) * down_multiplier``, which equals ``down_proj`` of this product when the
    down projection has no bias (a linear map commutes with the scalar). At 1.0 (every other model) they are not
    applied, and this is ``silu(gate) * up`` exactly.

    ``limit`` (DeepSeek-V4's ``config.swiglu_limit``): gate and up are first clamped, ``gate.clamp(max=limit)``,
    ``up.clamp(-limit, limit)`` (:func:`clamp_gate_up`), so that at multipliers 1 this is DeepSeek-V4's
    ``act_fn(gate.clamp(max=limit)) * up.clamp(-limit, limit)`` op for op. (GPT-OSS's clamped SwiGLU,
    :func:`clamped_swiglu`, is another formula: a sigmoid slope alpha and ``+ 1`` on up, interleaved gate / up.)

    Args:
        gate, up: tensors of one shape (..., I) and one float dtype.
        gate_multiplier, down_multiplier: real numbers.
        limit: a positive real number, or None (no clamp).

    Returns:
        tensor of that shape and dtype.
    """
    gate, up = clamp_gate_up(gate, up, limit)
    return _scaled(F.silu(_scaled(gate, gate_multiplier)) * up, down_multiplier)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh", gate_multiplier: float = 1.0,
          down_multiplier: float = 1.0) -> torch.Tensor:
    """``gelu(gate_multiplier * gate, approximate) * up * down_multiplier``, elementwise, with
    :func:`torch.nn.functional.gelu` semantics.

    Args:
        gate, up: tensors of one shape (..., I) and one float dtype.
        approximate: ``"tanh"`` (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, HF
            ``gelu_pytorch_tanh``) or ``"none"`` (the exact ``x * Phi(x)`` with the normal CDF via erf).
        gate_multiplier, down_multiplier: as :func:`swiglu`'s (not applied at 1.0).

    Returns:
        tensor of that shape and dtype.

    Raises:
        ValueError: unknown ``approximate``.
    """
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    return _scaled(F.gelu(_scaled(gate, gate_multiplier), approximate=approximate) * up, down_multiplier)


GLU_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def glu_linear(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               activation: str = "silu", gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
               limit: float | None = None) -> torch.Tensor:
    """A gated MLP's down projection of its gated product: ``linear(act(gm * gate) * up * dm, weight, bias)``.

    HF LlamaMLP's ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` from the projections' outputs on (gm = dm = 1);
    HF FalconH1MLP's, multipliers included, when the down projection has no bias.

    Args:
        gate, up: (..., I), one float dtype.
        weight: (H, I) (``nn.Linear`` layout); bias: (H,) or None.
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh-approximate GELU).
        gate_multiplier, down_multiplier: gm and dm, as :func:`swiglu`'s (scaling the product, before the bias).
        limit: DeepSeek-V4's clamps of gate and up, as :func:`swiglu`'s (``activation="silu"`` only), or None.

    Returns:
        (..., H) in torch's type-promotion result of the product and the weight (under autocast, its dtype).

    Raises:
        ValueError: unknown ``activation``, or a ``limit`` with another activation than ``"silu"``.
    """
    return F.linear(glu_product(gate, up, activation, gate_multiplier, down_multiplier, limit), weight, bias)


def glu_product(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu", gate_multiplier: float = 1.0,
                down_multiplier: float = 1.0, limit: float | None = None) -> torch.Tensor:
    """``act(gm * gate) * up * dm`` for an activation named as :func:`glu_linear`'s: :func:`swiglu` or
    :func:`geglu` (gm, dm: the multipliers, 1 by default; ``limit``: :func:`swiglu`'s clamps, SiLU only).

    Raises:
        ValueError: unknown ``activation``, or a ``limit`` with another activation than ``"silu"``.
    """
    if activation == "silu":
        return swiglu(gate, up, gate_multiplier, down_multiplier, limit)
    if limit is not None:
        raise ValueError(f"limit (DeepSeek-V4's clamped SwiGLU) needs activation='silu', got {activation!r}")
    if activation in ("gelu", "gelu_tanh"):
        return geglu(gate, up, "tanh" if activation == "gelu_tanh" else "none", gate_multiplier, down_multiplier)
    raise ValueError(f"activation must be one of {GLU_ACTIVATIONS}, got {activation!r}")


def clamped_swiglu(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU on its experts' fused, interleaved gate-up projection (transformers
    ``modeling_gpt_oss.py``, ``GptOssExperts._apply_gate``; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"):

        gate, up = gate_up[..., 0::2], gate_up[..., 1::2]
        out = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g),   g = clamp(gate, max=limit)

    Args:
        gate_up: (..., 2I) float, gate and up interleaved column by column.
        alpha: the sigmoid's slope (``config.swiglu_alpha``, 1.702 in GPT-OSS).
        limit: the clamp (``config.swiglu_limit``, 7.0).

    Returns:
        (..., I) in gate_up's dtype, computed in it as HF does.
    """
    gate, up = gate_up[..., 0::2], gate_up[..., 1::2]
    gate = gate.clamp(min=None, max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def gated_mlp(x: torch.Tensor, gate_weight: torch.Tensor, up_weight: torch.Tensor, down_weight: torch.Tensor,
              activation: str = "silu", num_shards: int | None = None) -> torch.Tensor:
    """HF LlamaMLP's ``down_proj(act(gate_proj(x)) * up_proj(x))`` (bias-free), untiled: the specification of
    :func:`tigon.functional.tiled_mlp` (tiling over tokens changes no value; ``num_shards`` is accepted and unused).

    Args:
        x: (..., H); gate_weight, up_weight: (I, H); down_weight: (H, I); one float dtype.
        activation: as :func:`glu_linear`'s.

    Returns:
        (..., H) in x's dtype.
    """
    lin = torch.nn.functional.linear
    return glu_linear(lin(x, gate_weight), lin(x, up_weight), down_weight, None, activation)
