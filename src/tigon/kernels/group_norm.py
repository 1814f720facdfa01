"""GroupNorm (Wu & He 2018, "Group Normalization"): Triton forward and backward.

X (B, C, *) is read as B*C channel rows of S = prod(*) positions (a view when X is contiguous). Group g of batch
row b holds the Cg = C / G channel rows ``b*C + g*Cg .. + Cg``, so N = Cg * S elements. With ``xhat = (x - mean_g)
* rstd_g``, ``rstd_g = 1/sqrt(var_g + eps)`` (biased variance) and ``g = dy * w[c]``:

    y = xhat * w[c] + b[c]
    dx = rstd_g * (g - xhat * c1_g - c2_g),   c1_g = sum_group(g * xhat) / N,   c2_g = sum_group(g) / N
    dw[c] = sum_{b, positions} dy * xhat        db[c] = sum_{b, positions} dy

Both directions are two passes over the channel rows, each a kernel of this module, and nothing else but the
backward's dw / db sum: a forward is 2 launches, a backward 3, and no small tensor operations between them (1 and 2
when a group fits a tile, below).

1. ``_channel_sums``: per channel row, forward its mean and the sum of squared deviations from it (two passes over
   the row, or one from registers when the row fits one tile), backward ``sum(dy)`` and ``sum(dy * xhat)``. These
   (B*C,) fp32 per-channel sums are all the statistics kept: the forward saves the channel means and M2s.
2. ``_channel_affine``: each row of its tile reads the per-channel sums of its group (Cg values, ``_group_stats``)
   and forms the group's statistics itself, by Chan et al.'s pairwise update (1979), ``M2_g = sum_c M2_c + S *
   sum_c (mean_c - mean_g)^2`` (no E[x^2] - E[x]^2 cancellation), and in the backward c1 / c2 as ``sum_c w[c] *
   sums_c / N``; then ``out = (x - mean_g) * k1 + k0 [+ dy * k2]`` with fp32 coefficients per row (forward: ``k1 =
   rstd w``, ``k0 = b``; backward: ``k2 = rstd w``, ``k1 = -rstd^2 c1``, ``k0 = -rstd c2``), an elementwise pass
   tiled over rows and positions (:mod:`tigon.kernels.elementwise`). The backward's ``_channel_sums`` forms mean_g /
   rstd_g the same way. No weight / no bias are constexpr flags (w = 1, b = 0), not materialised tensors.

Groups that fit one tile (``FUSED_GROUP`` elements) take one launch a direction instead: ``_group_fwd`` and
``_group_bwd``, a program per group holding it in registers (x, and dy), forming the channel statistics / sums, the
group's (``_combine``, the same combination) and writing y / dx; the backward then sums dw / db as above.

dw and db are the (B, C) backward sums reduced over B by the norms' partial-sum kernel
(:func:`tigon.kernels.norm._sum_partials`: fixed order, deterministic, no atomics).

Bytes (M x N of e bytes): forward reads x twice (once when S fits a tile of ``_channel_sums``, whose second pass
then reads registers) and writes y: 3 M N e against the 2 M N e floor; backward reads x and dy twice and writes dx,
5 M N e against 3 (``_group_fwd`` / ``_group_bwd``: 2 and 3, the floors); plus 2 Cg fp32 values a tile row (4 Cg
in the backward's affine pass) read from cache. H200, bf16 128 x 128 x 4096 fwd+bwd, 32 groups, before the
statistics moved into the kernels (5 launches and ~35 small ATen ops, the two-pass kernels in both directions):
kernel time (CUDA graphs, batch 64) 0.211 ms (Liger 0.392, torch.compile 0.312), host-inclusive 1.783 ms (Liger
1.036, torch.compile 0.707).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
import triton
import triton.language as tl

from ._common import (
    CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, next_pow2, once_differentiable, or_empty, rows, rows_per_program,
    warps_for,
)
from .elementwise import launch_shape, tile, tile_elems
from .norm import _sum_partials

# Positions of a channel row ``_channel_sums`` reads per step (a row of S <= CHUNK positions is held in registers
# once); the interpreter takes rows of up to INTERPRET_CHUNK elements a step (its cost is per step). Not measured on a
# GPU: 4096 is the norms' and softmax's wide-row chunk (kernels/softmax.py's WIDE_CHUNK).
CHUNK = 4096
INTERPRET_CHUNK = 1 << 16
# Groups of at most FUSED_GROUP elements (Cg and S each rounded up to a power of two) take the one-launch forward
# ``_group_fwd`` (the group in registers: x read once); the interpreter's limit is larger (fewer, larger programs).
# 16384 elements at 16 warps is 32 fp32 values a thread, as the norms' forward of rows of 16384 (kernels/norm.py). Not
# measured on a GPU yet.
FUSED_GROUP = 16384
INTERPRET_FUSED_GROUP = 1 << 16
# Elements a thread of the one-launch backward ``_group_bwd`` holds (x, dy and their products): 16 compiles to 56-64
# registers (sm_90, bf16, groups of 8192 / 16384 at 16 / 32 warps), 32 to 98-116, so that 16 warps of it fill an SM's
# registers (ptxas -v of the Triton 3.9 build, no spills either way). H200, bf16, 128 x 128 x 4096 in 32 groups, fwd +
# bwd CUDA-graph replays (benchmarks/results/h200/session14/tune_dyt-group_norm_llama3-8b_h200_20261204.json): 32
# elements 211.5 us (75.2% of copy bandwidth), 8 and 16 223.4 us; the two-launch path (FUSED_GROUP 0) 16.9 ms.
GROUP_BWD_ELEMS_PER_THREAD = 32


@triton.jit
def _group_stats(MEAN_C, M2_C, rows, rmask, Cg, S, eps, CG_BLOCK: tl.constexpr):
    """(mean_g, rstd_g, idx, gmask) for channel rows ``rows`` (int64, [BLOCK_M], masked by ``rmask``): the fp32
    statistics of each row's group from its Cg channels' means MEAN_C and sums of squared deviations M2_C (each S
    positions; Chan et al.'s pairwise combination), and the [BLOCK_M, CG_BLOCK] indices of those channel rows (with
    their mask) for the caller's other per-channel sums."""
    j = tl.arange(0, CG_BLOCK)
    idx = (rows - rows % Cg)[:, None] + j[None, :]
    gmask = rmask[:, None] & (j < Cg)[None, :]
    mc = tl.load(MEAN_C + idx, mask=gmask, other=0.0)
    mean = tl.sum(mc, axis=1) / Cg
    d = tl.where(gmask, mc - mean[:, None], 0.0)
    m2 = tl.sum(tl.load(M2_C + idx, mask=gmask, other=0.0), axis=1) + S * tl.sum(d * d, axis=1)
    rstd = tl.rsqrt(m2 / S / Cg + eps)  # / S / Cg: Cg * S may pass 2^31
    return mean, rstd, idx, gmask


