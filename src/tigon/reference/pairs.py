"""The shared part of the paired preference losses (DPO, SimPO, CPO, ORPO): from an LM head's hidden states and a
batch of chosen then rejected completions, the per-sequence log-probabilities of the policy (and of a reference
model), the NLL term and the metrics that TRL and Liger-Kernel log.

The batch is Liger-Kernel's and TRL's: ``B = 2P`` sequences, the ``P`` chosen completions first, then the ``P``
rejected ones in the same order (pair ``i`` is rows ``i`` and ``P + i``). For sequence ``b`` with scored tokens
``t`` (target != ignore_index; prompt and padding carry ignore_index) and per-token log-probabilities ``lp_bt``:

    n_b      = #{t : target_bt != ignore_index}                       completion length
    logp_b   = sum_t lp_bt               (average_log_prob=False: TRL's DPO, Liger's DPO / CPO default)
             = sum_t lp_bt / max(n_b, 1) (average_log_prob=True: Liger's SimPO / ORPO default, the paper's)
    nll      = -sum_{chosen b, t} lp_bt / max(sum_{chosen b} n_b, 1)  (the SFT / RPO term: TRL's loss_type "sft",
                                          Liger's compute_nll_loss; mean over the chosen completions' tokens)
    logits_mean(chosen) = sum_{chosen b, every t, v} z_btv / (P T V)  (Liger's metric: every position, prompt and
                                          padding included; z = hidden @ weight.T + bias, never materialised:
                                          sum_v z_btv = hidden_bt . sum_v weight_v + sum_v bias_v)

The per-token log-probabilities come from a function passed in (``token_logps(hidden2d, weight, target1d, bias,
ignore_index=...) -> (N,)``): Tigon's fused kernels, the float64 reference or TRL's plain computation, so that the
three share every other line. The reference model's pass runs under ``torch.no_grad`` (no gradient reaches
ref_hidden / ref_weight / ref_bias); its log-probabilities may instead be given (TRL's ``precompute_ref_log_probs``),
on the scale ``average_log_prob`` selects. Where Liger divides by a zero count (an all-ignored sequence with
``average_log_prob``, no chosen token for the NLL), this gives 0 instead of NaN.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .. import _checks
from .fused_linear_cross_entropy import check_head


class PairLogps(NamedTuple):
    """The sequence-level quantities every paired preference formula takes (float32; float64 for float64 inputs).

    chosen, rejected: (P,) the policy's log-probabilities of the chosen / rejected completions (sums, or per-token
        averages with ``averaged``); differentiable.
    ref_chosen, ref_rejected: (P,) the reference model's, on the same scale, without gradient; None without a
        reference model (the reference-free losses; DPO then takes them as 0, as Liger-Kernel does).
    chosen_tokens, rejected_tokens: (P,) completion lengths ``n_b`` (scored tokens), as floats.
    nll: 0-d mean negative log-likelihood of the chosen completions' tokens; differentiable.
    averaged: whether chosen / rejected are per-token averages.
    """

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor | None
    ref_rejected: torch.Tensor | None
    chosen_tokens: torch.Tensor
    rejected_tokens: torch.Tensor
    nll: torch.Tensor
    averaged: bool


class PreferenceOutput(NamedTuple):
    """What the fused linear preference losses return: the loss and the metrics TRL logs (Liger-Kernel's aux outputs,
    in its order). Every field is float32 (float64 for float64 inputs); only ``loss`` carries a gradient.

    loss: 0-d, the preference loss averaged over pairs, plus ``alpha * nll_loss`` with ``compute_nll_loss``.
    chosen_logps, rejected_logps: (P,) the policy's sequence log-probabilities (sums or averages).
    chosen_logits_mean, rejected_logits_mean: 0-d mean logit over the chosen / rejected sequences' positions and the
        vocabulary (Liger's; TRL averages over completion tokens only).
    nll_loss: 0-d mean NLL of the chosen tokens (0 without ``compute_nll_loss``).
    chosen_rewards, rejected_rewards: (P,) implicit rewards (DPO: ``beta * (logp - ref_logp)``).
    """

    loss: torch.Tensor
    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor
    chosen_logits_mean: torch.Tensor
    rejected_logits_mean: torch.Tensor
    nll_loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor


class OddsRatioOutput(NamedTuple):
    """ORPO's output: :class:`PreferenceOutput`'s fields, then ``log_odds_ratio`` (0-d ``mean log sigma(log odds
    ratio)``) and ``log_odds_chosen`` (0-d mean log odds ratio), as TRL logs and Liger returns them."""

    loss: torch.Tensor
    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor
    chosen_logits_mean: torch.Tensor
    rejected_logits_mean: torch.Tensor
    nll_loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor
    log_odds_ratio: torch.Tensor
    log_odds_chosen: torch.Tensor


def liger_tuple(out: PreferenceOutput | OddsRatioOutput) -> tuple:
    """Liger-Kernel's return value of the same loss: ``(loss, (chosen_logps, rejected_logps, chosen_logits_mean,
    rejected_logits_mean, nll_loss, chosen_rewards, rejected_rewards[, log_odds_ratio, log_odds_chosen]))``."""
    return out[0], tuple(out[1:])


TokenLogps = Callable[..., torch.Tensor]
"""``token_logps(hidden (N, H), weight (V, H), target (N,), bias (V,) or None, *, ignore_index) -> (N,)`` float
log-probabilities of the targets, 0 at ignored tokens."""


def check_batch(hidden, weight, target, bias=None, ref_hidden=None, ref_weight=None, ref_bias=None,
                ref_chosen_logps=None, ref_rejected_logps=None, *, paired: bool = True) -> None:
    """Validate a preference batch: chosen then rejected sequences (``paired``; else any B > 0 sequences) and an LM
    head (and a reference model's).

    Raises:
        TypeError: a float tensor not floating, target not an integer tensor.
        ValueError: hidden not (B, T, H) with B even and > 0, target not (B, T), weight not (V, H), bias not (V,),
            ref_hidden / ref_weight given without the other or of other shapes, ref_chosen_logps /
            ref_rejected_logps not both given or not (B / 2,), both a reference model and reference log-probs
            given, devices differ.
    """
    _checks.tensor("hidden", hidden, floating=True, ndim=3)
    _checks.tensor("target", target, integer=True, signed=True, ndim=2)
    b, t, h = hidden.shape
    if b == 0 or (paired and b % 2):
        raise ValueError(f"hidden must hold the chosen then the rejected sequences: an even batch B > 0, got shape "
                         f"{tuple(hidden.shape)}")
    if tuple(target.shape) != (b, t):
        raise ValueError(f"target must have shape {(b, t)} to match hidden {tuple(hidden.shape)}, "
                         f"got {tuple(target.shape)}")
    check_head(hidden.reshape(-1, h), weight, target.reshape(-1), bias)
    if (ref_hidden is None) != (ref_weight is None):
        raise ValueError("ref_hidden and ref_weight must be given together (the reference model's hidden states and "
                         f"LM head), got ref_hidden={'None' if ref_hidden is None else 'a tensor'} and "
                         f"ref_weight={'None' if ref_weight is None else 'a tensor'}")
    if ref_bias is not None and ref_weight is None:
        raise ValueError("ref_bias needs ref_hidden and ref_weight")
    if ref_hidden is not None:
        _checks.tensor("ref_hidden", ref_hidden, floating=True, ndim=3)
        if tuple(ref_hidden.shape[:2]) != (b, t):
            raise ValueError(f"ref_hidden must have shape ({b}, {t}, H_ref) to match target, "
                             f"got {tuple(ref_hidden.shape)}")
        _checks.tensor("ref_weight", ref_weight, floating=True, ndim=2)
        if ref_weight.shape[1] != ref_hidden.shape[2] or ref_weight.shape[0] != weight.shape[0]:
            raise ValueError(f"ref_weight must have shape ({weight.shape[0]}, {ref_hidden.shape[2]}) (the policy's "
                             f"vocabulary, ref_hidden's width), got {tuple(ref_weight.shape)}")
        if ref_bias is not None:
            _checks.tensor("ref_bias", ref_bias, floating=True, ndim=1)
            if ref_bias.shape[0] != weight.shape[0]:
                raise ValueError(f"ref_bias must have shape ({weight.shape[0]},), got {tuple(ref_bias.shape)}")
    if (ref_chosen_logps is None) != (ref_rejected_logps is None):
        raise ValueError("ref_chosen_logps and ref_rejected_logps must be given together")
    if ref_chosen_logps is not None:
        if ref_hidden is not None:
            raise ValueError("give either the reference model (ref_hidden, ref_weight) or its log-probabilities "
                             "(ref_chosen_logps, ref_rejected_logps), not both")
        for name, x in (("ref_chosen_logps", ref_chosen_logps), ("ref_rejected_logps", ref_rejected_logps)):
            _checks.tensor(name, x, floating=True, ndim=1)
            if x.shape[0] != b // 2:
                raise ValueError(f"{name} must have shape ({b // 2},) (one per pair), got {tuple(x.shape)}")
    _checks.same_device(hidden=hidden, weight=weight, target=target, ref_hidden=ref_hidden, ref_weight=ref_weight,
                        ref_bias=ref_bias, ref_chosen_logps=ref_chosen_logps, ref_rejected_logps=ref_rejected_logps)


def sequence_logps(token_logps: TokenLogps, hidden, weight, target, bias, ignore_index: int):
    """(B, T) per-token log-probabilities of ``target`` (0 where ignored) and (B,) counts of scored tokens."""
    b, t, h = hidden.shape
    lp = token_logps(hidden.reshape(b * t, h), weight, target.reshape(b * t), bias, ignore_index=ignore_index)
    return lp.reshape(b, t), (target != ignore_index).sum(-1).to(lp.dtype)


def policy_and_reference(token_logps: TokenLogps, hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias,
                         ignore_index: int, average_log_prob: bool, policy_lp=None, ref_lp=None):
    """The policy's (B, T) per-token log-probabilities, (B,) counts of scored tokens and (B,) sequence log-probs (sums,
    or averages with ``average_log_prob``), and the reference model's (B,) sequence log-probs on the same scale
    (computed under ``torch.no_grad``), or None without ``ref_hidden``. ``policy_lp``, ``ref_lp``: (B, T) per-token
    log-probabilities computed already (``token_logps`` is then not called for that model). Inputs checked by the
    caller."""
    if policy_lp is None:
        lp, n = sequence_logps(token_logps, hidden, weight, target, bias, ignore_index)
    else:
        lp, n = policy_lp, (target != ignore_index).sum(-1).to(policy_lp.dtype)
    length = n.clamp(min=1)
    seq = lp.sum(-1) / length if average_log_prob else lp.sum(-1)
    ref_seq = None
    if ref_hidden is not None:
        with torch.no_grad():
            if ref_lp is None:
                ref_lp, _ = sequence_logps(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index)
            ref_seq = ref_lp.sum(-1).to(seq.dtype)
            ref_seq = ref_seq / length if average_log_prob else ref_seq
    return lp, n, seq, ref_seq


def pair_logps(token_logps: TokenLogps, hidden, weight, target, bias=None, ref_hidden=None, ref_weight=None,
               ref_bias=None, ref_chosen_logps=None, ref_rejected_logps=None, *, ignore_index: int = -100,
               average_log_prob: bool = False, policy_lp=None, ref_lp=None) -> PairLogps:
    """The sequence-level log-probabilities of a preference batch (see the module docstring), one ``token_logps``
    call for the policy and, with a reference model, one under ``torch.no_grad`` for it.

    Args:
        token_logps: the per-token log-prob function (:data:`TokenLogps`).
        hidden: (B, T, H) the policy's final hidden states, chosen sequences first; float.
        weight, bias: (V, H) LM head, optional (V,) bias.
        target: (B, T) integer next-token ids, ``ignore_index`` where not scored.
        ref_hidden, ref_weight, ref_bias: the reference model's (B, T, H_ref), (V, H_ref), (V,), or None.
        ref_chosen_logps, ref_rejected_logps: (B/2,) given reference log-probabilities, or None.
        ignore_index: target value of unscored tokens.
        average_log_prob: per-token averages instead of sums.
        policy_lp, ref_lp: (B, T) per-token log-probabilities of the policy / the reference model computed already
            (as :func:`policy_and_reference` takes them), or None.

    Returns:
        :class:`PairLogps`.

    Raises:
        As :func:`check_batch`.
    """
    check_batch(hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias, ref_chosen_logps, ref_rejected_logps)
    p = hidden.shape[0] // 2
    lp, n, per_seq, ref_seq = policy_and_reference(token_logps, hidden, weight, target, bias, ref_hidden, ref_weight,
                                                   ref_bias, ignore_index, average_log_prob, policy_lp, ref_lp)
    nll = -lp[:p].sum() / n[:p].sum().clamp(min=1)
    ref_c = ref_r = None
    if ref_seq is not None:
        ref_c, ref_r = ref_seq[:p], ref_seq[p:]
    elif ref_chosen_logps is not None:
        ref_c = ref_chosen_logps.detach().to(per_seq.dtype)
        ref_r = ref_rejected_logps.detach().to(per_seq.dtype)
    return PairLogps(per_seq[:p], per_seq[p:], ref_c, ref_r, n[:p], n[p:], nll, bool(average_log_prob))


def row_logit_sums(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
    """(B,) sum of the logits ``hidden @ weight.T + bias`` of each sequence over its T positions and the V classes, in
    ``dtype``, without the logits: ``(sum_t hidden_bt) . (sum_v weight_v) + T sum_v bias_v``. No gradient."""
    with torch.no_grad():
        t = hidden.shape[1]
        out = hidden.sum(1, dtype=dtype) @ weight.sum(0, dtype=dtype)
        return out + t * bias.sum(dtype=dtype) if bias is not None else out


def logits_means(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
    """(chosen, rejected) 0-d mean of the logits over each half's (P, T) positions and the V classes (Liger's
    ``chosen_logits_mean``), from :func:`row_logit_sums`. No gradient."""
    b, t, _ = hidden.shape
    sums = row_logit_sums(hidden, weight, bias, dtype)
    denom = max(b // 2 * t * weight.shape[0], 1)
    return sums[: b // 2].sum() / denom, sums[b // 2:].sum() / denom


def preference_output(pairs: PairLogps, hidden, weight, bias, loss: torch.Tensor, chosen_rewards: torch.Tensor,
                      rejected_rewards: torch.Tensor, *extra: torch.Tensor, compute_nll_loss: bool,
                      alpha: float) -> PreferenceOutput | OddsRatioOutput:
    """Assemble a :class:`PreferenceOutput` from a formula's ``(loss, chosen_rewards, rejected_rewards, *extra)``:
    the NLL term added with weight ``alpha`` when ``compute_nll_loss``, every metric detached."""
    zero = torch.zeros((), dtype=pairs.chosen.dtype, device=pairs.chosen.device)
    nll = pairs.nll if compute_nll_loss else zero
    total = loss + alpha * nll if compute_nll_loss else loss
    c_mean, r_mean = logits_means(hidden, weight, bias, pairs.chosen.dtype)
    fields = (total, pairs.chosen.detach(), pairs.rejected.detach(), c_mean, r_mean, nll.detach(),
              chosen_rewards.detach(), rejected_rewards.detach(), *(e.detach() for e in extra))
    return OddsRatioOutput(*fields) if extra else PreferenceOutput(*fields)


def run(token_logps: TokenLogps, formula: Callable, hidden, weight, target, bias=None, ref_hidden=None,
        ref_weight=None, ref_bias=None, ref_chosen_logps=None, ref_rejected_logps=None, *, ignore_index: int,
        average_log_prob: bool, compute_nll_loss: bool, alpha: float, formed=None, **options) -> PreferenceOutput:
    """A paired preference loss: :func:`pair_logps` with ``token_logps``, then ``formula(pairs, **options) -> (loss,
    chosen_rewards, rejected_rewards, *extra)``, then :func:`preference_output`. The one body of every
    ``fused_linear_*_loss`` (Tigon's, the reference and TRL's plain computation differ only in ``token_logps``).

    ``formed``: None, or a function taking this function's arguments (less ``formed``) that returns the same output
    with the policy's gradients formed in its forward (:func:`tigon.ops.preference_formed.formed_pair_loss`), or None
    where it cannot (then the path above runs)."""
    _checks.number("alpha", alpha)
    if formed is not None:
        out = formed(token_logps, formula, hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias,
                     ref_chosen_logps, ref_rejected_logps, ignore_index=ignore_index,
                     average_log_prob=average_log_prob, compute_nll_loss=compute_nll_loss, alpha=alpha, **options)
        if out is not None:
            return out
    pairs = pair_logps(token_logps, hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias, ref_chosen_logps,
                       ref_rejected_logps, ignore_index=ignore_index, average_log_prob=bool(average_log_prob))
    return preference_output(pairs, hidden, weight, bias, *formula(pairs, **options),
                             compute_nll_loss=bool(compute_nll_loss), alpha=float(alpha))
