"""RMSNorm autograd op (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm semantics).

The kernels are shared with LayerNorm in :mod:`tigon.kernels.norm` (constexpr IS_RMS): one forward pass over the
rows, a persistent-grid backward with per-program fp32 dW partials and a second small reduction (no atomics).
Minimal bytes (bf16): forward 2*M*N*2, backward 3*M*N*2.

:func:`rms_norm_forward` and :func:`rms_norm_backward` are the two kernel entry points, which the ``tigon::rms_norm``
custom ops of this module (below) (torch.compile) call; :class:`RMSNormFunction` (eager) runs their bodies inline (one
Python frame less each, on the hot path of small models) and launches its backward in the launch mode of its forward
(:func:`~tigon.kernels._common.launch_mode`, kept on the ctx: one call less).
"""

from __future__ import annotations


import torch
from torch import Tensor

from ._common import CUSTOM_OP_TAGS, direct_backward, if_wanted, launch_mode, or_empty, rows_of
from .first_order import first_order
from .grad_ownership import MEASURED, owns_grad, prepare
from .norm import norm_backward, norm_forward


def output_dtype(x_dtype: torch.dtype, w_dtype: torch.dtype | None, casting_mode: str) -> torch.dtype:
    """The dtype of y: x's for ``"gemma"`` or without a weight (``w_dtype`` None), else the promotion of x's and
    weight's dtypes."""
    # (no promote_types call, a dispatcher op, when equal)
    if casting_mode == "gemma" or w_dtype is None or x_dtype == w_dtype:
        return x_dtype
    return torch.promote_types(x_dtype, w_dtype)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float, casting_mode: str):
    """Normalise x (..., N) (any strides) with weight (N,), or none (``weight`` None: ``offset`` is unused).

    Returns (y: x's shape, contiguous, :func:`output_dtype`; x2: x as the kernel read it (x itself when contiguous or
    already (M, N) rows with unit column stride, else its (M, N) rows view, a copy for a strided last dimension);
    rstd: (M,) fp32).
    """
    y, _, rstd, _, x2 = norm_forward(x, weight, None, eps, is_rms=True, offset=offset,
                                     round_xhat=casting_mode == "llama",
                                     out_dtype=x.dtype if weight is None or weight.dtype == x.dtype else output_dtype(
                                         x.dtype, weight.dtype, casting_mode))
    return y, x2, rstd


def _dtype(weight: torch.Tensor | None) -> torch.dtype | None:
    return None if weight is None else weight.dtype


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                      offset: float, need_dw: bool, x_shape: tuple[int, ...] | None = None, over_dy: bool = False):
    """Gradients for dy and x (..., N) (any strides; x as given to, or x2 as returned by, the forward).

    ``over_dy``: write dx into dy's memory (dy must then be contiguous and in x's dtype; the kernel reads each
    element of dy before it writes dx there); the caller decides that nothing else reads dy
    (:func:`tigon.kernels.grad_ownership.owns_grad`).

    Returns (dx: ``x_shape`` (default x's shape) and x's dtype, contiguous (dy itself, viewed so, with
    ``over_dy``); dw: (N,) in weight's dtype, or None unless ``need_dw`` (and without a weight)).
    """
    need_dw = need_dw and weight is not None
    dx, dw, _ = norm_backward(dy, x, weight, None, rstd, need_dw, False, is_rms=True, offset=offset, dx_shape=x_shape,
                              dx=dy if over_dy else None, dw_dtype=weight.dtype if need_dw else torch.float32)
    if over_dy and x_shape is not None:
        dx = dx.view(x_shape)
    return dx, dw


