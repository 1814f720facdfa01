"""An attention's q / k / v LoRA projections and the rotary embedding of q and k as one autograd node (LoRA, Hu et al.
2021; RoFormer, Su et al. 2021): cuBLAS matmuls (:func:`tigon.kernels.lora.stacked_forward` /
:func:`~tigon.kernels.lora.stacked_backward`) and the rope kernel of :mod:`tigon.kernels.rope`.

Forward, for x (M = B T, K), frozen base weights W_q (N_q, K), W_k (N_k, K), W_v (N_v, K) (N_p = H_p D), adapters
A_p (r_p, K), B_p (N_p, r_p), scalings s_p, rotary tables cos / sin (1 or B, T, R)::

    A   = [A_q; A_k; A_v]                  (r_q + r_k + r_v, K)   x read once for the three low-rank inputs
    xa  = x A^T                            (M, r_q + r_k + r_v)   saved
    q_p = x W_p^T (+ b_p);  q_p += s_p xa_p B_p^T                 one (M, N_p) buffer each (addmm_)
    q, k = rope(q, k) in place             one launch over q's and k's rows, fp32 math
    return the (B, H_p, T, D) views of the three (B, T, H_p D) buffers (HF's ``view(hidden_shape).transpose(1, 2)``)

Backward, for dq, dk (rotated), dv in any strides::

    dq_p, dk_p = rope^T(dq, dk)            one launch, written into new (M, N_q), (M, N_k) buffers
    dxb = [dq_p (s_q B_q), dk_p (s_k B_k), dv (s_v B_v)];  dA = dxb^T x (one matmul, split)
    dB_p = dy_p^T (s_p xa_p)
    dx  = dq_p W_q;  dx += dk_p W_k;  dx += dv W_v;  dx += dxb A  one (M, K) buffer (addmm_)

Saved for the backward: x (in the compute dtype), the (M, r_q + r_k + r_v) xa, the stacked A (sum r, K), the tables
and the parameters (by reference); not q, k or v. Against the same attention under Tigon's per-layer fusion (q_proj,
k_proj, v_proj as three ``lora_linear`` nodes, then the ``rope`` node), per attention and step:

- **the low-rank inputs**: one (M, sum r) matmul reading x once instead of three reading it three times, each way
  (``x A^T`` forward, ``dxb^T x`` backward);
- **saved**: the same x and r-wide products, except under autocast over fp32 hidden states, where each
  ``lora_linear`` keeps its own compute-dtype copy of x: one (M, K) copy here instead of three;
- **the rotation** writes over the projections' own buffers instead of into new (M, N_q + N_k) ones (one such
  allocation less in the forward), and its transpose writes straight into the (M, N_p) layout the matmuls read;
- **dx**: one (M, K) buffer that every matmul accumulates into, instead of three (M, K) gradients that autograd adds
  (two adds: 6 M K element reads and writes less, two (M, K) buffers less at the backward's peak).

The base matmuls are the same three (the frozen W_q, W_k, W_v are not concatenated: that copies 3 weights every call
or keeps a copy). Base weights that require grad get ``dW_p = dy_p^T x`` (PEFT freezes them: no matmul then).

The matmuls run in the compute dtype ``cd`` (x's dtype, or the autocast dtype under autocast, as ``F.linear``);
the rotation in fp32 registers; gradients come back in each input's own dtype.
"""

from __future__ import annotations

import torch

from .first_order import once_differentiable
from .lora import in_dtypes, stacked_backward, stacked_forward
from .rope import rope_apply

N_TENSORS = 15
"""The tensor inputs of :class:`LoRAQKVRoPEFunction`: x, cos, sin, the 9 weights and adapters, the 3 biases."""


