"""The local pass of the vocabulary-parallel cross-entropy: one read of this rank's shard of the logits.

Each rank holds the logits of classes [v0, v0 + Vl) of V (a column-sharded LM head's output). Per row the kernel
writes five fp32 partials (:data:`STAT_COLS`), combined across ranks by :mod:`tigon.ops.vocab_parallel` (max of the
first, then sum of the others rescaled to the global max; the formula follows Megatron-LM's vocab-parallel
cross-entropy, Shoeybi et al. 2019):

    m    local max of x = softcap(logit_scale * logits)       (all-reduced with max -> M)
    s    local sum_c exp(x_c - m)                             (times exp(m - M), all-reduced with sum -> S)
    x_t  the target's x if this rank owns the target, else 0  (sum: the owner's value)
    own  1 if this rank owns the target, else 0               (sum: 1 for a target in [0, V))
    sx   local sum_c x_c, only with label smoothing            (sum)

The rest runs on (N,) vectors: lse = M + log S, loss = (1-eps)(lse - x_t) + eps (lse - sx / V) + z lse^2. The
gradient on the shard is the plain cross-entropy's, formed by :func:`tigon.kernels.loss_rows.ce_rows_backward` from
the global (M, log S) with the target's -1 on its owner only. Ignored rows are not read (their partials are 0).
Bytes: one read of the shard (N*Vl*e) and 20 N bytes written; the backward reads the shard once and writes it once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv
from .loss_rows import _blocks, _transform

STAT_COLS = 5
"""Columns of :func:`local_stats`' output: m, s, x_t, own, sx (module docstring)."""


@triton.jit
def _vp_stats_kernel(
    X, stride_x,          # the shard (n_rows, V) of logits, unit column stride; stride_x: elements between rows
    T,                    # (n_rows,) global target ids (int32 / int64)
    OUT,                  # (n_rows, 5) fp32 partials, contiguous
    n_rows, V, vocab_start, ignore_index, logit_scale, softcap,
    HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n_rows
    t = tl.load(T + rows, mask=rmask, other=ignore_index)
    valid = rmask & (t != ignore_index)
    t_loc = t - vocab_start
    own = valid & (t_loc >= 0) & (t_loc < V)
    x_row = X + rows.to(tl.int64) * stride_x
    xt = tl.load(x_row + tl.where(own, t_loc, 0), mask=own, other=0.0).to(tl.float32)
    xt = tl.where(own, _transform(xt, logit_scale, softcap, HAS_SOFTCAP), 0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    sx = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, V, BLOCK_V):  # online log-sum-exp, as loss_rows' forward
        cols = start + tl.arange(0, BLOCK_V)
        cmask = cols < V
        raw = tl.load(x_row[:, None] + cols[None, :], mask=valid[:, None] & cmask[None, :], other=0.0).to(tl.float32)
        x = _transform(raw, logit_scale, softcap, HAS_SOFTCAP)
        if HAS_SMOOTHING:
            sx += tl.sum(tl.where(cmask[None, :], x, 0.0), axis=1)
        x = tl.where(cmask[None, :], x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)
        s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref[:, None]), axis=1)
        m = m_new
    out = OUT + rows * 5
    tl.store(out, tl.where(valid, m, 0.0), mask=rmask)
    tl.store(out + 1, tl.where(valid, s, 0.0), mask=rmask)
    tl.store(out + 2, xt, mask=rmask)
    tl.store(out + 3, tl.where(own, 1.0, 0.0), mask=rmask)
    tl.store(out + 4, tl.where(valid, sx, 0.0), mask=rmask)


def local_stats(x: torch.Tensor, target: torch.Tensor, vocab_start: int, ignore_index: int, logit_scale: float,
                softcap: float | None, smoothing: bool) -> torch.Tensor:
    """The (n, 5) fp32 partials of the module docstring for the shard ``x`` (n, Vl) (unit column stride) holding
    classes [vocab_start, vocab_start + Vl), global targets ``target`` (n,) contiguous. ``smoothing``: also sx
    (else 0)."""
    n, vocab = x.shape
    out = torch.empty((n, 5), dtype=torch.float32, device=x.device)
    if n == 0:
        return out
    block_m, block_v, warps = _blocks(n, vocab, x.device)
    _vp_stats_kernel[(cdiv(n, block_m),)](
        x, x.stride(0), target, out, n, vocab, int(vocab_start), int(ignore_index), float(logit_scale),
        float(softcap or 1.0), HAS_SOFTCAP=softcap is not None, HAS_SMOOTHING=bool(smoothing),
        BLOCK_M=block_m, BLOCK_V=block_v, num_warps=warps)
    return out
