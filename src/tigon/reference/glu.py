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
    return F.linear(glu_product(gate, up, activation), weight, bias)


def glu_product(gate: torch.Tensor, up: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """``act(gate) * up`` for an activation named as :func:`glu_linear`'s: :func:`swiglu` or :func:`geglu`.

    Raises:
        ValueError: unknown ``activation``.
    """
    if activation == "silu":
        return swiglu(gate, up)
    if activation in ("gelu", "gelu_tanh"):
        return geglu(gate, up, "tanh" if activation == "gelu_tanh" else "none")
    raise ValueError(f"activation must be one of {GLU_ACTIVATIONS}, got {activation!r}")
