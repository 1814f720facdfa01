"""The partial-sum kernels that the backwards of the norms (:mod:`tigon.kernels.norm`), DyT
(:mod:`tigon.kernels.dyt`) and GroupNorm (:mod:`tigon.kernels.group_norm`) share: a masked tile load, and the
fixed-order (deterministic) fp32 column sums that reduce the per-program dW / dB partial rows to the weight's
gradient in one more launch. Triton device functions and one kernel; no host code.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_tile(P, rows, row_end, cols, cmask, stride):
    """The [rows, cols] tile of P (storage dtype); rows >= row_end read as zeros."""
    mask = (rows < row_end)[:, None] & cmask[None, :]
    return tl.load(P + rows.to(tl.int64)[:, None] * stride + cols[None, :], mask=mask, other=0.0)


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
