"""Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"): Triton forward and backward.

``y = gamma * t + beta`` with ``t = tanh(alpha x)``: alpha one scalar, gamma and beta (N,) per column. With ``g =
dy * gamma``, the backward is

    dx = alpha * g * (1 - t^2)      dgamma = sum_rows(dy * t)      dbeta = sum_rows(dy)
    dalpha = sum_all(x * g * (1 - t^2))

Forward: element-wise over the (M, N) rows of x (:mod:`tigon.kernels.elementwise`'s tile and launch shape, rows of
any row stride read in place), fp32 in registers, one rounding to x's dtype. tanh from one ``exp(-2|u|)`` (no
libdevice call; see ``_tanh``: absolute error about one fp32 ulp of 1, below every storage dtype's rounding, and
``1 - t^2`` accurate relative to itself).

Backward: one pass over x and dy on a persistent grid, one program per range of rows (for rows wider than a tile,
the program walks the column chunks one after another): each walks its rows a [BLOCK_M, BLOCK_N] tile at a time,
loading the next tile while it computes this one (the norms' software pipelining, :mod:`tigon.kernels.norm`), writes
dx and accumulates dgamma / dbeta / dalpha in fp32 registers. Each program writes one partial row ``[dgamma (N) |
dbeta (N, with beta) | dalpha (1)]``; a second launch (``_dyt_sum_partials``, on the norms' ``_column_sums``) sums
the rows in a fixed order and writes the three gradients in their parameters' dtypes: two launches, no other
kernel, no atomics, deterministic.

Minimal bytes (M x N of e bytes): forward 2 M N e (read x, write y); backward 3 M N e (read dy, x; write dx).
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
from .partial_sums import _column_sums, _load_tile


@triton.jit
def _tanh(u):
    """(tanh(u), 1 - tanh(u)^2) in fp32 from e = exp(-2|u|) in (0, 1]: ``tanh(u) = sign(u) (1 - e) / (1 + e)`` and
    ``1 - tanh(u)^2 = 4 e / (1 + e)^2``, the second accurate to a few ulps relative even where tanh saturates (1 - t*t
    from a rounded t loses its digits there: dalpha, a sum of such terms that cancel, was 1e-5 off in fp32)."""
    e = tl.exp(-2.0 * tl.abs(u))
    r = 1.0 / (1.0 + e)
    t = (1.0 - e) * r
    return tl.where(u < 0, -t, t), 4.0 * e * r * r


@triton.jit
def _dyt_fwd(X, ALPHA, GAMMA, BETA, Y, M, N, stride_x, HAS_BETA: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr):
    """Y (M, N) contiguous = GAMMA * tanh(ALPHA * X) [+ BETA]; X rows of stride stride_x; ALPHA one element;
    GAMMA, BETA (N,) unit stride."""
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    cmask = cols < N
    alpha = tl.load(ALPHA).to(tl.float32)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    t, _ = _tanh(alpha * x)
    y = t * tl.load(GAMMA + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if HAS_BETA:
        y += tl.load(BETA + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _dyt_bwd(DY, X, ALPHA, GAMMA, DX, PART, M, N, stride_dy, stride_x, W, rows_per_prog, HAS_DB: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DX (M, N) contiguous from DY, X (M rows of N, row strides stride_dy / stride_x, unit column stride), ALPHA one
    element, GAMMA (N,) unit stride. PART (programs, W) fp32: this program's row holds the partial sums over its
    rows (``rows_per_prog`` from pid * rows_per_prog) of dy * t at [0, N), dy at [N, 2N) (HAS_DB) and x * g * (1 -
    t^2) at W - 1."""
    pid = tl.program_id(0)
    alpha = tl.load(ALPHA).to(tl.float32)
    row_start = pid * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    part = PART + pid.to(tl.int64) * W
    first = row_start + tl.arange(0, BLOCK_M)
    da = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):  # one chunk unless N > BLOCK_N
        cols = c0 + tl.arange(0, BLOCK_N)
        cmask = cols < N
        gamma = tl.load(GAMMA + cols, mask=cmask, other=0.0).to(tl.float32)
        dg = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        db = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        # the next tile's loads are in flight while this one is computed (rows >= row_end read as zeros: they add
        # nothing to the sums)
        x = _load_tile(X, first, row_end, cols, cmask, stride_x)
        dy = _load_tile(DY, first, row_end, cols, cmask, stride_dy)
        for r in range(row_start, row_end, BLOCK_M):
            rows = r + tl.arange(0, BLOCK_M)
            x_next = _load_tile(X, rows + BLOCK_M, row_end, cols, cmask, stride_x)
            dy_next = _load_tile(DY, rows + BLOCK_M, row_end, cols, cmask, stride_dy)
            xf = x.to(tl.float32)
            dyf = dy.to(tl.float32)
            t, dt = _tanh(alpha * xf)
            tmp = dyf * gamma[None, :] * dt
            mask = (rows < row_end)[:, None] & cmask[None, :]
            tl.store(DX + rows.to(tl.int64)[:, None] * N + cols[None, :], (alpha * tmp).to(DX.dtype.element_ty),
                     mask=mask)
            dg += dyf * t
            da += xf * tmp
            if HAS_DB:
                db += dyf
            x, dy = x_next, dy_next
        tl.store(part + cols, tl.sum(dg, axis=0), mask=cmask)
        if HAS_DB:
            tl.store(part + N + cols, tl.sum(db, axis=0), mask=cmask)
    tl.store(part + W - 1, tl.sum(tl.sum(da, axis=1), axis=0))


