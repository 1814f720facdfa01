"""Fused linear log-probabilities: per-token log p(target) (and entropy, log-sum-exp) of ``hidden @ weight.T``
without the (N, V) logits; the primitive of the post-training losses (DPO family, GRPO).

Formula and semantics: :mod:`tigon.reference.fused_linear_logprobs`. The temperature and the soft-cap are the
cross-entropy kernels' ``logit_scale`` and ``softcap``: ``c tanh(z / c) / T = c' tanh(s z / c')`` with ``s = 1 / T``
and ``c' = c / T``, so :class:`tigon.kernels.loss_rows.LossOptions` carries them unchanged.

Chunks of tokens as in :mod:`tigon.kernels.fused_linear_cross_entropy` (its ``chunk_rows``; ``_Matmuls``,
``grad_buffers``, ``finish_grad`` of :mod:`tigon.kernels.head_grads`): per chunk the logits go into one preallocated
(rows, V) buffer by cuBLAS, then a row kernel reads them.

* Log-probabilities alone: log p_t is minus the cross-entropy row loss (``reduction="none"``), formed as
  ``-((m - x_t) + log s)``; the forward is :func:`tigon.kernels.loss_rows.ce_rows_forward` and the backward, for an
  upstream ``a`` per token, is the cross-entropy row gradient with coefficient ``-a`` (logits recomputed by
  :func:`tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`, 4 matmuls in all).
* With the entropy (or a gradient on the lse): the kernels below. The forward keeps, beside the online
  log-sum-exp's running max m and sum s = sum exp(x - m), the sum u = sum exp(x - m) (m - x), rescaled with s when
  m grows (u' = e^(m - m') (u + (m' - m) s)); then H = u / s + log s: two non-negative terms, no cancellation (the
  form lse - sum p x loses the entropy of a confident token to an ulp of lse). The backward writes, per element,
  ``p_v (coef_p + h ((m - x_v) + log s)) - a [v = t]`` with coef_p = l - a - h H (module docstring of the
  reference), times the soft-cap and scale derivative, over the chunk buffer in place.

* Gradients formed in the forward (:func:`logprobs_grads_in_forward`, 3 matmuls in all): for a loss whose gradient
  w.r.t. each log p is known as soon as its chunk's log-probabilities are (the GRPO family's), each chunk runs the
  forward kernel, asks the loss for its per-token gradients, then the backward kernel over the same buffer, and the
  chunk's gradient matmuls; :class:`FormedGradsFunction` carries the result to the leaves.

* Top-1 flags (``return_is_top1``, TRL's token accuracy): both forwards keep, beside the running max, the column of
  the row's first maximum (a block's ``tl.argmax`` takes its first maximum; a later block replaces the running one
  only when its max is strictly larger), and write 1.0 where it is the target (the cross-entropy kernel's
  ``COMPUTE_ACC`` hit flags, in the log-probability-only path): ``torch.argmax``'s tie rule, in the same read of the
  logits. Comparing the target logit with the row max alone would count a target tied with an earlier column.

* ``log sum_v p_v^2`` (``return_log_sum_sq_probs``, the WPO weights of TRL's DPO): the entropy forward keeps, beside
  m and s, the sum s2 = sum exp(2 (x - m)) = sum e^2 of the same exponentials e = exp(x - m) (one multiply-add per
  element, no extra exp), rescaled by alpha^2 = e^(2 (m - m')) when m grows; then log sum p^2 = log s2 - 2 log s
  (= lse(2x) - 2 lse(x), with no second pass over the logits at half the temperature). Not differentiable. Without
  the entropy the same kernel runs with ``COMPUTE_ENT`` off (the entropy's sum u skipped); with the option off
  (``COMPUTE_SQ`` constexpr false) the kernel is the entropy / cross-entropy one, unchanged.

* The mean scaled logit (``return_mean_logits``, TRL's ``mean_logits``: the ``logits/*`` metrics of DPO and KTO):
  the same forward kernel (``COMPUTE_MEAN``) sums the transformed logits x_v of each row in fp32 as it reads them
  (one add per element), and writes sum / V; under a soft-cap it is not linear in the hidden state, so this read of
  every logit is where it can be had without the logits. Not differentiable.

Minimal bytes per chunk: forward reads the logits once (N*V*2 for bf16), backward reads and writes them once.
Ignored rows are never read (their outputs are 0, their gradient rows written as zeros); where at least 1/32 of the
rows are ignored and the head is large (:func:`tigon.kernels.ignored_rows.kept_for_chunks`: one host sync per call),
they are left out of the matmuls too, forward and backward (the kept rows gathered chunk by chunk).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from . import target_check
from ._common import CUSTOM_OP_TAGS, cdiv, if_wanted, or_empty
from .first_order import once_differentiable
from .fused_linear_cross_entropy import backward_over_chunks, chunk_rows
from .ignored_rows import kept_for_chunks, placed, scatter_rows
from .head_grads import _Matmuls, _operands, scale_grads
from .loss_rows import (
    LossOptions, _blocks, _record_bad_targets, _row_setup, _target_logit, _transform, _transform_slope,
    ce_rows_backward, ce_rows_forward, row_stats,
)


@triton.jit
def _logprob_entropy_fwd_kernel(
    X, stride_x,      # logits rows (n, V), unit column stride; stride_x: elements between rows
    T,                # (n,) int targets, contiguous
    LOGP, ENT,        # (n,) fp32 outputs: log p(target), entropy (0 at ignored rows)
    STATS,            # (n, 2) fp32 output: row max m and log s (lse = m + log s)
    TOP1,             # (n,) fp32 output with COMPUTE_TOP1: 1.0 where the target is the row's first argmax, else 0.0
    SQ,               # (n,) fp32 output with COMPUTE_SQ: log sum_v p_v^2 (0 at ignored rows)
    MEAN,             # (n,) fp32 output with COMPUTE_MEAN: mean_v x_v (0 at ignored rows)
    BAD,              # the target_check buffer (a target outside [0, V) is recorded there)
    n_rows, V, ignore_index, logit_scale, softcap,
    HAS_SOFTCAP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, COMPUTE_TOP1: tl.constexpr = False,
    COMPUTE_ENT: tl.constexpr = True, COMPUTE_SQ: tl.constexpr = False, COMPUTE_MEAN: tl.constexpr = False,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask, valid, in_range, t_safe, _wt = _row_setup(T, T, rows, n_rows, V, ignore_index, False)
    _record_bad_targets(BAD, T, rows, rmask, valid, in_range)
    x_row = X + rows.to(tl.int64) * stride_x
    xt = _target_logit(x_row, t_safe, in_range, valid, logit_scale, softcap, HAS_SOFTCAP)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    u = tl.zeros([BLOCK_M], tl.float32)  # sum_v exp(x_v - m) (m - x_v), with COMPUTE_ENT
    s2 = tl.zeros([BLOCK_M], tl.float32)  # sum_v exp(2 (x_v - m)), with COMPUTE_SQ
    xsum = tl.zeros([BLOCK_M], tl.float32)  # sum_v x_v, with COMPUTE_MEAN
    best = tl.zeros([BLOCK_M], tl.int32)  # column of the first maximum so far
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        cmask = cols < V
        raw = tl.load(x_row[:, None] + cols[None, :], mask=valid[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        x = _transform(raw, logit_scale, softcap, HAS_SOFTCAP)
        if COMPUTE_MEAN:  # (an ignored row reads zeros: x = 0)
            xsum += tl.sum(tl.where(cmask[None, :], x, 0.0), axis=1)
        x = tl.where(cmask[None, :], x, float("-inf"))
        bmax = tl.max(x, axis=1)
        if COMPUTE_TOP1:
            bidx = tl.argmax(x, axis=1, tie_break_left=True).to(tl.int32)
            best = tl.where(bmax > m, start + bidx, best)  # strict: an equal later maximum keeps the first
        m_new = tl.maximum(m, bmax)
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
        alpha = tl.exp(m - m_ref)
        e = tl.exp(x - m_ref[:, None])
        if COMPUTE_ENT:
            shift = tl.where(m > float("-inf"), m_ref - m, 0.0)  # (s = u = 0 while m = -inf)
            d = tl.where(cmask[None, :], m_ref[:, None] - x, 0.0)
            u = alpha * (u + shift * s) + tl.sum(e * d, axis=1)
        if COMPUTE_SQ:
            s2 = (alpha * alpha) * s2 + tl.sum(e * e, axis=1)
        s = alpha * s + tl.sum(e, axis=1)
        m = m_new
    logs = tl.log(s)
    tl.store(LOGP + rows, tl.where(valid, (xt - m) - logs, 0.0), mask=rmask)
    if COMPUTE_ENT:
        tl.store(ENT + rows, tl.where(valid, u / s + logs, 0.0), mask=rmask)
    if COMPUTE_SQ:
        tl.store(SQ + rows, tl.where(valid, tl.log(s2) - 2.0 * logs, 0.0), mask=rmask)
    if COMPUTE_MEAN:
        tl.store(MEAN + rows, tl.where(valid, xsum / V, 0.0), mask=rmask)
    tl.store(STATS + 2 * rows, m, mask=rmask)
    tl.store(STATS + 2 * rows + 1, logs, mask=rmask)
    if COMPUTE_TOP1:
        tl.store(TOP1 + rows, tl.where(valid & in_range & (best == t_safe), 1.0, 0.0), mask=rmask)


@triton.jit
def _logprob_bwd_kernel(
    X, stride_x,      # logits rows (n, V) (recomputed), unit column stride
    T, STATS, ENT,    # targets (n,), the forward's row statistics (n, 2) and entropy (n,) (read with HAS_ENT_GRAD)
    GLP, GENT, GLSE,  # (n,) fp32 upstream gradients on log p, entropy, lse (GENT / GLSE read only when flagged)
    DX, stride_dx,    # (n, V) output d/d raw logits (may be X: in place)
    n_rows, V, ignore_index, logit_scale, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_ENT_GRAD: tl.constexpr, HAS_LSE_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask, valid, _in_range, t_safe, _wt = _row_setup(T, T, rows, n_rows, V, ignore_index, False)
    m = tl.load(STATS + 2 * rows, mask=rmask, other=0.0)
    logs = tl.load(STATS + 2 * rows + 1, mask=rmask, other=0.0)
    a = tl.where(valid, tl.load(GLP + rows, mask=rmask, other=0.0), 0.0)
    coef_p = -a
    h = tl.zeros([BLOCK_M], tl.float32)
    if HAS_LSE_GRAD:
        coef_p += tl.where(valid, tl.load(GLSE + rows, mask=rmask, other=0.0), 0.0)
    if HAS_ENT_GRAD:
        h = tl.where(valid, tl.load(GENT + rows, mask=rmask, other=0.0), 0.0)
        coef_p -= h * tl.load(ENT + rows, mask=rmask, other=0.0)
    rows64 = rows.to(tl.int64)
    x_row = X + rows64 * stride_x
    dx_row = DX + rows64 * stride_dx
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        cmask = cols < V
        raw = tl.load(x_row[:, None] + cols[None, :], mask=valid[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        x, slope = _transform_slope(raw, logit_scale, softcap, HAS_SOFTCAP)
        p = tl.exp((x - m[:, None]) - logs[:, None])
        c = coef_p[:, None]
        if HAS_ENT_GRAD:
            c = c + h[:, None] * ((m[:, None] - x) + logs[:, None])
        g = c * p + tl.where(cols[None, :] == t_safe[:, None], a[:, None], 0.0)
        if HAS_SOFTCAP:  # (1 - tanh^2 from exp(-2|u|): accurate where tanh saturates)
            g = g * slope
        g = g * logit_scale
        tl.store(dx_row[:, None] + cols[None, :], g.to(DX.dtype.element_ty), mask=rmask[:, None] & cmask[None, :])


# ----------------------------------------------------------------------------------------------- launchers
# Blocks: the cross-entropy rows' (tigon.kernels.loss_rows._blocks: vocabulary blocks of up to MAX_BLOCK_V = 8192,
# one row per program at LM vocabularies, 8 warps), measured there for the cross-entropy forward and backward on an
# H200 (3.3 / 3.7 TB/s at N=8192, V=128256 bf16); these two kernels read and write the same bytes with a few more
# flops per element, and are not re-measured (no GPU in this session).


def rows_forward_entropy(x: torch.Tensor, target: torch.Tensor, opts: LossOptions, out_logp: torch.Tensor,
                         out_ent: torch.Tensor | None, out_stats: torch.Tensor, out_top1: torch.Tensor | None = None,
                         out_sq: torch.Tensor | None = None, out_mean: torch.Tensor | None = None) -> None:
    """Log-probabilities, entropies and row statistics of rows ``x`` (n, V) (unit column stride), targets (n,)
    contiguous, into (n,) / (n,) / (n, 2) fp32 outputs (``out_ent`` None: no entropy, its sum skipped); with
    ``out_top1`` ((n,) fp32) also 1.0 / 0.0 where the target is / is not the row's first argmax (0.0 at ignored
    rows); with ``out_sq`` ((n,) fp32) also log sum_v p_v^2 (0.0 at ignored rows), from the same exponentials; with
    ``out_mean`` ((n,) fp32) the mean transformed logit (0.0 at ignored rows). Raises first for a bad target an
    earlier launch recorded."""
    n, vocab = x.shape
    if n == 0:
        return
    target_check.raise_if_seen()
    block_m, block_v, warps = _blocks(n, vocab, x.device)
    _logprob_entropy_fwd_kernel[(cdiv(n, block_m),)](
        x, x.stride(0), target, out_logp, out_ent if out_ent is not None else out_logp, out_stats,
        out_top1 if out_top1 is not None else out_logp, out_sq if out_sq is not None else out_logp,
        out_mean if out_mean is not None else out_logp, target_check.buffer(x.device), n, vocab,
        int(opts.ignore_index), float(opts.logit_scale),
        float(opts.softcap or 1.0), HAS_SOFTCAP=opts.softcap is not None, BLOCK_M=block_m, BLOCK_V=block_v,
        num_warps=warps, COMPUTE_TOP1=out_top1 is not None, COMPUTE_ENT=out_ent is not None,
        COMPUTE_SQ=out_sq is not None, COMPUTE_MEAN=out_mean is not None,
    )


def rows_backward(x: torch.Tensor, target: torch.Tensor, stats: torch.Tensor, ent: torch.Tensor | None,
                  g_lp: torch.Tensor, g_ent: torch.Tensor | None, g_lse: torch.Tensor | None, opts: LossOptions,
                  dx: torch.Tensor) -> None:
    """``dx`` = the gradient on rows ``x`` (n, V) for the upstream gradients on log p (``g_lp``), the entropy
    (``g_ent``, with the forward's ``ent``) and the lse (``g_lse``): (n,) fp32 contiguous, None for none (g_lp
    required). ``dx`` may be ``x`` (in place)."""
    n, vocab = x.shape
    if n == 0:
        return
    target_check.raise_if_seen()
    block_m, block_v, warps = _blocks(n, vocab, x.device)
    _logprob_bwd_kernel[(cdiv(n, block_m),)](
        x, x.stride(0), target, stats, ent if g_ent is not None else stats, g_lp,
        g_ent if g_ent is not None else g_lp, g_lse if g_lse is not None else g_lp, dx, dx.stride(0),
        n, vocab, int(opts.ignore_index), float(opts.logit_scale), float(opts.softcap or 1.0),
        HAS_SOFTCAP=opts.softcap is not None, HAS_ENT_GRAD=g_ent is not None, HAS_LSE_GRAD=g_lse is not None,
        BLOCK_M=block_m, BLOCK_V=block_v, num_warps=warps,
    )


# ----------------------------------------------------------------------------------------------- chunk loops


def rows_forward(lg: torch.Tensor, target: torch.Tensor, opts: LossOptions, logp: torch.Tensor,
                 ent: torch.Tensor | None, z: torch.Tensor | None, stats: torch.Tensor,
                 top1: torch.Tensor | None = None, sq: torch.Tensor | None = None,
                 mean: torch.Tensor | None = None) -> None:
    """Log-probabilities (and, with ``ent``, entropies) and row statistics of one chunk of logits ``lg`` (n, V)
    into the (n,) / (n, 2) fp32 slices ``logp``, ``ent``, ``stats``; with ``top1`` ((n,) fp32) the 1.0 / 0.0 flags
    of a target that is its row's first argmax, with ``sq`` ((n,) fp32) log sum_v p_v^2, with ``mean`` ((n,) fp32)
    the mean transformed logit, from the same read. Without the entropy, ``sq`` and ``mean`` it is the
    cross-entropy row forward, whose loss rows (-log p, negated here), z rows (``z``, (n,) fp32 scratch) and hit flags
    it writes."""
    if ent is not None or sq is not None or mean is not None:
        rows_forward_entropy(lg, target, opts, logp, ent, stats, top1, sq, mean)
    else:
        ce_rows_forward(lg, target, None, None, opts, logp, z, stats, top1)
        logp.neg_().add_(0.0)  # the cross-entropy row loss is -log p (+0.0, not -0.0, at ignored rows)


def rows_grad_(lg: torch.Tensor, target: torch.Tensor, stats: torch.Tensor, ent: torch.Tensor | None,
               g_lp: torch.Tensor, g_ent: torch.Tensor | None, g_lse: torch.Tensor | None,
               opts: LossOptions) -> None:
    """Overwrite one chunk of logits ``lg`` (n, V) with the gradient for the upstream gradients (n,) fp32 on log p,
    the entropy and the lse (None for none): log p alone through the cross-entropy rows' backward (coefficient
    -g_lp), else :func:`rows_backward`."""
    if g_ent is None and g_lse is None:
        ce_rows_backward(lg, target, None, None, stats, opts, -g_lp, lg)
    else:
        rows_backward(lg, target, stats, ent, g_lp, g_ent, g_lse, opts, lg)


def logprobs_forward(hidden, weight, target, bias, opts: LossOptions, cd: torch.dtype, want_entropy: bool,
                     lean: bool = False, budget: int = -1, want_top1: bool = False, want_sq: bool = False,
                     want_mean: bool = False):
    """(logp (N,), entropy (N,) or None, stats (N, 2), top1, sq, mean) fp32 over chunks of tokens (no gradient is
    formed here: the backward recomputes the logits), top1 (N,) bool or None: with ``want_top1``, whether the target
    is its row's first argmax (False at ignored tokens); sq (N,) fp32 or None: with ``want_sq``, log sum_v p_v^2 (0
    at ignored tokens); mean (N,) fp32 or None: with ``want_mean``, the mean transformed logit (0 at ignored
    tokens). ``cd``: the matmul dtype; ``target`` contiguous; ``lean``, ``budget``: the chunk rule of
    :func:`tigon.kernels.fused_linear_cross_entropy.chunk_rows` (the ``memory`` option)."""
    n, hdim = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    h, w, b = _operands(hidden, weight, bias, cd)
    f32 = dict(dtype=torch.float32, device=dev)
    logp, stats = torch.empty(n, **f32), row_stats(n, dev)
    ent = torch.empty(n, **f32) if want_entropy else None
    z = None if want_entropy or want_sq or want_mean else torch.empty(n, **f32)  # the CE kernel's z-loss rows (0)
    top1 = torch.empty(n, **f32) if want_top1 else None
    sq = torch.empty(n, **f32) if want_sq else None
    mean = torch.empty(n, **f32) if want_mean else None
    # ignored tokens (0 in every output) left out of the matmuls, as the backward leaves them out (ignored_rows)
    kept = kept_for_chunks(target, opts.ignore_index, vocab, hdim, lean or budget >= 0)
    full = (logp, ent, z, stats, top1, sq, mean)
    m = n
    if kept is not None:
        m, target = kept.numel(), target.index_select(0, kept)
        logp, ent, z, stats, top1, sq, mean = (None if x is None else x.new_empty((m, *x.shape[1:])) for x in full)
    rows = chunk_rows(m, vocab, hdim, dev, lean, False, cd.itemsize, budget)
    buf = torch.empty(size=(rows, vocab), dtype=cd, device=dev)
    hbuf = None if kept is None else h.new_empty((rows, hdim))
    with torch.autocast(dev.type, enabled=False):
        mm = _Matmuls(dev, cd)
        for s in range(0, m, rows):
            e = min(s + rows, m)
            lg = buf[: e - s]
            hs = h[s:e] if kept is None else torch.index_select(h, 0, kept[s:e], out=hbuf[: e - s])
            mm.logits(lg, hs, w, b)
            rows_forward(lg, target[s:e], opts, logp[s:e], ent[s:e] if want_entropy else None,
                         None if z is None else z[s:e], stats[s:e], top1[s:e] if want_top1 else None,
                         sq[s:e] if want_sq else None, mean[s:e] if want_mean else None)
    if kept is not None:  # an ignored token's outputs: 0, statistics (0, log V), as the kernel writes them
        parts = (logp, ent, z, None, top1, sq, mean)  # (stats apart)
        scatter_rows(kept, [(d, x, 0.0) for d, x in zip(full, parts) if x is not None], full[3], stats, vocab)
        logp, ent, z, stats, top1, sq, mean = full
    return logp, ent, stats, (top1 != 0 if want_top1 else None), sq, mean


def logprobs_backward(g_lp, g_ent, g_lse, hidden, weight, target, bias, stats, ent, opts: LossOptions,
                      cd: torch.dtype, need: tuple[bool, bool, bool], lean: bool = False, halves: bool = False,
                      budget: int = -1):
    """(grad_hidden, grad_weight, grad_bias) in the inputs' dtypes (None where not needed) for upstream gradients
    (N,) on log p, the entropy and the lse (None for none; g_lp may be None too), the logits recomputed chunk by
    chunk (:func:`tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`). ``lean``, ``halves``,
    ``budget``: as :func:`tigon.kernels.fused_linear_cross_entropy.flce_backward_rows`."""
    n = hidden.shape[0]

    def coef(g):
        return None if g is None else g.to(torch.float32).contiguous()

    g_lp = coef(g_lp) if g_lp is not None else torch.zeros(n, dtype=torch.float32, device=hidden.device)
    g_ent, g_lse = coef(g_ent), coef(g_lse)

    # ignored rows get no gradient (the kernels zero them): left out of the matmuls where that pays
    kept = kept_for_chunks(target, opts.ignore_index, *weight.shape, lean or budget >= 0)
    if kept is not None:
        target, stats, ent, g_lp, g_ent, g_lse = (t if t is None else t.index_select(0, kept)
                                                  for t in (target, stats, ent, g_lp, g_ent, g_lse))

    def rows_grad(lg, s, e):
        rows_grad_(lg, target[s:e], stats[s:e], ent[s:e] if ent is not None else None, g_lp[s:e],
                   g_ent[s:e] if g_ent is not None else None, g_lse[s:e] if g_lse is not None else None, opts)

    return backward_over_chunks(hidden, weight, bias, cd, need, lean, halves, budget, rows_grad, kept=kept)


def logprobs_grads_in_forward(hidden, weight, target, bias, opts: LossOptions, cd: torch.dtype,
                              need: tuple[bool, bool, bool], want_entropy: bool, token_grads, lean: bool = False,
                              budget: int = -1, align: int = 1, halves: bool = True, before=None,
                              kept: torch.Tensor | None = None, bounds: list[int] | None = None,
                              pieces: dict | None = None):
    """Log-probabilities and the gradients of a loss of them formed in one pass (3 matmuls per chunk: logits,
    grad_hidden, grad_weight), for a loss whose gradient w.r.t. each token's log p (and entropy) is known once the
    chunk's log-probabilities are (a per-token function of them, or of whole sequences when chunks hold whole
    sequences: ``align``, see :func:`tigon.kernels.fused_linear_cross_entropy.loop_rows`).

    Per chunk [s, e): the logits, :func:`rows_forward`, then ``token_grads(s, e, logp, ent)`` (the chunk's (e - s,)
    fp32 log-probabilities and entropies or None) returns ``(g_lp, g_ent)``, (e - s,) fp32 contiguous (g_ent may be
    None), the loss's gradient w.r.t. them; :func:`rows_grad_` turns them into the logits' gradient in place, and the
    loop's matmuls accumulate it. Returns (logp (N,), entropy (N,) or None, (gh, gw, gb)): the unscaled accumulators
    of :func:`tigon.kernels.head_grads.grad_buffers`' scalar path, for
    :func:`~tigon.kernels.head_grads.scale_grads` (grad_hidden in bfloat16 for bfloat16 hidden states and matmuls:
    :func:`~tigon.kernels.head_grads.grad_buffers`' ``formed``). ``target`` contiguous; ``lean``, ``budget``,
    ``halves``: as :func:`logprobs_backward`; ``before``, ``kept``, ``bounds``: as
    :func:`~tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`' (each chunk's buffer before its logits;
    the rows to run, in their order, when the chunks run over them alone (the kept rows; the preference losses'
    rows pair by pair): [s, e) then index them, and the returned logp / entropy / grad_hidden are in the rows' own
    layout, 0 at the rows not run, what the kernels give an ignored row; explicit chunks).

    ``pieces`` (with ``bounds``): units of rows larger than a chunk, each split over consecutive chunks (sub-chunks),
    as ``{start of a unit's last sub-chunk: [(s, e) of its earlier ones]}``. An earlier sub-chunk's logits get the
    forward kernel alone (its gradient waits: 1 matmul); at the last one ``token_grads(u, e, logp, ent)`` takes the
    whole unit's rows [u, e) (u its first), the last sub-chunk's buffer becomes its logits' gradient (3 matmuls), and
    each earlier sub-chunk's logits are formed again and turned into theirs (3 matmuls more,
    :func:`~tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`' deferred gradients): a unit of k equal
    sub-chunks costs 3 + (k - 1) / k matmuls a row instead of 3, in a (rows / k, V) buffer; the unit's (rows,) fp32
    gradients w.r.t. log p are held meanwhile."""
    n = hidden.shape[0]
    f32 = dict(dtype=torch.float32, device=hidden.device)
    m = n if kept is None else kept.numel()
    if kept is not None:
        target = target.index_select(0, kept)
    logp, stats = torch.empty(m, **f32), row_stats(m, hidden.device)
    ent = torch.empty(m, **f32) if want_entropy else None
    z = None if want_entropy else torch.empty(m, **f32)

    pieces = pieces or {}
    waiting = {a for earlier in pieces.values() for a, _ in earlier}  # sub-chunks whose gradient comes later
    known = {}  # an earlier sub-chunk's start -> its (g_lp, g_ent), from its unit's last sub-chunk

    def rows_grad(lg, s, e):
        ent_c = ent[s:e] if ent is not None else None
        if s in known:  # an earlier sub-chunk's logits formed again: its gradient is known now
            g_lp, g_ent = known.pop(s)
            rows_grad_(lg, target[s:e], stats[s:e], ent_c, g_lp, g_ent, None, opts)
            return None
        rows_forward(lg, target[s:e], opts, logp[s:e], ent_c, z[s:e] if z is not None else None, stats[s:e])
        if s in waiting:
            return False
        earlier = pieces.get(s, ())
        u = earlier[0][0] if earlier else s
        g_lp, g_ent = token_grads(u, e, logp[u:e], None if ent is None else ent[u:e])
        for a, b in earlier:
            known[a] = (g_lp[a - u: b - u], None if g_ent is None else g_ent[a - u: b - u])
        rows_grad_(lg, target[s:e], stats[s:e], ent_c, g_lp[s - u:], None if g_ent is None else g_ent[s - u:],
                   None, opts)
        return list(earlier) or None

    grads = backward_over_chunks(hidden, weight, bias, cd, need, lean, halves, budget, rows_grad, scalar=True,
                                 align=align, before=before, kept=kept, bounds=bounds, formed=True)
    if kept is not None:
        logp, ent = (None if x is None else placed(x, kept, n) for x in (logp, ent))
    return logp, ent, grads


class FormedGradsFunction(torch.autograd.Function):
    """Carries gradients formed in a forward to their leaves: ``apply(hidden, weight, bias, run)`` calls ``run()``,
    which returns ``(outputs, (gh, gw, gb))``: a tuple of tensors and the unscaled accumulators of
    :func:`logprobs_grads_in_forward` for an upstream gradient of 1 (None where not needed), and returns
    ``(anchor, *outputs)``: ``anchor`` a 0-d fp32 zero, the only differentiable output. A loss computed from the
    outputs without autograd, plus the anchor, has the formed gradients times its upstream scalar (the backward
    scales and casts them, :func:`~tigon.kernels.head_grads.scale_grads`). A second backward
    through the same graph raises (the gradients are released by the first)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, run):
        outputs, grads = run()
        ctx.grads = grads
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(*outputs)
        return (hidden.new_zeros((), dtype=torch.float32), *outputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_anchor, *_unused):
        if ctx.grads is None:
            raise RuntimeError("tigon: this loss forms its gradients in the forward and scales them in the backward: "
                               "a second backward through the same graph is not possible")
        grads, ctx.grads = ctx.grads, None
        gh, gw, gb = scale_grads(grads, grad_anchor, ctx.dtypes, inplace=True)
        return gh, gw, gb, None


