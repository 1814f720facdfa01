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

from .first_order import once_differentiable


def linear(x2: torch.Tensor, weight: torch.Tensor, bias, cd: torch.dtype) -> torch.Tensor:
    """``x2 W^T (+ b)`` (M, N) in ``cd``: the base projection, one matmul (``addmm`` with a bias)."""
    w_t = weight.to(cd).t()
    return torch.mm(x2, w_t) if bias is None else torch.addmm(bias.to(cd), x2, w_t)


def lora_forward(x2: torch.Tensor, weight, lora_a, lora_b, bias, scaling: float, cd: torch.dtype):
    """``(y, xa)`` for x2 (M, K) in ``cd``: y (M, N) = x2 W^T + b + s (x2 A^T) B^T, xa (M, r) = x2 A^T."""
    with torch.autocast(x2.device.type, enabled=False):
        xa = torch.mm(x2, lora_a.to(cd).t())
        y = linear(x2, weight, bias, cd)
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


def stacked_forward(x2: torch.Tensor, projections, cd: torch.dtype):
    """Several LoRA projections of one input, ``projections`` a sequence of ``(W, A, B, b, s)``: ``(ys, xa, a_cat)``
    for x2 (M, K) in ``cd``, with ``a_cat = [A_1; A_2; ...]`` (sum r, K) and ``xa = x2 a_cat^T`` (M, sum r), one
    matmul that reads x once for every low-rank path, and each ``y_i = x2 W_i^T + b_i; y_i += s_i xa_i B_i^T``."""
    with torch.autocast(x2.device.type, enabled=False):
        a_cat = torch.cat([a.to(cd) for _, a, _, _, _ in projections])
        xa = torch.mm(x2, a_cat.t())
        ys, start = [], 0
        for weight, a, b, bias, s in projections:
            y = linear(x2, weight, bias, cd)
            y.addmm_(xa[:, start:start + a.shape[0]], b.to(cd).t(), alpha=s)
            ys.append(y)
            start += a.shape[0]
    return ys, xa, a_cat


def stacked_backward(dys, x2, xa, a_cat, weights, lora_bs, scalings, cd: torch.dtype, need_x: bool, need):
    """The backward of :func:`stacked_forward` for the output gradients ``dys`` (each (M, N_i), in ``cd``):
    ``(dx, grads)`` with ``grads[i] = (dW_i, dA_i, dB_i, db_i)``, None where ``need[i]`` (the same four flags) is
    False, dx None unless ``need_x``.

    ``dxb = [dy_1 (s_1 B_1), dy_2 (s_2 B_2), ...]`` (M, sum r) gives every dA in one matmul, ``dA = dxb^T x2``, and
    dx is one (M, K) buffer: ``dx = dy_1 W_1; dx += dy_i W_i ...; dx += dxb a_cat`` (``addmm_``), not one gradient
    per projection summed afterwards."""
    grads = [[None] * 4 for _ in dys]
    ranks = [b.shape[1] for b in lora_bs]
    dx = None
    with torch.autocast(x2.device.type, enabled=False):
        if need_x or any(n[1] for n in need):
            dxb = torch.cat([torch.mm(dy, b.to(cd) * s) for dy, b, s in zip(dys, lora_bs, scalings)], dim=1)
            if any(n[1] for n in need):
                for g, n, da in zip(grads, need, torch.mm(dxb.t(), x2).split(ranks)):
                    g[1] = da if n[1] else None
        start = 0
        for g, n, dy, r, s in zip(grads, need, dys, ranks, scalings):
            if n[2]:
                g[2] = torch.mm(dy.t(), xa[:, start:start + r] * s)
            if n[0]:
                g[0] = torch.mm(dy.t(), x2)
            if n[3]:
                g[3] = dy.sum(0)
            start += r
        if need_x:
            dx = torch.mm(dys[0], weights[0].to(cd))
            for dy, w in zip(dys[1:], weights[1:]):
                dx.addmm_(dy, w.to(cd))
            dx.addmm_(dxb, a_cat)
    return dx, grads


def in_dtypes(grads: list, dtypes: tuple, start: int) -> list:
    """``grads`` with each tensor from index ``start`` on cast to its parameter's dtype, ``dtypes[i - start]``
    (recorded in the forward; None entries stay None)."""
    for i in range(start, len(grads)):
        if grads[i] is not None:
            grads[i] = grads[i].to(dtypes[i - start])
    return grads


def with_leading_dims(rows: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The (M, N) output ``rows`` of a LoRA node as x's leading dimensions (..., N): the view taken outside the
    autograd node, so that the caller may modify the output in place (a view returned by a custom Function may not
    be)."""
    return rows.view(*x.shape[:-1], rows.shape[-1])


class LoRALinearFunction(torch.autograd.Function):
    """autograd node; ``apply(x, weight, lora_a, lora_b, bias, scaling, cd)`` with x (..., K): y (M, N) rows in ``cd``,
    M the tokens of x (:func:`tigon.functional.lora_linear` gives it x's leading dimensions outside the node: a view
    made inside would forbid in-place ops on the output).
    Saves x (in ``cd``), xa = x A^T and the parameters (by reference); see the module docstring."""

    @staticmethod
    def forward(ctx, x, weight, lora_a, lora_b, bias, scaling, cd):
        x2 = x.reshape(-1, x.shape[-1]).to(cd)
        y, xa = lora_forward(x2, weight, lora_a, lora_b, bias, scaling, cd)
        ctx.save_for_backward(x2, xa, weight, lora_a, lora_b)
        ctx.scaling, ctx.cd, ctx.x_shape, ctx.x_dtype = scaling, cd, x.shape, x.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return y

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
