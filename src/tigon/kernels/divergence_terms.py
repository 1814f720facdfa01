"""The pointwise terms of the divergence kernels (:mod:`tigon.kernels.divergence`,
:mod:`tigon.kernels.fused_linear_jsd`): each kind's per-element loss and its derivatives, in base 2 with the GPU's fast
special functions, and the series that keeps jsd exact where the two distributions nearly agree (:func:`_jsd_parts`).
Formulas: the divergence reference, :mod:`tigon.reference.divergence` (Liger-Kernel's semantics: inputs are
log-probabilities; the generalised JSD of Lin 1991 with ``beta``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import libdevice

# ---- the kinds ------------------------------------------------------------------------------------------
KL_LOG = 0  # exp(y) (y - x): KL(P || Q), y = log P, x = log Q (kl_div log_target=True; jsd beta=0)
KL_LOG_REVERSE = 1  # exp(x) (x - y): KL(Q || P) (jsd beta=1)
JSD = 2  # beta P (log P - log M) + (1 - beta) Q (log Q - log M), M = beta P + (1 - beta) Q (jsd 0 < beta < 1)
KL_PROB = 3  # y (log max(y, eps) - x), y a probability (kl_div log_target=False)
TVD = 4  # |x - y| / 2, both probabilities
KL_KINDS = (KL_LOG, KL_PROB)
"""The kinds whose input gradient depends on the target alone (kl_div's, and jsd's at beta=0): a backward after
a forward that formed the gradients rewrites them from the inputs for an upstream other than 1 (see above)."""

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
LN2_HI = tl.constexpr(0.693359375)
LN2_LO = tl.constexpr(-2.1219444005469057e-04)
"""ln2 = LN2_HI + LN2_LO to about 1e-12 (LN2_HI has 11 significant bits: its product with an fp32 is exact in an
FMA)."""
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


JSD_NEAR = tl.constexpr(0.5)
"""|log P - log Q| (nats) below which :func:`_jsd_parts` takes its series in ``d = log P - log Q`` (all of the loss
and of both gradients); at and above it the direct form. From the error study of ``benchmarks/jsd_series_study.py``:
the series to d^8 (log M / Q) and d^9 (the loss) stay within 2^-24 relative of their sums up to |d| = 0.5 for any
beta, and above 0.5 the direct form through the GPU's approximate lg2 / ex2 is within about 1.4e-5 (median, beta
0.1 .. 0.9) of the loss term (5.7e-5 at 0.25, 1.2e-2 at 0.01: why the series)."""


@triton.jit
def _jsd_parts(x, y, c, beta, FAST: tl.constexpr):
    """``(l2, gx, gy, Q, P)`` of the generalised JSD (0 < beta < 1) for fp32 tiles of the student's and the
    teacher's log-probabilities ``x = log Q``, ``y = log P`` in the unit of ``1 / c`` (``c = log2 e``: nats; 1:
    bits): the pointwise loss in bits ``l2 = l / ln2``, ``gx = Q (log2 Q - log2 M)``, ``gy = P (log2 P - log2 M)``,
    M = beta P + (1 - beta) Q. In nats:

        l = beta P (log P - log M) + (1 - beta) Q (log Q - log M) = ln2 l2,
        d l / d log Q = ln2 (1 - beta) gx,  d l / d log P = ln2 beta gy

    (in d l / d log Q the log M terms, through M, give ``-(beta P + (1 - beta) Q) (1 - beta) Q / M = -(1 - beta) Q``,
    which cancels the ``+(1 - beta) Q`` of d(Q log Q); so ``l = d l / d log Q + d l / d log P``). Callers fold the
    weights and ln2 into their gradient's factor (a per-row constant).

    With d = log P - log Q (nats) everything but Q and P is a function of d: log M - log Q = K(d) = log(1 - beta +
    beta e^d) (the cumulant generating function of a Bernoulli(beta)), ``gx = -Q K / ln2``, ``gy = P (d - K) / ln2``
    and ``l = Q J(d)``, ``J = beta e^d (d - K) - (1 - beta) K``: a Jensen gap, ``beta (1 - beta) d^2 / 2 + O(d^3)``,
    which the direct form ``ln2 ((1 - beta) gx + beta gy)`` computes from two first-order terms (cancellation: the
    GPU's approximate lg2 / ex2, about 2^-22, left a late-distillation test row's loss 1.6e-2 off on an H100, and
    its gradients 1e-4 off). So where |d| < :data:`JSD_NEAR`: K and J by their Taylor series in d (to d^8 and d^9;
    radius of convergence at least pi, the zeros of 1 - beta + beta e^d; the coefficients are polynomials in beta,
    formed once per program: loop-invariant scalars), ``d - K`` as one FMA (no cancellation: its series starts at
    (1 - beta) d); elsewhere the direct form, ``Q (c x - log2 M)`` and ``P (c y - log2 M)`` (one FMA each, the product
    unrounded). Special-function ops per element: three (Q = 2^(c x), P = 2^(c y): ``ex2.approx.ftz``; log2 M:
    :func:`_log2`), no division; the series are about 18 FMAs, each element taking one form by three selects.

    P and Q are at most 1 (log-probabilities): nothing overflows. M is floored at 2^-126 (both probabilities below
    that: P = Q = 0 on the GPU, terms under 1e-36 anyway) and x, y at :data:`NEG_BIG`, so -inf log-probabilities
    (masked tokens, skipped rows, columns past V) give 0 * finite = 0 (both -inf: d = 0, the series, Q = P = 0):
    finite wherever the divergence is (0 < beta < 1), with no select per element for them. NaN inputs propagate
    (NaN d takes the direct form)."""
    x = tl.maximum(x, NEG_BIG, propagate_nan=tl.PropagateNan.ALL)
    y = tl.maximum(y, NEG_BIG, propagate_nan=tl.PropagateNan.ALL)
    q = tl.math.exp2(x * c)
    p = tl.math.exp2(y * c)
    # the direct form
    log2_m = _log2(tl.maximum(beta * p + (1.0 - beta) * q, FP32_TINY), FAST)
    a_far = tl.fma(x, c, -log2_m)
    b_far = tl.fma(y, c, -log2_m)
    # the series, in the caller's unit: u = y - x = d / s (exact where they nearly agree), coefficients times s^n
    s = c * LN2
    v = beta * (1.0 - beta)
    w = 1.0 - 2.0 * beta
    s2 = s * s
    s3 = s2 * s
    s4 = s2 * s2
    # -K(d) log2 e = u * (k1 + u (k2 + ... + u k8)), k_n = -kappa_n s^n log2 e / n!, kappa_n beta's cumulants
    kn = -LOG2E * v
    k1 = -LOG2E * beta * s
    k2 = kn * s2 * 0.5
    k3 = kn * s3 * w * (1.0 / 6.0)
    k4 = kn * s4 * (1.0 - 6.0 * v) * (1.0 / 24.0)
    k5 = kn * (s4 * s) * w * (1.0 - 12.0 * v) * (1.0 / 120.0)
    k6 = kn * (s4 * s2) * (1.0 + v * (-30.0 + 120.0 * v)) * (1.0 / 720.0)
    k7 = kn * (s4 * s3) * w * (1.0 + v * (-60.0 + 360.0 * v)) * (1.0 / 5040.0)
    k8 = kn * (s4 * s4) * (1.0 + v * (-126.0 + v * (1680.0 - 5040.0 * v))) * (1.0 / 40320.0)
    # J(d) log2 e = u^2 (j2 + u (j3 + ... + u j9)), j_n = J's d^n coefficient times s^n log2 e
    jn = LOG2E * v
    j2 = jn * s2 * 0.5
    j3 = jn * s3 * (1.0 / 3.0 - beta * (1.0 / 6.0))
    j4 = jn * s4 * (0.125 + beta * (beta * (1.0 / 12.0) - 1.0 / 6.0))
    j5 = jn * (s4 * s) * (1.0 / 30.0 + beta * (beta * (7.0 / 60.0 - beta * 0.05) - 11.0 / 120.0))
    j6 = jn * (s4 * s2) * (1.0 / 144.0 + beta * (beta * (beta * (beta * (1.0 / 30.0) - 11.0 / 120.0) + 4.0 / 45.0)
                                                  - 13.0 / 360.0))
    j7 = jn * (s4 * s3) * (1.0 / 840.0 + beta * (beta * (beta * (beta * (8.0 / 105.0 - beta * (1.0 / 42.0))
                                                                    - 19.0 / 210.0) + 61.0 / 1260.0) - 19.0 / 1680.0))
    j8 = jn * (s4 * s4) * (1.0 / 5760.0 + beta * (beta * (beta * (beta * (beta * (beta * (1.0 / 56.0) - 11.0 / 168.0)
                                                                          + 13.0 / 140.0) - 71.0 / 1120.0)
                                                          + 47.0 / 2240.0) - 1.0 / 336.0))
    j9 = jn * (s4 * s4 * s) * (1.0 / 45360.0 + beta * (beta * (beta * (beta * (beta * (beta * (
        29.0 / 504.0 - beta * (1.0 / 72.0)) - 2.0 / 21.0) + 67.0 / 840.0) - 709.0 / 20160.0) + 463.0 / 60480.0)
        - 247.0 / 362880.0))
    u = y - x
    near = tl.abs(u) < JSD_NEAR / s
    a_near = u * (k1 + u * (k2 + u * (k3 + u * (k4 + u * (k5 + u * (k6 + u * (k7 + u * k8)))))))  # -K log2 e
    b_near = tl.fma(u, c, a_near)  # (d - K) log2 e
    l2_near = q * ((u * u) * (j2 + u * (j3 + u * (j4 + u * (j5 + u * (j6 + u * (j7 + u * (j8 + u * j9))))))))
    gx = q * tl.where(near, a_near, a_far)
    gy = p * tl.where(near, b_near, b_far)
    l2 = tl.where(near, l2_near, (1.0 - beta) * gx + beta * gy)
    return l2, gx, gy, q, p


@triton.jit
def _log1p_poly(f):
    """``P(f)`` with ``ln(1 + f) = f + f^2 P(f)`` for an fp32 tile f in ``[sqrt(1/2) - 1, sqrt(2) - 1]`` (the mantissa
    m = 1 + f of KL_PROB's target): Horner's form, 8 FMAs. P (degree 8) is the minimax fit of the absolute error
    (Remez exchange, then the coefficients made fp32 one at a time, the higher ones refitted: Lawson's algorithm),
    derived and checked by ``benchmarks/kl_log_poly.py``: ``|ln(1 + f) - f - f^2 P| <= 8.1e-10`` in exact
    arithmetic; in fp32, ``fma(f * f, P, f)`` is within 0.73 ulp (2.1e-8) of ln m over all 2^23 mantissas, mean error
    8e-11 (no bias)."""
    p = tl.fma(f, -0.0760907, 0.13051231)
    p = tl.fma(p, f, -0.13328032)
    p = tl.fma(p, f, 0.14161292)
    p = tl.fma(p, f, -0.16594371)
    p = tl.fma(p, f, 0.20002747)
    p = tl.fma(p, f, -0.25002372)
    p = tl.fma(p, f, 0.3333332)
    return tl.fma(p, f, -0.49999976)


@triton.jit
def _terms(x, y, eps, KIND: tl.constexpr, FAST: tl.constexpr):
    """(l, d l / d x, d l / d y, Q) of fp32 tiles x, y for the kinds other than JSD (:func:`_jsd_parts`); Q =
    exp(x) for the log-probability kinds KL_LOG and KL_LOG_REVERSE (x otherwise; the compiler drops what a caller
    does not use). A term with a zero probability is 0 (with zero derivative in the input that carries it), so -inf
    log-probabilities give no NaN. Exponentials: :func:`_exp` (one special-function op on the GPU); KL_PROB's log:
    a polynomial of the target's mantissa in fp32 FMAs (:func:`_log1p_poly`), see below."""
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
        # log max(y, eps) - x = ((e LN2_HI - x + f) + f^2 P(f)) + e LN2_LO: y = m 2^e, m in [sqrt(1/2), sqrt(2)), split
        # off by bit operations (k = bits(y) - bits(sqrt(1/2)) >> 23, arithmetic; bits(m) = bits(y) - (k << 23)),
        # f = m - 1 exact (Sterbenz) and ln(1 + f) = f + f^2 P(f) by :func:`_log1p_poly` (8 FMAs; P's minimax fit and
        # its fp32 error: benchmarks/kl_log_poly.py). All fp32 FMAs, no special function: not the GPU's lg2.approx
        # (FAST), whose about 2^-22.6 absolute error is biased, not random, so it adds up over a row: a near-identical
        # KL (8 x 3001, about 5e-5 a row) came out 6.4e-4 off float64 on an H100 (session 30). log y - x cancels where
        # target and input nearly agree, so nothing large is rounded before it: e LN2_HI - x is exact in the FMA
        # (LN2_HI has 11 significant bits; the result is on x's grid), adding f is exact where x is about log y and
        # |x| >= 1/2 (both on a 2^-24 grid, the sum under 0.1), the rounded terms (f^2, P, the FMA with them) are
        # under 0.2; e LN2_LO comes last, rounded at the ulp of the result (added before the cancellation, to a sum on
        # x's coarse grid, it rounded the same way every time: a bias of 3e-9). ln2 in two parts: fp32's ln2 alone
        # (2.7e-9 off) would bias the row sum by 2.7e-9 times the target's entropy. Every 2^23 mantissa: ln m within
        # 0.73 ulp, mean error 8e-11; log y - x where x = fp32(log y): within 6.9e-9, mean 1.2e-10 (the precise log2
        # of m in [1, 2) it replaces: 5.0e-8, mean 4e-11). Floored at 2^-126 (normal: the split needs it; moves only
        # terms under 1e-37).
        ym = tl.maximum(y, tl.maximum(eps, FP32_TINY))
        bits = ym.to(tl.int32, bitcast=True)
        k = (bits - 0x3F3504F3) >> 23
        f = (bits - (k << 23)).to(tl.float32, bitcast=True) - 1.0
        e = k.to(tl.float32)
        d = tl.fma(e, LN2_LO, tl.fma(f * f, _log1p_poly(f), tl.fma(e, LN2_HI, -x) + f))
        d = tl.where(live, d, 0.0)
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
