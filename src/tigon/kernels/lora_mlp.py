"""A gated MLP whose gate, up and down projections carry LoRA adapters, as one autograd node (LoRA, Hu et al. 2021;
GLU variants, Shazeer 2020): cuBLAS matmuls around Tigon's GLU kernels (:mod:`tigon.kernels.glu`).

Forward, for x (M, H), frozen base weights W_g, W_u (I, H) and W_d (H, I), adapters A_g (r_g, H), B_g (I, r_g),
A_u (r_u, H), B_u (I, r_u), A_d (r_d, I), B_d (H, r_d) and scalings s_g, s_u, s_d::

    A_gu = [A_g; A_u]                    (r_g + r_u, H)   stacked: x is read once for both low-rank inputs
    xa   = x A_gu^T                      (M, r_g + r_u)   saved
    gate = x W_g^T;  gate += s_g xa_g B_g^T               (M, I) saved
    up   = x W_u^T;  up   += s_u xa_u B_u^T               (M, I) saved
    p    = act(gate) * up                (M, I)           Triton, freed at the end of the forward
    pa   = p A_d^T                       (M, r_d)         saved
    out  = p W_d^T;  out  += s_d pa B_d^T                 (M, H)

Backward, for dout (M, H)::

    dpb  = dout (s_d B_d)                (M, r_d);  dB_d = dout^T (s_d pa)
    dp   = dout W_d;  dp += dpb A_d                        (M, I), the backward's one new (M, I) buffer
    d_gate, d_up, p = one Triton pass over dp, gate, up:   d_gate = dp up act'(gate) and d_up = dp act(gate) written
                                         over gate and up (nothing else holds them), p = act(gate) up over dp
    dA_d = dpb^T p
    dxb  = [d_gate (s_g B_g), d_up (s_u B_u)]              (M, r_g + r_u)
    dA_gu = dxb^T x  (one matmul for both A's);  dB_g = d_gate^T (s_g xa_g);  dB_u = d_up^T (s_u xa_u)
    dx   = d_gate W_g;  dx += d_up W_u;  dx += dxb A_gu     (M, H)

Base weights that require grad get ``dW = dy^T input`` (PEFT freezes them: no matmul then).

Against PEFT's three layers under Tigon's per-layer fusion (gate and up as :func:`tigon.functional.lora_linear`,
``swiglu`` / ``geglu``, down as ``lora_linear``), per MLP and step, M tokens, in the compute dtype's element size e:

- **saved for the backward**: x, gate, up, and the r-wide xa and pa: M (H + 2 I + r_g + r_u + r_d) e, against
  M (H + 3 I + r_g + r_u + r_d) e there (the down layer keeps p, its input): M I e less, 112 MiB a layer at
  Llama-3-8B's I = 14336 for 4096 bf16 tokens, 0.875 GiB over 8 layers, 3.5 GiB over 32.
- **passes over (M, I) tensors** (each read or write of one whole tensor; a matmul's output counts one write, an
  in-place ``addmm_`` a read and a write): forward 11 in both (gate and up: a write and an ``addmm_`` each, 6; the
  GLU reads 2, writes 1; the down matmul and ``p A_d^T`` read p, 2). Backward 16 here against 15 there: the same
  dp (a write and an ``addmm_``), GLU pass (3 reads, 2 writes), ``dA_d`` (a read of p) and six reads of d_gate /
  d_up (their B products, B gradients and dx), plus the one write of the recomputed p: a (M, I) write for a
  (M, I) tensor of memory. The autograd nodes: one instead of four, and the two A products of gate and up as
  one matmul each way.
- **not done**: the frozen [W_g; W_u] concatenated into one matmul (it would copy 2 I H weights at every call or
  keep that copy, 448 MiB a Llama-3-8B layer; two matmuls over the same x cost the same FLOPs), and the low-rank
  adds folded into the GLU pass (it would save the four ``addmm_`` passes over gate and up; a Triton dot of
  width r inside the elementwise kernel, left for later).

One fused gate-up projection (HF Phi3MLP, Glm4MLP: ``gate, up = gate_up_proj(x).chunk(2, -1)``), W_gu (2I, H),
A_gu (r, H), B_gu (2I, r), s_gu (:class:`LoRAGateUpMLPFunction`): ``gate_up = x W_gu^T; gate_up += s_gu xa B_gu^T``
is one (M, 2I) buffer (:func:`tigon.kernels.lora.lora_forward`, one base matmul as the model's), the GLU reads its
halves in place, and the backward's GLU pass writes d_gate / d_up over them, so that buffer is d(gate_up) for
:func:`tigon.kernels.lora.lora_backward` (one r-wide product each way, no stacking needed). Against the layers fused
one by one (gate_up_proj as ``lora_linear``, ``swiglu`` on the chunks, down_proj as ``lora_linear``): the same
M I e less saved, and autograd's join of d_gate and d_up into a new (M, 2I) gradient (the chunk's backward: two
(M, I) reads and writes) is not made, for the one write of the recomputed p.

The matmuls run in the compute dtype ``cd`` (x's dtype, or the autocast dtype under autocast, as ``F.linear``);
gradients come back in each input's own dtype.
"""

