"""Sparsemax over the last dimension (Martins & Astudillo 2016): Triton forward and backward, without a sort.

``y = max(x - tau, 0)`` where ``tau`` is the root of ``f(t) = sum(max(x - t, 0)) - 1``, which is continuous and
strictly decreasing where it matters, with ``f(max - 1) >= 0 > f(max)``. The forward finds tau by bisection on
[max - 1, max] (BISECT halvings of a unit interval) and then takes Michelot's exact step twice (Michelot 1986): with
the support ``S = {x > t}`` of a lower bound t of tau, ``t' = (sum_S x - 1) / |S|`` is again a lower bound, equal to
tau once S is the true support; so tau is exact as in the sort-based Algorithm 1
of the paper, which Liger-Kernel runs after a ``torch.sort`` of every row (an extra read and write of x). Entmax's
bisection (Blondel et al. 2019; Peters et al. 2019) uses the same root-finding for alpha-entmax.

Backward (y saved, as Liger-Kernel saves it): with ``s = (y > 0)``, ``dx = s * (dy - sum(s * dy) / sum(s))``.

Rows up to softmax's REGISTER_ROW are held in registers, several per program for short rows, and every bisection
step is a reduction over registers; wider rows take one program per row walking column chunks, so each step re-reads
the row (mostly from L2). The launch is softmax's (:func:`tigon.kernels.softmax._launch`), not re-measured here.

Minimal bytes (M x N of e bytes): forward 2 M N e (read x, write y); backward 3 M N e (read dy, y; write dx).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import rows
from .softmax import _launch
from .unary import unary_op

BISECT = tl.constexpr(24)
"""Bisection steps: the bracket [max - 1, max] shrinks to 2^-24 (fp32's epsilon at 1, the scale of the probabilities),
so the support {x > lo} is the true one but for values within 6e-8 above tau; Michelot's two steps then make tau
exact for that support (and drop such values: each step's support shrinks to the true one)."""


@triton.jit
def _sparsemax_fwd(X, Y, M, N, stride_x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Y (M, N) contiguous = sparsemax of the rows of X (row stride stride_x, unit column stride)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
    lo = tl.where(rmask, tl.max(x, axis=1), 0.0) - 1.0
    half = lo * 0.0 + 0.5  # tau in [lo, lo + 2 * half]; a tensor, as it is carried through the loop
    for _ in range(BISECT):
        mid = lo + half
        f = tl.sum(tl.where(x > mid[:, None], x - mid[:, None], 0.0), axis=1)
        lo = tl.where(f >= 1.0, mid, lo)
        half = half * 0.5
    for _ in range(2):  # Michelot's step from the lower bound lo
        supp = x > lo[:, None]
        k = tl.sum(tl.where(supp, 1.0, 0.0), axis=1)
        lo = (tl.sum(tl.where(supp, x, 0.0), axis=1) - 1.0) / tl.maximum(k, 1.0)  # k = 0: padding rows only
    y = tl.maximum(x - lo[:, None], 0.0)
    tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _excess(X, row, N, stride_x, t, BLOCK_N: tl.constexpr):
    """(sum(max(x - t, 0)), count(x > t), sum of x over x > t) of one row of X, in BLOCK_N-column chunks."""
    offs = tl.arange(0, BLOCK_N)
    e = tl.zeros([BLOCK_N], dtype=tl.float32)
    k = tl.zeros([BLOCK_N], dtype=tl.float32)
    s = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        x = tl.load(X + row * stride_x + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
        supp = x > t
        e += tl.where(supp, x - t, 0.0)
        k += tl.where(supp, 1.0, 0.0)
        s += tl.where(supp, x, 0.0)
    return tl.sum(e, axis=0), tl.sum(k, axis=0), tl.sum(s, axis=0)


@triton.jit
def _sparsemax_fwd_wide(X, Y, N, stride_x, BLOCK_N: tl.constexpr):
    """One row a program, in BLOCK_N-column chunks: the max, the bisection and Michelot's steps, then y."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        m = tl.maximum(m, tl.load(X + row * stride_x + cols, mask=cols < N, other=float("-inf")).to(tl.float32))
    lo = tl.max(m, axis=0) - 1.0
    half = lo * 0.0 + 0.5
    for _ in range(BISECT):
        mid = lo + half
        f, _k, _s = _excess(X, row, N, stride_x, mid, BLOCK_N)
        lo = tl.where(f >= 1.0, mid, lo)
        half = half * 0.5
    for _ in range(2):
        _e, k, s = _excess(X, row, N, stride_x, lo, BLOCK_N)
        lo = (s - 1.0) / k
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(Y + row * N + cols, tl.maximum(x - lo, 0.0).to(Y.dtype.element_ty), mask=cmask)


@triton.jit
def _sparsemax_bwd(DY, Y, DX, M, N, stride_dy, stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DX (M, N) contiguous = s * (DY - sum(s * DY) / sum(s)) per row, s = (Y > 0)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    supp = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0) > 0
    k = tl.maximum(tl.sum(tl.where(supp, 1.0, 0.0), axis=1), 1.0)  # >= 1 on real rows; padding rows read none
    mean = tl.sum(tl.where(supp, dy, 0.0), axis=1) / k
    dx = tl.where(supp, dy - mean[:, None], 0.0)
    tl.store(DX + rows[:, None] * N + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _sparsemax_bwd_wide(DY, Y, DX, N, stride_dy, stride_y, BLOCK_N: tl.constexpr):
    """One row a program, in BLOCK_N-column chunks: the support's size and sum of dy, then dx."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        supp = tl.load(Y + row * stride_y + cols, mask=cmask, other=0.0) > 0
        acc += tl.where(supp, tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32), 0.0)
        cnt += tl.where(supp, 1.0, 0.0)
    mean = tl.sum(acc, axis=0) / tl.sum(cnt, axis=0)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        supp = tl.load(Y + row * stride_y + cols, mask=cmask, other=0.0) > 0
        dy = tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(DX + row * N + cols, tl.where(supp, dy - mean, 0.0).to(DX.dtype.element_ty), mask=cmask)


def sparsemax_forward(x: torch.Tensor) -> torch.Tensor:
    """Sparsemax of x (..., N) (any strides) over its last dimension: a new contiguous tensor of x's shape and
    dtype."""
    y = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    x2, M, sx = rows(x, "input")
    if M:
        _launch(_sparsemax_fwd, _sparsemax_fwd_wide, (x2,), (sx,), y, M, x.shape[-1])
    return y


def sparsemax_backward(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``s * (dy - sum(s * dy) / sum(s))``, ``s = y > 0``, for the forward's output y and dy of y's shape (any
    strides): a new contiguous tensor of y's shape and dtype."""
    dx = torch.empty(size=y.shape, dtype=y.dtype, device=y.device)
    dy2, M, sdy = rows(dy, "grad_output")
    y2, _, sy = rows(y, "y")
    if M:
        _launch(_sparsemax_bwd, _sparsemax_bwd_wide, (dy2, y2), (sdy, sy), dx, M, y.shape[-1])
    return dx


# Eager autograd and the torch.compile custom ops tigon::sparsemax(_backward): see tigon.kernels.unary.
SparsemaxFunction, compiled_sparsemax = unary_op("sparsemax", sparsemax_forward, sparsemax_backward, saves="output")
