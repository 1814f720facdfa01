"""Fused linear generalised JSD: the distillation loss of a student's and a teacher's LM heads without the (N, V)
logits of either model.

Formula and semantics: :mod:`tigon.reference.fused_linear_jsd`. Chunks of tokens as the fused cross-entropy's
(:func:`tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`: its chunk rule and ``memory`` budget, its
matmuls and fp32 accumulators), with the gradient formed in the forward (the loss is a scalar, so its backward only
scales it, as Liger-Kernel's fused linear JSD does). Per chunk of rows:

1. ``z_s = h_s W_s^T (+ b_s)`` into the chunk buffer (compute dtype), ``z_t = h_t W_t^T (+ b_t)`` into a second one;
2. one Triton kernel (:func:`_jsd_logits_kernel`) reads both rows of logits in the compute dtype and, in fp32
   registers: (pass 1) both rows' online log-sum-exp of ``z / T``; (pass 2) ``x = log_softmax(z_s / T)``,
   ``y = log_softmax(z_t / T)`` per element, the divergence's pointwise term and its derivative ``g = d l / d x``
   (:func:`tigon.kernels.divergence._terms`, the formula :func:`tigon.functional.jsd` runs), summed per row;
   (pass 3) the gradient w.r.t. the student's logits, ``scale (g - softmax(z_s / T) sum_v g) / T`` (the
   log-softmax's backward; scale = 1 / kept rows), written over the student's chunk buffer in place;
3. the loop's matmuls add ``grad_hidden = G W_s`` and ``grad_W += G^T h_s`` (and ``grad_b += sum G``).

Memory per chunk row: the two logits rows in the compute dtype, nothing else (no fp32 (rows, V) temporaries). Bytes
per chunk: three reads of both rows and one write of the student's (7 x rows x V x 2 in bf16: about 4 ms at 8192 x
128256 on an H200 by copy bandwidth). The teacher gets no gradient. Matmuls: 2 for the logits, 2 for the student's
gradients (4 N H V x 2 FLOPs in all).

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

from ._common import CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, once_differentiable, or_empty
from .divergence import JSD, KL_LOG, KL_LOG_REVERSE, Divergence, _blocks, _terms, reduction_scale
from .fused_linear_cross_entropy import FLCE_BUDGET_BYTES_CUDA, backward_over_chunks
from .head_grads import _Matmuls, _operands, grad_buffers, scale_grads

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
def _online_lse(m, s, x):
    """One step of the online log-sum-exp (Milakov & Gimelshein 2018) over a [rows, cols] tile ``x`` (-inf where
    masked): the running max ``m`` and sum ``s`` of exp(x - m), per row."""
    m_new = tl.maximum(m, tl.max(x, axis=1))
    m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # rows all -inf so far keep s = 0
    s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref[:, None]), axis=1)
    return m_new, s


@triton.jit
def _log_probs(Z, rows64, stride, cols, read, inv_t, m, logs):
    """log_softmax(z / T) of a tile of raw logits from the row's max ``m`` and log-sum ``logs`` of z / T: (z / T - m) -
    logs, the max subtracted first as torch's log_softmax does; -inf where not ``read``."""
    z = tl.load(Z + rows64[:, None] * stride + cols[None, :], mask=read, other=0.0).to(tl.float32) * inv_t
    return tl.where(read, (z - m[:, None]) - logs[:, None], float("-inf"))


