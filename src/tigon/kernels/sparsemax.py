"""Sparsemax over the last dimension (Martins & Astudillo 2016): Triton forward and backward, without a sort.

``y = max(x - tau, 0)`` where ``tau`` is the root of ``f(t) = sum(max(x - t, 0)) - 1``, convex, piecewise linear and
strictly decreasing on ``t < max(x)``, with ``f(max - 1) >= 0 > f(max)``. The forward finds tau by Michelot's
algorithm (Michelot 1986, "A finite algorithm for finding the projection of a point onto the canonical simplex of
R^n"), run from the lower bound ``t_0 = max - 1``: with the support ``S = {x > t}``, ``k = |S|`` and the excess
``e = sum_S (x - t)``, one pass over the row gives

    t' = t + (e - 1) / k      (= (sum_S x - 1) / k, a Newton step on f)

and, in the same pass, ``min_S x``. Why it is exact and stops:

* t' is again a lower bound of tau (f is convex, so its tangent at t lies below it and the tangent's root t' is
  <= tau), and t' >= t (f(t) >= 0 at a lower bound; the kernel takes ``max(t, t')`` so that fp32 rounding cannot
  move t back). So the support ``{x > t}`` only shrinks and always contains the true support.
* If ``min_S x > t'``, the support at t' is S again, so t' is a fixed point: ``f(t') = e - 1 - k (t' - t) = 0``, i.e.
  t' = tau, the tau of the sort-based Algorithm 1 of Martins & Astudillo 2016 (``(sum of the top k(z) - 1) /
  k(z)``) up to fp32 rounding of the sum. The row stops there; y's support is S exactly and y sums to 1. (Values
  tied at tau sit in S until t reaches tau; the next pass drops them and stops.)
* Otherwise some x of S is <= t', so the next support is smaller: k strictly decreases on every pass that does not
  stop, and a pass with k = 0 stops too. So a row takes at most N + 1 passes whatever the input, fp32 rounding
  included. Hence no cap on the loop: a cap is only safe if no row reaches it, and Michelot's worst case is one
  value dropped a pass (Condat 2016, "Fast projection
  onto the simplex and the l1 ball"); 8 bisection halvings first would not bound it either, since any number of
  values can lie in the 2^-8 bracket below tau (what bounds the passes is the integer k, not a width).
* The passes run on ``x - max`` (sparsemax is shift-invariant): the max is 0 and t starts at -1, exact whatever the
  row's offset (from the raw values, a row near 3000 was 8e-5 off in fp32, one near 1e30 all zeros). A row holding a
  NaN (which ``tl.max`` skips) or +inf, or all -inf, does not run and is NaN throughout, as ``torch.softmax``.
  Realistic rows stop after a handful of passes (below).

Passes per row, counted by an emulation of this loop (``benchmarks/sparsemax_tune.py --passes``, CPU; the max's
pass included, y's writing pass not) on Gaussian rows of bf16 logits, N = 4096 / 32000 / 128256: scale 1, mean
4.5 / 4.9 / 5.2, max 7; scale 10, mean 2.0, max 4; scale 0.1 (near-uniform rows, supports of ~40), mean 9.6 / 11.4
/ 12.9, max 14. The previous kernel took 27 on every row (the max, 24 bisection halvings of [max - 1, max] as in
Blondel et al. 2019, "Learning with Fenchel-Young losses", and entmax's bisection, Peters et al. 2019, then 2
Michelot steps). 8 halvings then this loop take 10 at scales 1 and 10 (one Newton step from the 2^-8 bracket, then
the stop) and 10.4 to 10.5 (max 12) at 0.1: more than Michelot alone from max - 1 in every realistic case, fewer
only on near-uniform rows. Each pass reduces three values over the row: the support's size, its excess over t
and its minimum (the minimum saves the pass that would confirm an unchanged support). A pass costs more than a
halving: compiled for sm_90 (bf16, 4096 columns, 8 warps; no GPU needed, as benchmarks/sass_mix.py does it), the
loop's body is 210 SASS instructions (6 barriers) against 90 (2) for a halving and 131 for the old Michelot step,
so a row of 4 passes after the max issues about 840 against 24 x 90 + 2 x 131 = 2422 before, a third. (The three
reductions as one ``tl.reduce`` of a tuple: 198 instructions, 4 barriers; not taken, as Triton's CPU interpreter
runs such a reduction element by element in Python, which made these tests 30 times slower.)

Backward (y saved, as Liger-Kernel saves it): with ``s = (y > 0)``, ``dx = s * (dy - sum(s * dy) / sum(s))``.

Rows up to softmax's REGISTER_ROW are held in registers, several per program for short rows (the loop runs until
every row of the program has stopped; a stopped row's tau is frozen), and every pass is a reduction over registers;
wider rows take one program per row walking column chunks, the same loop, so each pass re-reads the row (mostly
from L2). The launch is softmax's (:func:`tigon.kernels.softmax._launch`), not re-measured here.

Liger-Kernel runs Algorithm 1 after a ``torch.sort`` of every row (an extra read and write of x).

Minimal bytes (M x N of e bytes): forward 2 M N e (read x, write y); backward 3 M N e (read dy, y; write dx).
H200, bf16, fwd + bwd over 5 M N e (benchmarks/results/h200/session22/cD/sparsemax-tune_h200.json), Gaussian rows
times 1 / 10: 16384 x 4096 0.242 ms (71% of copy bandwidth) / 0.168 (101%), against 0.490 (35%) for the former 24
halvings + 2 steps; 8192 x 32000 57% / 85%; 4096 x 128256 33% / 50% (the wide path re-reads the row per pass).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import rows
from .softmax import _launch
from .unary import unary_op


@triton.jit
def _michelot(t, k, e, mn):
    """(t', stop) of Michelot's step from the lower bound t with support size k, excess e and support minimum mn:
    t' = t + (e - 1) / k, never below t; stop once the support at t' is the same (mn > t': t' is tau) or is empty."""
    tn = tl.maximum(t, t + (e - 1.0) / tl.maximum(k, 1.0))
    return tn, (mn > tn) | (k == 0.0)


@triton.jit
def _top2_bound(t, m1, m2):
    """The lower bound of tau from the row's largest value m1 and another element m2 <= m1: ``max(m1 - 1, (m1 + m2 -
    1) / 2)`` where t = m1 - 1 is a number (a NaN t is kept: such rows do not run). Any k elements give one, ``(sum
    - 1) / k`` (f(t) >= sum_k (x - t) - 1, zero there), so the top 2 start Michelot's loop closer to tau: emulated
    passes after the max on Gaussian bf16 rows of 4096 / 32000, 3.53 / 3.87 from max - 1 against 1.97 / 2.09 at scale
    1, 8.6 / 10.4 against 8.4 / 10.1 at 0.1, 1.04 against 1.00 at 10. Halved before the sum: no overflow to inf."""
    return tl.where(t == t, tl.maximum(t, m1 * 0.5 + (m2 - 1.0) * 0.5), t)


@triton.jit
def _sparsemax_fwd(X, Y, M, N, stride_x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TOP2: tl.constexpr):
    """Y (M, N) contiguous = sparsemax of the rows of X (row stride stride_x, unit column stride). TOP2: start from
    ``_top2_bound`` (one more reduction, the runner-up) rather than max - 1."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    mask = rmask[:, None] & (cols < N)[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
    m1 = tl.max(x, axis=1)
    # a row holding a NaN (tl.max skips it) or +inf, or all -inf, is NaN throughout (as torch.softmax)
    bad = (tl.sum(tl.where(x == x, 0.0, 1.0), axis=1) > 0) | (m1 == float("inf")) | (m1 == float("-inf"))
    m1 = tl.where(bad | ~rmask, 0.0, m1)
    x = x - m1[:, None]  # relative to the max (shift-invariant; exact near it): the max is 0, t starts at -1
    t = tl.zeros_like(m1) - 1.0  # a lower bound of tau
    active = rmask & ~bad  # padding rows and bad rows do not run
    if TOP2:
        t = _top2_bound(t, 0.0, tl.max(tl.where(x < 0.0, x, float("-inf")), axis=1))
    while tl.max(active.to(tl.int32), axis=0) > 0:  # until every row of the block has stopped
        supp = x > t[:, None]
        k = tl.sum(tl.where(supp, 1.0, 0.0), axis=1)
        e = tl.sum(tl.where(supp, x - t[:, None], 0.0), axis=1)
        mn = tl.min(tl.where(supp, x, float("inf")), axis=1)
        tn, stop = _michelot(t, k, e, mn)
        t = tl.where(active, tn, t)  # a stopped row keeps its tau
        active = active & ~stop
    y = tl.where(bad[:, None], float("nan"), tl.maximum(x - t[:, None], 0.0))
    tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _sparsemax_fwd_wide(X, Y, N, stride_x, BLOCK_N: tl.constexpr, TOP2: tl.constexpr):
    """One row a program, in BLOCK_N-column chunks: the max, then Michelot's passes (each a read of the row), then y.
    TOP2: the max's pass also keeps each lane's runner-up, and the loop starts from ``_top2_bound``."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_N], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_N], float("-inf"), tl.float32)  # (TOP2) each lane's second largest, another position's
    nans = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        xc = tl.load(X + row * stride_x + cols, mask=cols < N, other=float("-inf")).to(tl.float32)
        if TOP2:
            m2 = tl.maximum(m2, tl.minimum(m, xc))
        m = tl.maximum(m, xc)
        nans += tl.where(xc == xc, 0.0, 1.0)
    m1 = tl.max(m, axis=0)
    # as the register path: a NaN, +inf or all -inf row is NaN; the passes run on x - max (the max is 0, t from -1)
    bad = (tl.sum(nans, axis=0) > 0) | (m1 == float("inf")) | (m1 == float("-inf"))
    m1 = tl.where(bad, 0.0, m1)
    t = tl.where(bad, 0.0, -1.0)
    active = ~bad
    if TOP2:  # a lane holding m1 offers its runner-up, any other lane its max: an element other than m1's
        t = _top2_bound(t, 0.0, tl.max(tl.where(m < m1, m, m2), axis=0) - m1)
    while active:
        k = tl.zeros([BLOCK_N], dtype=tl.float32)
        e = tl.zeros([BLOCK_N], dtype=tl.float32)
        mn = tl.full([BLOCK_N], float("inf"), tl.float32)
        for c0 in range(0, N, BLOCK_N):
            cols = c0 + offs
            x = tl.load(X + row * stride_x + cols, mask=cols < N, other=float("-inf")).to(tl.float32) - m1
            supp = x > t
            k += tl.where(supp, 1.0, 0.0)
            e += tl.where(supp, x - t, 0.0)
            mn = tl.minimum(mn, tl.where(supp, x, float("inf")))
        t, stop = _michelot(t, tl.sum(k, axis=0), tl.sum(e, axis=0), tl.min(mn, axis=0))
        active = ~stop
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        x = tl.load(X + row * stride_x + cols, mask=cmask, other=0.0).to(tl.float32) - m1
        y = tl.where(bad, float("nan"), tl.maximum(x - t, 0.0))
        tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=cmask)


@triton.jit
def _sparsemax_bwd(DY, Y, DX, M, N, stride_dy, stride_y, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DX (M, N) contiguous = s * (DY - sum(s * DY) / sum(s)) per row, s = (Y > 0)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    supp = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0) > 0
    k = tl.maximum(tl.sum(tl.where(supp, 1.0, 0.0), axis=1), 1.0)  # >= 1 on real rows; padding rows read none
    mean = tl.sum(tl.where(supp, dy, 0.0), axis=1) / k
    dx = tl.where(supp, dy - mean[:, None], 0.0)
    tl.store(DX + rows[:, None] * N + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _sparsemax_bwd_wide(DY, Y, DX, N, stride_dy, stride_y, BLOCK_N: tl.constexpr):
    """One row a program, in BLOCK_N-column chunks: the support's size and sum of dy, then dx."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    cnt = tl.zeros([BLOCK_N], dtype=tl.float32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        supp = tl.load(Y + row * stride_y + cols, mask=cmask, other=0.0) > 0
        acc += tl.where(supp, tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32), 0.0)
        cnt += tl.where(supp, 1.0, 0.0)
    mean = tl.sum(acc, axis=0) / tl.sum(cnt, axis=0)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + offs
        cmask = cols < N
        supp = tl.load(Y + row * stride_y + cols, mask=cmask, other=0.0) > 0
        dy = tl.load(DY + row * stride_dy + cols, mask=cmask, other=0.0).to(tl.float32)
        tl.store(DX + row * N + cols, tl.where(supp, dy - mean, 0.0).to(DX.dtype.element_ty), mask=cmask)


