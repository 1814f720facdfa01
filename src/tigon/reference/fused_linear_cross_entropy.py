"""Fused linear + cross-entropy reference: materialise the logits, then :func:`cross_entropy`.

``logits = logit_scale * (hidden @ weight.T + bias)`` in float32 (float64 for float64 inputs), then the
cross-entropy of :mod:`tigon.reference.cross_entropy` (softcap applied after the scale). This is the
specification of :func:`tigon.functional.fused_linear_cross_entropy`; the Triton path computes the same loss
without ever holding the (N, V) logits.
"""

from __future__ import annotations

import numbers

import torch

from .. import _checks
from .cross_entropy import check_loss_options, cross_entropy


def check_head(hidden, weight, target, bias, **per_class) -> None:
    """Validate an LM head's operands: hidden (N, H), weight (V, H) with V >= 1, integer target (N,), optional bias
    and the named per-class tensors (``class_weight=...``), each (V,); all floating except target, on one device.
    Shared by the fused linear losses' checks.

    Raises:
        TypeError: a float tensor not floating, target not an integer tensor.
        ValueError: a shape as above not met, or devices differ.
    """
    _checks.tensor("hidden", hidden, floating=True, ndim=2)
    _checks.tensor("weight", weight, floating=True, ndim=2)
    _checks.tensor("target", target, integer=True, signed=True, ndim=1)
    vectors = {"bias": bias, **per_class}
    for name, t in vectors.items():
        if t is not None:
            _checks.tensor(name, t, floating=True, ndim=1)
    _checks.same_device(hidden=hidden, weight=weight, target=target, **vectors)
    n, h = hidden.shape
    v = weight.shape[0]
    if weight.shape[1] != h:
        raise ValueError(f"weight must have shape (V, {h}) to match hidden {tuple(hidden.shape)}, "
                         f"got {tuple(weight.shape)}")
    if v == 0:
        raise ValueError("weight must have at least one row (vocabulary size V >= 1)")
    if target.shape[0] != n:
        swapped = (" (Liger-Kernel's LigerFusedLinearCrossEntropyLoss takes (lin_weight, _input, target); Tigon's "
                   "takes (hidden, weight, target))") if target.shape[0] == v else ""
        raise ValueError(f"target must have shape ({n},) to match hidden {tuple(hidden.shape)}, "
                         f"got {tuple(target.shape)}{swapped}")
    for name, t in vectors.items():
        if t is not None and t.shape[0] != v:
            raise ValueError(f"{name} must have shape ({v},) to match weight {tuple(weight.shape)}, "
                             f"got {tuple(t.shape)}")


def check_inputs(hidden, weight, target, bias, class_weight, *, logit_scale, **options) -> None:
    """Validate :func:`fused_linear_cross_entropy`'s tensors and options.

    Raises:
        TypeError: hidden / weight / bias / class_weight not floating, target not an integer tensor.
        ValueError: hidden not (N, H), weight not (V, H), target not (N,), bias or class_weight not (V,),
            devices differ, logit_scale not finite and non-zero, or a bad option (see check_loss_options).
    """
    check_head(hidden, weight, target, bias, class_weight=class_weight)
    if (not isinstance(logit_scale, numbers.Real) or isinstance(logit_scale, bool) or logit_scale == 0
            or logit_scale != logit_scale or abs(logit_scale) == float("inf")):
        raise ValueError(f"logit_scale must be a finite non-zero float, got {logit_scale!r}")
    check_loss_options(**options)


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
    return_predicted_tokens: bool = False,
    use_token_scaling: bool = False,
):
    """``cross_entropy(logit_scale * (hidden @ weight.T + bias), target, class_weight, ...)``.

    Args:
        hidden: (N, H) float tensor (the final hidden states, flattened over batch and sequence).
        weight: (V, H) LM-head weight.
        target: (N,) integer class indices, or ``ignore_index``.
        bias: optional (V,) LM-head bias.
        logit_scale: multiplies the logits before ``softcap`` (Cohere's ``logit_scale``, Granite's
            ``1 / logits_scaling``).
        class_weight: optional (V,) class weights (``weight`` of :func:`cross_entropy`).
        return_predicted_tokens: also return each token's argmax class (of the scaled logits; a soft-cap keeps it),
            (N,) int64, -1 where the target is ``ignore_index``, in the ``LossOutput``'s ``predicted_tokens``.
        use_token_scaling: each token's loss (and z term) times its target's probability under the transformed
            logits, detached, before the reduction (Liger-Kernel's option; the mean's denominator is unchanged).
        Other arguments: as :func:`tigon.reference.cross_entropy.cross_entropy`.

    Returns:
        As :func:`tigon.reference.cross_entropy.cross_entropy`, with ``predicted_tokens`` as above. The matmul runs in
        the inputs' dtype promoted to at least float32 (under ``torch.autocast`` the autocast dtype applies, as for
        ``F.linear``).

    Raises:
        TypeError, ValueError: see :func:`check_inputs`.
    """
    check_inputs(hidden, weight, target, bias, class_weight, logit_scale=logit_scale, reduction=reduction,
                 label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap,
                 num_items_in_batch=num_items_in_batch)
    ct = torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)
    logits = hidden.to(ct) @ weight.to(ct).t()
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    logits = logits.to(ct)
    if logit_scale != 1.0:
        logits = logits * logit_scale
    return cross_entropy(
        logits, target, class_weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing,
        lse_square_scale=lse_square_scale, softcap=softcap, num_items_in_batch=num_items_in_batch,
        return_z_loss=return_z_loss, return_accuracy=return_accuracy,
        return_predicted_tokens=return_predicted_tokens, _token_scaling=use_token_scaling,
    )
