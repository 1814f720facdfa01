"""Preference losses on an LM head without its logits: the public ops :func:`fused_linear_dpo_loss` (and its record),
:func:`fused_linear_simpo_loss`, :func:`fused_linear_cpo_loss`, :func:`fused_linear_orpo_loss` and the unpaired
:func:`fused_linear_kto_loss`.

Each runs the fused linear log-prob primitive's kernels (:func:`tigon.functional.fused_linear_logprobs`) over the
policy's chosen and rejected sequences, once more under ``torch.no_grad`` for a reference model (DPO), then the loss's
formula on the per-sequence log-probabilities (:mod:`tigon.reference.preference`; the shared batch logic in
:mod:`tigon.reference.pairs`). With gradients wanted, the paired losses form the policy's gradients in the forward,
pair by pair (KTO sequence by sequence; :func:`formed_pair_loss`, :func:`formed_kto_loss`: 3 policy matmuls);
otherwise autograd differentiates the formula and the primitive's backward recomputes the logits chunk by chunk (4).
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
from ..reference.pairs import (
    PreferenceOutput, check_batch, pair_logps, policy_and_reference, preference_output, sequence_logps,
)
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn, sizes, targets
from .fused_linear_cross_entropy import memory_plan
from .fused_linear_logprobs import fused_linear_logprobs, logprob_plan, trl_linear_logprobs

_MEMORY = """memory: the memory the primitive may hold beside its inputs and gradients, as in
            :func:`tigon.functional.fused_linear_logprobs` (``"auto"``, ``"low"`` or bytes). With the gradients
            formed in the forward, ``"auto"`` on CUDA holds chunks of at most 2**28 logits (at least one pair or
            sequence) beside the fp32 grad_weight accumulator (:data:`tigon.ops.preference.PAIR_CHUNK_LOGITS_CUDA`;
            about 2.6 GiB at Llama-3-8B's head), and a budget below that accumulator accumulates grad_weight in the
            weight's dtype (Liger-Kernel's way) in chunks as large as the budget allows."""


def _run(op: str, formula: str, opts: dict, **fixed):
    """The body of the public ops: the reference on the PyTorch backends, else the loss (``formula`` of
    :data:`tigon.reference.preference.LOSSES`, or ``"kto"``) on the fused primitive."""
    memory = opts.pop("memory")
    _checks.tensor("hidden", opts["hidden"], floating=True, ndim=3)
    spec = ref_kto if formula == "kto" else ref
    if select_backend(op, opts["hidden"]) in TORCH_CODE:
        return getattr(spec, op)(**opts)
    memory_plan(memory, None, opts["weight"])  # a bad memory fails before any pass
    token_logps = functools.partial(fused_linear_logprobs, memory=memory)
    if formula == "kto":
        return ref_kto.kto_with(token_logps, **opts, formed=functools.partial(formed_kto_loss, memory=memory))
    options = {**fixed, **opts}
    formed = functools.partial(formed_pair_loss, coupled=ref.couples_pairs(formula, options), memory=memory)
    return ref.loss_with(formula, token_logps, **options, formed=formed)


def formed_pair_loss(token_logps, formula, hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias,
                     ref_chosen_logps, ref_rejected_logps, *, ignore_index: int, average_log_prob: bool,
                     compute_nll_loss: bool, alpha: float, coupled: bool, memory="auto", **options):
    """A paired preference loss (:func:`tigon.reference.pairs.run`'s arguments; ``coupled``:
    :func:`tigon.reference.preference.couples_pairs`) with the policy's gradients formed in its forward: the
    :class:`~tigon.reference.pairs.PreferenceOutput`, or None where that is not possible here (then the
    log-probabilities' path runs, its backward recomputing the logits).

    Why it works: every formula is a mean over pairs of a function of the pair's own sequence log-probabilities, plus
    the NLL term, linear in the chosen tokens' log-probabilities with a coefficient that depends on the targets alone
    (AOT, which sorts the batch, is the exception: ``coupled``). So the rows are reordered pair by pair (chosen i,
    then rejected i: one copy of the hidden states, undone by autograd in the backward), chunks hold whole pairs (the
    whole batch when ``coupled``), and as soon as a chunk's log-probabilities are known, autograd through the
    formula on a batch whose other pairs hold placeholders (they do not reach the chunk's gradient) gives the
    loss's gradient w.r.t. them; :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward` turns it into
    the head's gradients in the same pass: 3 policy matmuls instead of 4. A reference model runs in the same chunk
    loop (:func:`_formed_pass`' ``ref``: its logits of the chunk's rows go into the chunk's buffer first, so the
    chunk's pairs have their reference log-probabilities before the formula runs): one more matmul, no buffer or pass
    of its own. The outputs then come from the formula on the log-probabilities without autograd, the loss plus the
    zero that carries the gradients (:class:`tigon.kernels.fused_linear_logprobs.FormedGradsFunction`).

    None when: no gradient is wanted, inside ``torch.compile``, a PyTorch backend or a matmul dtype the kernels do
    not take, or the unit of rows (a pair, or the batch when ``coupled``) does not fit a chunk.
    """
    b, t, h = hidden.shape
    check_batch(hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias, ref_chosen_logps, ref_rejected_logps)
    align = b * t if coupled else 2 * t
    plan = _formed_plan(hidden, weight, target, bias, ignore_index, memory, align)
    if plan is None:
        return None
    p = b // 2

    def by_pairs(x):  # (2P, T, ...) chosen then rejected -> (P * 2 * T, ...) pair by pair
        return x.reshape(2, p, t, *x.shape[2:]).transpose(0, 1).reshape(b * t, *x.shape[2:])

    def unpair(x):  # (P * 2 * T,) pair by pair -> (2P, T)
        return x.reshape(p, 2, t).transpose(0, 1).reshape(b, t)

    def ref_rows(r4):  # rows s .. e (whole pairs) of by_pairs(ref_hidden), copied chunk by chunk
        return lambda s, e: r4[:, s // (2 * t): e // (2 * t)].transpose(0, 1).reshape(e - s, r4.shape[-1])

    f32 = dict(dtype=torch.float32, device=hidden.device)
    ref_lp, ref = _reference(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index, memory, plan,
                             lambda rh: ref_rows(rh.reshape(2, p, t, rh.shape[-1])))
    kw = dict(ignore_index=ignore_index, average_log_prob=bool(average_log_prob))
    refs = (ref_hidden, ref_weight, ref_bias, ref_chosen_logps, ref_rejected_logps)
    zeros = torch.zeros((b, t), **f32)
    base = pair_logps(None, hidden, weight, target, bias, *refs, policy_lp=zeros,
                      ref_lp=zeros if ref is not None else ref_lp, **kw)
    lengths = torch.stack((base.chosen_tokens, base.rejected_tokens), 1).clamp(min=1)
    chosen_total = base.chosen_tokens.sum().clamp(min=1)
    fill, zero = torch.full((p,), -1.0, **f32), torch.zeros((p,), **f32)

    def chunk_loss(lp, ref_c, i, k):  # lp, ref_c (k pairs, 2, T): pairs i .. i + k - 1 (ref_c None: no model)
        def seq(x):
            return x.sum(-1) / lengths[i: i + k] if average_log_prob else x.sum(-1)

        s = seq(lp)
        nll = -lp[:, 0].sum() / chosen_total
        pairs = base._replace(chosen=torch.cat((fill[:i], s[:, 0], fill[i + k:])),
                              rejected=torch.cat((fill[:i], s[:, 1], fill[i + k:])), nll=nll)
        if ref_c is not None:  # the chunk's reference log-probabilities, 0 for the other pairs (unused)
            r = seq(ref_c)
            pairs = pairs._replace(ref_chosen=torch.cat((zero[:i], r[:, 0], zero[i + k:])),
                                   ref_rejected=torch.cat((zero[:i], r[:, 1], zero[i + k:])))
        loss = formula(pairs, **options)[0]
        return loss + alpha * nll if compute_nll_loss else loss

    anchor, logp, ref_logp = _formed_pass(by_pairs(hidden), weight, by_pairs(target), bias, plan, (2, t), align,
                                          chunk_loss, ref)
    with torch.no_grad():
        if ref_logp is not None:
            ref_lp = unpair(ref_logp)
        pairs = pair_logps(None, hidden, weight, target, bias, *refs, policy_lp=unpair(logp), ref_lp=ref_lp, **kw)
        out = preference_output(pairs, hidden, weight, bias, *formula(pairs, **options),
                                compute_nll_loss=bool(compute_nll_loss), alpha=float(alpha))
    return out._replace(loss=out.loss + anchor)


def formed_kto_loss(token_logps, hidden, weight, target, preference_labels, bias, ref_hidden, ref_weight, ref_bias, *,
                    ref_logps, kl, ignore_index: int, beta: float, loss_type: str, desirable_weight: float,
                    undesirable_weight: float, average_log_prob: bool, memory="auto"):
    """KTO (:func:`tigon.reference.kto.kto_with`'s arguments, checked there) with the policy's gradients formed in its
    forward, as :func:`formed_pair_loss` does for the paired losses (a reference model in the same chunk loop too):
    each sequence's loss depends on its own log-probability alone (the KL estimate ``kl`` is a given constant), so
    chunks of whole sequences suffice (no reordering). The :class:`~tigon.reference.kto.KTOOutput`, or None where
    not possible (as there)."""
    b, t, h = hidden.shape
    plan = _formed_plan(hidden, weight, target, bias, ignore_index, memory, t)
    if plan is None:
        return None
    f32 = dict(dtype=torch.float32, device=hidden.device)
    ref_lp, ref = _reference(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index, memory, plan,
                             lambda rh: (lambda s, e, r2=rh.reshape(b * t, rh.shape[-1]): r2[s:e]))
    kw = dict(ref_logps=ref_logps, kl=kl, ignore_index=ignore_index, beta=beta, loss_type=loss_type,
              desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
              average_log_prob=average_log_prob)
    refs = (ref_hidden, ref_weight, ref_bias)
    zeros = torch.zeros((b, t), **f32)
    _, n, _, ref_seq = policy_and_reference(None, hidden, weight, target, bias, *refs, ignore_index,
                                            bool(average_log_prob), zeros, zeros if ref is not None else ref_lp)
    length = n.clamp(min=1)
    fill, zero = torch.full((b,), -1.0, **f32), torch.zeros((b,), **f32)

    def chunk_loss(lp, ref_c, i, k):  # lp, ref_c (k sequences, T): sequences i .. i + k - 1 (ref_c None: no model)
        def seq(x):
            return x.sum(-1) / length[i: i + k] if average_log_prob else x.sum(-1)

        full = torch.cat((fill[:i], seq(lp), fill[i + k:]))
        rs = ref_seq if ref_c is None else torch.cat((zero[:i], seq(ref_c), zero[i + k:]))
        return ref_kto.kto_losses(full, rs, ref_logps, kl, preference_labels, beta, loss_type, desirable_weight,
                                  undesirable_weight)[0].mean()

    anchor, logp, ref_logp = _formed_pass(hidden.reshape(b * t, h), weight, target.reshape(b * t), bias, plan, (t,),
                                          t, chunk_loss, ref)
    with torch.no_grad():
        if ref_logp is not None:
            ref_lp = ref_logp.reshape(b, t)
        out = ref_kto.kto_with(None, hidden, weight, target, preference_labels, bias, *refs,
                               policy_lp=logp.reshape(b, t), ref_lp=ref_lp, **kw)
    return out._replace(loss=out.loss + anchor)


PAIR_CHUNK_LOGITS_CUDA = 1 << 28
"""Logits per chunk of the formed path's default plan on CUDA (``memory="auto"``, a head that gets a gradient): the
chunk buffer beside the fp32 grad_weight accumulator, at least one unit of rows (a pair, a sequence). 2**28 bf16
logits are 512 MiB: at Llama-3-8B's head (4096 x 128256) and 4 pairs of 1024 tokens, 4 chunks of one pair, peak
extra about 1.96 GiB of accumulator + 0.49 of chunk + 0.19 of fp32 grad_hidden and reordered hidden states (2.6 GiB;
Liger-Kernel's DPO 2.54, whose chunks are one pair too, with a bf16 grad_weight); the fused cross-entropy's 3 GiB
rule gave 2 chunks of two pairs (3.12 GiB measured). Each chunk beyond the minimum costs one more read and write of
the accumulator (8VH bytes, about 1 ms there). A unit larger than that takes the 3 GiB rule."""


def _formed_plan(hidden, weight, target, bias, ignore_index: int, memory, align: int):
    """The log-probabilities' :class:`~tigon.ops.fused_linear_logprobs.LogProbPlan` for a loss of (B, T) sequences
    whose gradients are formed in the forward over chunks of ``align`` rows, or None where that is not possible: no
    gradient wanted, inside ``torch.compile``, a PyTorch backend or a matmul dtype the kernels do not take, or
    ``align`` rows exceed a chunk. ``memory="auto"`` on CUDA: chunks of :data:`PAIR_CHUNK_LOGITS_CUDA` logits."""
    if torch.compiler.is_compiling():
        return None
    b, t, h = hidden.shape
    h2 = hidden.reshape(b * t, h)
    plan = logprob_plan(h2, weight, target.reshape(b * t), bias, ignore_index=ignore_index, memory=memory)
    if plan is None or not any(plan.need):
        return None
    from ..kernels._common import compiled_cuda
    from ..kernels.fused_linear_cross_entropy import loop_rows

    if plan.budget < 0 and not plan.lean and plan.need[1] and compiled_cuda(hidden.device):
        v = weight.shape[0]
        tight = plan._replace(budget=4 * v * h + PAIR_CHUNK_LOGITS_CUDA * plan.cd.itemsize)
        if loop_rows(h2, weight, tight.cd, tight.need, tight.lean, tight.budget, align=align):
            return tight
    return plan if loop_rows(h2, weight, plan.cd, plan.need, plan.lean, plan.budget, align=align) else None


def _reference(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index: int, memory, plan, rows_of):
    """How a formed path gets the reference model's log-probabilities: ``(ref_lp, ref)``, both None without a
    reference model; else ``ref`` for :func:`_formed_pass` (the reference in the policy's chunk loop; ``rows_of(
    ref_hidden in the matmul dtype)`` gives its ``rows(s, e)``) with ``ref_lp`` None, when its matmul dtype is the
    policy's (the buffer's) and its kernels run; otherwise ``ref_lp`` (B, T), computed by a pass of its own under
    ``torch.no_grad``, and ``ref`` None."""
    if ref_hidden is None:
        return None, None
    b, t, hr = ref_hidden.shape
    with torch.no_grad():
        ref_plan = logprob_plan(ref_hidden.reshape(b * t, hr), ref_weight, target.reshape(b * t), ref_bias,
                                ignore_index=ignore_index, memory=memory)
        if ref_plan is None or ref_plan.cd != plan.cd:
            return sequence_logps(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index)[0], None
        cd = plan.cd
        rh = ref_hidden.detach().to(cd)
        return None, (rows_of(rh), ref_weight.detach().to(cd), None if ref_bias is None else ref_bias.detach().to(cd))


def _formed_pass(hidden2d, weight, target2d, bias, plan, unit: tuple, align: int, chunk_loss, ref=None):
    """The policy's chunk loop with the gradients formed in the forward
    (:func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`) for rows ``hidden2d`` (N, H) grouped in
    units of ``unit`` (e.g. (2, T): a pair of sequences), chunks of whole groups of ``align`` rows (a multiple of the
    unit's), ``chunk_loss(lp, ref_lp, i, k)`` the loss as a function of the log-probabilities ``lp`` (k, *unit) of
    units i .. i + k - 1 (the others' held fixed; autograd differentiates it), ``ref_lp`` the reference model's of the
    same rows (no gradient) or None.

    ``ref``: None, or a reference model ``(rows, weight, bias)`` run in the same loop: ``rows(s, e)`` its (e - s,
    H_ref) hidden states for rows s .. e of ``hidden2d``, and its head, in the matmul dtype ``plan.cd``. Each chunk's
    buffer first takes the reference's logits of its rows and the log-probability kernel reads them (the log-prob
    kernel of :func:`tigon.kernels.fused_linear_logprobs.rows_forward`), then the policy's (one matmul and one read of
    the chunk more, nothing allocated beyond three (N,) vectors). Returns (anchor, logp (N,), ref_logp (N,) or None):
    anchor and logp are :class:`tigon.kernels.fused_linear_logprobs.FormedGradsFunction`'s."""
    from ..kernels import fused_linear_logprobs as klp

    rows = math.prod(unit)
    n = hidden2d.shape[0]
    target2d = target2d.contiguous()
    ref_lp = reference_rows = None
    if ref is not None:
        f32 = dict(dtype=torch.float32, device=hidden2d.device)
        ref_lp = torch.empty(n, **f32)
        reference_rows = _reference_rows(ref, target2d, plan, ref_lp)

    def token_grads(s, e, logp, _ent):
        ref_c = None if ref_lp is None else ref_lp[s:e].reshape(-1, *unit)
        with torch.enable_grad():
            lp = logp.detach().reshape(-1, *unit).requires_grad_()
            (g,) = torch.autograd.grad(chunk_loss(lp, ref_c, s // rows, (e - s) // rows), lp, allow_unused=True)
        return (torch.zeros_like(logp) if g is None else g.reshape(-1).contiguous()), None

    def run():
        logp, _, grads = klp.logprobs_grads_in_forward(hidden2d, weight, target2d, bias, plan.opts, plan.cd,
                                                       plan.need, False, token_grads, plan.lean, plan.budget, align,
                                                       before=reference_rows)
        return (logp,), grads

    anchor, logp = klp.FormedGradsFunction.apply(hidden2d, weight, bias, run)
    return anchor, logp, ref_lp


def _reference_rows(ref, target2d, plan, ref_lp):
    """The ``before`` hook of :func:`_formed_pass`' chunk loop for a reference model ``ref`` (its ``(rows, weight,
    bias)``): the chunk's reference logits into the chunk's buffer, then their log-probabilities into ``ref_lp``
    ((N,) fp32), before the policy's logits overwrite the buffer."""
    from ..kernels import fused_linear_logprobs as klp
    from ..kernels.head_grads import _Matmuls
    from ..kernels.loss_rows import row_stats

    ref_rows, ref_w, ref_b = ref
    n, dev = ref_lp.shape[0], ref_lp.device
    z, stats = torch.empty(n, dtype=torch.float32, device=dev), row_stats(n, dev)
    mm = _Matmuls(dev, plan.cd)

    def before(lg, s, e):
        mm.logits(lg, ref_rows(s, e), ref_w, ref_b)
        klp.rows_forward(lg, target2d[s:e], plan.opts, ref_lp[s:e], None, z[s:e], stats[s:e])

    return before


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
        beta: the KL coefficient (IPO's tau); > 0.
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
    return _run("fused_linear_dpo_loss", "dpo", dict(locals()))


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
        beta: > 0; loss_type: one of :data:`tigon.reference.preference.CPO_LOSS_TYPES`; label_smoothing: in [0, 1).
        gamma: SimPO's target reward margin (``loss_type="simpo"`` only).
        {memory}

    Returns:
        :class:`tigon.reference.pairs.PreferenceOutput`; rewards ``beta * logp``.

    Raises:
        TypeError, ValueError: as :func:`fused_linear_dpo_loss` (options: ``check_cpo_options``).
    """
    return _run("fused_linear_cpo_loss", "cpo", dict(locals()))


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
    return _run("fused_linear_simpo_loss", "cpo", dict(locals()), loss_type="simpo")


def fused_linear_orpo_loss(hidden, weight, target, bias=None, *, ignore_index: int = -100, beta: float = 0.1,
                           compute_nll_loss: bool = True, average_log_prob: bool = True,
                           memory: str | int = "auto") -> PreferenceOutput:
    """Odds Ratio Preference Optimization loss from the LM head's hidden states, without logits: the chosen tokens'
    NLL plus ``-beta mean log sigma(log odds(y_w) - log odds(y_l))`` (Hong et al. 2024, "ORPO", eqs. 4-7; TRL's
    ``ORPOTrainer.odds_ratio_loss``; Liger's ``LigerFusedLinearORPOLoss``, whose optional ``nll_target`` is not
    supported). ``log odds = logp - log(1 - exp(logp))`` is computed stably (``log1mexp``).

    Args:
        hidden, weight, target, bias, ignore_index, compute_nll_loss, average_log_prob: as
            :func:`fused_linear_dpo_loss`; beta: the odds-ratio term's weight (ORPO's lambda), > 0.
        {memory}

    Returns:
        :class:`tigon.reference.pairs.PreferenceOutput` with ``log_odds_ratio`` and ``log_odds_chosen``.

    Raises:
        TypeError, ValueError: as :func:`fused_linear_dpo_loss`.
    """
    return _run("fused_linear_orpo_loss", "orpo", dict(locals()))


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
        kl: the KL estimate ``z`` (0-d or broadcastable (B,); no gradient), or None for 0.
        beta: > 0; loss_type: ``"kto"`` or ``"apo_zero_unpaired"``; desirable_weight, undesirable_weight: >= 0.
        {memory}

    Returns:
        :class:`tigon.reference.kto.KTOOutput`: the 0-d loss (mean over the B sequences; differentiable w.r.t.
        hidden, weight, bias), then Liger's sums of log-probs, logits and rewards per group, detached.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, devices, labels not a (B,) bool tensor, options out of range
            (:func:`tigon.reference.kto.check_kto_options`), a bad ``memory``.
    """
    return _run("fused_linear_kto_loss", "kto", dict(locals()))


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
        grads_in_forward=("tigon", "tigon_lean", "tigon_1gib", "tigon_3gib"),
        peers={"liger": _liger_dpo},
        bench_notes={"tigon_1gib": "memory=1 << 30: at Llama-3-8B's head the fp32 grad_weight accumulator does not "
                                   "fit, so it accumulates in the weight's dtype (as Liger-Kernel's DPO), in 2 chunks "
                                   "of 2 pairs",
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
            Case("bench: memory=1 GiB", options={"memory": 1 << 30}, tags=frozenset({"bench"}),
                 provider="tigon_1gib"),
            Case("bench: memory=3 GiB", options={"memory": 3 << 30}, tags=frozenset({"bench"}),
                 provider="tigon_3gib"),
        ),
    ),
)
