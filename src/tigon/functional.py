"""Tigon's public functional API.

Every function validates its arguments, asks :func:`tigon.support.select_backend` which path to take (compiled
Triton, the Triton interpreter, or the PyTorch reference in :mod:`tigon.reference`), and runs it. Both paths
share one signature and one set of semantics; the reference is the specification.
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import torch

from . import _checks
from .support import select_backend


def _op(name: str):
    """The Triton op module ``tigon.ops.<name>``, imported on first use (so TRITON_INTERPRET can be set first)."""
    return importlib.import_module(f"tigon.ops.{name}")


def _ref(name: str):
    return importlib.import_module(f"tigon.reference.{name}")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama"
) -> torch.Tensor:
    """Root-mean-square layer norm over the last dimension (Zhang & Sennrich 2019; HF LlamaRMSNorm).

    ``y = x / sqrt(mean(x**2, -1) + eps) * (offset + weight)``, statistics in fp32.

    Args:
        x: (..., hidden) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        weight: (hidden,) float tensor on x's device.
        eps: variance epsilon (HF ``rms_norm_eps``).
        offset: added to weight; 1.0 gives Gemma's ``(1 + weight)``.
        casting_mode: ``"llama"`` | ``"gemma"`` | ``"none"``, see :func:`tigon.reference.rms_norm.rms_norm`.

    Returns:
        (..., hidden): dtype of x for ``"gemma"``, else the promotion of x's and weight's dtypes.

    Raises:
        TypeError: x or weight is not a floating tensor.
        ValueError: weight is not (hidden,), devices differ, or casting_mode is unknown.
    """
    _checks.tensor("x", x, floating=True)
    _checks.tensor("weight", weight, floating=True, ndim=1)
    _checks.same_device(x=x, weight=weight)
    _checks.choice("casting_mode", casting_mode, ("llama", "gemma", "none"))
    if x.dim() == 0 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight must have shape ({x.shape[-1] if x.dim() else '?'},), got {tuple(weight.shape)}")
    if select_backend("rms_norm", x) == "reference":
        return _ref("rms_norm").rms_norm(x, weight, eps, offset, casting_mode)
    return _op("rms_norm").RMSNormFunction.apply(x, weight, float(eps), float(offset), casting_mode)


class LossOutput(NamedTuple):
    """Returned by the cross-entropy ops when an extra output is requested.

    loss: scalar (or (N,) for reduction="none"), float32, includes the z-loss term.
    z_loss: the z-loss part alone (``lse_square_scale * lse**2``, reduced like loss), or None.
    accuracy: fraction of non-ignored tokens whose argmax equals the target (scalar float32), or None.
    """

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    accuracy: torch.Tensor | None = None


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, HF rotate-half convention (Su et al. 2021; HF ``apply_rotary_pos_emb``).

    TODO(helper B): implement; see the issue for shapes.
    """
    raise NotImplementedError


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (Shazeer 2020). TODO(helper B)."""
    raise NotImplementedError


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """``gelu(gate, approximate) * up`` (Shazeer 2020). TODO(helper B)."""
    raise NotImplementedError


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dimension, torch.nn.functional.layer_norm semantics. TODO(helper B)."""
    raise NotImplementedError


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_z_loss: bool = False,
    return_accuracy: bool = False,
    inplace_backward: bool = False,
):
    """Cross-entropy on (N, V) logits, torch.nn.functional.cross_entropy semantics plus extras. TODO(helper A)."""
    raise NotImplementedError


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    class_weight: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_z_loss: bool = False,
    return_accuracy: bool = False,
):
    """cross_entropy(logit_scale * (hidden @ weight.T + bias), target) without materialising the logits.

    TODO(helper A).
    """
    raise NotImplementedError
