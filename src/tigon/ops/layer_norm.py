"""LayerNorm autograd op (Ba, Kiros & Hinton 2016; torch.nn.functional.layer_norm semantics).

The kernels are shared with RMSNorm in :mod:`tigon.ops.norm`: mean and (biased) variance in fp32 from the row
held in registers; a persistent-grid backward with per-program fp32 dW/dB partials and a second small reduction
(no atomics). weight and bias are optional. Minimal bytes (bf16): forward 2*M*N*2, backward 3*M*N*2.

:func:`layer_norm_forward` and :func:`layer_norm_backward` are the two kernel entry points;
:class:`LayerNormFunction` (eager) and the ``tigon::layer_norm`` custom ops of :mod:`tigon.ops._library`
(torch.compile) both call them.
"""

from __future__ import annotations

import torch

from ._common import as_rows
from .norm import norm_backward, norm_forward


def layer_norm_forward(x: torch.Tensor, weight, bias, eps: float):
    """Normalise x (..., N) (any strides); weight, bias (N,) or None.

    Returns (y: x's shape and dtype, contiguous; x2: the (M, N) rows of x with unit column stride, a view of x
    where possible; mean, rstd: (M,) fp32).
    """
    x2 = as_rows(x, "x")
    y, mean, rstd = norm_forward(x2, weight, bias, eps, is_rms=False)
    return y.view(x.shape), x2, mean, rstd


def layer_norm_backward(dy, x, weight, bias_dtype: torch.dtype | None, mean, rstd, need_dw: bool, need_db: bool):
    """Gradients for dy and x (..., N) (any strides; x as given to, or x2 as returned by, the forward).

    Returns (dx: x's shape and dtype, contiguous; dw: (N,) in weight's dtype or None; db: (N,) in
    ``bias_dtype`` or None). dw needs ``need_dw`` and a weight, db ``need_db`` and a ``bias_dtype``.
    """
    need_dw = weight is not None and need_dw
    need_db = bias_dtype is not None and need_db
    dx, dw, db = norm_backward(dy, as_rows(x, "x"), weight, mean, rstd, need_dw, need_db, is_rms=False)
    return (dx.view(x.shape), dw.to(weight.dtype) if dw is not None else None,
            db.to(bias_dtype) if db is not None else None)


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
    @torch.autograd.function.once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layer_norm_backward(dy, x2, weight, ctx.bias_dtype, mean, rstd, ctx.needs_input_grad[1],
                                         ctx.needs_input_grad[2])
        return dx.view(ctx.x_shape), dw, db, None
