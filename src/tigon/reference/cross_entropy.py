"""Cross-entropy reference: torch.nn.functional.cross_entropy semantics plus the extras LLM training uses.

This module is the specification of :func:`tigon.functional.cross_entropy` (and of the loss of the fused LM-head
variant, whose reference calls it). Per token ``i`` with target
``t = target[i]`` (tokens whose target equals ``ignore_index`` contribute nothing), class weights ``w`` (all ones
when not given), vocabulary size ``V``, smoothing ``eps`` and ``x = softcap * tanh(logits / softcap)`` (or the
logits themselves):

    lse_i  = logsumexp_c x_ic
    ce_i   = (1 - eps) * w_t * (lse_i - x_it) + eps / V * sum_c w_c * (lse_i - x_ic)      (torch's formula)
    z_i    = lse_square_scale * lse_i ** 2                                                (PaLM z-loss)
    loss_i = ce_i + z_i

Reductions: ``"none"`` returns ``loss_i`` (0 at ignored tokens); ``"sum"`` returns ``sum_i loss_i``; ``"mean"``
returns ``sum_i ce_i / sum_i w_t(i) + sum_i z_i / n`` over the ``n`` non-ignored tokens: the cross-entropy part
exactly torch's normalisation (also with label smoothing and class weights), the z-loss averaged per non-ignored
token and never class-weighted (Liger-Kernel's rule; without class weights both divisors are ``n``); each part is 0
when its divisor is 0 (an all-ignored batch gives loss 0 and zero gradients, where torch gives NaN). With
``num_items_in_batch`` the loss is ``sum_i loss_i / num_items_in_batch`` (the Hugging Face gradient-accumulation
convention, where ``num_items_in_batch`` counts tokens), whatever ``reduction`` ("mean" or "sum") says.

Sources: label smoothing as in torch (Szegedy et al. 2016); z-loss from PaLM (Chowdhery et al. 2022,
section 5); logit soft-capping from Gemma 2 (Gemma Team 2024).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from .. import _checks

REDUCTIONS = ("mean", "sum", "none")


class LossOutput(NamedTuple):
    """Returned by the cross-entropy ops when an extra output is requested.

    Liger-Kernel's ``CrossEntropyOutput(loss, z_loss, token_accuracy, predicted_tokens)`` in the same order
    (``token_accuracy`` is an alias of ``accuracy`` here).

    loss: scalar (or (N,) for reduction="none": each token's loss, z part included, 0 where ignored), float32,
        includes the z-loss term.
    z_loss: the z-loss part alone, detached (a logging output; its gradient flows through ``loss``): for
        reduction="none" each token's ``lse_square_scale * lse**2`` ((N,), 0 where ignored, times the target's
        probability with token scaling); for "mean" their sum over the non-ignored tokens divided by their count
        (unweighted by class weights, Tigon's rule, as Liger's), for "sum" the sum; or None.
    accuracy: fraction of non-ignored tokens whose argmax equals the target (scalar float32; for reduction="none"
        each token's hit, (N,) float32, 1.0 or 0.0, 0 where ignored: Liger-Kernel's per-token ``token_accuracy``),
        or None.
    predicted_tokens: each token's argmax class, (N,) int64 with -1 for ignored tokens (the fused linear
        cross-entropy's ``return_predicted_tokens``, Liger-Kernel's), or None.
    """

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    accuracy: torch.Tensor | None = None
    predicted_tokens: torch.Tensor | None = None

    @property
    def token_accuracy(self) -> torch.Tensor | None:
        """``accuracy`` under Liger-Kernel's name (its ``CrossEntropyOutput.token_accuracy``)."""
        return self.accuracy


def _real(v) -> bool:
    """``isinstance(v, numbers.Real)``, floats first (an ABC check costs ~0.3 us, paid per option per call)."""
    return type(v) is float or isinstance(v, numbers.Real)


