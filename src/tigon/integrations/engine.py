"""The one patch engine: applies any :class:`~tigon.integrations.families.FamilySpec` to a model or a family.

Two levels:

instance (``patch(model)``)
    For every submodule that is an instance of a spec'd class (and does not override the replaced attribute), an
    instance attribute is set to the Tigon function bound to that module: ``forward``, or for v5 MoE experts
    modules the ``_apply_gate`` hook, and their ``forward`` too where Tigon's glue around the grouped matmuls applies
    (:mod:`tigon.integrations.moe_experts`). Nothing outside the model changes, except the rotary function (below)
    and the ``kernel_condition`` of classes prepared for hub kernels (:mod:`tigon.integrations.hub_kernels`).
    ``unpatch(model)`` deletes those instance attributes, so the class's own are in effect again. Every registered
    family whose classes the model contains is applied (a vision-language model's container, language model and
    vision tower may be three), each module by the first family that claims it; ``report.family`` is the outermost
    (a container of no family: its own model type, ``"llava_next_video (no family)"``; see ``plan.family_label``).
    A model of no registered family goes through the generic matcher (:mod:`tigon.integrations.generic`): the same
    machinery, with per-module specs found by numerical probes instead of class names.

class (``patch("llama")``)
    The spec'd classes of the family's modeling module get ``forward`` (``_apply_gate``) replaced on the class
    itself (so every model of that family, built before or after, runs Tigon), and the module-global rotary
    function routes to Tigon. ``unpatch("llama")`` puts back exactly what was there (deleting the attribute where
    the class had inherited it).

How rope is scoped at instance level
    Attention classes call the *module-global* ``apply_rotary_pos_emb`` of their modeling module, so there is no
    per-instance hook. Tigon installs a dispatcher in that global while any patched model of the family is alive
    (tracked with a WeakSet of patched attention modules), and gives every patched attention instance a
    ``forward`` that marks a thread-local "rope scope" around the class's forward. The dispatcher calls
    :func:`tigon.functional.rope` only inside that scope (or when the family is patched at class level); other
    models of the same family, patched or not, get the original function. When the last patched attention module
    is unpatched, or garbage collected (noticed at the next patch / unpatch call, or :func:`release_unused`), the
    original global is put back. A patched attention instance the switch does not know (a ``copy.deepcopy`` or
    ``torch.load`` of a patched model) registers itself on its first forward (:class:`RopeTarget`).

Shared classes (``torch.nn.LayerNorm`` in the LayerNorm families, named by a dotted name in the spec) are patched per
model only: their instances inside the model, never the class.

Adapters (PEFT LoRA, :mod:`tigon.integrations.lora`) are matched at instance level in any model, beside the family's
(or the generic matcher's) parts: ``tigon.patch(model)`` after ``get_peft_model``. Patched before PEFT wraps the
model, its LoRA layers do not exist yet: call ``tigon.patch`` again after ``get_peft_model`` (the second call adds
them and lists the rest as already patched). Class-level patches never touch the adapter library's classes.

Copies: instance-level patches survive ``copy.deepcopy`` and pickling (:mod:`tigon.integrations.persist`).

Refusals are per model, with the reason in the report: a rotary layout other than rotate-half (GLM's interleaved
pairs), partial rotary (``partial_rotary_factor < 1``) in a family not declared to handle it
(:attr:`~tigon.integrations.families.RopeSpec.partial_rotary`), an attention module whose forward calls
another rotary function instead for its configuration (DeepSeek-V3's ``apply_rotary_pos_emb_interleave`` under
``rope_interleave``; read from its source, :mod:`tigon.integrations.rotary_calls`), NoPE layers (nothing to patch), the
``eager`` experts loop, an LM head that is not one weight (a LoRA layer on it; PEFT's ``modules_to_save`` copy is
used), has hooks the fused loss would skip, or whose weight the fused loss cannot read whole (a DTensor outside
FSDP2 not split by vocabulary rows; an FSDP2 unit is read inside its hooks, a DeepSpeed ZeRO-3 head inside its own
call: :mod:`tigon.integrations.sharded_head`), activations without a kernel, non-gated MLPs whose
down projection does not fold into ``act_linear`` (a LoRA or quantised layer; a lone activation gains nothing), custom
losses, and the classes a family declares unsupported with the reason
(:class:`~tigon.integrations.family_spec.Unsupported`: GPT-OSS's clamped SwiGLU experts, gated RMSNorms, ...).

Never touched: ``torch.nn``, the classes and globals of other families, anything when ``strict=True`` finds a
problem (the plan is checked before anything is applied).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping

import torch

from . import causal_mask, components, hub_kernels, persist
from . import attention_patches, lora_qkv, rotary_calls, sink_attention
from .causal_lm import check_accum_dtype
from .families import FAMILIES, FamilySpec, Unsupported, family_by_module, family_by_name
from .family_spec import Match
from .generic import generic_matches
from .class_level import CLASS_STATE, plan_class, turned_off_note
from .lora import adapter_matches
from .marks import tigon_mark
from .plan import (MISSING, Action, already_patched_entry, check_options, existing_patch, family_label, held_heads,
                   import_family, inner_head, note_residual_adds, undeclared_head, unpatched_family)
from .report import PatchEntry, PatchReport, compile_note
from .rotary_switch import LOCK as _LOCK
from .rotary_switch import SWITCHES, RopeTarget

OPTION_KINDS = ("rms_norm", "layer_norm", "mlp", "rope", "sinks", "vision_attention", "fused_add_rms_norm",
                "lm_head_loss", "lora")
PATCH_KEYWORDS = {**{k: k for k in OPTION_KINDS}, "lm_head_loss": "fused_linear_cross_entropy"}
"""Patch kind -> the :func:`patch` keyword that turns it on or off (``patch(model, mlp=False)``)."""

# ---- rotary switch (tigon.integrations.rotary_switch) ----------------------------------------------------
def release_unused() -> list[str]:
    """Put back every rotary global that no live patched model needs (patched models that were garbage collected
    without :func:`unpatch`). Runs at the start of every patch / unpatch; returns the restored qualnames."""
    with _LOCK:
        causal_mask.release()
        hub_kernels.release()
        return [sw.qualname for sw in list(SWITCHES.values()) if sw.release()]


# ---- planning --------------------------------------------------------------------------------------------------
# Attributes the engine ever sets on instances / classes (unpatch looks for Tigon marks on exactly these).
PATCH_ATTRS = ("forward", "_apply_gate")


def _family_matches(model: torch.nn.Module, spec: FamilySpec, enabled: dict, report: PatchReport):
    """Matches of the spec's classes in ``model`` (class-not-found and rope problems go to the report)."""
    mod = import_family(spec)
    classes = []
    for kind, name, comp in components.components(spec, enabled):
        cls = components.resolve_class(mod, name)
        if cls is None:
            report.skipped.append(PatchEntry(kind, f"{spec.module}.{name}", "class not found in this transformers"))
        else:
            classes.append((kind, cls, comp))
    attn_classes = []
    if enabled["rope"] and spec.rope is not None:
        problem = components.rope_problem(spec, mod)
        if problem is not None:
            report.skipped.append(PatchEntry("rope", f"{spec.module}.{spec.rope.function}", problem))
        else:
            for name in spec.rope.attention_classes:
                cls = getattr(mod, name, None)
                if cls is None:
                    report.skipped.append(PatchEntry("rope", f"{spec.module}.{name}", "class not found"))
                else:
                    attn_classes.append(cls)
    matches = []
    for path, m in model.named_modules():
        hit = next(((k, c, comp) for k, c, comp in classes if isinstance(m, c)), None)
        if hit is not None:
            why = hit[2].reason if isinstance(hit[2], Unsupported) else None
            matches.append((path, m, Match(hit[0], hit[1], hit[2], spec.module, why)))
            continue
        cls = next((c for c in attn_classes if isinstance(m, c)), None)
        if cls is not None:
            matches.append((path, m, Match("rope", cls, spec.rope, spec.module)))
    wanted = {k for k, _, _ in classes} | ({"rope"} if attn_classes else set())
    return matches, wanted