@direct_backward  # (the call path of grad_ownership._Probe, which owns_grad compares with)
class RMSNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, weight, eps, offset, casting_mode, in_place=False)`` with x (..., N), weight (N,)
    or None.

    casting_mode ``"llama"`` rounds the normalised value to x's dtype before the weight multiply and returns the
    promotion of x's and weight's dtypes; ``"gemma"`` returns x's dtype; ``"none"`` the promotion. Statistics and
    gradients are computed in fp32 in every mode. ``in_place``: the backward writes dx over its incoming gradient dy
    when it owns dy (:func:`~tigon.kernels.grad_ownership.owns_grad`), else into a new tensor.
    """

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode, in_place=False):
        if in_place and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1]) and x.device.type not in MEASURED:
            prepare(x.device)  # (once per process and device type)
        # (rms_norm_forward, inline: one Python frame less; the launch mode kept for the backward's launches)
        ctx.mode = mode = launch_mode(x.device)
        y, _, rstd, _, x2 = norm_forward(
            x, weight, None, eps, is_rms=True, offset=offset, round_xhat=casting_mode == "llama",
            out_dtype=x.dtype if weight is None or weight.dtype == x.dtype else output_dtype(
                x.dtype, weight.dtype, casting_mode), mode=mode)
        ctx.to_save = (x2, weight, rstd)  # (ctx.save_for_backward(...), inline: all it does; one Python frame less)
        ctx.offset, ctx.in_place = offset, in_place
        ctx.x_shape = x.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(RMSNormFunction.backward, ctx, dy)
        x2, weight, rstd = ctx.saved_tensors
        over_dy = ctx.in_place and owns_grad(dy, x2.dtype)  # dy: no other local name (owns_grad counts references)
        # (rms_norm_backward, inline: one Python frame less)
        need_dw = ctx.needs_input_grad[1] and weight is not None
        dx, dw, _ = norm_backward(dy, x2, weight, None, rstd, need_dw, False, is_rms=True, offset=ctx.offset,
                                  dx_shape=ctx.x_shape, dx=dy if over_dy else None,
                                  dw_dtype=weight.dtype if need_dw else torch.float32, mode=ctx.mode)
        if over_dy:
            dx = dx.view(ctx.x_shape)
        return dx, dw, None, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels). ``in_place``
# is not taken here (a custom op may not return its input's memory); Inductor plans the backward's buffers itself.
@torch.library.custom_op("tigon::rms_norm", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _rms_norm(x: Tensor, weight: Tensor | None, eps: float, offset: float, casting_mode: str) -> tuple[Tensor, Tensor]:
    """(y: x's shape, contiguous, :func:`~tigon.kernels.rms_norm.output_dtype`; rstd: (M,) fp32)."""
    y, _, rstd = rms_norm_forward(x, weight, eps, offset, casting_mode)
    return y, rstd


@_rms_norm.register_fake
def _(x, weight, eps, offset, casting_mode):
    return (x.new_empty(x.shape, dtype=output_dtype(x.dtype, _dtype(weight), casting_mode)),
            x.new_empty((rows_of(x),), dtype=torch.float32))


@torch.library.custom_op("tigon::rms_norm_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _rms_norm_backward(dy: Tensor, x: Tensor, weight: Tensor | None, rstd: Tensor, offset: float,
                       need_dw: bool) -> tuple[Tensor, Tensor]:
    """(dx: x's shape and dtype, contiguous; dw: (N,) in weight's dtype, or (0,) unless ``need_dw`` and a weight)."""
    dx, dw = rms_norm_backward(dy, x, weight, rstd, offset, need_dw)
    return dx, or_empty(dw, x if weight is None else weight)


@_rms_norm_backward.register_fake
def _(dy, x, weight, rstd, offset, need_dw):
    if weight is None:
        return x.new_empty(x.shape), x.new_empty((0,))
    return x.new_empty(x.shape), weight.new_empty(weight.shape if need_dw else (0,))


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _eps, offset, _mode = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.offset = offset


def _rms_norm_grad(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[1] and weight is not None
    dx, dw = _rms_norm_backward(dy, x, weight, rstd, ctx.offset, need_dw)
    return dx, if_wanted(dw, need_dw), None, None, None


_rms_norm.register_autograd(_rms_norm_grad, setup_context=_rms_norm_setup)


def compiled_rms_norm(x, weight, eps, offset, casting_mode, in_place=False):
    """``RMSNormFunction.apply`` as the ``tigon::rms_norm`` custom op: y (x's shape); ``in_place`` is not taken."""
    return _rms_norm(x, weight, eps, offset, casting_mode)[0]
