"""Residual add followed by RMSNorm: the pattern of every pre-norm decoder layer (HF LlamaDecoderLayer:
``hidden_states = residual + hidden_states; residual = hidden_states; hidden_states = norm(hidden_states)``).

The specification of :func:`tigon.functional.fused_add_rms_norm`, built on :func:`tigon.reference.rms_norm.rms_norm`.
"""

from __future__ import annotations

import torch

from .rms_norm import CASTING_MODES, rms_norm

__all__ = ["CASTING_MODES", "fused_add_rms_norm"]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0,
    casting_mode: str = "llama", in_place: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` in x's dtype, then ``y = rms_norm(s, weight, eps, offset, casting_mode)``.

    Args:
        x: (..., hidden), any float dtype (the layer's new hidden states, e.g. the attention output).
        residual: x's shape and dtype (the residual stream).
        weight, eps, offset, casting_mode: as :func:`tigon.reference.rms_norm.rms_norm`.
        in_place: accepted for the kernels' signature and ignored: it only says where the kernels' backward
            stores a gradient (see :func:`tigon.functional.fused_add_rms_norm`); values are the same either way.

    Returns:
        (y, s): y as ``rms_norm(s, ...)`` (its dtype rules), s (..., hidden) in x's dtype (the new residual).
    """
    s = x + residual
    return rms_norm(s, weight, eps, offset, casting_mode), s
