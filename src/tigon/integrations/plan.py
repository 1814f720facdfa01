"""What a patch plan is made of, shared by the instance-level and class-level planners of
:mod:`tigon.integrations.engine`: an action (a report entry and the closure that applies it), the import of a
family's modeling module, the check that a target already patched carries the requested LM-head-loss options, the
note on residual adds that stay unfused, and the skipped entry of an LM head no family declares (and the family label
of a report on such a container)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Callable

import torch

from .causal_lm import flce_options, loss_options
from . import components, lora_mlp, lora_qkv, persist
from .families import FamilySpec, family_by_module, family_by_name
from .marks import tigon_mark
from .report import PatchEntry, PatchReport

MISSING = object()
"""Stands for an attribute a class did not define itself (unpatch deletes what the patch set)."""


@dataclass
class Action:
    """A planned replacement: its report entry and the closure that applies it (run only after planning)."""

    entry: PatchEntry
    apply: Callable[[], None]


def import_family(spec: FamilySpec):
    """The family's modeling module. Raises ImportError naming the module and family."""
    try:
        return importlib.import_module(spec.module)
    except ImportError as e:
        raise ImportError(f"tigon.patch: cannot import {spec.module} for family {spec.name!r} "
                          f"(is transformers installed? {e})") from e


def already_patched_entry(level: str, kind: str, target: str, m: torch.nn.Module, comp, family_module: str,
                          opts: dict) -> PatchEntry:
    """The report entry of ``m``, patched by Tigon before at ``level`` (``"class"`` / ``"instance"``), with what it
    runs with the adapter layers its projections became since (patched before ``peft.get_peft_model``): an MLP's
    LoRA node or why not; an attention's q / k / v node with the rotary or why not (never at class level: that
    patch replaces the rotary function alone, the node needs the instance-level attention forward)."""
    if kind == "mlp" and lora_mlp.mlp_adapter(m, comp) is not None:
        return PatchEntry(kind, target, f"{level} level; {components.describe(kind, comp, m, opts)}",
                          components.ops(kind, comp, m, opts), components.checkpoint_ops(kind, comp, m, opts))
    if kind == "rope":
        rope = components.rope_for(comp, m, sys.modules.get(family_module))
        qkv = lora_qkv.describe(m, rope, opts.get("lora", True))
        if qkv is not None and level == "class":
            q = " / ".join(rope.qkv)
            return PatchEntry(kind, target, (
                f"class level; its {q} adapter layers are not fused with the rotary (the class-level patch replaces "
                f"{rope.function} alone; the {qkv[0][0] if qkv[0] else 'q / k / v'} node needs an instance-level "
                "patch: tigon.unpatch the family, then tigon.patch(model)); each runs lora_linear, then "
                f"{components.rope_op(rope)}"), (components.rope_op(rope),))
        if qkv is not None:
            return PatchEntry(kind, target, f"{level} level; {qkv[1]}", qkv[0] or (components.rope_op(rope),))
    return PatchEntry(kind, target, f"{level} level")


def check_same_options(mk: dict, target: str, opts: dict, class_level: bool) -> None:
    """A target already patched with other LM-head-loss options: raise rather than silently keep the old ones."""
    if mk.get("kind") != "lm_head_loss" or "options" not in mk:
        return
    wanted = loss_options(opts["fused"], opts["ce"], opts["flce"])
    if mk["options"] != wanted:
        how = (f"it is patched at class level: call tigon.unpatch({mk['family']!r}) first" if class_level
               else "call tigon.unpatch(model) first")
        raise ValueError(f"tigon.patch: {target} is already patched with {mk['options']}, not the requested {wanted}; "
                         f"to change the options, {how}")


