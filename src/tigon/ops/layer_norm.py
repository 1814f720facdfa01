"""LayerNorm autograd op (Ba, Kiros & Hinton 2016; torch.nn.functional.layer_norm semantics).

The kernels are shared with RMSNorm in :mod:`tigon.ops.norm`: mean and (biased) variance in fp32 from the row
held in registers; a persistent-grid backward with per-program fp32 dW/dB partials and a second small reduction
(no atomics). weight and bias are optional. Minimal bytes (bf16): forward 2*M*N*2, backward 3*M*N*2.
"""

from __future__ import annotations

import torch

from ._common import as_rows
from .norm import norm_backward, norm_forward


class LayerNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, weight, bias, eps)`` with x (..., N), weight and bias (N,) or None.

    Output in x's dtype; dW / dB in the parameters' dtypes.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        shape = x.shape
        x2 = as_rows(x, "x")
        y, mean, rstd = norm_forward(x2, weight, bias, eps, is_rms=False)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.x_shape = shape
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y.view(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        need_dw = weight is not None and ctx.needs_input_grad[1]
        need_db = ctx.bias_dtype is not None and ctx.needs_input_grad[2]
        dx, dw, db = norm_backward(dy, x2, weight, mean, rstd, need_dw, need_db, is_rms=False)
        dw = dw.to(weight.dtype) if dw is not None else None
        db = db.to(ctx.bias_dtype) if db is not None else None
        return dx.view(ctx.x_shape), dw, db, None
