"""The glue around a mixture-of-experts layer's two grouped matmuls: Triton forward and backward of the gather of the
routed tokens (:func:`tigon.functional.moe_gather`), the per-expert bias and gate between the matmuls
(:func:`tigon.functional.moe_expert_gate`) and the weighted combine after them (:func:`tigon.functional.moe_combine`).

Notation (transformers ``integrations/moe.py``, ``grouped_mm_experts_forward``): T tokens, each routed to k experts:
S = T k (token, slot) pairs, sorted by expert into rows 0..S-1. ``positions`` (T, k): the sorted row of pair (t, j)
(the inverse of the sort's permutation), so row ``positions[t, j]`` holds token t. ``offsets`` (E,): grouped_mm's
cumulative row counts, row s belongs to expert ``e(s) = #{e: offsets[e] <= s}`` (a binary search in the kernels); a
row at or past ``offsets[-1]`` (an expert-parallel sentinel row) belongs to no expert and gets no bias.

    gather:   xg[positions[t, j]] = x[t]                      backward: dx[t] = sum_j dxg[positions[t, j]]
    gate:     h[s] = act(gu[s] + b[e(s)])         backward: dgu = act'(...) dh,  db[e] = sum_{e(s)=e} dgu[s]
    combine:  out[t] = sum_j (y[p] + b[e(p)]) w[t, j],  p = positions[t, j]
              backward: dy[p] = w[t, j] dout[t],  dw[t, j] = <y[p] + b[e(p)], dout[t]>,  db[e] = sum_{e(s)=e} dy[s]

Two kernels move rows between token order and sorted order, each organised by tokens so that a token's row is read
(or written) once: :func:`_to_rows` (the gather's forward, the combine's backward, which also forms dw) and
:func:`_to_tokens` (the combine's forward, the gather's backward: a sum over the k slots in fp32, in slot order, no
atomics). :func:`_expert_gate_fwd` / :func:`_expert_gate_bwd` are the GLU kernels' math (:mod:`tigon.kernels.glu`'s
jitted helpers) with the bias added per row; :func:`_segment_sum` forms the bias gradients, one program per (expert,
column block) looping over the expert's rows (deterministic, fp32).

Math in fp32; outputs in the input dtypes (dw in the weights' dtype, db in the bias's); offsets int64 throughout.

Eager calls run the autograd Functions (:class:`MoEGatherFunction`, :class:`MoEExpertGateFunction`,
:class:`MoECombineFunction`); under torch.compile the same launchers run as the custom ops ``tigon::moe_gather``,
``tigon::moe_expert_gate``, ``tigon::moe_combine`` and their ``_backward`` ops (:mod:`.moe_glue_compiled`), where
:func:`tigon.support.compiled_choice` says "kernel".

Minimal bytes (e bytes per element, H columns, I = the gate's output width): gather fwd (T + S) H e, bwd (S + T) H e;
gate fwd 3 S I e (+ bias), bwd (1 + 2 + 2) S I e (+ the bias gradient's read of dgu, 2 S I e); combine fwd
(S + T) H e, bwd (T + 2 S) H e (+ dgu's read for the bias gradient, S H e).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import cdiv, launch_mode, next_pow2, warps_for
from .elementwise import TILE_ELEMS, _launch_shape, tile
from .first_order import once_differentiable
from .glu import ACTIVATIONS, _act, _act_and_grad, _clamp_gate_up, _load_pairs, _pair_cols

GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "clamped_swiglu")
"""The gate's activations: the GLUs on the concatenated [gate; up] halves, and GPT-OSS's clamped SwiGLU on
interleaved columns (the kernels' ``clamped_silu``)."""


@triton.jit
def _row_expert(rows, OFFS, E, STEPS: tl.constexpr):
    """The expert of each sorted row (int64, [BLOCK]): ``#{e: offsets[e] <= row}``, E for a row past the last
    offset. A binary search over the nondecreasing ``offsets`` (STEPS = E.bit_length() halvings)."""
    lo = tl.zeros_like(rows)
    hi = lo + E
    for _ in tl.static_range(STEPS):
        live = lo < hi
        mid = (lo + hi) // 2
        v = tl.load(OFFS + mid, mask=live, other=0).to(tl.int64)
        go = live & (v <= rows)
        lo = tl.where(go, mid + 1, lo)
        hi = tl.where(live & (v > rows), mid, hi)
    return lo


# ---------------------------------------------------------------------------------------------------------- gate
@triton.jit
def _load_gate_up(GU, BIAS, OFFS, rows, cols, mask, M, N, E, stride_gu, stride_b,
                  HAS_BIAS: tl.constexpr, INTERLEAVED: tl.constexpr, STEPS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(gate, up) of this tile in fp32 with the row's expert bias added: interleaved columns (GPT-OSS: gate the even
    ones) or the two halves [gate; up] of each row."""
    if INTERLEAVED:
        g, u = _load_pairs(GU, rows, stride_gu, M, N, BLOCK_M, BLOCK_N)
    else:
        base = GU + rows[:, None] * stride_gu + cols[None, :]
        g = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(base + N, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        e = _row_expert(rows, OFFS, E, STEPS)
        e = tl.where(rows < M, e, E)  # rows past the end, and rows of no expert, read no bias (e == E: masked)
        if INTERLEAVED:
            bg, bu = _load_pairs(BIAS, e, stride_b, E, N, BLOCK_M, BLOCK_N)
        else:
            bmask = (e < E)[:, None] & mask
            bbase = BIAS + e[:, None] * stride_b + cols[None, :]
            bg = tl.load(bbase, mask=bmask, other=0.0).to(tl.float32)
            bu = tl.load(bbase + N, mask=bmask, other=0.0).to(tl.float32)
        g += bg
        u += bu
    return g, u


@triton.jit
def _expert_gate_fwd(
    GU,  # (M, 2N) sorted rows of the up grouped matmul, unit column stride, row stride stride_gu
    BIAS,  # (E, 2N) per-expert bias, unit column stride (unused without HAS_BIAS)
    OFFS,  # (E,) cumulative rows per expert (int32 / int64)
    OUT,  # (M, N) output, contiguous
    M, N, E, stride_gu, stride_b, alpha, limit,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, INTERLEAVED: tl.constexpr, CLAMP: tl.constexpr,
    STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    # alpha, limit: GPT-OSS's sigmoid slope and clamp (ACTIVATION 3), or DeepSeek-V4's clamp (CLAMP) on a GLU
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    g, u = _load_gate_up(GU, BIAS, OFFS, rows, cols, mask, M, N, E, stride_gu, stride_b, HAS_BIAS, INTERLEAVED,
                         STEPS, BLOCK_M, BLOCK_N)
    if ACTIVATION == 3 or CLAMP:
        g, u = _clamp_gate_up(g, u, limit)
        if ACTIVATION == 3:
            u = u + 1.0
    out = _act(g, alpha, ACTIVATION) * u
    tl.store(OUT + rows[:, None] * N + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _expert_gate_bwd(
    DY,  # (M, N) upstream gradient, unit column stride, row stride stride_dy
    GU, BIAS, OFFS,  # as _expert_gate_fwd's
    DGU,  # (M, 2N) gradient of GU, contiguous, laid out as GU (interleaved or halves)
    M, N, E, stride_dy, stride_gu, stride_b, alpha, limit,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, INTERLEAVED: tl.constexpr, CLAMP: tl.constexpr,
    STEPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """d(gu + b) = dgu, as :func:`tigon.kernels.glu._glu_bwd` forms it (gm = dm = 1): the clamps pass gradient
    inside their closed intervals only."""
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g, u = _load_gate_up(GU, BIAS, OFFS, rows, cols, mask, M, N, E, stride_gu, stride_b, HAS_BIAS, INTERLEAVED,
                         STEPS, BLOCK_M, BLOCK_N)
    if ACTIVATION == 3 or CLAMP:
        in_g = g <= limit
        in_u = (u >= -limit) & (u <= limit)
        g, u = _clamp_gate_up(g, u, limit)
        if ACTIVATION == 3:
            u = u + 1.0
        a, da = _act_and_grad(g, alpha, ACTIVATION)
        da = tl.where(in_g, da, 0.0)
        a_up = tl.where(in_u, a, 0.0)
    else:
        a, da = _act_and_grad(g, alpha, ACTIVATION)
        a_up = a
    dg = dy * u * da
    du = dy * a_up
    if INTERLEAVED:  # one contiguous [BLOCK_M, 2 BLOCK_N] store, interleaved as gate_up is
        cols2, mask2 = _pair_cols(rows, M, N, BLOCK_N)
        d = tl.reshape(tl.join(dg, du), [BLOCK_M, 2 * BLOCK_N])
        tl.store(DGU + rows[:, None] * (2 * N) + cols2[None, :], d.to(DGU.dtype.element_ty), mask=mask2)
    else:
        base = DGU + rows[:, None] * (2 * N) + cols[None, :]
        tl.store(base, dg.to(DGU.dtype.element_ty), mask=mask)
        tl.store(base + N, du.to(DGU.dtype.element_ty), mask=mask)


@triton.jit
def _segment_sum(
    SRC,  # (S, N) sorted rows, unit column stride, row stride stride_src
    OFFS,  # (E,) cumulative rows per expert
    OUT,  # (E, N) per-expert sums, contiguous
    M, N, stride_src, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``OUT[e] = sum of SRC's rows offsets[e-1] .. offsets[e]-1`` in fp32, in row order within each lane
    (deterministic), one program per (expert, column block). The bounds are clamped to [0, M] (M = SRC's rows): an
    offset past the rows or below 0 (unchecked CUDA offsets) reads nothing out of bounds."""
    n_col_blocks = tl.cdiv(N, BLOCK_N)
    e = tl.program_id(0) // n_col_blocks
    cols = (tl.program_id(0) % n_col_blocks).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    end = tl.minimum(tl.maximum(tl.load(OFFS + e).to(tl.int64), 0), M)
    start = tl.minimum(tl.maximum(tl.load(OFFS + e - 1, mask=e > 0, other=0).to(tl.int64), 0), M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r in range(start, end, BLOCK_M):
        rows = r + tl.arange(0, BLOCK_M).to(tl.int64)
        m = (rows < end)[:, None] & cmask[None, :]
        acc += tl.load(SRC + rows[:, None] * stride_src + cols[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(OUT + e.to(tl.int64) * N + cols, tl.sum(acc, axis=0).to(OUT.dtype.element_ty), mask=cmask)


# ------------------------------------------------------------------------------------------ token <-> sorted rows
@triton.jit
def _to_tokens(
    SRC,  # (S, N) sorted rows, unit column stride, row stride stride_src
    POS,  # (T, K) sorted row of each (token, slot), contiguous
    W,  # (T, K) weights, contiguous (unused without HAS_W)
    BIAS,  # (E, N) per-expert bias, unit column stride (unused without HAS_BIAS)
    OFFS,  # (E,) cumulative rows per expert (unused without HAS_BIAS)
    OUT,  # (T, N) output, contiguous
    T, N, E, stride_src, stride_b,
    K: tl.constexpr, HAS_W: tl.constexpr, HAS_BIAS: tl.constexpr, STEPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``OUT[t] = sum_j (SRC[p] + BIAS[e(p)]) * W[t, j]`` (p = POS[t, j]; W = 1 without HAS_W), the k slots summed in
    fp32 in slot order: the combine's forward, the gather's backward."""
    rows, cols, mask = tile(T, N, BLOCK_M, BLOCK_N)
    rmask = rows < T
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(K):
        p = tl.load(POS + rows * K + j, mask=rmask, other=0).to(tl.int64)
        pmask = mask & ((p >= 0) & (p < T * K))[:, None]  # (a position out of range reads nothing)
        v = tl.load(SRC + p[:, None] * stride_src + cols[None, :], mask=pmask, other=0.0).to(tl.float32)
        if HAS_BIAS:
            e = _row_expert(p, OFFS, E, STEPS)
            v += tl.load(BIAS + e[:, None] * stride_b + cols[None, :], mask=pmask & (e < E)[:, None],
                         other=0.0).to(tl.float32)
        if HAS_W:
            v = v * tl.load(W + rows * K + j, mask=rmask, other=0.0).to(tl.float32)[:, None]
        acc += v
    tl.store(OUT + rows[:, None] * N + cols[None, :], acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _to_rows(
    SRC,  # (T, N) token rows, unit column stride, row stride stride_src
    POS,  # (T, K) sorted row of each (token, slot), contiguous
    W,  # (T, K) weights, contiguous (unused without HAS_W)
    X,  # (S, N) the combine's input, unit column stride, row stride stride_x (DOT only)
    BIAS, OFFS,  # (E, N) bias, unit column stride, and the (E,) offsets (DOT with HAS_BIAS only)
    DST,  # (S, N) output, contiguous
    DW,  # (T, K) output <X[p] + BIAS[e(p)], SRC[t]>, contiguous (DOT only)
    T, N, E, stride_src, stride_x, stride_b,
    K: tl.constexpr, HAS_W: tl.constexpr, DOT: tl.constexpr, HAS_BIAS: tl.constexpr, STEPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """``DST[p] = SRC[t] * W[t, j]`` for p = POS[t, j] (W = 1 without HAS_W): the gather's forward; with DOT also
    ``DW[t, j] = <X[p] + BIAS[e(p)], SRC[t]>`` in fp32: the combine's backward. Without DOT a program is one
    [BLOCK_M, BLOCK_N] tile; with DOT it takes BLOCK_M whole rows (the dot products span every column), reading each
    token's SRC row once per slot (a re-read of the program's own rows: cache hits)."""
    if DOT:
        rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < T
        for j in tl.static_range(K):
            p = tl.load(POS + rows * K + j, mask=rmask, other=0).to(tl.int64)
            prmask = rmask & (p >= 0) & (p < T * K)  # (a position out of range is neither read nor written)
            w = tl.load(W + rows * K + j, mask=rmask, other=0.0).to(tl.float32)
            if HAS_BIAS:
                e = _row_expert(p, OFFS, E, STEPS)
            acc = tl.zeros([BLOCK_M], dtype=tl.float32)
            for c in range(0, N, BLOCK_N):
                cols = c + tl.arange(0, BLOCK_N).to(tl.int64)
                mask = rmask[:, None] & (cols < N)[None, :]
                pmask = prmask[:, None] & (cols < N)[None, :]
                s = tl.load(SRC + rows[:, None] * stride_src + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                x = tl.load(X + p[:, None] * stride_x + cols[None, :], mask=pmask, other=0.0).to(tl.float32)
                if HAS_BIAS:
                    x += tl.load(BIAS + e[:, None] * stride_b + cols[None, :], mask=pmask & (e < E)[:, None],
                                 other=0.0).to(tl.float32)
                acc += tl.sum(x * s, axis=1)
                tl.store(DST + p[:, None] * N + cols[None, :], (s * w[:, None]).to(DST.dtype.element_ty), mask=pmask)
            tl.store(DW + rows * K + j, acc.to(DW.dtype.element_ty), mask=rmask)
    else:
        rows, cols, mask = tile(T, N, BLOCK_M, BLOCK_N)
        rmask = rows < T
        s = tl.load(SRC + rows[:, None] * stride_src + cols[None, :], mask=mask, other=0.0)
        for j in tl.static_range(K):
            p = tl.load(POS + rows * K + j, mask=rmask, other=0).to(tl.int64)
            if HAS_W:
                w = tl.load(W + rows * K + j, mask=rmask, other=0.0).to(tl.float32)
                v = (s.to(tl.float32) * w[:, None]).to(DST.dtype.element_ty)
            else:
                v = s.to(DST.dtype.element_ty)
            tl.store(DST + p[:, None] * N + cols[None, :], v, mask=mask & ((p >= 0) & (p < T * K))[:, None])


# ----------------------------------------------------------------------------------------------------- launchers
def _steps(offsets: torch.Tensor | None) -> int:
    """The binary search's halvings for ``offsets`` (E,): E.bit_length()."""
    return 0 if offsets is None else int(offsets.shape[0]).bit_length()


def _rows2d(t: torch.Tensor) -> torch.Tensor:
    """``t`` (M, N) with unit column stride (a copy only when it has none)."""
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def _dense(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` contiguous (None stays None; a copy only when it is not)."""
    return t if t is None or t.is_contiguous() else t.contiguous()


def to_tokens(src: torch.Tensor, positions: torch.Tensor, weights: torch.Tensor | None = None,
              bias: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
              out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """(T, N) ``sum_j (src[p] + bias[e(p)]) * weights[t, j]`` (p = positions[t, j]) in ``out_dtype`` (src's)."""
    T, K = positions.shape
    N = src.shape[1]
    out = torch.empty((T, N), dtype=out_dtype or src.dtype, device=src.device)
    if out.numel() == 0:
        return out.zero_()
    src = _rows2d(src)
    pos = _dense(positions)
    w = _dense(weights) if weights is not None else pos
    b = _rows2d(bias) if bias is not None else src
    offs = _dense(offsets) if offsets is not None else pos
    mode = launch_mode(src.device)
    block_m, block_n, warps, grid = _launch_shape(T, N, TILE_ELEMS[mode.compiled])
    mode[_to_tokens][grid](src, pos, w, b, offs, out, T, N, 0 if offsets is None else offsets.shape[0], src.stride(0),
                           b.stride(0), K=K, HAS_W=weights is not None, HAS_BIAS=bias is not None,
                           STEPS=_steps(offsets), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return out


def to_rows(src: torch.Tensor, positions: torch.Tensor, weights: torch.Tensor | None = None,
            x: torch.Tensor | None = None, bias: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
            out_dtype: torch.dtype | None = None):
    """(dst, dw): dst (S, N) with ``dst[p] = src[t] * weights[t, j]`` in ``out_dtype`` (src's); with ``x`` also
    dw (T, K) ``<x[p] + bias[e(p)], src[t]>`` in the weights' dtype (else None)."""
    T, K = positions.shape
    N = src.shape[1]
    dst = torch.empty((T * K, N), dtype=out_dtype or src.dtype, device=src.device)
    dot = x is not None
    dw = torch.empty((T, K), dtype=weights.dtype, device=src.device) if dot else None
    if T * K == 0:
        return dst, dw
    if N == 0:
        return dst, (dw.zero_() if dot else None)
    src = _rows2d(src)
    pos = _dense(positions)
    w = _dense(weights) if weights is not None else pos
    xx = _rows2d(x) if dot else src
    b = _rows2d(bias) if bias is not None else src
    offs = _dense(offsets) if offsets is not None else pos
    mode = launch_mode(src.device)
    target = TILE_ELEMS[mode.compiled]
    if dot:  # whole rows per program: columns in blocks of at most 1024 (compiled), rows to fill the tile
        block_n = min(next_pow2(N), target if not mode.compiled else 1024)
        block_m = min(next_pow2(T), max(1, target // block_n))
        warps, grid = warps_for(block_m * block_n), (cdiv(T, block_m),)
    else:
        block_m, block_n, warps, grid = _launch_shape(T, N, target)
    mode[_to_rows][grid](src, pos, w, xx, b, offs, dst, dw if dot else pos, T, N,
                         0 if offsets is None else offsets.shape[0], src.stride(0), xx.stride(0), b.stride(0), K=K,
                         HAS_W=weights is not None, DOT=dot, HAS_BIAS=dot and bias is not None,
                         STEPS=_steps(offsets), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return dst, dw


def segment_sum(src: torch.Tensor, offsets: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(E, N) per-expert sums of the sorted rows of ``src`` (S, N), in ``dtype``."""
    E, N = offsets.shape[0], src.shape[1]
    out = torch.empty((E, N), dtype=dtype, device=src.device)
    if out.numel() == 0:
        return out
    if src.shape[0] == 0:
        return out.zero_()
    src = _rows2d(src)
    offs = _dense(offsets)
    mode = launch_mode(src.device)
    target = TILE_ELEMS[mode.compiled]
    block_n = min(next_pow2(N), 128 if mode.compiled else target)  # 128 columns: E x N/128 programs fill the GPU
    block_m = max(1, min(target // block_n, 32 if mode.compiled else target))
    mode[_segment_sum][(E * cdiv(N, block_n),)](src, offs, out, src.shape[0], N, src.stride(0), BLOCK_M=block_m,
                                                BLOCK_N=block_n, num_warps=warps_for(block_m * block_n))
    return out


def expert_gate_forward(gate_up: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None, activation: str,
                        alpha: float, limit: float | None) -> torch.Tensor:
    """(S, I) ``act(gate_up + bias[e(s)])``; ``activation`` in :data:`GATE_ACTIVATIONS`."""
    S, N = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((S, N), dtype=gate_up.dtype, device=gate_up.device)
    if out.numel() == 0:
        return out
    gu = _rows2d(gate_up)
    b = _rows2d(bias) if bias is not None else gu
    offs = _dense(offsets)
    mode = launch_mode(gu.device)
    block_m, block_n, warps, grid = _launch_shape(S, N, TILE_ELEMS[mode.compiled])
    scalars, meta = _gate_launch_args(activation, alpha, limit, bias, offsets)
    mode[_expert_gate_fwd][grid](gu, b, offs, out, S, N, offsets.shape[0], gu.stride(0), b.stride(0), *scalars,
                                 **meta, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    return out


def _gate_launch_args(activation: str, alpha: float, limit: float | None, bias, offsets) -> tuple[tuple, dict]:
    """The gate kernels' trailing ``(alpha, limit)`` fp32 scalars and their constexpr options (activation, bias,
    interleaved columns, DeepSeek-V4's clamp, the binary search's steps)."""
    interleaved = activation == "clamped_swiglu"
    meta = dict(ACTIVATION=ACTIVATIONS["clamped_silu" if interleaved else activation], HAS_BIAS=bias is not None,
                INTERLEAVED=interleaved, CLAMP=limit is not None and not interleaved, STEPS=_steps(offsets))
    return (float(alpha), 0.0 if limit is None else float(limit)), meta


def expert_gate_backward(dy: torch.Tensor, gate_up: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None,
                         activation: str, alpha: float, limit: float | None, need_bias: bool):
    """(d_gate_up (S, 2I) contiguous in gate_up's dtype, d_bias (E, 2I) in the bias's dtype or None)."""
    S, N = gate_up.shape[0], gate_up.shape[1] // 2
    dgu = torch.empty((S, 2 * N), dtype=gate_up.dtype, device=gate_up.device)
    if dgu.numel() != 0:
        gu, d2 = _rows2d(gate_up), _rows2d(dy)
        b = _rows2d(bias) if bias is not None else gu
        offs = _dense(offsets)
        mode = launch_mode(gu.device)
        block_m, block_n, warps, grid = _launch_shape(S, N, TILE_ELEMS[mode.compiled])
        scalars, meta = _gate_launch_args(activation, alpha, limit, bias, offsets)
        mode[_expert_gate_bwd][grid](d2, gu, b, offs, dgu, S, N, offsets.shape[0], d2.stride(0), gu.stride(0),
                                     b.stride(0), *scalars, **meta, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps)
    db = segment_sum(dgu, offsets, bias.dtype) if need_bias else None
    return dgu, db


def combine_backward(dout: torch.Tensor, x: torch.Tensor, weights: torch.Tensor, positions: torch.Tensor,
                     offsets: torch.Tensor | None, bias: torch.Tensor | None, need_w: bool, need_bias: bool):
    """The combine's gradients for dout (T, H): (dx (T*k, H) contiguous in x's dtype, formed whether or not x
    needs it (d_bias sums it); dw (T, k) in the weights' dtype or None unless ``need_w``; d_bias (E, H) in the
    bias's dtype or None unless ``need_bias`` and a bias)."""
    dx, dw = to_rows(dout, positions, weights, x if need_w else None, bias, offsets, out_dtype=x.dtype)
    db = segment_sum(dx, offsets, bias.dtype) if need_bias and bias is not None else None
    return dx, dw, db


# ---------------------------------------------------------------------------------------------- autograd wrappers
class MoEGatherFunction(torch.autograd.Function):
    """``apply(x, positions)``: (S, H) rows ``out[positions[t, j]] = x[t]``; backward sums each token's k rows."""

    @staticmethod
    def forward(ctx, x, positions):
        ctx.save_for_backward(positions)
        return to_rows(x, positions)[0]

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        (positions,) = ctx.saved_tensors
        return to_tokens(dout, positions), None


class MoEExpertGateFunction(torch.autograd.Function):
    """``apply(gate_up, offsets, bias, activation, alpha, limit)``: (S, I) ``act(gate_up + bias[e(s)])``; saves
    gate_up (and the bias), recomputes the activation in the backward."""

    @staticmethod
    def forward(ctx, gate_up, offsets, bias, activation, alpha, limit):
        ctx.save_for_backward(gate_up, offsets, bias)
        ctx.activation, ctx.alpha, ctx.limit = activation, alpha, limit
        return expert_gate_forward(gate_up, offsets, bias, activation, alpha, limit)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        gate_up, offsets, bias = ctx.saved_tensors
        need_bias = bias is not None and ctx.needs_input_grad[2]
        dgu, db = expert_gate_backward(dy, gate_up, offsets, bias, ctx.activation, ctx.alpha, ctx.limit, need_bias)
        return dgu, None, db, None, None, None


class MoECombineFunction(torch.autograd.Function):
    """``apply(x, weights, positions, offsets, bias)``: (T, H) ``sum_j (x[p] + bias[e(p)]) * weights[t, j]``."""

    @staticmethod
    def forward(ctx, x, weights, positions, offsets, bias):
        ctx.save_for_backward(x, weights, positions, offsets, bias)
        return to_tokens(x, positions, weights, bias, offsets)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        x, weights, positions, offsets, bias = ctx.saved_tensors
        need_x, need_w, _, _, need_b = ctx.needs_input_grad
        dx, dw, db = combine_backward(dout, x, weights, positions, offsets, bias, need_w, need_b)
        return (dx if need_x else None), dw, None, None, db
