"""PolyNorm (Zhuo et al. 2024, "Polynomial Composition Activations", arXiv:2411.03884): Triton forward and backward.

``y = w0 x^3 r3 + w1 x^2 r2 + w2 x r1 + b`` per row, ``r_p = 1/sqrt(mean(x^(2p)) + eps)`` (the RMS norm of x^p).
Forward: the row held in registers (the norms' forward layout and launch, :func:`tigon.kernels.norm.fwd_config`),
the three mean squares from one read of x in fp32; writes y and the (M, 3) fp32 r_p for the backward.

Backward, with ``S_p = sum(dy * x^p)`` over the row (d(x^p r_p)/dx^p is the RMSNorm gradient):

    dx = sum_p w_p r_p p x^(p-1) (dy - x^p r_p^2 S_p / N)
    dw_p = sum_rows r_p S_p          db = sum_all dy

on a persistent grid (each program a contiguous range of rows, a [BLOCK_M, BLOCK_N] tile a step, the next tile's
dy, x and r_p loaded while this one is reduced), with the four scalar partial sums per program reduced by one small
launch afterwards (:func:`tigon.kernels.partial_sums._sum_segments`; before: two ATen sums and two casts): two
launches, no atomics, deterministic. With ``in_place``
dx is written over dy (each tile read before it is written, by the same program), as Liger-Kernel does, but only
where the backward owns dy (:func:`tigon.kernels.grad_ownership.owns_grad`; Liger writes unconditionally).

Bytes (M x N of e bytes, P programs): forward 2 M N e (read x, write y; the floor) + 12 M (the r_p, fp32: 0.15% of a
bf16 row of 4096); backward 3 M N e (read dy, x; write dx; the floor) + 12 M (r_p) + 2 x 16 P (partials written and
read back). Per element: forward 2 multiplies (x^2, x^3), 3 FMAs of the mean squares, 3 for y; backward 5
multiplies (x^2, x^3 and the three products with dy), 4 adds of the row sums, 5 FMAs + 1 multiply for dx; no
transcendental or division an element (one rsqrt, a division by N, per row).
"""

from __future__ import annotations

import torch
from torch import Tensor
import triton
import triton.language as tl

from ._common import (
    CUSTOM_OP_TAGS, cdiv, check_row_width, compiled_cuda, direct_backward, if_wanted, next_pow2, num_programs_hint,
    rows, rows_of, rows_per_program, warps_for,
)
from .first_order import first_order
from .grad_ownership import MEASURED, owns_grad, prepare
from .norm import fwd_config
from .partial_sums import _load_tile, _sum_segments, segments_launch

# Whether the backward loads the next row tile (dy, x, r_p) before reducing this one (the norms' software
# pipelining; 16 more registers a thread at rows of 4096, 8 warps). Not measured (benchmarks/tune.py's poly_norm study).
BWD_PREFETCH = True


