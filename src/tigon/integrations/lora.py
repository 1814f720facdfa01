"""PEFT's LoRA layers through :func:`tigon.functional.lora_linear`: matching, the replacement forward, the reasons a
layer is left alone.

:func:`tigon.patch` on a model that contains PEFT LoRA layers (after ``peft.get_peft_model``) gives every
``peft.tuners.lora.layer.Linear`` it can fuse an instance-level ``forward`` that computes the base projection and
the adapter as one autograd node (LoRA, Hu et al. 2021; the unfused form is PEFT's
``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``).

Left alone at patch time, each reported with the reason (:func:`lora_problem`): a base layer that is not a plain
``torch.nn.Linear`` (quantised, GPT-2's Conv1D via ``fan_in_fan_out``), hooks on the base layer or the adapters
(the fused call would skip them), parameters that are tensor subclasses (DTensor, quantised), more than one active
adapter, DoRA or another LoRA variant, a bias on lora_B (``lora_bias``), ``lora_dropout > 0``, and adapter layers of
other kinds (Embedding, Conv).

Checked at every call, where PEFT's own forward then runs (:func:`_fused_adapter`): merged adapters
(``merge_adapter``; after ``unmerge_adapter`` the layer is fused again), disabled adapters (``disable_adapter()``),
extra arguments (``adapter_names`` for mixed batches), an adapter switched since patching (``set_adapter``) that
does not qualify, active dropout, hooks (or an instance-level ``forward``) on the base layer, A, B or the dropout
module added since patching or global ones (not for a DeepSpeed ZeRO-3 base weight), and dtypes that differ outside
``torch.autocast`` (PEFT keeps adapters in float32 for a bf16 model by default:
``get_peft_model(..., autocast_adapter_dtype=False)`` or autocast fuses them).
``merge_and_unload`` replaces the layers by their base ``nn.Linear``, and the patch goes with them.
"""

from __future__ import annotations

import functools
import sys

import torch

from .. import functional as TF
from .families import ADAPTERS, AdapterSpec
from .child_calls import _hook_problem
from .marks import mark
from .rotary_forwards import handed_output
from .sharded_head import zero3_param
from .family_spec import Match


def adapter_matches(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module, Match]]:
    """``(path, module, Match)`` for every adapter layer of :data:`~tigon.integrations.families.ADAPTERS` in
    ``model``; layers of the method's base class that are not the fused class carry the reason as ``problem``.
    Empty when the adapter library is not imported (then the model holds none of its layers)."""
    out = []
    for spec in ADAPTERS:
        mod = sys.modules.get(spec.module)
        cls = getattr(mod, spec.cls, None) if mod is not None else None
        if cls is None:
            continue
        base = getattr(mod, spec.base_class, cls)
        for path, m in model.named_modules():
            if isinstance(m, cls):
                out.append((path, m, Match(spec.kind, cls, spec, spec.module)))
            elif isinstance(m, base):
                why = (f"{type(m).__module__}.{type(m).__qualname__}: only {spec.module}.{spec.cls} over a plain "
                       "torch.nn.Linear is fused")
                out.append((path, m, Match(spec.kind, cls, spec, spec.module, problem=why)))
    return out


def _active(module) -> list[str]:
    active = getattr(module, "active_adapters", None)
    if active is None:
        active = getattr(module, "active_adapter", [])
    return [active] if isinstance(active, str) else list(active)


def _variant(module, name: str) -> str | None:
    """The LoRA variant of adapter ``name`` (``"DoRA (use_dora=True)"``, another variant's class), or None."""
    variant = getattr(module, "lora_variant", {}).get(name)
    if getattr(module, "use_dora", {}).get(name):
        return "DoRA (use_dora=True)"
    if variant is not None:
        return f"the LoRA variant {type(variant).__name__}"
    return None


