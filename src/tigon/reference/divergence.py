"""Distillation losses between two distributions over a vocabulary: the specification of :func:`tigon.functional.jsd`,
:func:`tigon.functional.kl_div` and :func:`tigon.functional.tvd` (Liger-Kernel's ``liger_jsd``, ``liger_kl_div`` and
``liger_tvd``: the same arguments, defaults and values).

Per row ``i`` of (N, V) inputs and element ``v`` of the vocabulary (``P = exp(target)`` the teacher, ``Q =
exp(input)`` the student, both log-probabilities, for the JSD; probabilities or log-probabilities as stated for the
others):

    jsd, 0 < beta < 1:  M = beta * P + (1 - beta) * Q
                        l_iv = beta * P * (log P - log M) + (1 - beta) * Q * (log Q - log M)
                        (the generalised JSD, beta * KL(P || M) + (1 - beta) * KL(Q || M): Agarwal et al. 2024,
                        "On-Policy Distillation of Language Models" (GKD), eq. 1; beta = 1/2 is the Jensen-Shannon
                        divergence of Lin 1991, "Divergence measures based on the Shannon entropy")
    jsd, beta = 0:      l_iv = P * (log P - log Q)                 forward KL(P || Q)   (GKD / TRL / Liger convention:
    jsd, beta = 1:      l_iv = Q * (log Q - log P)                 reverse KL(Q || P)    not the limits of the above)
    kl_div:             l_iv = t * (log max(t, eps) - x)          t = target probabilities, x = input log-probs
                        l_iv = exp(t) * (t - x)                   log_target=True
                        (torch.nn.functional.kl_div's pointwise loss, with Liger-Kernel's eps clamp inside the log)
    tvd:                l_iv = |p - q| / 2                        p = input, q = target, probabilities

Terms with a zero probability are 0 (``0 * log 0 = 0``), so -inf log-probabilities (a masked vocabulary) give finite
losses and gradients where the divergence is finite.

Reductions (rows whose ``shift_labels`` equal ``ignore_index`` are skipped: loss 0, gradient 0; ``n`` counts the other
rows, all N rows without labels): jsd returns ``sum_iv l_iv / n`` (Liger's only reduction); kl_div and tvd take
``"batchmean"`` (``/ n``), ``"mean"`` (``/ (n * V)``, torch's elementwise mean), ``"sum"`` and ``"none"`` ((N, V),
the ignored rows 0). An empty divisor (every row ignored, or N = 0) gives loss 0 and zero gradients, not NaN.

The losses are computed in the inputs' dtype promoted to at least float32, so a float64 call is the float64 truth;
:func:`plain_jsd`, :func:`plain_kl_div` and :func:`plain_tvd` evaluate them at the input dtype (what plain PyTorch
code such as TRL's GKD loss runs: verify's error baseline).
"""

from __future__ import annotations

import torch

from .. import _checks

REDUCTIONS = ("none", "sum", "mean", "batchmean")
"""kl_div's and tvd's reductions (torch's ``kl_div`` names)."""


# ---- argument checks (shared with the kernel path) ----------------------------------------------------------------
def check_pair(input: torch.Tensor, target: torch.Tensor, shift_labels: torch.Tensor | None = None) -> None:
    """Validate an (input, target[, shift_labels]) pair of distributions.

    Raises:
        TypeError: input / target not floating, shift_labels not an integer tensor.
        ValueError: input not (N, V) with V > 0, target of another shape, shift_labels not (N,), devices differ.
    """
    _checks.tensor("input", input, floating=True, ndim=2)
    _checks.tensor("target", target, floating=True, ndim=2)
    if shift_labels is not None:
        _checks.tensor("shift_labels", shift_labels, integer=True, ndim=1)
    _checks.same_device(input=input, target=target, shift_labels=shift_labels)
    if input.shape[1] == 0:
        raise ValueError("input must have a non-empty vocabulary dimension, got shape (N, 0)")
    if target.shape != input.shape:
        raise ValueError(f"target must have input's shape {tuple(input.shape)}, got {tuple(target.shape)}")
    if shift_labels is not None and shift_labels.shape[0] != input.shape[0]:
        raise ValueError(f"shift_labels must have shape ({input.shape[0]},) to match input {tuple(input.shape)}, "
                         f"got {tuple(shift_labels.shape)}")


