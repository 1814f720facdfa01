"""Error study behind ``JSD_NEAR`` and the series degrees of :func:`tigon.kernels.divergence_terms._jsd_parts`
(CPU only).

    PYTHONPATH=src python3 benchmarks/jsd_series_study.py [--samples 2000]

With d = log P - log Q the generalised JSD's pointwise pieces are Q K(d), Q J(d) (K = log(1 - beta + beta e^d),
J = beta e^d (d - K) - (1 - beta) K, the loss). Part 1 (mpmath, 40 digits): the lowest Taylor degree of K, d - K
and J that stays within 2^-24 relative of the function for every |d| <= T and beta in (0.01 .. 0.99), per T.
Part 2: per-element relative errors (median / 99th percentile over log Q ~ U(-12, -2) and both signs of d) of the
loss term and of both gradients, against mpmath, for (a) the direct form as the GPU evaluates it (fp32, ``ex2.approx``
modelled as a relative error uniform in +-2^-22.5, ``lg2.approx`` as an absolute one in +-2^-22.6, the FMAs of the
kernel) and (b) the kernel's series in fp32 (its coefficients formed in fp32 as the kernel forms them, Q through
the same approximate ex2). Needs sympy and mpmath (torch's dependencies).
"""

from __future__ import annotations

import argparse

import mpmath as mp
import numpy as np
import sympy as sp

f32 = np.float32
LOG2E, LN2 = f32(1.4426950408889634), f32(0.6931471805599453)
BETAS = (0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99)


def series_degrees(max_degree=14):
    b, d = sp.symbols("beta d")
    k = sp.series(sp.log(1 - b + b * sp.exp(d)), d, 0, max_degree + 1).removeO()
    j = sp.series(b * sp.exp(d) * (d - k) - (1 - b) * k, d, 0, max_degree + 1).removeO()
    kc = [sp.lambdify(b, sp.expand(k).coeff(d, n)) for n in range(max_degree + 1)]
    jc = [sp.lambdify(b, sp.expand(j).coeff(d, n)) for n in range(max_degree + 1)]
    print("part 1: lowest Taylor degree within 2^-24 relative for |d| <= T, every beta of", BETAS)
    for t in (0.125, 0.25, 0.375, 0.5, 0.75, 1.0):
        need = {}
        for which in ("K", "d - K", "J"):
            worst = 0
            for beta in BETAS:
                for dd in (t, -t, t / 2, -t / 2):
                    bm, dm = mp.mpf(beta), mp.mpf(dd)
                    km = mp.log(1 - bm + bm * mp.exp(dm))
                    truth = {"K": km, "d - K": dm - km, "J": bm * mp.exp(dm) * (dm - km) - (1 - bm) * km}[which]
                    for n in range(2, max_degree + 1):
                        ks = sum(mp.mpf(kc[i](beta)) * dm ** i for i in range(n + 1))
                        js = sum(mp.mpf(jc[i](beta)) * dm ** i for i in range(n + 1))
                        if abs({"K": ks, "d - K": dm - ks, "J": js}[which] / truth - 1) <= 2 ** -24:
                            break
                    worst = max(worst, n)
            need[which] = worst
        print(f"  T = {t}: K to d^{need['K']}, d - K to d^{need['d - K']}, J to d^{need['J']}")


def _approx(rng, t, rel=None, absolute=None):
    t = t.astype(np.float64)
    if rel is not None:
        t = t * (1 + rng.uniform(-1, 1, t.shape) * rel)
    if absolute is not None:
        t = t + rng.uniform(-1, 1, t.shape) * absolute
    return t.astype(f32)