def _fsdp2_rewrapped(sub: type, cls: type, attr: str) -> bool:
    """Whether ``sub`` is the class FSDP2's ``fully_shard`` gave a module of ``cls`` (``FSDP<cls>``, bases
    ``(FSDPModule, cls)``) and its own ``attr``, if any, only wraps ``cls``'s (``functools.wraps``): transformers'
    ``GradientCheckpointingLayer`` wraps the forward of every subclass again, FSDP's included. Patched after
    ``fully_shard``, such a module is patched as before it (the instance's forward)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    fsdp_module = getattr(fsdp, "FSDPModule", None) if fsdp is not None else None
    if fsdp_module is None or sub.__bases__ != (fsdp_module, cls):
        return False
    own = vars(sub).get(attr)
    return own is None or getattr(own, "__wrapped__", None) is getattr(cls, attr, None)


def existing_patch(m: torch.nn.Module, cls: type, attr: str, target: str, opts: dict) -> tuple[str | None, str]:
    """What already stands at ``m``'s ``attr`` (``cls``: the class whose attribute a patch replaces): ``(None, "")``
    nothing (patch it); ``("class", "")`` / ``("instance", "")`` Tigon's, at that level, with ``opts`` checked equal
    (:func:`check_same_options`: ValueError otherwise); ``("skip", why)`` a subclass's own ``attr`` or an instance
    attribute set by another library (or by the user: ``model.forward = torch.compile(model.forward)``)."""
    if getattr(type(m), attr, None) is not getattr(cls, attr, None) and not _fsdp2_rewrapped(type(m), cls, attr):
        return "skip", f"{type(m).__name__} overrides {cls.__name__}.{attr}"
    if (mk := tigon_mark(getattr(type(m), attr, None))) is not None:
        check_same_options(mk, target, opts, class_level=True)
        return "class", ""
    current = m.__dict__.get(attr)
    if current is None:
        return None, ""
    if (mk := tigon_mark(current)) is None:
        if "_kernel_repo" in m.__dict__:  # set by kernels.kernelize beside a hub layer's forward
            return "skip", (f"instance {attr} is a hub kernel's ({m.__dict__['_kernel_repo']}) that transformers' "
                            "kernels integration installed (from_pretrained with use_kernels); call "
                            "model.reset_kernels() before tigon.patch(model), or load with use_kernels=False")
        if getattr(current, "_torchdynamo_orig_callable", None) is not None:  # torch.compile's wrapper of a function
            return "skip", (f"instance {attr} is a torch.compile'd function (model.{attr} = torch.compile(...) before "
                            f"tigon.patch): patch first, then compile")
        return "skip", f"instance {attr} already overridden by another library (e.g. accelerate hooks)"
    check_same_options(mk, target, opts, class_level=False)
    return "instance", ""


def note_residual_adds(spec: FamilySpec | None, enabled: dict, report: PatchReport) -> None:
    """Say why a family's residual adds stay unfused, or that the post-attention norms stay patched beside them."""
    if not enabled["fused_add_rms_norm"]:
        return
    if spec is not None and spec.norms and all(n.kind == "layer_norm" for n in spec.norms):
        report.notes.append(f"fused_add_rms_norm: the {spec.name} family normalises with LayerNorm (the fused residual "
                            "add is an RMSNorm op); their residual adds run as before")
    elif spec is None or not spec.decoder_layers:
        who = f"the {spec.name} family's" if spec is not None else "these"
        report.notes.append(f"fused_add_rms_norm: {who} decoder layers are not declared of Llama's pre-norm form "
                            "(a DecoderLayerSpec); their residual adds run as before")
    elif enabled["rms_norm"]:
        report.notes.append("fused_add_rms_norm: the post-attention norms stay patched as rms_norm too; a fused layer "
                            "computes them with its residual add, and calls them itself only when it falls back "
                            "(hooks on the norm other than torch's SequenceParallel ones; residual and attention "
                            "output of different dtypes, as under "
                            "autocast with fp32 weights)")


