"""Cross-entropy: Triton forward and backward over rows of logits, vocabulary looped in blocks.

Formula and semantics: :mod:`tigon.reference.cross_entropy` (torch's label smoothing and class weights, PaLM
z-loss, Gemma 2 soft-capping, plus a ``logit_scale`` used by the fused linear op).

Forward (one read of the logits): each program owns ``BLOCK_M`` rows and walks the vocabulary in ``BLOCK_V``
columns, keeping a running max and rescaled sum of exponentials (the online log-sum-exp of Milakov &
Gimelshein 2018), the weighted logit sum needed by label smoothing and the running argmax. It writes per-row
loss, z-loss, lse and a correct-prediction flag (N floats each).

Forward with the gradient (one read, one write: the fused linear op's chunks and ``inplace_backward``): a row is
split over SPLIT programs that keep their block of it in registers, publish per-block (max, sum of exp) partials,
meet at a per-row counter (acquire/release atomics) and then each writes ``coef * d loss_row / d logits`` for its
block. A 128k-wide row does not fit one program, and a second pass over it misses L2 (measured: 3x slower).

Backward (one read, one write of the logits): recomputes the softmax from the saved lse with the per-token
upstream gradient (a 0-d tensor broadcast with stride 0 for mean/sum, an (N,) tensor for reduction="none").

Gradient per row, with p = softmax(x), a the upstream coefficient, eps the smoothing, w class weights:
    dL/dx_c = a * [p_c * ((1-eps) w_t + eps/V * sum(w) + 2 s lse) - (1-eps) w_t [c == t] - eps/V * w_c]
then times ``logit_scale * (1 - tanh^2)`` for the soft-cap.

Minimal bytes (bf16 logits): forward N*V*2, backward 2*N*V*2; forward with the gradient 2*N*V*2.

Targets outside [0, V) other than ignore_index are never read out of bounds (masked); on this path their loss
is NaN (the functional API checks them up front for CPU tensors; on CUDA that check would cost a sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..support import interpreter_enabled
from ._common import next_pow2, rows_per_program, warps_for

# Largest vocabulary block one program loads per step. Rows longer than this are walked in several steps
# (online log-sum-exp), so any vocabulary size works. 8192 elements is a [1, 8192] fp32 tile, 32 values per
# thread with 8 warps. Measured on an H200 (N=8192, V=128256, bf16; forward / forward+backward):
# 2048: 0.76 / 1.87 ms, 4096: 0.68 / 1.75, 8192: 0.64 / 1.71, 16384: 0.72 / 1.77, 32768: 0.88 / 1.96 ms.
# At 8192 the forward moves 3.3 TB/s and forward+backward 3.7 TB/s (3 passes of N*V*2 bytes) against ~4.3 TB/s
# copy bandwidth; torch's cross_entropy(logits.float()) takes 6.9 / 13.5 ms. Tests lower it to exercise the loop.
MAX_BLOCK_V = 8192

# Columns per program of the one-read gradient kernel (_ce_split_kernel): a row of V logits is split over
# cdiv(V, SPLIT_BLOCK_V) programs that hold their block in registers while the row's lse is assembled.
SPLIT_BLOCK_V = 8192


@triton.jit
def _transform(raw, logit_scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """x = softcap * tanh(logit_scale * raw / softcap) (or logit_scale * raw); tanh through exp."""
    x = raw * logit_scale
    if HAS_SOFTCAP:
        u = x / softcap
        e = tl.exp(-2.0 * tl.abs(u))
        th = (1.0 - e) / (1.0 + e)
        x = softcap * tl.where(u < 0, -th, th)
    return x


@triton.jit
def _row_setup(T, CW, rows, n_rows, V, ignore_index, HAS_WEIGHT: tl.constexpr):
    """Per-row target, masks and target weight."""
    rmask = rows < n_rows
    t = tl.load(T + rows, mask=rmask, other=ignore_index)
    valid = rmask & (t != ignore_index)
    in_range = valid & (t >= 0) & (t < V)
    t_safe = tl.where(in_range, t, 0).to(tl.int32)
    if HAS_WEIGHT:
        wt = tl.load(CW + t_safe, mask=in_range, other=0.0).to(tl.float32)
    else:
        wt = tl.where(valid, 1.0, 0.0)
    return rmask, valid, in_range, t_safe, wt


@triton.jit
def _grad_coefs(a, wt, wsum, lse, V, label_smoothing, lse_square_scale):
    """Per-row coefficients of the gradient formula in the module docstring: (on p, on the target, on every c)."""
    eps = label_smoothing
    coef_p = a * ((1.0 - eps) * wt + eps / V * wsum + 2.0 * lse_square_scale * lse)
    coef_t = a * (1.0 - eps) * wt
    coef_s = a * (eps / V)
    return coef_p, coef_t, coef_s


@triton.jit
def _grad_tile(
    x, cols, cmask, t_safe, lse, coef_p, coef_t, coef_s, CW, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
):
    """d loss_row / d raw_logits on a [rows, cols] tile of transformed logits ``x`` (fp32), times the row's a."""
    p = tl.exp(x - lse[:, None])
    g = coef_p[:, None] * p - tl.where(cols[None, :] == t_safe[:, None], coef_t[:, None], 0.0)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            wc = tl.load(CW + cols, mask=cmask, other=0.0).to(tl.float32)
            g = g - coef_s[:, None] * wc[None, :]
        else:
            g = g - coef_s[:, None]
    if HAS_SOFTCAP:
        th = x / softcap
        g = g * (1.0 - th * th)
    return g * logit_scale


