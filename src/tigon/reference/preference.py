"""Paired preference losses on sequence log-probabilities: the formulas, and the specification of
:func:`tigon.functional.fused_linear_dpo_loss`, ``fused_linear_simpo_loss``, ``fused_linear_cpo_loss`` and
``fused_linear_orpo_loss``.

Each formula is a small pure function of :class:`tigon.reference.pairs.PairLogps` (the policy's and the reference
model's per-sequence log-probabilities ``c = log pi(y_w|x)``, ``r = log pi(y_l|x)``, ``c_ref``, ``r_ref``) returning
``(loss, chosen_rewards, rejected_rewards, *extra)``; the loss is the per-pair loss averaged over the P pairs. The
per-token log-probabilities under them come from :mod:`tigon.reference.pairs` (here with the materialised-logits
reference :func:`tigon.reference.fused_linear_logprobs.fused_linear_logprobs`, so float64 inputs give the float64
truth).

DPO (:func:`dpo`): every ``loss_type`` of TRL 1.16's ``DPOTrainer`` (``trl/trainer/dpo_trainer.py``,
``DPOTrainer._compute_loss``), with ``u_c = c - c_ref``, ``u_r = r - r_ref`` (the log-ratios; ``c_ref = r_ref = 0``
without a reference, Liger-Kernel's reference-free convention), scores ``s = f'(u)`` of the f-divergence
(``reverse_kl``: ``s = u``; Wang et al. 2023, f-DPO), ``d = s_c - s_r`` and ``sigma`` the logistic function:

    sigmoid       -log sigma(beta d)                                    Rafailov et al. 2023, DPO, eq. 7
    hinge         relu(1 - beta d)                                      Zhao et al. 2023, SLiC
    ipo           (d' - 1 / (2 beta))^2, d' = s_c / n_c - s_r / n_r     Azar et al. 2023, IPO, eq. 17 (TRL's length
                                                                        normalisation)
    exo_pair      sigma(beta d) (log sigma(beta d) - log(1 - eps)) + sigma(-beta d) (log sigma(-beta d) - log eps)
                                                                        Ji et al. 2024, EXO, eq. 16
    nca_pair      -log sigma(beta u_c) - log sigma(-beta u_c) / 2 - log sigma(-beta u_r) / 2   Chen et al. 2024, NCA
    robust        (-(1 - eps) log sigma(beta d) + eps log sigma(-beta d)) / (1 - 2 eps)   Chowdhury et al. 2024
    bco_pair      -log sigma(beta u_c) - log sigma(-beta u_r)           Jung et al. 2024, BCO
    sppo_hard     (u_c - 1 / (2 beta))^2 + (u_r + 1 / (2 beta))^2        Wu et al. 2024, SPPO, eq. 4.7 (hard)
    aot           -(1 - eps) log sigma(beta a) - eps log sigma(-beta a), a = sort(c - r) - sort(c_ref - r_ref)
    aot_unpaired  the same with a = sort(u_c) - sort(u_r)               Melnyk et al. 2024, AOT (sorted over the batch)
    apo_zero      1 - sigma(beta u_c) + sigma(beta u_r)                 D'Oosterlinck et al. 2024, APO, eq. 7
    apo_down      sigma(beta u_c) + 1 - sigma(beta (u_c - u_r))          APO, eq. 8
    discopop      -log sigma(x) (1 - m) + exp(-x) m, x = beta d, m = sigma(x / tau)   Chris Lu et al. 2024, eq. 5
    sft           the NLL of the chosen tokens (every pair gets the batch's value)
    sigmoid_norm  -log sigma(beta d'), d' as for ipo

(eps = ``label_smoothing``, n_c / n_r the completion lengths.) Several types combine as ``sum_k w_k mean(l_k)``
(TRL's ``loss_weights``). Rewards: ``beta u_c``, ``beta u_r``. With ``average_log_prob`` the log-probabilities are
already per-token averages and ``ipo`` / ``sigmoid_norm`` do not divide again.

SimPO / CPO (:func:`cpo`, TRL's ``CPOTrainer.cpo_loss``, ``trl/experimental/cpo``; Liger's SimPO and CPO): with
``g = beta (c - r)``, ``sigmoid`` ``-(1 - eps) log sigma(g) - eps log sigma(-g)`` (Xu et al. 2024, CPO, eq. 3),
``simpo`` the same with ``g = beta (c - r) - gamma`` (Meng et al. 2024, SimPO, eq. 6, on averaged log-probs),
``hinge`` ``relu(1 - g)``, ``ipo`` ``(c - r - 1 / (2 beta))^2``. Rewards ``beta c``, ``beta r``.

ORPO (:func:`orpo`, TRL's ``ORPOTrainer.odds_ratio_loss``, Hong et al. 2024, eqs. 4 and 7): ``log odds(y) = logp -
log(1 - exp(logp))``; loss ``-beta mean log sigma(log odds(y_w) - log odds(y_l))``; extras ``mean log sigma(.)`` and
``mean (log odds(y_w) - log odds(y_l))``. A pair with an empty completion (every token ignored) adds 0 to the
loss and to both means (no odds: TRL's average would be 0 / 0).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from .. import _checks
from .fused_linear_logprobs import fused_linear_logprobs as _token_logps
from .pairs import PairLogps, PreferenceOutput, run

DPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
                  "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm")
"""TRL 1.16 ``DPOConfig.loss_type``'s values, all covered."""
F_DIVERGENCE_TYPES = ("reverse_kl", "forward_kl", "js_divergence", "alpha_divergence")
"""TRL's ``DPOConfig.f_divergence_type`` values."""
F_DIVERGENCE_LOSS_TYPES = frozenset({"sigmoid", "sigmoid_norm", "hinge", "ipo", "exo_pair", "robust", "discopop",
                                     "sft"})
