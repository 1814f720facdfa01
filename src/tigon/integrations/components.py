"""The engine's per-kind dispatch: which parts of a family spec are patched (``components``), what replaces each
(``factory``), how the report describes it (``describe``) and which ops it runs (``ops``), and why a module cannot
take it (``problem``).

A new kind of replacement (a new :class:`~tigon.integrations.families.FamilySpec` part) is a case in each of these.
"""

from __future__ import annotations

import importlib

from . import decoder_layer as dl
from . import lora
from .act_linear_forwards import act_linear_forward
from .causal_lm import causal_lm_forward, head_problem, uses_default_loss
from .families import ROPE_LAYOUTS, FamilySpec, Unsupported
from .mlp_activations import mlp_activation
from .mlp_forwards import describe_mlp, experts_gate, mlp_forward, mlp_ops, mlp_problem
from . import moe_experts
from .norm_forwards import norm_forward, norm_problem


def attr(comp) -> str:
    """The attribute a component's replacement is set on: ``forward``, or ``_apply_gate`` for MoE experts."""
    return getattr(comp, "patch_attr", "forward")


def resolve_class(mod, name: str):
    """The class ``name`` names for a spec of the modeling module ``mod``: ``mod.<name>``, or for a dotted name
    (``"torch.nn.LayerNorm"``) that shared class; None when it does not exist."""
    if "." not in name:
        return getattr(mod, name, None)
    where, _, attr_name = name.rpartition(".")
    try:
        return getattr(importlib.import_module(where), attr_name, None)
    except ImportError:
        return None


def class_level_problem(kind: str, comp, cls: type) -> str | None:
    """Why a class-level patch leaves the class ``cls`` of a component alone (None when it patches it): a shared
    class outside the family's modeling module (a dotted name in the spec), a non-gated MLP without a declared
    activation module (:attr:`~tigon.integrations.family_spec.MLPSpec.act`), or a class the family
    declares unsupported (:class:`~tigon.integrations.family_spec.Unsupported`: its reason)."""
    if isinstance(comp, Unsupported):
        return comp.reason
    if "." in getattr(comp, "cls", ""):
        return (f"{cls.__module__}.{cls.__qualname__} is not the family's own class (every model uses it): a "
                "class-level patch never changes it; patch a built model (tigon.patch(model)) to replace its "
                "instances there")
    if kind == "mlp" and not comp.gated:
        return mlp_problem(None, comp)
    return None


def components(spec: FamilySpec, enabled: dict[str, bool]):
    """(kind, class name, component spec) for each enabled class-based part of the spec, the classes it declares
    unsupported (:class:`~tigon.integrations.family_spec.Unsupported`, reported as skipped) last."""
    out = []
    for ns in spec.norms:
        out.append((ns.kind, ns.cls, ns))
    for ms in spec.mlps:
        out.append(("mlp", ms.cls, ms))
    for ds in spec.decoder_layers:
        out.append(("fused_add_rms_norm", ds.cls, ds))
    for hs in spec.heads:
        out.append(("lm_head_loss", hs.cls, hs))
    for us in spec.unsupported:
        out.append((us.kind, us.cls, us))
    return [c for c in out if enabled[c[0]]]


def factory(kind: str, comp, family: str, family_module: str, original, opts: dict, attr: str | None = None):
    """The Tigon function that replaces ``original`` (the class's attribute ``attr``; None: the component's own,
    :func:`attr`) for a component of ``kind``. An MoE experts module has two: its ``_apply_gate`` hook and, where
    the glue applies (:func:`tigon.integrations.moe_experts.glue_problem`), its ``forward``."""
    if kind in ("rms_norm", "layer_norm"):
        return norm_forward(comp, family, original)
    if kind == "mlp":
        if comp.experts:
            if attr == "forward":
                return moe_experts.experts_forward(comp, family, original)
            return experts_gate(comp, family, original)
        if not comp.gated:
            return act_linear_forward(comp, family, original)
        return mlp_forward(comp, family, original)
    if kind == "fused_add_rms_norm":
        return dl.decoder_layer_forward(comp, family, original)
    if kind == "lora":
        return lora.lora_forward(comp, family, original)
    return causal_lm_forward(comp, family, family_module, original, opts["fused"], opts["ce"], opts["flce"])


def _head_weight(module, comp):
    """The weight of ``module``'s LM head Linear (``module`` a built causal LM), or None (a class at class level, no
    plain Linear head)."""
    from .causal_lm import effective_head, head_attr, head_owner

    if module is None or isinstance(module, type) or not hasattr(comp, "lm_head"):
        return None
    from .sharded_head import stored_param

    module = head_owner(module, comp)
    if module is None:
        return None
    linear, _ = effective_head(getattr(module, head_attr(module, comp), None))
    return None if linear is None else stored_param(linear, "weight")