FWD_CONFIGS = {4096: (1, 2)}
"""(rows a program, warps) of the forward's register path by row width (a power of two; others: the norms'
``fwd_config``). Each Michelot pass reduces three values over the row, and across warps each reduction goes through
shared memory with a barrier: at 4096 columns the loop issues 580 SASS instructions a thread with 2 warps against 208
with 8, i.e. 1160 warp-instructions a row a pass against 1664 (sm_90, Triton 3.6, counted offline by
``benchmarks/sass_mix.py --sparsemax``: benchmarks/results/cpu/sass-sparsemax_triton36_session24.txt). H100, bf16 16384
x 4096, Gaussian rows, fwd + bwd (benchmarks/results/h100/session24/): 2 warps 0.271 ms (86% of copy bandwidth), 4 warps
0.274, 8 (the norms' rule) 0.280 (83%), 2 rows of 4 warps 0.292."""


START_TOP2 = True
"""Whether the forward starts Michelot's loop from the bound of the row's top two values (``_top2_bound``: one more
reduction over the row in registers; on the chunked path the max's pass keeps a runner-up a lane, no more reads)
rather than max - 1. H100, bf16 16384 x 4096, Gaussian rows at scale 1, 1 row x 2 warps (benchmarks/issue21_tune.py,
benchmarks/results/h100/session28/): forward 105.6 us (84.3% of copy bandwidth) against 134.0 (66.4%) from max - 1,
fwd + bwd 239.6 us (92.8%) against 267.6 (83.1%); at scale 10 (few passes either way) 225.2 against 225.8."""


