"""Tigon's kernels as ``torch.library`` custom ops, so that ``torch.compile`` sees each one as a single graph node.

Why: left to itself, dynamo traces into an op's Python launcher (block-size heuristics, dict caches, storage
pointer checks, ``torch.mm(..., out=)`` into preallocated buffers), where it hits code it cannot capture and splits
the model's graph (a graph break: the compiled region ends, Python runs the op, a new region starts, and the
optimiser never sees across it); under ``TRITON_INTERPRET=1`` it traced into the Triton interpreter itself and
compilation failed outright (a KeyError on uint64 fake tensors in the interpreter's pointer arithmetic). A
custom op is opaque instead: dynamo and AOTAutograd only run its *fake* implementation (shapes, dtypes and
strides, no data) while tracing, inductor calls the real implementation as an extern kernel, and the backward is
another custom op wired in with ``register_autograd``. One kernel path stays one kernel path: every op here calls
the same launcher functions as the eager ``torch.autograd.Function`` in its op module (``rms_norm_forward``,
``rope_apply``, ``glu_forward``, ``flce_forward`` ...); nothing about blocks, dtypes or chunking is repeated.

Calling convention. :mod:`tigon.functional` calls the Python functions at the bottom of this module
(:func:`rms_norm`, :func:`rope`, :func:`glu`, :func:`layer_norm`, :func:`cross_entropy`,
:func:`fused_linear_cross_entropy`) only while ``torch.compiler.is_compiling()``; each takes exactly the arguments
of the corresponding ``XFunction.apply``, so the switch is one line per op. Eager calls keep the direct
autograd.Function: the custom-op dispatcher costs about 35 us per forward call and 75 us per forward + backward on
a 2-core CPU host (measured against 9 / 78 us for the autograd.Function with the same empty body), 130+ calls per
Llama training step, which would be pure overhead outside a compiled graph.

Schema conventions (custom ops return tensors, never None, and outputs never alias inputs):

* an output that is not computed (a gradient not needed, a z-loss not requested) is an empty ``(0,)`` tensor;
* loss options travel as scalars (``ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale``),
  ``num_items_in_batch`` as an optional 0-d tensor;
* ``inplace_backward`` of swiglu/geglu/cross_entropy is ignored under compile (a custom op may not return its
  input's memory as a gradient; inductor plans the backward's buffers itself); the results are the same.
* A second backward through a compiled graph is not detected as it is in eager mode (mean/sum fused linear
  cross-entropy forms its gradients in the forward; retain_graph then scales the same saved gradients again,
  which is correct, not an error).
"""

import math
from typing import Optional

import torch
from torch import Tensor

from .cross_entropy import (
    LossOptions, ce_backward, ce_forward, class_weight_args, reduce_losses,
)
from .fused_linear_cross_entropy import flce_backward_rows, flce_forward, grad_buffers, grads_in_forward, scale_grads
from .glu import glu_backward, glu_forward
from .layer_norm import layer_norm_backward, layer_norm_forward
from .rms_norm import output_dtype, rms_norm_backward, rms_norm_forward
from .rope import rope_apply


# Inductor hands a custom op exactly the input strides it was traced with (torch 2.13's default for custom ops,
# stated here for releases with another default), so outputs whose strides follow the inputs' (rope's empty_like)
# get the strides the fake implementation gave them.
_TAGS = tuple(t for t in (getattr(torch.Tag, "needs_exact_strides", None),) if t is not None)


def _if_wanted(t: Tensor, wanted: bool) -> Optional[Tensor]:
    """A gradient output of a backward op for autograd: None where it was not computed (a (0,) placeholder)."""
    return t if wanted else None


def _or_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    """``t``, or the (0,) placeholder of an output that was not computed (custom ops cannot return None)."""
    return t if t is not None else like.new_empty((0,))