def undeclared_head(model: torch.nn.Module, specs: list[FamilySpec]) -> PatchEntry | None:
    """The skipped ``lm_head_loss`` entry of ``model``'s own LM head when the model's class is of none of the families
    applied (a vision-language container such as LLaVA-NeXT, whose towers are of declared families) and it has one
    (``get_output_embeddings()``, an ``nn.Linear``): its head and loss run as before. None otherwise."""
    if any(type(model).__module__ == sp.module for sp in specs):
        return None
    try:
        head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    except (AttributeError, NotImplementedError):  # (a model that declares no output embedding)
        return None
    path = next((p for p, m in model.named_modules() if m is head), "") if isinstance(head, torch.nn.Linear) else ""
    if not path:
        return None
    return PatchEntry("lm_head_loss", path, f"{type(model).__name__}.forward ({type(model).__module__}) is of no "
                      "family Tigon declares (the families of its towers are applied: see the families note): its LM "
                      "head and loss run as before")


def family_label(model: torch.nn.Module, spec: FamilySpec | None, forced: bool = False) -> str:
    """The family an instance-level report on ``model`` names: ``spec``'s name (``"generic"`` for None: the generic
    matcher), except for a transformers model whose own class (or a base class of it) is of no registered family while
    modules inside it are, a container no family declares (LLaVA-NeXT-Video around its CLIP and Llama towers, BLIP-2
    around a Llama causal LM): ``"<its model_type> (no family)"``, not the first tower's family (the families note
    names the towers'). ``forced`` (``family=`` given): ``spec``'s name. The outermost transformers model counts, so
    that wrappers (PEFT, TRL) keep the family of the model they hold."""
    if spec is None:
        return "generic"
    tf = sys.modules.get("transformers")
    outer = next((m for m in model.modules() if isinstance(m, tf.PreTrainedModel)), None) if tf else None
    if forced or outer is None or any(family_by_module(c.__module__) for c in type(outer).__mro__):
        return spec.name
    return f"{getattr(outer.config, 'model_type', None) or type(outer).__name__} (no family)"


def unpatched_family(model: torch.nn.Module, spec: FamilySpec | None, patched: set[str]) -> str:
    """The family an instance-level unpatch report names, the one the patch report named: the model's
    (:func:`family_label`: its outermost family, or the model type of a container of no family), not the family of
    whichever patched module came last; but the one family all the removed forwards were of where that is not the
    model's (a patch with ``family=``: ``"generic"`` on a Llama model). ``patched``: the families of the removed
    forwards (their marks'; none: ``spec``'s name, ``"none"`` for the generic matcher)."""
    if not patched:
        return spec.name if spec is not None else "none"
    label = family_label(model, spec)
    if label in patched or len(patched) != 1 or label.endswith("(no family)"):
        return label
    return next(iter(patched))


def held_heads(model: torch.nn.Module, matches: list, report: PatchReport) -> list:
    """``matches`` with the LM heads that run inside another model's forward taken out.

    * A head reached through a causal LM of its own (:attr:`~tigon.integrations.family_spec.CausalLMSpec.inner`,
      Llama 4's vision-language class around its ``Llama4ForCausalLM``): that LM's match leaves the list and rides on
      the container's (``Match.inner``): one report entry, both forwards patched.
    * Any other head held by a transformers model (a ``PreTrainedModel`` above it in ``model``, BLIP-2 or InstructBLIP
      around a Llama causal LM): that model's forward calls the causal LM itself, and the fused loss runs only for a
      causal LM called with labels, which such a forward need not pass on (BLIP-2's computes the loss on the logits
      it gets): reported skipped, left alone. Wrappers that are no transformers model (PEFT, TRL) hold heads as
      before.

    For the families' heads only (instance-level family plans; in transformers 5.2x every transformers model that
    holds one calls it without labels): the generic matcher's heads are of models of no family, some of whose
    containers pass the labels on (Moshi's MoshiForCausalLM gets its text labels).
    """
    heads = {id(m): (p, m, mt) for p, m, mt in matches if mt.kind == "lm_head_loss"}
    if not heads:
        return matches
    folded = {id(getattr(m, mt.comp.inner, None)) for _, m, mt in heads.values()
              if getattr(mt.comp, "inner", None) is not None}
    out = []
    for path, m, mt in matches:
        if mt.kind != "lm_head_loss":
            out.append((path, m, mt))
            continue
        if id(m) in folded:
            continue
        holder = _holder(model, path)
        if holder is not None:
            report.skipped.append(PatchEntry("lm_head_loss", path, (
                f"{type(holder).__name__}.forward ({type(holder).__module__}) calls this {type(m).__name__} itself: "
                "the fused loss runs only for a causal LM called with labels, which that forward need not pass on "
                "(BLIP-2's and InstructBLIP's compute the loss on the logits they get); its LM head and loss run as "
                "before")))
            continue
        name = getattr(mt.comp, "inner", None)
        if name is not None:
            mt = replace(mt, inner=heads.get(id(getattr(m, name, None))))
        out.append((path, m, mt))
    return out


