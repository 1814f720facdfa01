"""The preference losses' policy gradients formed in the forward (:mod:`tigon.ops.preference`'s fast path):
:func:`formed_pair_loss` (DPO, SimPO, CPO, ORPO: chunks of whole pairs), :func:`formed_kto_loss` (KTO: chunks of whole
sequences), both with a reference model's log-probabilities computed in the policy's chunk loop.

Per chunk (:func:`_formed_pass`): the reference model's logits of the chunk's rows into the chunk buffer and the
log-prob kernel over them (:func:`_reference_rows`), the policy's logits into the same buffer, the log-prob kernel,
the loss's gradient w.r.t. the chunk's log-probabilities by autograd through the formula, the logits-gradient kernel
in place, then grad_hidden and grad_weight (:func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`):
3 policy matmuls + 1 for the reference, one (rows, V) buffer. Ignored tokens (a masked prompt) are left out of those
matmuls where that pays (:func:`_kept_chunks`, :mod:`tigon.kernels.ignored_rows`): chunks of the kept rows of whole
units, the formula still differentiated on each unit's full (k, *unit) layout. Both the pairs' order and the kept rows
are one index of the rows to run (:func:`_formed_pass`' ``order``): each chunk gathers its rows from the caller's
layout, and the per-token outputs and grad_hidden come back in it.
"""

from __future__ import annotations

import itertools
import math

import torch

from ..reference import kto as ref_kto
from ..reference.pairs import check_batch, pair_logps, policy_and_reference, preference_output, sequence_logps
from ..reference.preference import LOSSES
from ..support import replaced
from .formed_grads import family, run_formed
from .fused_linear_logprobs import logprob_plan


def formed_pair_loss(token_logps, formula, hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias,
                     ref_chosen_logps, ref_rejected_logps, *, ignore_index: int, average_log_prob: bool,
                     compute_nll_loss: bool, alpha: float, coupled: bool, memory="auto", loss: str = "dpo",
                     **options):
    """A paired preference loss (:func:`tigon.reference.pairs.run`'s arguments; ``coupled``:
    :func:`tigon.reference.preference.couples_pairs`) with the policy's gradients formed in its forward: the
    :class:`~tigon.reference.pairs.PreferenceOutput`, or None where that is not possible here (then the
    log-probabilities' path runs, its backward recomputing the logits).

    Why it works: every formula is a mean over pairs of a function of the pair's own sequence log-probabilities, plus
    the NLL term, linear in the chosen tokens' log-probabilities with a coefficient that depends on the targets alone
    (AOT, which sorts the batch, is the exception: ``coupled``). So the rows run pair by pair (chosen i, then rejected
    i), chunks hold whole pairs (the whole batch when ``coupled``), each gathering its rows from the caller's (B T, H)
    layout by index (:func:`_pair_order`: no reordered copy of the hidden states, and grad_hidden comes back in that
    layout; :func:`_formed_pass`), and as soon as a chunk's log-probabilities are known, autograd through the formula on
    a batch whose other pairs hold placeholders (they do not reach the chunk's gradient) gives the loss's gradient
    w.r.t. them; :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward` turns it into the head's
    gradients in the same pass: 3 policy matmuls instead of 4. A reference model runs in the same chunk loop
    (:func:`_formed_pass`' ``ref``: its logits of the chunk's rows go into the chunk's buffer first, so the chunk's
    pairs have their reference log-probabilities before the formula runs): one more matmul, no buffer or pass of its
    own. The outputs then come from the formula on the log-probabilities without autograd, the loss plus the zero that
    carries the gradients (:class:`tigon.kernels.fused_linear_logprobs.FormedGradsFunction`).

    Eager or inside ``torch.compile`` (:func:`tigon.ops.formed_grads.run_formed`; the chunk loop :func:`_pair_pass`
    either way). None when: no gradient is wanted, a PyTorch backend or a matmul dtype the kernels do not take, or
    the unit of rows (a pair, or the batch when ``coupled``) does not fit a chunk.
    """
    b, t, h = hidden.shape
    check_batch(hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias, ref_chosen_logps, ref_rejected_logps)
    align = b * t if coupled else 2 * t
    plan = _formed_plan(hidden, weight, target, bias, ignore_index, memory, align, 1 if coupled else LOW_SPLIT)
    if plan is None:
        return None
    ref_lp, ref = _reference(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index, memory, plan)
    spec = dict(options, loss=loss, coupled=bool(coupled), ignore_index=int(ignore_index),
                average_log_prob=bool(average_log_prob), compute_nll_loss=bool(compute_nll_loss), alpha=float(alpha))
    tensors = [hidden, target, ref_hidden, ref_weight, ref_bias, ref_chosen_logps, ref_rejected_logps,
               None if ref else ref_lp]
    anchor, logp, _, ref_logp = run_formed("pairs", spec, hidden.reshape(b * t, h), weight, bias, tensors, plan,
                                           want_ref=bool(ref))
    kw = dict(ignore_index=ignore_index, average_log_prob=bool(average_log_prob))
    refs = (ref_hidden, ref_weight, ref_bias, ref_chosen_logps, ref_rejected_logps)
    with torch.no_grad():
        if ref_logp is not None:
            ref_lp = ref_logp.reshape(b, t)
        pairs = pair_logps(None, hidden, weight, target, bias, *refs, policy_lp=logp.reshape(b, t), ref_lp=ref_lp,
                           **kw)
        out = preference_output(pairs, hidden, weight, bias, *formula(pairs, **options),
                                compute_nll_loss=bool(compute_nll_loss), alpha=float(alpha))
    return replaced(out, loss=out.loss + anchor)