def _options(ignore_index: int, label_smoothing: float, lse_square_scale: float, softcap: Optional[float],
             logit_scale: float) -> LossOptions:
    """The LossOptions of a cross-entropy launch from the scalars the op schemas carry."""
    return LossOptions(ignore_index=ignore_index, label_smoothing=label_smoothing, lse_square_scale=lse_square_scale,
                       softcap=softcap, logit_scale=logit_scale)


def _rows(x: Tensor) -> int:
    """M of the (M, N) row view of x (..., N); symbolic-shape friendly."""
    return math.prod(x.shape[:-1])


# ---------------------------------------------------------------------------------------------------- RMSNorm
@torch.library.custom_op("tigon::rms_norm", mutates_args=(), tags=_TAGS)
def _rms_norm(x: Tensor, weight: Tensor, eps: float, offset: float, casting_mode: str) -> tuple[Tensor, Tensor]:
    """(y: x's shape, contiguous, :func:`~tigon.ops.rms_norm.output_dtype`; rstd: (M,) fp32)."""
    y, _, rstd = rms_norm_forward(x, weight, eps, offset, casting_mode)
    return y, rstd


@_rms_norm.register_fake
def _(x, weight, eps, offset, casting_mode):
    return (x.new_empty(x.shape, dtype=output_dtype(x.dtype, weight.dtype, casting_mode)),
            x.new_empty((_rows(x),), dtype=torch.float32))


@torch.library.custom_op("tigon::rms_norm_backward", mutates_args=(), tags=_TAGS)
def _rms_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, offset: float,
                       need_dw: bool) -> tuple[Tensor, Tensor]:
    """(dx: x's shape and dtype, contiguous; dw: (N,) in weight's dtype, or (0,) unless ``need_dw``)."""
    dx, dw = rms_norm_backward(dy, x, weight, rstd, offset, need_dw)
    return dx, _or_empty(dw, weight)


@_rms_norm_backward.register_fake
def _(dy, x, weight, rstd, offset, need_dw):
    return x.new_empty(x.shape), weight.new_empty(weight.shape if need_dw else (0,))


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _eps, offset, _mode = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.offset = offset


def _rms_norm_grad(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1]
    dx, dw = _rms_norm_backward(dy, x, weight, rstd, ctx.offset, need_dw)
    return dx, _if_wanted(dw, need_dw), None, None, None


_rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


# -------------------------------------------------------------------------------------------------- LayerNorm
@torch.library.custom_op("tigon::layer_norm", mutates_args=(), tags=_TAGS)
def _layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y: x's shape and dtype, contiguous; mean, rstd: (M,) fp32)."""
    y, _, mean, rstd = layer_norm_forward(x, weight, bias, eps)
    return y, mean, rstd


@_layer_norm.register_fake
def _(x, weight, bias, eps):
    stat = x.new_empty((_rows(x),), dtype=torch.float32)
    return x.new_empty(x.shape), stat, torch.empty_like(stat)


