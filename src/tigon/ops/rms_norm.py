"""RMSNorm autograd op (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm semantics).

The kernels are shared with LayerNorm in :mod:`tigon.ops.norm` (constexpr IS_RMS): one forward pass over the
rows, a persistent-grid backward with per-program fp32 dW partials and a second small reduction (no atomics).
Minimal bytes (bf16): forward 2*M*N*2, backward 3*M*N*2.
"""

from __future__ import annotations

import torch

from ._common import as_rows
from .norm import norm_backward, norm_forward


class RMSNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, weight, eps, offset, casting_mode)`` with x (..., N), weight (N,).

    casting_mode ``"llama"`` rounds the normalised value to x's dtype before the weight multiply and returns the
    promotion of x's and weight's dtypes; ``"gemma"`` returns x's dtype; ``"none"`` the promotion. Statistics and
    gradients are computed in fp32 in every mode.
    """

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode):
        shape = x.shape
        x2 = as_rows(x, "x")
        out_dtype = x2.dtype if casting_mode == "gemma" else torch.promote_types(x2.dtype, weight.dtype)
        y, _, rstd = norm_forward(x2, weight, None, eps, is_rms=True, offset=offset,
                                  round_xhat=casting_mode == "llama", out_dtype=out_dtype)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.offset = offset
        ctx.x_shape = shape
        return y.view(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        need_dw = ctx.needs_input_grad[1]
        dx, dw, _ = norm_backward(dy, x2, weight, None, rstd, need_dw, False, is_rms=True, offset=ctx.offset)
        return dx.view(ctx.x_shape), (dw.to(weight.dtype) if need_dw else None), None, None, None
