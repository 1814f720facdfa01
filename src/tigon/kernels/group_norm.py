"""GroupNorm (Wu & He 2018, "Group Normalization"): Triton forward and backward.

X (B, C, *) is read as B*C channel rows of S = prod(*) positions (a view when X is contiguous; row stride sx). Group
gi = b*G + g holds the Cg = C / G channel rows ``gi*Cg .. + Cg``, N = Cg * S elements. With ``xhat = (x - mean_g) *
rstd_g``, ``rstd_g = 1/sqrt(var_g + eps)`` (biased variance) and ``g = dy * w[c]``:

    y = xhat * w[c] + b[c]
    dx = rstd_g * (g - xhat * c1_g - c2_g),   c1_g = sum_group(g * xhat) / N,   c2_g = sum_group(g) / N
    dw[c] = sum_{b, positions} dy * xhat        db[c] = sum_{b, positions} dy

The forward saves each group's mean_g and rstd_g ((B*G,) fp32): all the backward needs besides x.

Groups that fit one tile (``FUSED_GROUP`` elements, Cg and S each rounded up to a power of two) take one launch a
direction: ``_group_fwd`` and ``_group_bwd`` (or, with ``GROUP_BWD_CHUNK``, ``_group_bwd_stream``: the group read in
chunks twice, the second read from L2), a program per group holding it in registers (x, and dy), forming the
channels' statistics and combining them (``_combine``: Chan et al.'s pairwise update, 1979, ``M2_g = sum_c M2_c +
S * sum_c (mean_c - mean_g)^2``, no E[x^2] - E[x]^2 cancellation), then writing y / dx. Bytes: 2 M N e forward and
3 backward (M x N = the whole tensor, e bytes an element), the floors, + 8 bytes a group forward (mean, rstd), 8 a
channel row backward (sum(dy), sum(dy xhat), written and read by the dw / db sum: 2 x 8 x 16384 = 262 KB at 128 x
128 channels, 0.07% of the 403 MB floor) and that sum's launch. Per element: forward 1 subtract, 3 FMAs / multiplies;
backward 1 subtract, 1 multiply and 2 FMAs for the sums, 1 subtract and 2 FMAs for dx = rstd w dy - rstd^2 c1 (x -
mean) - rstd c2 (before: 5 operations on a held xhat); no transcendental or division an element.

Larger groups are split into tiles of at most ``tile_elems`` elements (4096 on CUDA: [BLOCK_R channel rows,
BLOCK_S positions], ``_tile_shape``), each a program of every pass, so that the grid has B*G*T programs (T tiles a
group) whatever the group's size: 1 group of 2^22 elements (4 channels of 2^20 positions) is 1024 programs of 4096
elements, 32 groups of 2^19 are 4096. Each pass streams its tiles once (one 4096-element load per operand a program,
no loop over the group), and a small reduction between the passes, one program per group reading the tiles'
partials in a fixed order, forms what the next pass needs (no atomics: deterministic):

- forward: ``_tile_moments`` (read x; per tile count, mean, M2), ``_group_moments`` (per group: Chan's combination
  of its T tiles' moments into mean_g, rstd_g), ``_tile_affine`` (read x, write y);
- backward: ``_tile_grad_sums`` (read x, dy; per channel row and tile, sum(dy) and sum(dy * xhat)),
  ``_group_grad_sums`` (per group: each channel's sums over its tiles (dw / db's partials) and c1_g, c2_g),
  ``_tile_affine`` (read x, dy, write dx), and dw, db: the (B, C) channel sums reduced over B by the norms'
  partial-sum kernel (:func:`tigon.kernels.partial_sums._sum_partials`, fixed order).

Bytes: forward 3 M N e (x read twice: a group larger than a tile cannot stay in registers between its statistics
and its output) against the 2 M N e floor, backward 5 M N e (x and dy twice, dx once) against 3; the partials add 12
bytes a tile forward (0.15% of a bf16 tile of 4096) and 8 a channel row a column tile backward (4 / BLOCK_S of the
tile's bf16 bytes: 0.1% for rows of 4096 positions or more), which the reductions read once. So the split path can
reach 2/3 (forward) and 3/5 (backward) of the floors' speed at copy bandwidth, fwd + bwd 5/8 (8 M N e against 5).

History: the split path replaced one program per channel row (``_channel_sums``, looping over the row's S
positions, then ``_channel_affine`` gathering each row's Cg channel statistics), whose grid shrank with the number
of channel rows (1 group of 4 x 2^20: 4 programs, each looping over 2^20 positions). Forced at 128 x 128 x 4096 in 32
groups (FUSED_GROUP 0: 16384 channel rows, a program each) it took 16.9 ms fwd + bwd on the H200 (forward 4.24 ms)
against 0.21 ms in one launch a direction (benchmarks/results/h200/session14/tune_dyt-group_norm_llama3-8b_h200_
20261204.json); that 80x was not explained from the code (the kernels compile for sm_90 without spills), and the
two-pass kernels before the statistics moved into them (per-row coefficients, no per-row gathers of the group's
channel sums) ran that shape in 0.211 ms. The split kernels read one mean / rstd (and c1 / c2) a program, no
per-row gather or 64-bit modulo.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
import triton
import triton.language as tl

from ._common import CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, next_pow2, or_empty, warps_for
from .first_order import once_differentiable
from ._common import rows as as_channel_rows
from .elementwise import tile_elems
from .partial_sums import _load_tile, _sum_partials

# Groups of at most FUSED_GROUP elements (Cg and S each rounded up to a power of two) take the one-launch forward
# ``_group_fwd`` (the group in registers: x read once); the interpreter's limit is larger (fewer, larger programs).
# 16384 elements at 16 warps is 32 fp32 values a thread, as the norms' forward of rows of 16384 (kernels/norm.py).
# H200, bf16 128 x 128 x 4096 in 32 groups (4 x 4096 elements), fwd + bwd: 0.21 ms in one launch a direction.
FUSED_GROUP = 16384
INTERPRET_FUSED_GROUP = 1 << 16
# Elements a thread of the one-launch backward ``_group_bwd`` holds (x, dy and their products): 16 compiles to 56-64
# registers (sm_90, bf16, groups of 8192 / 16384 at 16 / 32 warps), 32 to 98-116, so that 16 warps of it fill an SM's
# registers (ptxas -v of the Triton 3.9 build, no spills either way). H200, bf16, 128 x 128 x 4096 in 32 groups, fwd +
# bwd CUDA-graph replays (benchmarks/results/h200/session14/tune_dyt-group_norm_llama3-8b_h200_20261204.json): 32
# elements 211.5 us (75.2% of copy bandwidth), 8 and 16 223.4 us. H100, the same shape and timing (benchmarks/results/
# h100/session28/issue21-tune_h100.json): 239.8 us, 92.8% of its 3.0 TB/s copy; the streamed variants no faster.
GROUP_BWD_ELEMS_PER_THREAD = 32
# Elements a chunk of the streamed one-launch backward ``_group_bwd_stream`` (a group read twice, the second time from
# L2, a chunk in registers: several programs an SM), or 0: ``_group_bwd`` (the group in registers). Only groups larger
# than a chunk stream (with GROUP_BWD_ROW_SUMS, as large too). H200, bf16 128 x 128 x 4096 in 32 groups, fwd + bwd
# (benchmarks/results/h200/session22/cD/tune-norms_llama3-8b-16k_h200.json): chunks of 4096 at 8 warps 205.9 us
# against 207.0 for ``_group_bwd`` (noise), 4 warps 213.9, chunks of 8192 209.0 / 216.2.
GROUP_BWD_CHUNK = 0
GROUP_BWD_CHUNK_WARPS = 4
# The streamed backward's first walk reduces each chunk to row sums at once (``_group_bwd_stream``'s ROW_SUMS): x and
# dy die after each chunk, so a chunk as large as the group (GROUP_BWD_CHUNK = the group's elements: one chunk a walk,
# the second read from L1 / L2) compiles to fewer registers. sm_90, Triton 3.6 (ptxas -v, no GPU), bf16 groups of 4 x
# 4096: chunks of 16384 at 16 warps 108 registers (``_group_bwd`` 127: one program an SM), 8192 at 8 / 4 warps 80 /
# 75, 4096 at 8 / 4 warps 64 / 45 (without ROW_SUMS 79 / 94). Not timed yet (benchmarks/issue21_tune.py).
GROUP_BWD_ROW_SUMS = False
# num_warps of the one-launch forward ``_group_fwd`` (0: ``warps_for`` the tile: 16 at 16384 elements, 64 registers
# on sm_90 with Triton 3.6, two programs an SM).
GROUP_FWD_WARPS = 0
# Partials a step of the reduction programs ``_group_moments`` / ``_group_grad_sums`` read (one program a group).
REDUCE_BLOCK = 1024


@triton.jit
def _combine(mean_c, m2_c, rmask, Cg, S, eps):
    """(mean_g, rstd_g) fp32 scalars of one group from its channels' means and sums of squared deviations ([CG_BLOCK],
    rows beyond Cg masked by ``rmask``; S positions each): Chan et al.'s pairwise combination."""
    mean = tl.sum(tl.where(rmask, mean_c, 0.0), axis=0) / Cg
    dm = tl.where(rmask, mean_c - mean, 0.0)
    m2 = tl.sum(tl.where(rmask, m2_c, 0.0), axis=0) + S * tl.sum(dm * dm, axis=0)
    return mean, tl.rsqrt(m2 / S / Cg + eps)  # / S / Cg: Cg * S may pass 2^31


