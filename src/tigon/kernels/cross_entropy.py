"""Cross-entropy on (N, V) logits: the eager autograd.Function and the torch.library custom op over the row kernels of
:mod:`tigon.kernels.loss_rows`. Eagerly, by default, the forward also forms the gradient into a new buffer while
each row is still in L2 (:class:`CrossEntropyFunction`); lazily, one read of the logits forward and one read and
one write backward (the custom op, reduction="none"); with ``grad_in_forward`` the gradient is written over the
logits during the forward.

Formula and semantics: :mod:`tigon.reference.cross_entropy`. Minimal bytes (bf16 logits): forward N*V*2, backward
2*N*V*2.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import loss_rows as rows
from ._common import CUSTOM_OP_TAGS, compiled_cuda, num_items_tensor
from .first_order import once_differentiable
from .loss_reduce import reduce_losses
from .loss_rows import (
    LossOptions, ce_rows_backward, ce_rows_forward, class_weight_args, row_stats, scale_rows_,
)


# ---------------------------------------------------------------------------------------------- autograd


def grad_in_forward_block(device: torch.device) -> tuple[int, int, bool] | None:
    """:data:`tigon.kernels.loss_rows.GRAD_IN_FORWARD_BLOCK` on CUDA; None (the default blocks) under the
    interpreter."""
    return rows.GRAD_IN_FORWARD_BLOCK if compiled_cuda(device) else None


def ce_forward(x, target, cw, cw_sum, opts: LossOptions, reduction: str, num_items, want_acc: bool,
               grad_out: torch.Tensor | None = None, pred: torch.Tensor | None = None):
    """The loss of rows ``x`` (n, V) (unit column stride), targets (n,) contiguous, class weights as given by
    :func:`class_weight_args`. Returns (loss, z_loss, accuracy (0-d, zero unless ``want_acc``; (n,) hits for
    "none"), the row statistics stats (n, 2) fp32 (max, log-sum: :func:`tigon.kernels.loss_rows.row_stats`),
    scale (see :func:`reduce_losses`)). Shared by the autograd.Function and the custom op below.
    ``grad_out`` (n, V), may be ``x``: also write ``d loss / d x`` there (a scalar reduction), one row at a time
    right after its loss, by the program that read it. ``pred``: an (n,) int64 tensor to write each row's argmax
    class into (-1 for ignored rows), or None."""
    n, vocab = x.shape
    f32 = dict(dtype=torch.float32, device=x.device)
    loss_rows, z_rows, stats = torch.empty(n, **f32), torch.empty(n, **f32), row_stats(n, x.device)
    correct = torch.empty(n, **f32) if want_acc else None
    if grad_out is None:
        ce_rows_forward(x, target, cw, cw_sum, opts, loss_rows, z_rows, stats, correct, out_pred=pred)
    else:
        scales = reduce_losses(target, cw, opts.ignore_index, vocab, reduction, num_items)[3]
        ce_rows_forward(x, target, cw, cw_sum, opts, loss_rows, z_rows, stats, correct, grad_scales=scales,
                        grad_out=grad_out, block=grad_in_forward_block(x.device), out_pred=pred)
    loss, z, acc, scale = reduce_losses(target, cw, opts.ignore_index, vocab, reduction, num_items,
                                        loss_rows, z_rows, correct, zero_acc=True)
    return loss, z, acc, stats, scale


def ce_backward(grad_loss, x, target, cw, cw_sum, stats, scale, opts: LossOptions, dx,
                skip_unit: bool = False) -> torch.Tensor:
    """Write ``d loss / d x`` times the upstream ``grad_loss`` into ``dx`` (may be ``x``); returns dx. ``scale``:
    from :func:`reduce_losses` (None for reduction="none", where ``grad_loss`` is per token). ``skip_unit``: dx
    holds the forward's gradient for an upstream of 1, kept as it is when ``grad_loss`` is 1 (decided on the
    device)."""
    ce_rows_backward(x, target, cw, cw_sum, stats, opts, grad_loss, dx, scale, skip_unit=skip_unit)
    return dx


def saved_tensor_hooks_active() -> bool:
    """True while saved-tensor hooks are set (non-reentrant activation checkpointing, ``save_on_cpu``,
    ``torch.autograd.graph.saved_tensors_hooks``), or when this torch cannot tell. grad_in_forward then runs the
    lazy path: a checkpointed region is run again before its backward, and the gradient written over the logits
    in that second run would replace the logits another op of the region saved (no version check catches it)."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return True
    try:
        return top(False) is not None
    except (RuntimeError, TypeError):
        return True


