"""The distillation losses (generalised JSD, KL divergence, total variation distance) of two (N, V) tables: one
row-loop kernel for the family, its launcher and the autograd.Function.

Formulas and semantics: :mod:`tigon.reference.divergence`. Every loss here is a sum over the vocabulary of a
pointwise term ``l(x, y)`` of the input ``x`` and the target ``y`` at one position, so one kernel serves all of them:
each program owns ``BLOCK_M`` rows and walks the vocabulary in ``BLOCK_V`` columns (int64 row offsets, any V),
evaluating in fp32 the term and its two partial derivatives (:func:`_terms`, a ``KIND`` constexpr picks the formula;
jsd's in :func:`_jsd_parts`). Wide rows (V >= 4096) take one row per program: a skipped row writes its zeros without
reading anything, a kept one is walked with no row mask and no column mask but in its last block.

Arithmetic (jsd is compute-bound, not memory-bound, unless its term is cheap): per element, forward with the
gradient formed, compiled for sm_90 (SASS of the vocabulary loop, bf16, counted offline by
``benchmarks/sass_mix.py``). Transcendentals (special-function ops: ``ex2`` / ``lg2``; no division anywhere):

=========================  ===========================  ==========================================
kernel                     special-function ops          instructions per element (SASS)
=========================  ===========================  ==========================================
jsd, session 14            2 ex2 + precise log (~25)     ~70 (7.47 ms fwd + bwd at 16384 x 128256
                           + subnormal fix-ups           on an H200: 40% of copy bandwidth)
jsd, 4845232 .. 04bb6c3    3 (ex2 Q, ex2 P, lg2 M)       42.0 (loss: + the Jensen-gap series in
                                                         Q / P - 1; gradients: the direct form)
jsd, now                   3 (ex2 Q, ex2 P, lg2 M)       43.9 (loss and both gradients: series in
                                                         d = log P - log Q where |d| < 0.5)
kl_div (prob. target)      0 + precise log (~25)         36.5 (04bb6c3)
kl_div (prob. target)      1 (lg2.approx of the          18.4 (98% of copy bandwidth at 8192 x 128256
  4845232 .. session 29    mantissa)                     on an H100; 6.4e-4 off a near-identical KL)
kl_div (prob. target)      0 + precise log2 of the       44.6 (lg2.approx's biased error added up over a
  5fbb45b                  mantissa (16 FFMA)            row)
kl_div (prob. target),     0 (ln of the mantissa: a      28.7 (12 FFMA; an H200 issues ~37 a bf16
  now                      degree-8 polynomial, 8 FFMA)  element at copy speed: to be timed)
kl_div (log target)        1 (ex2)                       11.9 (unchanged)
=========================  ===========================  ==========================================

Three special-function ops is jsd's floor for a branch-free form: P and Q are needed as such (the terms' weights:
two exponentials of independent inputs; P = Q e^d would be 0 * inf where Q underflows) and log M is a logarithm
wherever no series converges; the series (:func:`_jsd_parts`) replace its cancelling direct form where student
and teacher nearly agree, for about 18 FMAs, so the count stays about where it was while the gradients, not only
the loss, become exact there (the direct form through the GPU's approximate lg2 / ex2: loss 1e-2, gradients 2e-4
relative off at |d| = 0.01; the series: 1.5e-7, ``benchmarks/jsd_series_study.py``). kl_div of log targets
takes one special-function op (ex2), of probability targets none (its log: a polynomial in fp32 FMAs, unbiased where
lg2.approx was not, ``benchmarks/kl_log_poly.py``).

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

from ._common import CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, next_pow2, or_empty, warps_for
from .first_order import once_differentiable
from .divergence_terms import (  # noqa: F401 (JSD, KL_LOG_REVERSE: the kinds are part of this module's API)
    JSD, KL_KINDS, KL_LOG, KL_LOG_REVERSE, KL_PROB, LN2, LOG2E, TVD, _jsd_parts, _terms,
)
from .loss_rows import scale_rows_

MAX_BLOCK_V = 4096
"""Widest vocabulary block (columns) a program loads per step; tests lower it to walk the loop."""

TILE = 4096
INTERPRETER_TILE = 1 << 16
"""Elements of a program's [BLOCK_M, BLOCK_V] tile (compiled, and under Triton's interpreter, where each program
costs Python time): narrow rows are stacked up to it. Tests set both to :data:`MAX_BLOCK_V` to run one row per
program, the path of wide rows (a skipped row only writes zeros, a kept one is read with no row mask)."""


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
        total = tl.sum(acc, axis=1)
        if KIND == 2:  # jsd's terms are summed in bits
            total = total * LN2
        tl.store(LOSS + rows * stride_loss, total, mask=in_rows)


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
        # jsd in bits: the loss summed in bits (ln2 once a row), ln2 and the weights folded into the gradients' factors
        l2, gx, gy, _q, _p = _jsd_parts(x, y, LOG2E, beta, FAST)
        if WRITE_LOSS:
            if ELEMENTWISE:
                loss = l2 * LN2
            else:
                acc = acc + l2  # (in bits: _walk multiplies the row sums by ln2)
        dx = gx * ((1.0 - beta) * LN2 * coef)
        dy = gy * (beta * LN2 * coef)
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


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launcher as the autograd.Function above, as torch.library custom ops (see tigon.kernels). Under compile
# every loss takes the recomputing backward: a custom op may not return a buffer it saved (its outputs never alias its
# inputs), so jsd's forward-formed gradient would be copied once more; recomputing moves the same 3 N V e. (kl_div:
# forward 2 N V e + backward 2 N V e, one rounding for every upstream, as the autograd.Function's.)
@torch.library.custom_op("tigon::divergence", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _divergence(input: Tensor, target: Tensor, labels: Optional[Tensor], kind: int, beta: float, eps: float,
                ignore_index: int, reduction: str) -> Tensor:
    """The loss: 0-d fp32, or (N, V) fp32 for ``reduction="none"``."""
    x, y = _rows(input), _rows(target)
    labels = labels.contiguous() if labels is not None else None
    n, vocab = x.shape
    opts = Divergence(kind, beta, eps, ignore_index)
    scale = reduction_scale(labels, ignore_index, n, vocab, reduction, x.device)
    if reduction == "none":
        loss = torch.empty((n, vocab), dtype=torch.float32, device=x.device)
        launch(x, y, labels, scale, opts, loss=loss, elementwise=True)
        return loss
    rows = torch.empty(n, dtype=torch.float32, device=x.device)
    launch(x, y, labels, scale, opts, loss=rows)
    return rows.sum() * scale


@_divergence.register_fake
def _(input, target, labels, kind, beta, eps, ignore_index, reduction):
    return input.new_empty(input.shape if reduction == "none" else (), dtype=torch.float32)


@torch.library.custom_op("tigon::divergence_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _divergence_backward(grad: Tensor, input: Tensor, target: Tensor, labels: Optional[Tensor], kind: int,
                         beta: float, eps: float, ignore_index: int, reduction: str, want_dx: bool,
                         want_dy: bool) -> tuple[Tensor, Tensor]:
    """(d loss / d input, d loss / d target) times ``grad`` (0-d, or (N, V) for "none"); (0,) where not wanted."""
    x, y = _rows(input), _rows(target)
    labels = labels.contiguous() if labels is not None else None
    n, vocab = x.shape
    scale = reduction_scale(labels, ignore_index, n, vocab, reduction, x.device)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if want_dx else None
    dy = torch.empty(y.shape, dtype=y.dtype, device=y.device) if want_dy else None
    launch(x, y, labels, scale, Divergence(kind, beta, eps, ignore_index), dx=dx, dy=dy, g=grad.expand(x.shape))
    return or_empty(dx, x), or_empty(dy, y)


@_divergence_backward.register_fake
def _(grad, input, target, labels, kind, beta, eps, ignore_index, reduction, want_dx, want_dy):
    return (input.new_empty(input.shape if want_dx else (0,)), target.new_empty(target.shape if want_dy else (0,)))


def _divergence_setup(ctx, inputs, output):
    input, target, labels, *scalars = inputs
    ctx.save_for_backward(input, target, labels)
    ctx.scalars = scalars  # kind, beta, eps, ignore_index, reduction


def _divergence_grad(ctx, grad):
    input, target, labels = ctx.saved_tensors
    want_dx, want_dy = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    if not (want_dx or want_dy):
        return (None,) * 8
    dx, dy = _divergence_backward(grad, input, target, labels, *ctx.scalars, want_dx, want_dy)
    return (if_wanted(dx, want_dx), if_wanted(dy, want_dy)) + (None,) * 6


_divergence.register_autograd(_divergence_grad, setup_context=_divergence_setup)


def compiled_divergence(input, target, labels, opts: Divergence, reduction, grad_in_forward=False):
    """``DivergenceFunction.apply`` as the ``tigon::divergence`` custom op (``grad_in_forward`` is ignored: the
    backward recomputes, see above)."""
    return _divergence(input, target, labels, int(opts.kind), float(opts.beta), float(opts.eps),
                       int(opts.ignore_index), reduction)