@triton.jit
def _group_fwd(X, Y, W, B, MEAN_G, RSTD_G, S, C, Cg, eps, stride_x, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
               CG_BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """The forward of one group per program, its Cg channel rows of S positions (row stride stride_x) held in one
    [CG_BLOCK, BLOCK_S] tile: Y (rows of S, contiguous) = (x - mean_g) * rstd_g * w + b, the group's statistics
    combined from its channel rows' (``_combine``) and stored in MEAN_G, RSTD_G (the backward's). W, B (C,) read only
    under HAS_W / HAS_B."""
    j = tl.arange(0, CG_BLOCK)
    offs = tl.arange(0, BLOCK_S)
    gi = tl.program_id(0)
    rows = gi.to(tl.int64) * Cg + j
    rmask = j < Cg
    mask = rmask[:, None] & (offs < S)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    mean_c = tl.sum(x, axis=1) / S
    d = tl.where(mask, x - mean_c[:, None], 0.0)
    mean, rstd = _combine(mean_c, tl.sum(d * d, axis=1), rmask, Cg, S, eps)
    tl.store(MEAN_G + gi, mean)
    tl.store(RSTD_G + gi, rstd)
    k1 = tl.zeros([CG_BLOCK], dtype=tl.float32) + rstd
    if HAS_W:
        k1 = k1 * tl.load(W + rows % C, mask=rmask, other=0.0).to(tl.float32)
    y = (x - mean) * k1[:, None]
    if HAS_B:
        y += tl.load(B + rows % C, mask=rmask, other=0.0).to(tl.float32)[:, None]
    tl.store(Y + rows[:, None] * S + offs[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _group_bwd(X, DY, DX, W, MEAN_G, RSTD_G, SUM_DY, SUM_DYX, S, C, Cg, stride_x, stride_dy, HAS_W: tl.constexpr,
               CG_BLOCK: tl.constexpr, BLOCK_S: tl.constexpr):
    """The backward of one group per program, its Cg channel rows of S positions of X and DY (row strides stride_x,
    stride_dy) held in one [CG_BLOCK, BLOCK_S] tile: DX (rows of S, contiguous) = rstd_g * (dy * w - xhat * c1_g -
    c2_g), and each channel row's sum(dy), sum(dy * xhat) into SUM_DY, SUM_DYX (M,) (dw / db's partials); mean_g,
    rstd_g the forward's. W (C,) read only under HAS_W."""
    j = tl.arange(0, CG_BLOCK)
    offs = tl.arange(0, BLOCK_S)
    gi = tl.program_id(0)
    rows = gi.to(tl.int64) * Cg + j
    rmask = j < Cg
    mask = rmask[:, None] & (offs < S)[None, :]
    mean = tl.load(MEAN_G + gi)
    rstd = tl.load(RSTD_G + gi)
    x = tl.load(X + rows[:, None] * stride_x + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * stride_dy + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    k, kx, k0 = _group_grad_coeffs(tl.sum(dy, axis=1), tl.sum(dy * ((x - mean) * rstd), axis=1), W, SUM_DY, SUM_DYX,
                                   rows, rmask, C, Cg, S, rstd, HAS_W)  # (masked: dy = 0)
    dx = dy * k[:, None] + (x - mean) * kx + k0
    tl.store(DX + rows[:, None] * S + offs[None, :], dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _group_bwd_stream(X, DY, DX, W, MEAN_G, RSTD_G, SUM_DY, SUM_DYX, S, C, Cg, stride_x, stride_dy,
                      HAS_W: tl.constexpr, CG_BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, ROW_SUMS: tl.constexpr):
    """``_group_bwd``'s result (DX, SUM_DY, SUM_DYX) with the group streamed in [CG_BLOCK, BLOCK_S] chunks, twice:
    the first walk reads x and dy (``evict_last``) into fp32 per-channel accumulators of sum(dy) and sum(dy * xhat),
    the second reads them again (``evict_first``, from L2 while the group is still there: 2 x 2 e Cg S bytes a
    group, 64 KB for bf16 groups of 16384) and writes dx = rstd w dy - rstd^2 c1 (x - mean) - rstd c2. DRAM bytes
    stay 3 M N e when the re-read hits L2 (L2 reads 5 M N e); registers hold a chunk, not the group, so that
    several programs share an SM and one's loads overlap another's reductions and stores (``_group_bwd`` holds the
    whole group: one program of 16 warps an SM at 16384 elements). ROW_SUMS: the first walk reduces each chunk to
    its [CG_BLOCK] row sums at once (a reduction across the program a chunk) instead of carrying two fp32
    [CG_BLOCK, BLOCK_S] accumulators to the end: x and dy die after each chunk's sums, so that a chunk as large as
    the group (one iteration a walk, the second read from L1 / L2) takes about half ``_group_bwd``'s registers
    (sm_90, Triton 3.6, bf16 groups of 4 x 4096, 16 warps: 127 registers for ``_group_bwd``, one program an SM)."""
    j = tl.arange(0, CG_BLOCK)
    gi = tl.program_id(0)
    rows = gi.to(tl.int64) * Cg + j
    rmask = j < Cg
    mean = tl.load(MEAN_G + gi)
    rstd = tl.load(RSTD_G + gi)
    a_dy = tl.zeros([CG_BLOCK, BLOCK_S], dtype=tl.float32)
    a_dyx = tl.zeros([CG_BLOCK, BLOCK_S], dtype=tl.float32)
    s_dy = tl.zeros([CG_BLOCK], dtype=tl.float32)
    s_dyx = tl.zeros([CG_BLOCK], dtype=tl.float32)
    row_end = gi.to(tl.int64) * Cg + Cg  # (rows past it: another group's, read as zeros)
    for s0 in range(0, S, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        cmask = offs < S
        x = _load_tile(X, rows, row_end, offs, cmask, stride_x, "evict_last").to(tl.float32)
        dy = _load_tile(DY, rows, row_end, offs, cmask, stride_dy, "evict_last").to(tl.float32)
        if ROW_SUMS:
            s_dy += tl.sum(dy, axis=1)
            s_dyx += tl.sum(dy * ((x - mean) * rstd), axis=1)  # (masked: dy = 0)
        else:
            a_dy += dy
            a_dyx += dy * ((x - mean) * rstd)
    if not ROW_SUMS:
        s_dy = tl.sum(a_dy, axis=1)
        s_dyx = tl.sum(a_dyx, axis=1)
    k, kx, k0 = _group_grad_coeffs(s_dy, s_dyx, W, SUM_DY, SUM_DYX, rows, rmask, C, Cg, S, rstd, HAS_W)
    for s0 in range(0, S, BLOCK_S):
        offs = s0 + tl.arange(0, BLOCK_S)
        cmask = offs < S
        x = _load_tile(X, rows, row_end, offs, cmask, stride_x, "evict_first").to(tl.float32)
        dy = _load_tile(DY, rows, row_end, offs, cmask, stride_dy, "evict_first").to(tl.float32)
        dx = dy * k[:, None] + (x - mean) * kx + k0
        tl.store(DX + rows[:, None] * S + offs[None, :], dx.to(DX.dtype.element_ty),
                 mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _group_grad_coeffs(s_dy, s_dyx, W, SUM_DY, SUM_DYX, rows, rmask, C, Cg, S, rstd, HAS_W: tl.constexpr):
    """From one group's channel sums s_dy = sum(dy), s_dyx = sum(dy * xhat) ([CG_BLOCK], rows beyond Cg masked):
    stores them into SUM_DY, SUM_DYX (dw / db's partials) and returns dx's coefficients (k [CG_BLOCK], kx, k0) with
    ``dx = k dy + kx (x - mean) + k0``: k = rstd w, kx = -rstd^2 c1, k0 = -rstd c2, c1 = sum_c w s_dyx / N, c2 =
    sum_c w s_dy / N (the module docstring's dx, xhat expanded)."""
    tl.store(SUM_DY + rows, s_dy, mask=rmask)
    tl.store(SUM_DYX + rows, s_dyx, mask=rmask)
    k = tl.zeros_like(s_dy) + rstd
    if HAS_W:
        w = tl.load(W + rows % C, mask=rmask, other=0.0).to(tl.float32)
        s_dy = s_dy * w
        s_dyx = s_dyx * w
        k = k * w
    c1 = tl.sum(s_dyx, axis=0) / S / Cg  # / S / Cg: N may pass 2^31
    c2 = tl.sum(s_dy, axis=0) / S / Cg
    return k, -rstd * rstd * c1, -rstd * c2


@triton.jit
def _tile(Cg, S, n_tc, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """This program's tile of the split path: (group gi, column tile tc, the tile's channel rows r within the group
    [BLOCK_R], their absolute rows (int64), row mask, columns [BLOCK_S], column mask, element count). Programs are
    numbered group-major, T = cdiv(Cg, BLOCK_R) * n_tc tiles a group, row tiles outer."""
    pid = tl.program_id(0)
    T = tl.cdiv(Cg, BLOCK_R) * n_tc
    gi = pid // T
    t = pid % T
    tr = t // n_tc
    tc = t % n_tc
    r = tr * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < Cg
    rows = gi.to(tl.int64) * Cg + r
    cols = tc * BLOCK_S + tl.arange(0, BLOCK_S)
    cmask = cols < S
    count = tl.minimum(Cg - tr * BLOCK_R, BLOCK_R) * tl.minimum(S - tc * BLOCK_S, BLOCK_S)
    return gi, tc, r, rows, rmask, cols, cmask, count


@triton.jit
def _tile_moments(X, CNT, MEAN_T, M2_T, Cg, S, n_tc, stride_x, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """Per tile of X's groups (channel rows of S, row stride stride_x): its element count, mean and sum of squared
    deviations from that mean (fp32, two passes over the tile in registers) into CNT, MEAN_T, M2_T at the program's
    index."""
    _, _, _, rows, rmask, cols, cmask, count = _tile(Cg, S, n_tc, BLOCK_R, BLOCK_S)
    mask = rmask[:, None] & cmask[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    n = count.to(tl.float32)
    mean = tl.sum(tl.sum(x, axis=1), axis=0) / n
    d = tl.where(mask, x - mean, 0.0)
    pid = tl.program_id(0)
    tl.store(CNT + pid, n)
    tl.store(MEAN_T + pid, mean)
    tl.store(M2_T + pid, tl.sum(tl.sum(d * d, axis=1), axis=0))


@triton.jit
def _group_moments(CNT, MEAN_T, M2_T, MEAN_G, RSTD_G, T, eps, BLOCK_T: tl.constexpr):
    """One program per group: its T tiles' (count, mean, M2) combined in a fixed order (Chan et al.: each step's
    BLOCK_T tiles pairwise-summed, then merged into the running moments) into MEAN_G, RSTD_G."""
    gi = tl.program_id(0)
    base = gi.to(tl.int64) * T
    n_acc = 0.0
    mean_acc = 0.0
    m2_acc = 0.0
    for t0 in range(0, T, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        m = t < T
        n = tl.load(CNT + base + t, mask=m, other=0.0)
        mu = tl.load(MEAN_T + base + t, mask=m, other=0.0)
        n_c = tl.sum(n, axis=0)
        mean_c = tl.sum(n * mu, axis=0) / n_c
        dev = mu - mean_c
        m2_c = tl.sum(tl.load(M2_T + base + t, mask=m, other=0.0), axis=0) + tl.sum(n * dev * dev, axis=0)
        n_tot = n_acc + n_c
        delta = mean_c - mean_acc
        mean_acc = mean_acc + delta * (n_c / n_tot)
        m2_acc = m2_acc + m2_c + delta * delta * (n_acc * (n_c / n_tot))
        n_acc = n_tot
    tl.store(MEAN_G + gi, mean_acc)
    tl.store(RSTD_G + gi, tl.rsqrt(m2_acc / n_acc + eps))


@triton.jit
def _tile_grad_sums(X, DY, MEAN_G, RSTD_G, P_DY, P_DYX, Cg, S, n_tc, stride_x, stride_dy, BLOCK_R: tl.constexpr,
                    BLOCK_S: tl.constexpr):
    """Per tile: each of its channel rows' sum(dy) and sum(dy * xhat) over the tile's columns into P_DY, P_DYX (M,
    n_tc) at (row, column tile); mean_g, rstd_g the forward's."""
    gi, tc, _, rows, rmask, cols, cmask, _ = _tile(Cg, S, n_tc, BLOCK_R, BLOCK_S)
    mask = rmask[:, None] & cmask[None, :]
    mean = tl.load(MEAN_G + gi)
    rstd = tl.load(RSTD_G + gi)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    xhat = tl.where(mask, (x - mean) * rstd, 0.0)
    tl.store(P_DY + rows * n_tc + tc, tl.sum(dy, axis=1), mask=rmask)
    tl.store(P_DYX + rows * n_tc + tc, tl.sum(dy * xhat, axis=1), mask=rmask)


@triton.jit
def _group_grad_sums(P_DY, P_DYX, W, SUM_DY, SUM_DYX, C1_G, C2_G, Cg, S, G, n_tc, HAS_W: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    """One program per group: each channel row's sum(dy), sum(dy * xhat) over its n_tc column tiles (fixed order)
    into SUM_DY, SUM_DYX (M,), and the group's c1 = sum_c w[c] SUM_DYX[c] / N, c2 = sum_c w[c] SUM_DY[c] / N into
    C1_G, C2_G. W (C,) read only under HAS_W."""
    gi = tl.program_id(0)
    c1 = 0.0
    c2 = 0.0
    for r0 in range(0, Cg, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        rmask = r < Cg
        rows = gi.to(tl.int64) * Cg + r
        a_dy = tl.zeros([BLOCK_R, BLOCK_T], dtype=tl.float32)
        a_dyx = tl.zeros([BLOCK_R, BLOCK_T], dtype=tl.float32)
        for t0 in range(0, n_tc, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            mask = rmask[:, None] & (t < n_tc)[None, :]
            offs = rows[:, None] * n_tc + t[None, :]
            a_dy += tl.load(P_DY + offs, mask=mask, other=0.0)
            a_dyx += tl.load(P_DYX + offs, mask=mask, other=0.0)
        s_dy = tl.sum(a_dy, axis=1)
        s_dyx = tl.sum(a_dyx, axis=1)
        tl.store(SUM_DY + rows, s_dy, mask=rmask)
        tl.store(SUM_DYX + rows, s_dyx, mask=rmask)
        if HAS_W:
            w = tl.load(W + (gi % G) * Cg + r, mask=rmask, other=0.0).to(tl.float32)
            s_dy = s_dy * w
            s_dyx = s_dyx * w
        c1 += tl.sum(s_dyx, axis=0)
        c2 += tl.sum(s_dy, axis=0)
    tl.store(C1_G + gi, c1 / S / Cg)  # / S / Cg: N may pass 2^31
    tl.store(C2_G + gi, c2 / S / Cg)


@triton.jit
def _tile_affine(X, DY, OUT, W, B, MEAN_G, RSTD_G, C1_G, C2_G, Cg, S, G, n_tc, stride_x, stride_dy,
                 HAS_DY: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_S: tl.constexpr):
    """Per tile, OUT (channel rows of S, contiguous): without DY ``y = (x - mean_g) * rstd_g * w + b``; with DY (row
    stride stride_dy) ``dx = rstd_g * (dy * w - xhat * c1_g - c2_g)``. W, B (C,) unit stride, read only under HAS_W
    / HAS_B (else w = 1, b = 0); C1_G, C2_G read only under HAS_DY."""
    gi, _, r, rows, rmask, cols, cmask, _ = _tile(Cg, S, n_tc, BLOCK_R, BLOCK_S)
    mask = rmask[:, None] & cmask[None, :]
    mean = tl.load(MEAN_G + gi)
    rstd = tl.load(RSTD_G + gi)
    ch = (gi % G) * Cg + r
    k = tl.zeros([BLOCK_R], dtype=tl.float32) + rstd
    if HAS_W:
        k = k * tl.load(W + ch, mask=rmask, other=0.0).to(tl.float32)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_DY:
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        c1 = tl.load(C1_G + gi)
        c2 = tl.load(C2_G + gi)
        # dx = rstd w dy - rstd^2 c1 (x - mean) - rstd c2
        out = dy * k[:, None] + (x - mean) * (-rstd * rstd * c1) - rstd * c2
    else:
        out = (x - mean) * k[:, None]
        if HAS_B:
            out += tl.load(B + ch, mask=rmask, other=0.0).to(tl.float32)[:, None]
    tl.store(OUT + rows[:, None] * S + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


# ---- launchers -----------------------------------------------------------------------------------------------------
def _channel_rows(x: torch.Tensor, name: str) -> tuple[torch.Tensor, int, int, int]:
    """(rows, M = B*C, S, row stride) of x (B, C, *) read as channel rows with unit column stride (a view when x's
    layout allows it, else a copy)."""
    shape = x.shape
    S = math.prod(shape[2:])
    if x.is_contiguous() and S != 0:
        return x, shape[0] * shape[1], S, S  # the kernels read a pointer and a row stride: no view needed
    t, M, stride = as_channel_rows(x.reshape(shape[0] * shape[1], S), name)
    return t, M, S, stride


def _one_launch(cg: int, S: int, device: torch.device) -> bool:
    """Whether a group of cg channel rows of S positions fits the one-launch kernels' tile (``FUSED_GROUP``)."""
    return next_pow2(cg) * next_pow2(S) <= (FUSED_GROUP if compiled_cuda(device) else INTERPRET_FUSED_GROUP)


def _tile_shape(cg: int, S: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_S, column tiles a row n_tc, tiles a group T) of the split path: tiles of at most
    :func:`~tigon.kernels.elementwise.tile_elems` elements, the positions first (whole rows of up to that many),
    then as many of the group's channel rows as fill the tile."""
    elems = tile_elems(device)
    block_s = min(next_pow2(S), elems)
    block_r = min(next_pow2(cg), max(1, elems // block_s))
    n_tc = cdiv(S, block_s)
    return block_r, block_s, n_tc, cdiv(cg, block_r) * n_tc


def _unit(p: torch.Tensor | None) -> torch.Tensor | None:
    """A weight or bias as the kernels read it: unit stride (a strided one is copied)."""
    return p if p is None or p.stride(0) == 1 else p.contiguous()


def group_norm_forward(x: torch.Tensor, weight, bias, num_groups: int, eps: float):
    """GroupNorm of x (B, C, *) (any strides). Returns (y: x's shape and dtype, contiguous; x2: the (B*C, S) channel
    rows as the kernels read them (x itself when contiguous), what the backward should read; mean_g, rstd_g: (B*G,)
    fp32, each group's mean and 1/sqrt(var + eps), the statistics the backward takes). One launch when a group fits a
    tile (``FUSED_GROUP``), else three (the split path)."""
    C = x.shape[1]
    cg = C // num_groups
    dev = x.device
    y = torch.empty(size=x.shape, dtype=x.dtype, device=dev)
    x2, M, S, sx = _channel_rows(x, "X")
    groups = M // cg
    mean_g = torch.empty(groups, dtype=torch.float32, device=dev)
    rstd_g = torch.empty(groups, dtype=torch.float32, device=dev)
    if M == 0:
        return y, x2, mean_g, rstd_g
    weight, bias = _unit(weight), _unit(bias)
    w = weight if weight is not None else mean_g
    b = bias if bias is not None else mean_g
    if _one_launch(cg, S, dev):
        cg_block, block_s = next_pow2(cg), next_pow2(S)
        _group_fwd[(groups,)](x2, y, w, b, mean_g, rstd_g, S, C, cg, eps, sx, HAS_W=weight is not None,
                              HAS_B=bias is not None, CG_BLOCK=cg_block, BLOCK_S=block_s,
                              num_warps=GROUP_FWD_WARPS or warps_for(cg_block * block_s))
        return y, x2, mean_g, rstd_g
    block_r, block_s, n_tc, T = _tile_shape(cg, S, dev)
    warps = warps_for(block_r * block_s)
    cnt, mean_t, m2_t = torch.empty(3, groups * T, dtype=torch.float32, device=dev)
    _tile_moments[(groups * T,)](x2, cnt, mean_t, m2_t, cg, S, n_tc, sx, BLOCK_R=block_r, BLOCK_S=block_s,
                                 num_warps=warps)
    _group_moments[(groups,)](cnt, mean_t, m2_t, mean_g, rstd_g, T, eps, BLOCK_T=min(next_pow2(T), REDUCE_BLOCK),
                              num_warps=4)
    _tile_affine[(groups * T,)](x2, x2, y, w, b, mean_g, rstd_g, mean_g, mean_g, cg, S, num_groups, n_tc, sx, 0,
                                HAS_DY=False, HAS_W=weight is not None, HAS_B=bias is not None, BLOCK_R=block_r,
                                BLOCK_S=block_s, num_warps=warps)
    return y, x2, mean_g, rstd_g


def group_norm_backward(dy, x2, weight, bias, mean_g, rstd_g, x_shape, num_groups: int, eps: float, need_dw: bool,
                        need_db: bool):
    """Gradients of GroupNorm for dy (``x_shape``, any strides), the channel rows x2 (B*C, S) (or x itself, any
    strides) and the forward's group statistics mean_g, rstd_g (B*G,) fp32 (``eps`` is already in rstd_g). Returns
    (dx: ``x_shape`` in x's dtype, contiguous; dw, db: (C,) in the weight's / bias's dtype, or None unless
    ``need_dw`` / ``need_db``). One launch when a group fits a tile (``FUSED_GROUP``), else three; one more for dw
    and db."""
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
    w = weight if weight is not None else mean_g
    groups = M // cg
    sum_dy = torch.empty(M, dtype=torch.float32, device=dev)
    sum_dy_xhat = torch.empty(M, dtype=torch.float32, device=dev)
    chunk = GROUP_BWD_CHUNK
    group = next_pow2(cg) * next_pow2(S)
    if _one_launch(cg, S, dev) and chunk and next_pow2(cg) <= chunk and (
            chunk < group or (GROUP_BWD_ROW_SUMS and chunk == group)):
        cg_block = next_pow2(cg)
        _group_bwd_stream[(groups,)](x2, dy2, dx, w, mean_g, rstd_g, sum_dy, sum_dy_xhat, S, C, cg, sx, sdy,
                                     HAS_W=weight is not None, CG_BLOCK=cg_block, BLOCK_S=chunk // cg_block,
                                     ROW_SUMS=GROUP_BWD_ROW_SUMS, num_warps=GROUP_BWD_CHUNK_WARPS)
    elif _one_launch(cg, S, dev):
        cg_block, block_s = next_pow2(cg), next_pow2(S)
        _group_bwd[(groups,)](x2, dy2, dx, w, mean_g, rstd_g, sum_dy, sum_dy_xhat, S, C, cg, sx, sdy,
                              HAS_W=weight is not None, CG_BLOCK=cg_block, BLOCK_S=block_s,
                              num_warps=max(4, min(32, cg_block * block_s // (32 * GROUP_BWD_ELEMS_PER_THREAD))))
    else:
        block_r, block_s, n_tc, T = _tile_shape(cg, S, dev)
        warps = warps_for(block_r * block_s)
        p_dy, p_dyx = torch.empty(2, M * n_tc, dtype=torch.float32, device=dev)
        c1_g, c2_g = torch.empty(2, groups, dtype=torch.float32, device=dev)
        _tile_grad_sums[(groups * T,)](x2, dy2, mean_g, rstd_g, p_dy, p_dyx, cg, S, n_tc, sx, sdy, BLOCK_R=block_r,
                                       BLOCK_S=block_s, num_warps=warps)
        red_r = min(next_pow2(cg), REDUCE_BLOCK)
        _group_grad_sums[(groups,)](p_dy, p_dyx, w, sum_dy, sum_dy_xhat, c1_g, c2_g, cg, S, num_groups, n_tc,
                                    HAS_W=weight is not None, BLOCK_R=red_r,
                                    BLOCK_T=max(1, min(next_pow2(n_tc), REDUCE_BLOCK // red_r)), num_warps=4)
        _tile_affine[(groups * T,)](x2, dy2, dx, w, w, mean_g, rstd_g, c1_g, c2_g, cg, S, num_groups, n_tc, sx, sdy,
                                    HAS_DY=True, HAS_W=weight is not None, HAS_B=False, BLOCK_R=block_r,
                                    BLOCK_S=block_s, num_warps=warps)
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
    (C,) or None. Saves the channel rows of X and the (B*G,) fp32 group statistics (mean, rstd)."""

    @staticmethod
    def forward(ctx, x, weight, bias, num_channels, num_groups, eps):
        y, x2, mean_g, rstd_g = group_norm_forward(x, weight, bias, num_groups, eps)
        ctx.save_for_backward(x2, weight, bias, mean_g, rstd_g)
        ctx.x_shape, ctx.num_groups, ctx.eps = x.shape, num_groups, eps
        return y

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, weight, bias, mean_g, rstd_g = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = group_norm_backward(dy, x2, weight, bias, mean_g, rstd_g, ctx.x_shape, ctx.num_groups, ctx.eps,
                                         need[1] and weight is not None, need[2] and bias is not None)
        return dx if need[0] else None, dw, db, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::group_norm", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _group_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, num_groups: int,
                eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y: x's shape and dtype, contiguous; mean_g, rstd_g: (B*G,) fp32 group statistics)."""
    y, _, mean_g, rstd_g = group_norm_forward(x, weight, bias, num_groups, eps)
    return y, mean_g, rstd_g


@_group_norm.register_fake
def _(x, weight, bias, num_groups, eps):
    stats = x.new_empty((x.shape[0] * num_groups,), dtype=torch.float32)
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.custom_op("tigon::group_norm_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _group_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, mean_g: Tensor,
                         rstd_g: Tensor, num_groups: int, eps: float, need_dw: bool,
                         need_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype, contiguous; dw, db: (C,) in the weight's / bias's dtype, or (0,) unless ``need_dw`` /
    ``need_db``)."""
    dx, dw, db = group_norm_backward(dy, x, weight, bias, mean_g, rstd_g, x.shape, num_groups, eps, need_dw, need_db)
    return dx, or_empty(dw, x), or_empty(db, x)


@_group_norm_backward.register_fake
def _(dy, x, weight, bias, mean_g, rstd_g, num_groups, eps, need_dw, need_db):
    C = x.shape[1]
    return (x.new_empty(x.shape), weight.new_empty((C,)) if need_dw else x.new_empty((0,)),
            bias.new_empty((C,)) if need_db else x.new_empty((0,)))


def _group_norm_setup(ctx, inputs, output):
    x, weight, bias, num_groups, eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])
    ctx.num_groups, ctx.eps = num_groups, eps


def _group_norm_grad(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean_g, rstd_g = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_dw, need_db = need[1] and weight is not None, need[2] and bias is not None
    dx, dw, db = _group_norm_backward(dy, x, weight, bias, mean_g, rstd_g, ctx.num_groups, ctx.eps, need_dw, need_db)
    return if_wanted(dx, need[0]), if_wanted(dw, need_dw), if_wanted(db, need_db), None, None


_group_norm.register_autograd(_group_norm_grad, setup_context=_group_norm_setup)


def compiled_group_norm(x, weight, bias, num_channels, num_groups, eps):
    """``GroupNormFunction.apply`` as the ``tigon::group_norm`` custom op: y (x's shape)."""
    return _group_norm(x, weight, bias, num_groups, eps)[0]