def logprobs_outputs(hidden, weight, target, bias, opts: LossOptions, cd: torch.dtype, want_entropy: bool,
                     lean: bool = False, budget: int = -1, want_top1: bool = False, want_sq: bool = False,
                     want_mean: bool = False):
    """(logp, entropy or None, lse, stats, top1 or None, sq or None, mean or None): :func:`logprobs_forward` plus
    the lse (0 at ignored tokens); shared by the autograd.Function and the custom op."""
    logp, ent, stats, top1, sq, mean = logprobs_forward(hidden, weight, target, bias, opts, cd, want_entropy, lean,
                                                        budget, want_top1, want_sq, want_mean)
    lse = torch.where(target != opts.ignore_index, stats[:, 0] + stats[:, 1], 0.0)
    return logp, ent, lse, stats, top1, sq, mean


class FusedLinearLogProbsFunction(torch.autograd.Function):
    """autograd wrapper: ``apply(hidden, weight, target, bias, opts, cd, need, want_entropy, lean, budget,
    want_top1, want_sq, want_mean)`` -> (logp, entropy, lse, top1, sq, mean): (N,) fp32 each and differentiable
    (entropy is an empty (0,) tensor unless ``want_entropy``), top1 (N,) bool, not differentiable (an empty (0,)
    tensor unless ``want_top1``), sq (N,) fp32 log sum_v p_v^2 and mean (N,) fp32 mean transformed logit, not
    differentiable (empty (0,) tensors unless ``want_sq`` / ``want_mean``).
    ``need`` = (grad for hidden, weight, bias), decided by the caller; ``cd`` the matmul dtype; ``lean``, ``budget``:
    the ``memory`` option (:func:`tigon.ops.fused_linear_cross_entropy.memory_plan`)."""

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, opts, cd, need, want_entropy, lean=False, budget=-1,
                want_top1=False, want_sq=False, want_mean=False):
        target = target.contiguous()
        logp, ent, lse, stats, top1, sq, mean = logprobs_outputs(hidden, weight, target, bias, opts, cd, want_entropy,
                                                                 lean, budget, want_top1, want_sq, want_mean)
        ctx.opts, ctx.cd, ctx.need, ctx.lean, ctx.budget = opts, cd, need, lean, budget
        if any(need):
            ctx.save_for_backward(hidden, weight, target, bias, stats, ent)
        if ent is None:
            ent = logp.new_empty((0,))
            ctx.mark_non_differentiable(ent)
        if top1 is None:
            top1 = torch.empty((0,), dtype=torch.bool, device=logp.device)
        sq, mean = (logp.new_empty((0,)) if t is None else t for t in (sq, mean))
        ctx.mark_non_differentiable(top1, sq, mean)
        ctx.set_materialize_grads(False)
        return logp, ent, lse, top1, sq, mean

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, g_lp, g_ent, g_lse, _g_top1, _g_sq, _g_mean):
        none = (None,) * 9
        if not any(ctx.need) or (g_lp is None and g_ent is None and g_lse is None):
            return (None,) * 4 + none
        hidden, weight, target, bias, stats, ent = ctx.saved_tensors
        if ent is None:
            g_ent = None
        if g_lp is None:
            g_lp = torch.zeros(target.shape[0], dtype=torch.float32, device=target.device)
        gh, gw, gb = logprobs_backward(g_lp, g_ent, g_lse, hidden, weight, target, bias, stats, ent, ctx.opts,
                                       ctx.cd, ctx.need, ctx.lean, True, ctx.budget)
        return (gh if ctx.need[0] else None, gw if ctx.need[1] else None, None,
                gb if ctx.need[2] else None) + none


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::fused_linear_logprobs", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _flp(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], ignore_index: int,
         softcap: Optional[float], logit_scale: float, cd: torch.dtype, want_entropy: bool, need_hidden: bool,
         need_weight: bool, need_bias: bool, lean: bool, budget: int,
         want_top1: bool = False, want_sq: bool = False,
         want_mean: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(logp (N,), entropy (N,) or (0,) unless ``want_entropy``, lse (N,), stats (N, 2)), fp32, top1 (N,) bool
    or (0,) unless ``want_top1``, sq (N,) fp32 (log sum_v p_v^2, no gradient) or (0,) unless ``want_sq``, and mean
    (N,) fp32 (mean transformed logit, no gradient) or (0,) unless ``want_mean``. The need flags only tell the
    autograd formula which gradients to form."""
    opts = LossOptions(ignore_index, 0.0, 0.0, softcap, logit_scale)
    logp, ent, lse, stats, top1, sq, mean = logprobs_outputs(hidden, weight, target.contiguous(), bias, opts, cd,
                                                             want_entropy, lean, budget, want_top1, want_sq, want_mean)
    if top1 is None:
        top1 = torch.empty((0,), dtype=torch.bool, device=logp.device)
    return logp, or_empty(ent, stats), lse, stats, top1, or_empty(sq, stats), or_empty(mean, stats)


@_flp.register_fake
def _(hidden, weight, target, bias, ignore_index, softcap, logit_scale, cd, want_entropy, need_hidden, need_weight,
      need_bias, lean, budget, want_top1=False, want_sq=False, want_mean=False):
    n = hidden.shape[0]
    f32 = dict(dtype=torch.float32)
    return (hidden.new_empty((n,), **f32), hidden.new_empty((n,) if want_entropy else (0,), **f32),
            hidden.new_empty((n,), **f32), hidden.new_empty((n, 2), **f32),
            hidden.new_empty((n,) if want_top1 else (0,), dtype=torch.bool),
            hidden.new_empty((n,) if want_sq else (0,), **f32), hidden.new_empty((n,) if want_mean else (0,), **f32))


@torch.library.custom_op("tigon::fused_linear_logprobs_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _flp_backward(g_lp: Tensor, g_ent: Optional[Tensor], g_lse: Optional[Tensor], hidden: Tensor, weight: Tensor,
                  target: Tensor, bias: Optional[Tensor], stats: Tensor, ent: Tensor, ignore_index: int,
                  softcap: Optional[float], logit_scale: float, cd: torch.dtype, need_hidden: bool, need_weight: bool,
                  need_bias: bool, lean: bool, budget: int) -> tuple[Tensor, Tensor, Tensor]:
    """(grad_hidden, grad_weight, grad_bias) in the inputs' shapes and dtypes, (0,) where not needed; ``g_ent`` None
    unless the forward returned an entropy (``ent``)."""
    opts = LossOptions(ignore_index, 0.0, 0.0, softcap, logit_scale)
    gh, gw, gb = logprobs_backward(g_lp, g_ent, g_lse, hidden, weight, target.contiguous(), bias, stats,
                                   ent if g_ent is not None else None, opts, cd,
                                   (need_hidden, need_weight, need_bias), lean, budget=budget)
    return or_empty(gh, stats), or_empty(gw, stats), or_empty(gb, stats)


@_flp_backward.register_fake
def _(g_lp, g_ent, g_lse, hidden, weight, target, bias, stats, ent, ignore_index, softcap, logit_scale, cd,
      need_hidden, need_weight, need_bias, lean, budget):
    empty = stats.new_empty((0,))
    return (hidden.new_empty(hidden.shape) if need_hidden else empty,
            weight.new_empty(weight.shape) if need_weight else empty.new_empty((0,)),
            bias.new_empty(bias.shape) if need_bias and bias is not None else empty.new_empty((0,)))


def _flp_setup(ctx, inputs, output):
    hidden, weight, target, bias, ignore_index, softcap, logit_scale, cd, want_entropy, nh, nw, nb, lean = inputs[:13]
    budget = inputs[13]
    ctx.need, ctx.want_entropy, ctx.n_inputs = (nh, nw, nb), want_entropy, len(inputs)
    ctx.scalars = (ignore_index, softcap, logit_scale, cd, nh, nw, nb, lean, budget)
    ctx.save_for_backward(hidden, weight, target, bias, output[3], output[1])


def _flp_grad(ctx, g_lp, g_ent, g_lse, _g_stats, _g_top1, _g_sq, _g_mean):
    nones = (None,) * (ctx.n_inputs - 4)
    if not any(ctx.need):
        return (None,) * 4 + nones
    hidden, weight, target, bias, stats, ent = ctx.saved_tensors
    if g_lp is None:
        g_lp = torch.zeros(target.shape[0], dtype=torch.float32, device=target.device)
    outs = _flp_backward(g_lp, g_ent if ctx.want_entropy else None, g_lse, hidden, weight, target, bias, stats, ent,
                         *ctx.scalars)
    gh, gw, gb = (if_wanted(t, wanted) for t, wanted in zip(outs, ctx.need))
    return (gh, gw, None, gb) + nones


_flp.register_autograd(_flp_grad, setup_context=_flp_setup)


def compiled_fused_linear_logprobs(hidden, weight, target, bias, opts: LossOptions, cd, need, want_entropy,
                                   lean=False, budget=-1, want_top1=False, want_sq=False, want_mean=False):
    """``FusedLinearLogProbsFunction.apply`` as the ``tigon::fused_linear_logprobs`` custom op: (logp, entropy, lse,
    top1, sq, mean)."""
    logp, ent, lse, _stats, top1, sq, mean = _flp(hidden, weight, target, bias, opts.ignore_index, opts.softcap,
                                                  opts.logit_scale, cd, want_entropy, *need, lean, budget, want_top1,
                                                  want_sq, want_mean)
    return logp, ent, lse, top1, sq, mean