from __future__ import annotations

import torch

from .first_order import once_differentiable
from .glu import _saved_gate_up, glu_backward, glu_forward
from .lora import in_dtypes, lora_backward, lora_forward, stacked_backward, stacked_forward

N_TENSORS = 13
"""The tensor inputs of :class:`LoRAGLUMLPFunction` (x, the 9 weights and adapters, the 3 biases)."""


def gate_up_forward(x2, gate_weight, gate_a, gate_b, gate_bias, up_weight, up_a, up_b, up_bias, s_g: float,
                    s_u: float, cd: torch.dtype):
    """``(gate, up, xa, a_gu)`` for x2 (M, H) in ``cd``: the two LoRA projections with one stacked A product
    (:func:`tigon.kernels.lora.stacked_forward`)."""
    (gate, up), xa, a_gu = stacked_forward(x2, ((gate_weight, gate_a, gate_b, gate_bias, s_g),
                                                (up_weight, up_a, up_b, up_bias, s_u)), cd)
    return gate, up, xa, a_gu


def down_glu_backward(d2, gate, up, pa, down_weight, down_a, down_b, s_d: float, activation: str, cd: torch.dtype,
                      need_gate_side: bool, need_down: tuple[bool, bool, bool, bool]):
    """The backward of ``out = lora_linear(act(gate) * up, W_d, A_d, B_d, b_d, s_d)`` for d2 (M, H) in ``cd``:
    ``(d_gate, d_up, (dW_d, dA_d, dB_d, db_d))``. With ``need_gate_side`` d_gate and d_up are written over gate and
    up (None otherwise); ``need_down``: which of the down projection's gradients to form (None where not)."""
    need_w, need_a, need_b, need_bias = need_down
    dgate = dup = dw = da = db = dbias = None
    if need_gate_side or need_a:
        dpb = torch.mm(d2, down_b.to(cd) * s_d)
    if need_b:
        db = torch.mm(d2.t(), pa * s_d)
    if need_bias:
        dbias = d2.sum(0)
    need_p = need_w or need_a
    if need_gate_side:
        dp = torch.mm(d2, down_weight.to(cd))
        dp.addmm_(dpb, down_a.to(cd))
        dgate, dup = glu_backward(dp, gate, up, activation, inplace=True, store_product=need_p)
        product = dp
    else:
        product = glu_forward(gate, up, activation) if need_p else None
    if need_a:
        da = torch.mm(dpb.t(), product)
    if need_w:
        dw = torch.mm(d2.t(), product)
    return dgate, dup, (dw, da, db, dbias)


class LoRAGLUMLPFunction(torch.autograd.Function):
    """autograd node; ``apply(x, gate_weight, gate_a, gate_b, up_weight, up_a, up_b, down_weight, down_a, down_b,
    gate_bias, up_bias, down_bias, s_g, s_u, s_d, activation, cd)`` with x (..., H): out (M, H) rows in ``cd``, M
    the tokens of x (:func:`tigon.functional.lora_glu_mlp` gives it x's leading dimensions outside the node: a view
    made inside would forbid in-place ops on the output, Llama 4's ``out.add_`` of its shared expert).

    Saves x (in ``cd``), gate, up, xa, pa, the stacked A_gu and the parameters (by reference); see the module
    docstring. The backward writes d_gate / d_up over the saved gate / up, so a second backward through the same
    graph (``retain_graph=True``) raises."""

    @staticmethod
    def forward(ctx, x, gate_weight, gate_a, gate_b, up_weight, up_a, up_b, down_weight, down_a, down_b,
                gate_bias, up_bias, down_bias, s_g, s_u, s_d, activation, cd):
        x2 = x.reshape(-1, x.shape[-1]).to(cd)
        gate, up, xa, a_gu = gate_up_forward(x2, gate_weight, gate_a, gate_b, gate_bias, up_weight, up_a, up_b,
                                             up_bias, s_g, s_u, cd)
        product = glu_forward(gate, up, activation)
        out, pa = lora_forward(product, down_weight, down_a, down_b, down_bias, s_d, cd)
        ctx.save_for_backward(x2, gate, up, xa, pa, a_gu, gate_weight, gate_b, up_weight, up_b, down_weight,
                              down_a, down_b)
        ctx.scalings, ctx.activation, ctx.cd = (s_g, s_u, s_d), activation, cd
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        ctx.inplace, ctx.consumed = True, False
        ctx.dtypes = tuple(t.dtype if t is not None else None
                           for t in (gate_weight, gate_a, gate_b, up_weight, up_a, up_b, down_weight, down_a, down_b,
                                     gate_bias, up_bias, down_bias))
        return out

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dout):
        need = ctx.needs_input_grad[:N_TENSORS]
        need_gate_side = any(need[i] for i in (0, 1, 2, 3, 4, 5, 6, 10, 11))
        (x2, gate, up, xa, pa, a_gu, gate_weight, gate_b, up_weight, up_b, down_weight, down_a,
         down_b) = _saved_gate_up(ctx, "lora_glu_mlp", need_gate_side)
        s_g, s_u, s_d = ctx.scalings
        cd = ctx.cd
        g = [None] * N_TENSORS
        with torch.autocast(dout.device.type, enabled=False):
            d2 = dout.reshape(-1, dout.shape[-1]).to(cd)
            dgate, dup, (g[7], g[8], g[9], g[12]) = down_glu_backward(
                d2, gate, up, pa, down_weight, down_a, down_b, s_d, ctx.activation, cd, need_gate_side,
                (need[7], need[8], need[9], need[12]))
            # gate and up: one (M, H) dx, one matmul for both A's (stacked_backward)
            if need_gate_side:
                dx, ((g[1], g[2], g[3], g[10]), (g[4], g[5], g[6], g[11])) = stacked_backward(
                    (dgate, dup), x2, xa, a_gu, (gate_weight, up_weight), (gate_b, up_b), (s_g, s_u), cd, need[0],
                    ((need[1], need[2], need[3], need[10]), (need[4], need[5], need[6], need[11])))
                if dx is not None:
                    g[0] = dx.view(ctx.x_shape).to(ctx.x_dtype)
        return (*in_dtypes(g, ctx.dtypes, 1), None, None, None, None, None)


