"""Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"): Triton forward and backward.

``y = gamma * t + beta`` with ``t = tanh(alpha x)``: alpha one scalar, gamma and beta (N,) per column. With ``g =
dy * gamma``, the backward is

    dx = alpha * g * (1 - t^2)      dgamma = sum_rows(dy * t)      dbeta = sum_rows(dy)
    dalpha = sum_all(x * g * (1 - t^2))

Forward: element-wise over the (M, N) rows of x (:mod:`tigon.kernels.elementwise`'s tile and launch shape, rows of
any row stride read in place), fp32 in registers, one rounding to x's dtype. tanh from one ``exp2`` and one
approximate division (``_tanh_parts``; no libdevice call): per element 1 ex2 + 1 reciprocal (MUFU) and ~6 FP32
operations (before: exp with its log2(e) multiply, ``div.full.f32``, and 3 more multiplies).

Backward: one pass over x and dy on a persistent 2-D grid (column chunks x row ranges): each program walks its row
range a [BLOCK_M, BLOCK_N] tile at a time, loading the next tile while it computes this one (the norms' software
pipelining, :mod:`tigon.kernels.norm`), writes dx and accumulates dgamma / dbeta / dalpha in fp32 registers (alpha,
gamma and the 4 of 1 - t^2 = 4 q r folded into per-column factors: 4 multiplies and 3 adds an element besides tanh).
Each row range writes one partial row ``[dgamma (N) | dbeta (N, with beta) | pad | dalpha (one per column chunk)]``;
a second launch (:func:`tigon.kernels.partial_sums._sum_segments`) sums the rows in a fixed order and writes the
three gradients in their parameters' dtypes: two launches, no other kernel, no atomics, deterministic.

Bytes (M x N of e bytes; P row ranges): forward 2 M N e (read x, write y; + gamma, beta), the floor. Backward: the
floor 3 M N e (read dy, x; write dx) plus the partials, 2 x 4 P (2N + 32) bytes (written, read back): at Llama-3's
16384 x 4096 bf16 with P = 132 that is 4.3 MB written and read back, 8.7 MB on the 403 MB floor (2.1%; the 1-D grid
before had a row per program, P = 264: 17.3 MB, 4.3%). Per element: 2 MUFU (ex2, reciprocal), ~13 FP32 operations.
"""

from __future__ import annotations

import torch
from torch import Tensor
import triton
import triton.language as tl

from ._common import (
    CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, next_pow2, num_programs_hint, or_empty, rows, rows_per_program,
)
from .first_order import once_differentiable
from .elementwise import launch_shape, tile
from .partial_sums import SEGMENT_COLS, _load_tile, _sum_segments, segment_start, segments_launch


# Eviction hints of the backward's streams (x and dy are read once: evict_first; dx is stored with .cs, streaming):
# "" (none) or "evict_first". Not measured (benchmarks/tune.py's dyt study).
BWD_EVICT = ""


@triton.jit
def _tanh_parts(x, k):
    """For u = alpha x and ``k = -2 log2(e) |alpha|``: (s, q, r) in fp32 with ``tanh(u) = sign(alpha) s``,
    ``(1 - tanh(u)^2) / 4 = q r``.

    From e = exp(-2|u|) = exp2(k |x|) in (0, 1] and r = 1 / (1 + e) (one approximate division, ``div.approx.f32``,
    2 ulp: 1 + e is in [1, 2]): ``tanh|u| = (1 - e) / (1 + e) = r - q`` with q = e r, and ``1 - tanh(u)^2 = 4 e /
    (1 + e)^2 = 4 q r``, the second accurate to a few ulps relative even where tanh saturates (1 - t*t from a rounded
    t loses its digits there: dalpha, a sum of such terms that cancel, was 1e-5 off in fp32). tanh itself has an
    absolute error of a few fp32 ulps of 1, below every storage dtype's rounding. s carries x's sign (a select);
    the caller multiplies by sign(alpha) where it meets gamma. Per element: 1 multiply, 1 ex2, 1 add, 1 approximate
    reciprocal-multiply, 1 multiply, 1 subtract, 1 select (the formulas: tanh u = (1 - e^-2u) / (1 + e^-2u), the
    definition; d tanh / du = 1 - tanh^2)."""
    e = tl.exp2(k * tl.abs(x))
    r = 1.0 / (1.0 + e)  # fp32 '/' is div.full.f32 (approximate, 2 ulp; tl.fdiv's flag differs across Triton versions)
    q = e * r
    t = r - q
    return tl.where(x < 0, -t, t), q, r