def check_loss_options(
    *,
    reduction: str,
    label_smoothing: float,
    lse_square_scale: float,
    softcap: float | None,
    num_items_in_batch,
) -> None:
    """Validate the options shared by the cross-entropy ops (no tensor shapes).

    Raises:
        ValueError: reduction unknown, label_smoothing outside [0, 1], lse_square_scale negative or infinite,
            softcap not finite and > 0 (a bool for any of the three), num_items_in_batch not positive (an int, or a
            CPU tensor outside torch.compile's tracing; a CUDA tensor's value is not read, which would synchronise
            every call) or not 0-d, or num_items_in_batch with reduction="none".
        TypeError: num_items_in_batch is neither an int nor a tensor.
    """
    _checks.choice("reduction", reduction, REDUCTIONS)
    # (a bool is a Real, but True for 1.0 is a misplaced argument: refused, as ignore_index's and the flags' checks do)
    if not _real(label_smoothing) or isinstance(label_smoothing, bool) or not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be a float in [0, 1], got {label_smoothing!r}")
    if (not _real(lse_square_scale) or isinstance(lse_square_scale, bool)
            or not 0.0 <= float(lse_square_scale) < math.inf):  # (inf: a NaN loss)
        raise ValueError(f"lse_square_scale must be a finite float >= 0, got {lse_square_scale!r}")
    if softcap is not None and (not _real(softcap) or isinstance(softcap, bool) or not float(softcap) > 0.0
                                or float(softcap) == float("inf")):
        raise ValueError(f"softcap must be None or a finite float > 0, got {softcap!r}")
    if num_items_in_batch is not None:
        if reduction == "none":
            raise ValueError("num_items_in_batch divides the summed loss; it cannot be used with reduction='none'")
        _checks.num_items(num_items_in_batch)


def check_inputs(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, **options) -> None:
    """Validate :func:`cross_entropy`'s tensors and options (``options``: see :func:`check_loss_options`).

    Raises:
        TypeError: logits not floating, target not an integer tensor, weight not floating.
        ValueError: logits not (N, V), target not (N,), weight not (V,), devices differ, bad options.
    """
    _checks.tensor("logits", logits, floating=True, ndim=2)
    _checks.tensor("target", target, integer=True, signed=True, ndim=1)
    if weight is not None:
        _checks.tensor("weight", weight, floating=True, ndim=1)
    _checks.same_device(logits=logits, target=target, weight=weight)
    n, v = logits.shape
    if v == 0:
        raise ValueError("logits must have a non-empty vocabulary dimension, got shape (N, 0)")
    if target.shape[0] != n:
        raise ValueError(f"target must have shape ({n},) to match logits {tuple(logits.shape)}, "
                         f"got {tuple(target.shape)}")
    if weight is not None and weight.shape[0] != v:
        raise ValueError(f"weight (class weights) must have shape ({v},), got {tuple(weight.shape)}")
    check_loss_options(**options)


def widened(ids: torch.Tensor) -> torch.Tensor:
    """Integer ``ids`` as int64 when their dtype is narrower than int32 (else as they are), for comparisons with
    Python ints: torch casts the int to the tensor's dtype, so ``int16_ids >= 32768`` compared with -32768 (every id
    was "out of range" for a 32768-word vocabulary) and ``int8_ids >= 131`` with -125."""
    return ids.long() if ids.dtype in (torch.int8, torch.int16) else ids


