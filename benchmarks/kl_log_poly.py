"""The polynomial behind kl_div's log of probability targets (:func:`tigon.kernels.divergence_terms._terms`, KL_PROB),
its derivation and its error in fp32 (CPU only).

    PYTHONPATH=src python3 benchmarks/kl_log_poly.py [--degree 8] [--grid 65536]

The kernel writes a target ``y = m 2^e`` with ``m`` in ``[sqrt(1/2), sqrt(2))`` (bit operations: ``k = (bits(y) -
bits(sqrt(1/2))) >> 23``, ``bits(m) = bits(y) - (k << 23)``), so ``f = m - 1`` in ``[-0.293, 0.414]`` is exact
(Sterbenz), and evaluates ``log y - x = ((e LN2_HI - x + f) + f^2 P(f)) + e LN2_LO``: ``P`` (``--degree``; the
kernel's: 8, 9 coefficients) in Horner form, fp32 FMAs, no division, no special case (m is normal here).

Method. ``P`` minimises the absolute error ``max |log(1 + f) - f - f^2 P(f)|`` over ``[sqrt(1/2) - 1, sqrt(2) - 1]``
(Chebyshev's weighted minimax problem, weight ``f^2``), found by the Remez exchange algorithm (Remez 1934; e.g.
Muller, *Elementary Functions*, 3rd ed., ch. 3): solve for the coefficients and the levelled error ``E`` on ``n + 1``
reference points (mpmath, 40 digits), move the reference to the extrema of the error on a dense grid, repeat. The
``f + f^2 P`` form keeps the leading term exact, so the relative error stays small near m = 1. The coefficients are
then made fp32 one at a time (the lowest first; after each rounding the higher ones are refitted to absorb it, by
Lawson's algorithm on a grid: the greedy heuristic of Brisebarre, Muller and Tisserand's fp-minimax, without its
lattice search).

Checks (exact fp32 arithmetic emulated in numpy: products of two fp32 are exact in float64, FMAs rounded once through
round-to-odd, Boldo and Melquiond 2008): over all 2^23 fp32 mantissas, the error of the fp32 ``ln m = fma(f^2, P, f)``
against float64 (max, in absolute terms and in ulps of the result, and the mean: the bias that adds up over a row),
and the error of the whole per-element term ``log y - x`` where the input nearly equals it (``x = fp32(log y)``:
the cancellation of kl_div's near-identical rows) in a few binades, next to the chain it replaced: the precise log2
of m in [1, 2) (``tl.math.log2``, within 1 ulp; modelled as correctly rounded) times ln2 in two parts. Needs
mpmath (torch's dependency).
"""

from __future__ import annotations

import argparse

import mpmath as mp
import numpy as np

LO, HI = np.sqrt(0.5) - 1.0, np.sqrt(2.0) - 1.0
LN2_HI, LN2_LO = np.float32(0.693359375), np.float32(-2.1219444005469057e-04)  # the kernel's (divergence_terms)
SQRT_HALF_BITS = 0x3F3504F3  # fp32 sqrt(1/2), rounded down


def _err(f: np.ndarray, c) -> np.ndarray:
    """log(1 + f) - f - f^2 P(f) in float64 (``c``: P's coefficients, lowest first)."""
    return np.log1p(f) - f - f * f * np.polynomial.polynomial.polyval(f, c)