@triton.jit
def _alpha_terms(ALPHA):
    """(alpha, k = -2 log2(e) |alpha|, sign(alpha) with sign(0) = 1) in fp32 from ALPHA's one element."""
    alpha = tl.load(ALPHA).to(tl.float32)
    # exp(v) = exp2(v log2(e)): -2 log2(e) |alpha| folded into one scalar, so that exp(-2 |alpha x|) is one multiply
    # and one ex2.approx (MUFU) an element; 2 log2(e) = 2.8853900817779268
    return alpha, -2.8853900817779268 * tl.abs(alpha), tl.where(alpha < 0, -1.0, 1.0)


@triton.jit
def _dyt_fwd(X, ALPHA, GAMMA, BETA, Y, M, N, stride_x, HAS_BETA: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """Y (M, N) contiguous = GAMMA * tanh(ALPHA * X) [+ BETA]; X rows of stride stride_x; ALPHA one element;
    GAMMA, BETA (N,) unit stride. sign(alpha) is folded into gamma (per column), beta into the one FMA."""
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    cmask = cols < N
    _, k, sgn = _alpha_terms(ALPHA)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    s, _, _ = _tanh_parts(x, k)
    y = s * (sgn * tl.load(GAMMA + cols, mask=cmask, other=0.0).to(tl.float32))[None, :]
    if HAS_BETA:
        y += tl.load(BETA + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _dyt_bwd(DY, X, ALPHA, GAMMA, DX, PART, M, N, stride_dy, stride_x, W, c_start, rows_per_prog,
             HAS_DB: tl.constexpr, EVICT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DX (M, N) contiguous from DY, X (M rows of N, row strides stride_dy / stride_x, unit column stride), ALPHA one
    element, GAMMA (N,) unit stride. Program (i, j): rows [i * rows_per_prog, + rows_per_prog), columns [j BLOCK_N,
    + BLOCK_N). PART (row programs, W) fp32: row i holds the partial sums over program i's rows of dy * tanh(u) at
    [0, N) (its columns), dy at [N, 2N) (HAS_DB) and x * dy * gamma * (1 - t^2) over its columns at c_start + j.

    Per element, with (s, q, r) of ``_tanh_parts`` and p = dy q r: dx = (4 alpha gamma) p, dgamma += dy s (times
    sign(alpha) once, at the end), dalpha += x p (times 4 gamma per column, at the end), dbeta += dy: 4 multiplies,
    3 adds / FMAs besides ``_tanh_parts``; x and dy read once, dx written once."""
    pid = tl.program_id(0)
    cb = tl.program_id(1)
    alpha, k, sgn = _alpha_terms(ALPHA)
    row_start = pid * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    part = PART + pid.to(tl.int64) * W
    cols = cb * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    gamma = tl.load(GAMMA + cols, mask=cmask, other=0.0).to(tl.float32)
    ag4 = (4.0 * alpha) * gamma
    dg = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    da = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # the next tile's loads are in flight while this one is computed (rows >= row_end read as zeros: they add
    # nothing to the sums)
    first = row_start + tl.arange(0, BLOCK_M)
    x = _load_tile(X, first, row_end, cols, cmask, stride_x, EVICT)
    dy = _load_tile(DY, first, row_end, cols, cmask, stride_dy, EVICT)
    for r in range(row_start, row_end, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M)
        x_next = _load_tile(X, rows + BLOCK_M, row_end, cols, cmask, stride_x, EVICT)
        dy_next = _load_tile(DY, rows + BLOCK_M, row_end, cols, cmask, stride_dy, EVICT)
        xf = x.to(tl.float32)
        dyf = dy.to(tl.float32)
        s, q, rr = _tanh_parts(xf, k)
        p = dyf * (q * rr)
        mask = (rows < row_end)[:, None] & cmask[None, :]
        dx_ptrs = DX + rows.to(tl.int64)[:, None] * N + cols[None, :]
        if EVICT == "evict_first":
            tl.store(dx_ptrs, (ag4[None, :] * p).to(DX.dtype.element_ty), mask=mask, cache_modifier=".cs")
        else:
            tl.store(dx_ptrs, (ag4[None, :] * p).to(DX.dtype.element_ty), mask=mask)
        dg += dyf * s
        da += xf * p
        if HAS_DB:
            db += dyf
        x, dy = x_next, dy_next
    tl.store(part + cols, sgn * tl.sum(dg, axis=0), mask=cmask)
    if HAS_DB:
        tl.store(part + N + cols, tl.sum(db, axis=0), mask=cmask)
    tl.store(part + c_start + cb, 4.0 * tl.sum(gamma * tl.sum(da, axis=0), axis=0))


def _unit(p: torch.Tensor | None) -> torch.Tensor | None:
    """A parameter as the kernels read it: unit stride (a strided or expanded one is copied)."""
    return p if p is None or p.stride(-1) == 1 else p.contiguous()


def dyt_forward(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None):
    """``gamma * tanh(alpha x) + beta`` for x (..., N) (any strides). Returns (y: x's shape and dtype, contiguous;
    x2: x as the kernel read it, x itself or its (M, N) rows view (a copy for a strided last dimension), what the
    backward should read)."""
    y = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    x2, M, sx = rows(x, "x")
    N = x.shape[-1]
    if M == 0:
        return y, x2
    block_m, block_n, warps, grid = launch_shape(M, N, x.device)
    _dyt_fwd[grid](x2, alpha, _unit(gamma), _unit(beta) if beta is not None else x2, y, M, N, sx,
                   HAS_BETA=beta is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return y, x2


def bwd_config(M: int, N: int, device: torch.device) -> tuple[int, int, int, int]:
    """(BLOCK_M, programs, num_warps, BLOCK_N) of the backward (the norms' order, so that benchmarks/tune.py's
    ``bwd_rows`` / ``bwd_progs`` / ``bwd_warps`` knobs set them; ``bwd_block_n`` the last).

    A 2-D grid: cdiv(N, BLOCK_N) column chunks (up to 2048 columns; at least N / 32, so that the dalpha partials of
    a row fit one slab of the partial sum) times ``programs / chunks`` row ranges, each program a persistent walk
    over its row range's tiles of about 2048 elements (:func:`rows_per_program`) at 8 warps, i.e. 8 elements a
    thread: with the prefetched tile and the three fp32 accumulators ~80-100 registers (sm_90, bf16). The partial
    buffer has a row per row range, not per program: at Llama-3's 16384 x 4096 with 264 programs (2 per SM, 16 warps),
    132 rows of 8194 fp32 (4.3 MB written and read back: 2.1% of the 403 MB floor; the 1-D grid's 264 rows: 4.3%).
    Fewer programs when each would get fewer than 8 tiles. H200 (session 14, before the 2-D grid and the leaner
    arithmetic): 264 programs, BLOCK_N 2048, 8 warps 215.7 us fwd + bwd; best 210.2 at 16 warps (within 3%). Again
    at 16 warps after them (session 23, kernel time, benchmarks/results/h200/session23/c1/tune-dyt-poly_*.json): 8
    warps 194.7 us (81.7% of copy bandwidth), 16 warps 188.7 (84.8%), the best of 16 configurations; 16 it is.
    """
    block_n = min(next_pow2(N), 2048 if compiled_cuda(device) else 1 << 14)
    block_m = rows_per_program(block_n, device, target_elems=2048)
    progs = max(1, min(num_programs_hint(device), cdiv(M, 8 * block_m) * cdiv(N, block_n)))
    return block_m, progs, 16, block_n


def dyt_backward(dy: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, has_beta: bool,
                 x_shape: tuple[int, ...] | None = None, beta_dtype: torch.dtype | None = None):
    """Gradients for dy and x (..., N) (any strides; x as given to, or x2 as returned by, the forward).

    Returns (dx: ``x_shape`` (default x's shape) and x's dtype, contiguous; dalpha: alpha's shape and dtype; dgamma:
    (N,) in gamma's dtype; dbeta: (N,) in ``beta_dtype`` (default gamma's), or None unless ``has_beta``). Two
    launches (the pass over x and dy, the partial rows' sum) and no other kernel.
    """
    x2, M, sx = rows(x, "x")
    N = x.shape[-1]
    dy2, _, sdy = rows(dy, "grad_output")
    dev = x.device
    dx = torch.empty(size=x_shape or x.shape, dtype=x.dtype, device=dev)
    db_dtype = beta_dtype or gamma.dtype
    if M == 0:
        return (dx, torch.zeros_like(alpha), torch.zeros(N, dtype=gamma.dtype, device=dev),
                torch.zeros(N, dtype=db_dtype, device=dev) if has_beta else None)
    block_m, progs, warps, block_n = bwd_config(M, N, dev)
    block_n = max(block_n, next_pow2(cdiv(N, SEGMENT_COLS)))  # the dalpha partials of a row range: one slab
    chunks = cdiv(N, block_n)
    row_progs = max(1, progs // chunks)
    per_prog = cdiv(cdiv(M, row_progs), block_m) * block_m
    row_progs = cdiv(M, per_prog)
    nb = N if has_beta else 0
    c_start = segment_start(N + nb)  # [dgamma | dbeta | padding | dalpha (one a column chunk)] a row range
    W = c_start + chunks
    part = torch.empty(row_progs, W, dtype=torch.float32, device=dev)
    _dyt_bwd[(row_progs, chunks)](dy2, x2, alpha, _unit(gamma), dx, part, M, N, sdy, sx, W, c_start, per_prog,
                                  HAS_DB=has_beta, EVICT=BWD_EVICT, BLOCK_M=block_m, BLOCK_N=block_n,
                                  num_warps=warps)
    dgamma = torch.empty(N, dtype=gamma.dtype, device=dev)
    dbeta = torch.empty(N, dtype=db_dtype, device=dev) if has_beta else None
    dalpha = torch.empty(size=alpha.shape, dtype=alpha.dtype, device=dev)
    grid, block_p, block_cols = segments_launch(row_progs, W)
    _sum_segments[grid](part, dgamma, dbeta if has_beta else dgamma, dalpha, row_progs, W, N, nb, c_start,
                        HAS_B=has_beta, C_SUM=True, BLOCK_P=block_p, BLOCK_N=block_cols, num_warps=4)
    return dx, dalpha, dgamma, dbeta


class DyTFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, alpha, gamma, beta)`` with x (..., N), alpha one element, gamma (N,), beta (N,)
    or None. Saves x (as the kernel read it), alpha and gamma; t = tanh(alpha x) is recomputed in the backward."""

    @staticmethod
    def forward(ctx, x, alpha, gamma, beta):
        y, x2 = dyt_forward(x, alpha, gamma, beta)
        ctx.save_for_backward(x2, alpha, gamma)
        ctx.x_shape, ctx.has_beta = x.shape, beta is not None
        ctx.beta_dtype = beta.dtype if beta is not None else None
        return y

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, alpha, gamma = ctx.saved_tensors
        dx, dalpha, dgamma, dbeta = dyt_backward(dy, x2, alpha, gamma, ctx.has_beta, ctx.x_shape, ctx.beta_dtype)
        need = ctx.needs_input_grad
        return (dx if need[0] else None, dalpha if need[1] else None, dgamma if need[2] else None,
                dbeta if need[3] else None)


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::dyt", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _dyt(x: Tensor, alpha: Tensor, gamma: Tensor, beta: Tensor | None) -> Tensor:
    """``gamma * tanh(alpha x) + beta``: x's shape and dtype, contiguous."""
    return dyt_forward(x, alpha, gamma, beta)[0]


@_dyt.register_fake
def _(x, alpha, gamma, beta):
    return x.new_empty(x.shape)


@torch.library.custom_op("tigon::dyt_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _dyt_backward(dy: Tensor, x: Tensor, alpha: Tensor, gamma: Tensor,
                  has_beta: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype; dalpha: alpha's shape and dtype; dgamma, dbeta: (N,) in gamma's dtype, dbeta (0,)
    unless ``has_beta``)."""
    dx, dalpha, dgamma, dbeta = dyt_backward(dy, x, alpha, gamma, has_beta)
    return dx, dalpha, dgamma, or_empty(dbeta, gamma)


@_dyt_backward.register_fake
def _(dy, x, alpha, gamma, has_beta):
    return (x.new_empty(x.shape), alpha.new_empty(alpha.shape), gamma.new_empty(gamma.shape),
            gamma.new_empty(gamma.shape if has_beta else (0,)))


def _dyt_setup(ctx, inputs, output):
    x, alpha, gamma, beta = inputs
    ctx.save_for_backward(x, alpha, gamma)
    ctx.has_beta = beta is not None
    ctx.beta_dtype = beta.dtype if beta is not None else None


def _dyt_grad(ctx, dy):
    x, alpha, gamma = ctx.saved_tensors
    dx, dalpha, dgamma, dbeta = _dyt_backward(dy, x, alpha, gamma, ctx.has_beta)
    need = ctx.needs_input_grad
    return (if_wanted(dx, need[0]), if_wanted(dalpha, need[1]), if_wanted(dgamma, need[2]),
            dbeta.to(ctx.beta_dtype) if ctx.has_beta and need[3] else None)


_dyt.register_autograd(_dyt_grad, setup_context=_dyt_setup)


def compiled_dyt(x, alpha, gamma, beta):
    """``DyTFunction.apply`` as the ``tigon::dyt`` custom op."""
    return _dyt(x, alpha, gamma, beta)