def lora_problem(module) -> str | None:
    """Why the PEFT LoRA layer ``module`` is left alone by :func:`tigon.patch` (None when it is fused); see the
    module docstring."""
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear:
        return (f"its base layer is {type(base).__module__}.{type(base).__qualname__}, not a plain torch.nn.Linear "
                "(quantised layers, Conv1D)")
    if getattr(module, "fan_in_fan_out", False):
        return "fan_in_fan_out=True (a transposed, Conv1D-style weight)"
    active = _active(module)
    if len(active) != 1:
        return f"{len(active)} active adapters ({', '.join(active)}); the fused path runs exactly one"
    name = active[0]
    if name not in module.lora_A:
        return f"the active adapter {name!r} has no weights on this layer (PEFT runs the base layer alone)"
    variant = _variant(module, name)
    if variant is not None:
        return f"{variant}: only plain LoRA is fused"
    if module.lora_B[name].bias is not None or getattr(module, "lora_bias", {}).get(name):
        return "lora_bias=True (a bias on lora_B): not fused"
    rate = getattr(module.lora_dropout[name], "p", 0.0)
    if rate > 0:
        return (f"lora_dropout={rate:g}: the fused node has no dropout on the adapter's input (use lora_dropout=0, "
                "the usual setting for LLM fine-tuning)")
    for part, m in (("base_layer", base), ("lora_A", module.lora_A[name]), ("lora_B", module.lora_B[name])):
        problem = _hook_problem(m)
        if problem is not None:
            return f"{part}: {problem} (the fused call would skip it)"
        if not all(type(p) in (torch.Tensor, torch.nn.Parameter) for p in m.parameters()):
            return f"{part}: its parameters are tensor subclasses (DTensor, quantised)"
    return None


def _fused_adapter(module, x: torch.Tensor) -> str | None:
    """The adapter to fuse for this call of ``module`` on ``x``, or None: run PEFT's own forward (see the module
    docstring). Cheap attribute checks only: it runs for every LoRA layer in every step."""
    if module.merged or module.disable_adapters:
        return None
    active = _active(module)
    if len(active) != 1 or active[0] not in module.lora_A:
        return None
    name = active[0]
    if _variant(module, name) is not None or module.lora_B[name].bias is not None:
        return None
    dropout = module.lora_dropout[name]
    if dropout.training and getattr(dropout, "p", 0.0) > 0:
        return None
    # hooks added since patching (or global ones): the fused call would skip them. Not under DeepSpeed ZeRO-3, whose
    # hooks are on every module: its partitioned parameters are gathered when read inside this layer's call
    if not zero3_param(module.base_layer.__dict__["_parameters"].get("weight")):
        for part in (module.base_layer, module.lora_A[name], module.lora_B[name], dropout):
            if _hook_problem(part) is not None:
                return None
    dtype = module.base_layer.weight.dtype
    if x.dtype != dtype or module.lora_A[name].weight.dtype != dtype or module.lora_B[name].weight.dtype != dtype:
        dev = x.device.type
        if not (dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev)):
            return None
    return name


@functools.lru_cache(maxsize=None)
def lora_forward(spec: AdapterSpec, family: str, original):
    """``forward(self, x)`` of a PEFT ``lora.Linear``: :func:`tigon.functional.lora_linear` with the base layer's
    weight and bias and the active adapter's A, B and scaling, or ``original`` (PEFT's forward) for a call the
    fused node does not cover."""

    @functools.wraps(original)
    def forward(self, x, *args, **kwargs):
        handed = None if (args or kwargs) else handed_output(self, x)  # from the attention's q / k / v node
        if handed is not None:
            return handed
        name = None if (args or kwargs) else _fused_adapter(self, x)
        if name is None:
            return original(self, x, *args, **kwargs)
        base = self.base_layer
        return TF.lora_linear(x, base.weight, self.lora_A[name].weight, self.lora_B[name].weight, base.bias,
                              scaling=self.scaling[name])

    return mark(forward, spec.kind, family, adapter=spec)


def describe_lora(module) -> str:
    """What the patched layer computes, for the report (with the dtype caveat when adapters and base differ)."""
    text = ("tigon.functional.lora_linear(x, base W, A, B, scaling): base and adapter in one autograd node "
            "(PEFT's forward while merged, disabled or called with adapter_names)")
    if module is None:
        return text
    name = _active(module)[0]
    base, a = module.base_layer.weight.dtype, module.lora_A[name].weight.dtype
    if a != base:
        text += (f"; adapters {str(a).removeprefix('torch.')} and base {str(base).removeprefix('torch.')}: fused "
                 "only under torch.autocast, PEFT's forward otherwise")
    return text