@torch.library.custom_op("tigon::layer_norm_backward", mutates_args=(), tags=_TAGS)
def _layer_norm_backward(dy: Tensor, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor,
                         rstd: Tensor, need_dw: bool, need_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype; dw, db: (N,) in the parameter's dtype, or (0,) when not needed or absent).

    ``bias`` is only read for its dtype.
    """
    dx, dw, db = layer_norm_backward(dy, x, weight, bias.dtype if bias is not None else None, mean, rstd,
                                     need_dw, need_db)
    return dx, _or_empty(dw, x), _or_empty(db, x)


@_layer_norm_backward.register_fake
def _(dy, x, weight, bias, mean, rstd, need_dw, need_db):
    dw = weight.new_empty(weight.shape) if need_dw and weight is not None else x.new_empty((0,))
    db = bias.new_empty(bias.shape) if need_db and bias is not None else x.new_empty((0,))
    return x.new_empty(x.shape), dw, db


def _layer_norm_setup(ctx, inputs, output):
    x, weight, bias, _eps = inputs
    ctx.save_for_backward(x, weight, bias, output[1], output[2])


def _layer_norm_grad(ctx, dy, _dmean, _drstd):
    x, weight, bias, mean, rstd = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    need_db = bias is not None and ctx.needs_input_grad[2]
    dx, dw, db = _layer_norm_backward(dy, x, weight, bias, mean, rstd, need_dw, need_db)
    return dx, _if_wanted(dw, need_dw), _if_wanted(db, need_db), None


_layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)


# ------------------------------------------------------------------------------------------------------- RoPE
@torch.library.custom_op("tigon::rope", mutates_args=(), tags=_TAGS)
def _rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, backward: bool, need_q: bool,
          need_k: bool) -> tuple[Tensor, Tensor]:
    """The rotation of q and k (``backward=False``) or its transpose (``backward=True``).

    Returns outputs shaped, typed and (when dense) strided like q and k (``torch.empty_like``); (0,) for an output
    whose ``need_*`` is False. The transpose of the transpose is the rotation, so this op is its own backward.
    """
    qo, ko = rope_apply(q, k, cos, sin, unsqueeze_dim, backward=backward, need_q=need_q, need_k=need_k)
    return _or_empty(qo, q), _or_empty(ko, k)


@_rope.register_fake
def _(q, k, cos, sin, unsqueeze_dim, backward, need_q, need_k):
    return (torch.empty_like(q) if need_q else q.new_empty((0,)),
            torch.empty_like(k) if need_k else k.new_empty((0,)))


def _rope_setup(ctx, inputs, output):
    _q, _k, cos, sin, unsqueeze_dim, backward, _nq, _nk = inputs
    ctx.save_for_backward(cos, sin)
    ctx.unsqueeze_dim, ctx.backward = unsqueeze_dim, backward


def _rope_grad(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    need_q, need_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gq, gk = _rope(dq, dk, cos, sin, ctx.unsqueeze_dim, not ctx.backward, need_q, need_k)
    return _if_wanted(gq, need_q), _if_wanted(gk, need_k), None, None, None, None, None, None


_rope.register_autograd(_rope_grad, setup_context=_rope_setup)


# ----------------------------------------------------------------------------------------------- SwiGLU/GeGLU
@torch.library.custom_op("tigon::glu", mutates_args=(), tags=_TAGS)
def _glu(gate: Tensor, up: Tensor, activation: str) -> Tensor:
    """``act(gate) * up``: gate's shape and dtype, contiguous (activation in ``tigon.ops.glu.ACTIVATIONS``)."""
    return glu_forward(gate, up, activation)


@_glu.register_fake
def _(gate, up, activation):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("tigon::glu_backward", mutates_args=(), tags=_TAGS)
def _glu_backward(dy: Tensor, gate: Tensor, up: Tensor, activation: str) -> tuple[Tensor, Tensor]:
    """(d_gate, d_up): new contiguous tensors shaped like gate, in its dtype."""
    return glu_backward(dy, gate, up, activation, False)


@_glu_backward.register_fake
def _(dy, gate, up, activation):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _glu_setup(ctx, inputs, output):
    gate, up, activation = inputs
    ctx.save_for_backward(gate, up)
    ctx.activation = activation


def _glu_grad(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = _glu_backward(dy, gate, up, ctx.activation)
    return dgate, dup, None


_glu.register_autograd(_glu_grad, setup_context=_glu_setup)


# -------------------------------------------------------------------------------------------- cross-entropy
@torch.library.custom_op("tigon::cross_entropy", mutates_args=(), tags=_TAGS)
def _cross_entropy(logits: Tensor, target: Tensor, class_weight: Optional[Tensor], num_items: Optional[Tensor],
                   ignore_index: int, label_smoothing: float, lse_square_scale: float, softcap: Optional[float],
                   reduction: str, want_acc: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, accuracy, lse): loss and z_loss fp32, 0-d (or (N,) for ``reduction="none"``); accuracy
    0-d fp32 (0 unless ``want_acc``); lse (N,) fp32, kept for the backward."""
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    target = target.contiguous()
    cw, cw_sum = class_weight_args(class_weight, x.device)
    opts = _options(ignore_index, label_smoothing, lse_square_scale, softcap, 1.0)
    loss, z, acc, lse, _ = ce_forward(x, target, cw, cw_sum, opts, reduction, num_items, want_acc)
    return loss, z, acc, lse


@_cross_entropy.register_fake
def _(logits, target, class_weight, num_items, ignore_index, label_smoothing, lse_square_scale, softcap,
      reduction, want_acc):
    n = logits.shape[0]
    loss_shape = (n,) if reduction == "none" else ()
    f32 = dict(dtype=torch.float32)
    return (logits.new_empty(loss_shape, **f32), logits.new_empty(loss_shape, **f32), logits.new_empty((), **f32),
            logits.new_empty((n,), **f32))


@torch.library.custom_op("tigon::cross_entropy_backward", mutates_args=(), tags=_TAGS)
def _cross_entropy_backward(grad_loss: Tensor, logits: Tensor, target: Tensor, class_weight: Optional[Tensor],
                            num_items: Optional[Tensor], lse: Tensor, ignore_index: int, label_smoothing: float,
                            lse_square_scale: float, softcap: Optional[float], reduction: str) -> Tensor:
    """d loss / d logits: logits' shape and dtype, contiguous."""
    x = logits if logits.stride(-1) == 1 else logits.contiguous()
    target = target.contiguous()
    cw, cw_sum = class_weight_args(class_weight, x.device)
    *_, scale = reduce_losses(target, cw, ignore_index, x.shape[1], reduction, num_items)
    return ce_backward(grad_loss, x, target, cw, cw_sum, lse, scale,
                       _options(ignore_index, label_smoothing, lse_square_scale, softcap, 1.0),
                       torch.empty(x.shape, dtype=x.dtype, device=x.device))


@_cross_entropy_backward.register_fake
def _(grad_loss, logits, target, class_weight, num_items, lse, ignore_index, label_smoothing, lse_square_scale,
      softcap, reduction):
    return logits.new_empty(logits.shape)


def _cross_entropy_setup(ctx, inputs, output):
    logits, target, class_weight, num_items, *scalars, _want_acc = inputs
    ctx.save_for_backward(logits, target, class_weight, num_items, output[3])
    ctx.scalars = scalars  # ignore_index, label_smoothing, lse_square_scale, softcap, reduction


def _cross_entropy_grad(ctx, grad_loss, _dz, _dacc, _dlse):
    if not ctx.needs_input_grad[0]:
        return (None,) * 10
    logits, target, class_weight, num_items, lse = ctx.saved_tensors
    dx = _cross_entropy_backward(grad_loss, logits, target, class_weight, num_items, lse, *ctx.scalars)
    return (dx,) + (None,) * 9


_cross_entropy.register_autograd(_cross_entropy_grad, setup_context=_cross_entropy_setup)


# ----------------------------------------------------------------------------- fused linear + cross-entropy
@torch.library.custom_op("tigon::fused_linear_cross_entropy", mutates_args=(), tags=_TAGS)
def _flce(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], class_weight: Optional[Tensor],
          num_items: Optional[Tensor], ignore_index: int, label_smoothing: float, lse_square_scale: float,
          softcap: Optional[float], logit_scale: float, reduction: str, cd: torch.dtype, need_hidden: bool,
          need_weight: bool, need_bias: bool, want_acc: bool,
          lean: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, accuracy, lse, grad_hidden, grad_weight, grad_bias).

    loss, z_loss: fp32, 0-d (or (N,) for ``reduction="none"``); accuracy: 0-d fp32 (0 unless ``want_acc``);
    lse: (N,) fp32. For a scalar reduction with a gradient needed, the gradients of the loss for an upstream
    gradient of 1, computed during the forward as in eager mode (the backward only scales and casts them):
    grad_hidden (N, H), grad_weight (V, H), grad_bias (V,), in the dtypes of
    ``tigon.ops.fused_linear_cross_entropy.grad_buffers`` (fp32; ``lean``: the parameters' dtypes where they
    equal ``cd``). Each is (0,) when not computed. They are outputs, not hidden state, so that the compiled graph
    saves them for its backward like any activation.
    """
    opts = _options(ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale)
    need = (need_hidden, need_weight, need_bias)
    loss, z, acc, lse, grads = flce_forward(hidden, weight, target, bias, class_weight, opts, reduction, num_items,
                                            cd, need, want_acc, lean)
    if acc is None:
        acc = torch.zeros((), dtype=torch.float32, device=hidden.device)
    gh, gw, gb = grads if grads is not None else (None, None, None)
    return loss, z, acc, lse, _or_empty(gh, lse), _or_empty(gw, lse), _or_empty(gb, lse)


@_flce.register_fake
def _(hidden, weight, target, bias, class_weight, num_items, ignore_index, label_smoothing, lse_square_scale,
      softcap, logit_scale, reduction, cd, need_hidden, need_weight, need_bias, want_acc, lean):
    n = hidden.shape[0]
    loss_shape = (n,) if reduction == "none" else ()
    f32 = dict(dtype=torch.float32)
    empty = hidden.new_empty((0,), **f32)
    need = (need_hidden, need_weight, need_bias)
    if grads_in_forward(reduction, need):
        # The real allocator on fake tensors: the same shapes and dtypes as the kernel path, by construction.
        grads = [_or_empty(g, empty) for g in grad_buffers(n, hidden, weight, cd, need, lean, True)]
    else:
        grads = [empty, empty.new_empty((0,)), empty.new_empty((0,))]
    return (hidden.new_empty(loss_shape, **f32), hidden.new_empty(loss_shape, **f32), hidden.new_empty((), **f32),
            hidden.new_empty((n,), **f32), *grads)


@torch.library.custom_op("tigon::fused_linear_cross_entropy_backward_rows", mutates_args=(), tags=_TAGS)
def _flce_backward_rows(grad_rows: Tensor, hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor],
                        class_weight: Optional[Tensor], lse: Tensor, ignore_index: int, label_smoothing: float,
                        lse_square_scale: float, softcap: Optional[float], logit_scale: float, cd: torch.dtype,
                        need_hidden: bool, need_weight: bool, need_bias: bool,
                        lean: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Backward of ``reduction="none"`` (the logits are recomputed): (grad_hidden, grad_weight, grad_bias) in
    the inputs' shapes and dtypes, (0,) where not needed."""
    opts = _options(ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale)
    gh, gw, gb = flce_backward_rows(grad_rows, hidden, weight, target.contiguous(), bias, class_weight, lse, opts,
                                    cd, (need_hidden, need_weight, need_bias), lean)
    return _or_empty(gh, lse), _or_empty(gw, lse), _or_empty(gb, lse)


@_flce_backward_rows.register_fake
def _(grad_rows, hidden, weight, target, bias, class_weight, lse, ignore_index, label_smoothing, lse_square_scale,
      softcap, logit_scale, cd, need_hidden, need_weight, need_bias, lean):
    empty = lse.new_empty((0,))
    return (hidden.new_empty(hidden.shape) if need_hidden else empty,
            weight.new_empty(weight.shape) if need_weight else empty.new_empty((0,)),
            bias.new_empty(bias.shape) if need_bias and bias is not None else empty.new_empty((0,)))


def _flce_setup(ctx, inputs, output):
    (hidden, weight, target, bias, class_weight, _num_items, *scalars) = inputs
    ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale, reduction, cd, nh, nw, nb, _acc, lean \
        = scalars
    ctx.need = (nh, nw, nb)
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.scalar = grads_in_forward(reduction, ctx.need)
    if ctx.scalar:
        ctx.save_for_backward(*output[4:])
    else:
        ctx.save_for_backward(hidden, weight, target, bias, class_weight, output[3])
        ctx.scalars = (ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale, cd, nh, nw, nb, lean)


def _flce_grad(ctx, grad_loss, *_unused):
    nones = (None,) * 14
    if not any(ctx.need):
        return (None,) * 4 + nones
    if ctx.scalar:
        saved = [t if wanted else None for t, wanted in zip(ctx.saved_tensors, ctx.need)]
        gh, gw, gb = scale_grads(saved, grad_loss, ctx.dtypes, inplace=False)
    else:
        hidden, weight, target, bias, class_weight, lse = ctx.saved_tensors
        outs = _flce_backward_rows(grad_loss, hidden, weight, target, bias, class_weight, lse, *ctx.scalars)
        gh, gw, gb = (_if_wanted(t, wanted) for t, wanted in zip(outs, ctx.need))
    return (gh, gw, None, gb) + nones


_flce.register_autograd(_flce_grad, setup_context=_flce_setup)


# ------------------------------------------------------------------- entry points used by tigon.functional
# Same arguments as the autograd.Function each replaces under torch.compile (``XFunction.apply``).
def rms_norm(x, weight, eps, offset, casting_mode):
    """``RMSNormFunction.apply`` as the ``tigon::rms_norm`` custom op: y (x's shape)."""
    return _rms_norm(x, weight, eps, offset, casting_mode)[0]


def layer_norm(x, weight, bias, eps):
    """``LayerNormFunction.apply`` as the ``tigon::layer_norm`` custom op: y (x's shape and dtype)."""
    return _layer_norm(x, weight, bias, eps)[0]


def rope(q, k, cos, sin, unsqueeze_dim):
    """``RoPEFunction.apply`` as the ``tigon::rope`` custom op: (q_embed, k_embed)."""
    return _rope(q, k, cos, sin, unsqueeze_dim, False, True, True)


def glu(gate, up, activation, inplace=False):
    """``GLUFunction.apply`` as the ``tigon::glu`` custom op (``inplace`` is ignored, see the module docstring)."""
    return _glu(gate, up, activation)


def _num_items_tensor(num_items, device: torch.device) -> Optional[Tensor]:
    if num_items is None or isinstance(num_items, Tensor):
        return num_items
    return torch.tensor(float(num_items), dtype=torch.float32, device=device)


def cross_entropy(logits, target, class_weight, opts: LossOptions, reduction, num_items, want_acc, inplace=False):
    """``CrossEntropyFunction.apply`` as the ``tigon::cross_entropy`` custom op: (loss, z_loss, accuracy).

    ``inplace`` is ignored (see the module docstring).
    """
    loss, z, acc, _ = _cross_entropy(
        logits, target, class_weight, _num_items_tensor(num_items, logits.device), opts.ignore_index,
        opts.label_smoothing, opts.lse_square_scale, opts.softcap, reduction, want_acc)
    return loss, z.detach(), acc.detach()


def fused_linear_cross_entropy(hidden, weight, target, bias, class_weight, opts: LossOptions, reduction, num_items,
                               cd, need, want_acc, lean=False):
    """``FusedLinearCrossEntropyFunction.apply`` as the ``tigon::fused_linear_cross_entropy`` custom op:
    (loss, z_loss, accuracy)."""
    loss, z, acc, *_ = _flce(
        hidden, weight, target, bias, class_weight, _num_items_tensor(num_items, hidden.device), opts.ignore_index,
        opts.label_smoothing, opts.lse_square_scale, opts.softcap, opts.logit_scale, reduction, cd, need[0],
        need[1], need[2], want_acc, lean)
    return loss, z.detach(), acc.detach()