@triton.jit
def _poly_norm_fwd(X, W, B, Y, RSTD, M, N, stride_x, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Y (M, N) contiguous; RSTD (M, 3) fp32 = (r3, r2, r1); X rows of stride stride_x; W (3,) unit stride, B one
    element."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = x * x
    x3 = x2 * x
    r1 = tl.rsqrt(tl.sum(x2, axis=1) / N + eps)
    r2 = tl.rsqrt(tl.sum(x2 * x2, axis=1) / N + eps)
    r3 = tl.rsqrt(tl.sum(x3 * x3, axis=1) / N + eps)
    w0 = tl.load(W).to(tl.float32)
    w1 = tl.load(W + 1).to(tl.float32)
    w2 = tl.load(W + 2).to(tl.float32)
    y = (w0 * r3)[:, None] * x3 + (w1 * r2)[:, None] * x2 + (w2 * r1)[:, None] * x + tl.load(B).to(tl.float32)
    tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows * 3, r3, mask=rmask)
    tl.store(RSTD + rows * 3 + 1, r2, mask=rmask)
    tl.store(RSTD + rows * 3 + 2, r1, mask=rmask)


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _poly_norm_bwd(DY, X, W, RSTD, DX, PART, M, N, stride_dy, stride_x, stride_dx, rows_per_prog,
                   PREFETCH: tl.constexpr, ONE_REDUCE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DX rows of stride stride_dx (may be DY's own memory: each tile is read, by its program, before it is
    written); PART (programs, 4) fp32: this program's sums of r3 S3, r2 S2, r1 S1 and dy.

    Per row tile: the four row sums S3, S2, S1, sum(dy) in one 4-operand reduction (ONE_REDUCE: one cross-warp
    exchange, not four), then ``dx = dy (x (a3 x + a2) + a1) - x (x^2 (k5 x^2 + k3) + k1)`` with a_p = p w_p r_p
    and k_(2p-1) = a_p r_p^2 S_p / N per row (the module docstring's formula, expanded in powers of x: 5 FMAs and 1
    multiply an element, Horner's rule). PREFETCH: the next tile's dy, x and r_p are loaded before this tile is
    reduced (the norms' software pipelining)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w0 = tl.load(W).to(tl.float32)
    w1 = tl.load(W + 1).to(tl.float32)
    w2 = tl.load(W + 2).to(tl.float32)
    dw0 = tl.zeros([BLOCK_M], dtype=tl.float32)
    dw1 = tl.zeros([BLOCK_M], dtype=tl.float32)
    dw2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    db = tl.zeros([BLOCK_M], dtype=tl.float32)
    row_start = pid * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    first = row_start + tl.arange(0, BLOCK_M)
    dy_n = _load_tile(DY, first, row_end, cols, cmask, stride_dy, "")
    x_n = _load_tile(X, first, row_end, cols, cmask, stride_x, "")
    r3_n, r2_n, r1_n = _load_rstd(RSTD, first, row_end)
    for r in range(row_start, row_end, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M)
        if PREFETCH:
            dy_t, x_t, r3, r2, r1 = dy_n, x_n, r3_n, r2_n, r1_n
            dy_n = _load_tile(DY, rows + BLOCK_M, row_end, cols, cmask, stride_dy, "")
            x_n = _load_tile(X, rows + BLOCK_M, row_end, cols, cmask, stride_x, "")
            r3_n, r2_n, r1_n = _load_rstd(RSTD, rows + BLOCK_M, row_end)
        else:
            dy_t = _load_tile(DY, rows, row_end, cols, cmask, stride_dy, "")
            x_t = _load_tile(X, rows, row_end, cols, cmask, stride_x, "")
            r3, r2, r1 = _load_rstd(RSTD, rows, row_end)
        dy = dy_t.to(tl.float32)
        x = x_t.to(tl.float32)
        x2 = x * x
        if ONE_REDUCE:
            s3, s2, s1, sd = tl.reduce((dy * (x2 * x), dy * x2, dy * x, dy), 1, _add4)
        else:  # (the interpreter: tl.reduce calls the combine function in Python, tl.sum is one numpy call)
            s3, s2, s1, sd = tl.sum(dy * (x2 * x), 1), tl.sum(dy * x2, 1), tl.sum(dy * x, 1), tl.sum(dy, 1)
        a3 = 3.0 * w0 * r3
        a2 = 2.0 * w1 * r2
        a1 = w2 * r1
        k5 = (a3 * r3 * r3 * s3 / N)[:, None]
        k3 = (a2 * r2 * r2 * s2 / N)[:, None]
        k1 = (a1 * r1 * r1 * s1 / N)[:, None]
        dx = dy * (x * (a3[:, None] * x + a2[:, None]) + a1[:, None]) - x * (x2 * (k5 * x2 + k3) + k1)
        mask = (rows < row_end)[:, None] & cmask[None, :]
        tl.store(DX + rows.to(tl.int64)[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw0 += r3 * s3
        dw1 += r2 * s2
        dw2 += r1 * s1
        db += sd
    part = PART + pid.to(tl.int64) * 4
    tl.store(part, tl.sum(dw0, axis=0))
    tl.store(part + 1, tl.sum(dw1, axis=0))
    tl.store(part + 2, tl.sum(dw2, axis=0))
    tl.store(part + 3, tl.sum(db, axis=0))


@triton.jit
def _load_rstd(RSTD, rows, row_end):
    """(r3, r2, r1) of ``rows`` from RSTD (M, 3) fp32; rows >= row_end read as zeros (their terms vanish)."""
    rmask = rows < row_end
    p = RSTD + rows.to(tl.int64) * 3
    return (tl.load(p, mask=rmask, other=0.0), tl.load(p + 1, mask=rmask, other=0.0),
            tl.load(p + 2, mask=rmask, other=0.0))


def poly_norm_forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float):
    """PolyNorm of x (..., N) (any strides). Returns (y: x's shape and dtype, contiguous; x2: x as the kernel read it
    (x itself, or its (M, N) rows view, a copy for a strided last dimension), what the backward should read; rstd:
    (M, 3) fp32)."""
    N = x.shape[-1]
    check_row_width(N, "PolyNorm")
    x2, M, sx = rows(x, "X")
    y = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    rstd = torch.empty(M, 3, dtype=torch.float32, device=x.device)
    if M == 0:
        return y, x2, rstd
    block_n = next_pow2(N)
    block_m, warps = fwd_config(block_n, x.device)
    _poly_norm_fwd[(cdiv(M, block_m),)](x2, w.contiguous(), b, y, rstd, M, N, sx, eps, BLOCK_M=block_m,
                                         BLOCK_N=block_n, num_warps=warps)
    return y, x2, rstd


def bwd_config(M: int, block_n: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, programs, num_warps) of the backward: row tiles of about 4096 elements (:func:`rows_per_program`),
    one program per slot of :func:`num_programs_hint` (2 x SMs) with at least one tile each. Not measured on a GPU:
    the per-program state is four scalars (no (N,) weight-gradient row as in the norms), so the norms' forward
    layout is taken."""
    block_m = rows_per_program(block_n, device)
    progs = max(1, min(num_programs_hint(device), cdiv(M, block_m)))
    return block_m, progs, warps_for(block_m * block_n)


def poly_norm_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, rstd: torch.Tensor,
                       over_dy: bool = False, x_shape: tuple[int, ...] | None = None):
    """Gradients for dy and x (..., N) (any strides; x as given to, or x2 as returned by, the forward).

    ``over_dy``: write dx into dy's memory where dy can hold it (a contiguous tensor of dx's shape and dtype; else a
    new tensor); the caller decides that nothing else reads dy (:func:`tigon.kernels.grad_ownership.owns_grad`).

    Returns (dx: ``x_shape`` (default x's shape) and x's dtype: dy itself when written over, else a new contiguous
    tensor; dw: (3,) in w's dtype; db: b's shape and dtype).
    """
    x2, M, sx = rows(x, "X")
    N = x.shape[-1]
    shape = x_shape or x.shape
    dev = x.device
    dy2, _, sdy = rows(dy, "grad_output")
    if over_dy and dy.is_contiguous() and dy.dtype == x.dtype and dy.shape == shape:
        dx, dx2, sdx = dy, dy2, sdy
    else:
        dx = torch.empty(size=shape, dtype=x.dtype, device=dev)
        dx2, sdx = dx, N
    if M == 0:
        return dx, torch.zeros_like(w), torch.zeros_like(b)
    block_m, progs, warps = bwd_config(M, next_pow2(N), dev)
    per_prog = cdiv(cdiv(M, progs), block_m) * block_m
    progs = cdiv(M, per_prog)
    part = torch.empty(progs, 4, dtype=torch.float32, device=dev)
    _poly_norm_bwd[(progs,)](dy2, x2, w.contiguous(), rstd, dx2, part, M, N, sdy, sx, sdx, per_prog,
                             PREFETCH=BWD_PREFETCH, ONE_REDUCE=compiled_cuda(dev), BLOCK_M=block_m,
                             BLOCK_N=next_pow2(N), num_warps=warps)
    # dw and db: two tensors (views of one would alias each other: a custom op may not return such outputs), summed
    # from the partial rows in one launch (before: 2 ATen sums and 2 casts, 4 kernels)
    dw = torch.empty(3, dtype=w.dtype, device=dev)
    db = torch.empty(size=b.shape, dtype=b.dtype, device=dev)
    grid, block_p, block_cols = segments_launch(progs, 4)
    _sum_segments[grid](part, dw, db, dw, progs, 4, 3, 1, 4, HAS_B=True, C_SUM=False, BLOCK_P=block_p,
                        BLOCK_N=block_cols, num_warps=4)
    return dx, dw, db


@direct_backward  # (the call path of grad_ownership._Probe, which owns_grad compares with)
class PolyNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, w, b, eps, in_place)`` with x (..., N), w (3,), b one element. Saves x (as the
    kernel read it), w and the (M, 3) fp32 r_p; with ``in_place`` the backward writes dx into dy's memory when it
    owns dy (:func:`~tigon.kernels.grad_ownership.owns_grad`), else into a new tensor."""

    @staticmethod
    def forward(ctx, x, w, b, eps, in_place):
        if in_place and any(ctx.needs_input_grad[:3]) and x.device.type not in MEASURED:
            prepare(x.device)  # (once per process and device type)
        y, x2, rstd = poly_norm_forward(x, w, b, eps)
        ctx.save_for_backward(x2, w, b, rstd)
        ctx.x_shape, ctx.in_place = x.shape, in_place
        return y

    @staticmethod
    def backward(ctx, dy):  # (owns_grad's call path: as the other in-place backwards', see grad_ownership._Probe)
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(PolyNormFunction.backward, ctx, dy)
        x2, w, b, rstd = ctx.saved_tensors
        over_dy = ctx.in_place and owns_grad(dy, x2.dtype)  # dy: no other local name (owns_grad counts references)
        dx, dw, db = poly_norm_backward(dy, x2, w, b, rstd, over_dy, ctx.x_shape)
        need = ctx.needs_input_grad
        return dx if need[0] else None, dw if need[1] else None, db if need[2] else None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels; in_place is
# ignored under compile, as the GLUs' inplace_backward).
@torch.library.custom_op("tigon::poly_norm", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _poly_norm(x: Tensor, w: Tensor, b: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(y: x's shape and dtype, contiguous; rstd: (M, 3) fp32)."""
    y, _, rstd = poly_norm_forward(x, w, b, eps)
    return y, rstd


@_poly_norm.register_fake
def _(x, w, b, eps):
    return x.new_empty(x.shape), x.new_empty((rows_of(x), 3), dtype=torch.float32)


@torch.library.custom_op("tigon::poly_norm_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _poly_norm_backward(dy: Tensor, x: Tensor, w: Tensor, b: Tensor, rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype, contiguous; dw: (3,) in w's dtype; db: b's shape and dtype)."""
    return poly_norm_backward(dy, x, w, b, rstd, False)


@_poly_norm_backward.register_fake
def _(dy, x, w, b, rstd):
    return x.new_empty(x.shape), w.new_empty(w.shape), b.new_empty(b.shape)


def _poly_norm_setup(ctx, inputs, output):
    x, w, b, _eps = inputs
    ctx.save_for_backward(x, w, b, output[1])


def _poly_norm_grad(ctx, dy, _drstd):
    x, w, b, rstd = ctx.saved_tensors
    dx, dw, db = _poly_norm_backward(dy, x, w, b, rstd)
    need = ctx.needs_input_grad
    return if_wanted(dx, need[0]), if_wanted(dw, need[1]), if_wanted(db, need[2]), None


_poly_norm.register_autograd(_poly_norm_grad, setup_context=_poly_norm_setup)


def compiled_poly_norm(x, w, b, eps, in_place=False):
    """``PolyNormFunction.apply`` as the ``tigon::poly_norm`` custom op: y (``in_place`` is ignored)."""
    return _poly_norm(x, w, b, eps)[0]
