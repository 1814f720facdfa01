"""Residual add + RMSNorm autograd op (HF decoder layers' ``residual + hidden_states`` then the next RMSNorm).

The kernels are RMSNorm's in :mod:`tigon.kernels.norm` with the residual add folded in (constexpr HAS_RESIDUAL in
the forward, HAS_DS in the backward): the forward reads x and the residual, writes y and ``s = x + residual``
(s stays in registers for the statistics); the backward reads dy, the incoming gradient ds of s and s, and writes
``ds_total = rstd * (g - shat * mean(g * shat)) + ds`` (g = dy * (offset + w)) once. Minimal bytes (bf16): forward
4*M*N*2, backward 4*M*N*2 (3*M*N*2 when s's gradient is absent).

ds_total is the gradient of x and of the residual alike, and both get the same tensor object: torch's own add
(``AddBackward0``) hands one gradient to both operands, and autograd's engine copes with that (a leaf's ``.grad``
that would alias another is copied when accumulated; a buffer shared by two consumers is never summed into in
place), so returning one tensor for two inputs is safe and saves a (M, N) copy.

:func:`fused_add_rms_norm_forward` and :func:`fused_add_rms_norm_backward` are the two kernel entry points, which the
``tigon::fused_add_rms_norm`` custom ops of this module (below) (torch.compile) call; :class:`FusedAddRMSNormFunction`
(eager) runs their bodies inline (one Python frame less each) and launches its backward in its forward's launch mode
(:func:`~tigon.kernels._common.launch_mode`, kept on the ctx).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._common import CUSTOM_OP_TAGS, direct_backward, if_wanted, launch_mode, or_empty, rows_of
from .first_order import first_order
from .grad_ownership import MEASURED, owns_grad, prepare
from .norm import norm_backward, norm_forward
from .rms_norm import output_dtype


def fused_add_rms_norm_forward(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                               offset: float, casting_mode: str):
    """``s = x + residual``, ``y = rms_norm(s, weight, ...)`` for x and residual (..., N) of one shape and dtype (any
    strides).

    Returns (y: x's shape, contiguous, :func:`~tigon.kernels.rms_norm.output_dtype`; s: x's shape and dtype,
    contiguous; rstd: (M,) fp32).
    """
    y, _, rstd, s, _ = norm_forward(x, weight, None, eps, is_rms=True, offset=offset,
                                    round_xhat=casting_mode == "llama",
                                    out_dtype=x.dtype if weight.dtype == x.dtype else output_dtype(
                                        x.dtype, weight.dtype, casting_mode), residual=residual)
    return y, s, rstd


def fused_add_rms_norm_backward(dy: torch.Tensor, ds: torch.Tensor | None, s: torch.Tensor, weight: torch.Tensor,
                                rstd: torch.Tensor, offset: float, need_dw: bool, over_dy: bool = False):
    """The gradient of x and residual (one tensor: both are ``ds_total``) and of the weight.

    dy: y's gradient (..., N), any strides; ds: s's gradient (s's shape, any strides), or None for zero; s, rstd: as
    the forward returned them. ``over_dy``: write ds_total into dy's memory instead of a new tensor, where dy can
    hold it (contiguous, in s's dtype; the kernel reads each tile of dy, and of ds when it is dy, before writing
    it); the caller decides that nothing else reads dy (:func:`tigon.kernels.grad_ownership.owns_grad`).

    Returns (ds_total: s's shape and dtype, contiguous (dy itself when written in place); dw: (N,) in weight's dtype,
    or None unless ``need_dw``).
    """
    out = dy if over_dy and dy.is_contiguous() and dy.dtype == s.dtype else None
    return norm_backward(dy, s, weight, None, rstd, need_dw, False, is_rms=True, offset=offset, ds=ds, dx=out,
                         dw_dtype=weight.dtype)[:2]


@direct_backward  # (the call path of grad_ownership._Probe, which owns_grad compares with)
class FusedAddRMSNormFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(x, residual, weight, eps, offset, casting_mode, in_place)`` with x and residual
    (..., N) of one shape and dtype, weight (N,); returns (y, s).

    Casting modes as :class:`~tigon.kernels.rms_norm.RMSNormFunction` (for y); s is in x's dtype. Saves s, the
    weight and rstd (nothing of x or the residual). A gradient that does not reach an output is not materialised:
    without one for s nothing more than RMSNorm's backward runs, and without one for y the gradient of x and the
    residual is s's own (no kernel). ``in_place``: the backward writes ds_total over y's incoming gradient dy when
    it owns dy (:func:`~tigon.kernels.grad_ownership.owns_grad`: not when dy is also s's gradient, the caller's, or
    another branch's), else into a new tensor.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, eps, offset, casting_mode, in_place=False):
        if in_place and any(ctx.needs_input_grad[:3]) and x.device.type not in MEASURED:
            prepare(x.device)  # (once per process and device type)
        # (fused_add_rms_norm_forward, inline: one Python frame less; the launch mode kept for the backward's launch)
        ctx.mode = mode = launch_mode(x.device)
        y, _, rstd, s, _ = norm_forward(
            x, weight, None, eps, is_rms=True, offset=offset, round_xhat=casting_mode == "llama",
            out_dtype=x.dtype if weight.dtype == x.dtype else output_dtype(x.dtype, weight.dtype, casting_mode),
            residual=residual, mode=mode)
        # (ctx.save_for_backward(...) and ctx.set_materialize_grads(False), inline: all they do; two frames less)
        ctx.to_save, ctx.materialize_grads = (s, weight, rstd), False
        ctx.offset, ctx.in_place = offset, in_place
        return y, s

    @staticmethod
    def backward(ctx, dy, ds):
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(FusedAddRMSNormFunction.backward, ctx, dy, ds)
        s, weight, rstd = ctx.saved_tensors
        need_x, need_r, need_w = ctx.needs_input_grad[:3]
        if dy is None:  # y unused: s = x + residual passes s's gradient (possibly None too) to both
            return ds, ds, None, None, None, None, None
        over_dy = ctx.in_place and owns_grad(dy, s.dtype)  # dy: no other local name (owns_grad counts references)
        # (fused_add_rms_norm_backward, inline: one Python frame less)
        out = dy if over_dy and dy.is_contiguous() and dy.dtype == s.dtype else None
        dsum, dw, _ = norm_backward(dy, s, weight, None, rstd, need_w, False, is_rms=True, offset=ctx.offset, ds=ds,
                                    dx=out, dw_dtype=weight.dtype, mode=ctx.mode)
        return dsum if need_x else None, dsum if need_r else None, dw, None, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels). ``in_place``
# is ignored here (a custom op may not return its input's memory); inductor plans the backward's buffers itself.
@torch.library.custom_op("tigon::fused_add_rms_norm", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float, offset: float,
                        casting_mode: str) -> tuple[Tensor, Tensor, Tensor]:
    """(y: x's shape, contiguous, :func:`~tigon.kernels.rms_norm.output_dtype`; s: x's shape and dtype, contiguous;
    rstd: (M,) fp32)."""
    return fused_add_rms_norm_forward(x, residual, weight, eps, offset, casting_mode)


@_fused_add_rms_norm.register_fake
def _(x, residual, weight, eps, offset, casting_mode):
    return (x.new_empty(x.shape, dtype=output_dtype(x.dtype, weight.dtype, casting_mode)), x.new_empty(x.shape),
            x.new_empty((rows_of(x),), dtype=torch.float32))


@torch.library.custom_op("tigon::fused_add_rms_norm_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _fused_add_rms_norm_backward(dy: Tensor, ds: Optional[Tensor], s: Tensor, weight: Tensor, rstd: Tensor,
                                 offset: float, need_dw: bool) -> tuple[Tensor, Tensor]:
    """(ds_total, the gradient of x and residual: s's shape and dtype, contiguous; dw: (N,) in weight's dtype, or
    (0,) unless ``need_dw``)."""
    dsum, dw = fused_add_rms_norm_backward(dy, ds, s, weight, rstd, offset, need_dw)
    return dsum, or_empty(dw, weight)


@_fused_add_rms_norm_backward.register_fake
def _(dy, ds, s, weight, rstd, offset, need_dw):
    return s.new_empty(s.shape), weight.new_empty(weight.shape if need_dw else (0,))


def _fused_add_rms_norm_setup(ctx, inputs, output):
    _x, _residual, weight, _eps, offset, _mode = inputs
    ctx.save_for_backward(output[1], weight, output[2])
    ctx.offset = offset


def _fused_add_rms_norm_grad(ctx, dy, ds, _drstd):
    s, weight, rstd = ctx.saved_tensors
    need_x, need_r, need_w = ctx.needs_input_grad[:3]
    if dy is None:  # materialised as zeros by default here; handled as in the Function above all the same
        return ds, ds, None, None, None, None
    dsum, dw = _fused_add_rms_norm_backward(dy, ds, s, weight, rstd, ctx.offset, need_w)
    return if_wanted(dsum, need_x), if_wanted(dsum, need_r), if_wanted(dw, need_w), None, None, None


_fused_add_rms_norm.register_autograd(_fused_add_rms_norm_grad, setup_context=_fused_add_rms_norm_setup)


def compiled_fused_add_rms_norm(x, residual, weight, eps, offset, casting_mode, in_place=False):
    """``FusedAddRMSNormFunction.apply`` as the ``tigon::fused_add_rms_norm`` custom op: (y, s) (``in_place`` is
    ignored, see above)."""
    y, s, _ = _fused_add_rms_norm(x, residual, weight, eps, offset, casting_mode)
    return y, s
