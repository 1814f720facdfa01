"""GroupNorm (Wu & He 2018, "Group Normalization"): Triton forward and backward.

X (B, C, *) is read as B*C channel rows of S = prod(*) positions (a view when X is contiguous). Group g of batch
row b holds the Cg = C / G channel rows ``b*C + g*Cg .. + Cg``, so N = Cg * S elements. With ``xhat = (x - mean_g)
* rstd_g``, ``rstd_g = 1/sqrt(var_g + eps)`` (biased variance) and ``g = dy * w[c]``:

    y = xhat * w[c] + b[c]
    dx = rstd_g * (g - xhat * c1_g - c2_g),   c1_g = sum_group(g * xhat) / N,   c2_g = sum_group(g) / N
    dw[c] = sum_{b, positions} dy * xhat        db[c] = sum_{b, positions} dy

Both directions are two passes over the channel rows, each a kernel of this module:

1. ``_channel_sums``: per channel row, forward its mean and the sum of squared deviations from it (two passes over
   the row, or one from registers when the row fits one tile), backward ``sum(dy)`` and ``sum(dy * xhat)``. The
   group statistics follow from the channels' by Chan et al.'s pairwise update (1979), ``M2_g = sum_c M2_c + S *
   sum_c (mean_c - mean_g)^2`` (no E[x^2] - E[x]^2 cancellation), and c1 / c2 as ``sum_c w[c] * sums_c``: small
   (B, C) tensor operations.
2. ``_channel_affine``: ``out = (x - m) * k1 + k0 [+ dy * k2]`` with fp32 coefficients per channel row (forward:
   ``k1 = rstd w``, ``k0 = b``; backward: ``k2 = rstd w``, ``k1 = -rstd^2 c1``, ``k0 = -rstd c2``), an elementwise
   pass tiled over rows and positions (:mod:`tigon.kernels.elementwise`).

dw and db are the (B, C) backward sums reduced over B by the norms' partial-sum kernel
(:func:`tigon.kernels.norm._sum_partials`: fixed order, deterministic, no atomics).

Bytes (M x N of e bytes): forward reads x twice (once when S fits a tile of ``_channel_sums``, whose second pass
then reads registers) and writes y: 3 M N e against the 2 M N e floor; backward reads x and dy twice and writes dx,
5 M N e against 3. Not measured on a GPU yet.
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
from .elementwise import launch_shape, tile
from .norm import _sum_partials

# Positions of a channel row ``_channel_sums`` reads per step (a row of S <= CHUNK positions is held in registers
# once); the interpreter takes rows of up to INTERPRET_CHUNK elements a step (its cost is per step). Not measured on a
# GPU: 4096 is the norms' and softmax's wide-row chunk (kernels/softmax.py's WIDE_CHUNK).
CHUNK = 4096
INTERPRET_CHUNK = 1 << 16


@triton.jit
def _channel_sums(X, DY, MEAN, RSTD, OUT1, OUT2, M, S, stride_x, stride_dy, HAS_DY: tl.constexpr,
                  SINGLE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr):
    """Per row of X (M rows of S, row stride stride_x, unit column stride): without DY, OUT1 = mean(x), OUT2 =
    sum((x - mean)^2); with DY (same layout, row stride stride_dy), OUT1 = sum(dy), OUT2 = sum(dy * (x - MEAN) *
    RSTD) for the row's group statistics MEAN, RSTD (M,). SINGLE: S <= BLOCK_S (one tile, held in registers)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < M
    offs = tl.arange(0, BLOCK_S)
    s1 = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
    s2 = tl.zeros([BLOCK_M, BLOCK_S], dtype=tl.float32)
    if HAS_DY:
        mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
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
def _channel_affine(X, DY, OUT, MEAN, K1, K0, K2, M, S, stride_x, stride_dy, HAS_DY: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """OUT (M, S) contiguous = (x - MEAN) * K1 + K0 [+ dy * K2], the coefficients fp32 per row (M,)."""
    rows, cols, mask = tile(M, S, BLOCK_M, BLOCK_N)
    rmask = rows < M
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
    k1 = tl.load(K1 + rows, mask=rmask, other=0.0)
    k0 = tl.load(K0 + rows, mask=rmask, other=0.0)
    out = (x - mean[:, None]) * k1[:, None] + k0[:, None]
    if HAS_DY:
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        out += dy * tl.load(K2 + rows, mask=rmask, other=0.0)[:, None]
    tl.store(OUT + rows[:, None] * S + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


# ---- launchers -----------------------------------------------------------------------------------------------------
def _channel_rows(x: torch.Tensor, name: str) -> tuple[torch.Tensor, int, int, int]:
    """(rows, M = B*C, S, row stride) of x (B, C, *) read as channel rows with unit column stride (a view when x's
    layout allows it, else a copy)."""
    S = math.prod(x.shape[2:])
    t, M, stride = rows(x.reshape(x.shape[0] * x.shape[1], S), name)
    return t, M, S, stride


def _sums(x2, dy2, mean, rstd, M, S, sx, sdy):
    """The two (M,) fp32 sums of ``_channel_sums`` (forward without dy2, backward with it)."""
    dev = x2.device
    out1 = torch.empty(M, dtype=torch.float32, device=dev)
    out2 = torch.empty(M, dtype=torch.float32, device=dev)
    block_s = min(next_pow2(S), CHUNK if compiled_cuda(dev) else INTERPRET_CHUNK)
    block_m = rows_per_program(block_s, dev)
    has_dy = dy2 is not None
    _channel_sums[(cdiv(M, block_m),)](
        x2, dy2 if has_dy else x2, mean if has_dy else out1, rstd if has_dy else out1, out1, out2, M, S, sx,
        sdy if has_dy else 0, HAS_DY=has_dy, SINGLE=S <= block_s, BLOCK_M=block_m, BLOCK_S=block_s,
        num_warps=warps_for(block_m * block_s))
    return out1, out2


def _affine(x2, dy2, out, mean, k1, k0, k2, M, S, sx, sdy):
    """``_channel_affine`` over (M, S), written into ``out`` (M * S elements, contiguous)."""
    block_m, block_n, warps, grid = launch_shape(M, S, x2.device)
    has_dy = dy2 is not None
    _channel_affine[grid](x2, dy2 if has_dy else x2, out, mean, k1, k0, k2 if has_dy else k0, M, S, sx,
                          sdy if has_dy else 0, HAS_DY=has_dy, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)


def _per_row(t: torch.Tensor, cg: int) -> torch.Tensor:
    """(B, G) group values -> (B*C,) one per channel row."""
    return t.unsqueeze(-1).expand(*t.shape, cg).reshape(-1)


def group_norm_forward(x: torch.Tensor, weight, bias, num_groups: int, eps: float):
    """GroupNorm of x (B, C, *) (any strides). Returns (y: x's shape and dtype, contiguous; x2: the (B*C, S) channel
    rows as the kernels read them, what the backward should read; mean, rstd: (B, G) fp32)."""
    B, C = x.shape[0], x.shape[1]
    cg = C // num_groups
    dev = x.device
    y = torch.empty(size=x.shape, dtype=x.dtype, device=dev)
    x2, M, S, sx = _channel_rows(x, "X")
    if M == 0:
        z = torch.zeros(B, num_groups, dtype=torch.float32, device=dev)
        return y, x2, z, z.clone()
    mean_c, m2_c = _sums(x2, None, None, None, M, S, sx, 0)
    mean_c, m2_c = mean_c.view(B, num_groups, cg), m2_c.view(B, num_groups, cg)
    mean = mean_c.mean(-1)
    m2 = m2_c.sum(-1) + S * (mean_c - mean.unsqueeze(-1)).square().sum(-1)
    rstd = torch.rsqrt(m2 / (cg * S) + eps)
    w = torch.ones(C, device=dev) if weight is None else weight.float()
    k1 = (rstd.unsqueeze(-1) * w.view(num_groups, cg)).reshape(-1)
    k0 = torch.zeros(C, device=dev) if bias is None else bias.float()
    _affine(x2, None, y, _per_row(mean, cg), k1, k0.repeat(B), None, M, S, sx, 0)
    return y, x2, mean, rstd


def group_norm_backward(dy, x2, weight, bias, mean, rstd, x_shape, need_dw: bool, need_db: bool):
    """Gradients of GroupNorm for dy (``x_shape``, any strides), the channel rows x2 (B*C, S) and the statistics
    mean, rstd (B, G) of the forward. Returns (dx: ``x_shape`` in x's dtype, contiguous; dw, db: (C,) in the weight's
    / bias's dtype, or None unless ``need_dw`` / ``need_db``)."""
    B, G = mean.shape
    C = x_shape[1]
    cg = C // G
    dev = x2.device
    x2, M, sx = rows(x2, "X")
    S = x2.shape[1]
    dy2, _, _, sdy = _channel_rows(dy, "grad_output")
    dx = torch.empty(size=x_shape, dtype=x2.dtype, device=dev)
    dw = torch.zeros(C, dtype=weight.dtype, device=dev) if need_dw else None
    db = torch.zeros(C, dtype=bias.dtype, device=dev) if need_db else None
    if M == 0:
        return dx, dw, db
    mean_r, rstd_r = _per_row(mean, cg), _per_row(rstd, cg)
    sum_dy, sum_dy_xhat = _sums(x2, dy2, mean_r, rstd_r, M, S, sx, sdy)
    w = torch.ones(C, device=dev) if weight is None else weight.float()
    n = cg * S
    c1 = (sum_dy_xhat.view(B, G, cg) * w.view(G, cg)).sum(-1) / n
    c2 = (sum_dy.view(B, G, cg) * w.view(G, cg)).sum(-1) / n
    k2 = (rstd.unsqueeze(-1) * w.view(G, cg)).reshape(-1)
    _affine(x2, dy2, dx, mean_r, _per_row(-rstd * rstd * c1, cg), _per_row(-rstd * c2, cg), k2, M, S, sx, sdy)
    if need_dw or need_db:
        block_cols = min(next_pow2(C), 32)  # as kernels/norm.py's launch of it
        _sum_partials[(cdiv(C, block_cols),)](
            sum_dy_xhat, sum_dy, dw if need_dw else db, db if need_db else dw, B, C, HAS_DW=need_dw, HAS_DB=need_db,
            BLOCK_P=min(next_pow2(B), 128), BLOCK_N=block_cols, num_warps=4)
    return dx, dw, db


class GroupNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(X, weight, bias, num_channels, num_groups, eps)`` with X (B, C, *), weight and bias
    (C,) or None. Saves the channel rows of X and the (B, G) fp32 statistics."""

    @staticmethod
    def forward(ctx, x, weight, bias, num_channels, num_groups, eps):
        y, x2, mean, rstd = group_norm_forward(x, weight, bias, num_groups, eps)
        ctx.save_for_backward(x2, weight, bias, mean, rstd)
        ctx.x_shape = x.shape
        return y

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, weight, bias, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = group_norm_backward(dy, x2, weight, bias, mean, rstd, ctx.x_shape, need[1] and weight is not None,
                                         need[2] and bias is not None)
        return dx if need[0] else None, dw, db, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::group_norm", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _group_norm(x: Tensor, weight: Tensor | None, bias: Tensor | None, num_groups: int,
                eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y: x's shape and dtype, contiguous; mean, rstd: (B, G) fp32)."""
    y, _, mean, rstd = group_norm_forward(x, weight, bias, num_groups, eps)
    return y, mean, rstd


@_group_norm.register_fake
def _(x, weight, bias, num_groups, eps):
    stats = x.new_empty((x.shape[0], num_groups), dtype=torch.float32)
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.custom_op("tigon::group_norm_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _group_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor,
                         rstd: Tensor, need_dw: bool, need_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype, contiguous; dw, db: (C,) in the weight's / bias's dtype, or (0,) unless ``need_dw`` /
    ``need_db``)."""
    dx, dw, db = group_norm_backward(dy, _channel_rows(x, "X")[0], weight, bias, mean, rstd, x.shape, need_dw,
                                     need_db)
    return dx, or_empty(dw, x), or_empty(db, x)


@_group_norm_backward.register_fake
def _(dy, x, weight, bias, mean, rstd, need_dw, need_db):
    C = x.shape[1]
    return (x.new_empty(x.shape), weight.new_empty((C,)) if need_dw else x.new_empty((0,)),
            bias.new_empty((C,)) if need_db else x.new_empty((0,)))


def _group_norm_setup(ctx, inputs, output):
    x, weight, bias, _groups, _eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])


def _group_norm_grad(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need = ctx.needs_input_grad
    need_dw, need_db = need[1] and weight is not None, need[2] and bias is not None
    dx, dw, db = _group_norm_backward(dy, x, weight, bias, mean, rstd, need_dw, need_db)
    return if_wanted(dx, need[0]), if_wanted(dw, need_dw), if_wanted(db, need_db), None, None


_group_norm.register_autograd(_group_norm_grad, setup_context=_group_norm_setup)


def compiled_group_norm(x, weight, bias, num_channels, num_groups, eps):
    """``GroupNormFunction.apply`` as the ``tigon::group_norm`` custom op: y (x's shape)."""
    return _group_norm(x, weight, bias, num_groups, eps)[0]