"""The loss types TRL allows with an f-divergence other than ``reverse_kl``."""
CPO_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "simpo")
"""TRL's ``CPOConfig.loss_type`` values."""


# ---- option checks -------------------------------------------------------------------------------------------------
_BETA_DIVIDES = frozenset({"ipo", "sppo_hard"})
"""The loss types whose formula divides by beta (``1 / (2 beta)``): beta must be > 0 there, >= 0 elsewhere (0 is a
legitimate ablation, e.g. ORPO as plain NLL, and Liger-Kernel takes it)."""


def _beta(beta, types=()) -> float:
    """``beta`` as a float: >= 0, and > 0 when a loss type of ``types`` divides by it (:data:`_BETA_DIVIDES`).

    Raises:
        TypeError: not a real number. ValueError: negative or not finite, or 0 where it divides.
    """
    b = _checks.number("beta", beta, minimum=0.0)
    divides = sorted(_BETA_DIVIDES.intersection(types))
    if b == 0.0 and divides:
        raise ValueError(f"beta must be > 0 for loss_type {divides} (its formula divides by beta), got {beta!r}")
    return b


def dpo_loss_types(loss_type, loss_weights) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """``loss_type`` (a name or a sequence of names of :data:`DPO_LOSS_TYPES`) and ``loss_weights`` (None: 1 each)
    as two tuples.

    Raises:
        ValueError: an unknown or empty loss_type, loss_weights of another length.
        TypeError: loss_type neither a name nor a sequence of names (None said "'NoneType' object is not
            iterable", naming nothing), loss_weights not a sequence, a weight not a number.
    """
    if not isinstance(loss_type, (str, Iterable)):
        raise TypeError(f"loss_type must be a loss type's name or a list of them, got {type(loss_type).__name__} "
                        f"{loss_type!r}")
    if loss_weights is not None and (isinstance(loss_weights, str) or not isinstance(loss_weights, Iterable)):
        raise TypeError(f"loss_weights must be None or a list of numbers (one per loss_type), got "
                        f"{type(loss_weights).__name__} {loss_weights!r}")
    types = (loss_type,) if isinstance(loss_type, str) else tuple(loss_type)
    if not types:
        raise ValueError("loss_type must name at least one loss")
    for t in types:
        _checks.choice("loss_type", t, DPO_LOSS_TYPES)
    if loss_weights is None:
        return types, (1.0,) * len(types)
    weights = tuple(_checks.number("loss_weights", w) for w in loss_weights)
    if len(weights) != len(types):
        raise ValueError(f"loss_weights must have one weight per loss_type ({len(types)}), got {len(weights)}")
    return types, weights