def _pair_order(p: int, t: int, device) -> torch.Tensor | None:
    """The rows of a (2P, T) batch (chosen then rejected, flattened) pair by pair: chosen i, then rejected i ((2 P T,)
    int64, :func:`_formed_pass`' ``order``); None for one pair (the batch's own order)."""
    if p == 1:
        return None
    return torch.arange(2 * p * t, device=device).reshape(2, p, t).transpose(0, 1).reshape(-1)


@family("pairs")
def _pair_pass(spec: dict, tensors: list, hidden2d, weight, bias, plan, halves: bool):
    """The policy's chunk loop of :func:`formed_pair_loss` (``spec``: the formula's name ``loss`` and options, and
    the call's flags; ``tensors``: the (B, T, H) hidden states, targets, the reference model's hidden states / head /
    bias, the given reference log-probabilities, and the reference model's (B, T) log-probabilities when computed
    apart; ``hidden2d`` the hidden states as (B T, H), run pair by pair: :func:`_pair_order`): ``((logp (N,), None,
    ref_logp (N,) or None), unscaled gradients)``, in the (B T) layout, eager or inside the custom op
    (:func:`tigon.ops.formed_grads.run_formed`)."""
    options = dict(spec)
    name, ignore_index, average_log_prob = options.pop("loss"), options.pop("ignore_index"), options.pop(
        "average_log_prob")
    coupled, compute_nll_loss, alpha = options.pop("coupled"), options.pop("compute_nll_loss"), options.pop("alpha")
    formula = LOSSES[name][0]
    hidden, target, ref_hidden, ref_weight, ref_bias, ref_chosen_logps, ref_rejected_logps, ref_lp = tensors
    b, t, _ = hidden.shape
    p = b // 2

    f32 = dict(dtype=torch.float32, device=hidden.device)
    ref = None
    if ref_hidden is not None and ref_lp is None:  # the reference model in the policy's chunk loop
        ref = _in_loop(ref_hidden, ref_weight, ref_bias, plan.cd)
    kw = dict(ignore_index=ignore_index, average_log_prob=average_log_prob)
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

    align = b * t if coupled else 2 * t
    logp, ref_logp, grads = _formed_pass(hidden2d, weight, target.reshape(b * t), bias, plan, (2, t), align,
                                         chunk_loss, ref, halves, _pair_order(p, t, hidden.device))
    return (logp, None, ref_logp), grads


