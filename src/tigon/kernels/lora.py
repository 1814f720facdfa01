"""A LoRA linear layer's forward and backward as one autograd node (LoRA, Hu et al. 2021): cuBLAS matmuls, no Triton.

Forward, for x (M, K), a frozen base weight W (N, K), adapters A (r, K) and B (N, r), scaling s, r << K, N::

    xa = x A^T                      (M, r)   saved: the only activation besides x
    y  = x W^T (+ b);  y += s xa B^T        one (M, N) buffer, the low-rank product added in place (addmm_)

Backward, for dy (M, N)::

    dyb = dy (s B)                  (M, r)
    dx  = dy W;        dx += dyb A          one (M, K) buffer, accumulated in place (addmm_)
    dA  = dyb^T x                   (r, K)
    dB  = dy^T (s xa)               (N, r)
    dW  = dy^T x                    only when W requires grad (not with PEFT, whose base weights are frozen)

PEFT's ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling`` runs the same matmuls but forms three more (M, N)
tensors in the forward (B's output, its scaled copy, the sum) and in the backward a scaled copy of dy and a second
(M, K) gradient that autograd then adds to the first: two to three extra passes over (M, N) and one over (M, K) per
layer and step, and as many allocations, which this node does not make. What is saved between forward and backward
is the same: x and the small xa (the parameters are saved by reference).

The matmuls run in the compute dtype ``cd`` (x's dtype, or the autocast dtype under autocast, as ``F.linear``);
gradients come back in each input's own dtype.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


def lora_forward(x2: torch.Tensor, weight, lora_a, lora_b, bias, scaling: float, cd: torch.dtype):
    """``(y, xa)`` for x2 (M, K) in ``cd``: y (M, N) = x2 W^T + b + s (x2 A^T) B^T, xa (M, r) = x2 A^T."""
    with torch.autocast(x2.device.type, enabled=False):
        xa = torch.mm(x2, lora_a.to(cd).t())
        w_t = weight.to(cd).t()
        y = torch.mm(x2, w_t) if bias is None else torch.addmm(bias.to(cd), x2, w_t)
        y.addmm_(xa, lora_b.to(cd).t(), alpha=scaling)
    return y, xa


def lora_backward(dy2: torch.Tensor, x2, xa, weight, lora_a, lora_b, scaling: float, cd: torch.dtype,
                  need: tuple[bool, bool, bool, bool, bool]):
    """Gradients ``(dx2, dW, dA, dB, db)`` of :func:`lora_forward` for dy2 (M, N) (None where ``need`` is False),
    in ``cd``; ``need`` = (x, weight, lora_a, lora_b, bias)."""
    need_x, need_w, need_a, need_b, need_bias = need
    dx = dw = da = db = dbias = None
    with torch.autocast(dy2.device.type, enabled=False):
        dy2 = dy2.to(cd)
        if need_x or need_a:
            dyb = torch.mm(dy2, lora_b.to(cd) * scaling)  # (M, r): s dy B, scaled in the small factor
            if need_a:
                da = torch.mm(dyb.t(), x2)
            if need_x:
                dx = torch.mm(dy2, weight.to(cd))
                dx.addmm_(dyb, lora_a.to(cd))
        if need_b:
            db = torch.mm(dy2.t(), xa * scaling)
        if need_w:
            dw = torch.mm(dy2.t(), x2)
        if need_bias:
            dbias = dy2.sum(0)
    return dx, dw, da, db, dbias


class LoRALinearFunction(torch.autograd.Function):
    """autograd node; ``apply(x, weight, lora_a, lora_b, bias, scaling, cd)`` with x (..., K): y (..., N) in ``cd``.
    Saves x (in ``cd``), xa = x A^T and the parameters (by reference); see the module docstring."""

    @staticmethod
    def forward(ctx, x, weight, lora_a, lora_b, bias, scaling, cd):
        x2 = x.reshape(-1, x.shape[-1]).to(cd)
        y, xa = lora_forward(x2, weight, lora_a, lora_b, bias, scaling, cd)
        ctx.save_for_backward(x2, xa, weight, lora_a, lora_b)
        ctx.scaling, ctx.cd, ctx.x_shape, ctx.x_dtype = scaling, cd, x.shape, x.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, xa, weight, lora_a, lora_b = ctx.saved_tensors
        need = tuple(ctx.needs_input_grad[:5])
        dx, dw, da, db, dbias = lora_backward(dy.reshape(-1, dy.shape[-1]), x2, xa, weight, lora_a, lora_b,
                                              ctx.scaling, ctx.cd, need)
        return (dx.view(ctx.x_shape).to(ctx.x_dtype) if dx is not None else None,
                dw.to(weight.dtype) if dw is not None else None,
                da.to(lora_a.dtype) if da is not None else None,
                db.to(lora_b.dtype) if db is not None else None,
                dbias.to(ctx.bias_dtype) if dbias is not None else None,
                None, None)