def check_dpo_options(beta=0.1, loss_type="sigmoid", loss_weights=None, label_smoothing=0.0, discopop_tau=0.05,
                      f_divergence_type="reverse_kl", f_alpha_divergence_coef=0.5) -> None:
    """Validate :func:`dpo`'s options (TRL's and Liger-Kernel's rules).

    Raises:
        ValueError: as :func:`dpo_loss_types`; beta < 0, or 0 with ``ipo`` / ``sppo_hard``; label_smoothing
            outside [0, 1), outside [0, 0.5) with ``robust``, or 0 with ``exo_pair``; discopop_tau <= 0; an
            unknown f_divergence_type, or one other than ``reverse_kl`` with a loss type outside
            :data:`F_DIVERGENCE_LOSS_TYPES`.
        TypeError: a number that is not one.
    """
    types, _ = dpo_loss_types(loss_type, loss_weights)
    _beta(beta, types)
    eps = _checks.number("label_smoothing", label_smoothing, minimum=0.0)
    if eps >= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    if "robust" in types and eps >= 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5) for loss_type 'robust', got {label_smoothing!r}")
    if "exo_pair" in types and eps <= 0.0:
        raise ValueError("label_smoothing must be > 0 for loss_type 'exo_pair' (the EXO paper recommends 1e-3)")
    if not _checks.number("discopop_tau", discopop_tau) > 0.0:
        raise ValueError(f"discopop_tau must be > 0, got {discopop_tau!r}")
    _checks.choice("f_divergence_type", f_divergence_type, F_DIVERGENCE_TYPES)
    _checks.number("f_alpha_divergence_coef", f_alpha_divergence_coef)
    if f_divergence_type != "reverse_kl" and not set(types) <= F_DIVERGENCE_LOSS_TYPES:
        raise ValueError(f"f_divergence_type {f_divergence_type!r} is only defined for the loss types "
                         f"{sorted(F_DIVERGENCE_LOSS_TYPES)}, got loss_type {list(types)}")


def check_cpo_options(beta=0.1, loss_type="sigmoid", label_smoothing=0.0, gamma=0.5) -> None:
    """Validate :func:`cpo`'s options.

    Raises:
        ValueError: loss_type not in :data:`CPO_LOSS_TYPES`, beta < 0 (0 with ``ipo``), label_smoothing outside [0, 1).
        TypeError: a number that is not one.
    """
    _checks.choice("loss_type", loss_type, CPO_LOSS_TYPES)
    _beta(beta, (loss_type,))
    if _checks.number("label_smoothing", label_smoothing, minimum=0.0) >= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    _checks.number("gamma", gamma)


def _check_flags(**flags) -> None:
    for name, v in flags.items():
        if not isinstance(v, (bool, numbers.Integral)):
            raise TypeError(f"{name} must be a bool, got {type(v).__name__} {v!r}")


# ---- the formulas --------------------------------------------------------------------------------------------------
def f_divergence_scores(logratio: torch.Tensor, kind: str, coef: float) -> torch.Tensor:
    """``f'(exp(u))`` of the f-divergence regulariser for log-ratios ``u`` (TRL's ``f_divergence_type``;
    Wang et al. 2023, "Beyond Reverse KL", table 1): reverse KL ``u``, forward KL ``1 - exp(-u)``, Jensen-Shannon
    ``log 2 + log sigma(u)``, alpha-divergence ``(exp((a - 1) u) - 1) / (a - 1)`` (exponent clamped at 80 as TRL
    does; ``u`` when ``|a - 1| < 1e-6``)."""
    if kind == "reverse_kl" or (kind == "alpha_divergence" and abs(coef - 1.0) < 1e-6):
        return logratio
    if kind == "forward_kl":
        return 1 - torch.exp(-logratio)
    if kind == "js_divergence":
        return math.log(2) + F.logsigmoid(logratio)
    return torch.expm1(torch.clamp((coef - 1.0) * logratio, max=80.0)) / (coef - 1.0)