def check_beta(beta) -> float:
    """``beta`` as a float in [0, 1]. Raises TypeError (not a number) or ValueError (outside [0, 1])."""
    b = _checks.number("beta", beta)
    if not 0.0 <= b <= 1.0:
        raise ValueError(f"beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {beta!r}")
    return b


# ---- the pointwise losses -----------------------------------------------------------------------------------------
def _live(t: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``t`` where ``where``, else 0: the inactive branch of a zero-probability term stays finite, so its gradient
    (multiplied by the 0 the outer ``torch.where`` passes) is 0, not NaN."""
    return torch.where(where, t, torch.zeros_like(t))


def jsd_elements(x: torch.Tensor, y: torch.Tensor, beta: float) -> torch.Tensor:
    """The generalised JSD's terms (N, V) of student log-probs ``x`` and teacher log-probs ``y`` (module docstring)."""
    if beta == 0.0:
        return kl_log_elements(x, y)
    if beta == 1.0:
        return kl_log_elements(y, x)
    p, q = torch.exp(y), torch.exp(x)
    m = torch.maximum(x, y).detach()  # log M does not depend on the shift: no gradient through it
    m = _live(m, m != float("-inf"))
    s = beta * torch.exp(y - m) + (1.0 - beta) * torch.exp(x - m)
    log_m = m + torch.log(torch.where(s > 0, s, torch.ones_like(s)))  # s == 0 only where P = Q = 0 (masked below)
    tp = _live(beta * p * (_live(y, p > 0) - _live(log_m, p > 0)), p > 0)
    tq = _live((1.0 - beta) * q * (_live(x, q > 0) - _live(log_m, q > 0)), q > 0)
    return tp + tq


def kl_log_elements(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``exp(y) * (y - x)``: KL(P || Q)'s terms for log-probabilities x = log Q, y = log P (0 where P = 0)."""
    p = torch.exp(y)
    live = p > 0
    return _live(p * (_live(y, live) - _live(x, live)), live)


def kl_prob_elements(x: torch.Tensor, t: torch.Tensor, eps: float) -> torch.Tensor:
    """``t * (log max(t, eps) - x)`` for input log-probabilities x and target probabilities t (0 where t = 0)."""
    live = t != 0
    return _live(t * (torch.log(torch.clamp_min(_live(t, live), eps)) - _live(x, live)), live)


def tvd_elements(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``|p - q| / 2``."""
    return 0.5 * (p - q).abs()


# ---- reductions ----------------------------------------------------------------------------------------------------
def _rows_kept(n: int, shift_labels: torch.Tensor | None, ignore_index: int, device) -> torch.Tensor | None:
    """(N,) bool: the rows that count (None: all of them)."""
    return None if shift_labels is None else (shift_labels != ignore_index).to(device)


def _masked(t: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    return t if keep is None else torch.where(keep[:, None], t, torch.zeros_like(t))


def _reduce(elements: torch.Tensor, keep: torch.Tensor | None, reduction: str) -> torch.Tensor:
    """Reduce (N, V) terms (already 0 in the skipped rows) as the module docstring says."""
    if reduction == "none":
        return elements
    total = elements.sum()
    if reduction == "sum":
        return total
    n = elements.new_tensor(float(elements.shape[0])) if keep is None else keep.sum().to(elements.dtype)
    denom = n * elements.shape[1] if reduction == "mean" else n
    return torch.where(denom > 0, total / torch.where(denom > 0, denom, torch.ones_like(denom)),
                       torch.zeros_like(total))


def _compute_dtype(input: torch.Tensor, target: torch.Tensor, plain: bool) -> torch.dtype:
    if plain:
        return input.dtype
    return torch.promote_types(torch.promote_types(input.dtype, target.dtype), torch.float32)


def _jsd(input, target, shift_labels, beta, ignore_index, plain: bool = False):
    check_pair(input, target, shift_labels)
    beta = check_beta(beta)
    ct = _compute_dtype(input, target, plain)
    keep = _rows_kept(input.shape[0], shift_labels, ignore_index, input.device)
    x, y = _masked(input.to(ct), keep), _masked(target.to(ct), keep)  # skipped rows are never read
    return _reduce(_masked(jsd_elements(x, y, beta), keep), keep, "batchmean")


def _kl_div(input, target, reduction, log_target, eps, plain: bool = False):
    check_pair(input, target)
    _checks.choice("reduction", reduction, REDUCTIONS)
    eps = _checks.number("eps", eps, minimum=0.0)
    ct = _compute_dtype(input, target, plain)
    x, t = input.to(ct), target.to(ct)
    elements = kl_log_elements(x, t) if log_target else kl_prob_elements(x, t, eps)
    return _reduce(elements, None, reduction)


def _tvd(input, target, shift_labels, reduction, ignore_index, plain: bool = False):
    check_pair(input, target, shift_labels)
    _checks.choice("reduction", reduction, REDUCTIONS)
    ct = _compute_dtype(input, target, plain)
    keep = _rows_kept(input.shape[0], shift_labels, ignore_index, input.device)
    p, q = _masked(input.to(ct), keep), _masked(target.to(ct), keep)
    return _reduce(_masked(tvd_elements(p, q), keep), keep, reduction)


# ---- the public references (the signatures of tigon.functional's) ---------------------------------------------------
def jsd(input: torch.Tensor, target: torch.Tensor, shift_labels: torch.Tensor | None = None, beta: float = 0.5,
        ignore_index: int = -100) -> torch.Tensor:
    """The generalised Jensen-Shannon divergence of student log-probs ``input`` and teacher log-probs ``target``, summed
    over the vocabulary and averaged over the rows not ignored (module docstring); 0-d, float32 or wider."""
    return _jsd(input, target, shift_labels, beta, ignore_index)


def kl_div(input: torch.Tensor, target: torch.Tensor, size_average: bool = True, reduce: bool = True,
           reduction: str = "mean", log_target: bool = False, eps: float = 1e-10) -> torch.Tensor:
    """KL(target || input) of input log-probs (torch.nn.functional.kl_div's pointwise loss with Liger's eps clamp);
    ``size_average`` / ``reduce`` are ignored, as in Liger-Kernel. 0-d, or (N, V) for ``"none"``."""
    return _kl_div(input, target, reduction, log_target, eps)


def tvd(input: torch.Tensor, target: torch.Tensor, shift_labels: torch.Tensor | None = None, reduction: str = "mean",
        ignore_index: int = -100) -> torch.Tensor:
    """Total variation distance ``|input - target| / 2`` of two (N, V) probability tables, reduced (module
    docstring); 0-d, or (N, V) for ``"none"``."""
    return _tvd(input, target, shift_labels, reduction, ignore_index)


# ---- the same formulas at the input dtype (verify's error baseline, bench's eager provider) ------------------------
def plain_jsd(input, target, shift_labels=None, beta=0.5, ignore_index=-100):
    """:func:`jsd`'s formula evaluated at the input dtype, without the float32 upcast (what TRL's GKD loss runs)."""
    return _jsd(input, target, shift_labels, beta, ignore_index, plain=True)


def plain_kl_div(input, target, size_average=True, reduce=True, reduction="mean", log_target=False, eps=1e-10):
    """torch.nn.functional.kl_div at the input dtype (no eps clamp; ``size_average`` / ``reduce`` / ``eps`` unused).
    "mean" is torch's sum / numel, formed here from "sum" (torch warns on every "mean" call that its meaning will
    change)."""
    if reduction != "mean":
        return torch.nn.functional.kl_div(input, target, reduction=reduction, log_target=log_target)
    return torch.nn.functional.kl_div(input, target, reduction="sum", log_target=log_target) / max(input.numel(), 1)


def plain_tvd(input, target, shift_labels=None, reduction="mean", ignore_index=-100):
    """:func:`tvd`'s formula evaluated at the input dtype, without the float32 upcast."""
    return _tvd(input, target, shift_labels, reduction, ignore_index, plain=True)