@triton.jit
def _dyt_sum_partials(PART, DG, DB, DA, P, N, W, HAS_DB: tl.constexpr, BLOCK_P: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """The column sums of PART (P, W) fp32 (``_dyt_bwd``'s partial rows), each rounded once: columns [0, N) into DG
    (N,), [N, 2N) into DB (N,) (HAS_DB), W - 1 into DA (one element); in their dtypes."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    s = _column_sums(PART, P, W, cols, cols < W, BLOCK_P, BLOCK_N)
    tl.store(DG + cols, s.to(DG.dtype.element_ty), mask=cols < N)
    if HAS_DB:
        tl.store(DB + (cols - N), s.to(DB.dtype.element_ty), mask=(cols >= N) & (cols < 2 * N))
    tl.store(DA + (cols - (W - 1)), s.to(DA.dtype.element_ty), mask=cols == W - 1)


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

    Rows of up to 2048 columns whole, wider ones in 2048-column chunks that each program walks in turn (no second
    grid dimension, so one dalpha partial per program); tiles of about 2048 elements (:func:`rows_per_program`) at 8
    warps, i.e. 8 elements a thread: with the prefetched tile and the three fp32 accumulators that compiles to ~80
    registers (sm_90, bf16; 16 elements a thread take ~170, which leaves room for one program of 8 warps per SM: the
    previous layout here, [4, 1024] tiles at 8 warps without the prefetch, 182 registers, ran the H200 bf16 16384 x
    4096 backward in 0.396 ms against Liger's 0.275). The persistent grid of :func:`num_programs_hint` (2 per SM, 16
    warps), fewer when each would get fewer than 8 tiles (each program's partial row costs a (W,) write and read).
    Not measured on a GPU yet (benchmarks/tune.py's dyt study sweeps programs, BLOCK_N and warps).
    """
    block_n = min(next_pow2(N), 2048 if compiled_cuda(device) else 1 << 14)
    block_m = rows_per_program(block_n, device, target_elems=2048)
    progs = max(1, min(num_programs_hint(device), cdiv(M, 8 * block_m)))
    return block_m, progs, 8, block_n


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
    per_prog = cdiv(cdiv(M, progs), block_m) * block_m
    progs = cdiv(M, per_prog)
    W = (2 if has_beta else 1) * N + 1  # [dgamma | dbeta | dalpha] partials, one row per program
    part = torch.empty(progs, W, dtype=torch.float32, device=dev)
    _dyt_bwd[(progs,)](dy2, x2, alpha, _unit(gamma), dx, part, M, N, sdy, sx, W, per_prog, HAS_DB=has_beta,
                       BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    dgamma = torch.empty(N, dtype=gamma.dtype, device=dev)
    dbeta = torch.empty(N, dtype=db_dtype, device=dev) if has_beta else None
    dalpha = torch.empty(size=alpha.shape, dtype=alpha.dtype, device=dev)
    block_cols = min(next_pow2(W), 32)  # as the norms: W/32 programs, each summing a [progs, 32] slab
    _dyt_sum_partials[(cdiv(W, block_cols),)](part, dgamma, dbeta if has_beta else dgamma, dalpha, progs, N, W,
                                              HAS_DB=has_beta, BLOCK_P=min(next_pow2(progs), 128),
                                              BLOCK_N=block_cols, num_warps=4)
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
