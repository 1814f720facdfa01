"""The autograd and torch.compile wrappers of an op ``y = f(x)`` whose backward needs one saved tensor.

Ops such as relu_squared (which saves its input) and softmax (which saves its output, as torch does) differ only in
their launchers; :func:`unary_op` builds both of their wrappers from those: an ``autograd.Function`` for eager mode
and the ``tigon::<name>`` / ``tigon::<name>_backward`` custom ops (with fake implementations and the autograd
formula) that :mod:`tigon.kernels` uses under ``torch.compile``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ._common import CUSTOM_OP_TAGS
from .first_order import once_differentiable

Launcher = Callable[[Tensor], Tensor]
BackwardLauncher = Callable[[Tensor, Tensor], Tensor]


def unary_op(name: str, forward: Launcher, backward: BackwardLauncher, saves: str):
    """``(Function, compiled)`` for the op ``name``.

    ``forward(x) -> y`` and ``backward(dy, saved) -> dx`` are the op's launchers (new tensors of x's shape and dtype);
    ``saves`` is ``"input"`` (the backward gets x) or ``"output"`` (it gets y). ``Function.apply(x)`` runs them in
    eager mode (the backward is once-differentiable: create_graph raises); ``compiled(x)`` runs the
    ``tigon::<name>`` custom op, whose backward is ``tigon::<name>_backward``.

    Raises:
        ValueError: ``saves`` is neither "input" nor "output".
    """
    if saves not in ("input", "output"):
        raise ValueError(f"saves must be 'input' or 'output', got {saves!r}")
    keep_input = saves == "input"

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = forward(x)
            ctx.save_for_backward(x if keep_input else y)
            return y

        @staticmethod
        @once_differentiable  # not differentiable itself: create_graph raises
        def backward(ctx, dy):
            (saved,) = ctx.saved_tensors
            return backward(dy, saved)

    Function.__name__ = Function.__qualname__ = "".join(p.title() for p in name.split("_")) + "Function"
    Function.__doc__ = f"autograd wrapper of {name}; ``apply(x)``; saves the {saves} for the backward."

    def op_forward(x: Tensor) -> Tensor:
        return forward(x)

    def op_backward(dy: Tensor, saved: Tensor) -> Tensor:
        return backward(dy, saved)

    fwd = torch.library.custom_op(f"tigon::{name}", op_forward, mutates_args=(), tags=CUSTOM_OP_TAGS)
    bwd = torch.library.custom_op(f"tigon::{name}_backward", op_backward, mutates_args=(), tags=CUSTOM_OP_TAGS)
    fwd.register_fake(lambda x: x.new_empty(x.shape))
    bwd.register_fake(lambda dy, saved: saved.new_empty(saved.shape))

    def setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[0] if keep_input else output)

    def grad(ctx, dy):
        (saved,) = ctx.saved_tensors
        return bwd(dy, saved)

    fwd.register_autograd(grad, setup_context=setup)
    return Function, fwd
