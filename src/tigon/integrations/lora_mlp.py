"""A patched gated MLP whose gate, up and down projections are fused PEFT LoRA layers: the whole MLP as one
:func:`tigon.functional.lora_glu_mlp` node (:func:`tigon.functional.lora_gate_up_mlp` for one fused gate-up
projection: Phi-3, GLM-4), the reasons it is not, and its form inside activation checkpointing.

The patched MLP forward (:func:`tigon.integrations.mlp_forwards.mlp_forward`) asks :func:`fused_call` first when its
gate (gate-up) projection carries the forward of an adapter whose :class:`~tigon.integrations.families.AdapterSpec`
names an op for the MLP's layout (``AdapterSpec.mlp_op`` / ``gate_up_op``; PEFT LoRA: ``"lora_glu_mlp"`` /
``"lora_gate_up_mlp"``): then

- the MLP has no multipliers (Falcon-H1's muP gate / down multipliers are not arguments of the fused ops), and
  all its projections must be layers :func:`tigon.patch` fused (``lora=True``; each passed
  :func:`~tigon.integrations.lora.lora_problem`), without hooks, and each must fuse this call
  (:func:`~tigon.integrations.lora._fused_adapter`: not merged, not disabled, no active dropout, dtypes); otherwise
  the MLP calls its projections as before, each fused on its own or running PEFT's forward;
- outside activation checkpointing, one :func:`tigon.functional.lora_glu_mlp` (``lora_gate_up_mlp``) node (what it
  saves and the passes it makes: :mod:`tigon.kernels.lora_mlp`);
- inside a non-reentrant checkpoint (:func:`~tigon.integrations.child_calls.under_checkpoint`) nothing of the region
  is kept, and the recomputation stops once the last tensor the first forward saved is packed again: a Function
  packs after its forward, so a one-node MLP would recompute the down projection's base matmul for nothing. There
  gate and up (or gate-up) are called (their ``lora_linear`` nodes), then the GLU, then the down projection as plain
  matmuls with its low-rank path first, so that its last saved tensor (the frozen base weight) is packed before the base
  matmul runs (:func:`_down_for_checkpoint`).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .. import functional as TF
from .families import ADAPTERS, GLU_LINEAR_ACTIVATIONS, AdapterSpec, MLPSpec
from .child_calls import _hook_problem, under_checkpoint
from .marks import tigon_mark
from .mlp_forwards import _glu
from .lora import _fused_adapter, lora_problem


def projection_names(spec: MLPSpec) -> tuple[str, ...]:
    """The MLP's projections: ``(gate_up, down)`` with one fused gate-up projection, else ``(gate, up, down)``."""
    return (spec.gate_up, spec.down) if spec.gate_up is not None else (spec.gate, spec.up, spec.down)


def adapter_op(adapter: AdapterSpec, spec: MLPSpec) -> str | None:
    """The op that runs an MLP of ``spec``'s layout whose projections are ``adapter``'s layers (None: none)."""
    return adapter.gate_up_op if spec.gate_up is not None else adapter.mlp_op


def mlp_adapter(module, spec: MLPSpec):
    """The :class:`~tigon.integrations.families.AdapterSpec` with an op for ``spec``'s MLP layout whose layer class
    ``module``'s gate (or fused gate-up) projection is (None when there is none, or for experts and non-gated MLPs)."""
    if spec.experts or not spec.gated:
        return None
    first = getattr(module, projection_names(spec)[0], None)
    for a in ADAPTERS:
        mod = sys.modules.get(a.module)
        cls = getattr(mod, a.cls, None) if mod is not None and adapter_op(a, spec) else None
        if cls is not None and isinstance(first, cls):
            return a
    return None


def mlp_problem(module, spec: MLPSpec, lora_enabled: bool = True) -> str | None:
    """Why the patched MLP ``module`` with adapter layers on its projections does not run as one fused node
    (None when it does); for the report, at patch time."""
    adapter = mlp_adapter(module, spec)
    if adapter is None:
        return f"its {projection_names(spec)[0]} projection is not an adapter layer"
    mod = sys.modules[adapter.module]
    cls = getattr(mod, adapter.cls)
    names = projection_names(spec)
    bare = [n for n in names if not isinstance(getattr(module, n, None), cls)]
    if bare:
        return f"{', '.join(bare)} carr{'ies' if len(bare) == 1 else 'y'} no {adapter.cls} adapter layer"
    if not lora_enabled:
        return f"tigon.patch(..., {adapter.kind}=False) leaves its adapter layers to PEFT"
    if spec.multipliers is not None:
        return (f"the MLP's multipliers ({', '.join(spec.multipliers)}) are not taken by "
                f"tigon.functional.{adapter_op(adapter, spec)}")
    if spec.limit is not None:
        return (f"the MLP's clamp (self.{spec.limit}) is not taken by tigon.functional.{adapter_op(adapter, spec)}: "
                "its projections run as adapter layers, the clamped product as tigon.functional.swiglu(limit=...)")
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
    if spec.multipliers is not None or spec.limit is not None:
        return None
    projections = tuple(getattr(module, n) for n in projection_names(spec))
    names = []
    for m in projections:
        mk = tigon_mark(m.__dict__.get("forward"))
        if mk is None or mk.get("adapter") is None or _hook_problem(m, tigon_forward_ok=True) is not None:
            return None
        name = _fused_adapter(m, x)
        if name is None:
            return None
        names.append(name)
    *gate_side, (wd, ad, bd, cdn, sd) = (_parts(m, n) for m, n in zip(projections, names))
    activation = GLU_LINEAR_ACTIVATIONS[act]
    if under_checkpoint():
        if spec.gate_up is not None:
            gate, up = projections[0](x).chunk(2, dim=-1)
        else:
            gate, up = projections[0](x), projections[1](x)
        return _down_for_checkpoint(_glu(act, gate, up, inplace=True), wd, ad, bd, cdn, sd)
    if spec.gate_up is not None:
        ((w, a, b, c, s),) = gate_side
        return TF.lora_gate_up_mlp(x, w, a, b, wd, ad, bd, gate_up_bias=c, down_bias=cdn, gate_up_scaling=s,
                                   down_scaling=sd, activation=activation)
    (wg, ag, bg, cg, sg), (wu, au, bu, cu, su) = gate_side
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
    if spec.gate_up is not None:
        inner, lora_linears = f"*{spec.gate_up}(x).chunk(2, -1)", spec.gate_up
        how = ("the gate-up output one buffer whose halves the GLU reads and over which the backward writes their "
               "gradients")
    else:
        inner, lora_linears = f"{spec.gate}(x), {spec.up}(x)", f"{spec.gate} / {spec.up}"
        how = "the two A products of gate and up as one matmul"
    return (f"{spec.down}({act_name}({inner})) with their PEFT LoRA adapters as one "
            f"tigon.functional.{adapter_op(mlp_adapter(module, spec), spec)} node (base weights frozen; the product "
            f"recomputed in the backward, not stored; {how}); inside a non-reentrant activation checkpoint "
            f"{lora_linears} as lora_linear, the GLU, and {spec.down} as matmuls ordered so that the "
            "recomputation stops before its base matmul; the layers' own forwards at a call where an adapter is "
            "merged, disabled or has active dropout")