def _plan_matches(matches, family: str, opts: dict, report: PatchReport):
    """Turn matches into actions (or skipped / already-patched entries); nothing is changed here."""
    actions: list[Action] = []
    no_rope = 0
    rope_off: dict[str, int] = {}  # RopeSpec.off_config_attr -> attention modules it turns rotary off in
    rope_globals: set[str] = set()  # the rotary globals the planned rope actions dispatch
    qkv_apart: dict[str, int] = {}  # why attention modules with q / k / v adapters keep them apart -> how many
    for path, m, match in matches:
        kind, cls, comp = match.kind, match.cls, match.comp
        target = path or f"({type(m).__name__})"
        if match.problem is not None:
            report.skipped.append(PatchEntry(kind, target, match.problem))
            continue
        attr = components.attr(comp)
        state, why = existing_patch(m, cls, attr, target, opts)
        if state == "skip":
            report.skipped.append(PatchEntry(kind, target, why))
            continue
        if state in ("class", "instance"):  # with what it runs with adapter layers added since, or why not
            report.already_patched.append(already_patched_entry(state, kind, target, m, comp, match.family_module,
                                                                opts))
            continue
        if kind == "rope":
            comp = components.rope_for(comp, m, sys.modules.get(match.family_module))
            if comp.enabled_attr is not None and not getattr(m, comp.enabled_attr, True):
                no_rope += 1
                continue
            config = getattr(m, "config", None)
            if components.rope_off(comp, config):
                rope_off[comp.off_config_attr] = rope_off.get(comp.off_config_attr, 0) + 1
                continue
            reached = rotary_calls.reach(m, comp.function)
            if reached is not None and comp.function not in reached.called:
                if not reached.called:  # a NoPE layer: no rotary call at all
                    no_rope += 1
                    continue
                why = "; ".join(reached.decided) or "as its source reads"
                report.skipped.append(PatchEntry(kind, target, (
                    f"{type(m).__name__}.forward calls {', '.join(sorted(reached.called))} here, not "
                    f"{comp.function} ({why}); Tigon's rotary ops replace only {comp.function}, left alone")))
                continue
            factor = components.partial_rotary_factor(config)
            if factor < 1.0 and not comp.partial_rotary:
                report.skipped.append(PatchEntry(kind, target, f"partial rotary (partial_rotary_factor={factor:g}): "
                                                 f"the {family} family's rotary code is not declared to handle it "
                                                 "as tigon.functional.rope does (RopeSpec.partial_rotary)"))
                continue
            sw = SWITCHES.get((match.family_module, comp.function))
            if sw is not None and sw.class_level:
                report.already_patched.append(already_patched_entry("class", kind, target, m, comp,
                                                                    match.family_module, opts))
                continue
            fn = persist.build(persist.Recipe("forward", kind, comp, family, match.family_module), type(m).forward)
            op = components.rope_op(comp)
            detail = f"{comp.function} -> tigon.functional.{op} inside this module (scoped dispatcher)"
            if factor < 1.0:
                detail += (f"; partial rotary (partial_rotary_factor={factor:g}): the first rotary_dim dims of each "
                           "head rotated, the rest passed through, in the same kernel")
            ops = (op,)
            qkv = lora_qkv.describe(m, comp, opts.get("lora", True))
            if qkv is not None:  # q / k / v are adapter layers: one node with the rotary, or why not
                ops, detail = qkv[0] or ops, f"{detail}; {qkv[1]}"
                if not qkv[0]:
                    qkv_apart[qkv[1]] = qkv_apart.get(qkv[1], 0) + 1
            rope = RopeTarget(match.family_module, comp.function, family, comp.partial_rotary, comp.layout,
                              comp.head_axis)
            rope_globals.add(f"{match.family_module}.{comp.function}")
            actions.append(Action(PatchEntry(kind, target, detail, ops), _rope_instance_apply(m, fn, rope)))
            continue
        problem = components.problem(kind, comp, m, opts)
        inner = inner_fn = None
        if problem is None and kind == "lm_head_loss" and getattr(comp, "inner", None) is not None:
            inner, inner_fn, problem = inner_head(comp, match, family, opts)
        if problem is not None:
            report.skipped.append(PatchEntry(kind, target, problem))
            continue
        fn = persist.build(persist.Recipe(attr, kind, comp, family, match.family_module, opts), getattr(type(m), attr))
        entry = PatchEntry(kind, target, components.describe(kind, comp, m, opts), components.ops(kind, comp, m, opts),
                           components.checkpoint_ops(kind, comp, m, opts))
        binds = [(attr, fn)]
        if kind == "mlp" and components.experts_glue(comp, m):  # MoE experts: the glue forward beside _apply_gate
            binds.append(("forward", persist.build(persist.Recipe("forward", kind, comp, family, match.family_module,
                                                                  opts), type(m).forward)))
        more = [(inner, [("forward", inner_fn)])] if inner_fn is not None else []  # (the LM the head runs in)
        actions.append(Action(entry, _bind_all(m, binds, *more)))
    if no_rope:
        report.notes.append(f"rope: {no_rope} attention module(s) apply no rotary embedding (NoPE layers); "
                            "nothing to patch there")
    for attr, n in rope_off.items():
        report.notes.append(f"rope: config.{attr} is set: {n} attention module(s) use no rotary embedding (e.g. "
                            "Falcon's ALiBi biases instead); nothing to patch there")
    for why, n in qkv_apart.items():
        report.notes.append(f"rope: {n} attention module(s): {why}; each runs lora_linear, then rope")
    if rope_globals:
        report.notes.append(
            f"rope: {', '.join(sorted(rope_globals))} is a dispatcher while patched models are alive; it runs "
            "Tigon's rotary op only inside patched attention modules, other models get the original")
    return actions