class CrossEntropyFunction(torch.autograd.Function):
    """autograd wrapper: ``apply(logits, target, class_weight, opts, reduction, num_items, want_acc, inplace,
    want_pred)``.

    Returns (loss, z_loss, accuracy, predicted tokens); the last three are non-differentiable (accuracy is a dummy
    zero when ``want_acc`` is False; the predicted tokens, (N,) int64 with -1 where ignored, are (0,) unless
    ``want_pred``). ``logits`` (N, V) any dtype in KERNEL_DTYPES; the gradient has its dtype.

    ``inplace`` picks where and when the gradient is written:

    - ``"formed"`` (the functional default when the logits need a gradient and the loss is a scalar): the forward
      forms ``d loss / d logits`` for an upstream of 1 into a new (N, V) buffer, right after each row's loss, while
      the row may still be in L2; the backward hands that buffer on untouched when the upstream is 1 (the usual
      ``loss.backward()``) and otherwise recomputes it from the logits for that upstream (one rounding, as the
      lazy path: the device decides, no host sync). The logits are never written. A second backward
      (``retain_graph``) recomputes into a new buffer.
    - ``False``: lazy: the forward writes per-row loss and row statistics (max, log-sum); the backward reads the
      logits again and writes the gradient (``round(upstream * d loss / d logits)``, as the unfused computation)
      into a new buffer; ``True``: the same, written over the logits.
    - ``"forward"`` (grad_in_forward=True): formed in the forward as ``"formed"``, but written over the logits (no
      extra buffer, as Liger-Kernel does), and the backward scales it by the upstream (a no-op when that is 1;
      rounded twice otherwise).

    The formed modes fall back to the lazy one for reduction="none", for logits that need no gradient and while
    saved-tensor hooks are set (activation checkpointing would run the forward, and write the gradient, twice).

    Speed (H200, 8192 x 128256 bf16, 10% of the tokens ignored, fwd+bwd with upstream 1, kernel time,
    session8/sweep9_ce_graph.json): formed in the forward 1.438 ms (69% of copy bandwidth over the 2 N V e minimal
    bytes), against 1.611 lazily, 2.604 for torch.compile and 1.420 for Liger's kernels (whose host
    synchronisations make a step take 2.07 ms: session8/method.log). Each program re-reads its row right after the
    row's loss, last block first (blocks: :data:`GRAD_IN_FORWARD_BLOCK`). Both read the logits twice: as bytes moved
    that is 97% of copy bandwidth, so 80% of the minimal bytes' floor needs a single read. Measured designs for
    that: rows split over programs that meet at per-row counters (session 4's, 32%: commit 6468296; a persistent
    grid taking tasks in ticket order with the next task's load in flight, 30%: commit 8f4fd00,
    session8/tune10_ce_onepass.json: 13.5 us per task whose bytes need about 4, i.e. bound by the latency of each
    task's chain of dependent atomics and loads). Keeping the second read in L2 instead: capping the grid at 1-4
    programs per SM was slower (2.0-4.6 ms against 1.620: too few bytes in flight; session7/tune7_ce.json), holding
    a row's last block in registers was slower (1.80-1.94 ms: fewer resident programs), and going last block first
    gained 5-9% at 8k tokens and 5% at 64k with blocks of 8192 (session8/tune12_ce_reverse_ab.json; with blocks of
    32768 it lost 4%, tune11_ce_order.json).
    """

    @staticmethod
    def forward(ctx, logits, target, class_weight, opts, reduction, num_items, want_acc, inplace, want_pred=False):
        formed = (inplace in ("forward", "formed") and ctx.needs_input_grad[0] and reduction != "none"
                  and not saved_tensor_hooks_active())
        ctx.grad_formed = formed and inplace == "forward"  # written over the logits
        ctx.formed = None  # "formed": the gradient's own buffer, until the backward hands it on
        # Written in place (either way) only where every element has its own memory (rows sharing memory, e.g. an
        # expanded bias, would read gradients as logits): otherwise a contiguous copy takes the gradient.
        writes = ctx.grad_formed or inplace is True
        rows_share = logits.shape[0] > 1 and logits.stride(0) < logits.shape[1]
        x = logits if logits.stride(-1) == 1 and not (writes and rows_share) else logits.contiguous()
        target = target.contiguous()
        cw, cw_sum = class_weight_args(class_weight, x.device)
        if ctx.grad_formed and x is logits:
            # anything that saved the logits for its own backward now raises there instead of reading gradients
            torch.autograd.graph.increment_version(logits)
        if formed and not ctx.grad_formed:
            ctx.formed = torch.empty_like(x, memory_format=torch.contiguous_format)
        pred = target.new_empty((target.shape[0] if want_pred else 0,), dtype=torch.int64)
        grad_out = x if ctx.grad_formed else ctx.formed
        loss, z, acc, stats, scale = ce_forward(x, target, cw, cw_sum, opts, reduction, num_items, want_acc,
                                              grad_out=grad_out, pred=pred if want_pred else None)
        # In place: save a detached alias, so that the gradient returned (the same memory) is the only reference
        # to its tensor object and autograd can hand it on (or keep it as a leaf's .grad) without a copy.
        if ctx.grad_formed:
            ctx.save_for_backward(x.detach())
        else:
            ctx.save_for_backward(x.detach() if inplace is True else x, target, cw, cw_sum, stats, scale)
        ctx.opts, ctx.inplace, ctx.consumed = opts, inplace is True, False
        ctx.mark_non_differentiable(z, acc, pred)
        # z_loss and accuracy get no gradient: skip materialising zeros for them (two fills per backward)
        ctx.set_materialize_grads(False)
        return loss, z, acc, pred

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, grad_loss, _grad_z, _grad_acc, _grad_pred):
        if not ctx.needs_input_grad[0] or grad_loss is None:
            return (None,) * 9
        if ctx.consumed:
            raise RuntimeError("tigon.cross_entropy(inplace_backward=True or grad_in_forward=True) wrote its "
                               "gradient into the logits buffer and handed it to the first backward; a second "
                               "backward through it is not possible")
        if ctx.grad_formed:
            (x,) = ctx.saved_tensors
            ctx.consumed = True
            return scale_rows_(x, grad_loss.to(torch.float32)), None, None, None, None, None, None, None, None
        x, target, cw, cw_sum, stats, scale = ctx.saved_tensors
        if ctx.formed is not None:  # the forward's buffer: kept for an upstream of 1, else recomputed over
            dx, ctx.formed = ctx.formed, None  # handed on: autograd may keep it as a leaf's .grad, no copy
            return (ce_backward(grad_loss, x, target, cw, cw_sum, stats, scale, ctx.opts, dx, skip_unit=True),
                    None, None, None, None, None, None, None, None)
        dx = ce_backward(grad_loss, x, target, cw, cw_sum, stats, scale, ctx.opts,
                         x if ctx.inplace else torch.empty_like(x))
        if ctx.inplace:
            # the logits now hold the gradient: a node that saved them (e.g. a softmax that produced them) raises
            # when its backward unpacks them, instead of reading gradients as logits (x shares their version)
            torch.autograd.graph.increment_version(x)
        ctx.consumed = ctx.inplace
        return dx, None, None, None, None, None, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::cross_entropy", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _cross_entropy(logits: Tensor, target: Tensor, class_weight: Optional[Tensor], num_items: Optional[Tensor],
                   ignore_index: int, label_smoothing: float, lse_square_scale: float, softcap: Optional[float],
                   reduction: str, want_acc: bool, want_pred: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor,
                                                                                     Tensor]:
    """(loss, z_loss, accuracy, stats, predicted tokens): loss and z_loss fp32, 0-d (or (N,) for
    ``reduction="none"``); accuracy 0-d fp32 (0 unless ``want_acc``; (N,) hits for "none"); stats (N, 2) fp32,
    the rows' max and log-sum (:func:`tigon.kernels.loss_rows.row_stats`), kept for the backward; predicted tokens
    (N,) int64 (-1 where ignored) with ``want_pred``, else (0,)."""
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    target = target.contiguous()
    cw, cw_sum = class_weight_args(class_weight, x.device)
    opts = LossOptions(ignore_index, label_smoothing, lse_square_scale, softcap, 1.0)
    pred = target.new_empty((target.shape[0] if want_pred else 0,), dtype=torch.int64)
    loss, z, acc, stats, _ = ce_forward(x, target, cw, cw_sum, opts, reduction, num_items, want_acc,
                                        pred=pred if want_pred else None)
    return loss, z, acc, stats, pred