def dpo(pairs: PairLogps, *, beta: float = 0.1, loss_type="sigmoid", loss_weights=None, label_smoothing: float = 0.0,
        discopop_tau: float = 0.05, f_divergence_type: str = "reverse_kl", f_alpha_divergence_coef: float = 0.5):
    """The DPO family's loss (module docstring; TRL 1.16's ``DPOTrainer``) and its rewards.

    Returns:
        (loss 0-d, chosen_rewards (P,), rejected_rewards (P,)).

    Options are checked by :func:`check_dpo_options` (:func:`loss_with` calls it first).
    """
    types, weights = dpo_loss_types(loss_type, loss_weights)
    beta, eps = float(beta), float(label_smoothing)
    c, r = pairs.chosen, pairs.rejected
    c_ref = pairs.ref_chosen if pairs.ref_chosen is not None else torch.zeros_like(c)
    r_ref = pairs.ref_rejected if pairs.ref_rejected is not None else torch.zeros_like(r)
    u_c, u_r = c - c_ref, r - r_ref
    s_c = f_divergence_scores(u_c, f_divergence_type, float(f_alpha_divergence_coef))
    s_r = f_divergence_scores(u_r, f_divergence_type, float(f_alpha_divergence_coef))
    d = s_c - s_r
    n_c = torch.ones_like(c) if pairs.averaged else pairs.chosen_tokens.clamp(min=1)
    n_r = torch.ones_like(r) if pairs.averaged else pairs.rejected_tokens.clamp(min=1)

    def smoothed(x):  # -(1 - eps) log sigma(x) - eps log sigma(-x)
        return -(1 - eps) * F.logsigmoid(x) - eps * F.logsigmoid(-x)

    def per_pair(kind: str) -> torch.Tensor:
        x = beta * d
        if kind == "sigmoid":
            return -F.logsigmoid(x)
        if kind == "hinge":
            return torch.relu(1 - x)
        if kind == "ipo":
            return (s_c / n_c - s_r / n_r - 1 / (2 * beta)) ** 2
        if kind == "exo_pair":
            return (torch.sigmoid(x) * (F.logsigmoid(x) - math.log1p(-eps))
                    + torch.sigmoid(-x) * (F.logsigmoid(-x) - math.log(eps)))
        if kind == "nca_pair":
            return -F.logsigmoid(beta * u_c) - 0.5 * F.logsigmoid(-beta * u_c) - 0.5 * F.logsigmoid(-beta * u_r)
        if kind == "robust":
            return ((1 - eps) * -F.logsigmoid(x) + eps * F.logsigmoid(-x)) / (1 - 2 * eps)
        if kind == "bco_pair":
            return -F.logsigmoid(beta * u_c) - F.logsigmoid(-beta * u_r)
        if kind == "sppo_hard":
            return (u_c - 0.5 / beta) ** 2 + (u_r + 0.5 / beta) ** 2
        if kind == "aot":
            return smoothed(beta * (torch.sort(c - r, dim=0)[0] - torch.sort(c_ref - r_ref, dim=0)[0]))
        if kind == "aot_unpaired":
            return smoothed(beta * (torch.sort(u_c, dim=0)[0] - torch.sort(u_r, dim=0)[0]))
        if kind == "apo_zero":
            return 1 - torch.sigmoid(beta * u_c) + torch.sigmoid(beta * u_r)
        if kind == "apo_down":
            return torch.sigmoid(beta * u_c) + 1 - torch.sigmoid(beta * (u_c - u_r))
        if kind == "discopop":
            # exp(-x) m as exp(-x + log m): TRL's product is inf * 0 = NaN once -x passes the dtype's exp range (x <
            # -88.7 in float32: beta = 0.1 and log-ratios 887 apart), where the term is exp(x (1 / tau - 1)) -> 0
            m = torch.sigmoid(x / float(discopop_tau))
            return -F.logsigmoid(x) * (1 - m) + torch.exp(F.logsigmoid(x / float(discopop_tau)) - x)
        if kind == "sft":
            return pairs.nll.expand(c.shape)
        return -F.logsigmoid(beta * (s_c / n_c - s_r / n_r))  # sigmoid_norm

    loss = sum(w * per_pair(t).mean() for t, w in zip(types, weights))
    return loss, beta * u_c, beta * u_r


