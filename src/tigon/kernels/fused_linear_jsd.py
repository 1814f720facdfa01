"""Fused linear generalised JSD: the distillation loss of a student's and a teacher's LM heads without the (N, V)
logits of either model.

Formula and semantics: :mod:`tigon.reference.fused_linear_jsd`. Chunks of tokens as the fused cross-entropy's
(:func:`tigon.kernels.fused_linear_cross_entropy.backward_over_chunks`: its chunk rule and ``memory`` budget, its
matmuls and fp32 accumulators), with the gradient formed in the forward (the loss is a scalar, so its backward only
scales it, as Liger-Kernel's fused linear JSD does). Per chunk of rows:

1. ``z_s = h_s W_s^T (+ b_s)`` into the chunk buffer (compute dtype), ``z_t = h_t W_t^T (+ b_t)`` into a second one;
2. ``x = log_softmax(z_s / T)``, ``y = log_softmax(z_t / T)`` in fp32 (torch);
3. the divergence kernel of :mod:`tigon.kernels.divergence` (the one :func:`tigon.functional.jsd` runs) writes the
   rows' JSD and ``g = scale * d JSD / d x`` (scale = 1 / kept rows), in place over ``y``;
4. the gradient w.r.t. the student's logits, ``(g - softmax(z_s / T) * sum_v g) / T`` (the log-softmax's
   backward), goes into the chunk buffer, and the loop's matmuls add ``grad_hidden = G W_s`` and ``grad_W += G^T h_s``
   (and ``grad_b += sum G``).

Memory per chunk row: the two logits rows in the compute dtype and two fp32 rows (x, y), plus torch's fp32
temporaries of the log-softmax (:data:`ELEM_BYTES_FP32` per logit on top of the compute dtype's two). The teacher
gets no gradient. Matmuls: 2 for the logits, 2 for the student's gradients (4 N H V x 2 FLOPs in all).
"""

from __future__ import annotations

import torch

from typing import Optional

from torch import Tensor

from ._common import CUSTOM_OP_TAGS, compiled_cuda, if_wanted, once_differentiable, or_empty
from .divergence import JSD, KL_LOG, KL_LOG_REVERSE, Divergence, launch, reduction_scale
from .fused_linear_cross_entropy import (
    FLCE_BUDGET_BYTES_CUDA, _operands, backward_over_chunks, grad_buffers, scale_grads,
)

ELEM_BYTES_FP32 = 16
"""fp32 bytes a chunk holds per logit besides the two logits buffers: x and y (4 + 4) and the log-softmax's
temporaries (up to 8 while one is formed)."""

# Chunk rows. The fused cross-entropy's default rule keeps at least H/2 rows per chunk (fewer passes over the fp32
# grad_weight accumulator); at 2 + 2 + 16 bytes per logit that floor would hold 2048 x 128256 x 20 B = 5.3 GB at
# Llama-3-8B's head, beside the 2.1 GB accumulator. So memory="auto" here is the budget FLCE_BUDGET_BYTES_CUDA (3 GiB)
# for the chunk and the accumulator together (:func:`chunk_rows`' budget rule: 432 rows there, 19 chunks at 8192
# tokens, each re-reading and re-writing the accumulator: about 80 GB of traffic, ~19 ms at 4.3 TB/s; estimated, not
# measured). A larger ``memory=`` budget trades memory for fewer chunks; "low" accumulates in the weight's dtype.


def _kind(beta: float) -> int:
    return KL_LOG if beta == 0.0 else KL_LOG_REVERSE if beta == 1.0 else JSD


def jsd_forward(student_input, student_weight, teacher_input, teacher_weight, labels, student_bias, teacher_bias,
                beta: float, ignore_index: int, temperature: float, cd: torch.dtype, need, lean: bool = False,
                budget: int = -1, halves: bool = True):
    """(loss 0-d fp32, (gh, gw, gb) unscaled accumulators for :func:`scale_grads`, None where not needed) of the
    batch-mean JSD over the rows whose label is not ``ignore_index`` (all rows when ``labels`` is None). ``halves``:
    grad_weight as a :class:`~tigon.kernels.fused_linear_cross_entropy.RowHalves` (eager calls)."""
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
    inv_t = 1.0 / temperature
    teacher_buf: list[torch.Tensor] = []

    def rows_grad(lg, s, e):
        if not teacher_buf:  # one (rows, V) buffer for the teacher's logits, the size of the student's
            teacher_buf.append(torch.empty_like(lg))
        tz = teacher_buf[0][: e - s]
        if bt is None:
            torch.mm(ht[s:e], wt.t(), out=tz)
        else:
            torch.addmm(bt, ht[s:e], wt.t(), out=tz)
        x = torch.log_softmax(lg.float().mul_(inv_t), dim=-1)
        y = torch.log_softmax(tz.float().mul_(inv_t), dim=-1)
        launch(x, y, labels[s:e] if labels is not None else None, scale, opts, loss=loss_rows[s:e],
               dx=y if want_grad else None)  # each program reads its block of y before writing g over it
        if want_grad:
            g = y
            g.sub_(x.exp_().mul_(g.sum(dim=-1, keepdim=True))).mul_(inv_t)
            lg.copy_(g)

    grads = backward_over_chunks(student_input, student_weight, student_bias, cd, need, lean, halves, budget, rows_grad,
                                 elem_bytes=2 * cd.itemsize + ELEM_BYTES_FP32, scalar=True)
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
    :func:`~tigon.kernels.fused_linear_cross_entropy.grad_buffers`' scalar path; (0,) where not needed."""
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