def formed_kto_loss(token_logps, hidden, weight, target, preference_labels, bias, ref_hidden, ref_weight, ref_bias, *,
                    ref_logps, kl, ignore_index: int, beta: float, loss_type: str, desirable_weight: float,
                    undesirable_weight: float, average_log_prob: bool, memory="auto"):
    """KTO (:func:`tigon.reference.kto.kto_with`'s arguments, checked there) with the policy's gradients formed in its
    forward, as :func:`formed_pair_loss` does for the paired losses (a reference model in the same chunk loop too):
    each sequence's loss depends on its own log-probability alone (the KL estimate ``kl`` is a given constant), so
    chunks of whole sequences suffice (the batch's own order). The :class:`~tigon.reference.kto.KTOOutput`, or None
    where not possible (as there)."""
    b, t, h = hidden.shape
    plan = _formed_plan(hidden, weight, target, bias, ignore_index, memory, t, LOW_SPLIT)
    if plan is None:
        return None
    ref_lp, ref = _reference(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index, memory, plan)
    given_kl = isinstance(kl, torch.Tensor)
    spec = dict(beta=beta, loss_type=loss_type, desirable_weight=desirable_weight,
                undesirable_weight=undesirable_weight, average_log_prob=bool(average_log_prob),
                ignore_index=int(ignore_index), kl=None if given_kl else kl)
    tensors = [hidden, target, preference_labels, ref_hidden, ref_weight, ref_bias, ref_logps,
               kl if given_kl else None, None if ref else ref_lp]
    anchor, logp, _, ref_logp = run_formed("kto", spec, hidden.reshape(b * t, h), weight, bias, tensors, plan,
                                           want_ref=bool(ref))
    kw = dict(ref_logps=ref_logps, kl=kl, ignore_index=ignore_index, beta=beta, loss_type=loss_type,
              desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
              average_log_prob=average_log_prob)
    with torch.no_grad():
        if ref_logp is not None:
            ref_lp = ref_logp.reshape(b, t)
        out = ref_kto.kto_with(None, hidden, weight, target, preference_labels, bias, ref_hidden, ref_weight,
                               ref_bias, policy_lp=logp.reshape(b, t), ref_lp=ref_lp, **kw)
    return replaced(out, loss=out.loss + anchor)


@family("kto")
def _kto_pass(spec: dict, tensors: list, hidden2d, weight, bias, plan, halves: bool):
    """The policy's chunk loop of :func:`formed_kto_loss` (``spec``: its options, a non-tensor ``kl``; ``tensors``:
    the (B, T, H) hidden states, targets, labels, the reference model's hidden states / head / bias, the given
    reference log-probabilities, a tensor ``kl``, the reference model's (B, T) log-probabilities when computed apart),
    as :func:`_pair_pass`."""
    hidden, target, labels, ref_hidden, ref_weight, ref_bias, ref_logps, kl, ref_lp = tensors
    kl = spec["kl"] if kl is None else kl
    average_log_prob = spec["average_log_prob"]
    b, t, _ = hidden.shape
    f32 = dict(dtype=torch.float32, device=hidden.device)
    ref = None
    if ref_hidden is not None and ref_lp is None:  # the reference model in the policy's chunk loop
        ref = _in_loop(ref_hidden, ref_weight, ref_bias, plan.cd)
    zeros = torch.zeros((b, t), **f32)
    _, n, _, ref_seq = policy_and_reference(None, hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias,
                                            spec["ignore_index"], average_log_prob, zeros,
                                            zeros if ref is not None else ref_lp)
    length = n.clamp(min=1)
    fill, zero = torch.full((b,), -1.0, **f32), torch.zeros((b,), **f32)

    def chunk_loss(lp, ref_c, i, k):  # lp, ref_c (k sequences, T): sequences i .. i + k - 1 (ref_c None: no model)
        def seq(x):
            return x.sum(-1) / length[i: i + k] if average_log_prob else x.sum(-1)

        full = torch.cat((fill[:i], seq(lp), fill[i + k:]))
        rs = ref_seq if ref_c is None else torch.cat((zero[:i], seq(ref_c), zero[i + k:]))
        return ref_kto.kto_losses(full, rs, ref_logps, kl, labels, spec["beta"], spec["loss_type"],
                                  spec["desirable_weight"], spec["undesirable_weight"])[0].mean()

    logp, ref_logp, grads = _formed_pass(hidden2d, weight, target.reshape(b * t), bias, plan, (t,), t, chunk_loss,
                                         ref, halves)
    return (logp, None, ref_logp), grads