@_cross_entropy.register_fake
def _(logits, target, class_weight, num_items, ignore_index, label_smoothing, lse_square_scale, softcap,
      reduction, want_acc, want_pred=False):
    n = logits.shape[0]
    loss_shape = (n,) if reduction == "none" else ()
    f32 = dict(dtype=torch.float32)
    acc_shape = loss_shape if want_acc else ()  # "none": each token's hit
    return (logits.new_empty(loss_shape, **f32), logits.new_empty(loss_shape, **f32),
            logits.new_empty(acc_shape, **f32), logits.new_empty((n, 2), **f32),
            target.new_empty((n if want_pred else 0,), dtype=torch.int64))


@torch.library.custom_op("tigon::cross_entropy_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _cross_entropy_backward(grad_loss: Tensor, logits: Tensor, target: Tensor, class_weight: Optional[Tensor],
                            num_items: Optional[Tensor], stats: Tensor, ignore_index: int, label_smoothing: float,
                            lse_square_scale: float, softcap: Optional[float], reduction: str) -> Tensor:
    """d loss / d logits: logits' shape and dtype, contiguous."""
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    target = target.contiguous()
    cw, cw_sum = class_weight_args(class_weight, x.device)
    *_, scale = reduce_losses(target, cw, ignore_index, x.shape[1], reduction, num_items)
    return ce_backward(grad_loss, x, target, cw, cw_sum, stats, scale,
                       LossOptions(ignore_index, label_smoothing, lse_square_scale, softcap, 1.0),
                       torch.empty(size=x.shape, dtype=x.dtype, device=x.device))