def remez(degree: int, fixed=(), grid: int = 20001, iters: int = 40):
    """(coefficients lowest first, max |error|) of the weighted minimax ``log(1 + f) ~ f + f^2 P(f)`` on [LO, HI]
    with P of ``degree``; its first ``len(fixed)`` coefficients held at ``fixed``."""
    mp.mp.dps = 40
    j0, n = len(fixed), degree + 1 - len(fixed)  # free coefficients c_j0 .. c_degree
    xs = np.linspace(LO, HI, grid)
    ref = [(LO + HI) / 2 + (HI - LO) / 2 * np.cos(np.pi * (n - i) / n) for i in range(n + 1)]  # Chebyshev points
    for _ in range(iters):
        rows, rhs = [], []
        for i, x in enumerate(ref):
            x = mp.mpf(x)
            rows.append([x ** (j + 2) for j in range(j0, degree + 1)] + [(-1) ** i])
            rhs.append(mp.log1p(x) - x - sum(c * x ** (j + 2) for j, c in enumerate(fixed)))
        sol = mp.lu_solve(mp.matrix(rows), mp.matrix(rhs))
        c = list(fixed) + [float(sol[j]) for j in range(n)]
        e = _err(xs, c)
        # the new reference: the largest |e| of each run of one sign, n + 1 alternating ones kept
        runs, start = [], 0
        for i in range(1, grid + 1):
            if i == grid or np.sign(e[i]) != np.sign(e[start]):
                runs.append(start + int(np.argmax(np.abs(e[start:i]))))
                start = i
        while len(runs) > n + 1:
            runs.pop(0 if abs(e[runs[0]]) < abs(e[runs[-1]]) else -1)
        new = [float(xs[i]) for i in runs]
        if len(new) < n + 1 or np.allclose(new, ref, rtol=0, atol=1e-12):
            break
        ref = new
    return c, float(np.max(np.abs(e)))


def lawson(degree: int, fixed=(), grid: int = 4001, iters: int = 500):
    """(coefficients lowest first, max |error|) of the same minimax problem as :func:`remez` on a grid, by Lawson's
    iteratively reweighted least squares (Lawson 1961: weights times the residuals, renormalised, each pass), for
    fits with fixed low coefficients: their free basis ``f^(j0 + 2) ..`` changes sign at 0 for odd ``j0`` (no Haar
    system), where the exchange does not converge."""
    xs = np.linspace(LO, HI, grid)
    a = np.stack([xs ** (j + 2) for j in range(len(fixed), degree + 1)], 1)
    scale = np.max(np.abs(a), 0)
    a = a / scale
    b = _err(xs, list(fixed) or [0.0])  # log(1 + f) - f - f^2 (the fixed part)
    w = np.full(grid, 1.0 / grid)
    for _ in range(iters):
        c = np.linalg.lstsq(a * np.sqrt(w)[:, None], b * np.sqrt(w), rcond=None)[0]
        r = np.abs(a @ c - b)
        w = w * r / np.sum(w * r)
    return list(fixed) + list(c / scale), float(np.max(r))


def fp32_coefficients(degree: int):
    """P's coefficients made fp32 one at a time, the higher ones refitted after each (see the module docstring)."""
    fixed = []
    for _ in range(degree + 1):
        c, _ = lawson(degree, fixed)
        fixed.append(float(np.float32(c[len(fixed)])))
    return fixed