def sparsemax_forward(x: torch.Tensor) -> torch.Tensor:
    """Sparsemax of x (..., N) (any strides) over its last dimension: a new contiguous tensor of x's shape and
    dtype."""
    y = torch.empty(size=x.shape, dtype=x.dtype, device=x.device)
    x2, M, sx = rows(x, "input")
    if M:
        _launch(_sparsemax_fwd, _sparsemax_fwd_wide, (x2,), (sx,), y, M, x.shape[-1], FWD_CONFIGS,
                dict(TOP2=START_TOP2))
    return y


def sparsemax_backward(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``s * (dy - sum(s * dy) / sum(s))``, ``s = y > 0``, for the forward's output y and dy of y's shape (any
    strides): a new contiguous tensor of y's shape and dtype."""
    dx = torch.empty(size=y.shape, dtype=y.dtype, device=y.device)
    dy2, M, sdy = rows(dy, "grad_output")
    y2, _, sy = rows(y, "y")
    if M:
        _launch(_sparsemax_bwd, _sparsemax_bwd_wide, (dy2, y2), (sdy, sy), dx, M, y.shape[-1])
    return dx


# Eager autograd and the torch.compile custom ops tigon::sparsemax(_backward): see tigon.kernels.unary.
SparsemaxFunction, compiled_sparsemax = unary_op("sparsemax", sparsemax_forward, sparsemax_backward, saves="output")