def check_target_range(target: torch.Tensor, num_classes: int, ignore_index: int) -> None:
    """Raise ValueError when a target other than ``ignore_index`` is outside [0, num_classes).

    Reads the targets on the host: a device synchronisation on CUDA (the kernel path skips it there). Skipped
    while torch.compile traces, where a host read of a tensor ends the graph (a graph break): there such targets
    give a NaN loss (kernel path) or an indexing error (reference path) instead.
    """
    if torch.compiler.is_compiling() or not _checks.has_data(target):  # (meta / fake targets: nothing to read)
        return
    target = widened(target)
    bad = (target != ignore_index) & ((target < 0) | (target >= num_classes))
    if bool(bad.any()):
        first = int(target[bad][0])
        raise ValueError(f"target values must be in [0, {num_classes}) or equal ignore_index={ignore_index}; "
                         f"found {first}")


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_z_loss: bool = False,
    return_accuracy: bool = False,
    inplace_backward: bool = False,
    grad_in_forward: bool = False,
    return_predicted_tokens: bool = False,
    _token_scaling: bool = False,
):
    """Cross-entropy of ``logits`` against class indices ``target``; see the module docstring for the formula.

    The options are keyword-only (the public op takes them positionally in Liger-Kernel's order, with torch's
    deprecated ``size_average`` / ``reduce``, which the op turns into ``reduction`` before calling this).

    Computed in ``logits.dtype`` promoted to at least float32 (so float64 inputs give a float64 truth).

    Args:
        logits: (N, V) float tensor.
        target: (N,) integer tensor of class indices in [0, V), or ``ignore_index``.
        weight: optional (V,) class weights (torch's ``weight``).
        ignore_index: target value whose tokens are skipped.
        reduction: ``"mean"`` | ``"sum"`` | ``"none"``.
        label_smoothing: eps in [0, 1], torch's definition (with class weights as torch applies them).
        lse_square_scale: z-loss coefficient (PaLM uses 1e-4); the z term is part of the returned loss.
        softcap: if given, ``logits := softcap * tanh(logits / softcap)`` first (Gemma 2 final soft-capping).
        num_items_in_batch: if given (int or 0-d tensor), loss = summed loss / num_items_in_batch.
        return_z_loss, return_accuracy: return a :class:`LossOutput` instead of the loss.
        return_predicted_tokens: also return each token's argmax class (of the soft-capped logits), (N,) int64, -1
            where the target is ``ignore_index``, in the LossOutput (Liger-Kernel's option of the same name).
        inplace_backward, grad_in_forward: accepted for signature parity; the reference never writes into
            ``logits``.
        _token_scaling: the fused linear cross-entropy's ``use_token_scaling`` (its reference's use only): each
            token's loss and z term times its target's probability, detached, before the reduction.

    Returns:
        The loss: 0-d, or (N,) for ``reduction="none"``; float32 (float64 for float64 logits). With
        ``return_z_loss`` / ``return_accuracy``, ``LossOutput(loss, z_loss, accuracy)``: z_loss is the z part
        alone reduced like the loss and accuracy the fraction of non-ignored tokens whose argmax is the target
        (for ``reduction="none"`` each token's 1.0 / 0.0 hit, 0 where ignored);
        both are detached (logging outputs: the gradient flows through ``loss``, which includes the z part).

    Raises:
        TypeError, ValueError: see :func:`check_inputs`; ValueError also for targets out of range.
    """
    check_inputs(logits, target, weight, reduction=reduction, label_smoothing=label_smoothing,
                 lse_square_scale=lse_square_scale, softcap=softcap, num_items_in_batch=num_items_in_batch)
    n, v = logits.shape
    check_target_range(target, v, ignore_index)
    ct = torch.promote_types(logits.dtype, torch.float32)
    x = logits.to(ct)
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    valid = target != ignore_index
    safe_t = torch.where(valid, target, torch.zeros_like(target)).long()
    logp = torch.log_softmax(x, dim=-1)
    lse = torch.logsumexp(x, dim=-1)
    w = weight.to(ct) if weight is not None else None
    w_t = w.gather(0, safe_t) if w is not None else torch.ones(n, dtype=ct, device=x.device)
    w_t = torch.where(valid, w_t, torch.zeros_like(w_t))
    nll = -logp.gather(1, safe_t[:, None]).squeeze(1) * w_t
    if label_smoothing > 0:
        smooth = -(logp * w).sum(-1) if w is not None else -logp.sum(-1)
        smooth = torch.where(valid, smooth, torch.zeros_like(smooth))
        per_token = (1.0 - label_smoothing) * nll + (label_smoothing / v) * smooth
    else:
        per_token = nll
    z = torch.where(valid, lse_square_scale * lse * lse, torch.zeros_like(lse))
    if _token_scaling:
        p = torch.where(valid, logp.detach().gather(1, safe_t[:, None]).squeeze(1).exp(), torch.zeros_like(lse))
        per_token, z = per_token * p, z * p

    def reduce(t: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
        if num_items_in_batch is not None:
            items = torch.as_tensor(num_items_in_batch, device=t.device).to(ct).reshape(())
            return t.sum() / items
        if reduction == "none":
            return t
        if reduction == "sum":
            return t.sum()
        nonzero = denom != 0
        return torch.where(nonzero, t.sum() / torch.where(nonzero, denom, torch.ones_like(denom)),
                           torch.zeros_like(denom))

    n_valid = valid.sum().to(ct)
    loss = reduce(per_token, w_t.sum()) + reduce(z, n_valid)  # z-loss: per non-ignored token, unweighted
    if not (return_z_loss or return_accuracy or return_predicted_tokens):
        return loss
    z_out = reduce(z, n_valid).detach() if return_z_loss else None
    pred = torch.where(valid, x.detach().argmax(-1), -1) if return_predicted_tokens else None
    acc = None
    if return_accuracy:
        with torch.no_grad():
            hit = (x.argmax(dim=-1) == target) & valid
            if reduction == "none":  # each token's hit, as Liger-Kernel's per-token token_accuracy
                acc = hit.to(torch.float32)
            else:
                acc = (hit.sum().to(torch.float32) / valid.sum().clamp_min(1).to(torch.float32))
    return LossOutput(loss, z_out, acc, pred)
