"""Row-normalisation kernels shared by RMSNorm, LayerNorm and fused add + RMSNorm (one set of kernels, constexpr
IS_RMS; HAS_RESIDUAL / HAS_DS for the residual add).

RMSNorm (Zhang & Sennrich 2019): ``xhat = x * rstd``, ``rstd = 1/sqrt(mean(x^2) + eps)``.
LayerNorm (Ba, Kiros & Hinton 2016): ``xhat = (x - mean) * rstd``, ``rstd = 1/sqrt(var(x) + eps)`` (biased var).
Both: ``y = xhat * (offset + w) [+ b]``; RMSNorm's ``offset`` gives Gemma's ``(1 + w)``; ``ROUND_XHAT`` rounds
xhat to x's dtype before the weight multiply (HF LlamaRMSNorm's "llama" casting).

Forward: one pass, a [BLOCK_M, BLOCK_N] tile of rows per program, fp32 statistics from the row held in
registers (LayerNorm: two-pass over registers, no E[x^2] - E[x]^2 cancellation); writes y, rstd and (LayerNorm)
mean, i.e. 1-2 floats per row.

Backward, with g = dy * (offset + w):

    dx = rstd * (g - xhat * mean(g * xhat) [- mean(g)])      dw = sum_rows(dy * xhat)      db = sum_rows(dy)

on a persistent grid (one program per SM): each program walks a contiguous range of rows, loading the next row
tile while it reduces the current one, writes dx, and accumulates its share of dw / db in fp32 registers; the
(programs, N) partials are summed by one small reduction afterwards. No atomics, so dw and db are
deterministic. Rows wider than WIDE_ROW drop the prefetch; rows wider than REGISTER_ROW take a chunked variant
that keeps the partials in (cached) memory.

Residual add (the fused add + RMSNorm op, HF decoder layers' ``residual + hidden_states`` then the norm): with
HAS_RESIDUAL the forward reads x and the residual r, normalises ``s = x + r`` (added in fp32 and rounded to x's dtype,
as torch adds two tensors of one dtype) held in registers, and writes s next to y. Its backward is the norm's backward
on s plus the incoming gradient of the output s (HAS_DS; absent: zero), ``ds_total = rstd * (g - shat * mean(g * shat))
+ ds``, which is the gradient of both x and r.

Gated RMSNorm (Qwen3-Next / Qwen3.5's ``RMSNormGated``, Falcon-H1's Mamba norm; HAS_GATE): ``y = yn * silu(gate)``
with ``yn = xhat * (offset + w)``; the backward writes ``d_gate = dy * yn * silu'(gate)`` and runs the norm's backward
on ``dy * silu(gate)``. GATE_FIRST (Mamba-2's ``norm_before_gate=False``): the row normalised is ``u = x * silu(gate)``
(fp32), ``y = uhat * (offset + w)``; the backward forms the norm's ``du`` and writes ``dx = du * silu(gate)``,
``d_gate = du * x * silu'(gate)``. Either: forward 3*M*N*2 bytes (read x, gate; write y), backward 5*M*N*2 (read x,
gate, dy; write dx, d_gate). GROUPED (Mamba-2's ``group_size``): statistics per group of contiguous channels, the
kernels' rows being the groups (see ``_row_starts``, ``_weight``), the same bytes.

Minimal bytes (bf16): forward 2*M*N*2 (read x, write y); backward 3*M*N*2 (read x, dy; write dx). With the residual
add: forward 4*M*N*2 (read x, r; write y, s); backward 4*M*N*2 (read dy, ds, s; write ds_total once).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    MAX_FUSED_ROW, cdiv, check_row_width, compiled_cuda, launch_mode, next_pow2, num_programs_hint, rows,
    rows_per_program, sm_count, warps_for,
)
from .norm_launch import bwd_launch, fwd_launch, sum_launch
from .norm_options import NO_FLAGS, check_groups, gated_flags
from .partial_sums import _load_tile, _sum_partials

# Backward by row width (elements, after rounding up to a power of two): up to WIDE_ROW, row tiles with the next
# tile prefetched; up to REGISTER_ROW, one whole row per step in registers without the prefetch (Liger-Kernel's
# layout: x, dy and the dW accumulator of one row, 16 or 32 warps), beyond that the column-chunked kernel.
WIDE_ROW = 8192
REGISTER_ROW = 32768
# How RMSNorm's backward holds the weight row between rows whose block (the width rounded up to a power of two) is
# W_HOLD_ROW, i.e. 8193..16384 elements (``_norm_bwd``'s W_HOLD): 0 in fp32 registers, 2 re-read every row (from
# L1/L2). Other rows, and LayerNorm's, hold it in fp32. H200, 16384 rows bf16 fwd+bwd, 16 / 32 warps
# (session7/tune7_rms.json): hidden 16384: 0: 825.5 / 827.3 us, 2: 750.3 / 824.1 (Liger 779.1); hidden 12288:
# 0: 684.7 / 683.3, 2: 601.3 / 687.7 (Liger 622.9). Re-reading frees the registers that spilled (42 spills at 16
# warps, 16 with it), hence 2 at 16 warps. (1, the row held in its storage dtype, measured as 0: 824.9 / 830.2 us,
# and was removed.)
W_HOLD = 2
W_HOLD_ROW = 16384
# Whether the backward with a second gradient DS (the fused add + RMSNorm) loads the next row tile's DS with its x and
# dy (prefetch path only; rows wider than WIDE_ROW always load it where it is used).
DS_PREFETCH = True


@triton.jit
def _row_starts(rows64, stride, N, n_groups, GROUPED: tl.constexpr):
    """Element offsets of the rows' first elements: ``rows * stride``; GROUPED (the grouped gated RMSNorm), row r is
    group ``r % n_groups`` (N elements) of the tensor's row ``r // n_groups`` (row stride ``stride``)."""
    if GROUPED:
        starts = (rows64 // n_groups) * stride + (rows64 % n_groups) * N
    else:
        starts = rows64 * stride
    return starts


@triton.jit
def _weight(W, rows, cols, cmask, N, n_groups, offset, GROUPED: tl.constexpr):
    """``offset + w`` in fp32 for a [rows, cols] tile: [1, BLOCK_N]; GROUPED [BLOCK_M, BLOCK_N], row r's group
    ``r % n_groups`` reading the weight's columns ``(r % n_groups) * N + cols``."""
    if GROUPED:
        w = tl.load(W + ((rows % n_groups) * N)[:, None] + cols[None, :], mask=cmask[None, :], other=0.0)
        w = w.to(tl.float32) + offset
    else:
        w = (tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset)[None, :]
    return w


@triton.jit
def _norm_fwd(
    X, R, W, B, Y, S, MEAN, RSTD, M, N, stride_x, stride_r, stride_y, stride_s, eps, offset,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ROUND_XHAT: tl.constexpr, HAS_W: tl.constexpr,
    HAS_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, G=None, stride_g=0,
    HAS_GATE: tl.constexpr = False, n_groups=1, GROUPED: tl.constexpr = False, GATE_FIRST: tl.constexpr = False,
):
    # HAS_GATE: y is multiplied by silu(G) (the gated RMSNorm; G has x's row layout, row stride stride_g); with
    # GATE_FIRST, x is, before the statistics.
    # GROUPED: the M rows are groups of N elements, n_groups to a row of X and G (see _row_starts); Y is contiguous.
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(X + _row_starts(rows64, stride_x, N, n_groups, GROUPED)[:, None] + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # s = x + r in x's dtype (torch's add of two such tensors: fp32 sum, one rounding); the statistics below are
        # those of s as stored, which stays in registers.
        r = tl.load(R + rows64[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(S + rows64[:, None] * stride_s + cols[None, :], x, mask=mask)
    x = x.to(tl.float32)
    if HAS_GATE and GATE_FIRST:
        gt = tl.load(G + _row_starts(rows64, stride_g, N, n_groups, GROUPED)[:, None] + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        x = x * gt * tl.sigmoid(gt)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        tl.store(MEAN + rows, mean, mask=rmask)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
    y = xc * rstd[:, None]
    if ROUND_XHAT:
        y = y.to(X.dtype.element_ty).to(tl.float32)
    if HAS_W:
        y = y * _weight(W, rows, cols, cmask, N, n_groups, offset, GROUPED)
    if HAS_B:
        y = y + tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if HAS_GATE and not GATE_FIRST:
        gt = tl.load(G + _row_starts(rows64, stride_g, N, n_groups, GROUPED)[:, None] + cols[None, :], mask=mask,
                     other=0.0).to(tl.float32)
        y = y * gt * tl.sigmoid(gt)
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _load_rows(X, DY, MEAN, RSTD, rows, row_end, cols, cmask, stride_x, stride_dy, IS_RMS: tl.constexpr, N, n_groups,
               GROUPED: tl.constexpr):
    """x and dy tiles (storage dtype), mean (0 for RMS) and rstd of ``rows``; rows >= row_end read as zeros."""
    rmask = rows < row_end
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(X + _row_starts(rows64, stride_x, N, n_groups, GROUPED)[:, None] + cols[None, :], mask=mask, other=0.0)
    dy = tl.load(DY + _row_starts(rows64, stride_dy, N, n_groups, GROUPED)[:, None] + cols[None, :], mask=mask,
                 other=0.0)
    if IS_RMS:
        mean = tl.zeros_like(rows).to(tl.float32)
    else:
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    return x, dy, mean, rstd


@triton.jit
def _norm_bwd(
    DY, DS, X, W, MEAN, RSTD, DX, DW_PART, DB_PART, M, N, stride_dy, stride_ds, stride_x, stride_dx, rows_per_prog,
    offset, IS_RMS: tl.constexpr, HAS_DS: tl.constexpr, HAS_W: tl.constexpr, HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr,
    W_HOLD: tl.constexpr, DS_PREFETCH: tl.constexpr, G=None, DG=None, stride_g=0, stride_dg=0,
    HAS_GATE: tl.constexpr = False, n_groups=1, GROUPED: tl.constexpr = False, GATE_FIRST: tl.constexpr = False,
):
    # GATE_FIRST: the gate multiplies x before the norm (see the module docstring); xhat is then u's.
    # GROUPED (the grouped gated RMSNorm): the M rows are groups of N elements, n_groups to a row of X, DY and G (see
    # _row_starts; DX and DG are contiguous); the host makes BLOCK_M and rows_per_prog multiples of n_groups, so the
    # dW accumulator's row i always holds group i % n_groups, and the whole [BLOCK_M, N] accumulator is stored: the
    # partials are then (programs * BLOCK_M / n_groups) rows of the weight's n_groups * N columns.
    # HAS_GATE (the gated RMSNorm, y = yn * silu(gate), yn = xhat * (offset + w)): each tile's gate is loaded where it
    # is used, d_gate = dy * yn * silu'(gate) is written to DG, and the norm's backward below runs on dy * silu(gate).
    # HAS_DS: DS holds a second gradient of X itself (the output s of the residual add), added to dx. DX may be DY's
    # own memory (the fused add + RMSNorm's in_place): each tile of DY (and DS) is loaded before this program stores the
    # same tile of DX, and no other program touches those rows.
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    # W_HOLD (the registers the weight row takes between rows): 0 fp32 (+ offset), 2 none (re-read every row,
    # from L1/L2).
    if HAS_W and W_HOLD == 0 and not GROUPED:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
    # dW/dB accumulate per tile position and are reduced over rows once at the end, not per step.
    dw = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    row_start = pid * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    # Software pipelining by hand (PREFETCH): the next tile's loads are in flight while this one is reduced. Wide
    # rows skip it: two tiles of x and dy no longer fit in registers next to the dW/dB accumulators.
    x, dy, mean, rstd = _load_rows(X, DY, MEAN, RSTD, row_start + tl.arange(0, BLOCK_M), row_end, cols, cmask,
                                   stride_x, stride_dy, IS_RMS, N, n_groups, GROUPED)
    if HAS_DS and PREFETCH and DS_PREFETCH:
        ds = _load_tile(DS, row_start + tl.arange(0, BLOCK_M), row_end, cols, cmask, stride_ds, "")
    for r in range(row_start, row_end, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M)
        if PREFETCH:
            x_next, dy_next, mean_next, rstd_next = _load_rows(X, DY, MEAN, RSTD, rows + BLOCK_M, row_end, cols,
                                                               cmask, stride_x, stride_dy, IS_RMS, N, n_groups, GROUPED)
            if HAS_DS and DS_PREFETCH:
                ds_next = _load_tile(DS, rows + BLOCK_M, row_end, cols, cmask, stride_ds, "")
        mask = (rows < row_end)[:, None] & cmask[None, :]
        dyf = dy.to(tl.float32)
        xf = x.to(tl.float32)
        if HAS_GATE:
            gt = tl.load(G + _row_starts(rows.to(tl.int64), stride_g, N, n_groups, GROUPED)[:, None] + cols[None, :],
                         mask=mask, other=0.0).to(tl.float32)
            sg = tl.sigmoid(gt)
        if HAS_GATE and GATE_FIRST:
            xhat = tl.where(mask, xf * gt * sg * rstd[:, None], 0.0)  # u's (RMS: no mean)
        else:
            xhat = tl.where(mask, (xf - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_GATE and not GATE_FIRST:
            if HAS_W:
                yn = xhat * _weight(W, rows, cols, cmask, N, n_groups, offset, GROUPED)
            else:
                yn = xhat
            tl.store(DG + rows.to(tl.int64)[:, None] * stride_dg + cols[None, :],
                     (dyf * yn * sg * (1.0 + gt * (1.0 - sg))).to(DG.dtype.element_ty), mask=mask)
            dyf = dyf * gt * sg
        if HAS_W:
            if W_HOLD == 0 and not GROUPED:
                g = dyf * w[None, :]
            else:
                g = dyf * _weight(W, rows, cols, cmask, N, n_groups, offset, GROUPED)
        else:
            g = dyf
        c1 = tl.sum(g * xhat, axis=1) / N
        if IS_RMS:
            dx = rstd[:, None] * (g - xhat * c1[:, None])
        else:
            c2 = tl.sum(g, axis=1) / N
            dx = rstd[:, None] * (g - xhat * c1[:, None] - c2[:, None])
        if HAS_GATE and GATE_FIRST:  # dx so far is du, u = x * silu(gate)
            tl.store(DG + rows.to(tl.int64)[:, None] * stride_dg + cols[None, :],
                     (dx * xf * sg * (1.0 + gt * (1.0 - sg))).to(DG.dtype.element_ty), mask=mask)
            dx = dx * gt * sg
        if HAS_DS:
            # Prefetched with the row tiles (sm_90 builds, bf16, rows of 1024 / 4096 / 8192: no spills, as without
            # it). Without the prefetch (wide rows) loaded here, where it is used, not with the next row's x and dy,
            # so that it holds no registers through the reductions: rows of 16384 at 16 warps spill 112 bytes of
            # stack so, 144 loaded with x and dy, 72 for RMSNorm (compiled for sm_90 without a GPU; not timed).
            if PREFETCH and DS_PREFETCH:
                dx += ds.to(tl.float32)
            else:
                dx += _load_tile(DS, rows, row_end, cols, cmask, stride_ds, "").to(tl.float32)
        tl.store(DX + rows.to(tl.int64)[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DW:
            dw += dyf * xhat
        if HAS_DB:
            db += dyf
        if PREFETCH:
            x, dy, mean, rstd = x_next, dy_next, mean_next, rstd_next
            if HAS_DS and DS_PREFETCH:
                ds = ds_next
        else:
            x, dy, mean, rstd = _load_rows(X, DY, MEAN, RSTD, rows + BLOCK_M, row_end, cols, cmask, stride_x,
                                           stride_dy, IS_RMS, N, n_groups, GROUPED)
    if GROUPED:
        parts = (pid.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M))[:, None] * N + cols[None, :]
        if HAS_DW:
            tl.store(DW_PART + parts, dw, mask=cmask[None, :])
        if HAS_DB:
            tl.store(DB_PART + parts, db, mask=cmask[None, :])
    else:
        if HAS_DW:
            tl.store(DW_PART + pid.to(tl.int64) * N + cols, tl.sum(dw, axis=0), mask=cmask)
        if HAS_DB:
            tl.store(DB_PART + pid.to(tl.int64) * N + cols, tl.sum(db, axis=0), mask=cmask)


@triton.jit
def _norm_bwd_wide(
    DY, DS, X, W, MEAN, RSTD, DX, DW_PART, DB_PART, M, N, stride_dy, stride_ds, stride_x, stride_dx, rows_per_prog,
    offset, IS_RMS: tl.constexpr, HAS_DS: tl.constexpr, HAS_W: tl.constexpr, HAS_DW: tl.constexpr,
    HAS_DB: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # Rows too wide for registers (N > REGISTER_ROW): two passes over BLOCK_N-column chunks per row, the second
    # re-reading x and dy from cache; this program's dW/dB partial row (zero-initialised, owned by this program
    # alone) is updated in place, so it stays in L2 instead of registers. HAS_DS and DX as in _norm_bwd (the second
    # pass loads each chunk of DY and DS before it stores that chunk of DX).
    # TODO(perf): on an H200 this reaches only 13-19% of copy bandwidth for N = 12288 .. 32768 (torch eager: about
    # 35%), one row at a time per SM. A row-parallel dx kernel plus a column-parallel dW/dB kernel should do better.
    pid = tl.program_id(0)
    row_start = pid * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    part = pid.to(tl.int64) * N
    for i in range(0, row_end - row_start):
        row = row_start + i
        r64 = row.to(tl.int64)
        if IS_RMS:
            mean = 0.0
        else:
            mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        s1 = tl.zeros([BLOCK_N], dtype=tl.float32)
        s2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            x = tl.load(X + r64 * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
            g = tl.load(DY + r64 * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32)
            if HAS_W:
                g = g * (tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset)
            s1 += g * tl.where(cmask, (x - mean) * rstd, 0.0)
            s2 += g
        c1 = tl.sum(s1, axis=0) / N
        c2 = tl.sum(s2, axis=0) / N
        if IS_RMS:
            c2 = 0.0
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + tl.arange(0, BLOCK_N)
            cmask = cols < N
            x = tl.load(X + r64 * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
            dy = tl.load(DY + r64 * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32)
            xhat = tl.where(cmask, (x - mean) * rstd, 0.0)
            if HAS_W:
                g = dy * (tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset)
            else:
                g = dy
            dx = rstd * (g - xhat * c1 - c2)
            if HAS_DS:
                dx += tl.load(DS + r64 * stride_ds + cols, mask=cmask, other=0.0).to(tl.float32)
            tl.store(DX + r64 * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=cmask)
            if HAS_DW:
                tl.store(DW_PART + part + cols, tl.load(DW_PART + part + cols, mask=cmask) + dy * xhat, mask=cmask)
            if HAS_DB:
                tl.store(DB_PART + part + cols, tl.load(DB_PART + part + cols, mask=cmask) + dy, mask=cmask)


def _persistent_programs(device: torch.device) -> int:
    """Programs of the persistent backward: one per SM on CUDA (each holds two tiles in flight)."""
    return sm_count(device) if compiled_cuda(device) else num_programs_hint(device)


def fwd_config(block_n: int, device: torch.device) -> tuple[int, int]:
    """(rows per program, num_warps) of the forward for rows of ``block_n`` (a power of two) elements.

    The whole row in registers, several rows per program for small N (about 4096 elements a program; 2048 for
    rows of <= 1024, with 4 warps). H200, RMSNorm 16384 x 1024 bf16 (benchmarks/results/h200/session4/
    tune_h200.json): 2048-element programs 18.4 us, 4096: 18.7, 8192: 19.0, 16384: 22.0; 4 warps beat 2 and 8.
    """
    if block_n <= 1024:
        return rows_per_program(block_n, device, target_elems=2048), 4
    block_m = rows_per_program(block_n, device)
    return block_m, warps_for(block_m * block_n)


def bwd_config(M: int, block_n: int, device: torch.device, is_rms: bool) -> tuple[int, int, int, bool]:
    """(rows per step, programs, num_warps, db_by_columns) of the backward for M rows of ``block_n`` elements (see
    :func:`norm_backward` for the measurements behind them).

    Whole rows of 16384 in registers (H200, 16384 x 16384 bf16 fwd+bwd): RMSNorm 8 / 16 / 32 warps 0.93 / 0.81 /
    0.81 ms, and in session6/tune4_rope_rms16k.json 0.921 / 0.817 / 0.810 ms (Liger 0.778; with the next row
    prefetched 16 / 32 warps 1.14 / 1.21 ms: the prefetched tiles spill), hence 32 then; with the weight row
    re-read every row (``W_HOLD``) 16 warps: 0.750 ms against 0.824 at 32 (Liger 0.779; session7/tune7_rms.json),
    hence 16 now. LayerNorm with dW and dB accumulated in the kernel (two accumulator rows) spills: 8 / 16 / 32
    warps 10.1 / 7.1 / 1.57 ms; hence ``db_by_columns``: LayerNorm rows of 16384+ in registers leave dB to a
    separate column sum of dy (one more read of dy) and the kernel holds one accumulator row, as RMSNorm's: 8 / 16
    / 32 warps 1.00 / 6.98 / 1.28 ms (torch.compile 1.06 ms). Figures: session5/tune3_h200.json
    (session4/tune_h200.json before). Rows wider than 16384 keep 32 warps (not measured with db_by_columns).
    """
    prefetch = block_n <= WIDE_ROW
    block_m = 1 if not prefetch else rows_per_program(block_n, device, target_elems=8192)
    # Row tiles (prefetch path): at least 16 rows a program; with few rows, fewer programs mean fewer dW/dB partial
    # rows to sum (LayerNorm 1024 x 4096 fwd+bwd: 64 programs 26.0 us, 128: 27.8, 264: 40.6;
    # session4/tune2_h200.json). Wider rows go one row per step and keep one program per SM.
    progs = max(1, min(_persistent_programs(device), cdiv(M, max(block_m, 16) if prefetch else block_m)))
    db_by_columns = not is_rms and 16384 <= block_n <= REGISTER_ROW
    if block_n < 8192 or (db_by_columns and block_n <= 16384):
        warps = 8
    elif block_n < 16384 or (is_rms and block_n == W_HOLD_ROW and W_HOLD == 2):
        warps = 16
    else:
        warps = 32
    return block_m, progs, warps, db_by_columns


def norm_forward(x: torch.Tensor, weight, bias, eps: float, *, is_rms: bool, offset: float = 0.0,
                 round_xhat: bool = False, out_dtype: torch.dtype | None = None, residual: torch.Tensor | None = None,
                 gate: torch.Tensor | None = None, n_groups: int = 1, gate_first: bool = False, mode=None):
    """Launch the forward on the rows of ``x`` (..., N) (any strides: read as :func:`rows` gives them).

    ``mode``: :func:`~tigon.kernels._common.launch_mode` of x's device where the caller asked it already (None:
    asked here).

    ``gate``: x's shape (any strides), or None. Given, y is multiplied by ``silu(gate)`` (the gated RMSNorm);
    ``gate_first``: x is, before the statistics (RMSNorm only; rstd is then that of ``x * silu(gate)``).

    ``n_groups``: the statistics are those of each of n_groups groups of N / n_groups contiguous elements (a divisor
    of N; RMSNorm without residual only): rstd is then (M * n_groups,), one per group.

    ``residual``: x's shape and dtype (any strides), or None. Given, the rows normalised are ``s = x + residual``
    (rounded to x's dtype, as torch adds), and s is written too (the fused add + RMSNorm).

    Returns (y: x's shape, contiguous, in ``out_dtype`` (default x's); mean (M,) fp32 or None for RMS; rstd (M,) fp32;
    s: x's shape and dtype, contiguous, or None without ``residual``; x2: x as the kernel read it (x itself, or its
    (M, N) rows view or copy), what the backward should read).
    """
    shape = x.shape
    N = shape[-1] if shape else 0  # (0-d: rows raises)
    # rows(t, name) of a contiguous t of more than 2 dims with rows of N > 0 elements (the layers' activations and
    # their gradients) is (t, t.numel() // N, N): taken inline here and below, one Python frame less per tensor
    x2, M, sx = (x, x.numel() // N, N) if len(shape) > 2 and N and x.is_contiguous() else rows(x, "x")
    if weight is not None and weight.stride(-1) != 1:  # (weight / bias read with unit stride: a strided one copied)
        weight = weight.contiguous()
    if bias is not None and bias.stride(-1) != 1:
        bias = bias.contiguous()
    name = ("fused add + RMSNorm" if residual is not None else "RMSNorm") if is_rms else "LayerNorm"
    if N > MAX_FUSED_ROW:
        check_row_width(N, name)
    gated = gate is not None or n_groups != 1 or gate_first
    if n_groups != 1:
        check_groups(N, n_groups, is_rms and residual is None and bias is None)
        M, N = M * n_groups, N // n_groups  # the kernel's rows are the groups
    if residual is not None:
        r2, m_r, sr = ((residual, residual.numel() // N, N) if residual.dim() > 2 and N and residual.shape[-1] == N
                       and residual.is_contiguous() else rows(residual, "residual"))  # (rows, inline: see above)
        if m_r != M or residual.shape[-1] != N or residual.dtype != x.dtype:
            raise ValueError(f"{name}: residual must match x's {tuple(x.shape)} {x.dtype}, got "
                             f"{tuple(residual.shape)} {residual.dtype}")
    dev = x.device
    # size= by keyword: a positional tuple is first tried as an int by torch's argument parser (a TypeError raised and
    # cleared: ~0.5 us more per allocation)
    y = torch.empty(size=x.shape, dtype=out_dtype or x.dtype, device=dev)
    mean = None if is_rms else torch.empty(M, dtype=torch.float32, device=dev)
    rstd = torch.empty(M, dtype=torch.float32, device=dev)
    s = torch.empty(size=x.shape, dtype=x.dtype, device=dev) if residual is not None else None
    if M == 0:
        return y, mean, rstd, s, x2
    if mode is None:
        mode = launch_mode(dev)  # (compiled_cuda(dev) and launcher(_norm_fwd), in one call)
    block_n, block_m, warps, grid = fwd_launch(M, N, dev, mode.compiled, fwd_config, rows_per_program)
    r, sr, s_ = (r2, sr, s) if residual is not None else (x2, sx, y)  # placeholders the kernel does not touch
    g2, sg = rows(gate, "gate")[::2] if gate is not None else (x2, 0)
    # y and s are contiguous: their row stride is N (a group's, when grouped)
    mode[_norm_fwd][grid](
        x2, r, weight if weight is not None else x2, bias if bias is not None else x2, y, s_,
        mean if mean is not None else rstd, rstd, M, N, sx, sr, N, N, eps,
        offset, IS_RMS=is_rms, HAS_RESIDUAL=residual is not None, ROUND_XHAT=round_xhat, HAS_W=weight is not None,
        HAS_B=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, G=g2, stride_g=sg, HAS_GATE=gate is not None,
        num_warps=warps, **(gated_flags(gate, is_rms, n_groups, gate_first) if gated else NO_FLAGS),
    )
    return y, mean, rstd, s, x2


GROUPED_TILE = 16384  # the largest tile the grouped backward raises BLOCK_M to (not measured; ungrouped: 8192)


def grouped_backward_fits(n: int, n_groups: int) -> bool:
    """Whether :func:`norm_backward` takes rows of ``n`` elements in ``n_groups`` groups: n_groups a power of two
    (a row tile holds whole rows of groups, BLOCK_M a multiple of n_groups), groups of at most WIDE_ROW elements
    (rounded up to a power of two), tiles of n_groups groups of at most GROUPED_TILE. Else the caller runs its
    reference."""
    if n_groups < 1 or n % n_groups or n_groups & (n_groups - 1):
        return False
    block_n = next_pow2(n // n_groups)
    return block_n <= WIDE_ROW and n_groups * block_n <= GROUPED_TILE


def norm_backward(dy, x, weight, mean, rstd, need_dw: bool, need_db: bool, *, is_rms: bool, offset: float = 0.0,
                  ds: torch.Tensor | None = None, dx: torch.Tensor | None = None,
                  dx_shape: tuple[int, ...] | None = None, dw_dtype: torch.dtype = torch.float32,
                  db_dtype: torch.dtype = torch.float32, gate: torch.Tensor | None = None, n_groups: int = 1,
                  gate_first: bool = False, mode=None):
    """Launch the backward for dy and x (..., N), any strides (x as given to the forward, or the x2 it returned).

    ``gate_first``, ``n_groups``: as given to :func:`norm_forward` (rstd (M * n_groups,)); the rows must satisfy
    :func:`grouped_backward_fits` (ValueError), ``ds`` and ``dx`` must be None.

    ``gate``: the forward's gate (x's shape, any strides), or None; given, the fourth value returned is d_gate (new,
    contiguous, gate's shape and dtype), and rows wider than REGISTER_ROW are refused (ValueError).

    ``ds``: a second incoming gradient of x itself (the fused add + RMSNorm's output s), x's shape, added to dx; None:
    zero (nothing is read). ``dx``: x's dtype and M * N elements read as rows without a copy (contiguous, or 2-D with
    unit column stride) to write dx into, which may be ``dy``'s own memory (each element is read before it is
    overwritten); None: a new contiguous one, of shape ``dx_shape`` (default x's). ``dw_dtype`` / ``db_dtype``: the
    dtypes dw and db are returned in (summed in fp32, rounded once when written: no separate cast kernel).
    ``mode``: :func:`~tigon.kernels._common.launch_mode` of x's device as the caller has it (an autograd.Function's,
    from its forward), or None: asked here.

    Returns (dx, dw (N,) or None, db (N,) or None[, d_gate]).
    """
    shape = x.shape
    N = shape[-1] if shape else 0  # (0-d: rows raises)
    # (rows(t, name) inline for a contiguous t of more than 2 dims and rows of N > 0 elements, as in norm_forward)
    x2, M, sx = (x, x.numel() // N, N) if len(shape) > 2 and N and x.is_contiguous() else rows(x, "x")
    if weight is not None and weight.stride(-1) != 1:  # (weight / bias read with unit stride: a strided one copied)
        weight = weight.contiguous()
    dy, _, sdy = ((dy, 0, N) if dy.dim() > 2 and N and dy.shape[-1] == N and dy.is_contiguous()
                  else rows(dy, "grad_output"))  # (rows, inline: its M is not read)
    dev = x.device
    n_full = N  # the weight's size
    if n_groups != 1:
        check_groups(N, n_groups, is_rms and ds is None and dx is None and not need_db)
        if not grouped_backward_fits(N, n_groups):
            raise ValueError(f"grouped RMSNorm backward: {n_groups} groups of {N // n_groups} elements are not "
                             "supported (see grouped_backward_fits)")
        M, N = M * n_groups, N // n_groups  # the kernel's rows are the groups
    if dx is None:
        dx = torch.empty(size=dx_shape or x.shape, dtype=x.dtype, device=dev)
        sdx = N
    elif (dx.dtype != x.dtype or dx.numel() != M * N or (dx.shape[-1] if dx.dim() else 1) != N
          or not (dx.is_contiguous() or (dx.dim() == 2 and dx.stride(-1) == 1) or M == 0)):
        raise ValueError(f"dx must be ({M}, {N}) rows of {x.dtype}, contiguous or with unit column stride, got "
                         f"{tuple(dx.shape)} {dx.dtype} strides {dx.stride()}")
    else:
        sdx = dx.stride(0) if dx.dim() == 2 else N
    if ds is not None:
        ds, m_ds, sds = ((ds, ds.numel() // N, N) if ds.dim() > 2 and N and ds.shape[-1] == N and ds.is_contiguous()
                         else rows(ds, "grad_s"))  # (rows, inline)
        if m_ds != M or ds.shape[-1] != N:
            raise ValueError(f"ds must have x's shape {tuple(x.shape)}, got {tuple(ds.shape)}")
    dgate = torch.empty(size=gate.shape, dtype=gate.dtype, device=dev) if gate is not None else None
    if M == 0:
        z = torch.zeros(n_full, dtype=torch.float32, device=dev)
        out = dx, z.to(dw_dtype) if need_dw else None, z.to(db_dtype) if need_db else None
        return out if gate is None else (*out, dgate)
    # Measured on an H200 (bf16, N = 768 .. 8192): 8192-element tiles, one persistent program per SM, 8 warps
    # (16 for rows of 8192) and the prefetching loop gave 52-79% of the copy bandwidth, against 41-66% with
    # 2048-element tiles, 2 programs per SM and no prefetch. Wider rows no longer fit in registers next to their
    # dW/dB accumulators with the prefetch (N=16384 ran at 6%); the chunked kernel that replaced it re-reads and
    # re-writes its fp32 dW partial row for every row (N=16384: 1.30 ms, Liger 0.78 ms, sweep_h200.json). So rows up
    # to REGISTER_ROW run one whole row per step without the prefetch: N=16384 fwd+bwd RMSNorm 0.83 ms, LayerNorm
    # 1.54 ms (torch.compile 0.95 / 1.06, Liger 0.78 / 1.28; session4/sweep3_norm_rope.json). Warps: bwd_config
    # (the chunked kernel beyond REGISTER_ROW takes its own, by chunk size).
    gated = gate is not None or n_groups != 1 or gate_first
    if mode is None:
        mode = launch_mode(dev)  # (compiled_cuda(dev) and launcher(kernel) of the kernels below, in one call)
    block_n, wide, prefetch, block_m, progs, warps, db_by_columns, per_prog = bwd_launch(
        M, N, dev, mode.compiled, is_rms, n_groups, bwd_config, WIDE_ROW, REGISTER_ROW, rows_per_program,
        num_programs_hint)
    db_cols = need_db and db_by_columns and not wide
    need_db = need_db and not db_cols  # the kernel's dB partials
    alloc = torch.zeros if wide else torch.empty  # the wide kernel accumulates into its partial row in place
    # grouped: the kernel stores its [block_m, N] accumulator, (progs * block_m / n_groups) rows of the weight's size
    parts = (progs, N) if n_groups == 1 else (progs * block_m // n_groups, n_full)
    dw_part = alloc(parts, dtype=torch.float32, device=dev) if need_dw else None
    db_part = alloc(parts, dtype=torch.float32, device=dev) if need_db else None
    args = (dy, ds if ds is not None else dy, x2, weight if weight is not None else x2,
            mean if mean is not None else rstd, rstd, dx, dw_part if need_dw else dx, db_part if need_db else dx,
            M, N, sdy, sds if ds is not None else 0, sx, sdx, per_prog, offset)
    flags = dict(IS_RMS=is_rms, HAS_DS=ds is not None, HAS_W=weight is not None, HAS_DW=need_dw, HAS_DB=need_db)
    if wide and gate is not None:
        raise ValueError(f"gated RMSNorm: rows of {N} elements are wider than the kernel's {REGISTER_ROW}")
    if wide:
        chunk = min(4096, block_n)
        mode[_norm_bwd_wide][(progs,)](*args, **flags, BLOCK_N=chunk, num_warps=warps_for(chunk))
    else:
        g2, sg = rows(gate, "gate")[::2] if gate is not None else (x2, 0)
        mode[_norm_bwd][(progs,)](*args, **flags, BLOCK_M=block_m, BLOCK_N=block_n, PREFETCH=prefetch,
                                  W_HOLD=W_HOLD if is_rms and block_n == W_HOLD_ROW else 0, DS_PREFETCH=DS_PREFETCH,
                                  G=g2, DG=dgate if gate is not None else dx, stride_g=sg, stride_dg=N,
                                  HAS_GATE=gate is not None, num_warps=warps,
                                  **(gated_flags(gate, is_rms, n_groups, gate_first) if gated else NO_FLAGS))
    dw = torch.empty(n_full, dtype=dw_dtype, device=dev) if need_dw else None
    db = torch.empty(n_full, dtype=db_dtype, device=dev) if need_db else None
    if need_dw or need_db:
        n_parts = parts[0]
        block_cols, grid, block_p = sum_launch(n_full, n_parts)
        mode[_sum_partials][grid](
            dw_part if need_dw else db_part, db_part if need_db else dw_part, dw if need_dw else db,
            db if need_db else dw, n_parts, n_full, HAS_DW=need_dw, HAS_DB=need_db,
            BLOCK_P=block_p, BLOCK_N=block_cols, num_warps=4)
    if db_cols:
        db = dy.reshape(M, N).sum(0, dtype=torch.float32).to(db_dtype)
    return (dx, dw, db) if gate is None else (dx, dw, db, dgate)
