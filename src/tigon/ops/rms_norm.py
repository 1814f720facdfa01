"""RMSNorm autograd op (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm semantics).

The kernels are shared with LayerNorm in :mod:`tigon.ops.norm` (constexpr IS_RMS): one forward pass over the
rows, a persistent-grid backward with per-program fp32 dW partials and a second small reduction (no atomics).
Minimal bytes (bf16): forward 2*M*N*2, backward 3*M*N*2.

:func:`rms_norm_forward` and :func:`rms_norm_backward` are the two kernel entry points; :class:`RMSNormFunction`
(eager) and the ``tigon::rms_norm`` custom ops of :mod:`tigon.ops._library` (torch.compile) both call them.
"""

from __future__ import annotations

import torch

from ._common import as_rows
from .norm import norm_backward, norm_forward


def output_dtype(x_dtype: torch.dtype, w_dtype: torch.dtype, casting_mode: str) -> torch.dtype:
    """The dtype of y: x's for ``"gemma"``, else the promotion of x's and weight's dtypes."""
    return x_dtype if casting_mode == "gemma" else torch.promote_types(x_dtype, w_dtype)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float, casting_mode: str):
    """Normalise x (..., N) (any strides) with weight (N,).

    Returns (y: x's shape, contiguous, :func:`output_dtype`; x2: the (M, N) rows of x with unit column stride, a
    view of x where possible; rstd: (M,) fp32).
    """
    x2 = as_rows(x, "x")
    y, _, rstd = norm_forward(x2, weight, None, eps, is_rms=True, offset=offset,
                              round_xhat=casting_mode == "llama",
                              out_dtype=output_dtype(x2.dtype, weight.dtype, casting_mode))
    return y.view(*x.shape[:-1], y.shape[-1]), x2, rstd


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor, offset: float,
                      need_dw: bool):
    """Gradients for dy and x (..., N) (any strides; x as given to, or x2 as returned by, the forward).

    Returns (dx: x's shape and dtype, contiguous; dw: (N,) in weight's dtype, or None unless ``need_dw``).
    """
    dx, dw, _ = norm_backward(dy, as_rows(x, "x"), weight, None, rstd, need_dw, False, is_rms=True, offset=offset)
    return dx.view(x.shape), (dw.to(weight.dtype) if need_dw else None)


class RMSNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, weight, eps, offset, casting_mode)`` with x (..., N), weight (N,).

    casting_mode ``"llama"`` rounds the normalised value to x's dtype before the weight multiply and returns the
    promotion of x's and weight's dtypes; ``"gemma"`` returns x's dtype; ``"none"`` the promotion. Statistics and
    gradients are computed in fp32 in every mode.
    """

    @staticmethod
    def forward(ctx, x, weight, eps, offset, casting_mode):
        y, x2, rstd = rms_norm_forward(x, weight, eps, offset, casting_mode)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.offset = offset
        ctx.x_shape = x.shape
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw = rms_norm_backward(dy, x2, weight, rstd, ctx.offset, ctx.needs_input_grad[1])
        return dx.view(ctx.x_shape), dw, None, None, None
