"""The divergence kernels as they were at 04bb6c3 (before the series of d = log P - log Q in jsd and the lg2 of
kl_div's probability targets): a frozen copy for ``benchmarks/divergence_tune.py`` to time against, not used by
the library. The torch.compile custom ops of the original are left out (their names would collide with the
library's). Original module docstring follows.

The distillation losses (generalised JSD, KL divergence, total variation distance) of two (N, V) tables: one
row-loop kernel for the family, its launcher and the autograd.Function.

Formulas and semantics: :mod:`tigon.reference.divergence`. Every loss here is a sum over the vocabulary of a
pointwise term ``l(x, y)`` of the input ``x`` and the target ``y`` at one position, so one kernel serves all of them:
each program owns ``BLOCK_M`` rows and walks the vocabulary in ``BLOCK_V`` columns (int64 row offsets, any V),
evaluating in fp32 the term and its two partial derivatives (:func:`_terms`, a ``KIND`` constexpr picks the formula;
jsd's in :func:`_jsd_parts`). Wide rows (V >= 4096) take one row per program: a skipped row writes its zeros without
reading anything, a kept one is walked with no row mask and no column mask but in its last block.

Arithmetic (jsd is compute-bound, not memory-bound, unless its term is cheap): per element, forward with the
gradient formed, compiled for sm_90 (SASS of the vocabulary loop, bf16, counted offline by
``benchmarks/sass_mix.py``): jsd
three special-function ops (2^(c x), 2^(c y), log2 M; ``ex2.approx.ftz`` and ``lg2.approx.ftz``) and about 22
instructions in all, where the previous form (P, Q from e^max and e^-|x - y|, M's log through ``tl.log``, selects
for zero probabilities) took 2 ``ex2`` with subnormal fix-ups, a ~25-instruction precise log and about 70
instructions (at 16384 x 128256 on an H200: 7.47 ms fwd + bwd, 40% of copy bandwidth, issue-bound). The KL kinds
take one ``ex2`` each. Since session 17 jsd's loss (not its gradients) adds the near-agreement series of
:func:`_jsd_term` (about 20 more FMAs a logit, no special-function op) for accuracy: not yet timed on the GPU.

Passes. jsd (``grad_in_forward``): the forward reads x and y once and writes the per-row loss sums (N fp32) and,
when the input (and / or the target) needs a gradient, ``scale * d l / d x`` (``d l / d y``) in the same pass, in
the input's dtype (Liger-Kernel's scheme); ``scale`` is the reduction's factor (1 / kept rows), a 0-d fp32 tensor
computed on the device from the labels (no host synchronisation). Its backward multiplies the saved gradient by the
upstream gradient in place (:func:`tigon.kernels.loss_rows.scale_rows_`, which reads the upstream on the device and
writes nothing when it is 1, as for ``loss.backward()``). Minimal bytes (N x V, element size e): forward 2 N V e,
forward + backward 3 N V e with upstream 1, against 5 N V e for a forward and a recomputing backward. With an
upstream other than 1 the gradient is rounded to the input's dtype twice (forward, then after scaling): in bf16
about 1.4x the error of one rounding, far inside the error of the same formula evaluated in bf16 (what plain PyTorch
code runs), which is the baseline. (jsd at beta=0 is kl_div's term and takes kl_div's backward below: one
rounding.)

tvd (``grad_in_forward`` too, as Liger-Kernel's): its gradient takes three values, ``+-c`` and 0 with ``c = scale /
2``, so the forward writes ``sign(x - y) * round(c)`` and the backward, for an upstream g other than 1, multiplies
by ``g * c / round(c)`` (a 0-d fp32 factor formed on the device): each element is then ``round(g * c)`` up to fp32
error, one rounding as the recomputing backward gives, not two. Forward + backward 3 N V e with upstream 1 (Liger's),
5 N V e otherwise.

kl_div (``grad_in_forward`` too, and jsd at beta=0, the same term: :data:`KL_KINDS`): its input gradient, ``-y`` or
``-exp(y)`` times scale and the upstream g, depends on the target alone. The forward reads x and y and writes the row
sums and ``round(scale * d l)`` (the target's gradient too when it is wanted: ``d l / d y`` depends on x as well,
``log max(y, eps) - x + 1`` or ``exp(y) (y - x + 1)``, and the forward holds both). The backward reads g on the
device (no host sync): where g == 1 it reads and writes nothing (the gradients are the forward's); otherwise it
rewrites them from the inputs, ``round(g * scale * d l)``, reading y (and x for the target's gradient): one rounding
for every upstream, as torch's own kl_div's backward (its baseline), never a rounded value rescaled (that costs 1.4x
torch's bf16 error, measured). Bytes with the input's gradient alone: forward 3 N V e, forward + backward 3 N V e
with upstream 1 (the floor: read x and y, write dx), 5 N V e otherwise (Liger's kl_div: 4 N V e with upstream 1, its
backward reads the target again); with the target's gradient too, 4 N V e with upstream 1 (x and y read, dx and dy
written), 8 N V e otherwise. The rewrite moves what scaling in place would (it reads y, or x and y, where scaling
reads dx, or dx and dy), so it costs nothing over it. The gradients formed in the forward are held from the forward
to the backward (N V e each, as jsd's). A second backward through the same loss (``retain_graph``) recomputes them
into new tensors, so any sequence of upstreams is exact.

Other reductions: ``reduction="none"`` (every kind) writes the (N, V) fp32 pointwise losses in the forward, and its
backward reads the inputs and the (N, V) upstream gradient (any strides, e.g. the stride-0 expansion of
``loss.sum()``'s) and writes ``upstream * scale * d l``, rounded once (tvd's: 5 N V e).

Rows whose label equals ``ignore_index`` are never read: their loss and gradients are 0.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from triton.language.extra.cuda import libdevice

from tigon.kernels._common import CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, next_pow2, or_empty, warps_for
from tigon.kernels.first_order import once_differentiable
from tigon.kernels.loss_rows import scale_rows_

# ---- the pointwise terms ------------------------------------------------------------------------------------------
KL_LOG = 0  # exp(y) (y - x): KL(P || Q), y = log P, x = log Q (kl_div log_target=True; jsd beta=0)
KL_LOG_REVERSE = 1  # exp(x) (x - y): KL(Q || P) (jsd beta=1)
JSD = 2  # beta P (log P - log M) + (1 - beta) Q (log Q - log M), M = beta P + (1 - beta) Q (jsd 0 < beta < 1)
KL_PROB = 3  # y (log max(y, eps) - x), y a probability (kl_div log_target=False)
TVD = 4  # |x - y| / 2, both probabilities
KL_KINDS = (KL_LOG, KL_PROB)
"""The kinds whose input gradient depends on the target alone (kl_div's, and jsd's at beta=0): a backward after
a forward that formed the gradients rewrites them from the inputs for an upstream other than 1 (see above)."""

MAX_BLOCK_V = 4096
"""Widest vocabulary block (columns) a program loads per step; tests lower it to walk the loop."""

TILE = 4096
INTERPRETER_TILE = 1 << 16
"""Elements of a program's [BLOCK_M, BLOCK_V] tile (compiled, and under Triton's interpreter, where each program
costs Python time): narrow rows are stacked up to it. Tests set both to :data:`MAX_BLOCK_V` to run one row per
program, the path of wide rows (a skipped row only writes zeros, a kept one is read with no row mask)."""


LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
NEG_BIG = tl.constexpr(-1e30)
"""Where a base-2 log-probability is clamped from below (-inf, a masked token, becomes this): exp2 of it is 0 and a
difference with it stays finite, so 0 * log 0 terms give 0 without a select per term."""
FP32_TINY = tl.constexpr(1.1754943508222875e-38)
"""The smallest normal fp32 (2^-126): the floor of the mixture M before its logarithm (below it lg2.approx.ftz, like
any flush-to-zero op, would read 0)."""


@triton.jit
def _log2(x, FAST: tl.constexpr):
    """log2 of an fp32 tile of positive normal numbers. FAST (compiled on an NVIDIA GPU): one special-function op,
    ``lg2.approx.ftz.f32`` (libdevice's ``fast_log2f``; PTX ISA: absolute error about 2^-22 of the result), where
    ``tl.math.log2`` compiles to a precise ~25-instruction polynomial; otherwise (Triton's interpreter, other
    backends) ``tl.math.log2``."""
    if FAST:
        return libdevice.fast_log2f(x)
    else:
        return tl.math.log2(x)


@triton.jit
def _exp(x, FAST: tl.constexpr):
    """exp of an fp32 tile. FAST (compiled on an NVIDIA GPU): ``2^(x log2 e)``, one ``ex2.approx.ftz`` (results
    under 2^-126 flush to 0; ``tl.exp`` compiles to the same op plus three instructions that keep them); otherwise
    ``tl.exp`` (the interpreter's is numpy's, correctly rounded)."""
    if FAST:
        return tl.math.exp2(x * LOG2E)
    else:
        return tl.exp(x)


@triton.jit
def _jsd_parts(x, y, c, beta, FAST: tl.constexpr):
    """``(gx, gy, Q, P)`` of the generalised JSD (0 < beta < 1) for fp32 tiles of the student's and the teacher's
    log-probabilities ``x = log Q``, ``y = log P`` in the unit of ``1 / c`` (``c = log2 e``: nats; 1: bits):
    ``gx = Q (log2 Q - log2 M)``, ``gy = P (log2 P - log2 M)``, M = beta P + (1 - beta) Q. In nats:

        l = ln2 ((1 - beta) gx + beta gy),  d l / d log Q = ln2 (1 - beta) gx,  d l / d log P = ln2 beta gy

    (``l = beta P (log P - log M) + (1 - beta) Q (log Q - log M)``; in d l / d log Q the log M terms, through M,
    give ``-(beta P + (1 - beta) Q) (1 - beta) Q / M = -(1 - beta) Q``, which cancels the ``+(1 - beta) Q`` of
    d(Q log Q)). Callers fold the weights and ln2 into their accumulator and their gradient's factor (per-row
    constants), so the term costs three special-function ops (Q = 2^(c x) and P = 2^(c y): ``ex2.approx.ftz``; log2 M:
    :func:`_log2`) and about a dozen arithmetic ones. ``c x - log2 M`` is one FMA (the product is not rounded before
    the difference: plain PyTorch's fp32 error where student and teacher nearly agree, not 1.4x it).

    P and Q are at most 1 (log-probabilities): nothing overflows. M is floored at 2^-126 (both probabilities below
    that: P = Q = 0 on the GPU, terms under 1e-36 anyway) and x, y at :data:`NEG_BIG`, so -inf log-probabilities
    (masked tokens, skipped rows, columns past V) give 0 * finite = 0: finite wherever the divergence is
    (0 < beta < 1), with no select per element. NaN inputs propagate."""
    x = tl.maximum(x, NEG_BIG, propagate_nan=tl.PropagateNan.ALL)
    y = tl.maximum(y, NEG_BIG, propagate_nan=tl.PropagateNan.ALL)
    q = tl.math.exp2(x * c)
    p = tl.math.exp2(y * c)
    log2_m = _log2(tl.maximum(beta * p + (1.0 - beta) * q, FP32_TINY), FAST)
    return q * tl.fma(x, c, -log2_m), p * tl.fma(y, c, -log2_m), q, p


JSD_NEAR = tl.constexpr(0.25)
"""|log Q - log P| (nats) below which :func:`_jsd_term` takes the series of the term in Q / P - 1."""


@triton.jit
def _jsd_term(x, y, p, direct, beta):
    """The generalised JSD's pointwise term in nats where student and teacher nearly agree, else ``direct``.

    With t = Q / P = e^(x - y), s = t - 1 and w = 1 - beta the term is ``P ((1 - w) f(1) + w f(t) - f(1 + w s))``,
    f(u) = u ln u: a Jensen gap, second order in s (about P beta (1 - beta) s^2 / 2), which the direct form (two
    first-order terms in log M, :func:`_jsd_parts`) computes by cancellation, so that the approximate ``lg2`` /
    ``ex2`` of the GPU (about 2^-22 absolute) dominate it where the distributions nearly agree (1.6% relative on a
    late-distillation test row on an H100). Below |x - y| < :data:`JSD_NEAR`: s = expm1(x - y) by its Taylor series
    to z^8 (truncation under z^9 / 9!) and the term by the series of (1 + a) ln(1 + a) = a + sum_k (-1)^k a^k /
    (k (k - 1)), which gives ``P s^2 sum_{k=2..8} (-1)^k w (1 - w^(k - 1)) s^(k - 2) / (k (k - 1))`` (truncation
    under about 0.3 s^7 of the leading term at s = e^0.25 - 1). Both inputs -inf: 0; one: ``direct`` (0); NaN:
    ``direct`` (NaN)."""
    z = (tl.maximum(x, NEG_BIG, propagate_nan=tl.PropagateNan.ALL)
         - tl.maximum(y, NEG_BIG, propagate_nan=tl.PropagateNan.ALL))  # (-inf - -inf: 0 here, P = 0)
    s = z * (1.0 + z * (0.5 + z * (0.16666666666666666 + z * (0.041666666666666664 + z * (
        0.008333333333333333 + z * (0.001388888888888889 + z * (0.0001984126984126984 + z * 2.48015873015873e-05)))))))
    w = 1.0 - beta
    w2 = w * w
    w3 = w2 * w
    w4 = w3 * w
    w5 = w4 * w
    w6 = w5 * w
    w7 = w6 * w
    a7 = -w * (1.0 - w6) / 42.0
    a8 = w * (1.0 - w7) / 56.0
    series = (w * (1.0 - w) * 0.5 + s * (-w * (1.0 - w2) / 6.0 + s * (w * (1.0 - w3) / 12.0 + s * (
        -w * (1.0 - w4) / 20.0 + s * (w * (1.0 - w5) / 30.0 + s * (a7 + s * a8))))))
    return tl.where(tl.abs(z) < JSD_NEAR, p * (s * s) * series, direct)


@triton.jit
def _terms(x, y, eps, KIND: tl.constexpr, FAST: tl.constexpr):
    """(l, d l / d x, d l / d y, Q) of fp32 tiles x, y for the kinds other than JSD (:func:`_jsd_parts`); Q =
    exp(x) for the log-probability kinds KL_LOG and KL_LOG_REVERSE (x otherwise; the compiler drops what a caller
    does not use). A term with a zero probability is 0 (with zero derivative in the input that carries it), so -inf
    log-probabilities give no NaN. Exponentials: :func:`_exp` (one special-function op on the GPU)."""
    if KIND == 0:
        p = _exp(y, FAST)
        d = tl.where(p > 0, y - x, 0.0)
        loss = p * d
        dx = -p
        dy = loss + p
        q = _exp(x, FAST)
    elif KIND == 1:
        q = _exp(x, FAST)
        d = tl.where(q > 0, x - y, 0.0)
        loss = q * d
        dx = loss + q
        dy = -q
    elif KIND == 3:
        live = y != 0
        d = tl.where(live, tl.log(tl.maximum(y, eps)) - x, 0.0)
        loss = y * d
        dx = -y
        dy = tl.where(live, d + tl.where(y >= eps, 1.0, 0.0), 0.0)
        q = x
    else:
        loss = 0.5 * tl.abs(x - y)
        dx = tl.where(x > y, 0.5, tl.where(x < y, -0.5, 0.0))
        dy = -dx
        q = x
    return loss, dx, dy, q


@triton.jit
def _divergence_kernel(
    X, stride_x,  # (n, V) input rows, unit column stride; row r starts at X + r * stride_x
    Y, stride_y,  # (n, V) target rows, unit column stride
    LABELS,  # (n,) integer labels (HAS_LABELS): rows labelled ignore_index are skipped
    SCALE,  # 0-d fp32: the reduction's factor, multiplies the gradients (not the row losses)
    G, stride_gm, stride_gv,  # (n, V) upstream gradient (HAS_G), any strides: reduction="none"'s, or a 0-d one
    #                           expanded (strides 0) for a recomputing backward
    LOSS, stride_loss,  # (n,) fp32 row sums, or (n, V) fp32 pointwise losses (ELEMENTWISE)
    DX, stride_dx,  # (n, V) gradient of the input (WRITE_DX), contiguous
    DY, stride_dy,  # (n, V) gradient of the target (WRITE_DY), contiguous
    n_rows, V, ignore_index, beta, eps,
    KIND: tl.constexpr, HAS_LABELS: tl.constexpr, WRITE_LOSS: tl.constexpr, ELEMENTWISE: tl.constexpr,
    WRITE_DX: tl.constexpr, WRITE_DY: tl.constexpr, HAS_G: tl.constexpr, LOAD_X: tl.constexpr,
    SKIP_UNIT_G: tl.constexpr, FAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    # SKIP_UNIT_G: G is a 0-d upstream gradient (expanded, strides 0), read here on the device; where it is 1 the
    # program reads and writes nothing (kl_div's backward after a forward that wrote the gradient for g = 1)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    in_rows = rows < n_rows
    keep = in_rows
    if HAS_LABELS:
        label = tl.load(LABELS + rows, mask=in_rows, other=ignore_index)
        keep = in_rows & (label != ignore_index)
    run = True
    if SKIP_UNIT_G:
        run = tl.load(G).to(tl.float32) != 1.0
    if run:
        if BLOCK_M == 1:
            # one row (wide rows: the grid has exactly n programs): a skipped row only writes its zeros, a kept one
            # is walked with no row mask (every load, store and select of the walk unmasked but the last block's)
            if tl.max(keep.to(tl.int32), axis=0) != 0:
                every = tl.full([BLOCK_M], 1, tl.int1)
                _walk(X, stride_x, Y, stride_y, G, stride_gm, stride_gv, LOSS, stride_loss, DX, stride_dx, DY,
                      stride_dy, SCALE, rows, every, every, V, beta, eps, KIND, WRITE_LOSS, ELEMENTWISE, WRITE_DX,
                      WRITE_DY, HAS_G, LOAD_X, FAST, BLOCK_M, BLOCK_V)
            else:
                _zero_row(LOSS, stride_loss, DX, stride_dx, DY, stride_dy, rows, V, WRITE_LOSS, ELEMENTWISE,
                          WRITE_DX, WRITE_DY, BLOCK_M, BLOCK_V)
        else:
            _walk(X, stride_x, Y, stride_y, G, stride_gm, stride_gv, LOSS, stride_loss, DX, stride_dx, DY, stride_dy,
                  SCALE, rows, in_rows, keep, V, beta, eps, KIND, WRITE_LOSS, ELEMENTWISE, WRITE_DX, WRITE_DY, HAS_G,
                  LOAD_X, FAST, BLOCK_M, BLOCK_V)


@triton.jit
def _walk(X, stride_x, Y, stride_y, G, stride_gm, stride_gv, LOSS, stride_loss, DX, stride_dx, DY, stride_dy, SCALE,
          rows, in_rows, keep, V, beta, eps, KIND: tl.constexpr, WRITE_LOSS: tl.constexpr, ELEMENTWISE: tl.constexpr,
          WRITE_DX: tl.constexpr, WRITE_DY: tl.constexpr, HAS_G: tl.constexpr, LOAD_X: tl.constexpr,
          FAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr):
    """:func:`_divergence_kernel`'s walk over the vocabulary of its rows (``in_rows``: the rows that exist,
    ``keep``: those read): whole blocks with no column mask, then the ragged last one. The row sums of the losses
    are accumulated per element in a [BLOCK_M, BLOCK_V] fp32 tile (one add per element, no reduction per block) and
    stored at the end."""
    scale = tl.load(SCALE)
    acc = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    full = V - V % BLOCK_V
    for start in range(0, full, BLOCK_V):
        acc = _step(X, stride_x, Y, stride_y, G, stride_gm, stride_gv, LOSS, stride_loss, DX, stride_dx, DY,
                    stride_dy, rows, in_rows, keep, scale, acc, start, V, beta, eps, KIND, WRITE_LOSS, ELEMENTWISE,
                    WRITE_DX, WRITE_DY, HAS_G, LOAD_X, FAST, False, BLOCK_M, BLOCK_V)
    if full < V:
        acc = _step(X, stride_x, Y, stride_y, G, stride_gm, stride_gv, LOSS, stride_loss, DX, stride_dx, DY,
                    stride_dy, rows, in_rows, keep, scale, acc, full, V, beta, eps, KIND, WRITE_LOSS, ELEMENTWISE,
                    WRITE_DX, WRITE_DY, HAS_G, LOAD_X, FAST, True, BLOCK_M, BLOCK_V)
    if WRITE_LOSS and not ELEMENTWISE:
        tl.store(LOSS + rows * stride_loss, tl.sum(acc, axis=1), mask=in_rows)


@triton.jit
def _step(X, stride_x, Y, stride_y, G, stride_gm, stride_gv, LOSS, stride_loss, DX, stride_dx, DY, stride_dy,
          rows, in_rows, keep, scale, acc, start, V, beta, eps, KIND: tl.constexpr, WRITE_LOSS: tl.constexpr,
          ELEMENTWISE: tl.constexpr, WRITE_DX: tl.constexpr, WRITE_DY: tl.constexpr, HAS_G: tl.constexpr,
          LOAD_X: tl.constexpr, FAST: tl.constexpr, RAGGED: tl.constexpr, BLOCK_M: tl.constexpr,
          BLOCK_V: tl.constexpr):
    """One vocabulary block (columns ``start`` ...) of :func:`_walk`: writes what it writes there and returns
    ``acc`` plus the block's losses (when they are summed). RAGGED: the block runs past V (its columns are masked;
    the other blocks need no column mask)."""
    cols = start + tl.arange(0, BLOCK_V)
    if RAGGED:
        in_cols = (cols < V)[None, :]
    else:
        in_cols = tl.full([1, BLOCK_V], 1, tl.int1)
    read = keep[:, None] & in_cols  # skipped rows are never read
    # jsd: -inf where nothing is read makes its terms and derivatives exactly 0 there (see _jsd_parts); the other
    # kinds read 0 there and select
    fill = float("-inf") if KIND == 2 else 0.0
    if LOAD_X:
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=read, other=fill).to(tl.float32)
    else:  # (kl_div's input gradient depends on the target alone)
        x = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=read, other=fill).to(tl.float32)
    coef = scale
    if HAS_G:
        coef = tl.load(G + rows[:, None] * stride_gm + cols[None, :].to(tl.int64) * stride_gv, mask=read,
                       other=0.0).to(tl.float32) * scale
    if KIND == 2:
        # jsd in bits: ln2 and the weights folded into the accumulation (two FMAs) and the gradients' factors
        gx, gy, _q, p = _jsd_parts(x, y, LOG2E, beta, FAST)
        wx = (1.0 - beta) * LN2
        wy = beta * LN2
        if WRITE_LOSS:
            if ELEMENTWISE:
                loss = _jsd_term(x, y, p, wx * gx + wy * gy, beta)
            else:
                acc = acc + _jsd_term(x, y, p, wx * gx + wy * gy, beta)
        dx = gx * (wx * coef)
        dy = gy * (wy * coef)
    else:
        loss, dx, dy, _q = _terms(x, y, eps, KIND, FAST)
        loss = tl.where(read, loss, 0.0)
        if WRITE_LOSS and not ELEMENTWISE:
            acc += loss
        dx = tl.where(read, dx * coef, 0.0)
        dy = tl.where(read, dy * coef, 0.0)
    out = in_rows[:, None] & in_cols
    if WRITE_LOSS and ELEMENTWISE:
        tl.store(LOSS + rows[:, None] * stride_loss + cols[None, :], loss, mask=out)
    if WRITE_DX:
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=out)
    if WRITE_DY:
        tl.store(DY + rows[:, None] * stride_dy + cols[None, :], dy.to(DY.dtype.element_ty), mask=out)
    return acc


@triton.jit
def _zero_row(LOSS, stride_loss, DX, stride_dx, DY, stride_dy, rows, V, WRITE_LOSS: tl.constexpr,
              ELEMENTWISE: tl.constexpr, WRITE_DX: tl.constexpr, WRITE_DY: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_V: tl.constexpr):
    """A skipped row's outputs: its zeros (loss sum, pointwise losses, gradients), nothing read."""
    zero = tl.zeros([BLOCK_M, BLOCK_V], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        out = (cols < V)[None, :]
        if WRITE_LOSS and ELEMENTWISE:
            tl.store(LOSS + rows[:, None] * stride_loss + cols[None, :], zero, mask=out)
        if WRITE_DX:
            tl.store(DX + rows[:, None] * stride_dx + cols[None, :], zero.to(DX.dtype.element_ty), mask=out)
        if WRITE_DY:
            tl.store(DY + rows[:, None] * stride_dy + cols[None, :], zero.to(DY.dtype.element_ty), mask=out)
    if WRITE_LOSS and not ELEMENTWISE:
        tl.store(LOSS + rows * stride_loss, tl.sum(zero, axis=1))


# ---- launcher -----------------------------------------------------------------------------------------------------
class Divergence(NamedTuple):
    """Which loss and its scalar options: ``kind`` (:data:`KL_LOG` ... :data:`TVD`), ``beta`` (JSD), ``eps``
    (KL_PROB), ``ignore_index`` (rows of that label are skipped)."""

    kind: int
    beta: float = 0.5
    eps: float = 1e-10
    ignore_index: int = -100


def fast_math(device: torch.device) -> bool:
    """The ``FAST`` constexpr of the kernels here (:func:`_log2`): compiled on an NVIDIA GPU (not ROCm, not the
    interpreter)."""
    return compiled_cuda(device) and torch.version.hip is None


def _blocks(n: int, vocab: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_V, num_warps). A vocabulary block of up to :data:`MAX_BLOCK_V` columns (4096: two fp32 tiles
    of 16 KB for x and y per step, 8 warps); narrower rows are stacked so a tile holds about :data:`TILE` elements
    (:data:`INTERPRETER_TILE` under the interpreter). One row per program (BLOCK_M = 1) is the kernels' wide-row
    path (see :func:`_divergence_kernel`)."""
    block_v = min(next_pow2(vocab), MAX_BLOCK_V)
    target = TILE if compiled_cuda(device) else INTERPRETER_TILE
    block_m = max(1, min(64, target // block_v, next_pow2(n)))
    return block_m, block_v, warps_for(block_m * block_v)


def launch(x, y, labels, scale, opts: Divergence, *, loss=None, elementwise=False, dx=None, dy=None, g=None,
           skip_unit_g=False):
    """Run :func:`_divergence_kernel` on rows ``x``, ``y`` (n, V) (unit column stride).

    labels: (n,) contiguous integers or None. scale: 0-d fp32 tensor. loss: (n,) or, ``elementwise``, (n, V) fp32
    output, or None. dx, dy: (n, V) contiguous gradient outputs or None. g: (n, V) upstream gradient (any strides) or
    None (the gradients are ``scale * d l``). skip_unit_g: ``g`` is a 0-d tensor expanded (strides 0) and the kernel
    writes nothing where it is 1 (no loss then). ``x`` is never read when only kl_div's input gradient is written:
    any (n, V) tensor (the target) may stand in for it.
    """
    n, vocab = x.shape
    if skip_unit_g and (g is None or g.stride() != (0, 0) or loss is not None):
        raise ValueError("skip_unit_g needs a 0-d upstream gradient g expanded to (n, V) and no loss output")
    if n == 0:
        return
    block_m, block_v, warps = _blocks(n, vocab, x.device)
    dummy = scale
    load_x = loss is not None or dy is not None or opts.kind not in (KL_LOG, KL_PROB)
    _divergence_kernel[(cdiv(n, block_m),)](
        x, x.stride(0), y, y.stride(0), labels if labels is not None else dummy, scale,
        g if g is not None else dummy, g.stride(0) if g is not None else 0, g.stride(1) if g is not None else 0,
        loss if loss is not None else dummy, loss.stride(0) if loss is not None else 0,
        dx if dx is not None else x, dx.stride(0) if dx is not None else 0,
        dy if dy is not None else x, dy.stride(0) if dy is not None else 0,
        n, vocab, int(opts.ignore_index), float(opts.beta), float(opts.eps),
        KIND=opts.kind, HAS_LABELS=labels is not None, WRITE_LOSS=loss is not None, ELEMENTWISE=elementwise,
        WRITE_DX=dx is not None, WRITE_DY=dy is not None, HAS_G=g is not None, LOAD_X=load_x,
        SKIP_UNIT_G=bool(skip_unit_g), FAST=fast_math(x.device), BLOCK_M=block_m, BLOCK_V=block_v, num_warps=warps,
    )


def reduction_scale(labels, ignore_index: int, n: int, vocab: int, reduction: str, device) -> torch.Tensor:
    """The reduction's factor as a 0-d fp32 tensor on ``device``, computed there (no host sync): 1 for "sum" /
    "none", 1 / kept rows for "batchmean", 1 / (kept rows * V) for "mean"; 0 when nothing is kept."""
    f32 = dict(dtype=torch.float32, device=device)
    if reduction in ("sum", "none"):
        return torch.ones((), **f32)
    per_row = vocab if reduction == "mean" else 1
    if labels is None:
        return torch.full((), 1.0 / (n * per_row) if n else 0.0, **f32)
    kept = (labels != ignore_index).sum().to(torch.float32) * per_row
    return torch.where(kept > 0, 1.0 / torch.where(kept > 0, kept, torch.ones_like(kept)), torch.zeros_like(kept))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


# ---- autograd -----------------------------------------------------------------------------------------------------
class DivergenceFunction(torch.autograd.Function):
    """``apply(input, target, labels, opts, reduction, grad_in_forward) -> loss`` for (N, V) input and target
    (float32 / bfloat16 / float16, any strides), labels (N,) integers or None, ``opts`` a :class:`Divergence`,
    ``reduction`` one of "sum", "mean", "batchmean" (a 0-d fp32 loss) or "none" ((N, V) fp32).

    Gradients flow to the input and to the target (each written only when it is needed), in their dtypes. With
    ``grad_in_forward`` a scalar reduction forms them in the forward; the backward keeps them for an upstream of 1 and
    otherwise scales them in place (jsd, tvd: a second backward through the same graph then raises) or, for
    :data:`KL_KINDS`, rewrites them from the inputs (one rounding; a second backward recomputes them). Without it the
    backward reads the inputs again and writes ``upstream * scale * d l`` rounded once, as the unfused computation
    does.
    """

    @staticmethod
    def forward(ctx, input, target, labels, opts, reduction, grad_in_forward):
        x, y = _rows(input), _rows(target)
        labels = labels.contiguous() if labels is not None else None
        n, vocab = x.shape
        scale = reduction_scale(labels, opts.ignore_index, n, vocab, reduction, x.device)
        want_dx, want_dy = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.opts, ctx.consumed = opts, False
        ctx.formed = grad_in_forward and reduction != "none" and (want_dx or want_dy)
        # kl_div: the backward rewrites the formed gradients from the inputs where the upstream is not 1
        ctx.rewrite = ctx.formed and opts.kind in KL_KINDS
        if reduction == "none":
            loss = torch.empty((n, vocab), dtype=torch.float32, device=x.device)
            launch(x, y, labels, scale, opts, loss=loss, elementwise=True)
        else:
            rows = torch.empty(n, dtype=torch.float32, device=x.device)
            dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if ctx.formed and want_dx else None
            dy = torch.empty(y.shape, dtype=y.dtype, device=y.device) if ctx.formed and want_dy else None
            launch(x, y, labels, scale, opts, loss=rows, dx=dx, dy=dy)
            loss = rows.sum() * scale
        if ctx.rewrite:  # x is read only for the target's gradient: the target stands in for it otherwise
            ctx.save_for_backward(dx, dy, x if want_dy else y, y, labels, scale)
        else:
            ctx.save_for_backward(*((dx, dy, scale) if ctx.formed else (x, y, labels, scale)))
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        if ctx.rewrite and not ctx.consumed:  # kl_div: one rounding of g * scale * d l for every upstream g
            ctx.consumed = True
            dx, dy, x, y, labels, scale = ctx.saved_tensors
            launch(x, y, labels, scale, ctx.opts, dx=dx, dy=dy, g=grad.expand(x.shape), skip_unit_g=True)
            return dx, dy, None, None, None, None
        if ctx.formed and not ctx.rewrite:
            if ctx.consumed:
                raise RuntimeError("tigon.jsd (0 < beta <= 1) and tigon.tvd form their gradients in the forward and "
                                   "scale them in place in the backward: a second backward through the same loss is "
                                   "not possible")
            ctx.consumed = True
            dx, dy, scale = ctx.saved_tensors
            g = grad.to(torch.float32)
            tvd = ctx.opts.kind == TVD  # every gradient is +-round(c) or 0: rescale to one rounding of g * c

            def scaled(d):  # (per tensor: the input's and the target's dtypes may differ)
                return None if d is None else scale_rows_(d, _tvd_factor(g, scale, d.dtype) if tvd else g)
            return scaled(dx), scaled(dy), None, None, None, None
        if ctx.rewrite:  # a second backward of kl_div's (retained graph) recomputes: the first one's gradients are
            # the caller's now (x may be the target standing in: the formed gradients have the dtypes)
            formed_dx, formed_dy, x, y, labels, scale = ctx.saved_tensors
            dx, dy = (None if d is None else torch.empty_like(d) for d in (formed_dx, formed_dy))
        else:
            x, y, labels, scale = ctx.saved_tensors
            want_dx, want_dy = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_dx else None
            dy = torch.empty(y.shape, dtype=y.dtype, device=y.device) if want_dy else None
        launch(x, y, labels, scale, ctx.opts, dx=dx, dy=dy, g=grad.expand(x.shape))  # 0-d upstream: strides 0
        return dx, dy, None, None, None, None


def _tvd_factor(g: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 0-d fp32 factor that turns tvd's forward-formed gradient ``+-round(c)`` (``c = scale / 2`` rounded to
    ``dtype``) into ``+-g * c``: 1 where g is 1 (nothing is written then), else ``g * c / round(c)`` (``g`` where
    round(c) is 0: every gradient is 0)."""
    c = scale * 0.5
    rc = c.to(dtype).to(torch.float32)
    return torch.where(g == 1, torch.ones_like(g), g * torch.where(rc != 0, c / torch.where(rc != 0, rc, c),
                                                                   torch.ones_like(c)))


