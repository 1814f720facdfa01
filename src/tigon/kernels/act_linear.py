"""The non-gated MLP's down projection ``linear(act(h), weight, bias)`` without keeping ``act(h)`` for the backward.

No kernel of its own: the GLU kernels of :mod:`tigon.kernels.glu` run with ``GATED=False`` (u = 1, no up operand),
and the activation codes there include relu2, relu and quick_gelu for this. With ``a = act(h)``:

    forward:   a = act(h)                                  (one pass: read h, write a; a is not saved)
               out = a @ weight.T + bias                   (cuBLAS)
    backward:  dy = dout @ weight                          (cuBLAS)
               dh = dy * act'(h),  dy <- act(h)            (one pass: read dy, h; write dh, and a over dy)
               d_weight = dout.T @ a,  d_bias = sum(dout)  (cuBLAS; a is dy's memory)

Saved between forward and backward: h and the weight. The unfused ``down(act(up(x)))`` saves h (the activation's
input) and a (the down projection's input): one (tokens, I) tensor more per MLP. Minimal bytes of the elementwise
passes (bf16, n = tokens x I elements): forward 2*n*2, backward 4*n*2 (read dy, h; write dh, a), one n*2 write more
than the activation's own backward, the price of not storing a.
"""

from __future__ import annotations

import torch

from ._common import launcher
from .first_order import first_order
from .elementwise import _launch_shape, as_2d, tile_elems
from .glu import _ANY_AUTOCAST, ACTIVATIONS, _autocast_on, _glu_bwd, _glu_fwd, _in

ALPHA = {"quick_gelu": 1.702}
"""The sigmoid slope of the activations written ``g * sigmoid(alpha * g)`` (CLIP's quick_gelu), a kernel scalar."""


def act_forward(h: torch.Tensor, activation: str) -> torch.Tensor:
    """``act(h)``: a new contiguous tensor of h's shape and dtype."""
    out = torch.empty(size=h.shape, dtype=h.dtype, device=h.device)
    if out.numel() == 0:
        return out
    M, N, (h2, o2), (sh, so) = as_2d(h=h, out=out)
    block_m, block_n, warps, grid = _launch_shape(M, N, tile_elems(h.device))  # (launch_shape, inline)
    launcher(_glu_fwd)[grid](h2, h2, o2, M, N, sh, sh, so, 1.0, 1.0, ALPHA.get(activation, 0.0), 0.0,
                             ACTIVATION=ACTIVATIONS[activation], BLOCK_M=block_m, BLOCK_N=block_n, GATED=False,
                             num_warps=warps)
    return out


def act_backward(dy: torch.Tensor, h: torch.Tensor, activation: str, inplace: bool = False,
                 store_product: bool = False) -> torch.Tensor:
    """``dh = dy * act'(h)``, shaped like h and in its dtype: a new contiguous tensor, or with ``inplace`` h itself
    where its row view is its own memory (each element read before it is overwritten, by the same program).
    ``store_product``: also overwrite ``dy`` (a contiguous tensor of h's shape and dtype) with ``act(h)``."""
    if store_product and not (dy.is_contiguous() and dy.shape == h.shape and dy.dtype == h.dtype):
        raise ValueError("store_product needs dy contiguous with h's shape and dtype (act(h) is written there)")
    if h.numel() == 0:
        return h if inplace else torch.empty(size=h.shape, dtype=h.dtype, device=h.device)
    M, N, (dy2, h2), (sdy, sh) = as_2d(grad_output=dy, h=h)
    if inplace and h2.untyped_storage().data_ptr() == h.untyped_storage().data_ptr():
        dh, dh2, sdh = h, h2, sh
    else:  # contiguous (M, N) rows of h's shape (M * N = numel)
        dh = dh2 = torch.empty(size=h.shape, dtype=h.dtype, device=h.device)
        sdh = N
    block_m, block_n, warps, grid = _launch_shape(M, N, tile_elems(h.device))  # (launch_shape, inline)
    launcher(_glu_bwd)[grid](dy2, h2, h2, dh2, dh2, M, N, sdy, sh, sh, sdh, sdh, 1.0, 1.0,
                             ALPHA.get(activation, 0.0), 0.0, ACTIVATION=ACTIVATIONS[activation],
                             STORE_PRODUCT=store_product, BLOCK_M=block_m, BLOCK_N=block_n, GATED=False,
                             num_warps=warps)
    return dh


