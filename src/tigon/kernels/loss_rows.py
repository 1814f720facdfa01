"""The row kernels of the cross-entropy losses: Triton forward and backward over rows of logits, vocabulary looped in
blocks, and their launchers. Shared by the cross-entropy op and the fused LM-head loss (which runs them on its chunks
of logits).

Formula and semantics: the cross-entropy reference in :mod:`tigon.reference` (torch's label smoothing and class
weights, PaLM z-loss, Gemma 2 soft-capping, plus a ``logit_scale`` used by the fused linear op).

Forward (one read of the logits): each program owns ``BLOCK_M`` rows and walks the vocabulary in ``BLOCK_V``
columns, keeping a running max and rescaled sum of exponentials (the online log-sum-exp of Milakov &
Gimelshein 2018), the weighted logit sum needed by label smoothing and the running argmax. It writes per-row
loss, z-loss, the row's statistics ``(m, log s)``: its max and the log of its sum of exp(x - m), lse = m + log s
((N, 2) fp32), and a correct-prediction flag; with ``STORE_PRED`` also the argmax class itself (int64, -1 for an
ignored row: Liger-Kernel's predicted tokens). With ``WRITE_GRAD`` it makes a second pass over the row and writes
``coef * d loss_row / d logits`` (the fused linear op uses this on its chunk buffer, in place).

Token scaling (``TOKEN_SCALING``, Liger-Kernel's ``use_token_scaling``): the row's loss and z term are multiplied by
the target's probability ``p_t = exp(x_t - lse)``, a constant of the gradient (detached), so the gradient below is
multiplied by p_t too (a and a_z scaled per row, in the forward's gradient pass and in the backward, which recomputes
p_t from the target logit and the saved statistics).

Accuracy: the loss is formed as (m - x_t) + log s and the probabilities as exp((x - m) - log s), the max subtracted
first as in torch's log_softmax, so a confident token's loss (far below the logits) carries an error of its own
size. Forming lse - x_t and exp(x - lse) cost an ulp of lse instead: 37x torch's fp32 error on the loss and 16x on
the gradient for logits (30, 38) (tests/test_properties.py, the confident-token test).

Backward (one read, one write of the logits): recomputes the softmax from the saved row statistics with the per-token
upstream gradient (a 0-d tensor broadcast with stride 0 for mean/sum, an (N,) tensor for reduction="none").

Gradient per row, with p = softmax(x), a the upstream coefficient, eps the smoothing, w class weights, s the
z-loss coefficient and a_z the z-loss's own upstream coefficient (a, except for reduction="mean" with class weights,
where the cross-entropy part is divided by the target weights' sum and the z-loss by the token count):
    dL/dx_c = a * [p_c * ((1-eps) w_t + eps/V * sum(w)) - (1-eps) w_t [c == t] - eps/V * w_c] + a_z * 2 s lse p_c
then times ``logit_scale * (1 - tanh^2)`` for the soft-cap (from exp(-2|u|): :func:`_transform_slope`).

Minimal bytes (bf16 logits): forward N*V*2, backward 2*N*V*2. Rows of ignored tokens are never read: the forward
skips them, the gradient's pass writes their zeros (as Liger-Kernel does; 10% of the bench's tokens are ignored).

Targets outside [0, V) other than ignore_index are never read out of bounds (masked); their loss is NaN and the
forward records them for :mod:`tigon.kernels.target_check`, which raises at the next launch of a loss kernel (no
device sync; the functional API also checks CPU targets up front).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from . import target_check
from ._common import cdiv, compiled_cuda, launcher, next_pow2, rows_per_program, sm_count, warps_for

# Largest vocabulary block one program loads per step. Rows longer than this are walked in several steps
# (online log-sum-exp), so any vocabulary size works. 8192 elements is a [1, 8192] fp32 tile, 32 values per
# thread with 8 warps. Measured on an H200 (N=8192, V=128256, bf16; forward / forward+backward):
# 2048: 0.76 / 1.87 ms, 4096: 0.68 / 1.75, 8192: 0.64 / 1.71, 16384: 0.72 / 1.77, 32768: 0.88 / 1.96 ms.
# At 8192 the forward moves 3.3 TB/s and forward+backward 3.7 TB/s (3 passes of N*V*2 bytes) against ~4.3 TB/s
# copy bandwidth; torch's loss on logits.float() takes 6.9 / 13.5 ms. Tests lower it to exercise the loop.
MAX_BLOCK_V = 8192

# grad_in_forward on CUDA: (vocabulary block, num_warps, reverse) of the forward that also writes the gradient, for
# rows at least that wide (one row per program); reverse: its second pass over a row goes last block first, so the
# blocks it read last come first, while they may still be in L2. H200, V = 128256 bf16, fwd+bwd: at (8192, 8),
# first block first against last block first, alternating twice (session8/tune12_ce_reverse_ab.json): 8k tokens
# 1.511 / 1.629 against 1.440 / 1.484 ms, 64k 11.779 / 11.779 against 11.209 / 11.207. Across blocks at 8k / 32k /
# 64k (session8/tune11_ce_order.json, ignored rows still read then): (8192, 8, reverse) 1.520 / 5.975 / 11.916 ms,
# (16384, 16, reverse) 1.548 / 6.067 / 12.123, (32768, 32) 1.570 / 6.196 / 12.130 first block first (session 7's
# choice) and 1.636 at 8k last block first; Liger-Kernel 1.938 / 6.463 / 12.180 in the same call. Holding the last
# block in registers (no re-read of it) was slower: 1.80-1.94 ms at 8k (registers cost resident programs).
# Fourth and fifth fields (ce_rows_forward): L2 eviction hints of the two passes and the stores, and a grid capped at
# k programs per SM (benchmarks/tune.py's cross_entropy study 2). H200, 8k tokens, kernel time, one run
# (session22/tune-ce-l2_llama3-8b-8k_h200.json): no hints 1.532 ms; hints 1 (first read kept in L2, the re-read dropped
# from it, stores streamed) 1.474, 3 1.482, 2 1.488; capped grids slower (2 per SM 1.952, 4 per SM 1.526; blocks of
# 16384 / 32768 at 1-2 per SM 1.529-1.884); Liger's kernels 1.412 in the same run. Study 3 (session23/c1/tune-ce-
# liger-launch_*.json), hints 1: (16384, 16, reverse) 1.451 ms, (8192, 8, reverse) 1.481, Liger's launch (32768, 32)
# 1.541-1.575 with or without hints or reverse: blocks of 16384 at 16 warps now (without hints, session 8 had them
# 2% behind 8192).
GRAD_IN_FORWARD_BLOCK = (16384, 16, True, 1)


@triton.jit
def _transform(raw, logit_scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """x = softcap * tanh(logit_scale * raw / softcap) (or logit_scale * raw); tanh through exp
    (:func:`_transform_slope`'s x; its slope is left unused, so never computed)."""
    x, _slope = _transform_slope(raw, logit_scale, softcap, HAS_SOFTCAP)
    return x


@triton.jit
def _transform_slope(raw, logit_scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """(x, slope): :func:`_transform`'s x (bit for bit) and the soft-cap's derivative ``1 - tanh(u)^2`` (1.0 without a
    soft-cap), formed as ``4 e / (1 + e)^2`` from the same e = exp(-2 |u|): accurate to a few ulps relative where
    tanh saturates, where ``1 - t*t`` from a rounded t loses its digits (fp32 gradients of logits 4-6 soft-caps out
    were 1e-4 off relative; tests/test_loss_options_fuzz.py)."""
    x = raw * logit_scale
    if HAS_SOFTCAP:
        u = x / softcap
        e = tl.exp(-2.0 * tl.abs(u))
        th = (1.0 - e) / (1.0 + e)
        x = softcap * tl.where(u < 0, -th, th)
        slope = 4.0 * e / ((1.0 + e) * (1.0 + e))
    else:
        slope = 1.0
    return x, slope


@triton.jit
def _row_setup(T, CW, rows, n_rows, V, ignore_index, HAS_WEIGHT: tl.constexpr):
    """Per-row target, masks and target weight."""
    rmask = rows < n_rows
    t = tl.load(T + rows, mask=rmask, other=ignore_index)
    valid = rmask & (t != ignore_index)
    in_range = valid & (t >= 0) & (t < V)
    t_safe = tl.where(in_range, t, -1).to(tl.int32)  # -1: matches no column (a vocabulary shard's other rows)
    if HAS_WEIGHT:
        wt = tl.load(CW + t_safe, mask=in_range, other=0.0).to(tl.float32)
    else:
        wt = tl.where(valid, 1.0, 0.0)
    return rmask, valid, in_range, t_safe, wt


@triton.jit
def _grad_coefs(a, az, wt, wsum, lse, V, label_smoothing, lse_square_scale):
    """Per-row coefficients of the gradient formula in the module docstring: (on p, on the target, on every c)."""
    eps = label_smoothing
    coef_p = a * ((1.0 - eps) * wt + eps / V * wsum) + az * (2.0 * lse_square_scale * lse)
    coef_t = a * (1.0 - eps) * wt
    coef_s = a * (eps / V)
    return coef_p, coef_t, coef_s


@triton.jit
def _grad_tile(
    x, slope, cols, cmask, t_safe, m, logs, coef_p, coef_t, coef_s, CW, logit_scale,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
):
    """a * d loss_row / d raw_logits on a [rows, cols] tile of transformed logits ``x`` (fp32), ``slope`` the
    soft-cap's derivative there (:func:`_transform_slope`)."""
    p = tl.exp((x - m[:, None]) - logs[:, None])
    g = coef_p[:, None] * p - tl.where(cols[None, :] == t_safe[:, None], coef_t[:, None], 0.0)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            wc = tl.load(CW + cols, mask=cmask, other=0.0).to(tl.float32)
            g = g - coef_s[:, None] * wc[None, :]
        else:
            g = g - coef_s[:, None]
    if HAS_SOFTCAP:
        g = g * slope
    return g * logit_scale


@triton.jit
def _grad_pass(
    X, stride_x, DX, stride_dx, CW, rows, rmask, valid, t_safe, wt, m, logs, a, az, wsum, V, n_classes,
    label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, BLOCK_V: tl.constexpr,
    REVERSE: tl.constexpr, HINTS: tl.constexpr = 0,
):
    """Write a * d loss_row / d raw_logits for each row (``az``: the z-loss term's coefficient, see the module
    docstring; zero rows where a == az == 0; ignored rows, not ``valid``, are
    written without being read), block by block (``n_classes``: the vocabulary size label smoothing divides by, V
    except on a vocabulary shard): first block first, or with REVERSE last block first (the blocks a
    forward read last are the likeliest still in L2). HINTS (see :data:`GRAD_IN_FORWARD_BLOCK`): 1 or 3: the
    re-read marks its lines evict-first (done with them); 1, 2 or 3: the gradient's stores stream past L2
    (evict-first), so that they do not push the logits still to be re-read out of it."""
    rows64 = rows.to(tl.int64)
    x_row = X + rows64 * stride_x
    dx_row = DX + rows64 * stride_dx
    coef_p, coef_t, coef_s = _grad_coefs(a, az, wt, wsum, m + logs, n_classes, label_smoothing, lse_square_scale)
    last = (tl.cdiv(V, BLOCK_V) - 1) * BLOCK_V
    for i in range(0, V, BLOCK_V):
        start = last - i if REVERSE else i
        cols = start + tl.arange(0, BLOCK_V)
        cmask = cols < V
        lmask = valid[:, None] & cmask[None, :]
        if HINTS == 1 or HINTS == 3:
            raw = tl.load(x_row[:, None] + cols[None, :], mask=lmask, other=0.0, eviction_policy="evict_first")
        else:
            raw = tl.load(x_row[:, None] + cols[None, :], mask=lmask, other=0.0)
        x, slope = _transform_slope(raw.to(tl.float32), logit_scale, softcap, HAS_SOFTCAP)
        g = _grad_tile(x, slope, cols, cmask, t_safe, m, logs, coef_p, coef_t, coef_s, CW, logit_scale,
                       HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING)
        smask = rmask[:, None] & cmask[None, :]
        if HINTS == 0:
            tl.store(dx_row[:, None] + cols[None, :], g.to(DX.dtype.element_ty), mask=smask)
        else:
            tl.store(dx_row[:, None] + cols[None, :], g.to(DX.dtype.element_ty), mask=smask,
                     eviction_policy="evict_first")


@triton.jit
def _record_bad_targets(BAD, T, rows, rmask, valid, in_range):
    """Store a target outside [0, V) other than ignore_index into the host-visible buffer of
    :mod:`tigon.kernels.target_check` (raised at the next loss launch)."""
    tl.store(BAD + rows * 0, tl.load(T + rows, mask=rmask, other=0).to(tl.int64), mask=valid & (~in_range))


@triton.jit
def _target_logit(x_row, t_safe, in_range, valid, logit_scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """The transformed target logit of rows; NaN for a target outside [0, V) (never read out of bounds)."""
    xt = tl.load(x_row + t_safe, mask=in_range, other=0.0).to(tl.float32)
    xt = _transform(xt, logit_scale, softcap, HAS_SOFTCAP)
    return tl.where(in_range | (~valid), xt, float("nan"))


@triton.jit
def _target_prob(xt, m, logs, valid):
    """Per row: the probability of the target, ``exp(x_t - lse)`` (0 for an ignored row): ``use_token_scaling``'s
    factor, a constant of the loss (no gradient flows through it)."""
    return tl.where(valid, tl.exp(xt - m - logs), 0.0)


@triton.jit
def _smoothing_sum(x, xt, cols, cmask, CW, HAS_WEIGHT: tl.constexpr):
    """Per row of a tile: sum_c w_c * (x_c - x_t) over its valid columns (label smoothing's extra term)."""
    d = tl.where(cmask[None, :], x - xt[:, None], 0.0)
    if HAS_WEIGHT:
        d = d * tl.load(CW + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return tl.sum(d, axis=1)


@triton.jit
def _row_loss(m, logs, xt, wt, wsum, sw, valid, V, label_smoothing, lse_square_scale,
              HAS_SMOOTHING: tl.constexpr):
    """(loss incl. z, z) of rows from their max and log-sum (lse = m + logs), target logit, target weight and
    smoothing sum (0 if ignored). The loss is (m - x_t) + logs: exact to its own size for a confident token."""
    eps = label_smoothing
    nll = (m - xt) + logs
    lse = m + logs
    loss = (1.0 - eps) * wt * nll
    if HAS_SMOOTHING:
        loss += eps / V * (wsum * nll - sw)
    z = lse_square_scale * lse * lse
    return tl.where(valid, loss + z, 0.0), tl.where(valid, z, 0.0)


@triton.jit
def _weight_sum(CW, CWSUM, V, HAS_WEIGHT: tl.constexpr):
    """sum(class weights) (V without them)."""
    if HAS_WEIGHT:
        wsum = tl.load(CWSUM).to(tl.float32)
    else:
        wsum = V * 1.0
    return wsum


@triton.jit
def _ce_fwd_kernel(
    X, stride_x, T, CW, CWSUM, SCALES, DX, stride_dx, LOSS, ZLOSS, STATS, CORRECT, PRED, BAD,
    n_rows, V, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    COMPUTE_ACC: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
    REVERSE: tl.constexpr, STORE_PRED: tl.constexpr = False, TOKEN_SCALING: tl.constexpr = False,
    HINTS: tl.constexpr = 0,
):
    # A program takes row tiles pid, pid + grid, ...: one each on a grid of all tiles (the default), several on a
    # capped (persistent) grid, which bounds the rows in flight (and the L2 their second pass needs).
    for tile in range(tl.program_id(0), tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        _ce_fwd_tile(X, stride_x, T, CW, CWSUM, SCALES, DX, stride_dx, LOSS, ZLOSS, STATS, CORRECT, PRED, BAD,
                     tile, n_rows, V, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
                     HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, COMPUTE_ACC, WRITE_GRAD, BLOCK_M, BLOCK_V, REVERSE,
                     STORE_PRED, TOKEN_SCALING, HINTS)


@triton.jit
def _ce_fwd_tile(
    X, stride_x, T, CW, CWSUM, SCALES, DX, stride_dx, LOSS, ZLOSS, STATS, CORRECT, PRED, BAD,
    tile, n_rows, V, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    COMPUTE_ACC: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
    REVERSE: tl.constexpr, STORE_PRED: tl.constexpr, TOKEN_SCALING: tl.constexpr, HINTS: tl.constexpr,
):
    """The forward of one tile of BLOCK_M rows (see :func:`ce_rows_forward`)."""
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask, valid, in_range, t_safe, wt = _row_setup(T, CW, rows, n_rows, V, ignore_index, HAS_WEIGHT)
    _record_bad_targets(BAD, T, rows, rmask, valid, in_range)
    x_row = X + rows.to(tl.int64) * stride_x
    xt = _target_logit(x_row, t_safe, in_range, valid, logit_scale, softcap, HAS_SOFTCAP)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    sw = tl.zeros([BLOCK_M], tl.float32)  # sum_c w_c * (x_c - x_t), for label smoothing
    best = tl.zeros([BLOCK_M], tl.int32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        cmask = cols < V
        # ignored rows read nothing: their loss and gradient are zero (their lse, log V, meets a zero coefficient)
        lmask = valid[:, None] & cmask[None, :]
        if HINTS == 1:  # the gradient's pass reads these again: keep them in L2 in preference
            raw = tl.load(x_row[:, None] + cols[None, :], mask=lmask, other=0.0, eviction_policy="evict_last")
        else:
            raw = tl.load(x_row[:, None] + cols[None, :], mask=lmask, other=0.0)
        x = _transform(raw.to(tl.float32), logit_scale, softcap, HAS_SOFTCAP)
        x = tl.where(cmask[None, :], x, float("-inf"))
        bmax = tl.max(x, axis=1)
        if COMPUTE_ACC or STORE_PRED:
            bidx = tl.argmax(x, axis=1).to(tl.int32)
            best = tl.where(bmax > m, start + bidx, best)  # strict: keeps the first maximum, like torch.argmax
        m_new = tl.maximum(m, bmax)
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows all -inf so far (masked blocks) stay at s = 0
        s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref[:, None]), axis=1)
        m = m_new
        if HAS_SMOOTHING:
            sw += _smoothing_sum(x, xt, cols, cmask, CW, HAS_WEIGHT)
    logs = tl.log(s)
    wsum = _weight_sum(CW, CWSUM, V, HAS_WEIGHT)
    loss, z = _row_loss(m, logs, xt, wt, wsum, sw, valid, V, label_smoothing, lse_square_scale, HAS_SMOOTHING)
    if TOKEN_SCALING:
        p = _target_prob(xt, m, logs, valid)
        loss = loss * p
        z = z * p
    tl.store(LOSS + rows, loss, mask=rmask)
    tl.store(ZLOSS + rows, z, mask=rmask)
    tl.store(STATS + 2 * rows, m, mask=rmask)
    tl.store(STATS + 2 * rows + 1, logs, mask=rmask)
    if COMPUTE_ACC:
        tl.store(CORRECT + rows, tl.where(valid & (best == t_safe) & in_range, 1.0, 0.0), mask=rmask)
    if STORE_PRED:  # the argmax class of each row (-1 for an ignored one, which read no logits)
        tl.store(PRED + rows, tl.where(valid, best, -1).to(tl.int64), mask=rmask)
    if WRITE_GRAD:
        a = tl.where(valid, tl.load(SCALES), 0.0)
        az = tl.where(valid, tl.load(SCALES + 1), 0.0)
        if TOKEN_SCALING:
            a = a * p
            az = az * p
        _grad_pass(X, stride_x, DX, stride_dx, CW, rows, rmask, valid, t_safe, wt, m, logs, a, az, wsum, V, V,
                   label_smoothing, lse_square_scale, logit_scale, softcap,
                   HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, BLOCK_V, REVERSE, HINTS)


@triton.jit
def _scale_kernel(X, stride_x, n_rows, V, G, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    # X[rows, :] *= g for the 0-d upstream gradient g, read on the device; nothing is read or written when g == 1
    # (the usual loss.backward()), so the check costs no host sync.
    g = tl.load(G).to(tl.float32)
    if g != 1.0:
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        rmask = rows < n_rows
        x_row = X + rows.to(tl.int64) * stride_x
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            mask = rmask[:, None] & (cols < V)[None, :]
            p = x_row[:, None] + cols[None, :]
            x = tl.load(p, mask=mask, other=0.0).to(tl.float32)
            tl.store(p, (x * g).to(X.dtype.element_ty), mask=mask)


@triton.jit
def _ce_bwd_kernel(
    X, stride_x, T, CW, CWSUM, STATS, COEF, stride_coef, SCALES, DX, stride_dx,
    n_rows, V, n_classes, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, TOKEN_SCALING: tl.constexpr = False,
    SKIP_UNIT: tl.constexpr = False,
):
    # SKIP_UNIT: DX already holds the gradient for a unit upstream (formed in the forward); write nothing when the
    # 0-d upstream COEF is 1 (read on the device: no host sync), else recompute it over DX for that upstream.
    if SKIP_UNIT:
        if tl.load(COEF).to(tl.float32) != 1.0:
            _ce_bwd_rows(X, stride_x, T, CW, CWSUM, STATS, COEF, stride_coef, SCALES, DX, stride_dx,
                         n_rows, V, n_classes, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
                         HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, HAS_SCALE, BLOCK_M, BLOCK_V, TOKEN_SCALING)
    else:
        _ce_bwd_rows(X, stride_x, T, CW, CWSUM, STATS, COEF, stride_coef, SCALES, DX, stride_dx,
                     n_rows, V, n_classes, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
                     HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, HAS_SCALE, BLOCK_M, BLOCK_V, TOKEN_SCALING)


@triton.jit
def _ce_bwd_rows(
    X, stride_x, T, CW, CWSUM, STATS, COEF, stride_coef, SCALES, DX, stride_dx,
    n_rows, V, n_classes, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, HAS_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, TOKEN_SCALING: tl.constexpr,
):
    """The backward of this program's rows (see :func:`ce_rows_backward`)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask, valid, in_range, t_safe, wt = _row_setup(T, CW, rows, n_rows, V, ignore_index, HAS_WEIGHT)
    m = tl.load(STATS + 2 * rows, mask=rmask, other=0.0)
    logs = tl.load(STATS + 2 * rows + 1, mask=rmask, other=0.0)
    a = tl.load(COEF + rows * stride_coef, mask=rmask, other=0.0).to(tl.float32)
    a = tl.where(valid, a, 0.0)
    if HAS_SCALE:
        az = a * tl.load(SCALES + 1)
        a = a * tl.load(SCALES)
    else:
        az = a
    if TOKEN_SCALING:  # the forward's factor, from the (recomputed) target logit and the saved statistics
        xt = _target_logit(X + rows.to(tl.int64) * stride_x, t_safe, in_range, valid, logit_scale, softcap,
                           HAS_SOFTCAP)
        p = _target_prob(xt, m, logs, valid)
        a = a * p
        az = az * p
    wsum = _weight_sum(CW, CWSUM, n_classes, HAS_WEIGHT)
    _grad_pass(X, stride_x, DX, stride_dx, CW, rows, rmask, valid, t_safe, wt, m, logs, a, az, wsum, V, n_classes,
               label_smoothing, lse_square_scale, logit_scale, softcap,
               HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, BLOCK_V, False)


# ----------------------------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class LossOptions:
    """The scalar options of a cross-entropy launch (their semantics: the cross-entropy reference)."""

    ignore_index: int = -100
    label_smoothing: float = 0.0
    lse_square_scale: float = 0.0
    softcap: float | None = None
    logit_scale: float = 1.0
    token_scaling: bool = False  # each row's loss times its target's (detached) probability: Liger's use_token_scaling


def _blocks(n_rows: int, vocab: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_V, num_warps): BLOCK_V = min(next_pow2(V), MAX_BLOCK_V); several rows per program
    only when a block of the vocabulary is narrow (small V), and never more rows than there are."""
    block_v = min(next_pow2(vocab), next_pow2(MAX_BLOCK_V))
    block_m = min(rows_per_program(block_v, device), next_pow2(n_rows))
    return block_m, block_v, warps_for(block_m * block_v)


def class_weight_args(class_weight: torch.Tensor | None, device: torch.device):
    """(weights fp32 contiguous or None, their sum as a 0-d fp32 tensor or None)."""
    if class_weight is None:
        return None, None
    cw = class_weight.detach().to(device=device, dtype=torch.float32).contiguous()
    return cw, cw.sum()


def ce_rows_forward(
    x: torch.Tensor, target: torch.Tensor, cw: torch.Tensor | None, cw_sum: torch.Tensor | None,
    opts: LossOptions, out_loss: torch.Tensor, out_z: torch.Tensor, out_stats: torch.Tensor,
    out_correct: torch.Tensor | None, grad_scales: torch.Tensor | None = None, grad_out: torch.Tensor | None = None,
    block: tuple[int, int, bool] | None = None, out_pred: torch.Tensor | None = None,
) -> None:
    """Launch the forward on rows ``x`` (n, V) (unit column stride) with targets (n,) (contiguous).

    Writes per-row loss (incl. z), z and (if ``out_correct`` is given) 1.0/0.0 argmax hits into the (n,) fp32
    outputs, (if ``out_pred`` is given) each row's argmax class (the first maximum of the transformed logits, -1 for
    an ignored row) into that (n,) int64 tensor, and the rows' statistics (max, log-sum; see the module docstring)
    into ``out_stats`` ((n, 2) fp32, contiguous; :func:`row_stats` allocates it; lse = the sum of a row's two). With
    ``grad_scales`` (the (2,) fp32 scales of :func:`tigon.kernels.loss_reduce.reduce_losses`), also writes
    ``d loss / d x`` of the reduced loss into ``grad_out`` (n, V), which may be ``x`` itself (in place).
    First raises for a bad target an earlier launch recorded (:func:`tigon.kernels.target_check.raise_if_seen`).
    ``block``: (vocabulary block, num_warps, reverse: the gradient's pass goes last block first, see
    :func:`_grad_pass`[, hints[, programs per SM]]), one row per program, for rows at least that wide (narrower
    rows: the default blocks, by :data:`MAX_BLOCK_V`, with that order). Default: the default blocks, first block
    first. With the gradient's pass only: ``hints``, the L2 eviction hints of :func:`_grad_pass` (0: none);
    ``programs per SM`` k > 0 caps the grid at k times the SM count, each program then taking every grid-th row
    (0: a program per row).
    """
    n, vocab = x.shape
    if n == 0:
        return
    hints, per_sm = (tuple(block[3:5]) + (0, 0))[:2] if block is not None else (0, 0)
    if block is not None and vocab >= block[0]:
        block_m, (block_v, warps, reverse) = 1, block[:3]
    else:
        block_m, block_v, warps = _blocks(n, vocab, x.device)
        reverse, per_sm = block is not None and block[2], 0
    target_check.raise_if_seen()
    write_grad = grad_scales is not None
    dx = grad_out if write_grad else x
    tiles = cdiv(n, block_m)
    # a capped grid: k programs per SM (k in all under the interpreter, where there are no SMs)
    cap = per_sm * (sm_count(x.device) if compiled_cuda(x.device) else 1) if per_sm and write_grad else tiles
    grid = min(tiles, cap)
    launcher(_ce_fwd_kernel)[(grid,)](
        x, x.stride(0), target, cw if cw is not None else out_stats, cw_sum if cw_sum is not None else out_stats,
        grad_scales if write_grad else out_stats, dx, dx.stride(0),
        out_loss, out_z, out_stats, out_correct if out_correct is not None else out_loss,
        out_pred if out_pred is not None else target, target_check.buffer(x.device),
        n, vocab, int(opts.ignore_index), float(opts.label_smoothing), float(opts.lse_square_scale),
        float(opts.logit_scale), float(opts.softcap or 1.0),
        HAS_WEIGHT=cw is not None, HAS_SOFTCAP=opts.softcap is not None,
        HAS_SMOOTHING=opts.label_smoothing > 0, COMPUTE_ACC=out_correct is not None, WRITE_GRAD=write_grad,
        BLOCK_M=block_m, BLOCK_V=block_v, REVERSE=bool(reverse and write_grad), STORE_PRED=out_pred is not None,
        TOKEN_SCALING=opts.token_scaling, HINTS=int(hints) if write_grad else 0, num_warps=warps,
    )


def row_stats(n: int, device: torch.device) -> torch.Tensor:
    """An uninitialised (n, 2) fp32 buffer for :func:`ce_rows_forward`'s row statistics (max, log-sum)."""
    return torch.empty((n, 2), dtype=torch.float32, device=device)


def scale_rows_(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``x *= g`` in place for rows ``x`` (n, V) (unit column stride) and a 0-d tensor ``g``, skipped on the device
    (no host sync) when g == 1. Returns x."""
    n, vocab = x.shape
    if n == 0:
        return x
    block_m, block_v, warps = _blocks(n, vocab, x.device)
    launcher(_scale_kernel)[(cdiv(n, block_m),)](x, x.stride(0), n, vocab, g.reshape(()), BLOCK_M=block_m,
                                                 BLOCK_V=block_v, num_warps=warps)
    return x


def ce_rows_backward(
    x: torch.Tensor, target: torch.Tensor, cw: torch.Tensor | None, cw_sum: torch.Tensor | None,
    stats: torch.Tensor, opts: LossOptions, coef: torch.Tensor, dx: torch.Tensor, scale: torch.Tensor | None = None,
    n_classes: int | None = None, skip_unit: bool = False,
) -> None:
    """Launch the backward: ``dx = coef * d loss / d x`` for rows ``x`` (n, V), using the saved row statistics
    ``stats`` ((n, 2) fp32 of the forward).

    ``coef`` is a 0-d tensor (broadcast) or an (n,) tensor of any stride, any float dtype; ``scale``: the (2,)
    fp32 scales of :func:`tigon.kernels.loss_reduce.reduce_losses` for a scalar reduction (None for per-token
    losses); ``dx`` may be ``x`` (in place). First raises for a bad target an earlier forward recorded.

    Vocabulary shard (:mod:`tigon.kernels.vocab_parallel`): ``x`` holds classes [v0, v0 + V) of ``n_classes``,
    ``stats`` the global (max, log-sum), ``target`` the local class (t - v0), or any value outside [0, V) other
    than ignore_index for a row whose target another shard holds (no target term there); label smoothing divides
    by ``n_classes`` (no class weights on a shard).

    ``skip_unit`` (a 0-d ``coef``): ``dx`` already holds the gradient for an upstream of 1 (the forward formed it,
    :func:`ce_rows_forward` with ``grad_out``); the kernel reads ``coef`` on the device and writes nothing when it
    is 1, else recomputes ``dx`` for it (one rounding, as the lazy path; no host sync either way).
    """
    n, vocab = x.shape
    if n == 0:
        return
    target_check.raise_if_seen()
    block_m, block_v, warps = _blocks(n, vocab, x.device)
    launcher(_ce_bwd_kernel)[(cdiv(n, block_m),)](
        x, x.stride(0), target, cw if cw is not None else stats, cw_sum if cw_sum is not None else stats,
        stats, coef, coef.stride(0) if coef.dim() else 0, scale if scale is not None else stats, dx, dx.stride(0),
        n, vocab, int(vocab if n_classes is None else n_classes), int(opts.ignore_index),
        float(opts.label_smoothing), float(opts.lse_square_scale), float(opts.logit_scale), float(opts.softcap or 1.0),
        HAS_WEIGHT=cw is not None, HAS_SOFTCAP=opts.softcap is not None, HAS_SMOOTHING=opts.label_smoothing > 0,
        HAS_SCALE=scale is not None, BLOCK_M=block_m, BLOCK_V=block_v, TOKEN_SCALING=opts.token_scaling,
        SKIP_UNIT=skip_unit, num_warps=warps,
    )