def _heads(y: torch.Tensor, batch: int, seq: int, head_dim: int) -> torch.Tensor:
    """The (B, H, T, D) view of a (B T, H D) projection buffer (HF's ``view(hidden_shape).transpose(1, 2)``; the
    sizes given, so an empty batch or sequence has its heads too)."""
    return y.view(batch, seq, y.shape[1] // head_dim, head_dim).transpose(1, 2)


class LoRAQKVRoPEFunction(torch.autograd.Function):
    """autograd node; ``apply(x, cos, sin, q_weight, q_a, q_b, k_weight, k_a, k_b, v_weight, v_a, v_b, q_bias,
    k_bias, v_bias, s_q, s_k, s_v, head_dim, cd)`` with x (B, T, K) and cos / sin (1 or B, T, R): (q, k, v) as
    (B, H_p, T, D) views, in ``cd``. cos and sin receive no gradient. See the module docstring."""

    @staticmethod
    def forward(ctx, x, cos, sin, q_weight, q_a, q_b, k_weight, k_a, k_b, v_weight, v_a, v_b, q_bias, k_bias,
                v_bias, s_q, s_k, s_v, head_dim, cd):
        batch, seq = x.shape[:2]
        x2 = x.reshape(-1, x.shape[-1]).to(cd)
        ys, xa, a_cat = stacked_forward(x2, ((q_weight, q_a, q_b, q_bias, s_q), (k_weight, k_a, k_b, k_bias, s_k),
                                             (v_weight, v_a, v_b, v_bias, s_v)), cd)
        q, k, v = (_heads(y, batch, seq, head_dim) for y in ys)
        rope_apply(q, k, cos, sin, 1, backward=False, inplace=True)
        ctx.save_for_backward(x2, xa, a_cat, cos, sin, q_weight, q_b, k_weight, k_b, v_weight, v_b)
        ctx.scalings, ctx.head_dim, ctx.cd, ctx.x_shape, ctx.x_dtype = (s_q, s_k, s_v), head_dim, cd, x.shape, x.dtype
        ctx.dtypes = tuple(t.dtype if t is not None else None
                           for t in (q_weight, q_a, q_b, k_weight, k_a, k_b, v_weight, v_a, v_b, q_bias, k_bias,
                                     v_bias))
        return q, k, v

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dq, dk, dv):
        x2, xa, a_cat, cos, sin, q_weight, q_b, k_weight, k_b, v_weight, v_b = ctx.saved_tensors
        need = ctx.needs_input_grad[:N_TENSORS]
        g = [None] * N_TENSORS
        (batch, seq), cd, m = ctx.x_shape[:2], ctx.cd, x2.shape[0]
        if not any(need[i] for i in (0, *range(3, N_TENSORS))):
            return (*g, None, None, None, None, None)
        with torch.autocast(x2.device.type, enabled=False):
            dyq = torch.empty((m, q_weight.shape[0]), dtype=cd, device=x2.device)
            dyk = torch.empty((m, k_weight.shape[0]), dtype=cd, device=x2.device)
            rope_apply(dq, dk, cos, sin, 1, backward=True,
                       out=(_heads(dyq, batch, seq, ctx.head_dim), _heads(dyk, batch, seq, ctx.head_dim)))
            dyv = dv.transpose(1, 2).reshape(m, v_weight.shape[0]).to(cd)
            # per projection p: (W_p, A_p, B_p, b_p) at input indices (3 + 3p, 4 + 3p, 5 + 3p, 12 + p)
            flags = tuple((need[3 + 3 * p], need[4 + 3 * p], need[5 + 3 * p], need[12 + p]) for p in range(3))
            dx, grads = stacked_backward((dyq, dyk, dyv), x2, xa, a_cat, (q_weight, k_weight, v_weight),
                                         (q_b, k_b, v_b), ctx.scalings, cd, need[0], flags)
        for p, (dw, da, db, dbias) in enumerate(grads):
            g[3 + 3 * p], g[4 + 3 * p], g[5 + 3 * p], g[12 + p] = dw, da, db, dbias
        if dx is not None:
            g[0] = dx.view(ctx.x_shape).to(ctx.x_dtype)
        return (*in_dtypes(g, ctx.dtypes, 3), None, None, None, None, None)