@_cross_entropy_backward.register_fake
def _(grad_loss, logits, target, class_weight, num_items, stats, ignore_index, label_smoothing, lse_square_scale,
      softcap, reduction):
    return logits.new_empty(logits.shape)


def _cross_entropy_setup(ctx, inputs, output):
    logits, target, class_weight, num_items, *scalars = inputs
    ctx.save_for_backward(logits, target, class_weight, num_items, output[3])
    ctx.scalars = scalars[:5]  # ignore_index, label_smoothing, lse_square_scale, softcap, reduction (not the flags)


def _cross_entropy_grad(ctx, grad_loss, _dz, _dacc, _dlse, _dpred):
    if not ctx.needs_input_grad[0]:
        return (None,) * 11
    logits, target, class_weight, num_items, stats = ctx.saved_tensors
    dx = _cross_entropy_backward(grad_loss, logits, target, class_weight, num_items, stats, *ctx.scalars)
    return (dx,) + (None,) * 10


_cross_entropy.register_autograd(_cross_entropy_grad, setup_context=_cross_entropy_setup)


def compiled_cross_entropy(logits, target, class_weight, opts: LossOptions, reduction, num_items, want_acc,
                           inplace=False, want_pred=False):
    """``CrossEntropyFunction.apply`` as the ``tigon::cross_entropy`` custom op: (loss, z_loss, accuracy, predicted
    tokens).

    ``inplace`` is ignored (see the module docstring).
    """
    loss, z, acc, _, pred = _cross_entropy(
        logits, target, class_weight, num_items_tensor(num_items, logits.device), opts.ignore_index,
        opts.label_smoothing, opts.lse_square_scale, opts.softcap, reduction, want_acc, want_pred)
    return loss, z.detach(), acc.detach(), pred
