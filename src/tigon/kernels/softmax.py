"""Row softmax over the last dimension: Triton forward and backward.

Forward: ``y = exp(x - m) / d`` with ``m = max(x)``, ``d = sum(exp(x - m))`` per row, fp32 in registers, one rounding
to x's dtype. Backward (y saved, as torch saves its output): ``dx = y * (dy - sum(dy * y))`` per row.

Rows up to REGISTER_ROW elements are held whole in registers, several rows per program for short rows (the norms'
forward layout and launch, :func:`tigon.kernels.norm.fwd_config`): one read and one write per element. Wider rows
(a vocabulary) take one program per row walking BLOCK_N-column chunks: the forward keeps a running max and sum per
lane (online softmax, Milakov & Gimelshein 2018) over one read, then a second read writes y; the backward reads dy
and y twice (the row sum, then dx). The second reads mostly hit L2 (a row of 128k bf16 is 256 KB).

Masked lanes load ``-inf`` (forward) and are kept out of the exponentials' arguments (``_safe``), so no NaN is
formed except where torch forms one (a row of all ``-inf``: 0/0).

Minimal bytes (M x N of e bytes): forward 2 M N e (read x, write y); backward 3 M N e (read dy, y; write dx).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, next_pow2, rows, warps_for
from .norm import fwd_config
from .unary import unary_op

# Rows whose block (N rounded up to a power of two) exceeds this many elements take the chunked kernels, in chunks of
# WIDE_CHUNK. 32768 fp32 values are 32 a thread at 32 warps, the norms' REGISTER_ROW (kernels/norm.py), measured
# there; not re-measured for softmax.
REGISTER_ROW = 32768
WIDE_CHUNK = 4096


@triton.jit
def _safe(m):
    """The max to subtract: 0 where it is -inf (a lane or row that saw only -inf), so that exp(x - m) is 0, not NaN."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def _softmax_fwd(X, Y, M, N, stride_x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Y (M, N) contiguous = softmax of the rows of X (row stride stride_x, unit column stride)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - _safe(tl.max(x, axis=1))[:, None])
    d = tl.where(rmask, tl.sum(e, axis=1), 1.0)
    tl.store(Y + rows[:, None] * N + cols[None, :], (e / d[:, None]).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_wide(X, Y, N, stride_x, BLOCK_N: tl.constexpr):
    """One row a program, in BLOCK_N-column chunks: online max / sum per lane, then y."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    d = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        x = tl.load(X + row * stride_x + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        s = _safe(m_new)
        d = d * tl.exp(m - s) + tl.exp(x - s)
        m = m_new
    mr = tl.max(m, axis=0)
    dr = tl.sum(d * tl.exp(m - _safe(mr)), axis=0)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=cmask, other=float("-inf")).to(tl.float32)
        tl.store(Y + row * N + cols, (tl.exp(x - _safe(mr)) / dr).to(Y.dtype.element_ty), mask=cmask)


@triton.jit
def _softmax_bwd(DY, Y, DX, M, N, stride_dy, stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DX (M, N) contiguous = Y * (DY - sum(DY * Y)) per row."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(dy * y, axis=1)
    tl.store(DX + rows[:, None] * N + cols[None, :], (y * (dy - dot[:, None])).to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_wide(DY, Y, DX, N, stride_dy, stride_y, BLOCK_N: tl.constexpr):
    """One row a program, in BLOCK_N-column chunks: sum(dy * y), then dx."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        dy = tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32)
        acc += dy * tl.load(Y + row * stride_y + cols, mask=cmask, other=0.0).to(tl.float32)
    dot = tl.sum(acc, axis=0)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        dy = tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32)
        y = tl.load(Y + row * stride_y + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(DX + row * N + cols, (y * (dy - dot)).to(DX.dtype.element_ty), mask=cmask)


def _launch(kernel, wide_kernel, inputs: tuple, strides: tuple, out: torch.Tensor, M: int, N: int,
            configs: dict | None = None, constexprs: dict | None = None) -> None:
    """Run ``kernel(*inputs, out, M, N, *strides)`` on whole rows (``fwd_config``'s rows per program and warps, or
    ``configs[block_n]`` where given) or, for rows wider than REGISTER_ROW, ``wide_kernel(*inputs, out, N,
    *strides)`` on WIDE_CHUNK-column chunks (one row a program); ``constexprs``: more keyword arguments of both."""
    block_n = next_pow2(N)
    more = constexprs or {}
    if block_n <= REGISTER_ROW:
        block_m, warps = configs[block_n] if configs and block_n in configs else fwd_config(block_n, out.device)
        kernel[(cdiv(M, block_m),)](*inputs, out, M, N, *strides, BLOCK_M=block_m, BLOCK_N=block_n,
                                    num_warps=warps, **more)
    else:
        chunk = min(WIDE_CHUNK, block_n)
        wide_kernel[(M,)](*inputs, out, N, *strides, BLOCK_N=chunk, num_warps=warps_for(chunk), **more)


def softmax_forward(x: torch.Tensor) -> torch.Tensor:
    """Softmax of x (..., N) (any strides) over its last dimension: a new contiguous tensor of x's shape and dtype."""
    y = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    x2, M, sx = rows(x, "x")
    if M:
        _launch(_softmax_fwd, _softmax_fwd_wide, (x2,), (sx,), y, M, x.shape[-1])
    return y


def softmax_backward(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``y * (dy - sum(dy * y, -1))`` for the forward's output y and dy of y's shape (any strides): a new contiguous
    tensor of y's shape and dtype."""
    dx = torch.empty(size=y.shape, dtype=y.dtype, device=y.device)
    dy2, M, sdy = rows(dy, "grad_output")
    y2, _, sy = rows(y, "y")
    if M:
        _launch(_softmax_bwd, _softmax_bwd_wide, (dy2, y2), (sdy, sy), dx, M, y.shape[-1])
    return dx


# Eager autograd and the torch.compile custom ops tigon::softmax(_backward): see tigon.kernels.unary.
SoftmaxFunction, compiled_softmax = unary_op("softmax", softmax_forward, softmax_backward, saves="output")