def _plan_instance(model: torch.nn.Module, spec: FamilySpec, enabled: dict, opts: dict, report: PatchReport,
                   forced: bool = False):
    """The actions of an instance-level patch with ``spec`` and, unless ``forced`` (``family=`` given), of every other
    registered family whose classes the model contains (the towers of a vision-language model: the language model's
    family, the vision encoder's). Each module is matched by the first family that claims it."""
    specs = [spec] if forced else [spec] + [s for s in _find_families(model) if s is not spec]
    seen_modules: set[int] = set()
    actions, seen, wanted = [], set(), set()
    for sp in specs:
        matches, want = _family_matches(model, sp, enabled, report)
        matches = [mt for mt in matches if id(mt[1]) not in seen_modules]
        seen_modules.update(id(mt[1]) for mt in matches)
        if forced and not matches and any(enabled.values()):
            raise TypeError(f"tigon.patch: family {sp.name!r} matched nothing in {type(model).__name__} (from "
                            f"{type(model).__module__}): none of its module classes is in it; leave family= unset "
                            "to detect the family, or use family='generic'")
        actions += _plan_matches(held_heads(model, matches, report), sp.name, opts, report)
        seen |= {mt.kind for _, _, mt in matches}
        wanted |= want
        if sp.rope is not None or sp.decoder_layers:  # no residual-add note for vision towers / containers
            note_residual_adds(sp, enabled, report)
    for kind in sorted(wanted - seen):
        head = undeclared_head(model, specs) if kind == "lm_head_loss" and not forced else None
        if head is not None:
            report.skipped.append(head)
        else:
            report.notes.append(f"{kind}: no matching module in this model")
    if len(specs) > 1 or family_label(model, spec, forced) != spec.name:  # (a container of no family: its towers')
        where = {sp.name: _family_paths(model, sp) for sp in specs}
        report.notes.append("families: " + "; ".join(f"{name} ({', '.join(paths) or 'no module'})"
                                                     for name, paths in where.items()))
    return actions


