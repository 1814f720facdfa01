"""RMSNorm: Triton forward and backward (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm semantics).

Forward: one pass, a [BLOCK_M, BLOCK_N] tile of rows per program, fp32 math, writes y and rstd (M floats).
Backward: a persistent grid; each program walks a contiguous range of rows, writes dx, and accumulates its
share of dW in registers; the (programs, N) fp32 partials are then summed by one small reduction. No atomics,
so dW is deterministic.

Minimal bytes (bf16): forward 2*M*N*2 (read x, write y); backward 3*M*N*2 (read x, dy, write dx).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import as_rows, check_row_width, next_pow2, num_programs_hint, rows_per_program, warps_for

_CASTING = {"llama": 0, "gemma": 1, "none": 2}


@triton.jit
def _rms_norm_fwd(
    X, W, Y, RSTD, M, N, stride_x, stride_y, eps, offset,
    CASTING: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    mask = rmask[:, None] & cmask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
    xhat = x * rstd[:, None]
    if CASTING == 0:  # llama: round the normalised value to x's dtype before the weight multiply
        xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
    y = xhat * w[None, :]
    tl.store(Y + rows64[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=rmask)


@triton.jit
def _rms_norm_bwd(
    DY, X, W, RSTD, DX, DW_PART, M, N, stride_dy, stride_x, stride_dx, offset, rows_per_prog,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    row_start = pid * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    for r in range(row_start, row_end, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M)
        rmask = rows < row_end
        mask = rmask[:, None] & cmask[None, :]
        rows64 = rows.to(tl.int64)
        x = tl.load(X + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + rows64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        xhat = x * rstd[:, None]
        dyw = dy * w[None, :]
        c = tl.sum(dyw * xhat, axis=1) / N
        dx = rstd[:, None] * (dyw - xhat * c[:, None])
        tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * xhat, axis=0)
    tl.store(DW_PART + pid.to(tl.int64) * N + cols, dw, mask=cmask)


def rms_norm_forward(x2: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, casting_mode: str):
    """Launch the forward on rows ``x2`` (M, N). Returns (y (M, N), rstd (M,) fp32)."""
    M, N = x2.shape
    check_row_width(N, "rms_norm")
    if casting_mode == "gemma":
        out_dtype = x2.dtype
    else:
        out_dtype = torch.promote_types(x2.dtype, weight.dtype)
    y = torch.empty((M, N), dtype=out_dtype, device=x2.device)
    rstd = torch.empty((M,), dtype=torch.float32, device=x2.device)
    block_n = next_pow2(N)
    block_m = rows_per_program(block_n, x2.device)
    grid = (triton.cdiv(M, block_m),)
    _rms_norm_fwd[grid](
        x2, weight, y, rstd, M, N, x2.stride(0), y.stride(0), eps, offset,
        CASTING=_CASTING[casting_mode], BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps_for(block_m * block_n),
    )
    return y, rstd


def rms_norm_backward(dy: torch.Tensor, x2: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, offset: float):
    """Launch the backward. Returns (dx (M, N) in x's dtype, dw (N,) in weight's dtype)."""
    M, N = x2.shape
    dy = as_rows(dy, "grad_output")
    dx = torch.empty_like(x2)
    block_n = next_pow2(N)
    block_m = rows_per_program(block_n, x2.device, target_elems=2048)
    progs = max(1, min(num_programs_hint(x2.device), triton.cdiv(M, block_m)))
    per_prog = triton.cdiv(triton.cdiv(M, progs), block_m) * block_m
    progs = triton.cdiv(M, per_prog)
    dw_part = torch.empty((progs, N), dtype=torch.float32, device=x2.device)
    _rms_norm_bwd[(progs,)](
        dy, x2, weight, rstd, dx, dw_part, M, N, dy.stride(0), x2.stride(0), dx.stride(0), offset, per_prog,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps_for(block_m * block_n),
    )
    return dx, dw_part.sum(0).to(weight.dtype)


class RMSNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, weight, eps, offset, casting_mode)`` with x (..., N), weight (N,)."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode):
        shape = x.shape
        x2 = as_rows(x, "x")
        y, rstd = rms_norm_forward(x2, weight, eps, offset, casting_mode)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.offset = offset
        ctx.x_shape = shape
        return y.view(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x2, weight, rstd, ctx.offset)
        return dx.view(ctx.x_shape), (dw if ctx.needs_input_grad[1] else None), None, None, None