@triton.jit
def _grad_pass(
    X, stride_x, DX, stride_dx, CW, rows, rmask, t_safe, wt, lse, a, wsum, V,
    label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """Write a * d loss_row / d raw_logits for each row (zero rows where a == 0)."""
    rows64 = rows.to(tl.int64)
    x_row = X + rows64 * stride_x
    dx_row = DX + rows64 * stride_dx
    coef_p, coef_t, coef_s = _grad_coefs(a, wt, wsum, lse, V, label_smoothing, lse_square_scale)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        cmask = cols < V
        mask = rmask[:, None] & cmask[None, :]
        raw = tl.load(x_row[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = _transform(raw, logit_scale, softcap, HAS_SOFTCAP)
        g = _grad_tile(x, cols, cmask, t_safe, lse, coef_p, coef_t, coef_s, CW, logit_scale, softcap,
                       HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING)
        tl.store(dx_row[:, None] + cols[None, :], g.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _row_loss(lse, xt, wt, wsum, sw, valid, V, label_smoothing, lse_square_scale, HAS_SMOOTHING: tl.constexpr):
    """(loss incl. z, z) of rows from their lse, target logit, target weight and smoothing sum (0 if ignored)."""
    eps = label_smoothing
    nll = lse - xt
    loss = (1.0 - eps) * wt * nll
    if HAS_SMOOTHING:
        loss += eps / V * (wsum * nll - sw)
    z = lse_square_scale * lse * lse
    return tl.where(valid, loss + z, 0.0), tl.where(valid, z, 0.0)


@triton.jit
def _target_logit(x_row, t_safe, in_range, valid, logit_scale, softcap, HAS_SOFTCAP: tl.constexpr):
    """The transformed target logit; NaN for a target outside [0, V) (never read out of bounds)."""
    xt = tl.load(x_row + t_safe, mask=in_range, other=0.0).to(tl.float32)
    xt = _transform(xt, logit_scale, softcap, HAS_SOFTCAP)
    return tl.where(in_range | (~valid), xt, float("nan"))


@triton.jit
def _smoothing_sum(x, xt, cols, cmask, CW, HAS_WEIGHT: tl.constexpr):
    """Per row of a tile: sum_c w_c * (x_c - x_t) over its valid columns (label smoothing's extra term)."""
    d = tl.where(cmask[None, :], x - xt[:, None], 0.0)
    if HAS_WEIGHT:
        d = d * tl.load(CW + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return tl.sum(d, axis=1)


@triton.jit
def _ce_fwd_kernel(
    X, stride_x, T, CW, CWSUM, LOSS, ZLOSS, LSE, CORRECT,
    n_rows, V, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    COMPUTE_ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask, valid, in_range, t_safe, wt = _row_setup(T, CW, rows, n_rows, V, ignore_index, HAS_WEIGHT)
    x_row = X + rows.to(tl.int64) * stride_x
    xt = _target_logit(x_row, t_safe, in_range, valid, logit_scale, softcap, HAS_SOFTCAP)

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    sw = tl.zeros([BLOCK_M], tl.float32)  # sum_c w_c * (x_c - x_t), for label smoothing
    best = tl.zeros([BLOCK_M], tl.int32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        cmask = cols < V
        mask = rmask[:, None] & cmask[None, :]
        raw = tl.load(x_row[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        x = _transform(raw, logit_scale, softcap, HAS_SOFTCAP)
        x = tl.where(cmask[None, :], x, float("-inf"))
        bmax = tl.max(x, axis=1)
        if COMPUTE_ACC:
            bidx = tl.argmax(x, axis=1).to(tl.int32)
            best = tl.where(bmax > m, start + bidx, best)  # strict: keeps the first maximum, like torch.argmax
        m_new = tl.maximum(m, bmax)
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), axis=1)
        m = m_new
        if HAS_SMOOTHING:
            sw += _smoothing_sum(x, xt, cols, cmask, CW, HAS_WEIGHT)
    lse = m + tl.log(s)
    if HAS_WEIGHT:
        wsum = tl.load(CWSUM).to(tl.float32)
    else:
        wsum = V * 1.0
    loss, z = _row_loss(lse, xt, wt, wsum, sw, valid, V, label_smoothing, lse_square_scale, HAS_SMOOTHING)
    tl.store(LOSS + rows, loss, mask=rmask)
    tl.store(ZLOSS + rows, z, mask=rmask)
    tl.store(LSE + rows, lse, mask=rmask)
    if COMPUTE_ACC:
        tl.store(CORRECT + rows, tl.where(valid & (best == t_safe) & in_range, 1.0, 0.0), mask=rmask)


@triton.jit
def _ce_split_kernel(
    X, stride_x, T, CW, CWSUM, COEF, stride_coef, DX, stride_dx, PART, COUNT, LOSS, ZLOSS, LSE, CORRECT,
    n_rows, V, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    COMPUTE_ACC: tl.constexpr, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK_V: tl.constexpr,
):
    # SPLIT consecutive programs own one row, BLOCK_V columns each, held in registers from load to gradient.
    # Each writes its block's (max, sum of exp, smoothing sum, argmax) to PART, signals COUNT[row] and waits
    # until all SPLIT have; then each forms the row's lse from the SPLIT partials and writes its block's
    # gradient: the logits are read once and the gradient written once.
    pid = tl.program_id(0)
    row = pid // SPLIT
    part = pid % SPLIT
    rows = row + tl.arange(0, 1)
    rmask, valid, in_range, t_safe, wt = _row_setup(T, CW, rows, n_rows, V, ignore_index, HAS_WEIGHT)
    rows64 = rows.to(tl.int64)
    x_row = X + rows64 * stride_x
    cols = part * BLOCK_V + tl.arange(0, BLOCK_V)
    cmask = cols < V
    lmask = (rmask & valid)[:, None] & cmask[None, :]  # ignored rows read nothing; their gradient is zero
    raw = tl.load(x_row[:, None] + cols[None, :], mask=lmask, other=0.0).to(tl.float32)
    x = _transform(raw, logit_scale, softcap, HAS_SOFTCAP)
    xm = tl.where(cmask[None, :], x, float("-inf"))
    bmax = tl.max(xm, axis=1)
    bsum = tl.sum(tl.exp(xm - bmax[:, None]), axis=1)
    pbase = PART + (rows64 * SPLIT + part) * 4
    tl.store(pbase, bmax)
    tl.store(pbase + 1, bsum)
    xt = _target_logit(x_row, t_safe, in_range, valid, logit_scale, softcap, HAS_SOFTCAP)
    if HAS_SMOOTHING:
        tl.store(pbase + 2, _smoothing_sum(xm, xt, cols, cmask, CW, HAS_WEIGHT))
    if COMPUTE_ACC:
        tl.store(pbase + 3, (part * BLOCK_V + tl.argmax(xm, axis=1)).to(tl.float32))
    # Arrive (release: the partials above are visible first), then wait for the row's other programs (acquire).
    # They are consecutive program ids, so they are resident together whenever a row's SPLIT programs fit on the
    # GPU at once (blocks are dispatched in order of their id).
    arrived = tl.atomic_add(COUNT + row, 1, sem="acq_rel") + 1
    while arrived < SPLIT:
        arrived = tl.atomic_add(COUNT + row, 0, sem="acquire")
    offs = tl.arange(0, SPLIT_P2)
    omask = offs < SPLIT
    prow = PART + (row.to(tl.int64) * SPLIT + offs) * 4
    pm = tl.load(prow, mask=omask, other=float("-inf"), volatile=True)
    ps = tl.load(prow + 1, mask=omask, other=0.0, volatile=True)
    m = tl.max(pm, axis=0)
    lse = (m + tl.log(tl.sum(ps * tl.exp(pm - m), axis=0))) + tl.zeros([1], tl.float32)
    if HAS_WEIGHT:
        wsum = tl.load(CWSUM).to(tl.float32)
    else:
        wsum = V * 1.0
    a = tl.load(COEF + rows * stride_coef, mask=rmask, other=0.0).to(tl.float32)
    a = tl.where(valid, a, 0.0)
    coef_p, coef_t, coef_s = _grad_coefs(a, wt, wsum, lse, V, label_smoothing, lse_square_scale)
    g = _grad_tile(x, cols, cmask, t_safe, lse, coef_p, coef_t, coef_s, CW, logit_scale, softcap,
                   HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING)
    tl.store(DX + rows64[:, None] * stride_dx + cols[None, :], g.to(DX.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])
    first = rmask & ((tl.zeros([1], tl.int32) + part) == 0)
    if HAS_SMOOTHING:
        sw = tl.sum(tl.load(prow + 2, mask=omask, other=0.0, volatile=True), axis=0) + tl.zeros([1], tl.float32)
    else:
        sw = tl.zeros([1], tl.float32)
    loss, z = _row_loss(lse, xt, wt, wsum, sw, valid, V, label_smoothing, lse_square_scale, HAS_SMOOTHING)
    tl.store(LOSS + rows, loss, mask=first)
    tl.store(ZLOSS + rows, z, mask=first)
    tl.store(LSE + rows, lse, mask=first)
    if COMPUTE_ACC:
        # the first block holding the row maximum has the first maximum (torch.argmax's tie rule)
        first_max = tl.min(tl.where(pm == m, offs, SPLIT_P2), axis=0)
        best = tl.load(PART + (row.to(tl.int64) * SPLIT + first_max) * 4 + 3, volatile=True).to(tl.int32)
        hit = valid & (best == t_safe) & in_range
        tl.store(CORRECT + rows, tl.where(hit, 1.0, 0.0), mask=first)


@triton.jit
def _scale_rows_kernel(DX, stride_dx, G, stride_g, V, BLOCK_V: tl.constexpr):
    """dx[row, :] *= g[row] (stride_g 0: one scalar), skipped where g == 1."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.load(G + row * stride_g).to(tl.float32)
    if g != 1.0:
        cols = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        mask = cols < V
        p = DX + row * stride_dx + cols
        tl.store(p, (tl.load(p, mask=mask, other=0.0).to(tl.float32) * g).to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _ce_bwd_kernel(
    X, stride_x, T, CW, CWSUM, LSE, COEF, stride_coef, DX, stride_dx,
    n_rows, V, ignore_index, label_smoothing, lse_square_scale, logit_scale, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask, valid, in_range, t_safe, wt = _row_setup(T, CW, rows, n_rows, V, ignore_index, HAS_WEIGHT)
    lse = tl.load(LSE + rows, mask=rmask, other=0.0)
    a = tl.load(COEF + rows * stride_coef, mask=rmask, other=0.0).to(tl.float32)
    a = tl.where(valid, a, 0.0)
    if HAS_WEIGHT:
        wsum = tl.load(CWSUM).to(tl.float32)
    else:
        wsum = V * 1.0
    _grad_pass(X, stride_x, DX, stride_dx, CW, rows, rmask, t_safe, wt, lse, a, wsum, V,
               label_smoothing, lse_square_scale, logit_scale, softcap,
               HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, BLOCK_V)


# ----------------------------------------------------------------------------------------------- launchers


@dataclass(frozen=True)
class LossOptions:
    """The scalar options of a cross-entropy launch (see :mod:`tigon.reference.cross_entropy`)."""

    ignore_index: int = -100
    label_smoothing: float = 0.0
    lse_square_scale: float = 0.0
    softcap: float | None = None
    logit_scale: float = 1.0


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


def _split_blocks(vocab: int, device: torch.device) -> tuple[int, int, int]:
    """(BLOCK_V, SPLIT, num_warps) of the one-read gradient kernel: SPLIT programs of BLOCK_V columns per row.

    Under the interpreter programs run one after another, so a program can never wait for a later one: there
    one program takes the whole row (SPLIT = 1).
    """
    if interpreter_enabled() or device.type != "cuda":
        return next_pow2(vocab), 1, 4
    block_v = min(next_pow2(vocab), SPLIT_BLOCK_V)
    return block_v, triton.cdiv(vocab, block_v), warps_for(block_v)


def ce_rows_forward(
    x: torch.Tensor, target: torch.Tensor, cw: torch.Tensor | None, cw_sum: torch.Tensor | None,
    opts: LossOptions, out_loss: torch.Tensor, out_z: torch.Tensor, out_lse: torch.Tensor,
    out_correct: torch.Tensor | None, grad_coef: torch.Tensor | None = None, grad_out: torch.Tensor | None = None,
) -> None:
    """Launch the forward on rows ``x`` (n, V) (unit column stride) with targets (n,) (contiguous).

    Writes per-row loss (incl. z), z, lse and (if ``out_correct`` is given) 1.0/0.0 argmax hits into the
    (n,) fp32 outputs. With ``grad_coef`` (a 0-d fp32 tensor, or (n,)), also writes
    ``grad_coef * d loss_row / d x`` into ``grad_out`` (n, V), which may be ``x`` itself (in place); that path
    reads the logits once (the split-row kernel).
    """
    n, vocab = x.shape
    if n == 0:
        return
    scalars = (n, vocab, int(opts.ignore_index), float(opts.label_smoothing), float(opts.lse_square_scale),
               float(opts.logit_scale), float(opts.softcap or 1.0))
    flags = dict(HAS_WEIGHT=cw is not None, HAS_SOFTCAP=opts.softcap is not None,
                 HAS_SMOOTHING=opts.label_smoothing > 0, COMPUTE_ACC=out_correct is not None)
    cw_args = (cw if cw is not None else out_lse, cw_sum if cw_sum is not None else out_lse)
    correct = out_correct if out_correct is not None else out_loss
    if grad_coef is None:
        block_m, block_v, warps = _blocks(n, vocab, x.device)
        _ce_fwd_kernel[(triton.cdiv(n, block_m),)](
            x, x.stride(0), target, *cw_args, out_loss, out_z, out_lse, correct, *scalars, **flags,
            BLOCK_M=block_m, BLOCK_V=block_v, num_warps=warps,
        )
        return
    block_v, split, warps = _split_blocks(vocab, x.device)
    part = torch.empty((n, split, 4), dtype=torch.float32, device=x.device)
    count = torch.zeros((n,), dtype=torch.int32, device=x.device)
    _ce_split_kernel[(n * split,)](
        x, x.stride(0), target, *cw_args, grad_coef, grad_coef.stride(0) if grad_coef.dim() else 0,
        grad_out, grad_out.stride(0), part, count, out_loss, out_z, out_lse, correct, *scalars, **flags,
        SPLIT=split, SPLIT_P2=next_pow2(split), BLOCK_V=block_v, num_warps=warps,
    )


def scale_rows(dx: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``dx`` (n, V) *= ``grad`` in place (a 0-d tensor, or (n,) per row); rows whose factor is 1 are not
    touched (no host sync: the kernel reads the factor). Returns dx."""
    n, vocab = dx.shape
    if n == 0:
        return dx
    block_v = min(next_pow2(vocab), MAX_BLOCK_V)
    _scale_rows_kernel[(n, triton.cdiv(vocab, block_v))](
        dx, dx.stride(0), grad, grad.stride(0) if grad.dim() else 0, vocab, BLOCK_V=block_v,
        num_warps=warps_for(block_v))
    return dx


def ce_rows_backward(
    x: torch.Tensor, target: torch.Tensor, cw: torch.Tensor | None, cw_sum: torch.Tensor | None,
    lse: torch.Tensor, opts: LossOptions, coef: torch.Tensor, dx: torch.Tensor,
) -> None:
    """Launch the backward: ``dx = coef * d loss_row / d x`` for rows ``x`` (n, V), using the saved ``lse``.

    ``coef`` is a 0-d fp32 tensor (broadcast) or an (n,) tensor of any stride; ``dx`` may be ``x`` (in place).
    """
    n, vocab = x.shape
    if n == 0:
        return
    block_m, block_v, warps = _blocks(n, vocab, x.device)
    _ce_bwd_kernel[(triton.cdiv(n, block_m),)](
        x, x.stride(0), target, cw if cw is not None else lse, cw_sum if cw_sum is not None else lse,
        lse, coef, coef.stride(0) if coef.dim() else 0, dx, dx.stride(0),
        n, vocab, int(opts.ignore_index), float(opts.label_smoothing), float(opts.lse_square_scale),
        float(opts.logit_scale), float(opts.softcap or 1.0),
        HAS_WEIGHT=cw is not None, HAS_SOFTCAP=opts.softcap is not None, HAS_SMOOTHING=opts.label_smoothing > 0,
        BLOCK_M=block_m, BLOCK_V=block_v, num_warps=warps,
    )


def loss_scale(
    target: torch.Tensor, cw: torch.Tensor | None, ignore_index: int, vocab: int, reduction: str,
    num_items_in_batch,
) -> torch.Tensor | None:
    """The factor turning summed per-token losses into the reduced loss: a 0-d fp32 tensor (None for "none").

    mean: 1 / sum of the target weights of non-ignored tokens (0 when that sum is 0, so an all-ignored batch
    gives loss 0 and zero gradients); sum: 1; with num_items_in_batch: 1 / num_items_in_batch. No host sync.
    """
    device = target.device
    if num_items_in_batch is not None:
        items = torch.as_tensor(num_items_in_batch, device=device).reshape(()).to(torch.float32)
        return 1.0 / items
    if reduction == "none":
        return None
    if reduction == "sum":
        return torch.ones((), dtype=torch.float32, device=device)
    valid = target != ignore_index
    if cw is None:
        denom = valid.sum().to(torch.float32)
    else:
        denom = torch.where(valid, cw.gather(0, target.clamp(0, vocab - 1).long()), 0.0).sum()
    return torch.where(denom != 0, 1.0 / torch.where(denom != 0, denom, 1.0), 0.0)


def reduce_rows(
    rows: torch.Tensor, scale: torch.Tensor | None
) -> torch.Tensor:
    """Per-token values (N,) -> the reduced value (``rows`` itself when ``scale`` is None)."""
    return rows if scale is None else rows.sum() * scale


def accuracy(correct: torch.Tensor, target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """Fraction of non-ignored tokens whose argmax hit the target (0-d fp32; 0 when all are ignored)."""
    valid = (target != ignore_index).sum().clamp_min(1).to(torch.float32)
    return correct.sum() / valid


# ---------------------------------------------------------------------------------------------- autograd


def ce_forward(x, target, cw, cw_sum, opts: LossOptions, reduction: str, num_items, want_acc: bool,
               grad_out: torch.Tensor | None = None):
    """The loss of rows ``x`` (n, V) (unit column stride), targets (n,) contiguous, class weights as given by
    :func:`class_weight_args`. Returns (loss, z_loss, accuracy (0-d, zero unless ``want_acc``), lse (n,) fp32,
    scale (see :func:`loss_scale`)). Shared by the autograd.Function and the custom op (tigon.ops._library).

    With ``grad_out`` ((n, V), may be ``x``), also writes ``d loss / d x`` there for an upstream gradient of 1
    (per token for reduction="none"), in the same read of the logits; :func:`scale_rows` applies another one.
    """
    n, vocab = x.shape
    f32 = dict(dtype=torch.float32, device=x.device)
    loss_rows, z_rows, lse = torch.empty(n, **f32), torch.empty(n, **f32), torch.empty(n, **f32)
    correct = torch.empty(n, **f32) if want_acc else None
    scale = loss_scale(target, cw, opts.ignore_index, vocab, reduction, num_items)
    coef = None if grad_out is None else (scale if scale is not None else torch.ones((), **f32))
    ce_rows_forward(x, target, cw, cw_sum, opts, loss_rows, z_rows, lse, correct, grad_coef=coef, grad_out=grad_out)
    acc = accuracy(correct, target, opts.ignore_index) if want_acc else torch.zeros((), **f32)
    return reduce_rows(loss_rows, scale), reduce_rows(z_rows, scale), acc, lse, scale


def ce_backward(grad_loss, x, target, cw, cw_sum, lse, scale, opts: LossOptions, dx) -> torch.Tensor:
    """Write ``d loss / d x`` times the upstream ``grad_loss`` into ``dx`` (may be ``x``); returns dx."""
    coef = grad_loss.to(torch.float32)
    if scale is not None:
        coef = (coef * scale).reshape(())
    ce_rows_backward(x, target, cw, cw_sum, lse, opts, coef, dx)
    return dx


class CrossEntropyFunction(torch.autograd.Function):
    """autograd wrapper: ``apply(logits, target, class_weight, opts, reduction, num_items, want_acc, inplace)``.

    Returns (loss, z_loss, accuracy); z_loss and accuracy are non-differentiable (accuracy is a dummy zero
    when ``want_acc`` is False). ``logits`` (N, V) any dtype in KERNEL_DTYPES; the gradient has its dtype.

    Default: the forward reads the logits once and writes per-row loss and lse; the backward reads them again
    and writes ``round(upstream * d loss / d logits)`` (one rounding, like the unfused computation) into a new
    buffer. The caller's logits are never written.

    ``inplace`` (when the logits need a gradient): the forward writes ``d loss / d logits`` over the logits in
    the same read (the split-row kernel; the logits are read once and written once, Liger-Kernel's schedule
    without its second read) and bumps their autograd version, so another op that saved them for its backward
    raises instead of using the overwritten values. The backward multiplies by the upstream gradient in place,
    skipping rows whose factor is exactly 1 (``loss.backward()`` on a mean or sum). A factor other than 1 rounds
    the gradient twice (bf16: up to one more half-ulp, as in Liger-Kernel).
    """

    @staticmethod
    def forward(ctx, logits, target, class_weight, opts, reduction, num_items, want_acc, inplace):
        x = logits if logits.stride(-1) == 1 else logits.contiguous()
        target = target.contiguous()
        cw, cw_sum = class_weight_args(class_weight, x.device)
        preformed = inplace and ctx.needs_input_grad[0]
        loss, z, acc, lse, scale = ce_forward(x, target, cw, cw_sum, opts, reduction, num_items, want_acc,
                                              grad_out=x if preformed else None)
        if preformed and x is logits:
            torch.autograd.graph.increment_version(logits)
        # In place: save a detached alias, so that the gradient returned (the same memory) is the only reference
        # to its tensor object and autograd can hand it on (or keep it as a leaf's .grad) without a copy.
        ctx.save_for_backward(x.detach() if inplace else x, target, cw, cw_sum, lse, scale)
        ctx.opts, ctx.inplace, ctx.preformed, ctx.consumed = opts, inplace, preformed, False
        ctx.mark_non_differentiable(z, acc)
        return loss, z, acc

    @staticmethod
    def backward(ctx, grad_loss, _grad_z, _grad_acc):
        if not ctx.needs_input_grad[0]:
            return (None,) * 8
        if ctx.consumed:
            raise RuntimeError("tigon.cross_entropy(inplace_backward=True) wrote its gradient into the logits "
                               "buffer during the first backward; a second backward through it is not possible")
        x, target, cw, cw_sum, lse, scale = ctx.saved_tensors
        if ctx.preformed:
            dx = scale_rows(x, grad_loss.to(torch.float32))
        else:
            dx = ce_backward(grad_loss, x, target, cw, cw_sum, lse, scale, ctx.opts,
                             x if ctx.inplace else torch.empty_like(x))
        ctx.consumed = ctx.inplace
        return dx, None, None, None, None, None, None, None
