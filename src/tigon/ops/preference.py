"""Preference losses on an LM head without its logits: the public ops :func:`fused_linear_dpo_loss` (and its record),
:func:`fused_linear_simpo_loss`, :func:`fused_linear_cpo_loss`, :func:`fused_linear_orpo_loss` and the unpaired
:func:`fused_linear_kto_loss`.

Each runs the fused linear log-prob primitive's kernels (:func:`tigon.functional.fused_linear_logprobs`) over the
policy's chosen and rejected sequences (and a reference model's, without gradient: DPO, KTO), then the loss's formula
on the per-sequence log-probabilities (:mod:`tigon.reference.preference`; the shared batch logic in
:mod:`tigon.reference.pairs`). With gradients wanted, the paired losses form the policy's gradients in the forward,
pair by pair (KTO sequence by sequence; :mod:`tigon.ops.preference_formed`: 3 policy matmuls, the reference model's
logits in the same chunk loop and buffer: 1 more); otherwise the reference model runs a forward pass of its own under
``torch.no_grad``, autograd differentiates the formula and the primitive's backward recomputes the logits chunk by
chunk (4 policy matmuls).
No (tokens, vocab) tensor is ever held. Liger-Kernel's ``LigerFusedLinear{DPO,SimPO,CPO,ORPO}Loss`` (0.8.5) compute
the same losses with ``torch.func`` over chunks of ``chunk_size`` pairs, materialising each chunk's logits in fp32.
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from .. import _checks
from ..reference import kto as ref_kto
from ..reference import preference as ref
from ..reference.kto import KTOOutput
from ..reference.pairs import PreferenceOutput
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn, sizes, targets
from .fused_linear_cross_entropy import memory_plan
from .fused_linear_logprobs import fused_linear_logprobs, trl_linear_logprobs
from .preference_formed import formed_kto_loss, formed_pair_loss

_MEMORY = """memory: the memory the primitive may hold beside its inputs and gradients, as in
            :func:`tigon.functional.fused_linear_logprobs` (``"auto"``, ``"low"`` or bytes). With the gradients formed
            in the forward, ``"auto"`` on CUDA holds chunks of at most 2**28 logits (at least one pair or sequence)
            beside the fp32 grad_weight accumulator (:data:`tigon.ops.preference_formed.PAIR_CHUNK_LOGITS_CUDA`; about
            2.5 GiB at Llama-3-8B's head by arithmetic), and a budget below that accumulator accumulates grad_weight in
            the weight's dtype (Liger-Kernel's way) in chunks as large as the budget allows."""


def _run(op: str, formula: str, opts: dict, **fixed):
    """The body of the public ops: the reference on the PyTorch backends, else the loss (``formula`` of
    :data:`tigon.reference.preference.LOSSES`, or ``"kto"``) on the fused primitive."""
    memory = opts.pop("memory")
    _checks.tensor("hidden", opts["hidden"], floating=True, ndim=3)
    spec = ref_kto if formula == "kto" else ref
    memory_plan(memory, None, opts["weight"])  # a bad memory fails before any pass, on every backend
    if select_backend(op, opts["hidden"]) in TORCH_CODE:
        return getattr(spec, op)(**opts)
    token_logps = functools.partial(fused_linear_logprobs, memory=memory)
    if formula == "kto":
        return ref_kto.kto_with(token_logps, **opts, formed=functools.partial(formed_kto_loss, memory=memory))
    options = {**fixed, **opts}
    formed = functools.partial(formed_pair_loss, coupled=ref.couples_pairs(formula, options), memory=memory,
                               loss=formula)
    return ref.loss_with(formula, token_logps, **options, formed=formed)


def fused_linear_dpo_loss(hidden, weight, target, bias=None, ref_hidden=None, ref_weight=None, ref_bias=None, *,
                          ref_chosen_logps=None, ref_rejected_logps=None, ignore_index: int = -100, beta: float = 0.1,
                          loss_type="sigmoid", loss_weights=None, label_smoothing: float = 0.0,
                          discopop_tau: float = 0.05, f_divergence_type: str = "reverse_kl",
                          f_alpha_divergence_coef: float = 0.5, compute_nll_loss: bool = False, alpha: float = 1.0,
                          average_log_prob: bool = False, memory: str | int = "auto") -> PreferenceOutput:
    """Direct Preference Optimization loss (and its TRL variants) from the LM head's hidden states, without logits.

    Rafailov et al. 2023, "Direct Preference Optimization", eq. 7, and every ``loss_type`` of TRL 1.16's
    ``DPOTrainer`` (formulas and sources: :mod:`tigon.reference.preference`), with Liger-Kernel's batch layout and
    metrics (``LigerFusedLinearDPOLoss``, whose loss types are a subset; its ``ipo`` raises, this one follows TRL).

    Args:
        hidden: (B, T, H) float32 / bfloat16 / float16 policy final hidden states; B = 2P, the P chosen sequences
            first, then the P rejected ones (pair i: rows i and P + i). Any strides.
        weight: (V, H) the policy's LM head; bias: optional (V,).
        target: (B, T) integer next-token ids, ``ignore_index`` at prompt and padding positions.
        ref_hidden, ref_weight, ref_bias: the reference model's (B, T, H_ref) hidden states, (V, H_ref) head and
            optional (V,) bias: its log-probabilities are computed in the same call, without gradient. Or None.
        ref_chosen_logps, ref_rejected_logps: (P,) precomputed reference log-probabilities (TRL's
            ``precompute_ref_log_probs``), on the scale ``average_log_prob`` selects; or None. With neither a
            reference model nor these, the reference log-probabilities are 0 (Liger's ``use_ref_model=False``).
        ignore_index: target value of unscored tokens.
        beta: the KL coefficient (IPO's tau); >= 0 (> 0 for ``ipo`` and ``sppo_hard``, which divide by it).
        loss_type: one of :data:`tigon.reference.preference.DPO_LOSS_TYPES`, or a sequence of them combined as
            ``sum_k loss_weights[k] * loss_k`` (TRL's MPO-style ``loss_weights``; None: weights 1).
        label_smoothing: robust DPO / cDPO's flip probability in [0, 0.5), EXO's epsilon (> 0), AOT's smoothing.
        discopop_tau: DiscoPOP's temperature, > 0.
        f_divergence_type, f_alpha_divergence_coef: TRL's f-DPO regulariser (``"reverse_kl"``: plain DPO).
        compute_nll_loss, alpha: add ``alpha`` times the chosen tokens' mean NLL (Liger's; RPO, Pang et al. 2024).
        average_log_prob: per-token average log-probabilities instead of sums (Liger's option).
        {memory}

    Returns:
        :class:`tigon.reference.pairs.PreferenceOutput` (float32; float64 for float64 inputs): the 0-d loss (mean
        over pairs; differentiable w.r.t. hidden, weight and bias), then Liger's aux outputs (chosen / rejected
        log-probs, logits means, NLL, rewards ``beta (logp - ref_logp)``), detached;
        ``tigon.reference.pairs.liger_tuple`` gives Liger's ``(loss, aux)`` tuple. The caller's tensors are never
        written.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, devices (:func:`tigon.reference.pairs.check_batch`), a target
            outside [0, V) other than ``ignore_index``, an unknown loss_type or f_divergence_type, options out of
            range (:func:`tigon.reference.preference.check_dpo_options`), a bad ``memory``.
    """
    return _run("fused_linear_dpo_loss", "dpo", dict(hidden=hidden, weight=weight, target=target, bias=bias,
        ref_hidden=ref_hidden, ref_weight=ref_weight, ref_bias=ref_bias, ref_chosen_logps=ref_chosen_logps,
        ref_rejected_logps=ref_rejected_logps, ignore_index=ignore_index, beta=beta, loss_type=loss_type,
        loss_weights=loss_weights, label_smoothing=label_smoothing, discopop_tau=discopop_tau,
        f_divergence_type=f_divergence_type, f_alpha_divergence_coef=f_alpha_divergence_coef,
        compute_nll_loss=compute_nll_loss, alpha=alpha, average_log_prob=average_log_prob, memory=memory))


def fused_linear_cpo_loss(hidden, weight, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
                          loss_type: str = "sigmoid", label_smoothing: float = 0.0, gamma: float = 0.5,
                          compute_nll_loss: bool = True, alpha: float = 1.0, average_log_prob: bool = False,
                          memory: str | int = "auto") -> PreferenceOutput:
    """Contrastive Preference Optimization loss (reference-free) from the LM head's hidden states, without logits.

    Xu et al. 2024, "Contrastive Preference Optimization", eq. 3, with TRL's ``CPOTrainer`` loss types
    (``sigmoid``, ``hinge``, ``ipo``, ``simpo`` with margin ``gamma``, TRL's ``simpo_gamma``) and Liger's
    ``LigerFusedLinearCPOLoss`` defaults (summed log-probs, NLL term with weight ``alpha``).

    Args:
        hidden, weight, target, bias, ignore_index, compute_nll_loss, alpha, average_log_prob: as
            :func:`fused_linear_dpo_loss`.
        beta: >= 0 (> 0 for ``ipo``); loss_type: one of :data:`tigon.reference.preference.CPO_LOSS_TYPES`;
            label_smoothing: in [0, 1).
        gamma: SimPO's target reward margin (``loss_type="simpo"`` only).
        {memory}

    Returns:
        :class:`tigon.reference.pairs.PreferenceOutput`; rewards ``beta * logp``.

    Raises:
        TypeError, ValueError: as :func:`fused_linear_dpo_loss` (options: ``check_cpo_options``).
    """
    return _run("fused_linear_cpo_loss", "cpo", dict(hidden=hidden, weight=weight, target=target, bias=bias,
        ignore_index=ignore_index, beta=beta, loss_type=loss_type, label_smoothing=label_smoothing, gamma=gamma,
        compute_nll_loss=compute_nll_loss, alpha=alpha, average_log_prob=average_log_prob, memory=memory))


def fused_linear_simpo_loss(hidden, weight, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
                            gamma: float = 0.5, label_smoothing: float = 0.0, compute_nll_loss: bool = True,
                            alpha: float = 1.0, average_log_prob: bool = True,
                            memory: str | int = "auto") -> PreferenceOutput:
    """Simple Preference Optimization loss from the LM head's hidden states, without logits:
    ``-log sigma(beta (logp_w - logp_l) - gamma)`` on per-token average log-probabilities (Meng et al. 2024,
    "SimPO", eq. 6; label smoothing as TRL's CPOTrainer ``loss_type="simpo"``; Liger's ``LigerFusedLinearSimPOLoss``
    defaults: NLL term on, ``alpha`` 1).

    Args:
        As :func:`fused_linear_cpo_loss` (``gamma``: the target reward margin).
        {memory}

    Returns:
        :class:`tigon.reference.pairs.PreferenceOutput`; rewards ``beta * logp``.

    Raises:
        TypeError, ValueError: as :func:`fused_linear_cpo_loss`.
    """
    return _run("fused_linear_simpo_loss", "cpo", dict(hidden=hidden, weight=weight, target=target, bias=bias,
        ignore_index=ignore_index, beta=beta, gamma=gamma, label_smoothing=label_smoothing,
        compute_nll_loss=compute_nll_loss, alpha=alpha, average_log_prob=average_log_prob, memory=memory),
        loss_type="simpo")


def fused_linear_orpo_loss(hidden, weight, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
                           compute_nll_loss: bool = True, average_log_prob: bool = True,
                           memory: str | int = "auto") -> PreferenceOutput:
    """Odds Ratio Preference Optimization loss from the LM head's hidden states, without logits: the chosen tokens'
    NLL plus ``-beta mean log sigma(log odds(y_w) - log odds(y_l))`` (Hong et al. 2024, "ORPO", eqs. 4-7; TRL's
    ``ORPOTrainer.odds_ratio_loss``; Liger's ``LigerFusedLinearORPOLoss``, whose optional ``nll_target`` is not
    supported). ``log odds = logp - log(1 - exp(logp))`` is computed stably (``log1mexp``); a chosen log-probability
    that rounds to 0 (infinite odds) gives the term 0, as TRL, with finite gradients (TRL's and Liger's are NaN).

    Args:
        hidden, weight, target, bias, ignore_index, compute_nll_loss, average_log_prob: as
            :func:`fused_linear_dpo_loss`; beta: the odds-ratio term's weight (ORPO's lambda), >= 0.
        {memory}

    Returns:
        :class:`tigon.reference.pairs.PreferenceOutput` with ``log_odds_ratio`` and ``log_odds_chosen``.

    Raises:
        TypeError, ValueError: as :func:`fused_linear_dpo_loss`.
    """
    return _run("fused_linear_orpo_loss", "orpo", dict(hidden=hidden, weight=weight, target=target, bias=bias,
        ignore_index=ignore_index, beta=beta, compute_nll_loss=compute_nll_loss, average_log_prob=average_log_prob,
        memory=memory))


def fused_linear_kto_loss(hidden, weight, target, preference_labels, bias=None, ref_hidden=None, ref_weight=None,
                          ref_bias=None, *, ref_logps=None, kl=None, ignore_index: int = -100, beta: float = 0.1,
                          loss_type: str = "kto", desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
                          average_log_prob: bool = False, memory: str | int = "auto") -> KTOOutput:
    """Kahneman-Tversky Optimization loss (unpaired) from the LM head's hidden states, without logits.

    Ethayarajh et al. 2024, "KTO", eq. 7, and TRL 1.16's ``KTOTrainer`` loss types (``kto``,
    ``apo_zero_unpaired``); Liger's ``LigerFusedLinearKTOLoss`` metrics (formulas: :mod:`tigon.reference.kto`).

    Args:
        hidden: (B, T, H) float32 / bfloat16 / float16 policy final hidden states (any B >= 1, any order).
        weight, target, bias, ref_hidden, ref_weight, ref_bias, ignore_index, average_log_prob: as
            :func:`fused_linear_dpo_loss`.
        preference_labels: (B,) bool, True for a desirable completion.
        ref_logps: (B,) precomputed reference log-probabilities, or None (0 without a reference model either).
        kl: the KL estimate ``z``: a float, or a 0-d, (1,) or (B,) floating tensor (no gradient); None for 0.
        beta: >= 0; loss_type: ``"kto"`` or ``"apo_zero_unpaired"``; desirable_weight, undesirable_weight: >= 0.
        {memory}

    Returns:
        :class:`tigon.reference.kto.KTOOutput`: the 0-d loss (mean over the B sequences; differentiable w.r.t.
        hidden, weight, bias), then Liger's sums of log-probs, logits and rewards per group, detached.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, devices, labels not a (B,) bool tensor, a ``kl`` of another
            shape, options out of range (:func:`tigon.reference.kto.check_kto_options`), a bad ``memory``.
    """
    return _run("fused_linear_kto_loss", "kto", dict(hidden=hidden, weight=weight, target=target,
        preference_labels=preference_labels, bias=bias, ref_hidden=ref_hidden, ref_weight=ref_weight,
        ref_bias=ref_bias, ref_logps=ref_logps, kl=kl, ignore_index=ignore_index, beta=beta, loss_type=loss_type,
        desirable_weight=desirable_weight, undesirable_weight=undesirable_weight, average_log_prob=average_log_prob,
        memory=memory))


for _f in (fused_linear_dpo_loss, fused_linear_cpo_loss, fused_linear_simpo_loss, fused_linear_orpo_loss,
           fused_linear_kto_loss):
    _f.__doc__ = _f.__doc__.replace("{memory}", _MEMORY)


# ---- originals: TRL's computation (the logits materialised at the input dtype, then upcast) -----------------------
def _original(fn, formula: str, **fixed):
    op = fn.__name__
    signature = inspect.signature(fn)

    def original(**opts):
        bound = signature.bind(**opts)
        bound.apply_defaults()
        args = dict(bound.arguments)
        args.pop("memory")
        return ref.loss_with(formula, trl_linear_logprobs, **fixed, **args)

    original.__name__ = original.__qualname__ = f"trl_{op}"
    original.__doc__ = (f"TRL's computation of :func:`{op}`: the LM head (``F.linear``) at the input dtype, fp32 "
                        "logits, log-softmax gathered at the targets, then the same formula.")
    return original


# ---- the records ---------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen, pairs: int = 2, ignore_every: int = 0, bias: bool = False,
            reference: str = "logps") -> dict:
    """A preference batch: ``pairs`` chosen then ``pairs`` rejected sequences of ``tokens // (2 pairs)`` positions
    (at least 1), hidden (B, T, hidden), an LM head (vocab, hidden) with logits of std ~2, targets (every
    ``ignore_every``-th -100); ``reference`` ``"model"``: a reference model near the policy (hidden states and head
    perturbed by 50% and 30%: far enough that the rewards, differences of the two, are no cancellation),
    ``"logps"``: given reference log-probabilities, ``"none"``: neither."""
    b, h, v = 2 * pairs, s["hidden"], s["vocab"]
    t = max(1, s["tokens"] // b)
    hidden = randn(gen, (b, t, h), torch.float32, device)
    w = randn(gen, (v, h), torch.float32, device, 2.0 / math.sqrt(h))
    out = dict(hidden=hidden.to(dtype), weight=w.to(dtype),
               target=targets(gen, b * t, v, device, ignore_every).reshape(b, t))
    if bias:
        out["bias"] = randn(gen, (v,), dtype, device, 0.5)
    if reference == "model":
        out["ref_hidden"] = (hidden + randn(gen, (b, t, h), torch.float32, device, 0.5)).to(dtype)
        out["ref_weight"] = (w * (1 + randn(gen, (v, h), torch.float32, device, 0.3))).to(dtype)
    elif reference == "logps":
        out["ref_chosen_logps"] = randn(gen, (pairs,), torch.float32, device, 1.0, -2.0 * t)
        out["ref_rejected_logps"] = randn(gen, (pairs,), torch.float32, device, 1.0, -2.0 * t)
    return out


def _record(fn, formula: str, summary: str, cases: tuple, fixed=None, bench_inputs=(), **extra) -> OpSpec:
    name = fn.__name__
    return OpSpec(
        name=name, summary=summary, fn=fn, reference=getattr(ref, name),
        original=_original(fn, formula, **(fixed or {})),
        original_name="TRL: HF LM head (F.linear in the input dtype), fp32 logits, log-softmax gathered, summed per "
                      "sequence, then the loss's formula",
        make_inputs=_inputs,
        shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden, "vocab": m.vocab},
        **sizes("tokens", "hidden", "vocab"),
        grad_inputs=("hidden", "weight"),
        category="lm_head_loss",
        bench_inputs={"ignore_every": 10, **bench_inputs},
        cases=cases,
        **extra,
    )


def _liger_dpo(hidden, weight, target, bias=None, ref_hidden=None, ref_weight=None, ref_bias=None, **_):
    # LigerFusedLinearDPOFunction.apply(_input, weight, target, bias, ref_input, ref_weight, ref_bias, ...)
    from liger_kernel.chunked_loss.functional import liger_fused_linear_dpo

    return liger_fused_linear_dpo(hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias, -100, 0.1, False,
                                  True, ref_hidden is not None)[0]


RECORDS = (
    _record(
        fused_linear_dpo_loss, "dpo",
        "DPO (every TRL loss_type) on an LM head, policy and reference in one call, without the logits",
        # the floor: the reference model's logits and the policy's (2 matmuls), with the gradients 2 more
        # (grad_hidden, grad_weight); Tigon forms them in the forward (formed_pair_loss), so its forward does all 4
        # when the inputs need gradients
        flops=lambda s, mode: (4 if mode == "fwd" else 8) * s["tokens"] * s["hidden"] * s["vocab"],
        grads_in_forward=("tigon", "tigon_lean", "tigon_416mib", "tigon_1gib", "tigon_3gib", "tigon_compile"),
        tigon_compile=True,  # a compiled training step: the gradients still formed in the forward (formed_grads)
        peers={"liger": _liger_dpo},
        bench_notes={"tigon_1gib": "memory=1 << 30: at Llama-3-8B's head the fp32 grad_weight accumulator does not "
                                   "fit, so it accumulates in the weight's dtype (as Liger-Kernel's DPO), in 2 chunks "
                                   "of 2 pairs",
                     "tigon_416mib": "memory=13 << 25 (416 MiB of chunk): bf16 grad_weight, each pair's kept rows "
                                     "in chunks of at most 1,536, the rest formed twice (preference_formed."
                                     "_formed_plan: issue 29's <= 1.5 GiB at about 3.17 policy matmuls a row)",
                     "tigon_3gib": "memory=3 << 30: the fused cross-entropy's 3 GiB rule (before issue 29: 2 chunks "
                                   "of 2 pairs at Llama-3-8B's head and 8192 tokens, 0.49 GiB more than 'auto')"},
        # issue 29's row (--tokens 8192: 4 pairs x 1024 positions): the reference model in the same call
        bench_inputs={"reference": "model", "pairs": 4},
        cases=(
            Case(),
            Case("reference model", inputs={"reference": "model", "ignore_every": 5}),
            Case("ipo, averaged, bias", options={"loss_type": "ipo", "average_log_prob": True},
                 inputs={"bias": True, "ignore_every": 3}, variants=("model",)),
            Case("robust + nll, reference-free", options={"loss_type": "robust", "label_smoothing": 0.1,
                                                          "compute_nll_loss": True},
                 inputs={"reference": "none", "ignore_every": 4}, variants=("model",)),
            Case("bench: memory=low", options={"memory": "low"}, tags=frozenset({"bench"}), provider="tigon_lean"),
            Case("bench: memory=416 MiB", options={"memory": 13 << 25}, tags=frozenset({"bench"}),
                 provider="tigon_416mib"),
            Case("bench: memory=1 GiB", options={"memory": 1 << 30}, tags=frozenset({"bench"}),
                 provider="tigon_1gib"),
            Case("bench: memory=3 GiB", options={"memory": 3 << 30}, tags=frozenset({"bench"}),
                 provider="tigon_3gib"),
        ),
    ),
)
