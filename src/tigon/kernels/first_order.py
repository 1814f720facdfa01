"""Backwards that are first-order only: a second differentiation through them raises, never returns a silently
constant gradient. Kept apart from :mod:`tigon.kernels._common` (which imports Triton) so that op modules may
decorate their ``autograd.Function`` s at import (:mod:`tigon.ops.tiled_mlp`) without importing Triton before
``TRITON_INTERPRET`` is decided."""

from __future__ import annotations

import functools

import torch


def once_differentiable(backward):
    """``torch.autograd.function.once_differentiable`` for an autograd.Function's backward, without its cost on the
    usual backward, and with every gradient marked (see :func:`first_order`).

    torch's wrapper runs the backward under ``torch.no_grad()`` (a context manager: ~1.5 us of host time per call)
    and then, when grad mode is on (``create_graph=True``), makes a second differentiation raise. Autograd runs a
    backward with grad mode off unless ``create_graph=True``: there the no_grad context changes nothing and the
    wrapper returns the outputs as they are, so this calls the backward directly, and otherwise :func:`first_order`.
    """

    @functools.wraps(backward)
    def wrapper(ctx, *grads):
        if torch.is_grad_enabled():
            return first_order(backward, ctx, *grads)
        return backward(ctx, *grads)

    return wrapper


_TWICE = b"trying to differentiate twice a function that was marked with @once_differentiable"


def first_order(backward, ctx, *grads, linear: bool = False):
    """:func:`once_differentiable` without its wrapper's Python frame on the usual backward, for the hot ops: their
    backward begins ``if torch.is_grad_enabled(): return first_order(<Function>.backward, ctx, *grads)`` (grad mode
    is on only under ``create_graph=True``), which runs it under no_grad (so the second entry takes the usual path)
    and returns its gradients behind a node whose differentiation raises.

    Every gradient is marked so, not only (as torch's ``once_differentiable`` does) where an incoming gradient
    requires grad: the gradients of a non-linear op depend on its saved inputs too, and ``grad(y.sum(), x,
    create_graph=True)`` (incoming ones) came back as a constant, so a gradient penalty on it silently lost its
    second-order term. ``linear``: the gradients depend on the incoming ones only (rope: constant tables), so where
    those do not require grad the gradients are constants and right as they are: torch's rule then."""
    if linear:
        return torch.autograd.function.once_differentiable(backward)(ctx, *grads)
    with torch.no_grad():
        out = backward(ctx, *grads)
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    # (DelayedError's outputs have its raising grad_fn only for inputs that require grad: detached aliases that do)
    marked = torch._C._functions.DelayedError(_TWICE, len(outs))(
        *(g.detach().requires_grad_() if isinstance(g, torch.Tensor) and g.is_floating_point() else g for g in outs))
    marked = marked if isinstance(marked, tuple) else (marked,)
    return marked[0] if single else marked