def cpo(pairs: PairLogps, *, beta: float = 0.1, loss_type: str = "sigmoid", label_smoothing: float = 0.0,
        gamma: float = 0.5):
    """The reference-free CPO / SimPO loss (module docstring; ``gamma`` is SimPO's target reward margin, TRL's
    ``simpo_gamma``) and its rewards ``beta c``, ``beta r``.

    Returns:
        (loss 0-d, chosen_rewards (P,), rejected_rewards (P,)).

    Options are checked by :func:`check_cpo_options`.
    """
    beta, eps = float(beta), float(label_smoothing)
    diff = pairs.chosen - pairs.rejected
    if loss_type == "hinge":
        losses = torch.relu(1 - beta * diff)
    elif loss_type == "ipo":
        losses = (diff - 1 / (2 * beta)) ** 2
    else:
        g = beta * diff - (float(gamma) if loss_type == "simpo" else 0.0)
        losses = -(1 - eps) * F.logsigmoid(g) - eps * F.logsigmoid(-g)
    return losses.mean(), beta * pairs.chosen, beta * pairs.rejected


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate on both sides of ``-log 2`` (Maechler 2012, "Accurately Computing
    log(1 - exp(-|a|))"); -inf at 0. Each branch reads only its own side (the other gets a stand-in), so the branch
    not taken adds no NaN to the gradient: ``log1p(-exp(x))`` is -inf where exp(x) rounds to 1 (float32 x > -6e-8),
    and ``torch.where``'s backward multiplies its infinite slope by 0."""
    near = x > -math.log(2)
    return torch.where(near, torch.log(-torch.expm1(torch.where(near, x, -1.0))),
                       torch.log1p(-torch.exp(torch.where(near, -1.0, x))))


def _log_odds_ratio(c: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``log odds(c) - log odds(r)``, ``log odds(p) = p - log1mexp(p)``, for log-probabilities c, r <= 0: TRL's value,
    with its gradient taken at ``min(c, -eps)`` (eps: the dtype's). A chosen log-probability that rounds to 0 (every
    token certain, e.g. a short memorised answer) has infinite odds: the value is +inf (the odds-ratio term 0, as in
    TRL), but its slope is infinite too and the loss's backward multiplied it by the sigmoid's 0 (NaN gradients for the
    whole step in TRL and Liger-Kernel). There the clamped slope is 0 (the true one is finite, and the logits' share of
    it vanishes with the token's 1 - p)."""
    exact = (c - r) - (log1mexp(c) - log1mexp(r))
    cg = torch.clamp(c, max=-torch.finfo(c.dtype).eps)
    slope = (cg - r) - (log1mexp(cg) - log1mexp(r))
    return slope + (exact - slope).detach()


def orpo(pairs: PairLogps, *, beta: float = 0.1):
    """ORPO's odds-ratio loss (module docstring) and its rewards and logged values.

    Returns:
        (loss 0-d, chosen_rewards (P,), rejected_rewards (P,), log_odds_ratio 0-d, log_odds_chosen 0-d).

    beta must be >= 0 (checked by :func:`loss_with`).
    """
    beta = float(beta)
    c, r = pairs.chosen, pairs.rejected
    # A pair with a completion of no scored tokens (all ignore_index) has no odds: its log-probability is the empty
    # sum 0, odds 1 / 0. It adds 0 to the odds-ratio term and to both logged means (which still divide by every
    # pair), with a zero gradient, instead of TRL's 0 / 0 NaN, which would take the whole batch's loss with it.
    empty = (pairs.chosen_tokens == 0) | (pairs.rejected_tokens == 0)
    safe_c, safe_r = torch.where(empty, -1.0, c), torch.where(empty, -2.0, r)  # (finite where the pair is dropped)
    log_odds = torch.where(empty, 0.0, _log_odds_ratio(safe_c, safe_r))
    ratio = torch.where(empty, 0.0, F.logsigmoid(log_odds))
    return -beta * ratio.mean(), beta * c, beta * r, ratio.mean(), log_odds.mean()


# ---- the specification of the public ops ---------------------------------------------------------------------------
LOSSES = {"dpo": (dpo, check_dpo_options), "cpo": (cpo, check_cpo_options),
          "orpo": (orpo, lambda beta=0.1: _beta(beta))}
"""Formula name -> (formula, its option check)."""


BATCH_COUPLED = frozenset({"aot", "aot_unpaired"})
"""The DPO loss types whose pair losses depend on other pairs (AOT sorts the batch). Every other formula here is a
mean over pairs of a function of the pair's own log-probabilities (plus the NLL, linear in the tokens'), so its
gradient w.r.t. a pair's tokens is known once that pair's log-probabilities are."""


def couples_pairs(name: str, options: dict) -> bool:
    """Whether the loss ``name`` of :data:`LOSSES` with ``options`` couples pairs (:data:`BATCH_COUPLED`)."""
    if name != "dpo":
        return False
    types, _ = dpo_loss_types(options.get("loss_type", "sigmoid"), options.get("loss_weights"))
    return bool(BATCH_COUPLED & set(types))


def loss_with(name: str, token_logps, hidden, weight, target, bias=None, ref_hidden=None, ref_weight=None,
              ref_bias=None, ref_chosen_logps=None, ref_rejected_logps=None, *, ignore_index: int = -100,
              compute_nll_loss: bool, average_log_prob: bool, alpha: float = 1.0, formed=None,
              **options) -> PreferenceOutput:
    """The paired preference loss ``name`` of :data:`LOSSES` with the per-token log-prob function ``token_logps``:
    the body of the public ops (``token_logps`` Tigon's kernels), of their references here (the materialised-logits
    reference) and of their originals (TRL's plain computation). Options are checked before any pass. ``formed``:
    :func:`tigon.reference.pairs.run`'s, called with ``coupled`` (:func:`couples_pairs`) bound by the caller."""
    formula, check = LOSSES[name]
    _check_flags(compute_nll_loss=compute_nll_loss, average_log_prob=average_log_prob)
    check(**options)
    return run(token_logps, formula, hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias,
               ref_chosen_logps, ref_rejected_logps, ignore_index=ignore_index, average_log_prob=average_log_prob,
               compute_nll_loss=compute_nll_loss, alpha=alpha, formed=formed, **options)


def fused_linear_dpo_loss(hidden, weight, target, bias=None, ref_hidden=None, ref_weight=None, ref_bias=None, *,
                          ref_chosen_logps=None, ref_rejected_logps=None, ignore_index: int = -100, beta: float = 0.1,
                          loss_type="sigmoid", loss_weights=None, label_smoothing: float = 0.0,
                          discopop_tau: float = 0.05, f_divergence_type: str = "reverse_kl",
                          f_alpha_divergence_coef: float = 0.5, compute_nll_loss: bool = False, alpha: float = 1.0,
                          average_log_prob: bool = False) -> PreferenceOutput:
    """DPO on an LM head with the logits materialised: the specification of
    :func:`tigon.functional.fused_linear_dpo_loss` (same arguments, less ``memory``)."""
    return loss_with("dpo", _token_logps, hidden=hidden, weight=weight, target=target, bias=bias,
        ref_hidden=ref_hidden, ref_weight=ref_weight, ref_bias=ref_bias, ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps, ignore_index=ignore_index, beta=beta, loss_type=loss_type,
        loss_weights=loss_weights, label_smoothing=label_smoothing, discopop_tau=discopop_tau,
        f_divergence_type=f_divergence_type, f_alpha_divergence_coef=f_alpha_divergence_coef,
        compute_nll_loss=compute_nll_loss, alpha=alpha, average_log_prob=average_log_prob)


def fused_linear_cpo_loss(hidden, weight, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
                          loss_type: str = "sigmoid", label_smoothing: float = 0.0, gamma: float = 0.5,
                          compute_nll_loss: bool = True, alpha: float = 1.0,
                          average_log_prob: bool = False) -> PreferenceOutput:
    """CPO with the logits materialised: the specification of :func:`tigon.functional.fused_linear_cpo_loss`."""
    return loss_with("cpo", _token_logps, hidden=hidden, weight=weight, target=target, bias=bias,
        ignore_index=ignore_index, beta=beta, loss_type=loss_type, label_smoothing=label_smoothing, gamma=gamma,
        compute_nll_loss=compute_nll_loss, alpha=alpha, average_log_prob=average_log_prob)


def fused_linear_simpo_loss(hidden, weight, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
                            gamma: float = 0.5, label_smoothing: float = 0.0, compute_nll_loss: bool = True,
                            alpha: float = 1.0, average_log_prob: bool = True) -> PreferenceOutput:
    """SimPO with the logits materialised: the specification of :func:`tigon.functional.fused_linear_simpo_loss`."""
    return loss_with("cpo", _token_logps, loss_type="simpo", hidden=hidden, weight=weight, target=target,
        bias=bias, ignore_index=ignore_index, beta=beta, gamma=gamma, label_smoothing=label_smoothing,
        compute_nll_loss=compute_nll_loss, alpha=alpha, average_log_prob=average_log_prob)


def fused_linear_orpo_loss(hidden, weight, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
                           compute_nll_loss: bool = True, average_log_prob: bool = True) -> PreferenceOutput:
    """ORPO with the logits materialised: the specification of :func:`tigon.functional.fused_linear_orpo_loss`."""
    return loss_with("orpo", _token_logps, hidden=hidden, weight=weight, target=target, bias=bias,
        ignore_index=ignore_index, beta=beta, compute_nll_loss=compute_nll_loss, average_log_prob=average_log_prob)