@triton.jit
def _jsd_logits_kernel(
    ZS, stride_s,    # (n, V) student logits (compute dtype), unit column stride; overwritten with the gradient
    ZT, stride_t,    # (n, V) teacher logits, unit column stride
    LABELS,          # (n,) integer labels (HAS_LABELS): rows labelled ignore_index are skipped
    SCALE,           # 0-d fp32: the reduction's factor (1 / kept rows), multiplies the gradient
    LOSS,            # (n,) fp32 output: each row's divergence (0 for a skipped row)
    n_rows, V, ignore_index, inv_t, beta,
    KIND: tl.constexpr, HAS_LABELS: tl.constexpr, WRITE_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    in_rows = rows < n_rows
    keep = in_rows
    if HAS_LABELS:
        keep = in_rows & (tl.load(LABELS + rows, mask=in_rows, other=ignore_index) != ignore_index)
    # pass 1: both rows' log-sum-exp of z / T
    ms = tl.full([BLOCK_M], float("-inf"), tl.float32)
    mt = tl.full([BLOCK_M], float("-inf"), tl.float32)
    ss = tl.zeros([BLOCK_M], tl.float32)
    st = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        read = keep[:, None] & (cols < V)[None, :]
        zs = tl.load(ZS + rows[:, None] * stride_s + cols[None, :], mask=read, other=float("-inf")).to(tl.float32)
        zt = tl.load(ZT + rows[:, None] * stride_t + cols[None, :], mask=read, other=float("-inf")).to(tl.float32)
        ms, ss = _online_lse(ms, ss, zs * inv_t)
        mt, st = _online_lse(mt, st, zt * inv_t)
    ms = tl.where(keep, ms, 0.0)  # skipped rows: finite statistics, never used
    mt = tl.where(keep, mt, 0.0)
    logs_s = tl.log(tl.where(keep, ss, 1.0))
    logs_t = tl.log(tl.where(keep, st, 1.0))
    # pass 2: the row's divergence and sum_v d l / d x_v
    acc = tl.zeros([BLOCK_M], tl.float32)
    gsum = tl.zeros([BLOCK_M], tl.float32)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        read = keep[:, None] & (cols < V)[None, :]
        x = _log_probs(ZS, rows, stride_s, cols, read, inv_t, ms, logs_s)
        y = _log_probs(ZT, rows, stride_t, cols, read, inv_t, mt, logs_t)
        loss, dx, _dy = _terms(x, y, beta, 0.0, KIND)
        acc += tl.sum(tl.where(read, loss, 0.0), axis=1)
        gsum += tl.sum(tl.where(read, dx, 0.0), axis=1)
    tl.store(LOSS + rows, acc, mask=in_rows)
    if WRITE_GRAD:
        # pass 3: d loss / d z_s = scale / T (g - p_s sum_v g); skipped rows get zeros (the matmuls read them)
        coef = tl.load(SCALE) * inv_t
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            cmask = (cols < V)[None, :]
            read = keep[:, None] & cmask
            x = _log_probs(ZS, rows, stride_s, cols, read, inv_t, ms, logs_s)
            y = _log_probs(ZT, rows, stride_t, cols, read, inv_t, mt, logs_t)
            _loss, dx, _dy = _terms(x, y, beta, 0.0, KIND)
            g = tl.where(read, (dx - tl.exp(x) * gsum[:, None]) * coef, 0.0)
            tl.store(ZS + rows[:, None] * stride_s + cols[None, :], g.to(ZS.dtype.element_ty),
                     mask=in_rows[:, None] & cmask)


def jsd_rows(zs: torch.Tensor, zt: torch.Tensor, labels: torch.Tensor | None, scale: torch.Tensor, opts: Divergence,
             inv_t: float, loss: torch.Tensor, write_grad: bool) -> None:
    """Run :func:`_jsd_logits_kernel` on a chunk: student and teacher logits ``zs``, ``zt`` (n, V) (unit column
    stride, the compute dtype), labels (n,) contiguous or None, the 0-d fp32 ``scale``; writes the rows' divergence
    into ``loss`` ((n,) fp32) and, with ``write_grad``, ``scale * d loss / d zs`` over ``zs`` in place."""
    n, vocab = zs.shape
    if n == 0:
        return
    block_m, block_v, warps = _blocks(n, vocab, zs.device)
    _jsd_logits_kernel[(cdiv(n, block_m),)](
        zs, zs.stride(0), zt, zt.stride(0), labels if labels is not None else scale, scale, loss,
        n, vocab, int(opts.ignore_index), float(inv_t), float(opts.beta),
        KIND=opts.kind, HAS_LABELS=labels is not None, WRITE_GRAD=write_grad, BLOCK_M=block_m, BLOCK_V=block_v,
        num_warps=warps,
    )


def _kind(beta: float) -> int:
    return KL_LOG if beta == 0.0 else KL_LOG_REVERSE if beta == 1.0 else JSD


def jsd_forward(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias,
                beta: float, ignore_index: int, temperature: float, cd: torch.dtype, need, lean: bool = False,
                budget: int = -1, halves: bool = True):
    """(loss 0-d fp32, (gh, gw, gb) unscaled accumulators for :func:`scale_grads`, None where not needed) of the
    batch-mean JSD over the rows whose label is not ``ignore_index`` (all rows when ``labels`` is None). ``halves``:
    grad_weight as a :class:`~tigon.kernels.head_grads.RowHalves` (eager calls)."""
    n = student_input.shape[0]
    vocab = student_weight.shape[0]
    dev = student_input.device
    labels = labels.contiguous() if labels is not None else None
    scale = reduction_scale(labels, ignore_index, n, vocab, "batchmean", dev)
    opts = Divergence(_kind(beta), beta, 0.0, ignore_index)
    loss_rows = torch.zeros(n, dtype=torch.float32, device=dev)
    ht, wt, bt = _operands(teacher_input.detach(), teacher_weight.detach(),
                           None if teacher_bias is None else teacher_bias.detach(), cd)
    want_grad = any(need)
    if budget < 0 and not lean and compiled_cuda(dev):
        budget = FLCE_BUDGET_BYTES_CUDA  # the chunk rows' comment above
    teacher_buf: list[torch.Tensor] = []
    mm = _Matmuls(dev, cd)

    def rows_grad(lg, s, e):
        if not teacher_buf:  # one (rows, V) buffer for the teacher's logits, the size of the student's
            teacher_buf.append(torch.empty_like(lg))
        tz = teacher_buf[0][: e - s]
        mm.logits(tz, ht[s:e], wt, bt)
        jsd_rows(lg, tz, labels[s:e] if labels is not None else None, scale, opts, 1.0 / temperature,
                 loss_rows[s:e], want_grad)

    grads = backward_over_chunks(student_input, student_weight, student_bias, cd, need, lean, halves, budget, rows_grad,
                                 elem_bytes=2 * cd.itemsize, scalar=True)
    return loss_rows.sum() * scale, grads


class FusedLinearJSDFunction(torch.autograd.Function):
    """``apply(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias, beta,
    ignore_index, temperature, cd, need, lean, budget) -> loss``: 0-d fp32, gradients formed in the forward for
    ``need`` = (student_input, student_weight, student_bias) and scaled by the upstream gradient in the backward (a
    second backward through the same graph raises)."""

    @staticmethod
    def forward(ctx, student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                teacher_bias, beta, ignore_index, temperature, cd, need, lean=False, budget=-1):
        loss, grads = jsd_forward(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                                  teacher_bias, beta, ignore_index, temperature, cd, need, lean, budget)
        ctx.grads, ctx.need = grads, need
        ctx.dtypes = (student_input.dtype, student_weight.dtype,
                      student_bias.dtype if student_bias is not None else None)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        none = (None,) * 8
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
           need_bias: bool, lean: bool, budget: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss 0-d fp32, grad_input, grad_weight, grad_bias) for an upstream gradient of 1, in the dtypes of
    :func:`~tigon.kernels.head_grads.grad_buffers`' scalar path; (0,) where not needed."""
    loss, grads = jsd_forward(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                              teacher_bias, beta, ignore_index, temperature, cd, (need_input, need_weight, need_bias),
                              lean, budget, halves=False)
    return (loss, *(or_empty(g, loss) for g in grads))