def _family_paths(model: torch.nn.Module, spec: FamilySpec, limit: int = 3) -> list[str]:
    """The outermost module paths of ``model`` whose classes come from the family's modeling module (at most
    ``limit``; ``"(root)"`` for the model itself)."""
    paths: list[str] = []
    for path, m in model.named_modules():
        if type(m).__module__ != spec.module or "" in paths or any(path.startswith(p + ".") for p in paths):
            continue
        paths.append(path)
        if len(paths) == limit:
            break
    return [p or "(root)" for p in paths]


def _plan_generic(model: torch.nn.Module, enabled: dict, opts: dict, report: PatchReport):
    result = generic_matches(model, enabled)
    for kind, target, reason in result.skipped:
        report.skipped.append(PatchEntry(kind, target, reason))
    actions = _plan_matches(result.matches, "generic", opts, report)
    report.notes.append("generic matcher: each module was replaced only after a numerical probe against the "
                        "original (see tigon.integrations.generic)")
    note_residual_adds(None, enabled, report)
    return actions


def _bind_all(module, binds, *more):
    """The action binding each ``(attr, fn)`` of ``binds`` on ``module``, then each of ``more``'s ``(module, binds)``
    (an LM head's inner causal LM, :func:`~tigon.integrations.plan.inner_head`)."""
    def apply():
        for mod, pairs in ((module, binds), *more):
            for attr, fn in pairs:
                setattr(mod, attr, types.MethodType(fn, mod))
            hub_kernels.guard(mod)  # (a class prepared for hub kernels: kernelize keeps the forward)
            persist.keep_on_replicas(mod)  # (DataParallel replicas run these methods on themselves)
    return apply