def fma32(a, b, c) -> np.ndarray:
    """fp32 ``a * b + c`` rounded once (as the GPU's FFMA and Triton's interpreter): the float64 product is exact,
    the float64 sum is rounded to odd (one ulp toward the exact value where RN(sum) is inexact and even), and
    rounding that to fp32 is then correct (53 >= 24 + 2 bits)."""
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    c = np.asarray(c, np.float32).astype(np.float64)
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)  # TwoSum: p + c = s + e exactly
    odd = (s.view(np.int64) & 1) == 1
    s = np.where((e != 0) & ~odd, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def split(y: np.ndarray):
    """(e as fp32, f = m - 1) of fp32 ``y`` (positive normal), m in [sqrt(1/2), sqrt(2)): the kernel's bit
    operations."""
    bits = y.astype(np.float32).view(np.int32)
    k = (bits - np.int32(SQRT_HALF_BITS)) >> 23
    m = (bits - (k << 23)).view(np.float32)
    return k.astype(np.float32), m - np.float32(1.0)


def horner(f: np.ndarray, coeffs) -> np.ndarray:
    """P(f) in fp32 FMAs, the kernel's order (highest coefficient first)."""
    p = np.full_like(f, np.float32(coeffs[-1]))
    for c in coeffs[-2::-1]:
        p = fma32(p, f, np.float32(c))
    return p


def log_term(y: np.ndarray, x: np.ndarray, coeffs) -> np.ndarray:
    """The kernel's ``log y - x`` in fp32 (divergence_terms._terms, KL_PROB)."""
    e, f = split(y)
    return fma32(e, LN2_LO, fma32(f * f, horner(f, coeffs), fma32(e, LN2_HI, -x) + f))


def log_term_log2(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The chain replaced (5fbb45b): ``(e + log2 m) ln2 - x`` with m in [1, 2) and log2 m correctly rounded (the
    model of the precise tl.math.log2)."""
    bits = y.astype(np.float32).view(np.int32)
    e = ((bits >> 23) - 127).astype(np.float32)
    m = ((bits & 0x007FFFFF) | 0x3F800000).view(np.float32)
    l2m = np.log2(m.astype(np.float64)).astype(np.float32)
    return fma32(e + l2m, LN2_LO, fma32(l2m, LN2_HI, fma32(e, LN2_HI, -x)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--degree", type=int, default=8, help="degree of P (default 8, the kernel's: 9 coefficients)")
    parser.add_argument("--grid", type=int, default=1 << 16, help="mantissas a binade in the chain check")
    args = parser.parse_args(argv)
    free, e_free = remez(args.degree)
    coeffs = fp32_coefficients(args.degree)
    xs = np.linspace(LO, HI, 1 << 20)
    print(f"P of degree {args.degree} on [sqrt(1/2) - 1, sqrt(2) - 1]: minimax |log(1+f) - f - f^2 P| = {e_free:.3e} "
          f"(real coefficients), {np.max(np.abs(_err(xs, coeffs))):.3e} (the fp32 ones below, float64 arithmetic)")
    for j, c in enumerate(coeffs):
        print(f"  C{j} = {np.float32(c)!r:>16}  # {c:.9e} (real fit: {free[j]:.12e})")

    # ln m alone, every fp32 mantissa: y in [1, 2) covers m in [sqrt(1/2), sqrt(2)) once
    y = (np.arange(1 << 23, dtype=np.int32) | np.int32(0x3F800000)).view(np.float32)
    _, f = split(y)
    got = fma32(f * f, horner(f, coeffs), f).astype(np.float64)
    want = np.log1p(f.astype(np.float64))
    err = got - want
    ulp = np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    ulp[want == 0] = np.spacing(np.float32(0))
    print(f"ln m, all 2^23 mantissas: max |error| {np.max(np.abs(err)):.3e} ({np.max(np.abs(err)) / np.log(2):.3e} "
          f"in log2 units), max {np.max(np.abs(err) / ulp):.3f} ulp of the result, mean {np.mean(err):+.3e} "
          f"(mean |error| {np.mean(np.abs(err)):.3e})")

    # log y - x, x = fp32(log y): the per-element term of a near-identical kl_div, a few binades
    rng = np.random.default_rng(0)
    mant = np.sort(rng.uniform(1.0, 2.0, args.grid)).astype(np.float32)
    for name, fn in (("polynomial", lambda y, x: log_term(y, x, coeffs)), ("old log2", log_term_log2)):
        errs = []
        for binade in (-1, -4, -10, -20, -60):
            yb = (mant * np.float32(2.0 ** binade)).astype(np.float32)
            truth = np.log(yb.astype(np.float64))
            x = truth.astype(np.float32)
            errs.append(fn(yb, x).astype(np.float64) - (truth - x.astype(np.float64)))
        err = np.concatenate(errs)
        print(f"log y - x, {name:12s} (x = fp32(log y), y in 2^-1 .. 2^-60): max |error| {np.max(np.abs(err)):.3e}, "
              f"mean {np.mean(err):+.3e} (mean |error| {np.mean(np.abs(err)):.3e})")


if __name__ == "__main__":
    main()
