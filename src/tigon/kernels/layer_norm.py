"""LayerNorm autograd op (Ba, Kiros & Hinton 2016; torch.nn.functional.layer_norm semantics).

The kernels are shared with RMSNorm in :mod:`tigon.kernels.norm`: mean and (biased) variance in fp32 from the row
held in registers; a persistent-grid backward with per-program fp32 dW/dB partials and a second small reduction
(no atomics). weight and bias are optional. Minimal bytes (bf16): forward 2*M*N*2, backward 3*M*N*2.

:func:`layer_norm_forward` and :func:`layer_norm_backward` are the two kernel entry points;
:class:`LayerNormFunction` (eager) and the ``tigon::layer_norm`` custom ops of this module (below)
(torch.compile) both call them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._common import CUSTOM_OP_TAGS, if_wanted, or_empty, rows_of
from .first_order import once_differentiable
from .norm import norm_backward, norm_forward


def layer_norm_forward(x: torch.Tensor, weight, bias, eps: float):
    """Normalise x (..., N) (any strides); weight, bias (N,) or None.

    Returns (y: x's shape and dtype, contiguous; x2: x as the kernel read it (x itself when contiguous or already
    (M, N) rows with unit column stride, else its (M, N) rows view, a copy for a strided last dimension); mean, rstd:
    (M,) fp32).
    """
    y, mean, rstd, _, x2 = norm_forward(x, weight, bias, eps, is_rms=False)
    return y, x2, mean, rstd


def layer_norm_backward(dy, x, weight, bias_dtype: torch.dtype | None, mean, rstd, need_dw: bool, need_db: bool,
                        x_shape: tuple[int, ...] | None = None):
    """Gradients for dy and x (..., N) (any strides; x as given to, or x2 as returned by, the forward).

    Returns (dx: ``x_shape`` (default x's shape) and x's dtype, contiguous; dw: (N,) in weight's dtype or None; db:
    (N,) in ``bias_dtype`` or None). dw needs ``need_dw`` and a weight, db ``need_db`` and a ``bias_dtype``.
    """
    need_dw = weight is not None and need_dw
    need_db = bias_dtype is not None and need_db
    return norm_backward(dy, x, weight, mean, rstd, need_dw, need_db, is_rms=False, dx_shape=x_shape,
                         dw_dtype=weight.dtype if need_dw else torch.float32,
                         db_dtype=bias_dtype if need_db else torch.float32)


class LayerNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, weight, bias, eps)`` with x (..., N), weight and bias (N,) or None.

    Output in x's dtype; dW / dB in the parameters' dtypes.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, x2, mean, rstd = layer_norm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.x_shape = x.shape
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy, x2, weight, ctx.bias_dtype, mean, rstd, ctx.needs_input_grad[1],
                                         ctx.needs_input_grad[2], ctx.x_shape)
        return dx, dw, db, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::layer_norm", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(y: x's shape and dtype, contiguous; mean, rstd: (M,) fp32)."""
    y, _, mean, rstd = layer_norm_forward(x, weight, bias, eps)
    return y, mean, rstd


@_layer_norm.register_fake
def _(x, weight, bias, eps):
    stat = x.new_empty((rows_of(x),), dtype=torch.float32)
    return x.new_empty(x.shape), stat, torch.empty_like(stat)


@torch.library.custom_op("tigon::layer_norm_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _layer_norm_backward(dy: Tensor, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], mean: Tensor,
                         rstd: Tensor, need_dw: bool, need_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype; dw, db: (N,) in the parameter's dtype, or (0,) when not needed or absent).

    ``bias`` is only read for its dtype.
    """
    dx, dw, db = layer_norm_backward(dy, x, weight, bias.dtype if bias is not None else None, mean, rstd,
                                     need_dw, need_db)
    return dx, or_empty(dw, x), or_empty(db, x)


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
    return dx, if_wanted(dw, need_dw), if_wanted(db, need_db), None


_layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)


def compiled_layer_norm(x, weight, bias, eps):
    """``LayerNormFunction.apply`` as the ``tigon::layer_norm`` custom op: y (x's shape and dtype)."""
    return _layer_norm(x, weight, bias, eps)[0]
