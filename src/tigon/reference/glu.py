"""Gated linear unit activations (Shazeer 2020, "GLU Variants Improve Transformer"): SwiGLU and GeGLU.

These are the products HF MLPs form between the gate and up projections, e.g. LlamaMLP's
``act_fn(gate_proj(x)) * up_proj(x)`` with ``act_fn`` SiLU (Llama, Mistral, Qwen) or tanh-GELU (Gemma).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

GELU_APPROXIMATIONS = ("tanh", "none")


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with ``silu(x) = x * sigmoid(x)``, elementwise.

    Args:
        gate, up: tensors of one shape (..., I) and one float dtype.

    Returns:
        tensor of that shape and dtype.
    """
    return F.silu(gate) * up


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """``gelu(gate, approximate) * up``, elementwise, with :func:`torch.nn.functional.gelu` semantics.

    Args:
        gate, up: tensors of one shape (..., I) and one float dtype.
        approximate: ``"tanh"`` (``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, HF
            ``gelu_pytorch_tanh``) or ``"none"`` (the exact ``x * Phi(x)`` with the normal CDF via erf).

    Returns:
        tensor of that shape and dtype.

    Raises:
        ValueError: unknown ``approximate``.
    """
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {GELU_APPROXIMATIONS}, got {approximate!r}")
    return F.gelu(gate, approximate=approximate) * up


GLU_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")


def glu_linear(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               activation: str = "silu") -> torch.Tensor:
    """A gated MLP's down projection of its gated product: ``linear(act(gate) * up, weight, bias)``.

    HF LlamaMLP's ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` from the projections' outputs on.

    Args:
        gate, up: (..., I), one float dtype.
        weight: (H, I) (``nn.Linear`` layout); bias: (H,) or None.
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh-approximate GELU).

    Returns:
        (..., H) in torch's type-promotion result of the product and the weight (under autocast, its dtype).

    Raises:
        ValueError: unknown ``activation``.
    """
    if activation == "silu":
        product = swiglu(gate, up)
    elif activation in ("gelu", "gelu_tanh"):
        product = geglu(gate, up, "tanh" if activation == "gelu_tanh" else "none")
    else:
        raise ValueError(f"activation must be one of {GLU_ACTIVATIONS}, got {activation!r}")
    return F.linear(product, weight, bias)


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
