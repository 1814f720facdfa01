"""Fused linear generalised JSD: the distillation loss of a student's and a teacher's LM heads without the (N, V)
logits of either model.

Formula and semantics: :mod:`tigon.reference.fused_linear_jsd`. Chunks of tokens as the fused cross-entropy's
(:func:`tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`: its chunk rule and ``memory`` budget, its
matmuls and fp32 accumulators), with the gradient formed in the forward (the loss is a scalar, so its backward only
scales it, as Liger-Kernel's fused linear JSD does). Per chunk of rows:

1. ``z_s = h_s W_s^T (+ b_s)`` into the chunk buffer (compute dtype), ``z_t = h_t W_t^T (+ b_t)`` into a second one;
2. one Triton kernel (:func:`_jsd_logits_kernel`) reads both rows of logits in the compute dtype and, in fp32
   registers: (pass 1) both rows' online log-sum-exp of ``z / T`` (the max of the raw logits, the sum in bits; in
   partial accumulators of 8 columns each, merged once, so no reduction across threads per block);
   (pass 2) ``x = log_softmax(z_s / T)``, ``y = log_softmax(z_t / T)`` per element (in bits for jsd), the
   divergence's pointwise term and its derivative ``g = d l / d x`` (:func:`tigon.kernels.divergence_terms._jsd_parts`
   and ``_terms``, the formulas :func:`tigon.functional.jsd` runs), summed per row; (pass 3) the gradient w.r.t.
   the student's logits, ``scale (g - softmax(z_s / T) sum_v g) / T`` (the log-softmax's backward; scale = 1 /
   kept rows; softmax(z_s / T) = Q, which the term already formed), written over the student's chunk buffer in
   place;
3. the loop's matmuls add ``grad_hidden = G W_s`` and ``grad_W += G^T h_s`` (and ``grad_b += sum G``).

Final-logit soft-caps (``student_softcap``, ``teacher_softcap``: Gemma 2's ``c tanh(z / c)`` on each model's logits):
the kernel applies each model's cap to its logits as it loads them (``HAS_CAP_S``, ``HAS_CAP_T`` constexprs: nothing
changes without them), so the three passes above run on the capped logits, and pass 3 multiplies the student's
gradient by the cap's derivative ``1 - tanh^2(z / c) = 1 - (cap(z) / c)^2``, from the capped value it holds: the same
reads, one tanh per logit and model in each pass.

Rows whose label is ``ignore_index`` (loss 0, no gradient) are left out of all four matmuls where that pays
(:func:`tigon.kernels.ignored_rows.kept_for_chunks`: the default plan, at least 1/32 of the rows ignored, a large
head; one host sync per call): the chunks run over the kept rows of both models, gathered chunk by chunk into two
(rows, H) buffers beside the chunk's logits (32 MiB at Llama-3-8B's 2048-row chunks, outside the 3 GiB figure
below), and grad_hidden's ignored rows are zeros (tests/test_fused_linear_jsd.py checks the result equals computing
every row).

Memory per chunk row: the two logits rows in the compute dtype, nothing else (no fp32 (rows, V) temporaries). Bytes
per chunk: three reads of both rows and one write of the student's (7 x rows x V x 2 in bf16: about 4 ms at 8192 x
128256 on an H200 by copy bandwidth). The teacher gets no gradient. Matmuls: 2 for the logits, 2 for the student's
gradients (4 N H V x 2 FLOPs in all).

Arithmetic per logit (jsd, 0 < beta < 1; SASS of the three vocabulary loops, sm_90, bf16, counted offline by
``benchmarks/sass_mix.py``): 8.25 special-function ops (pass 1: 2 ``ex2`` and a rescale per 8 logits; passes 2 and
3: 2 ``ex2`` + 1 ``lg2`` each) and about 94 instructions (16 + 47 + 31, with the series of
:func:`tigon.kernels.divergence_terms._jsd_parts` where student and teacher nearly agree, for the loss in pass 2 and the
gradient in pass 3; 16 + 24 + 21 without; beta 0 / 1: 50 / 51 instructions, 6.25 / 4.25 ``ex2``), where the
previous passes took 7 ``ex2`` with subnormal fix-ups and two ~25-instruction precise logs (the "9
transcendentals" of the H200 notes), about 185 instructions: at 8192 x 128256 the kernel was issue-bound (about 7
ms by instruction count at the H200's issue rate, of the 62.1 ms fwd + bwd, 79.9% of the matmul floor) against
about 3.4 ms of memory traffic, which should bound it now (about 3 ms of issue and 2 ms of special-function
work: to be measured).

History: until this kernel, step 2 was torch on fp32 copies (``log_softmax`` of both chunks, the divergence kernel,
then the log-softmax backward in five more torch passes): about 20 fp32 passes over each (rows, V) chunk and 16
bytes of fp32 temporaries per logit, which forced 432-row chunks at Llama-3-8B's head (19 chunks, each re-reading
and re-writing the fp32 grad_weight accumulator). Measured then on an H200 (8192 x 4096 x 128256 bf16, fwd+bwd):
104 ms against Liger-Kernel's 103 and a matmul floor of 43.5 ms.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._common import CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, interpreter_quiet, or_empty
from .first_order import once_differentiable
from .divergence import Divergence, _blocks, fast_math, reduction_scale
from .divergence_terms import JSD, KL_LOG, KL_LOG_REVERSE, LN2, LOG2E, _jsd_parts, _terms
from .fused_linear_cross_entropy import FLCE_BUDGET_BYTES_CUDA, backward_over_chunks
from .head_grads import _Matmuls, _operands, grad_buffers, scale_grads
from .ignored_rows import kept_for_chunks
from .loss_rows import _transform_slope

# Chunk rows. The loop's chunk buffer holds the student's logits and this module a second one for the teacher's, so a
# logit costs 2 x the compute dtype's size (elem_bytes of backward_over_chunks). memory="auto" on CUDA is the budget
# FLCE_BUDGET_BYTES_CUDA (3 GiB) for both buffers and the fp32 accumulator (:func:`chunk_rows`' budget rule): at
# Llama-3-8B's head (4096 x 128256) 2.1 GB of accumulator leave 2180 rows, so 8192 tokens run in 4 chunks of 2048:
# peak extra 1.96 GiB of accumulator + 2 x 0.49 of logits + 0.125 of fp32 grad_hidden = 3.06 GiB (measured 3.06 on an
# H200, session 13; Liger-Kernel 2.14, whose grad_weight is bf16: with the exact fp32 accumulator alone at 1.96 GiB,
# its footprint leaves no room for both heads' chunks). A larger ``memory=`` budget trades memory for fewer chunks; a
# budget below the accumulator (e.g. 1 << 30: the same 2048-row chunks, about 2.0 GiB) accumulates in the weight's
# dtype, as Liger does; "low" does too, with Liger's small chunks.


@triton.jit
def _block(rows, keep, start, V, RAGGED: tl.constexpr, BLOCK_V: tl.constexpr):
    """(cols, in_cols, read) of the vocabulary block at ``start``: its columns, those inside V ([1, BLOCK_V]; all
    of them, no mask, unless RAGGED) and the elements read ([BLOCK_M, BLOCK_V]: kept rows' columns inside V)."""
    cols = start + tl.arange(0, BLOCK_V)
    if RAGGED:
        in_cols = (cols < V)[None, :]
    else:
        in_cols = tl.full([1, BLOCK_V], 1, tl.int1)
    return cols, in_cols, keep[:, None] & in_cols


@triton.jit
def _load(Z, rows, stride, cols, read, cap, HAS_CAP: tl.constexpr):
    """A [BLOCK_M, BLOCK_V] tile of logits in fp32, soft-capped with HAS_CAP (``cap tanh(z / cap)``), -inf where not
    ``read`` (:func:`_load_slope`'s tile; its slope is left unused, so never computed)."""
    z, _slope = _load_slope(Z, rows, stride, cols, read, cap, HAS_CAP)
    return z


@triton.jit
def _load_slope(Z, rows, stride, cols, read, cap, HAS_CAP: tl.constexpr):
    """(:func:`_load`'s tile, the soft-cap's derivative ``1 - tanh(z / cap)^2`` there: 1.0 without HAS_CAP), the
    derivative from exp(-2|u|) (:func:`tigon.kernels.loss_rows._transform_slope`: accurate where tanh saturates)."""
    if HAS_CAP:  # (cap tanh(-inf / cap) = -cap: the cap is taken on zeros where not read, then masked)
        z = tl.load(Z + rows[:, None] * stride + cols[None, :], mask=read, other=0.0).to(tl.float32)
        z, slope = _transform_slope(z, 1.0, cap, True)
        z = tl.where(read, z, float("-inf"))
    else:
        z = tl.load(Z + rows[:, None] * stride + cols[None, :], mask=read, other=float("-inf")).to(tl.float32)
        slope = 1.0
    return z, slope


@triton.jit
def _online_lse2(m, s, z, c2, LANES: tl.constexpr):
    """One step of the online log-sum-exp (Milakov & Gimelshein 2018) over a [BLOCK_M, BLOCK_V] tile ``z`` of raw
    logits (-inf where masked), in ``LANES`` partial accumulators per row: the running max ``m`` of z and sum ``s``
    of 2^(c2 (z - m)), both [BLOCK_M, LANES] (c2 = log2 e / T: one ``ex2`` per element). The tile is viewed as
    [BLOCK_M, LANES, BLOCK_V / LANES]; with LANES = BLOCK_V / 8 a lane's 8 contiguous columns are one thread's
    16-byte load of bf16 logits, so a step reduces within threads only (no shuffle or barrier per block; SASS:
    20 -> 16 instructions a logit, a rescale ``ex2`` per 8 logits more);
    :func:`_lse_rows` merges the lanes once. The max is of the raw logits, so that ``z - m`` is exact (0 at the
    max) and rounded only once scaled: a confident token's log-probability carries no rounding of a scaled max
    (``c2 z - c2 m`` would carry an ulp of c2 m, 1e-5 at logits of 100)."""
    z3 = tl.reshape(z, [z.shape[0], LANES, z.shape[1] // LANES])
    m_new = tl.maximum(m, tl.max(z3, axis=2))
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # lanes all -inf so far keep s = 0
    s = s * tl.math.exp2((m - m_ref) * c2) + tl.sum(tl.math.exp2((z3 - m_ref[:, :, None]) * c2), axis=2)
    return m_new, s


@triton.jit
def _lse_rows(m, s, c2):
    """The rows' (max of z, sum of 2^(c2 (z - max))) from :func:`_online_lse2`'s [BLOCK_M, LANES] lanes."""
    m_row = tl.max(m, axis=1)
    m_ref = tl.where(m_row > float("-inf"), m_row, 0.0)
    return m_row, tl.sum(s * tl.math.exp2((m - m_ref[:, None]) * c2), axis=1)


@triton.jit
def _stats_step(ZS, stride_s, ZT, stride_t, rows, keep, start, V, c2, ms, ss, mt, st, cap_s, cap_t,
                HAS_CAP_S: tl.constexpr, HAS_CAP_T: tl.constexpr, RAGGED: tl.constexpr, LANES: tl.constexpr,
                BLOCK_V: tl.constexpr):
    """Pass 1 over one block: both rows' online log-sum-exp of ``z / T`` (max in logits, sum in bits), per lane."""
    cols, _in_cols, read = _block(rows, keep, start, V, RAGGED, BLOCK_V)
    ms, ss = _online_lse2(ms, ss, _load(ZS, rows, stride_s, cols, read, cap_s, HAS_CAP_S), c2, LANES)
    mt, st = _online_lse2(mt, st, _load(ZT, rows, stride_t, cols, read, cap_t, HAS_CAP_T), c2, LANES)
    return ms, ss, mt, st


@triton.jit
def _pieces(zs, zt, c, ms, ls, mt, lt, beta, KIND: tl.constexpr, FAST: tl.constexpr):
    """Per element of a block of logits ``zs``, ``zt`` (:func:`_load`'s): ``(u, v, g, Q)`` with the pointwise loss
    ``ln2 (u + v)`` (jsd) or ``u + v`` (the KL kinds), g proportional to d l / d x and Q = exp(x). x =
    log_softmax(z_s / T), y = log_softmax(z_t / T) formed as ``c (z - m) - logs`` (``z - m`` exact: the max
    subtracted first, as torch's log_softmax; then one FMA; -inf where not read, which makes every piece 0), in bits
    for jsd (c = log2 e / T: :func:`tigon.kernels.divergence._jsd_parts`' ``u = l2`` (the loss in bits), ``v = 0``,
    ``g = gx``; the gradient takes ln2 (1 - beta)), in nats for the KL kinds (c = 1 / T: ``_terms``' u = l, v = 0,
    g = d l / d x)."""
    x = tl.fma(zs - ms[:, None], c, -ls[:, None])
    y = tl.fma(zt - mt[:, None], c, -lt[:, None])
    if KIND == 2:
        u, gx, _gy, q, _p = _jsd_parts(x, y, 1.0, beta, FAST)  # (bits; the series where the two nearly agree)
        return u, 0.0, gx, q
    else:
        loss, dx, _dy, q = _terms(x, y, 0.0, KIND, FAST)
        return loss, 0.0, dx, q


@triton.jit
def _sums_step(ZS, stride_s, ZT, stride_t, rows, keep, start, V, c, ms, ls, mt, lt, beta, acc, gacc, qacc, cap_s,
               cap_t, HAS_CAP_S: tl.constexpr, HAS_CAP_T: tl.constexpr, KIND: tl.constexpr, FAST: tl.constexpr,
               RAGGED: tl.constexpr, BLOCK_V: tl.constexpr):
    """Pass 2 over one block: adds the pointwise losses to ``acc``, g to ``gacc`` and Q to ``qacc`` ([BLOCK_M,
    BLOCK_V] fp32 tiles, summed per row after the walk: no reduction per block)."""
    cols, _in_cols, read = _block(rows, keep, start, V, RAGGED, BLOCK_V)
    u, v, g, q = _pieces(_load(ZS, rows, stride_s, cols, read, cap_s, HAS_CAP_S),
                         _load(ZT, rows, stride_t, cols, read, cap_t, HAS_CAP_T), c, ms, ls, mt, lt, beta, KIND, FAST)
    return acc + u + v, gacc + g, qacc + q


@triton.jit
def _grad_step(ZS, stride_s, ZT, stride_t, rows, in_rows, keep, start, V, c, ms, ls, mt, lt, beta, cg, cq, cap_s,
               cap_t, HAS_CAP_S: tl.constexpr, HAS_CAP_T: tl.constexpr, KIND: tl.constexpr, FAST: tl.constexpr,
               RAGGED: tl.constexpr, BLOCK_V: tl.constexpr):
    """Pass 3 over one block: ``cg g - cq Q`` (per-row factors) over the student's logits, in place; times the
    soft-cap's derivative ``1 - tanh(z / cap)^2`` with HAS_CAP_S (:func:`tigon.kernels.loss_rows._transform_slope`)."""
    cols, in_cols, read = _block(rows, keep, start, V, RAGGED, BLOCK_V)
    zs, slope = _load_slope(ZS, rows, stride_s, cols, read, cap_s, HAS_CAP_S)
    _u, _v, g, q = _pieces(zs, _load(ZT, rows, stride_t, cols, read, cap_t, HAS_CAP_T), c, ms, ls, mt, lt, beta,
                           KIND, FAST)
    grad = g * cg[:, None] - q * cq[:, None]
    if HAS_CAP_S:
        grad = grad * tl.where(read, slope, 1.0)  # (not read: -inf, and a gradient of 0)
    tl.store(ZS + rows[:, None] * stride_s + cols[None, :], grad.to(ZS.dtype.element_ty),
             mask=in_rows[:, None] & in_cols)


@triton.jit
def _jsd_rows(ZS, stride_s, ZT, stride_t, SCALE, LOSS, rows, in_rows, keep, V, inv_t, beta, cap_s, cap_t,
              HAS_CAP_S: tl.constexpr, HAS_CAP_T: tl.constexpr, KIND: tl.constexpr, WRITE_GRAD: tl.constexpr,
              FAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, LANES: tl.constexpr):
    """:func:`_jsd_logits_kernel`'s three passes over its rows (``in_rows``: those that exist, ``keep``: those read);
    each walks the whole blocks with no column mask, then the ragged last one. LANES: pass 1's partial accumulators
    per row (:func:`_online_lse2`)."""
    full = V - V % BLOCK_V
    # pass 1: both rows' log-sum-exp of z / T (the max in logits, the log-sum in bits)
    c2 = inv_t * LOG2E
    ms = tl.full([BLOCK_M, LANES], float("-inf"), tl.float32)
    mt = tl.full([BLOCK_M, LANES], float("-inf"), tl.float32)
    ss = tl.zeros([BLOCK_M, LANES], tl.float32)
    st = tl.zeros([BLOCK_M, LANES], tl.float32)
    for start in range(0, full, BLOCK_V):
        ms, ss, mt, st = _stats_step(ZS, stride_s, ZT, stride_t, rows, keep, start, V, c2, ms, ss, mt, st, cap_s,
                                     cap_t, HAS_CAP_S, HAS_CAP_T, False, LANES, BLOCK_V)
    if full < V:
        ms, ss, mt, st = _stats_step(ZS, stride_s, ZT, stride_t, rows, keep, full, V, c2, ms, ss, mt, st, cap_s,
                                     cap_t, HAS_CAP_S, HAS_CAP_T, True, LANES, BLOCK_V)
    ms, ss = _lse_rows(ms, ss, c2)
    mt, st = _lse_rows(mt, st, c2)
    ms = tl.where(keep, ms, 0.0)  # skipped rows: finite statistics (their tiles are -inf: every piece is 0)
    mt = tl.where(keep, mt, 0.0)
    ss = tl.where(keep, ss, 1.0)
    st = tl.where(keep, st, 1.0)
    if KIND == 2:  # jsd in bits (the loss and g take ln2 and ln2 (1 - beta): _pieces)
        c = c2
        ls = tl.math.log2(ss)
        lt = tl.math.log2(st)
        loss_unit = LN2
        g_unit = LN2 * (1.0 - beta)
    else:  # the KL kinds in nats
        c = inv_t
        ls = tl.log(ss)
        lt = tl.log(st)
        loss_unit = 1.0
        g_unit = 1.0
    # pass 2: the row's divergence and sum_v d l / d x_v, last block first (the blocks pass 1 read last are the
    # likeliest still in L2; pass 3 then starts where this one ends, as the cross-entropy's gradient pass does:
    # tigon.kernels.loss_rows.GRAD_IN_FORWARD_BLOCK)
    acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    gacc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    qacc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    if full < V:
        acc, gacc, qacc = _sums_step(ZS, stride_s, ZT, stride_t, rows, keep, full, V, c, ms, ls, mt, lt, beta, acc,
                                     gacc, qacc, cap_s, cap_t, HAS_CAP_S, HAS_CAP_T, KIND, FAST, True, BLOCK_V)
    for i in range(0, full, BLOCK_V):
        acc, gacc, qacc = _sums_step(ZS, stride_s, ZT, stride_t, rows, keep, full - BLOCK_V - i, V, c, ms, ls, mt,
                                     lt, beta, acc, gacc, qacc, cap_s, cap_t, HAS_CAP_S, HAS_CAP_T, KIND, FAST, False,
                                     BLOCK_V)
    tl.store(LOSS + rows, tl.sum(acc, axis=1) * loss_unit, mask=in_rows)
    if WRITE_GRAD:
        # pass 3: d loss / d z_s = scale / T (d l / d x - Q sum_v d l / d x_v); skipped rows get zeros (the
        # matmuls read them). Q normalised by its computed sum (1 up to the roundings of the row's log-sum, common to
        # every Q of the row): the gradient's row sum is 0 up to its own roundings, as the exact one
        coef = tl.load(SCALE) * inv_t
        cg = tl.full([BLOCK_M], 1.0, tl.float32) * (coef * g_unit)
        q_sum = tl.sum(qacc, axis=1)
        cq = tl.sum(gacc, axis=1) * (coef * g_unit) / tl.where(q_sum > 0, q_sum, 1.0)
        for start in range(0, full, BLOCK_V):
            _grad_step(ZS, stride_s, ZT, stride_t, rows, in_rows, keep, start, V, c, ms, ls, mt, lt, beta, cg, cq,
                       cap_s, cap_t, HAS_CAP_S, HAS_CAP_T, KIND, FAST, False, BLOCK_V)
        if full < V:
            _grad_step(ZS, stride_s, ZT, stride_t, rows, in_rows, keep, full, V, c, ms, ls, mt, lt, beta, cg, cq,
                       cap_s, cap_t, HAS_CAP_S, HAS_CAP_T, KIND, FAST, True, BLOCK_V)


@triton.jit
def _jsd_logits_kernel(
    ZS, stride_s,    # (n, V) student logits (compute dtype), unit column stride; overwritten with the gradient
    ZT, stride_t,    # (n, V) teacher logits, unit column stride
    LABELS,          # (n,) integer labels (HAS_LABELS): rows labelled ignore_index are skipped
    SCALE,           # 0-d fp32: the reduction's factor (1 / kept rows), multiplies the gradient
    LOSS,            # (n,) fp32 output: each row's divergence (0 for a skipped row)
    n_rows, V, ignore_index, inv_t, beta,
    cap_s, cap_t,    # the student's / teacher's final-logit soft-cap (read with HAS_CAP_S / HAS_CAP_T)
    KIND: tl.constexpr, HAS_LABELS: tl.constexpr, WRITE_GRAD: tl.constexpr, FAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, LANES: tl.constexpr, HAS_CAP_S: tl.constexpr = False,
    HAS_CAP_T: tl.constexpr = False,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    in_rows = rows < n_rows
    keep = in_rows
    if HAS_LABELS:
        keep = in_rows & (tl.load(LABELS + rows, mask=in_rows, other=ignore_index) != ignore_index)
    if BLOCK_M == 1:
        # one row (wide rows: exactly n programs): a kept one is walked with no row mask, a skipped one only writes
        # its zeros
        if tl.max(keep.to(tl.int32), axis=0) != 0:
            every = tl.full([BLOCK_M], 1, tl.int1)
            _jsd_rows(ZS, stride_s, ZT, stride_t, SCALE, LOSS, rows, every, every, V, inv_t, beta, cap_s, cap_t,
                      HAS_CAP_S, HAS_CAP_T, KIND, WRITE_GRAD, FAST, BLOCK_M, BLOCK_V, LANES)
        else:
            tl.store(LOSS + rows, tl.zeros([BLOCK_M], tl.float32))
            if WRITE_GRAD:
                for start in range(0, V, BLOCK_V):
                    cols = start + tl.arange(0, BLOCK_V)
                    tl.store(ZS + rows[:, None] * stride_s + cols[None, :],
                             tl.zeros([BLOCK_M, BLOCK_V], ZS.dtype.element_ty), mask=(cols < V)[None, :])
    else:
        _jsd_rows(ZS, stride_s, ZT, stride_t, SCALE, LOSS, rows, in_rows, keep, V, inv_t, beta, cap_s, cap_t,
                  HAS_CAP_S, HAS_CAP_T, KIND, WRITE_GRAD, FAST, BLOCK_M, BLOCK_V, LANES)


def jsd_rows(zs: torch.Tensor, zt: torch.Tensor, labels: torch.Tensor | None, scale: torch.Tensor, opts: Divergence,
             inv_t: float, loss: torch.Tensor, write_grad: bool, caps: tuple = (None, None)) -> None:
    """Run :func:`_jsd_logits_kernel` on a chunk: student and teacher logits ``zs``, ``zt`` (n, V) (unit column
    stride, the compute dtype), labels (n,) contiguous or None, the 0-d fp32 ``scale``, ``caps`` the student's and
    the teacher's soft-caps (float or None); writes the rows' divergence into ``loss`` ((n,) fp32) and, with
    ``write_grad``, ``scale * d loss / d zs`` over ``zs`` in place."""
    n, vocab = zs.shape
    if n == 0:
        return
    block_m, block_v, warps = _blocks(n, vocab, zs.device)
    launch = _jsd_logits_kernel[(cdiv(n, block_m),)]
    args = (zs, zs.stride(0), zt, zt.stride(0), labels if labels is not None else scale, scale, loss,
            n, vocab, int(opts.ignore_index), float(inv_t), float(opts.beta), *(float(c or 1.0) for c in caps))
    meta = dict(KIND=opts.kind, HAS_LABELS=labels is not None, WRITE_GRAD=write_grad, FAST=fast_math(zs.device),
                BLOCK_M=block_m, BLOCK_V=block_v, LANES=max(block_v // 8, 1), num_warps=warps,
                HAS_CAP_S=caps[0] is not None, HAS_CAP_T=caps[1] is not None)
    if zs.device.type == "cpu":  # the interpreter: the -inf - -inf of zero-probability terms, discarded (_terms)
        with interpreter_quiet():
            launch(*args, **meta)
    else:
        launch(*args, **meta)


def _kind(beta: float) -> int:
    return KL_LOG if beta == 0.0 else KL_LOG_REVERSE if beta == 1.0 else JSD


def jsd_forward(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias,
                beta: float, ignore_index: int, temperature: float, cd: torch.dtype, need, lean: bool = False,
                budget: int = -1, halves: bool = True, caps: tuple = (None, None)):
    """(loss 0-d fp32, (gh, gw, gb) unscaled accumulators for :func:`scale_grads`, None where not needed) of the
    batch-mean JSD over the rows whose label is not ``ignore_index`` (all rows when ``labels`` is None). ``halves``:
    grad_weight as a :class:`~tigon.kernels.head_grads.RowHalves` (eager calls); ``caps``: the student's and the
    teacher's final-logit soft-caps (float or None)."""
    n = student_input.shape[0]
    vocab = student_weight.shape[0]
    dev = student_input.device
    labels = labels.contiguous() if labels is not None else None
    scale = reduction_scale(labels, ignore_index, n, vocab, "batchmean", dev)
    opts = Divergence(_kind(beta), beta, 0.0, ignore_index)
    ht, wt, bt = _operands(teacher_input.detach(), teacher_weight.detach(),
                           None if teacher_bias is None else teacher_bias.detach(), cd)
    # ignored tokens (loss 0, no gradient) left out of all four matmuls: the kept rows gathered (ignored_rows)
    kept = None if labels is None else kept_for_chunks(labels, ignore_index, vocab, student_input.shape[1],
                                                        lean or budget >= 0)
    if kept is not None:  # the teacher's kept rows are gathered chunk by chunk below (one (rows, H_t) buffer)
        labels = labels.index_select(0, kept)
    loss_rows = torch.zeros(n if kept is None else kept.numel(), dtype=torch.float32, device=dev)
    want_grad = any(need)
    if budget < 0 and not lean and compiled_cuda(dev):
        budget = FLCE_BUDGET_BYTES_CUDA  # the chunk rows' comment above
    teacher_buf: list[torch.Tensor] = []
    mm = _Matmuls(dev, cd)

    def rows_grad(lg, s, e):
        if not teacher_buf:  # one (rows, V) buffer for the teacher's logits, the size of the student's
            teacher_buf.append(torch.empty_like(lg))
            if kept is not None:  # and one (rows, H_t) for its kept hidden rows
                teacher_buf.append(ht.new_empty((lg.shape[0], ht.shape[1])))
        tz = teacher_buf[0][: e - s]
        if kept is None:
            hr = ht[s:e]
        else:
            hr = torch.index_select(ht, 0, kept[s:e], out=teacher_buf[1][: e - s])
        mm.logits(tz, hr, wt, bt)
        jsd_rows(lg, tz, labels[s:e] if labels is not None else None, scale, opts, 1.0 / temperature,
                 loss_rows[s:e], want_grad, caps)

    grads = backward_over_chunks(student_input, student_weight, student_bias, cd, need, lean, halves, budget, rows_grad,
                                 elem_bytes=2 * cd.itemsize, scalar=True, kept=kept)
    return loss_rows.sum() * scale, grads


class FusedLinearJSDFunction(torch.autograd.Function):
    """``apply(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias, beta,
    ignore_index, temperature, cd, need, lean, budget, student_softcap, teacher_softcap) -> loss``: 0-d fp32,
    gradients formed in the forward for ``need`` = (student_input, student_weight, student_bias) and scaled by the
    upstream gradient in the backward (a second backward through the same graph raises)."""

    @staticmethod
    def forward(ctx, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                teacher_bias, beta, ignore_index, temperature, cd, need, lean=False, budget=-1, student_softcap=None,
                teacher_softcap=None):
        loss, grads = jsd_forward(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                                  teacher_bias, beta, ignore_index, temperature, cd, need, lean, budget,
                                  caps=(student_softcap, teacher_softcap))
        ctx.grads, ctx.need = grads, need
        ctx.dtypes = (student_input.dtype, student_weight.dtype,
                      student_bias.dtype if student_bias is not None else None)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        none = (None,) * 10
        if not any(ctx.need):
            return (None,) * 6 + none
        if ctx.grads is None:
            raise RuntimeError("tigon.fused_linear_jsd forms its gradients in the forward and scales them in the "
                               "backward: a second backward through the same loss is not possible")
        grads, ctx.grads = ctx.grads, None
        gh, gw, gb = scale_grads(grads, grad_loss, ctx.dtypes, inplace=True)
        return (gh if ctx.need[0] else None, gw if ctx.need[1] else None, None, None, None,
                gb if ctx.need[2] else None) + none


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same loop as the autograd.Function above, as a torch.library custom op (see tigon.kernels): the gradients are
# outputs formed in the forward (as the fused cross-entropy's scalar path returns them), so that the compiled graph
# saves them like any activation; its backward only scales them.
@torch.library.custom_op("tigon::fused_linear_jsd", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _fljsd(student_input: Tensor, student_weight: Tensor, teacher_input: Tensor, teacher_weight: Tensor,
           labels: Optional[Tensor], student_bias: Optional[Tensor], teacher_bias: Optional[Tensor], beta: float,
           ignore_index: int, temperature: float, cd: torch.dtype, need_input: bool, need_weight: bool,
           need_bias: bool, lean: bool, budget: int, student_softcap: Optional[float] = None,
           teacher_softcap: Optional[float] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss 0-d fp32, grad_input, grad_weight, grad_bias) for an upstream gradient of 1, in the dtypes of
    :func:`~tigon.kernels.head_grads.grad_buffers`' scalar path; (0,) where not needed."""
    loss, grads = jsd_forward(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                              teacher_bias, beta, ignore_index, temperature, cd, (need_input, need_weight, need_bias),
                              lean, budget, halves=False, caps=(student_softcap, teacher_softcap))
    return (loss, *(or_empty(g, loss) for g in grads))


@_fljsd.register_fake
def _(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias, beta,
      ignore_index, temperature, cd, need_input, need_weight, need_bias, lean, budget, student_softcap=None,
      teacher_softcap=None):
    loss = student_input.new_empty((), dtype=torch.float32)
    need = (need_input, need_weight, need_bias)
    # the real allocator on fake tensors: the kernel path's shapes and dtypes by construction
    grads = grad_buffers(student_input.shape[0], student_input, student_weight, cd, need, lean, True)
    return (loss, *(or_empty(g, loss) for g in grads))


def _fljsd_setup(ctx, inputs, output):
    student_input, student_weight, _ti, _tw, _labels, student_bias, *_rest = inputs
    ctx.need, ctx.n_inputs = tuple(inputs[11:14]), len(inputs)
    ctx.dtypes = (student_input.dtype, student_weight.dtype, student_bias.dtype if student_bias is not None else None)
    ctx.save_for_backward(*output[1:])


def _fljsd_grad(ctx, grad_loss, *_unused):
    saved = [t if wanted else None for t, wanted in zip(ctx.saved_tensors, ctx.need)]
    gh, gw, gb = scale_grads(saved, grad_loss, ctx.dtypes, inplace=False)
    return (if_wanted(gh, ctx.need[0]), if_wanted(gw, ctx.need[1]), None, None, None,
            if_wanted(gb, ctx.need[2])) + (None,) * (ctx.n_inputs - 6)


_fljsd.register_autograd(_fljsd_grad, setup_context=_fljsd_setup)


def compiled_fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                              teacher_bias, beta, ignore_index, temperature, cd, need, lean=False, budget=-1,
                              student_softcap=None, teacher_softcap=None):
    """``FusedLinearJSDFunction.apply`` as the ``tigon::fused_linear_jsd`` custom op: the loss."""
    return _fljsd(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias,
                  float(beta), int(ignore_index), float(temperature), cd, *need, lean, budget, student_softcap,
                  teacher_softcap)[0]
