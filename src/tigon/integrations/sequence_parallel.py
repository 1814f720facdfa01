"""A decoder layer's fused residual add + norm when the norm is sequence parallel (torch's ``SequenceParallel``).

torch's ``SequenceParallel`` style (``torch.distributed.tensor.parallel``, applied by ``parallelize_module``) makes a
norm's weight a Replicate DTensor and hooks the norm: a forward pre-hook takes its input as sharded over the tokens
(a DTensor is redistributed to ``Shard(sequence_dim)``, a plain tensor is taken as this rank's tokens:
``DTensor.from_local``) and a forward hook returns the output as a DTensor or, with ``use_local_output``, its local
tensor. A patched decoder layer (:mod:`tigon.integrations.decoder_layer`) does not call its post-attention norm, so
those hooks would not run; a norm with hooks of any other kind keeps the original computation.

:func:`sequence_parallel_hooks` recognises exactly those two hooks (nothing else on the module, no global hooks) and
:func:`fused_add_norm` computes what the original computes around them: ``s = x + residual``, then the pre-hook on
s, the norm and the forward hook, with the add and the norm as one :func:`tigon.functional.fused_add_rms_norm` on
each rank's tokens (the op is row-wise: :mod:`tigon.ops._dtensor` runs it on the local shards, no gather). Both
inputs must be DTensors already ``Shard(sequence_dim)`` on the style's mesh (the residual stream kept as DTensors:
the embedding's and the row-wise projections' ``output_layouts=Shard(1), use_local_output=False``, so the pre-hook
would leave their sum as it is). Anything else (plain tensors, another placement or mesh) returns None and the layer
adds and calls the norm as the original does. (Plain local tokens between the layers, torchtitan's layout, do not
fit a transformers decoder: it takes the positions and the causal mask from the embedding output's length.)

torch.distributed is never imported here unless the norm has hooks to recognise.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch

from .child_calls import _MODULE
from .marks import tigon_mark


@dataclass(frozen=True)
class SequenceParallelHooks:
    """A norm's ``SequenceParallel`` hooks: mesh (the style's device mesh), placements (``(Shard(sequence_dim),)``,
    what the pre-hook makes the input) and post (the forward hook, which lays out the output)."""

    mesh: object
    placements: tuple
    post: object


def _closure(fn) -> dict:
    """The values a function closes over, by name ({} for anything else)."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return {}
    try:
        return {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
    except ValueError:  # an empty cell
        return {}


def _style_fn(hook, name: str, attr: str):
    """The ``functools.partial`` of ``SequenceParallel.<attr>`` that ``hook`` (``distribute_module``'s lambda) calls
    as ``name``, with the device mesh it passes; None if ``hook`` is not that."""
    from torch.distributed.tensor.parallel import SequenceParallel

    env = _closure(hook)
    fn = env.get(name)
    if not (isinstance(fn, functools.partial) and fn.func is getattr(SequenceParallel, attr) and len(fn.args) == 1
            and not fn.keywords and "device_mesh" in env):
        return None
    return fn, env["device_mesh"]


def sequence_parallel_hooks(module: torch.nn.Module) -> SequenceParallelHooks | None:
    """The ``SequenceParallel`` hooks on ``module`` when they are all it has (one forward pre-hook and one forward
    hook, as ``parallelize_module`` registers them; no hooks with kwargs, no backward or global hooks, no
    instance-level ``forward`` other than Tigon's), else None. Read at every call of a patched layer whose norm has
    hooks (a few attribute reads)."""
    d = module.__dict__
    pre, post = d["_forward_pre_hooks"], d["_forward_hooks"]
    if (len(pre) != 1 or len(post) != 1 or d["_backward_hooks"] or d["_backward_pre_hooks"]
            or d.get("_forward_pre_hooks_with_kwargs") or d.get("_forward_hooks_with_kwargs")
            or d.get("_forward_hooks_always_called")):
        return None
    m = _MODULE
    if m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks or \
            m._global_backward_pre_hooks:
        return None
    own = d.get("forward")
    if own is not None and tigon_mark(own) is None:
        return None
    if "torch.distributed.tensor.parallel" not in sys.modules:
        return None  # no parallelize_module has run
    (pre_hook,), (post_hook,) = pre.values(), post.values()
    found_in = _style_fn(pre_hook, "input_fn", "_prepare_input_fn")
    found_out = _style_fn(post_hook, "output_fn", "_prepare_output_fn")
    if found_in is None or found_out is None or found_in[1] is not found_out[1]:
        return None
    placements = found_in[0].args[0]
    return SequenceParallelHooks(found_in[1], tuple(placements), post_hook)


def fused_add_norm(hooks: SequenceParallelHooks, norm: torch.nn.Module, fused, x, residual):
    """``(norm(residual + x), residual + x)`` as the original layer computes them with ``norm``'s
    ``SequenceParallel`` hooks (module docstring), the add and the norm one call of ``fused(x, residual)`` (returning
    ``(y, s)``: :func:`tigon.functional.fused_add_rms_norm` with the norm's weight and options). None unless x and
    residual are both DTensors laid out as the pre-hook lays out the norm's input (the caller then runs the original
    computation).

    Args:
        hooks: :func:`sequence_parallel_hooks` of ``norm``.
        norm: the post-attention norm (passed to its forward hook).
        fused: ``fused(x, residual) -> (y, s)``.
        x: (batch, tokens, hidden) the attention output; residual: the residual stream, x's shape. DTensors
            ``hooks.placements`` on ``hooks.mesh`` (for anything else the result is None).

    Returns:
        (y, s) or None: y as the norm's forward hook returns it (a DTensor, or its local tensor with
        ``use_local_output``); s the sum, a DTensor laid out as x.
    """
    from torch.distributed.tensor import DTensor

    if not (isinstance(x, DTensor) and isinstance(residual, DTensor)):
        return None
    if x.shape != residual.shape:
        return None  # (broadcasting: the original's add decides the shape)
    for t in (x, residual):
        if t.device_mesh != hooks.mesh or tuple(t.placements) != hooks.placements:
            return None
    y, s = fused(x, residual)
    out = hooks.post(norm, (s,), y)
    return (y if out is None else out), s