PAIR_CHUNK_LOGITS_CUDA = 1 << 28
"""Logits per chunk of the formed path's default plan on CUDA (``memory="auto"``, a head that gets a gradient): the
chunk buffer beside the fp32 grad_weight accumulator, at least one unit of rows (a pair, a sequence). 2**28 bf16
logits are 512 MiB: at Llama-3-8B's head (4096 x 128256) and 4 pairs of 1024 tokens, 4 chunks of one pair. Issue 29's
row (bf16, the reference model in the call, every tenth target ignored: each chunk holds a pair's 1843 kept rows)
measured 2,705 MiB peak extra on an H100, against Liger-Kernel's DPO 2,601 (whose chunks are one pair too, with a bf16
grad_weight): 2004 MiB of accumulator (128256 x 4096 x 4 B) + 451 of chunk (1843 x 128256 x 2 B) + 128 of fp32
grad_hidden (8192 x 4096 x 4 B) + 64 of the hidden states reordered pair by pair + 29 of a chunk's fp32 grad_hidden
rows + 14 of its gathered hidden rows + 14 of the reference model's. Since then the chunks gather their rows pair by
pair from the caller's layout (:func:`_formed_pass`' ``order``: no reordered copy) and write grad_hidden straight into
a bf16 buffer of the rows run, placed in its (N, H) layout once the chunk buffer is free (the formed passes'
grad_hidden: :func:`tigon.kernels.head_grads.grad_buffers`' ``formed``, where bf16 costs at most half an ulp of
rounding more). Expected there, by arithmetic (not measured): 2004 + 451 + 58 (7372 kept rows x 4096 x 2 B) + 14 + 14
= about 2,541 MiB, 163 less (2,599 with grad_hidden in fp32); with no row ignored 2004 + 501 + 64 + 16 + 16 = 2,601
(2,713 before). The fused cross-entropy's 3 GiB rule gave 2 chunks of two pairs (3.12 GiB measured). Each chunk beyond
the minimum costs one more read and write of the accumulator (8VH bytes, about 1 ms there). A unit larger than that
takes the 3 GiB rule.

``memory="low"`` (the lean plan: grad_weight accumulated in the weight's dtype, no fp32 accumulator) on CUDA: chunks
of one unit where a unit has at most this many logits (the fused cross-entropy's lean rule, about N / ceil(V / H)
rows, 256 at Llama-3-8B's head, holds less than a pair, and the loss would take the recomputing path: 4 policy
matmuls and more), so 3 policy matmuls still: a budget in bytes of one unit's logits (its rows rounded up to 16),
and of its rows gathered where ignored rows are skipped (:func:`_gathered_bytes`; 48 MiB a pair below). Peak extra at
Llama-3-8B's head (4096 x 128256, bf16) and 4 pairs of 1024 tokens, chunks of one pair (``LOW_SPLIT`` = 1): about
0.98 GiB of bf16 grad_weight + 0.49 of one pair's chunk + 0.13 of bf16 grad_hidden and reordered hidden states:
measured 1.59 GiB and 49.4 ms fwd + bwd on an H100 with the reference model in the call (default 2.64 GiB / 52.1 ms,
Liger 2.54 / 66.9; benchmarks/results/h100/session24/). Now a unit larger than the lean rule's chunk is split into
sub-chunks (:data:`LOW_SPLIT`), and no reordered copy is made (above). With ignored rows skipped
(:func:`_kept_chunks`) a chunk holds the kept rows of whole units, at most one unit's rows with their gathered rows:
within the same budget, often fewer chunks."""

LOW_SPLIT = 2
"""The most sub-chunks a unit (a pair, a KTO sequence; not AOT's coupled batch) takes on the formed path under
``memory="low"`` on CUDA, where the unit exceeds the lean rule's chunk (about N / ceil(V / H) rows): k = min(LOW_SPLIT,
ceil(unit rows / lean rows)) sub-chunks, the budget that of ceil(unit rows / k) rows rounded up to 16 (with their
gathered rows, as above). A unit's gradients need its whole log-probability, so its first k - 1 sub-chunks get the
forward alone and their logits are formed again once the last one's are known
(:func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`' ``pieces``): 3 + (k - 1) / k policy matmuls a
row at most instead of 3 (the first sub-chunk takes the rest, so a unit of kept rows a little over the cap re-forms only
that little: :func:`_split_units`; the reference model's 1 unchanged). Why 2: at Llama-3-8B's head the lean rule's 256
rows would split a 2048-row pair 8 ways (3.875 matmuls, 7 more reads and writes of the bf16 grad_weight per pair: slower
than the recomputing path), while the second sub-chunk alone takes the chunk from 0.49 to 0.25 GiB for one matmul in six
more; a third would save 0.08 GiB more for one in nine more. Expected peak extra there (4 pairs of 1024 tokens, bf16,
the reference model in the call; arithmetic, not measured): 128256 x 4096 x 2 B = 0.98 GiB of bf16 grad_weight + 1024 x
128256 x 2 B = 0.245 GiB of chunk + 8192 x 4096 x 2 B = 0.0625 GiB of bf16 grad_hidden + 1024 x 4096 x 2 B = 8 MiB of
a chunk's hidden rows gathered pair by pair and 8 of the reference model's = 1.30 GiB (+ (N,) vectors; with ignored rows
skipped, a chunk's kept rows in the same 8 + 8 MiB and grad_hidden of the kept rows alone), against 1.59 measured with
chunks of a pair and a reordered copy of the hidden states; 3.5 policy matmuls + 1 of the reference a row."""


