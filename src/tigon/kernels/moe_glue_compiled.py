"""The MoE glue (:mod:`tigon.kernels.moe_glue`) as ``torch.library`` custom ops for ``torch.compile`` (see
:mod:`tigon.kernels`): ``tigon::moe_gather``, ``tigon::moe_expert_gate``, ``tigon::moe_combine`` and their backward
ops, on the same launchers as the eager autograd Functions; the ``compiled_moe_*`` entries take those Functions'
arguments. Kept apart from the kernels' module only for its length."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..reference.moe_glue import check_host
from ._common import CUSTOM_OP_TAGS, if_wanted, or_empty
from .moe_glue import combine_backward, expert_gate_backward, expert_gate_forward, to_rows, to_tokens


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Functions above, as torch.library custom ops (see tigon.kernels). positions and
# offsets are int32 / int64 tensors without gradients, CPU ones checked in the forward ops as in eager
# (reference.moe_glue.check_host); an output not computed is a (0,) placeholder.
@torch.library.custom_op("tigon::moe_gather", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _moe_gather(x: Tensor, positions: Tensor) -> Tensor:
    """(T*k, H) contiguous in x's dtype: ``out[positions[t, j]] = x[t]``."""
    check_host(positions, None)
    return to_rows(x, positions)[0]


@_moe_gather.register_fake
def _(x, positions):
    return x.new_empty((positions.shape[0] * positions.shape[1], x.shape[1]))


@torch.library.custom_op("tigon::moe_gather_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _moe_gather_backward(dout: Tensor, positions: Tensor) -> Tensor:
    """dx (T, H) contiguous in dout's dtype: each token's k rows of dout (T*k, H) summed in fp32."""
    return to_tokens(dout, positions)


@_moe_gather_backward.register_fake
def _(dout, positions):
    return dout.new_empty((positions.shape[0], dout.shape[1]))


def _moe_gather_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _moe_gather_grad(ctx, dout):
    (positions,) = ctx.saved_tensors
    return _moe_gather_backward(dout, positions), None


_moe_gather.register_autograd(_moe_gather_grad, setup_context=_moe_gather_setup)


@torch.library.custom_op("tigon::moe_expert_gate", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _moe_expert_gate(gate_up: Tensor, offsets: Tensor, bias: Optional[Tensor], activation: str, alpha: float,
                     limit: Optional[float]) -> Tensor:
    """(S, I) contiguous in gate_up's dtype: ``act(gate_up[s] + bias[e(s)])`` (:func:`expert_gate_forward`)."""
    check_host(None, offsets)
    return expert_gate_forward(gate_up, offsets, bias, activation, alpha, limit)


@_moe_expert_gate.register_fake
def _(gate_up, offsets, bias, activation, alpha, limit):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


@torch.library.custom_op("tigon::moe_expert_gate_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _moe_expert_gate_backward(dy: Tensor, gate_up: Tensor, offsets: Tensor, bias: Optional[Tensor], activation: str,
                              alpha: float, limit: Optional[float], need_bias: bool) -> tuple[Tensor, Tensor]:
    """(d_gate_up: gate_up's shape and dtype, contiguous; d_bias: (E, 2I) in the bias's dtype, or (0,) unless
    ``need_bias`` and a bias)."""
    dgu, db = expert_gate_backward(dy, gate_up, offsets, bias, activation, alpha, limit,
                                   need_bias and bias is not None)
    return dgu, or_empty(db, gate_up)


@_moe_expert_gate_backward.register_fake
def _(dy, gate_up, offsets, bias, activation, alpha, limit, need_bias):
    db = bias.new_empty(bias.shape) if need_bias and bias is not None else gate_up.new_empty((0,))
    return gate_up.new_empty(gate_up.shape), db


def _moe_expert_gate_setup(ctx, inputs, output):
    gate_up, offsets, bias, activation, alpha, limit = inputs
    ctx.save_for_backward(gate_up, offsets, bias)
    ctx.activation, ctx.alpha, ctx.limit = activation, alpha, limit


def _moe_expert_gate_grad(ctx, dy):
    gate_up, offsets, bias = ctx.saved_tensors
    need_bias = ctx.needs_input_grad[2] and bias is not None
    dgu, db = _moe_expert_gate_backward(dy, gate_up, offsets, bias, ctx.activation, ctx.alpha, ctx.limit, need_bias)
    return dgu, None, if_wanted(db, need_bias), None, None, None


_moe_expert_gate.register_autograd(_moe_expert_gate_grad, setup_context=_moe_expert_gate_setup)


@torch.library.custom_op("tigon::moe_combine", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _moe_combine(x: Tensor, weights: Tensor, positions: Tensor, offsets: Optional[Tensor],
                 bias: Optional[Tensor]) -> Tensor:
    """(T, H) contiguous in x's dtype: ``sum_j (x[p] + bias[e(p)]) * weights[t, j]``, p = positions[t, j]."""
    check_host(positions, offsets if bias is not None else None)
    return to_tokens(x, positions, weights, bias, offsets)


@_moe_combine.register_fake
def _(x, weights, positions, offsets, bias):
    return x.new_empty((positions.shape[0], x.shape[1]))


@torch.library.custom_op("tigon::moe_combine_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _moe_combine_backward(dout: Tensor, x: Tensor, weights: Tensor, positions: Tensor, offsets: Optional[Tensor],
                          bias: Optional[Tensor], need_w: bool, need_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype, contiguous; dw: (T, k) in the weights' dtype, or (0,) unless ``need_w``; d_bias:
    (E, H) in the bias's dtype, or (0,) unless ``need_bias`` and a bias) (:func:`combine_backward`)."""
    dx, dw, db = combine_backward(dout, x, weights, positions, offsets, bias, need_w, need_bias)
    return dx, or_empty(dw, weights), or_empty(db, x)


@_moe_combine_backward.register_fake
def _(dout, x, weights, positions, offsets, bias, need_w, need_bias):
    db = bias.new_empty(bias.shape) if need_bias and bias is not None else x.new_empty((0,))
    return x.new_empty(x.shape), weights.new_empty(weights.shape if need_w else (0,)), db


def _moe_combine_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _moe_combine_grad(ctx, dout):
    x, weights, positions, offsets, bias = ctx.saved_tensors
    need_x, need_w, _, _, need_b = ctx.needs_input_grad
    need_b = need_b and bias is not None
    dx, dw, db = _moe_combine_backward(dout, x, weights, positions, offsets, bias, need_w, need_b)
    return if_wanted(dx, need_x), if_wanted(dw, need_w), None, None, if_wanted(db, need_b)


_moe_combine.register_autograd(_moe_combine_grad, setup_context=_moe_combine_setup)


def compiled_moe_gather(x, positions):
    """``MoEGatherFunction.apply`` as the ``tigon::moe_gather`` custom op."""
    return _moe_gather(x, positions)


def compiled_moe_expert_gate(gate_up, offsets, bias, activation, alpha, limit):
    """``MoEExpertGateFunction.apply`` as the ``tigon::moe_expert_gate`` custom op."""
    return _moe_expert_gate(gate_up, offsets, bias, activation, float(alpha), None if limit is None else float(limit))


def compiled_moe_combine(x, weights, positions, offsets, bias):
    """``MoECombineFunction.apply`` as the ``tigon::moe_combine`` custom op."""
    return _moe_combine(x, weights, positions, offsets, bias)