def _rope_instance_apply(module, fn, rope: RopeTarget):
    def apply():
        rope.ensure(module)
        module.forward = types.MethodType(fn, module)
        hub_kernels.guard(module)
        persist.keep_on_replicas(module)
    return apply


# ---- public entry points ---------------------------------------------------------------------------------------
def _find_families(model: torch.nn.Module) -> list[FamilySpec]:
    """The registered families whose classes ``model`` contains, in module order (the model's own first)."""
    found: list[FamilySpec] = []
    for m in model.modules():
        spec = family_by_module(type(m).__module__)
        if spec is not None and spec not in found:
            found.append(spec)
    return found


def _find_family(model: torch.nn.Module) -> FamilySpec | None:
    """The family of the outermost module of a registered family (the model's family), or None."""
    return next(iter(_find_families(model)), None)


def _resolve(obj, verb: str, family: str | None = None) -> tuple[FamilySpec | None, str]:
    """(spec, level); spec None means the generic matcher (a model of no registered family, or family="generic")."""
    if family is not None and not isinstance(family, str):
        raise TypeError(f"tigon.{verb}: family must be a family name (str) or None, got {type(family).__name__}")
    if isinstance(obj, str):
        if family is not None:
            raise TypeError(f"tigon.{verb}: family= is only for models; got the family name {obj!r} already")
        return family_by_name(obj), "class"
    if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
        if family is not None:
            raise TypeError(f"tigon.{verb}: family= is only for models; got the class {obj.__name__}")
        # a user's subclass (class MyLlama(LlamaForCausalLM)) belongs to the family of its transformers base
        spec = next((s for s in map(family_by_module, (c.__module__ for c in obj.__mro__)) if s is not None), None)
        if spec is None:
            raise ValueError(f"tigon.{verb}({obj.__name__}): the class (from {obj.__module__}) belongs to no "
                             f"registered family (supported: {', '.join(sorted(FAMILIES))}), and class-level "
                             "patching works by family; instance-level patching of a built model also covers other "
                             "architectures (the generic matcher).")
        return spec, "class"
    if isinstance(obj, torch.nn.Module):
        if family is None:
            return _find_family(obj), "instance"
        if family.lower() == "generic":
            return None, "instance"
        return family_by_name(family), "instance"
    got = f"the class {obj.__name__}" if isinstance(obj, type) else type(obj).__name__
    raise TypeError(f"tigon.{verb} expects a torch.nn.Module, a model class or a family name "
                    f"({', '.join(sorted(FAMILIES))}), got {got}")


def _nothing_matched(model, report: PatchReport) -> TypeError:
    why = ""
    if report.skipped:
        shown = "; ".join(f"{e.kind} {e.target}: {e.detail}" for e in report.skipped[:3])
        more = f" (+{len(report.skipped) - 3} more)" if len(report.skipped) > 3 else ""
        why = f"; generic candidates rejected: {shown}{more}"
    return TypeError(
        f"tigon.patch: {type(model).__name__} (from {type(model).__module__}) contains no module of a supported model "
        f"family (supported families: {', '.join(sorted(FAMILIES))}) and nothing the generic matcher recognises "
        f"(RMSNorm-like norms, gated MLPs, rotate-half rotary){why}")


