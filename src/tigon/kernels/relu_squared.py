"""Squared ReLU (So et al. 2021, "Primer"): Triton forward and backward.

``y = relu(x)^2`` and ``dx = 2 relu(x) dy``, elementwise in fp32 registers, one rounding to x's dtype per output
(the same single rounding as torch's ``square(relu(x))``: relu is exact). The backward reads x (saved, not y):
nothing else is kept between forward and backward.

Tiles and views come from :mod:`tigon.kernels.elementwise` (int64 offsets; contiguous tensors read as one long row;
rows of any row stride with unit column stride read in place). The launch (4096-element tiles, 8 warps) is the GLU
kernels' (``launch_shape``), measured there at 102% of the H200's copy bandwidth for SwiGLU; not re-measured for this
op, which moves fewer bytes per element but has the same access pattern.

Minimal bytes (n elements of e bytes): forward 2 n e (read x, write y); backward 3 n e (read dy, x; write dx).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .elementwise import as_2d, launch_shape, tile
from .unary import unary_op


@triton.jit
def _relu_squared_fwd(X, Y, M, N, stride_x, stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Y = relu(X)^2 over an (M, N) tile grid; stride_*: elements between rows (columns have unit stride)."""
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    r = tl.maximum(tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], (r * r).to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _relu_squared_bwd(DY, X, DX, M, N, stride_dy, stride_x, stride_dx, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    """DX = 2 relu(X) DY (DY: upstream gradient, X: the forward's input)."""
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    r = tl.maximum(tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32), 0.0)
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], (2.0 * r * dy).to(DX.dtype.element_ty), mask=mask)


def relu_squared_forward(x: torch.Tensor) -> torch.Tensor:
    """``relu(x)^2``: a new contiguous tensor of x's shape and dtype (x: any strides)."""
    y = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    M, N, (x2, y2), (sx, sy) = as_2d(x=x, out=y)
    block_m, block_n, warps, grid = launch_shape(M, N, x.device)
    _relu_squared_fwd[grid](x2, y2, M, N, sx, sy, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return y


def relu_squared_backward(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``2 relu(x) dy``: a new contiguous tensor of x's shape and dtype (dy: x's shape, any strides)."""
    dx = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    if dx.numel() == 0:
        return dx
    M, N, (dy2, x2, dx2), (sdy, sx, sdx) = as_2d(grad_output=dy, x=x, dx=dx)
    block_m, block_n, warps, grid = launch_shape(M, N, x.device)
    _relu_squared_bwd[grid](dy2, x2, dx2, M, N, sdy, sx, sdx, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return dx


# Eager autograd and the torch.compile custom ops tigon::relu_squared(_backward): see tigon.kernels.unary.
ReLUSquaredFunction, compiled_relu_squared = unary_op("relu_squared", relu_squared_forward, relu_squared_backward,
                                                     saves="input")