@_fljsd.register_fake
def _(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias, beta,
      ignore_index, temperature, cd, need_input, need_weight, need_bias, lean, budget):
    loss = student_input.new_empty((), dtype=torch.float32)
    need = (need_input, need_weight, need_bias)
    # the real allocator on fake tensors: the kernel path's shapes and dtypes by construction
    grads = grad_buffers(student_input.shape[0], student_input, student_weight, cd, need, lean, True)
    return (loss, *(or_empty(g, loss) for g in grads))


def _fljsd_setup(ctx, inputs, output):
    student_input, student_weight, _ti, _tw, _labels, student_bias, *_rest = inputs
    ctx.need = tuple(inputs[11:14])
    ctx.dtypes = (student_input.dtype, student_weight.dtype, student_bias.dtype if student_bias is not None else None)
    ctx.save_for_backward(*output[1:])


def _fljsd_grad(ctx, grad_loss, *_unused):
    saved = [t if wanted else None for t, wanted in zip(ctx.saved_tensors, ctx.need)]
    gh, gw, gb = scale_grads(saved, grad_loss, ctx.dtypes, inplace=False)
    return (if_wanted(gh, ctx.need[0]), if_wanted(gw, ctx.need[1]), None, None, None,
            if_wanted(gb, ctx.need[2])) + (None,) * 10


_fljsd.register_autograd(_fljsd_grad, setup_context=_fljsd_setup)


def compiled_fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias,
                              teacher_bias, beta, ignore_index, temperature, cd, need, lean=False, budget=-1):
    """``FusedLinearJSDFunction.apply`` as the ``tigon::fused_linear_jsd`` custom op: the loss."""
    return _fljsd(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias,
                  float(beta), int(ignore_index), float(temperature), cd, *need, lean, budget)[0]