def _formed_plan(hidden, weight, target, bias, ignore_index: int, memory, align: int, split: int = 1):
    """The log-probabilities' :class:`~tigon.ops.fused_linear_logprobs.LogProbPlan` for a loss of (B, T) sequences
    whose gradients are formed in the forward over chunks of ``align`` rows, or None where that is not possible: no
    gradient wanted, a PyTorch backend or a matmul dtype the kernels do not take, or
    ``align`` rows exceed a chunk. On CUDA (:data:`PAIR_CHUNK_LOGITS_CUDA`), ``memory="auto"``: chunks of that many
    logits; ``memory="low"``: chunks of one unit (``align`` rows), as a budget in bytes of that unit's logits, or,
    ``split`` > 1 (``align`` rows are one unit), of 1 / k of it where the unit exceeds the lean rule's chunk
    (:data:`LOW_SPLIT`: :func:`_formed_pass` then splits each unit into at most k sub-chunks).

    ``memory`` a budget in bytes (the chunk buffer, with the fp32 accumulator where it fits:
    :func:`tigon.kernels.fused_linear_cross_entropy.chunk_rows`) below one unit's chunk: the formed pass stays where a
    unit fits ``split`` sub-chunks of the budget's rows; :func:`_formed_pass` splits each unit (its kept rows, where
    ignored rows are skipped) as under ``"low"``, the first sub-chunk taking the rest, so only what exceeds the budget
    is formed twice (``"low"`` halves every unit). At Llama-3-8B's head (4 pairs x 1024, bf16, a tenth of the tokens
    ignored: about 1,843 kept rows a pair, 256 KiB of bf16 logits a row), ``memory=13 << 25`` (416 MiB: no room for the
    fp32 accumulator, so grad_weight in bf16, 0.98 GiB; chunks of 1,536 kept rows with their gathered rows) forms 307
    rows a pair twice: 3.17 policy matmuls a row against ``"low"``'s 3.5, for a peak of about 1.45 GiB (arithmetic, not
    measured)."""
    b, t, h = hidden.shape
    h2 = hidden.reshape(b * t, h)
    plan = logprob_plan(h2, weight, target.reshape(b * t), bias, ignore_index=ignore_index, memory=memory)
    if plan is None or not any(plan.need):
        return None
    from ..kernels import fused_linear_cross_entropy as kflce

    def fits(p, k=1):
        if k > 1:  # a unit in at most k sub-chunks
            return -(-align // kflce.loop_cap(h2, weight, p.cd, p.need, p.lean, p.budget)) <= k
        return kflce.loop_rows(h2, weight, p.cd, p.need, p.lean, p.budget, align=align) > 0

    v = weight.shape[0]
    if plan.budget < 0 and kflce.compiled_cuda(hidden.device):
        if plan.lean and align * v <= PAIR_CHUNK_LOGITS_CUDA:  # 1 / k unit a chunk, in rows of 16 (chunk_rows')
            k = 1
            if split > 1:  # the lean rule's chunk: k sub-chunks a unit where it holds less than one
                k = max(1, min(split, -(-align // kflce.loop_cap(h2, weight, plan.cd, plan.need, True, -1))))
            rows = 16 * math.ceil(math.ceil(align / k) / 16)  # 1 / k of a unit, in whole 16-row steps
            one = plan._replace(budget=rows * (v * plan.cd.itemsize + _gathered_bytes(h, plan.cd)))
            if fits(one, k):
                return one
        elif not plan.lean and plan.need[1]:
            tight = plan._replace(budget=4 * v * h + PAIR_CHUNK_LOGITS_CUDA * plan.cd.itemsize)
            if fits(tight):
                return tight
    if fits(plan):
        return plan
    if plan.budget >= 0 and split > 1 and fits(plan, split):  # a byte budget below one unit: units split
        return plan
    return None


def _reference(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index: int, memory, plan):
    """How a formed path gets the reference model's log-probabilities: ``(ref_lp, in_loop)``: (None, False) without a
    reference model; (None, True) when its matmul dtype is the policy's (the buffer's) and its kernels run: it then
    runs in the policy's chunk loop (:func:`_in_loop`); otherwise ``(ref_lp (B, T), False)``, computed by a pass of its
    own under ``torch.no_grad``."""
    if ref_hidden is None:
        return None, False
    b, t, hr = ref_hidden.shape
    with torch.no_grad():
        ref_plan = logprob_plan(ref_hidden.reshape(b * t, hr), ref_weight, target.reshape(b * t), ref_bias,
                                ignore_index=ignore_index, memory=memory)
        if ref_plan is None or ref_plan.cd != plan.cd:
            return sequence_logps(token_logps, ref_hidden, ref_weight, target, ref_bias, ignore_index)[0], False
        return None, True


def _in_loop(ref_hidden, ref_weight, ref_bias, cd):
    """The reference model for :func:`_formed_pass`' ``ref``: ``(rows, weight, bias)`` in the matmul dtype ``cd``,
    ``rows(s, e, idx)`` the rows s .. e of its (B, T, H_ref) hidden states taken as (B T, H_ref) (a view where that
    layout is one), or their rows ``idx`` in that order, gathered: a copy of those rows alone, whatever the strides
    (a sequence-first (T, B, H_ref) transposed has no (B T, H_ref) view, and a reshape would copy all of it)."""
    with torch.no_grad():
        rh = ref_hidden.detach().to(cd)
        t, hr = rh.shape[1:]
        try:
            flat = rh.view(-1, hr)
        except RuntimeError:
            flat = None

        def rows(s, e, idx):
            if idx is None and flat is not None:
                return flat[s:e]
            if idx is None:
                idx = torch.arange(s, e, device=rh.device)
            return flat.index_select(0, idx) if flat is not None else rh[idx // t, idx % t]

        return rows, ref_weight.detach().to(cd), None if ref_bias is None else ref_bias.detach().to(cd)


def _formed_pass(hidden2d, weight, target2d, bias, plan, unit: tuple, align: int, chunk_loss, ref=None,
                 halves: bool = True, order: torch.Tensor | None = None):
    """The policy's chunk loop with the gradients formed in the forward
    (:func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`) for rows ``hidden2d`` (N, H) (any
    strides) and targets ``target2d`` (N,), taken in the ``order`` (N,) of their rows (None: their own) and grouped in
    that order in units of ``unit`` (e.g. (2, T): a pair of sequences, :func:`_pair_order`), chunks of whole groups of
    ``align`` rows (a multiple of the unit's), ``chunk_loss(lp, ref_lp, i, k)`` the loss as a function of the
    log-probabilities ``lp`` (k, *unit) of units i .. i + k - 1 (the others' held fixed; autograd differentiates it),
    ``ref_lp`` the reference model's of the same rows (no gradient) or None.

    ``ref``: None, or a reference model ``(rows, weight, bias)`` run in the same loop: ``rows(s, e, idx)`` its (e - s,
    H_ref) hidden states for rows s .. e of ``hidden2d`` (``idx`` None), or for its rows ``idx`` ((k,) int64, in that
    order), and its head, in the matmul dtype ``plan.cd``. Each chunk's buffer first takes the reference's logits of its
    rows and the log-probability kernel reads them (the log-prob kernel of
    :func:`tigon.kernels.fused_linear_logprobs.rows_forward`), then the policy's (one matmul and one read of the chunk
    more; beyond three (N,) vectors, each chunk's (rows, H_ref) reference rows). Returns (logp (N,), ref_logp (N,)
    or None, the unscaled gradients), in the rows' own layout whatever ``order``; ``halves``:
    :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`'s.

    The rows to run are one index, ``order`` with the ignored rows left out (``run`` below, the log-probabilities'
    ``kept``): each chunk gathers its rows by it into a (rows, H) buffer (the same rows, in the same order and chunks,
    as the (N, H) copy of the hidden states reordered pair by pair that this replaces: the same matmuls), and
    grad_hidden's rows go to their place once the chunk loop ends.

    Ignored rows (:func:`_kept_chunks`): where skipping pays, the chunks run over the kept rows alone, whole groups of
    ``align`` rows each (of varying kept counts). Each chunk's log-probabilities (and the reference's) go into a
    zero-filled (k, *unit) view of its units, where ignored tokens hold the 0 the kernels give them, the formula's
    gradient there is gathered back to the kept rows, and logp / ref_logp come back in the full layout with 0 at the
    ignored rows: the same values as computing every row; grad_hidden's ignored rows are zeros.

    Units larger than a chunk (the lean plan's, ``align`` the unit's rows: :data:`LOW_SPLIT`): each unit (its kept
    rows) in sub-chunks of at most a chunk's rows (:func:`_split_units`), its gradients formed at its last one and its
    earlier ones' logits formed again (``pieces`` of
    :func:`~tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`); ``chunk_loss`` then sees the whole
    unit's log-probabilities, as above."""
    from ..kernels import fused_linear_logprobs as klp
    from ..kernels.fused_linear_cross_entropy import loop_cap
    from ..kernels.ignored_rows import placed

    rows = math.prod(unit)
    n = hidden2d.shape[0]
    target2d = target2d.contiguous()
    # units may be split over sub-chunks where one exceeds a chunk (memory="low", byte budgets: _formed_plan)
    split = (plan.lean or plan.budget >= 0) and align == rows
    # kept: the kept rows' places in the run order (units, chunks), run: their rows of hidden2d
    kept, bounds, units, pieces = _kept_chunks(hidden2d, weight, _taken(target2d, order), plan, align, rows, split)
    run = kept if order is None else _taken(order, kept)
    if kept is None and split:
        cap = loop_cap(hidden2d, weight, plan.cd, plan.need, plan.lean, plan.budget)
        if rows > cap:
            bounds, pieces, _ = _split_units([rows] * (n // rows), cap)
    ref_lp = reference_rows = None
    if ref is not None:
        run_target = _taken(target2d, run)
        ref_lp = torch.empty(run_target.numel(), dtype=torch.float32, device=hidden2d.device)
        reference_rows = _reference_rows(ref, run_target, plan, ref_lp, run)

    def token_grads(s, e, logp, _ent):
        if kept is None:
            i, k, at = s // rows, (e - s) // rows, None
            lp, ref_c = logp.detach(), None if ref_lp is None else ref_lp[s:e]
        else:  # the chunk's kept rows among the rows of its units, the others 0 (as the kernels give them)
            (i, k), at = units[s], kept[s:e] - units[s][0] * rows
            lp, ref_c = (None if x is None else placed(x, at, k * rows)
                         for x in (logp.detach(), None if ref_lp is None else ref_lp[s:e]))
        with torch.enable_grad():
            lp = lp.reshape(k, *unit).requires_grad_()
            loss = chunk_loss(lp, None if ref_c is None else ref_c.reshape(k, *unit), i, k)
            (g,) = torch.autograd.grad(loss, lp, allow_unused=True)
        if g is None:
            return torch.zeros_like(logp), None
        return (g.reshape(-1).contiguous() if at is None else g.reshape(-1).index_select(0, at)), None

    logp, _, grads = klp.logprobs_grads_in_forward(hidden2d, weight, target2d, bias, plan.opts, plan.cd, plan.need,
                                                   False, token_grads, plan.lean, plan.budget, align, halves,
                                                   before=reference_rows, kept=run, bounds=bounds, pieces=pieces)
    if run is not None and ref_lp is not None:
        ref_lp = placed(ref_lp, run, n)
    return logp, ref_lp, grads


def _taken(x, idx):
    """``x``'s entries ``idx`` (None: ``x`` itself)."""
    return x if idx is None else x.index_select(0, idx)


def _kept_chunks(hidden2d, weight, target2d, plan, align: int, rows: int, split: bool = False):
    """How :func:`_formed_pass` skips ignored rows of ``target2d`` (N,), in the order its units take them (pair by
    pair): ``(kept, bounds, units, pieces)``, the (K,) kept rows' places in that order
    (:func:`tigon.kernels.ignored_rows.kept_groups`: the fused cross-entropy's rule, at least MIN_SKIPPED of the rows
    ignored and N V H >= SKIP_MIN_MACS, never while a CUDA graph is captured), the chunks' bounds over them (whole
    groups of ``align`` rows, :func:`tigon.kernels.ignored_rows.group_cuts`) and each chunk's units (its first kept
    row -> (first unit, units), units of ``rows`` rows), and None; or (None, None, None, None): every row is
    computed. ``split`` (units of ``align`` rows): where one unit's kept rows exceed a chunk, each unit's kept rows in
    sub-chunks instead (:func:`_split_units`; ``pieces``: its sub-chunks).

    The chunks of kept rows stay within the plan's rule (:func:`tigon.kernels.fused_linear_cross_entropy.loop_cap` for
    K rows), the lean plan's and a byte budget's included: each chunk's rows are gathered into a (rows, H) buffer
    beside the (rows, V) chunk (:func:`~tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`), and a budget
    in bytes counts them with a grad_hidden row each (:func:`_gathered_bytes`), so that the chunk buffer and these
    rows together stay within it; where that leaves a group's kept rows no room, every row is computed."""
    from ..kernels.fused_linear_cross_entropy import loop_cap
    from ..kernels.ignored_rows import group_cuts, kept_groups

    v, h = weight.shape
    found = kept_groups(target2d, plan.opts.ignore_index, v, h, align)
    if found is None:
        return None, None, None, None
    kept, sizes = found
    cap = loop_cap(hidden2d, weight, plan.cd, plan.need, plan.lean, plan.budget, n=kept.numel(),
                   row_bytes=_gathered_bytes(h, plan.cd))
    cuts = group_cuts(sizes, cap)
    if cuts is None and split:
        bounds, pieces, units = _split_units(sizes, cap)
        return kept, bounds, units, pieces
    if cuts is None:
        return None, None, None, None
    starts = [0, *itertools.accumulate(sizes)]
    per = align // rows
    units = {starts[c]: (c * per, (d - c) * per) for c, d in zip(cuts, cuts[1:])}
    return kept, [starts[c] for c in cuts], units, None


def _split_units(sizes: list[int], cap: int):
    """Chunks of one unit each for units of ``sizes`` rows (consecutive; ints >= 0), a unit of more than ``cap`` rows
    split into k = ceil(size / cap) sub-chunks: the first takes the rest, size - (k - 1) cap rows, the others ``cap``
    each, so that the rows formed twice (all but the last sub-chunk's: size - cap) are as few as the cap allows (a
    unit of kept rows a little over the cap re-forms only that little); a unit of no rows in none:
    ``(bounds, pieces, units)``, the chunks' bounds over the rows (from 0 to sum(sizes)), ``{start of a unit's last
    sub-chunk: [(s, e) of its earlier ones]}`` and each unit's first row -> (its index, 1), as :func:`_kept_chunks`'
    ``units``."""
    bounds, pieces, units, at = [0], {}, {}, 0
    for g, size in enumerate(sizes):
        if size == 0:
            continue
        k = -(-size // cap)
        first = size - (k - 1) * cap
        cuts = [at] + [at + first + j * cap for j in range(k - 1)] + [at + size]
        if k > 1:
            pieces[cuts[-2]] = list(zip(cuts[:-2], cuts[1:-1]))
        units[at] = (g, 1)
        bounds += cuts[1:]
        at += size
    return bounds, pieces, units


def _gathered_bytes(hdim: int, cd: torch.dtype) -> int:
    """What a kept row gathered for a chunk costs beside its logits: its hidden row in ``cd`` and its grad_hidden row
    (fp32 at most). (The formed passes now write a chunk's grad_hidden rows straight into grad_hidden's buffer of the
    rows run, which holds K rows instead of N: :func:`tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`'
    ``formed``. The share is kept, a margin, so that the chunk plans stay as they were.)"""
    return hdim * (cd.itemsize + 4)


def _reference_rows(ref, target, plan, ref_lp, kept=None):
    """The ``before`` hook of :func:`_formed_pass`' chunk loop for a reference model ``ref`` (its ``(rows, weight,
    bias)``): the chunk's reference logits into the chunk's buffer, then their log-probabilities into ``ref_lp``
    ((M,) fp32, over the rows the loop runs: ``kept`` (K,) of them, or all), before the policy's logits overwrite the
    buffer. ``target``: (M,), the rows run."""
    from ..kernels import fused_linear_logprobs as klp
    from ..kernels.head_grads import _Matmuls
    from ..kernels.loss_rows import row_stats

    ref_rows, ref_w, ref_b = ref
    n, dev = ref_lp.shape[0], ref_lp.device
    z, stats = torch.empty(n, dtype=torch.float32, device=dev), row_stats(n, dev)
    mm = _Matmuls(dev, plan.cd)

    def before(lg, s, e):
        mm.logits(lg, ref_rows(s, e, None if kept is None else kept[s:e]), ref_w, ref_b)
        klp.rows_forward(lg, target[s:e], plan.opts, ref_lp[s:e], None, z[s:e], stats[s:e])

    return before
