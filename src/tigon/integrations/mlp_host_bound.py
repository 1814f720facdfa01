"""The host-bound choice of a patched MLP, gated or not: on a CUDA GPU in eager mode, a call whose product has at most
its op record's ``host_bound_elements`` tokens x intermediate elements runs the original forward (:func:`host_bound`),
and the patch report's sentence on it (:func:`describe_host_bound`).
"""

from __future__ import annotations

import functools

import torch

from .. import support
from .families import MLPSpec
from .mlp_activations import mlp_activation


def _on_compiled_gpu(x: torch.Tensor, compiling: bool | None = None) -> bool:
    """Whether the kernels would run compiled on a CUDA GPU for ``x`` in eager mode (where the host-bound choice of
    :func:`host_bound` applies; under the interpreter or torch.compile the kernels' host cost is not what it
    saves). ``compiling``: ``torch.compiler.is_compiling()`` where the caller asked it already (None: asked here)."""
    if not x.is_cuda:
        return False
    if compiling is None:
        compiling = support.dynamo_compiling() or support.COMPILER._is_compiling_flag  # (is_compiling())
    data = support._ENV_DATA
    if data is None or support.os.environ is not support._ENVIRON:
        return not compiling and not support.interpreter_enabled()
    return not compiling and data.get(support._K_INTERPRET) != support._ONE  # (interpreter_enabled(), inline)


def _intermediate(module, spec: MLPSpec) -> int | None:
    """The MLP's intermediate size, from its gate (or fused gate-up) projection's ``out_features`` (None if absent).
    The projection is read from the module's children (past ``nn.Module.__getattr__``: one Python frame less), else
    as an attribute."""
    name = spec.gate_up if spec.gate_up is not None else spec.gate if spec.gate is not None else spec.up  # (non-gated)
    mods = module.__dict__.get("_modules")
    proj = mods.get(name) if mods is not None else None
    n = getattr(proj if proj is not None else getattr(module, name), "out_features", None)
    if spec.gate_up is not None:
        return n // 2 if isinstance(n, int) else None
    return n if isinstance(n, int) else None


def host_bound(module, spec: MLPSpec, act: tuple[str, str | None], x: torch.Tensor,
               compiling: bool | None = None) -> bool:
    """Whether the patched MLP ``module`` runs its original forward for input ``x``: on a CUDA GPU in eager mode,
    when its product has at most the ``host_bound_elements`` of its op's record (swiglu / geglu; see
    :attr:`tigon.ops.OpSpec.host_bound_elements`) tokens x intermediate elements. ``compiling``: as
    :func:`_on_compiled_gpu`'s."""
    if not _on_compiled_gpu(x, compiling):
        return False
    limit = support.host_bound_elements(_host_bound_default(act[0]))
    if not limit or not x.dim():
        return False
    inter = _intermediate(module, spec)
    return inter is not None and x.numel() // max(x.shape[-1], 1) * inter <= limit


@functools.lru_cache(maxsize=None)
def _host_bound_default(op: str) -> int:
    """The record's :attr:`~tigon.ops.OpSpec.host_bound_elements` of ``op`` (read once)."""
    from .. import ops

    return ops.get(op).host_bound_elements


def describe_host_bound(module, spec: MLPSpec, op: str | None = None) -> str:
    """The patch report's sentence on the host-bound choice of a patched MLP ("" when its threshold is 0); ``op``: the
    record that holds the threshold (default: the gated op of the MLP's activation)."""
    act = mlp_activation(module, spec) if module is not None and op is None else None
    op = op or (act[0] if isinstance(act, tuple) else "swiglu")
    limit = support.host_bound_elements(_host_bound_default(op))
    if not limit or spec.experts:
        return ""
    return (f"; on a CUDA GPU in eager mode, a call of at most {limit} tokens x intermediate elements runs the "
            "original forward (ATen: less host time at sizes where the step waits on the host; the original's "
            f"numerics; tigon.ops.get({op!r}).host_bound_elements, TIGON_HOST_BOUND_ELEMENTS overrides it)")