GATE_UP_TENSORS = 9
"""The tensor inputs of :class:`LoRAGateUpMLPFunction` (x, the 6 weights and adapters, the 2 biases)."""


class LoRAGateUpMLPFunction(torch.autograd.Function):
    """autograd node; ``apply(x, gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b, gate_up_bias,
    down_bias, s_gu, s_d, activation, cd)`` with x (..., H): out (M, H) rows in ``cd`` (shaped as x outside the
    node, as :class:`LoRAGLUMLPFunction`'s).

    The one-projection form (see the module docstring): the (M, 2 I) gate-up output is one buffer (a base matmul and
    an ``addmm_``), the GLU reads its halves in place, the backward writes d_gate / d_up over them, so that buffer
    is the gate-up projection's output gradient for :func:`tigon.kernels.lora.lora_backward`. Saves x (in ``cd``),
    gate_up, xa, pa and the parameters (by reference); a second backward through the same graph raises."""

    @staticmethod
    def forward(ctx, x, gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b, gate_up_bias, down_bias,
                s_gu, s_d, activation, cd):
        x2 = x.reshape(-1, x.shape[-1]).to(cd)
        gate_up, xa = lora_forward(x2, gate_up_weight, gate_up_a, gate_up_b, gate_up_bias, s_gu, cd)
        product = glu_forward(*gate_up.chunk(2, dim=1), activation)
        out, pa = lora_forward(product, down_weight, down_a, down_b, down_bias, s_d, cd)
        ctx.save_for_backward(x2, gate_up, xa, pa, gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b)
        ctx.scalings, ctx.activation, ctx.cd, ctx.x_shape, ctx.x_dtype = (s_gu, s_d), activation, cd, x.shape, x.dtype
        ctx.inplace, ctx.consumed = True, False
        ctx.dtypes = tuple(t.dtype if t is not None else None
                           for t in (gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b, gate_up_bias,
                                     down_bias))
        return out

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dout):
        need = ctx.needs_input_grad[:GATE_UP_TENSORS]
        need_gate_side = any(need[i] for i in (0, 1, 2, 3, 7))
        (x2, gate_up, xa, pa, gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a,
         down_b) = _saved_gate_up(ctx, "lora_gate_up_mlp", need_gate_side)
        s_gu, s_d = ctx.scalings
        cd = ctx.cd
        g = [None] * GATE_UP_TENSORS
        with torch.autocast(dout.device.type, enabled=False):
            d2 = dout.reshape(-1, dout.shape[-1]).to(cd)
            gate, up = gate_up.chunk(2, dim=1)
            dgate, dup, (g[4], g[5], g[6], g[8]) = down_glu_backward(
                d2, gate, up, pa, down_weight, down_a, down_b, s_d, ctx.activation, cd, need_gate_side,
                (need[4], need[5], need[6], need[8]))
            if need_gate_side:
                # the GLU wrote d_gate / d_up over the two halves: gate_up's memory is d(gate_up) (a copy otherwise)
                written = dgate.data_ptr() == gate.data_ptr() and dup.data_ptr() == up.data_ptr()
                dgu = gate_up if written else torch.cat([dgate, dup], dim=1)
                del dgate, dup, gate, up
                dx, g[1], g[2], g[3], g[7] = lora_backward(dgu, x2, xa, gate_up_weight, gate_up_a, gate_up_b, s_gu,
                                                           cd, (need[0], need[1], need[2], need[3], need[7]))
                if dx is not None:
                    g[0] = dx.view(ctx.x_shape).to(ctx.x_dtype)
        return (*in_dtypes(g, ctx.dtypes, 1), None, None, None, None)