def _fsdp2_head(module, comp) -> bool:
    """Whether ``module``'s LM head is an FSDP2 unit or inside one (``fully_shard`` applied before patching)."""
    from .causal_lm import effective_head, head_attr, head_owner
    from .sharded_head import fsdp_unit

    owner = None if module is None or isinstance(module, type) else head_owner(module, comp)
    head = getattr(owner, head_attr(owner, comp), None) if owner is not None else None
    linear, _ = effective_head(head)
    return linear is not None and (fsdp_unit(head, linear) is not None
                                   or bool(getattr(linear, "_is_fsdp_managed_module", False)))


def _tied_note(module, weight) -> str:
    """For a vocabulary-sharded head weight that is also the input embedding's: a note for the report."""
    get = getattr(module, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        emb = None
    if emb is not None and getattr(emb, "weight", None) is weight:
        return ("; tied to the input embedding, whose rows are split the same way: each rank's rows get the loss's "
                "gradient and the embedding's")
    return ""


def describe(kind: str, comp, module=None, opts=None) -> str:
    """What the replacement of a component of ``kind`` computes, for the report."""
    if kind == "rms_norm":
        op = "rms_norm_gated" if comp.gated else "rms_norm"
        text = f"tigon.functional.{op}(casting_mode={comp.casting_mode!r}, offset={comp.offset:g})"
        if comp.gated:  # the instance's groups and gate order (norm_forwards.gated_options)
            order = "norm_before_gate" if comp.norm_before_gate else "norm_before_gate (default False)"
            text += f", group_size and {order} from the module"
        return text
    if kind == "layer_norm":
        return "tigon.functional.layer_norm" + (f" (weight + {comp.offset:g})" if comp.offset else "")
    if kind == "mlp":
        gate = describe_mlp(module, comp, (opts or {}).get("lora", True))
        return moe_experts.describe(module, comp, gate) if comp.experts and module is not None else gate
    if kind == "fused_add_rms_norm":
        return dl.describe_decoder_layer(comp)
    if kind == "lora":
        return lora.describe_lora(module)
    parts = []
    if opts["fused"]:
        args = f"({', '.join(f'{k}={v}' for k, v in opts['flce'])})" if opts["flce"] else ""
        from .sharded_head import vocab_sharded, zero3_param

        weight = _head_weight(module, comp)
        if weight is not None and _fsdp2_head(module, comp):  # sharded by FSDP2, whatever its placements
            parts.append(f"training with labels: tigon.functional.fused_linear_cross_entropy{args} on the LM head's "
                         "weight as FSDP2 gathers it (in the forward of the unit holding the head: the root's, or "
                         "its own unit's, run around the loss); vocab-parallel (tigon.functional."
                         "vocab_parallel_fused_linear_cross_entropy) where the gathered weight is a tensor-parallel "
                         "shard of vocabulary rows (FSDP2 over TP) (logits=None)")
        elif weight is not None and vocab_sharded(weight):
            parts.append(f"training with labels: tigon.functional.vocab_parallel_fused_linear_cross_entropy, "
                         f"vocab-parallel over {weight.device_mesh.size()} ranks (the LM head is split by vocabulary "
                         f"rows, ColwiseParallel: no logits gathered; logits=None{_tied_note(module, weight)})")
        elif weight is not None and zero3_param(weight):
            parts.append(f"training with labels: tigon.functional.fused_linear_cross_entropy{args} run as the LM "
                         "head Linear's forward, so DeepSpeed ZeRO-3's hooks gather its partitioned weight for the "
                         "loss and its backward, as for lm_head(hidden) (logits=None)")
        else:
            parts.append(f"training with labels: tigon.functional.fused_linear_cross_entropy{args} (logits=None)")
    if opts["ce"]:
        parts.append("materialised logits with labels: tigon.functional.cross_entropy")
    if opts["fused"] and getattr(comp, "inner", None) is not None:
        inner = getattr(module, comp.inner, None) if module is not None and not isinstance(module, type) else None
        cls = f" ({type(inner).__name__})" if inner is not None else ""
        parts.append(f"its {comp.inner}{cls} hands this forward its last hidden states in the logits' place for the "
                     f"fused loss on {comp.inner}.{comp.lm_head} (its forward patched with this one)")
    return "; ".join(parts) + "; otherwise the original forward"


def ops(kind: str, comp, module=None, opts=None) -> tuple[str, ...]:
    """The :mod:`tigon.functional` op(s) the replacement of a component of ``kind`` runs (see
    :attr:`~tigon.integrations.report.PatchEntry.ops`)."""
    if kind == "rope":
        return (rope_op(comp),)
    if kind == "rms_norm" and comp.gated:
        return ("rms_norm_gated",)
    if kind in ("rms_norm", "layer_norm", "fused_add_rms_norm"):
        return (kind,)
    if kind == "mlp":
        if comp.experts and module is not None and experts_glue(comp, module):
            return moe_experts.MOE_OPS
        return mlp_ops(module, comp, (opts or {}).get("lora", True))
    if kind == "lora":
        return ("lora_linear",)
    return (("fused_linear_cross_entropy",) if opts["fused"] else ()) + (("cross_entropy",) if opts["ce"] else ())


def experts_glue(comp, module) -> bool:
    """Whether the MoE experts ``module`` (a built one) also gets the glue forward
    (:func:`tigon.integrations.moe_experts.experts_forward`) beside its ``_apply_gate`` patch."""
    return bool(getattr(comp, "experts", False)) and moe_experts.glue_problem(module, comp) is None


def checkpoint_ops(kind: str, comp, module=None, opts=None) -> tuple[str, ...] | None:
    """The op(s) the replacement runs instead inside a non-reentrant activation checkpoint (see
    :attr:`~tigon.integrations.report.PatchEntry.checkpoint_ops`; () for none: the original forward); None when
    they are :func:`ops`'s."""
    run = mlp_ops(module, comp, (opts or {}).get("lora", True)) if kind == "mlp" else ()
    if run == ("glu_linear",):
        return (mlp_activation(module, comp)[0],)
    if run in (("lora_glu_mlp",), ("lora_gate_up_mlp",)):
        return ("lora_linear", mlp_activation(module, comp)[0])
    if run == ("act_linear",):  # (act_linear_forward runs the original forward under a checkpoint)
        return ()
    return None


def problem(kind: str, comp, module, opts) -> str | None:
    """Why ``module`` cannot take the replacement of a component of ``kind`` (None when it can)."""
    if kind in ("rms_norm", "layer_norm"):
        return norm_problem(module, comp)
    if kind == "mlp":
        return mlp_problem(module, comp)
    if kind == "fused_add_rms_norm":
        return dl.decoder_layer_problem(module, comp)
    if kind == "lora":
        return lora.lora_problem(module)
    if opts["fused"]:
        p = head_problem(module, comp)
        if p is None or not opts["ce"] or not uses_default_loss(module):
            return p
        return None  # head not fusable, but the cross-entropy path still applies
    return None if uses_default_loss(module) else "the model has a custom loss_function / loss_type; its loss is kept"


def rope_off(comp, config) -> bool:
    """Whether the model of ``config`` replaces rotary altogether (the spec's ``off_config_attr``, Falcon's
    ``alibi``)."""
    return comp.off_config_attr is not None and bool(getattr(config, comp.off_config_attr, False))


def rope_problem(spec: FamilySpec, mod) -> str | None:
    """Why the family's rotary function (in its modeling module ``mod``) cannot be routed to Tigon, or None: a
    layout no Tigon op takes, or none of its functions (:meth:`RopeSpec.candidates`) in this transformers."""
    from .rotary_layouts import ROPE_OPS

    for c in spec.rope.candidates():
        if c.layout not in ROPE_OPS:
            why = ROPE_LAYOUTS.get(c.layout, f"no Tigon rotary op takes layout {c.layout!r}")
            return f"layout {c.layout!r} is not supported ({why}); the family's rotary function is left alone"
    if not rope_candidates(spec.rope, mod):
        return "function not found in this transformers"
    return None


def rope_candidates(rope, mod) -> tuple:
    """The single-function specs of ``rope`` (:meth:`RopeSpec.candidates`) whose function ``mod`` has."""
    return tuple(c for c in rope.candidates() if callable(getattr(mod, c.function, None)))


def rope_for(rope, module, mod):
    """The single-function spec of ``rope`` that the attention instance ``module`` calls: among those ``mod`` (its
    modeling module) has, the first its forward calls for this instance (:func:`rotary_calls.reach`), else the
    first (the engine then reports what the forward calls instead)."""
    from . import rotary_calls

    found = rope_candidates(rope, mod) or (rope,)
    if len(found) > 1:
        for c in found:
            reached = rotary_calls.reach(module, c.function)
            if reached is not None and c.function in reached.called:
                return c
    return found[0]


def rope_op(rope) -> str:
    """The :mod:`tigon.functional` op a single-function rotary spec's calls run."""
    from .rotary_layouts import ROPE_OPS

    return ROPE_OPS.get(rope.layout, "rope")


def partial_rotary_factor(config) -> float:
    """The fraction of the head dim that is rotated (``partial_rotary_factor``, or GPT-NeoX's ``rotary_pct``, in the
    config (object or dict) or its ``rope_parameters`` / ``rope_scaling``), 1.0 when absent."""
    get = (lambda h, k: h.get(k)) if isinstance(config, dict) else (lambda h, k: getattr(h, k, None))
    for holder in (config, get(config, "rope_parameters"), get(config, "rope_scaling")):
        if holder is None:
            continue
        for key in ("partial_rotary_factor", "rotary_pct"):
            v = holder.get(key) if isinstance(holder, dict) else getattr(holder, key, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
    return 1.0
