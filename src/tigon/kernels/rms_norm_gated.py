"""Gated RMSNorm autograd op, ``rmsnorm(x) * silu(gate)`` (Qwen3-Next / Qwen3.5 ``RMSNormGated``, Falcon-H1's Mamba
norm): the norm kernels of :mod:`tigon.kernels.norm` with their ``HAS_GATE`` switch, so the gate is applied in the
same pass as the normalisation (forward) and d_gate is written by the pass that forms dx (backward).
Minimal bytes (bf16): forward 3*M*N*2 (read x, gate; write y), backward 5*M*N*2 (read x, gate, dy; write dx, d_gate).

Grouped statistics (``n_groups`` groups of N / n_groups contiguous channels, Mamba-2's ``group_size``): the kernels'
rows are the M * n_groups groups (the norm kernels' ``GROUPED`` switch: the weight read at the group's columns, the
dW partials kept per group row), the same bytes. ``norm_before_gate=False`` (Mamba-2's, Falcon-H1's option): the
gate multiplies x before the statistics (the norm kernels' ``GATE_FIRST``), the same bytes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._common import CUSTOM_OP_TAGS, if_wanted, or_empty, rows_of
from .first_order import once_differentiable
from .norm import norm_backward, norm_forward


def rms_norm_gated_forward(x, gate, weight, eps: float, offset: float, casting_mode: str, n_groups: int = 1,
                           norm_before_gate: bool = True):
    """(y: x's shape and dtype, contiguous; x2: x as the kernel read it; rstd: (M * n_groups,) fp32)."""
    y, _, rstd, _, x2 = norm_forward(x, weight, None, eps, is_rms=True, offset=offset,
                                     round_xhat=casting_mode == "llama", out_dtype=x.dtype, gate=gate,
                                     n_groups=n_groups, gate_first=not norm_before_gate)
    return y, x2, rstd


def rms_norm_gated_backward(dy, x, gate, weight, rstd, offset: float, need_dw: bool, x_shape=None, n_groups: int = 1,
                            norm_before_gate: bool = True):
    """(dx: ``x_shape`` (default x's), x's dtype; d_gate: gate's shape and dtype; dw: (N,) weight's dtype or None)."""
    need_dw = need_dw and weight is not None
    dx, dw, _, dgate = norm_backward(dy, x, weight, None, rstd, need_dw, False, is_rms=True, offset=offset,
                                     dx_shape=x_shape, dw_dtype=weight.dtype if need_dw else torch.float32, gate=gate,
                                     n_groups=n_groups, gate_first=not norm_before_gate)
    return dx, dgate, dw


class RMSNormGatedFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, gate, weight, eps, offset, casting_mode, n_groups, norm_before_gate)``."""

    @staticmethod
    def forward(ctx, x, gate, weight, eps, offset, casting_mode, n_groups=1, norm_before_gate=True):
        y, x2, rstd = rms_norm_gated_forward(x, gate, weight, eps, offset, casting_mode, n_groups, norm_before_gate)
        ctx.save_for_backward(x2, gate, weight, rstd)
        ctx.offset, ctx.x_shape, ctx.n_groups, ctx.norm_before_gate = offset, x.shape, n_groups, norm_before_gate
        return y

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        x2, gate, weight, rstd = ctx.saved_tensors
        dx, dgate, dw = rms_norm_gated_backward(dy, x2, gate, weight, rstd, ctx.offset, ctx.needs_input_grad[2],
                                                ctx.x_shape, ctx.n_groups, ctx.norm_before_gate)
        return dx, dgate, dw, None, None, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
@torch.library.custom_op("tigon::rms_norm_gated", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _rms_norm_gated(x: Tensor, gate: Tensor, weight: Tensor | None, eps: float, offset: float,
                    casting_mode: str, n_groups: int, norm_before_gate: bool) -> tuple[Tensor, Tensor]:
    """(y: x's shape and dtype, contiguous; rstd: (M * n_groups,) fp32)."""
    y, _, rstd = rms_norm_gated_forward(x, gate, weight, eps, offset, casting_mode, n_groups, norm_before_gate)
    return y, rstd


@_rms_norm_gated.register_fake
def _(x, gate, weight, eps, offset, casting_mode, n_groups, norm_before_gate):
    return x.new_empty(x.shape), x.new_empty((rows_of(x) * n_groups,), dtype=torch.float32)


@torch.library.custom_op("tigon::rms_norm_gated_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _rms_norm_gated_backward(dy: Tensor, x: Tensor, gate: Tensor, weight: Tensor | None, rstd: Tensor, offset: float,
                             need_dw: bool, n_groups: int, norm_before_gate: bool) -> tuple[Tensor, Tensor, Tensor]:
    """(dx: x's shape and dtype; d_gate: gate's; dw: (N,) weight's dtype, or (0,) unless need_dw and a weight)."""
    dx, dgate, dw = rms_norm_gated_backward(dy, x, gate, weight, rstd, offset, need_dw, n_groups=n_groups,
                                            norm_before_gate=norm_before_gate)
    return dx, dgate, or_empty(dw, x if weight is None else weight)


@_rms_norm_gated_backward.register_fake
def _(dy, x, gate, weight, rstd, offset, need_dw, n_groups, norm_before_gate):
    dw = x.new_empty((0,)) if weight is None else weight.new_empty(weight.shape if need_dw else (0,))
    return x.new_empty(x.shape), gate.new_empty(gate.shape), dw


def _setup(ctx, inputs, output):
    x, gate, weight, _eps, offset, _mode, n_groups, norm_before_gate = inputs
    ctx.save_for_backward(x, gate, weight, output[1])
    ctx.offset, ctx.n_groups, ctx.norm_before_gate = offset, n_groups, norm_before_gate


def _grad(ctx, dy, _drstd):
    x, gate, weight, rstd = ctx.saved_tensors
    need_dw = ctx.needs_input_grad[2] and weight is not None
    dx, dgate, dw = _rms_norm_gated_backward(dy, x, gate, weight, rstd, ctx.offset, need_dw, ctx.n_groups,
                                             ctx.norm_before_gate)
    return dx, dgate, if_wanted(dw, need_dw), None, None, None, None, None


_rms_norm_gated.register_autograd(_grad, setup_context=_setup)


def compiled_rms_norm_gated(x, gate, weight, eps, offset, casting_mode, n_groups=1, norm_before_gate=True):
    """``RMSNormGatedFunction.apply`` as the ``tigon::rms_norm_gated`` custom op: y (x's shape)."""
    return _rms_norm_gated(x, gate, weight, eps, offset, casting_mode, n_groups, norm_before_gate)[0]
