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