def _holder(model: torch.nn.Module, path: str) -> torch.nn.Module | None:
    """The nearest transformers model strictly above the module at ``path`` in ``model``, or None."""
    base = getattr(sys.modules.get("transformers.modeling_utils"), "PreTrainedModel", None)
    if base is None or not path:
        return None
    parts = path.split(".")
    for i in range(len(parts) - 1, -1, -1):
        above = model.get_submodule(".".join(parts[:i]))
        if isinstance(above, base):
            return above
    return None


def inner_head(comp, match, family: str, opts: dict):
    """For an LM head reached through a causal LM of its own (``comp.inner``; :func:`held_heads` put that LM's match
    in ``match.inner``): ``(module, forward, None)``, the LM and the forward to bind on it (``forward`` None when
    Tigon's is there already, class or instance level), or ``(None, None, why)`` when it cannot hand back its hidden
    states, so that the head is skipped."""
    if match.inner is None:
        return None, None, (f"its {comp.inner} is no causal LM of the family (Tigon's LM-head forward would not run "
                            "there)")
    path, inner, im = match.inner
    state, why = existing_patch(inner, im.cls, "forward", path, opts)
    if state is not None:
        return (None, None, f"its {comp.inner}: {why}") if state == "skip" else (inner, None, None)
    problem = components.problem("lm_head_loss", im.comp, inner, opts)
    if problem is not None:
        return None, None, f"its {comp.inner}: {problem}"
    recipe = persist.Recipe("forward", "lm_head_loss", im.comp, family, im.family_module, opts)
    return inner, persist.build(recipe, type(inner).forward), None


def check_options(options: Mapping) -> tuple[bool, dict]:
    """Check :func:`tigon.patch`'s keyword options (any subset, by name) before anything is built or patched; returns
    :func:`~tigon.integrations.causal_lm.flce_options` of ``fused_linear_cross_entropy`` (default True).

    Raises:
        TypeError: a switch (``rms_norm``, ``rope``, ``mlp``, ...) or ``strict`` not a bool, ``family`` neither a
            str nor None, ``fused_linear_cross_entropy`` neither a bool nor a dict.
        ValueError: an unknown family name, or bad fused_linear_cross_entropy options.
    """
    for name, flag in options.items():
        if name in ("fused_linear_cross_entropy", "family"):
            continue
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be True or False, got {type(flag).__name__} {flag!r}"
                            + (" (cross_entropy takes no options; fused_linear_cross_entropy does)"
                               if name == "cross_entropy" and isinstance(flag, Mapping) else ""))
    family = options.get("family")
    if family is not None and not isinstance(family, str):
        raise TypeError(f"tigon.patch: family must be a family name (str) or None, got {type(family).__name__}")
    if family is not None and family.lower() != "generic":
        family_by_name(family)
    return flce_options(options.get("fused_linear_cross_entropy", True))