def patch(
    model_or_family,
    *,
    rms_norm: bool = True,
    rope: bool = True,
    mlp: bool = True,
    layer_norm: bool = True,
    fused_add_rms_norm: bool = True,
    fused_linear_cross_entropy: bool | Mapping = True,
    cross_entropy: bool = False,
    lora: bool = True,
    sinks: bool = True,
    vision_attention: bool = True,
    strict: bool = False,
    family: str | None = None,
) -> PatchReport:
    """Route a Hugging Face model (or a whole model family) through Tigon's kernels.

    Args:
        model_or_family: a built ``torch.nn.Module`` (e.g. ``LlamaForCausalLM``, or a wrapper containing one):
            instance-level patch of that model only; or a family name (``"llama"``, see
            :data:`tigon.integrations.FAMILIES`) or a model class of one (``LlamaForCausalLM``): class-level patch
            of the family's modeling module, affecting every model of that family, including those built later
            (call it before ``from_pretrained``).
        rms_norm, layer_norm: replace the family's norm forwards by :func:`tigon.functional.rms_norm` /
            :func:`tigon.functional.layer_norm` (with the module's own weight, bias and epsilon).
        mlp: replace gated MLP forwards by ``down(swiglu|geglu(gate(x), up(x)))``, chosen by the config's
            activation; activations without a kernel are skipped (instance) or run the original (class); non-gated
            MLPs ``down(act(up(x)))`` (GPT-NeoX, phi, Falcon, Nemotron, the CLIP / SigLIP vision towers) by
            :func:`tigon.functional.act_linear`, the activation named by the class of the module's activation.
        rope: route the family's rotary function to :func:`tigon.functional.rope` (scoping: see the module docs).
        sinks: (GPT-OSS: attention with a learned sink logit per head) run the model's eager sink attention on
            torch's ``scaled_dot_product_attention`` with the sink folded into an extra key
            (:mod:`tigon.integrations.sink_attention`: the model config's ``_attn_implementation`` becomes
            ``"tigon_sink_sdpa"``, with transformers' sdpa masks); instance level only, eager models only.
        vision_attention: (Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE), GLM-4V(-MoE)) run the vision tower's packed
            attention, which transformers' sdpa / eager path calls once per image / frame / window, as one call per
            distinct chunk length (:mod:`tigon.integrations.varlen_attention`: the vision config's
            ``_attn_implementation`` becomes ``"tigon_varlen_flash_sdpa"`` / ``"tigon_varlen_flash_eager"``);
            instance level only, sdpa and eager towers only.
        fused_add_rms_norm: in decoder layers of Llama's pre-norm form (the family's
            :class:`~tigon.integrations.families.DecoderLayerSpec`, checked against the layer's source), compute the
            residual add after attention and the post-attention RMSNorm as one
            :func:`tigon.functional.fused_add_rms_norm` (one pass over the hidden states instead of two).
        fused_linear_cross_entropy: in training with ``labels``, compute the LM head and HF's causal-LM loss with
            :func:`tigon.functional.fused_linear_cross_entropy`; ``output.logits`` is None then. Without labels or
            in eval mode the original forward runs and logits are returned as before. A dict turns it on with
            keyword options for that function; the allowed keys are :data:`~tigon.integrations.causal_lm.FLCE_OPTIONS`:
            ``accum_dtype`` (``None`` / ``torch.float32``: grad_weight accumulated in fp32, the default; the LM head's
            dtype, e.g. ``{"accum_dtype": torch.bfloat16}``: accumulated in that dtype, less memory, slightly less
            accurate gradients; a dtype other than those raises ValueError in the training forward) and ``memory``
            (``"auto"``, ``"low"``: Liger-level memory, or a budget in bytes; see the function). The report's
            LM-head entry shows the options.
        cross_entropy: when logits are materialised with labels (eval, or the fused path off), compute the loss
            with :func:`tigon.functional.cross_entropy` instead of torch.
        lora: (a model wrapped by PEFT, ``get_peft_model``) compute each LoRA linear layer's base projection and
            adapter as one :func:`tigon.functional.lora_linear` node; layers it cannot take (dropout > 0, several
            active adapters, DoRA, quantised bases, ...) are skipped with the reason, and calls it does not cover
            (merged or disabled adapters, ``adapter_names``) run PEFT's forward (:mod:`tigon.integrations.lora`).
            Instance level only: a class-level patch notes that it leaves LoRA layers alone.
        strict: raise instead of skipping anything requested that cannot be patched; nothing is changed then.
        family: for a model, the family spec to apply instead of detecting it from the model's classes; ``"generic"``
            forces the generic matcher (:mod:`tigon.integrations.generic`). Models of no registered family use the
            generic matcher anyway (``report.family == "generic"``).

    Returns:
        a :class:`~tigon.integrations.report.PatchReport` (``print`` it, or ``.as_dict()`` for JSON). Patching twice
        is idempotent: the second report lists the targets under ``already_patched`` (turning a kind off in the
        second call does not unpatch it: use :func:`unpatch`).

    Raises:
        TypeError: the model contains no module of a supported family and the generic matcher recognises nothing
            in it (the message names the class, the supported families and rejected candidates); a ``family=``
            given explicitly matches no module of the model; the argument is neither a module, a module class nor
            a string.
        ValueError: unknown family name, or a model class of no registered family; the LM head is already
            patched with other ``fused_linear_cross_entropy`` / ``cross_entropy`` options (unpatch first);
            ``strict=True`` and something requested cannot be patched (the
            message lists each target and why); an unknown ``fused_linear_cross_entropy`` option (named), or (a
            model) an ``accum_dtype`` other than None, torch.float32 or the LM head's dtype.
        TypeError: ``fused_linear_cross_entropy`` is neither a bool nor a dict; ``rms_norm``, ``rope``, ``mlp``,
            ``sinks``, ``vision_attention``, ``layer_norm``, ``fused_add_rms_norm``, ``cross_entropy`` or ``strict``
            is not a bool (e.g.
            an options dict for cross_entropy, which takes none).
        ImportError: transformers (the family's modeling module) cannot be imported.
    """
    fused, flce = check_options(dict(
        rms_norm=rms_norm, rope=rope, mlp=mlp, layer_norm=layer_norm, fused_add_rms_norm=fused_add_rms_norm,
        cross_entropy=cross_entropy, lora=lora, sinks=sinks, vision_attention=vision_attention, strict=strict,
        fused_linear_cross_entropy=fused_linear_cross_entropy, family=family))
    spec, level = _resolve(model_or_family, "patch", family)
    if level == "instance":
        check_accum_dtype(model_or_family, dict(flce).get("accum_dtype"))
    enabled = {"rms_norm": rms_norm, "layer_norm": layer_norm, "mlp": mlp, "rope": rope,
               "fused_add_rms_norm": fused_add_rms_norm, "lm_head_loss": fused or bool(cross_entropy), "lora": lora,
               "sinks": sinks, "vision_attention": vision_attention}
    opts = {"fused": fused, "ce": bool(cross_entropy), "flce": flce, "lora": lora}
    name = spec.name if spec is not None else "generic"
    report = PatchReport(family=family_label(model_or_family, spec, family is not None) if level == "instance"
                         else name, level=level)
    with _LOCK:
        release_unused()
        adapters = []
        if level == "instance" and enabled["lora"]:
            adapters = _plan_matches(adapter_matches(model_or_family), name, opts, report)
        elif enabled["lora"] and "peft" in sys.modules:
            report.notes.append("lora: PEFT's LoRA layers are patched per model, never at class level: call "
                                "tigon.patch(model) after get_peft_model")
        if spec is None:
            actions = _plan_generic(model_or_family, enabled, opts, report)
            if not actions and not adapters and not report.already_patched and any(enabled.values()):
                raise _nothing_matched(model_or_family, report)
        elif level == "instance":
            actions = _plan_instance(model_or_family, spec, enabled, opts, report, forced=family is not None)
            actions += attention_patches.plan(model_or_family, [spec, *_find_families(model_or_family)], enabled,
                                              report)
        else:
            actions = plan_class(spec, enabled, opts, report)
            attention_patches.class_notes(spec, enabled, report)
        actions += adapters
        if strict and report.skipped:
            lines = "; ".join(f"{e.kind} {e.target}: {e.detail}" for e in report.skipped)
            raise ValueError(f"tigon.patch(strict=True) cannot patch {len(report.skipped)} target(s) of family "
                             f"{name!r}: {lines}")
        for a in actions:
            a.apply()
            report.replaced.append(a.entry)
        if level == "instance" and report.replaced and _uses_sdpa(model_or_family):
            report.notes.append(causal_mask.hold(model_or_family))
    off = [k for k in OPTION_KINDS if not enabled[k]]
    if off:
        report.notes.append(turned_off_note(model_or_family, spec, level, off, PATCH_ATTRS))
    compiled = compile_note(report)
    if compiled:
        report.notes.append(compiled)
    return report