@triton.jit
def _combine(mean_c, m2_c, rmask, Cg, S, eps):
    """(mean_g, rstd_g) fp32 scalars of one group from its channels' means and sums of squared deviations ([CG_BLOCK],
    rows beyond Cg masked by ``rmask``; S positions each): Chan et al.'s pairwise combination, as ``_group_stats``."""
    mean = tl.sum(tl.where(rmask, mean_c, 0.0), axis=0) / Cg
    dm = tl.where(rmask, mean_c - mean, 0.0)
    m2 = tl.sum(tl.where(rmask, m2_c, 0.0), axis=0) + S * tl.sum(dm * dm, axis=0)
    return mean, tl.rsqrt(m2 / S / Cg + eps)


@triton.jit
def _group_fwd(X, Y, W, B, MEAN_C, M2_C, S, C, Cg, eps, stride_x, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
               CG_BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """The forward of one group per program, its Cg channel rows of S positions (row stride stride_x) held in one
    [CG_BLOCK, BLOCK_S] tile: Y (rows of S, contiguous) = (x - mean_g) * rstd_g * w + b, and each channel row's
    mean and sum of squared deviations into MEAN_C, M2_C (the backward's statistics), the group's combined from them
    as ``_group_stats`` does (Chan et al.). W, B (C,) read only under HAS_W / HAS_B."""
    j = tl.arange(0, CG_BLOCK)
    offs = tl.arange(0, BLOCK_S)
    rows = tl.program_id(0).to(tl.int64) * Cg + j
    rmask = j < Cg
    mask = rmask[:, None] & (offs < S)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    mean_c = tl.sum(x, axis=1) / S
    d = tl.where(mask, x - mean_c[:, None], 0.0)
    m2_c = tl.sum(d * d, axis=1)
    tl.store(MEAN_C + rows, mean_c, mask=rmask)
    tl.store(M2_C + rows, m2_c, mask=rmask)
    mean, rstd = _combine(mean_c, m2_c, rmask, Cg, S, eps)
    k1 = tl.zeros([CG_BLOCK], dtype=tl.float32) + rstd
    if HAS_W:
        k1 = k1 * tl.load(W + rows % C, mask=rmask, other=0.0).to(tl.float32)
    y = (x - mean) * k1[:, None]
    if HAS_B:
        y += tl.load(B + rows % C, mask=rmask, other=0.0).to(tl.float32)[:, None]
    tl.store(Y + rows[:, None] * S + offs[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _group_bwd(X, DY, DX, W, MEAN_C, M2_C, SUM_DY, SUM_DYX, S, C, Cg, eps, stride_x, stride_dy, HAS_W: tl.constexpr,
               CG_BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """The backward of one group per program, its Cg channel rows of S positions of X and DY (row strides stride_x,
    stride_dy) held in one [CG_BLOCK, BLOCK_S] tile: DX (rows of S, contiguous) = rstd_g * (dy * w - xhat * c1_g -
    c2_g), and each channel row's sum(dy), sum(dy * xhat) into SUM_DY, SUM_DYX (M,) (dw / db's partials); mean_g,
    rstd_g from the forward's MEAN_C, M2_C (``_combine``). W (C,) read only under HAS_W."""
    j = tl.arange(0, CG_BLOCK)
    offs = tl.arange(0, BLOCK_S)
    rows = tl.program_id(0).to(tl.int64) * Cg + j
    rmask = j < Cg
    mask = rmask[:, None] & (offs < S)[None, :]
    mean, rstd = _combine(tl.load(MEAN_C + rows, mask=rmask, other=0.0), tl.load(M2_C + rows, mask=rmask, other=0.0),
                          rmask, Cg, S, eps)
    x = tl.load(X + rows[:, None] * stride_x + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * stride_dy + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    s_dy = tl.sum(dy, axis=1)
    s_dyx = tl.sum(dy * xhat, axis=1)
    tl.store(SUM_DY + rows, s_dy, mask=rmask)
    tl.store(SUM_DYX + rows, s_dyx, mask=rmask)
    if HAS_W:
        w = tl.load(W + rows % C, mask=rmask, other=0.0).to(tl.float32)
        s_dy = s_dy * w
        s_dyx = s_dyx * w
        dy = dy * w[:, None]
    c1 = tl.sum(s_dyx, axis=0) / S / Cg
    c2 = tl.sum(s_dy, axis=0) / S / Cg
    dx = rstd * (dy - xhat * c1 - c2)
    tl.store(DX + rows[:, None] * S + offs[None, :], dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _channel_sums(X, DY, MEAN_C, M2_C, OUT1, OUT2, M, S, Cg, eps, stride_x, stride_dy, HAS_DY: tl.constexpr,
                  SINGLE: tl.constexpr, CG_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
    """Per row of X (M rows of S, row stride stride_x, unit column stride): without DY, OUT1 = mean(x), OUT2 =
    sum((x - mean)^2); with DY (same layout, row stride stride_dy), OUT1 = sum(dy), OUT2 = sum(dy * (x - mean_g) *
    rstd_g) for the row's group statistics, formed from the forward's MEAN_C, M2_C (M,) (``_group_stats``: groups of
    Cg rows, eps). SINGLE: S <= BLOCK_S (one tile, held in registers)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    offs = tl.arange(0, BLOCK_S)
    s1 = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
    if HAS_DY:
        mean, rstd, _, _ = _group_stats(MEAN_C, M2_C, rows, rmask, Cg, S, eps, CG_BLOCK)
        for c0 in range(0, S, BLOCK_S):
            cols = c0 + offs
            mask = rmask[:, None] & (cols < S)[None, :]
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            s1 += dy
            s2 += dy * (x - mean[:, None]) * rstd[:, None]
        tl.store(OUT1 + rows, tl.sum(s1, axis=1), mask=rmask)
    else:
        if SINGLE:
            mask = rmask[:, None] & (offs < S)[None, :]
            x = tl.load(X + rows[:, None] * stride_x + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            mean = tl.sum(x, axis=1) / S
            d = tl.where(mask, x - mean[:, None], 0.0)
            s2 = d * d
        else:
            for c0 in range(0, S, BLOCK_S):
                cols = c0 + offs
                mask = rmask[:, None] & (cols < S)[None, :]
                s1 += tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            mean = tl.sum(s1, axis=1) / S
            for c0 in range(0, S, BLOCK_S):
                cols = c0 + offs
                mask = rmask[:, None] & (cols < S)[None, :]
                x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                d = tl.where(mask, x - mean[:, None], 0.0)
                s2 += d * d
        tl.store(OUT1 + rows, mean, mask=rmask)
    tl.store(OUT2 + rows, tl.sum(s2, axis=1), mask=rmask)


@triton.jit
def _channel_affine(X, DY, OUT, MEAN_C, M2_C, SUM_DY, SUM_DYX, W, B, M, S, C, Cg, eps, stride_x, stride_dy,
                    HAS_DY: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, CG_BLOCK: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT (M, S) contiguous from X (M channel rows of S, row stride stride_x): without DY, ``y = (x - mean_g) *
    rstd_g * w + b``; with DY (row stride stride_dy) and the backward's per-channel SUM_DY = sum(dy), SUM_DYX =
    sum(dy * xhat) (M,), ``dx = rstd_g * (dy * w - xhat * c1_g - c2_g)``. mean_g, rstd_g from the forward's MEAN_C,
    M2_C (M,) (``_group_stats``; groups of Cg rows, C channels a batch row, eps). W, B (C,) unit stride, read only
    under HAS_W / HAS_B (else w = 1, b = 0)."""
    rows, cols, mask = tile(M, S, BLOCK_M, BLOCK_N)
    rmask = rows < M
    mean, rstd, idx, gmask = _group_stats(MEAN_C, M2_C, rows, rmask, Cg, S, eps, CG_BLOCK)
    k1 = rstd
    if HAS_W:
        k1 = rstd * tl.load(W + rows % C, mask=rmask, other=0.0).to(tl.float32)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_DY:
        # c1 = sum_c w[c] * SUM_DYX[c] / N, c2 = sum_c w[c] * SUM_DY[c] / N over the row's group
        s1 = tl.load(SUM_DYX + idx, mask=gmask, other=0.0)
        s2 = tl.load(SUM_DY + idx, mask=gmask, other=0.0)
        if HAS_W:
            wg = tl.load(W + idx % C, mask=gmask, other=0.0).to(tl.float32)
            s1 = s1 * wg
            s2 = s2 * wg
        c1 = tl.sum(s1, axis=1) / S / Cg
        c2 = tl.sum(s2, axis=1) / S / Cg
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        # dx = (x - mean) * k1 + k0 + dy * k2 with k2 = rstd w, k1 = -rstd^2 c1, k0 = -rstd c2
        out = (x - mean[:, None]) * (-rstd * rstd * c1)[:, None] + (-rstd * c2)[:, None] + dy * k1[:, None]
    else:
        out = (x - mean[:, None]) * k1[:, None]
        if HAS_B:
            out += tl.load(B + rows % C, mask=rmask, other=0.0).to(tl.float32)[:, None]
    tl.store(OUT + rows[:, None] * S + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


# ---- launchers -----------------------------------------------------------------------------------------------------
def _channel_rows(x: torch.Tensor, name: str) -> tuple[torch.Tensor, int, int, int]:
    """(rows, M = B*C, S, row stride) of x (B, C, *) read as channel rows with unit column stride (a view when x's
    layout allows it, else a copy)."""
    shape = x.shape
    S = math.prod(shape[2:])
    if x.is_contiguous() and S != 0:
        return x, shape[0] * shape[1], S, S  # the kernels read a pointer and a row stride: no view needed
    t, M, stride = rows(x.reshape(shape[0] * shape[1], S), name)
    return t, M, S, stride


def _cap_rows(block_m: int, cg_block: int, device: torch.device) -> int:
    """Rows of a tile, at most as many as keep the [rows, next_pow2(Cg)] loads of ``_group_stats`` within a tile's
    element count (many rows of few positions in groups of many channels: each row re-reads its group's sums)."""
    return max(1, min(block_m, tile_elems(device) // cg_block))


def _sums(x2, dy2, mean_c, m2_c, M, S, sx, sdy, cg, eps):
    """The two (M,) fp32 sums of ``_channel_sums`` (forward without dy2, backward with it)."""
    dev = x2.device
    out1 = torch.empty(M, dtype=torch.float32, device=dev)
    out2 = torch.empty(M, dtype=torch.float32, device=dev)
    block_s = min(next_pow2(S), CHUNK if compiled_cuda(dev) else INTERPRET_CHUNK)
    cg_block = next_pow2(cg)
    block_m = rows_per_program(block_s, dev)
    has_dy = dy2 is not None
    if has_dy:
        block_m = _cap_rows(block_m, cg_block, dev)
    _channel_sums[(cdiv(M, block_m),)](
        x2, dy2 if has_dy else x2, mean_c if has_dy else out1, m2_c if has_dy else out1, out1, out2, M, S, cg, eps,
        sx, sdy if has_dy else 0, HAS_DY=has_dy, SINGLE=S <= block_s, CG_BLOCK=cg_block, BLOCK_M=block_m,
        BLOCK_S=block_s, num_warps=warps_for(block_m * block_s))
    return out1, out2


def _affine(x2, dy2, out, mean_c, m2_c, sum_dy, sum_dyx, weight, bias, M, S, C, cg, eps, sx, sdy):
    """``_channel_affine`` over (M, S), written into ``out`` (M * S elements, contiguous)."""
    dev = x2.device
    block_m, block_n, warps, grid = launch_shape(M, S, dev)
    cg_block = next_pow2(cg)
    capped = _cap_rows(block_m, cg_block, dev)
    if capped != block_m:
        block_m, warps, grid = capped, warps_for(capped * block_n), (cdiv(M, capped) * cdiv(S, block_n),)
    has_dy = dy2 is not None
    _channel_affine[grid](
        x2, dy2 if has_dy else x2, out, mean_c, m2_c, sum_dy if has_dy else mean_c, sum_dyx if has_dy else mean_c,
        weight if weight is not None else mean_c, bias if bias is not None else mean_c, M, S, C, cg, eps, sx,
        sdy if has_dy else 0, HAS_DY=has_dy, HAS_W=weight is not None, HAS_B=bias is not None and not has_dy,
        CG_BLOCK=cg_block, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)


def _unit(p: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias as the kernels read it: unit stride (a strided one is copied)."""
    return p if p is None or p.stride(0) == 1 else p.contiguous()


def group_norm_forward(x: torch.Tensor, weight, bias, num_groups: int, eps: float):
    """GroupNorm of x (B, C, *) (any strides). Returns (y: x's shape and dtype, contiguous; x2: the (B*C, S) channel
    rows as the kernels read them (x itself when contiguous), what the backward should read; mean_c, m2_c: (B*C,)
    fp32, each channel row's mean and sum of squared deviations, the statistics the backward takes). One launch when
    a group fits a tile (``FUSED_GROUP``), else two."""
    C = x.shape[1]
    cg = C // num_groups
    y = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    x2, M, S, sx = _channel_rows(x, "X")
    if M == 0:
        z = torch.empty(0, dtype=torch.float32, device=x.device)
        return y, x2, z, z.clone()
    weight, bias = _unit(weight), _unit(bias)
    cg_block, block_s = next_pow2(cg), next_pow2(S)
    if cg_block * block_s <= (FUSED_GROUP if compiled_cuda(x.device) else INTERPRET_FUSED_GROUP):
        mean_c = torch.empty(M, dtype=torch.float32, device=x.device)
        m2_c = torch.empty(M, dtype=torch.float32, device=x.device)
        _group_fwd[(M // cg,)](x2, y, weight if weight is not None else mean_c, bias if bias is not None else mean_c,
                               mean_c, m2_c, S, C, cg, eps, sx, HAS_W=weight is not None, HAS_B=bias is not None,
                               CG_BLOCK=cg_block, BLOCK_S=block_s, num_warps=warps_for(cg_block * block_s))
        return y, x2, mean_c, m2_c
    mean_c, m2_c = _sums(x2, None, None, None, M, S, sx, 0, cg, eps)
    _affine(x2, None, y, mean_c, m2_c, None, None, weight, bias, M, S, C, cg, eps, sx, 0)
    return y, x2, mean_c, m2_c


def group_norm_backward(dy, x2, weight, bias, mean_c, m2_c, x_shape, num_groups: int, eps: float, need_dw: bool,
                        need_db: bool):
    """Gradients of GroupNorm for dy (``x_shape``, any strides), the channel rows x2 (B*C, S) (or x itself, any
    strides) and the forward's per-channel statistics mean_c, m2_c (B*C,) fp32. Returns (dx: ``x_shape`` in x's
    dtype, contiguous; dw, db: (C,) in the weight's / bias's dtype, or None unless ``need_dw`` / ``need_db``).
    Three launches (two without dw and db), one less when a group fits a tile (``FUSED_GROUP``)."""
    B, C = x_shape[0], x_shape[1]
    cg = C // num_groups
    dev = x2.device
    M, S = B * C, math.prod(x_shape[2:])
    if x2.is_contiguous():  # x itself, or its channel rows copied
        sx = S
    elif x2.dim() == 2 and x2.shape[0] == M and (S == 1 or x2.stride(1) == 1):  # the forward's channel-rows view
        sx = x2.stride(0)
    else:  # x itself, any strides (the custom op's backward)
        x2, _, _, sx = _channel_rows(x2, "X")
    dy2, _, _, sdy = _channel_rows(dy, "grad_output")
    dx = torch.empty(size=x_shape, dtype=x2.dtype, device=dev)
    if M == 0:
        return (dx, torch.zeros(C, dtype=weight.dtype, device=dev) if need_dw else None,
                torch.zeros(C, dtype=bias.dtype, device=dev) if need_db else None)
    weight = _unit(weight)
    cg_block, block_s = next_pow2(cg), next_pow2(S)
    if cg_block * block_s <= (FUSED_GROUP if compiled_cuda(dev) else INTERPRET_FUSED_GROUP):
        sum_dy = torch.empty(M, dtype=torch.float32, device=dev)
        sum_dy_xhat = torch.empty(M, dtype=torch.float32, device=dev)
        _group_bwd[(M // cg,)](x2, dy2, dx, weight if weight is not None else mean_c, mean_c, m2_c, sum_dy,
                               sum_dy_xhat, S, C, cg, eps, sx, sdy, HAS_W=weight is not None, CG_BLOCK=cg_block,
                               BLOCK_S=block_s,
                               num_warps=max(4, min(32, cg_block * block_s // (32 * GROUP_BWD_ELEMS_PER_THREAD))))
    else:
        sum_dy, sum_dy_xhat = _sums(x2, dy2, mean_c, m2_c, M, S, sx, sdy, cg, eps)
        _affine(x2, dy2, dx, mean_c, m2_c, sum_dy, sum_dy_xhat, weight, None, M, S, C, cg, eps, sx, sdy)
    dw = torch.empty(C, dtype=weight.dtype, device=dev) if need_dw else None
    db = torch.empty(C, dtype=bias.dtype, device=dev) if need_db else None
    if need_dw or need_db:
        block_cols = min(next_pow2(C), 32)  # as kernels/norm.py's launch of it
        _sum_partials[(cdiv(C, block_cols),)](
            sum_dy_xhat, sum_dy, dw if need_dw else db, db if need_db else dw, B, C, HAS_DW=need_dw, HAS_DB=need_db,
            BLOCK_P=min(next_pow2(B), 128), BLOCK_N=block_cols, num_warps=4)
    return dx, dw, db


class GroupNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(X, weight, bias, num_channels, num_groups, eps)`` with X (B, C, *), weight and bias
    (C,) or None. Saves the channel rows of X and the (B*C,) fp32 per-channel statistics."""

    @staticmethod
    def forward(ctx, x, weight, bias, num_channels, num_groups, eps):
        y, x2, mean_c, m2_c = group_norm_forward(x, weight, bias, num_groups, eps)
        ctx.save_for_backward(x2, weight, bias, mean_c, m2_c)
        ctx.x_shape, ctx.num_groups, ctx.eps = x.shape, num_groups, eps
        return y

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, weight, bias, mean_c, m2_c = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = group_norm_backward(dy, x2, weight, bias, mean_c, m2_c, ctx.x_shape, ctx.num_groups, ctx.eps,
                                         need[1] and weight is not None, need[2] and bias is not None)
        return dx if need[0] else None, dw, db, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::group_norm", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _group_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, num_groups: int,
                eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y: x's shape and dtype, contiguous; mean_c, m2_c: (B*C,) fp32 per-channel statistics)."""
    y, _, mean_c, m2_c = group_norm_forward(x, weight, bias, num_groups, eps)
    return y, mean_c, m2_c


@_group_norm.register_fake
def _(x, weight, bias, num_groups, eps):
    stats = x.new_empty((x.shape[0] * x.shape[1],), dtype=torch.float32)
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.custom_op("tigon::group_norm_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _group_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, mean_c: Tensor,
                         m2_c: Tensor, num_groups: int, eps: float, need_dw: bool,
                         need_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype, contiguous; dw, db: (C,) in the weight's / bias's dtype, or (0,) unless ``need_dw`` /
    ``need_db``)."""
    dx, dw, db = group_norm_backward(dy, x, weight, bias, mean_c, m2_c, x.shape, num_groups, eps, need_dw, need_db)
    return dx, or_empty(dw, x), or_empty(db, x)


@_group_norm_backward.register_fake
def _(dy, x, weight, bias, mean_c, m2_c, num_groups, eps, need_dw, need_db):
    C = x.shape[1]
    return (x.new_empty(x.shape), weight.new_empty((C,)) if need_dw else x.new_empty((0,)),
            bias.new_empty((C,)) if need_db else x.new_empty((0,)))


def _group_norm_setup(ctx, inputs, output):
    x, weight, bias, num_groups, eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.num_groups, ctx.eps = num_groups, eps


def _group_norm_grad(ctx, dy, _dmean, _dm2):
    x, weight, bias, mean_c, m2_c = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_dw, need_db = need[1] and weight is not None, need[2] and bias is not None
    dx, dw, db = _group_norm_backward(dy, x, weight, bias, mean_c, m2_c, ctx.num_groups, ctx.eps, need_dw, need_db)
    return if_wanted(dx, need[0]), if_wanted(dw, need_dw), if_wanted(db, need_db), None, None


_group_norm.register_autograd(_group_norm_grad, setup_context=_group_norm_setup)


def compiled_group_norm(x, weight, bias, num_channels, num_groups, eps):
    """``GroupNormFunction.apply`` as the ``tigon::group_norm`` custom op: y (x's shape)."""
    return _group_norm(x, weight, bias, num_groups, eps)[0]
