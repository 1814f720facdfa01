"""A patched gated MLP whose gate, up and down projections are fused PEFT LoRA layers: the whole MLP as one
:func:`tigon.functional.lora_glu_mlp` node, the reasons it is not, and its form inside activation checkpointing.

The patched MLP forward (:func:`tigon.integrations.forwards.mlp_forward`) asks :func:`fused_call` first when its
gate projection carries the forward of an adapter whose :class:`~tigon.integrations.families.AdapterSpec` names an
MLP op (``AdapterSpec.mlp_op``; PEFT LoRA: ``"lora_glu_mlp"``): then

- all three projections must be layers :func:`tigon.patch` fused (``lora=True``; each passed
  :func:`~tigon.integrations.lora.lora_problem`), without hooks, and each must fuse this call
  (:func:`~tigon.integrations.lora._fused_adapter`: not merged, not disabled, no active dropout, dtypes); otherwise
  the MLP calls its projections as before, each fused on its own or running PEFT's forward;
- outside activation checkpointing, one :func:`tigon.functional.lora_glu_mlp` node (what it saves and the passes
  it makes: :mod:`tigon.kernels.lora_mlp`);
- inside a non-reentrant checkpoint (:func:`~tigon.integrations.forwards.under_checkpoint`) nothing of the region
  is kept, and the recomputation stops once the last tensor the first forward saved is packed again: a Function
  packs after its forward, so a one-node MLP would recompute the down projection's base matmul for nothing. There
  gate and up are called (their ``lora_linear`` nodes), then the GLU, then the down projection as plain matmuls
  with its low-rank path first, so that its last saved tensor (the frozen base weight) is packed before the base
  matmul runs (:func:`_down_for_checkpoint`).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .. import functional as TF
from .families import ADAPTERS, MLPSpec
from .forwards import _glu, _GLU_LINEAR_ACTIVATION, _hook_problem, tigon_mark, under_checkpoint
from .lora import _fused_adapter, lora_problem


def mlp_adapter(module, spec: MLPSpec):
    """The :class:`~tigon.integrations.families.AdapterSpec` with an MLP op whose layer class ``module``'s gate
    projection is (None when there is none, or the MLP has one fused gate-up projection)."""
    if spec.gate_up is not None or spec.experts:
        return None
    gate = getattr(module, spec.gate, None)
    for a in ADAPTERS:
        mod = sys.modules.get(a.module)
        cls = getattr(mod, a.cls, None) if mod is not None and a.mlp_op else None
        if cls is not None and isinstance(gate, cls):
            return a
    return None


def mlp_problem(module, spec: MLPSpec, lora_enabled: bool = True) -> str | None:
    """Why the patched MLP ``module`` with adapter layers on its projections does not run as one fused node
    (None when it does); for the report, at patch time."""
    adapter = mlp_adapter(module, spec)
    if adapter is None:
        return "its gate projection is not an adapter layer"
    mod = sys.modules[adapter.module]
    cls = getattr(mod, adapter.cls)
    names = (spec.gate, spec.up, spec.down)
    bare = [n for n in names if not isinstance(getattr(module, n, None), cls)]
    if bare:
        return f"{', '.join(bare)} carr{'ies' if len(bare) == 1 else 'y'} no {adapter.cls} adapter layer"
    if not lora_enabled:
        return f"tigon.patch(..., {adapter.kind}=False) leaves its adapter layers to PEFT"
    for n in names:
        m = getattr(module, n)
        problem = lora_problem(m) or _hook_problem(m, tigon_forward_ok=True)
        if problem is not None:
            return f"{n}: {problem}"
    return None


def _parts(m, name: str):
    base = m.base_layer
    return base.weight, m.lora_A[name].weight, m.lora_B[name].weight, base.bias, m.scaling[name]


def fused_call(module, spec: MLPSpec, act: tuple[str, str | None], x: torch.Tensor):
    """The MLP's output for ``x`` through the fused path, or None when this call does not take it (see the module
    docstring). Cheap attribute checks only: it runs for every MLP in every step."""
    projections = (getattr(module, spec.gate), getattr(module, spec.up), getattr(module, spec.down))
    names = []
    for m in projections:
        mk = tigon_mark(m.__dict__.get("forward"))
        if mk is None or mk.get("adapter") is None or _hook_problem(m, tigon_forward_ok=True) is not None:
            return None
        name = _fused_adapter(m, x)
        if name is None:
            return None
        names.append(name)
    (wg, ag, bg, cg, sg), (wu, au, bu, cu, su), (wd, ad, bd, cdn, sd) = (
        _parts(m, n) for m, n in zip(projections, names))
    activation = _GLU_LINEAR_ACTIVATION[act]
    if under_checkpoint():
        product = _glu(act, projections[0](x), projections[1](x), inplace=True)
        return _down_for_checkpoint(product, wd, ad, bd, cdn, sd)
    return TF.lora_glu_mlp(x, wg, ag, bg, wu, au, bu, wd, ad, bd, gate_bias=cg, up_bias=cu, down_bias=cdn,
                           gate_scaling=sg, up_scaling=su, down_scaling=sd, activation=activation)


def _down_for_checkpoint(product, weight, lora_a, lora_b, bias, scaling: float) -> torch.Tensor:
    """``linear(p, W, b) + s linear(linear(p, A), B)`` with the low-rank path first: the base matmul, whose frozen
    weight is the last tensor saved, runs after it is packed (so a checkpoint's recomputation stops before it)."""
    low = F.linear(F.linear(product, lora_a), lora_b) * scaling
    return low + F.linear(product, weight, bias)


def describe(module, spec: MLPSpec, act_name: str, lora_enabled: bool) -> str | None:
    """The report's text for an MLP whose projections are adapter layers (None when they are not)."""
    if module is None or mlp_adapter(module, spec) is None:
        return None
    problem = mlp_problem(module, spec, lora_enabled)
    if problem is not None:
        return f"its adapter layers are not fused as one node with the MLP ({problem})"
    return (f"{spec.down}({act_name}({spec.gate}(x), {spec.up}(x))) with their PEFT LoRA adapters as one "
            "tigon.functional.lora_glu_mlp node (base weights frozen; the product recomputed in the backward, not "
            "stored; the two A products of gate and up as one matmul); inside a non-reentrant activation checkpoint "
            f"{spec.gate} / {spec.up} as lora_linear, the GLU, and {spec.down} as matmuls ordered so that the "
            "recomputation stops before its base matmul; the layers' own forwards at a call where an adapter is "
            "merged, disabled or has active dropout")
