"""The partial-sum kernels that the backwards of the norms (:mod:`tigon.kernels.norm`), DyT
(:mod:`tigon.kernels.dyt`) and GroupNorm (:mod:`tigon.kernels.group_norm`) share: a masked tile load, and the
fixed-order (deterministic) fp32 column sums that reduce the per-program dW / dB partial rows to the weight's
gradient in one more launch. Triton device functions and two kernels (``_sum_partials``: two (P, N) partial
buffers into dW, dB; ``_sum_segments``: one (P, W) buffer whose columns are the concatenated partials of several
gradients, DyT's [dgamma | dbeta | dalpha] and PolyNorm's [dw (3) | db]), and their grid (:func:`segments_launch`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import cdiv, next_pow2


@triton.jit
def _load_tile(P, rows, row_end, cols, cmask, stride, EVICT: tl.constexpr):
    """The [rows, cols] tile of P (storage dtype); rows >= row_end read as zeros. EVICT: the load's eviction policy
    ("" none, "evict_first" for a stream read once, "evict_last" for one read again soon)."""
    mask = (rows < row_end)[:, None] & cmask[None, :]
    ptrs = P + rows.to(tl.int64)[:, None] * stride + cols[None, :]
    # literal policies: Triton 3.6 refuses a constexpr as eviction_policy (3.9 takes it)
    if EVICT == "evict_first":
        tile = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_first")
    elif EVICT == "evict_last":
        tile = tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_last")
    else:
        tile = tl.load(ptrs, mask=mask, other=0.0)
    return tile


@triton.jit
def _column_sums(PART, P, N, cols, cmask, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """fp32 sums over the P rows of PART (P, N) fp32 (row stride N) at ``cols`` ([BLOCK_N], masked by ``cmask``), the
    rows added BLOCK_P at a time in a fixed order (deterministic)."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        ps = p0 + tl.arange(0, BLOCK_P)
        mask = (ps < P)[:, None] & cmask[None, :]
        acc += tl.sum(tl.load(PART + ps.to(tl.int64)[:, None] * N + cols[None, :], mask=mask, other=0.0), axis=0)
    return acc


@triton.jit
def _sum_partials(DW_PART, DB_PART, DW, DB, P, N, HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """dw = sum over the P partial rows of DW_PART (P, N), db likewise, in one launch (fixed order: deterministic),
    written in DW's / DB's dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_DW:  # fp32 sums, rounded once to dW's dtype (the weight's)
        dw = _column_sums(DW_PART, P, N, cols, cmask, BLOCK_P, BLOCK_N)
        tl.store(DW + cols, dw.to(DW.dtype.element_ty), mask=cmask)
    if HAS_DB:
        db = _column_sums(DB_PART, P, N, cols, cmask, BLOCK_P, BLOCK_N)
        tl.store(DB + cols, db.to(DB.dtype.element_ty), mask=cmask)


@triton.jit
def _sum_segments(PART, A, B, C, P, W, NA, NB, C_START, HAS_B: tl.constexpr, C_SUM: tl.constexpr,
                  BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """The column sums of PART (P, W) fp32 (one partial row per program of a backward), each rounded once to its
    output's dtype: columns [0, NA) into A, [NA, NA + NB) into B (HAS_B; else NB is 0), and columns [C_START, W)
    (C_START >= NA + NB; the columns between are padding, never read back) into C: one element, their sum, under
    C_SUM (then C_START is a multiple of BLOCK_N and W - C_START <= BLOCK_N: one program holds them all), else one
    element a column. Fixed order (deterministic); one launch for all of an op's parameter gradients."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    live = (cols < NA + NB) | ((cols >= C_START) & (cols < W))  # (the padding is never read: it was never written)
    s = _column_sums(PART, P, W, cols, live, BLOCK_P, BLOCK_N)
    tl.store(A + cols, s.to(A.dtype.element_ty), mask=cols < NA)
    if HAS_B:
        tl.store(B + (cols - NA), s.to(B.dtype.element_ty), mask=(cols >= NA) & (cols < NA + NB))
    if C_SUM:
        if tl.program_id(0) * BLOCK_N == C_START:
            tl.store(C, tl.sum(tl.where(cols < W, s, 0.0), axis=0).to(C.dtype.element_ty))
    else:
        tl.store(C + (cols - C_START), s.to(C.dtype.element_ty), mask=(cols >= C_START) & (cols < W))


SEGMENT_COLS = 32
"""Columns a program of ``_sum_segments`` sums (the norms' ``_sum_partials`` launch: 32-column slabs)."""


def segment_start(n: int) -> int:
    """The first column at or after n where a ``C_SUM`` segment of ``_sum_segments`` may start (a slab boundary)."""
    return cdiv(n, SEGMENT_COLS) * SEGMENT_COLS


def segments_launch(P: int, W: int) -> tuple[tuple[int], int, int]:
    """(grid, BLOCK_P, BLOCK_N) of ``_sum_segments`` over a (P, W) partial buffer: slabs of ``SEGMENT_COLS``
    columns (fewer when W is smaller), the P rows read 128 at a time."""
    block_n = min(next_pow2(W), SEGMENT_COLS)
    return (cdiv(W, block_n),), min(next_pow2(P), 128), block_n