def _uses_sdpa(model: torch.nn.Module) -> bool:
    """Whether ``model``'s config (or a sub-config: a vision-language model's text tower) asks for sdpa attention."""
    cfg = getattr(model, "config", None)
    impls = {getattr(c, "_attn_implementation", None)
             for c in (cfg, getattr(cfg, "text_config", None)) if c is not None}
    return bool(impls & {"sdpa", sink_attention.NAME})  # the sink attention runs on sdpa masks


def unpatch(model_or_family) -> PatchReport:
    """Undo :func:`patch` exactly.

    Args:
        model_or_family: a model: every Tigon instance forward in it is removed (``module.forward`` is the class's
            own again) and the rotary global is restored once no patched model of the family needs it. A family
            name or a model class of the family: the classes' forward attributes and the module-global rotary
            function are put back as they were. Class-level and instance-level patches are undone separately.

    Returns:
        a :class:`PatchReport` with ``action="unpatch"``; ``replaced`` lists what was restored (empty when nothing
        was patched).

    Raises:
        TypeError / ValueError: as for :func:`patch` (not a module, module class or string; unknown family name;
            a class of no registered family).
    """
    spec, level = _resolve(model_or_family, "unpatch")
    report = PatchReport(family=spec.name if spec else "none", level=level, action="unpatch")
    with _LOCK:
        release_unused()
        if level == "instance":
            patched: set[str] = set()  # the families the removed forwards were of
            for path, m in model_or_family.named_modules():
                for attr in PATCH_ATTRS:
                    mk = tigon_mark(m.__dict__.get(attr))
                    if mk is None:
                        continue
                    del m.__dict__[attr]
                    for sw in SWITCHES.values():
                        sw.live.discard(m)
                    patched.add(mk["family"])
                    report.replaced.append(PatchEntry(mk["kind"], path or f"({type(m).__name__})", f"original {attr}"))
                if not any(tigon_mark(m.__dict__.get(a)) for a in PATCH_ATTRS):
                    persist.forget_replicas(m)
            report.family = unpatched_family(model_or_family, spec, patched)
            for sw in list(SWITCHES.values()):
                if sw.release():
                    report.replaced.append(PatchEntry("rope", sw.qualname, "original module global"))
            attention_patches.restore(model_or_family, report)
            hub_kernels.release()
            if causal_mask.release(model_or_family):
                report.notes.append("causal mask under torch.compile: transformers' own check restored")
        else:
            state = CLASS_STATE.pop(spec.name, None)
            if state is None:
                report.notes.append(f"family {spec.name!r} was not patched at class level")
                return report
            for cls, attr, original, kind in reversed(state.saved):
                target = f"{cls.__module__}.{cls.__qualname__}.{attr}"
                if tigon_mark(cls.__dict__.get(attr)) is None:
                    report.skipped.append(PatchEntry(kind, target, "changed by someone else since; left alone"))
                    continue
                if original is MISSING:
                    delattr(cls, attr)
                else:
                    setattr(cls, attr, original)
                report.replaced.append(PatchEntry(kind, target, f"original {attr}"))
            for sw in state.ropes:
                sw.class_level = False
                if sw.release():
                    report.replaced.append(PatchEntry("rope", sw.qualname, "original module global"))
                else:
                    report.notes.append(f"rope: {sw.qualname} stays a dispatcher for instance-patched models")
    return report


def patched_state() -> dict:
    """Diagnostics: families patched at class level and rotary globals currently dispatched (for ``tigon inspect``)."""
    with _LOCK:
        return {
            "class_level": {name: sorted({k for _, _, _, k in st.saved} | ({"rope"} if st.ropes else set()))
                            for name, st in CLASS_STATE.items()},
            "rope_dispatchers": {sw.qualname: {"class_level": sw.class_level, "patched_attention_modules": len(sw.live)}
                                 for sw in SWITCHES.values()},
        }