def _outside_autocast(fn, device: torch.device, *args):
    """``fn(*args)`` with autocast off for ``device`` (its matmuls run in the dtypes they are given), entering an
    ``autocast(enabled=False)`` region only when autocast is on (~5 us of host time)."""
    if _ANY_AUTOCAST() and _autocast_on(device):
        with torch.autocast(device.type, enabled=False):
            return fn(*args)
    return fn(*args)


def _down(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cd: torch.dtype) -> torch.Tensor:
    return torch.nn.functional.linear(_in(a, cd), _in(weight, cd), _in(bias, cd))


def act_linear_forward(h, weight, bias, activation: str, cd: torch.dtype) -> torch.Tensor:
    """``linear(act(h), weight, bias)`` with the matmul in ``cd`` (h's dtype or the autocast dtype)."""
    return _outside_autocast(_down, h.device, act_forward(h, activation), weight, bias, cd)


def _grads(d2, h, weight, activation: str, cd: torch.dtype, need, inplace: bool):
    """(d_h, d_weight) of :func:`act_linear_forward` from ``d2`` = dout as (tokens, H) rows in ``cd`` (None where
    ``need`` is False)."""
    need_h, need_w, _ = need
    if need_h:
        dy = _in(torch.mm(d2, _in(weight, cd)), h.dtype).view(h.shape)
        dh = act_backward(dy, h, activation, inplace, store_product=need_w)
        a = dy  # act(h), written over dy by the pass above
    else:
        dh, a = None, (act_forward(h, activation) if need_w else None)
    if not need_w:
        return dh, None
    return dh, _in(torch.mm(d2.t(), _in(a.reshape(d2.shape[0], h.shape[-1]), cd)), weight.dtype)


def act_linear_backward(dout, h, weight, activation: str, cd: torch.dtype, need: tuple[bool, bool, bool],
                        inplace: bool):
    """(d_h, d_weight, d_bias) of :func:`act_linear_forward` (None where ``need`` is False): ``dy = dout @ weight``,
    one pass writing d_h (into h's memory with ``inplace``) and ``act(h)`` over dy, then ``d_weight = dout.T @
    act(h)``; the backward allocates no more than the unfused one (dy)."""
    d2 = _in(dout.reshape(-1, dout.shape[-1]), cd)
    dh, dw = _outside_autocast(_grads, h.device, d2, h, weight, activation, cd, need, inplace)
    return dh, dw, (d2.sum(0) if need[2] else None)


class ActLinearFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(h, weight, bias, activation, cd, inplace)``: a non-gated MLP's ``down(act(h))`` that
    saves h and the weight but not ``act(h)``, recomputed in the backward by the pass that forms d_h (see
    :func:`act_linear_backward`). ``inplace``: d_h is written into h's memory (h is then saved as a detached alias,
    so the gradient returned, h's memory, is the only reference to its tensor object and autograd passes it on
    without a copy)."""

    @staticmethod
    def forward(ctx, h, weight, bias, activation, cd, inplace=False):
        ctx.save_for_backward(h.detach() if inplace else h, weight)
        ctx.activation, ctx.cd, ctx.inplace, ctx.consumed = activation, cd, inplace, False
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return act_linear_forward(h, weight, bias, activation, cd)

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(ActLinearFunction.backward, ctx, dout)
        need = tuple(ctx.needs_input_grad[:3])
        if ctx.consumed:
            raise RuntimeError("tigon act_linear(inplace_backward=True) wrote its gradient into h during the first "
                               "backward; a second backward through it is not possible (a model patched by "
                               "tigon.patch does this in its non-gated MLPs: retain_graph=True is not supported there)")
        ctx.consumed = ctx.inplace and need[0]
        h, weight = ctx.saved_tensors
        dh, dw, db = act_linear_backward(dout, h, weight, ctx.activation, ctx.cd, need, ctx.inplace)
        return dh, dw, (db.to(ctx.bias_dtype) if db is not None else None), None, None, None