def kernel_fp32(x, y, beta, rng, series):
    """(loss nats, gx, gy) of _jsd_parts in fp32 (c = log2 e): the direct form or the series, GPU special ops."""
    fma = lambda a, b, c: (a.astype(np.float64) * np.float64(b) + c.astype(np.float64)).astype(f32)  # noqa: E731
    q = _approx(rng, np.exp2((x * LOG2E).astype(np.float64)), rel=2 ** -22.5)
    p = _approx(rng, np.exp2((y * LOG2E).astype(np.float64)), rel=2 ** -22.5)
    bt = f32(beta)
    if not series:
        m = fma(p, bt, (f32(1) - bt) * q)
        l2m = _approx(rng, np.log2(m.astype(np.float64)), absolute=2 ** -22.6)
        a, b = fma(x, LOG2E, -l2m), fma(y, LOG2E, -l2m)
        gx, gy = q * a, p * b
        return ((f32(1) - bt) * gx + bt * gy) * LN2, gx, gy
    v, w, s = bt * (f32(1) - bt), f32(1) - f32(2) * bt, LOG2E * LN2
    kappa = [bt, v, v * w, v * (1 - 6 * v), v * w * (1 - 12 * v), v * (1 + v * (-30 + 120 * v)),
             v * w * (1 + v * (-60 + 360 * v)), v * (1 + v * (-126 + v * (1680 - 5040 * v)))]
    fact = [1, 2, 6, 24, 120, 720, 5040, 40320]
    k = [f32(-LOG2E * kn * s ** (n + 1) / fact[n]) for n, kn in enumerate(kappa)]
    jpoly = [f32(0.5), 1 / 3 - bt / 6, 0.125 + bt * (bt / 12 - 1 / 6),
             1 / 30 + bt * (bt * (7 / 60 - bt * 0.05) - 11 / 120),
             1 / 144 + bt * (bt * (bt * (bt / 30 - 11 / 120) + 4 / 45) - 13 / 360),
             1 / 840 + bt * (bt * (bt * (bt * (8 / 105 - bt / 42) - 19 / 210) + 61 / 1260) - 19 / 1680),
             1 / 5760 + bt * (bt * (bt * (bt * (bt * (bt / 56 - 11 / 168) + 13 / 140) - 71 / 1120) + 47 / 2240)
                              - 1 / 336),
             1 / 45360 + bt * (bt * (bt * (bt * (bt * (bt * (29 / 504 - bt / 72) - 2 / 21) + 67 / 840) - 709 / 20160)
                                     + 463 / 60480) - 247 / 362880)]
    j = [f32(LOG2E * v * jp * s ** (n + 2)) for n, jp in enumerate(jpoly)]
    u = (y - x).astype(f32)
    acc = np.full_like(u, k[7])
    for c in reversed(k[:7]):
        acc = (u * acc + c).astype(f32)  # (fp32 rounding per step: FMA's one rounding is finer)
    a = (u * acc).astype(f32)
    b = fma(u, LOG2E, a)
    jacc = np.full_like(u, j[7])
    for c in reversed(j[:7]):
        jacc = (u * jacc + c).astype(f32)
    return (q * ((u * u) * jacc)) * LN2, q * a, p * b


def truth(x, y, beta):
    mp.mp.dps = 30
    out = []
    for xi, yi in zip(x.tolist(), y.tolist()):
        xi, yi, bm = mp.mpf(xi), mp.mpf(yi), mp.mpf(beta)
        q, p = mp.exp(xi), mp.exp(yi)
        lm = mp.log(bm * p + (1 - bm) * q)
        out.append((float(bm * p * (yi - lm) + (1 - bm) * q * (xi - lm)), float(q * (xi - lm) / mp.log(2)),
                    float(p * (yi - lm) / mp.log(2))))
    return np.array(out).T


def element_errors(samples):
    rng = np.random.default_rng(0)
    print("part 2: relative error per element, median / p99 (loss term, gx, gy); direct = GPU fp32 direct form, "
          "series = the kernel's series in fp32")
    for beta in (0.1, 0.5, 0.9):
        for dist in (0.01, 0.1, 0.25, 0.49, 0.51, 1.0, 4.0):
            x = rng.uniform(-12, -2, samples).astype(f32)
            y = (x + f32(dist) * np.where(rng.random(samples) < 0.5, 1, -1).astype(f32)).astype(f32)
            want = truth(x, y, beta)
            row = []
            for series in (False, True):
                if series and dist > 0.75:
                    continue
                got = kernel_fp32(x, y, beta, rng, series)
                errs = [np.abs(g.astype(np.float64) / t - 1) for g, t in zip(got, want)]
                row.append(("series" if series else "direct") + " " + "  ".join(
                    f"{np.median(e):.1e}/{np.quantile(e, 0.99):.1e}" for e in errs))
            print(f"  beta {beta} |d| {dist}: " + " | ".join(row))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args(argv)
    series_degrees()
    element_errors(args.samples)


if __name__ == "__main__":
    main()
