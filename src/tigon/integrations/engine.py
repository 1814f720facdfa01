"""The one patch engine: applies any :class:`~tigon.integrations.families.FamilySpec` to a model or a family.

Two levels:

instance (``patch(model)``)
    For every submodule that is an instance of a spec'd class (and does not override its forward), an instance
    attribute ``forward`` is set to the Tigon forward bound to that module. Nothing outside the model changes,
    except the rotary function (below). ``unpatch(model)`` deletes those instance attributes, so ``module.forward``
    is the class's own again.

class (``patch("llama")``)
    The spec'd classes of the family's modeling module get ``forward`` replaced on the class itself (so every
    model of that family, built before or after, runs Tigon), and the module-global rotary function routes to
    Tigon. ``unpatch("llama")`` puts back exactly what was there (deleting the attribute where the class had
    inherited it).

How rope is scoped at instance level
    Attention classes call the *module-global* ``apply_rotary_pos_emb`` of their modeling module, so there is no
    per-instance hook. Tigon installs a dispatcher in that global while any patched model of the family is alive
    (tracked with a WeakSet of patched attention modules), and gives every patched attention instance a
    ``forward`` that marks a thread-local "rope scope" around the class's forward. The dispatcher calls
    :func:`tigon.functional.rope` only inside that scope (or when the family is patched at class level); other
    models of the same family, patched or not, get the original function. When the last patched attention module
    is unpatched, or garbage collected (noticed at the next patch / unpatch call, or :func:`release_unused`), the
    original global is put back.

Never touched: ``torch.nn``, the classes and globals of other families, anything when ``strict=True`` finds a
problem (the plan is checked before anything is applied).
"""

from __future__ import annotations

import importlib
import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import forwards as fw
from .causal_lm import causal_lm_forward, head_problem, uses_default_loss
from .families import FAMILIES, FamilySpec, family_by_module, family_by_name
from .report import PatchEntry, PatchReport

_LOCK = threading.RLock()
_MISSING = object()

OPTION_KINDS = ("rms_norm", "layer_norm", "mlp", "rope", "lm_head_loss")


# ---- rotary switch ---------------------------------------------------------------------------------------------
class _RopeSwitch:
    """The dispatcher installed as ``module.<function>`` and the reasons to keep it there."""

    def __init__(self, module, name: str, family: str):
        self.module, self.name = module, name
        self.original = getattr(module, name)
        self.class_level = False
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.dispatcher = fw.rope_dispatcher(self.original, family, self)

    @property
    def qualname(self) -> str:
        return f"{self.module.__name__}.{self.name}"

    def install(self) -> None:
        if getattr(self.module, self.name) is not self.dispatcher:
            setattr(self.module, self.name, self.dispatcher)

    def release(self) -> bool:
        """Restore the original global when nothing needs the dispatcher any more; True when restored."""
        if self.live or self.class_level:
            return False
        if getattr(self.module, self.name) is self.dispatcher:
            setattr(self.module, self.name, self.original)
        _SWITCHES.pop((self.module.__name__, self.name), None)
        return True


_SWITCHES: dict[tuple[str, str], _RopeSwitch] = {}


def release_unused() -> list[str]:
    """Put back every rotary global that no live patched model needs (patched models that were garbage collected
    without :func:`unpatch`). Runs at the start of every patch / unpatch; returns the restored qualnames."""
    with _LOCK:
        return [sw.qualname for sw in list(_SWITCHES.values()) if sw.release()]


def _switch(module, name: str, family: str) -> _RopeSwitch:
    key = (module.__name__, name)
    sw = _SWITCHES.get(key)
    if sw is None:
        sw = _SWITCHES[key] = _RopeSwitch(module, name, family)
    return sw


# ---- class-level state -----------------------------------------------------------------------------------------
@dataclass
class _ClassState:
    saved: list[tuple[type, object, str]] = field(default_factory=list)  # (class, original or _MISSING, kind)
    rope: _RopeSwitch | None = None


_CLASS_STATE: dict[str, _ClassState] = {}


# ---- planning --------------------------------------------------------------------------------------------------
@dataclass
class _Action:
    entry: PatchEntry
    apply: Callable[[], None]


def _import_family(spec: FamilySpec):
    try:
        return importlib.import_module(spec.module)
    except ImportError as e:
        raise ImportError(f"tigon.patch: cannot import {spec.module} for family {spec.name!r} "
                          f"(is transformers installed? {e})") from e


def _components(spec: FamilySpec, enabled: dict[str, bool]):
    """(kind, class name, component spec) for each enabled class-based part of the spec."""
    out = []
    for ns in spec.norms:
        out.append((ns.kind, ns.cls, ns))
    for ms in spec.mlps:
        out.append(("mlp", ms.cls, ms))
    if spec.causal_lm is not None:
        out.append(("lm_head_loss", spec.causal_lm.cls, spec.causal_lm))
    return [c for c in out if enabled[c[0]]]


def _factory(kind: str, comp, spec: FamilySpec, original, opts: dict):
    if kind in ("rms_norm", "layer_norm"):
        return fw.norm_forward(comp, spec.name, original)
    if kind == "mlp":
        return fw.mlp_forward(comp, spec.name, original)
    return causal_lm_forward(comp, spec.name, spec.module, original, opts["fused"], opts["ce"])


def _describe(kind: str, comp, module=None, opts=None) -> str:
    if kind == "rms_norm":
        return f"tigon.functional.rms_norm(casting_mode={comp.casting_mode!r}, offset={comp.offset})"
    if kind == "layer_norm":
        return "tigon.functional.layer_norm"
    if kind == "mlp":
        if module is not None:
            return fw.describe_mlp(module, comp)
        return f"{comp.down}(swiglu|geglu({comp.gate}(x), {comp.up}(x))) by config.{comp.act_config_attr} per call"
    parts = []
    if opts["fused"]:
        parts.append("training with labels: tigon.functional.fused_linear_cross_entropy (logits=None)")
    if opts["ce"]:
        parts.append("materialised logits with labels: tigon.functional.cross_entropy")
    return "; ".join(parts) + "; otherwise the original forward"


def _problem(kind: str, comp, module, opts) -> str | None:
    if kind in ("rms_norm", "layer_norm"):
        return fw.norm_problem(module, comp)
    if kind == "mlp":
        return fw.mlp_problem(module, comp)
    if opts["fused"]:
        p = head_problem(module, comp)
        if p is None or not opts["ce"] or not uses_default_loss(module):
            return p
        return None  # head not fusable, but the cross-entropy path still applies
    return None if uses_default_loss(module) else "the model has a custom loss_function / loss_type; its loss is kept"


def _rope_problem(spec: FamilySpec, mod) -> str | None:
    if spec.rope.layout != "rotate_half":
        return f"layout {spec.rope.layout!r} is not supported (tigon.functional.rope is rotate-half)"
    if not callable(getattr(mod, spec.rope.function, None)):
        return "function not found in this transformers"
    return None


def _plan_instance(model: torch.nn.Module, spec: FamilySpec, enabled: dict, opts: dict, report: PatchReport):
    mod = _import_family(spec)
    actions: list[_Action] = []
    classes = []
    for kind, name, comp in _components(spec, enabled):
        cls = getattr(mod, name, None)
        if cls is None:
            report.skipped.append(PatchEntry(kind, f"{spec.module}.{name}", "class not found in this transformers"))
        else:
            classes.append((kind, cls, comp))
    attn_classes = []
    rope_ok = False
    if enabled["rope"] and spec.rope is not None:
        problem = _rope_problem(spec, mod)
        if problem is not None:
            report.skipped.append(PatchEntry("rope", f"{spec.module}.{spec.rope.function}", problem))
        else:
            rope_ok = True
            for name in spec.rope.attention_classes:
                cls = getattr(mod, name, None)
                if cls is None:
                    report.skipped.append(PatchEntry("rope", f"{spec.module}.{name}", "class not found"))
                else:
                    attn_classes.append(cls)

    seen_kinds = set()
    for path, m in model.named_modules():
        target = path or f"({type(m).__name__})"
        match = next(((k, c, comp) for k, c, comp in classes if isinstance(m, c)), None)
        if match is None and rope_ok and any(isinstance(m, c) for c in attn_classes):
            match = ("rope", next(c for c in attn_classes if isinstance(m, c)), spec.rope)
        if match is None:
            continue
        kind, cls, comp = match
        seen_kinds.add(kind)
        current = m.__dict__.get("forward")
        if type(m).forward is not cls.forward:
            report.skipped.append(PatchEntry(kind, target, f"{type(m).__name__} overrides {cls.__name__}.forward"))
            continue
        if fw.tigon_mark(type(m).forward) is not None:
            report.already_patched.append(PatchEntry(kind, target, "class level"))
            continue
        if current is not None:
            if fw.tigon_mark(current) is not None:
                report.already_patched.append(PatchEntry(kind, target, "instance level"))
            else:
                report.skipped.append(PatchEntry(kind, target, "instance forward already overridden by another "
                                                 "library (e.g. accelerate hooks)"))
            continue
        if kind == "rope":
            sw = _SWITCHES.get((spec.module, spec.rope.function))
            if sw is not None and sw.class_level:
                report.already_patched.append(PatchEntry(kind, target, "class level"))
                continue
            sw_args = (mod, spec.rope.function, spec.name)
            fn = fw.attention_forward(spec.name, type(m).forward)
            detail = f"{spec.rope.function} -> tigon.functional.rope inside this module (scoped dispatcher)"
            actions.append(_Action(PatchEntry(kind, target, detail), _rope_instance_apply(m, fn, sw_args)))
            continue
        problem = _problem(kind, comp, m, opts)
        if problem is not None:
            report.skipped.append(PatchEntry(kind, target, problem))
            continue
        fn = _factory(kind, comp, spec, type(m).forward, opts)
        actions.append(_Action(PatchEntry(kind, target, _describe(kind, comp, m, opts)), _bind(m, fn)))

    wanted = {k for k, _, _ in classes} | ({"rope"} if rope_ok and attn_classes else set())
    for kind in sorted(wanted - seen_kinds):
        report.notes.append(f"{kind}: no matching module in this model")
    if rope_ok and any(a.entry.kind == "rope" for a in actions):
        report.notes.append(
            f"rope: {spec.module}.{spec.rope.function} is a dispatcher while patched models are alive; it runs "
            "tigon.functional.rope only inside patched attention modules, other models get the original")
    return actions


def _bind(module, fn):
    def apply():
        module.forward = types.MethodType(fn, module)
    return apply


def _rope_instance_apply(module, fn, sw_args):
    def apply():
        sw = _switch(*sw_args)
        sw.live.add(module)
        sw.install()
        module.forward = types.MethodType(fn, module)
    return apply


def _plan_class(spec: FamilySpec, enabled: dict, opts: dict, report: PatchReport):
    mod = _import_family(spec)
    actions: list[_Action] = []
    for kind, name, comp in _components(spec, enabled):
        cls = getattr(mod, name, None)
        target = f"{spec.module}.{name}.forward"
        if cls is None:
            report.skipped.append(PatchEntry(kind, target, "class not found in this transformers"))
            continue
        if fw.tigon_mark(cls.__dict__.get("forward")) is not None:
            report.already_patched.append(PatchEntry(kind, target, "class level"))
            continue
        fn = _factory(kind, comp, spec, cls.forward, opts)
        actions.append(_Action(PatchEntry(kind, target, _describe(kind, comp, None, opts)),
                               _class_apply(spec.name, cls, fn, kind)))
    if enabled["rope"] and spec.rope is not None:
        target = f"{spec.module}.{spec.rope.function}"
        sw = _SWITCHES.get((spec.module, spec.rope.function))
        problem = _rope_problem(spec, mod)
        if problem is not None:
            report.skipped.append(PatchEntry("rope", target, problem))
        elif sw is not None and sw.class_level:
            report.already_patched.append(PatchEntry("rope", target, "class level"))
        else:
            actions.append(_Action(PatchEntry("rope", target, "tigon.functional.rope for every model of the family"),
                                   _class_rope_apply(spec, mod)))
    return actions


def _class_apply(family: str, cls: type, fn, kind: str):
    def apply():
        state = _CLASS_STATE.setdefault(family, _ClassState())
        state.saved.append((cls, cls.__dict__.get("forward", _MISSING), kind))
        cls.forward = fn
    return apply


def _class_rope_apply(spec: FamilySpec, mod):
    def apply():
        state = _CLASS_STATE.setdefault(spec.name, _ClassState())
        sw = _switch(mod, spec.rope.function, spec.name)
        sw.class_level = True
        sw.install()
        state.rope = sw
    return apply


# ---- public entry points ---------------------------------------------------------------------------------------
def _find_family(model: torch.nn.Module) -> FamilySpec | None:
    for m in model.modules():
        spec = family_by_module(type(m).__module__)
        if spec is not None:
            return spec
    return None


def _resolve(obj, verb: str) -> tuple[FamilySpec | None, str]:
    if isinstance(obj, str):
        return family_by_name(obj), "class"
    if isinstance(obj, torch.nn.Module):
        spec = _find_family(obj)
        if spec is None and verb == "patch":
            raise TypeError(
                f"tigon.patch: {type(obj).__name__} (from {type(obj).__module__}) contains no module of a supported "
                f"model family; supported families: {', '.join(sorted(FAMILIES))}")
        return spec, "instance"
    raise TypeError(f"tigon.{verb} expects a torch.nn.Module or a family name "
                    f"({', '.join(sorted(FAMILIES))}), got {type(obj).__name__}")


def patch(
    model_or_family,
    *,
    rms_norm: bool = True,
    rope: bool = True,
    mlp: bool = True,
    layer_norm: bool = True,
    fused_linear_cross_entropy: bool = True,
    cross_entropy: bool = False,
    strict: bool = False,
) -> PatchReport:
    """Route a Hugging Face model (or a whole model family) through Tigon's kernels.

    Args:
        model_or_family: a built ``torch.nn.Module`` (e.g. ``LlamaForCausalLM``, or a wrapper containing one):
            instance-level patch of that model only; or a family name (``"llama"``, see
            :data:`tigon.integrations.FAMILIES`): class-level patch of the family's modeling module, affecting
            every model of that family, including those built later (call it before ``from_pretrained``).
        rms_norm, layer_norm: replace the family's norm forwards by :func:`tigon.functional.rms_norm` /
            :func:`tigon.functional.layer_norm` (with the module's own weight, bias and epsilon).
        mlp: replace gated MLP forwards by ``down(swiglu|geglu(gate(x), up(x)))``, chosen by the config's
            activation; activations without a kernel are skipped (instance) or run the original (class).
        rope: route the family's rotary function to :func:`tigon.functional.rope` (scoping: see the module docs).
        fused_linear_cross_entropy: in training with ``labels``, compute the LM head and HF's causal-LM loss with
            :func:`tigon.functional.fused_linear_cross_entropy`; ``output.logits`` is None then. Without labels or
            in eval mode the original forward runs and logits are returned as before.
        cross_entropy: when logits are materialised with labels (eval, or the fused path off), compute the loss
            with :func:`tigon.functional.cross_entropy` instead of torch.
        strict: raise instead of skipping anything requested that cannot be patched; nothing is changed then.

    Returns:
        a :class:`~tigon.integrations.report.PatchReport` (``print`` it, or ``.as_dict()`` for JSON). Patching twice
        is idempotent: the second report lists the targets under ``already_patched``.

    Raises:
        TypeError: the model contains no module of a supported family, or the argument is neither a module nor
            a string (the message names the class and the supported families).
        ValueError: unknown family name; or ``strict=True`` and something requested cannot be patched (the
            message lists each target and why).
        ImportError: transformers (the family's modeling module) cannot be imported.
    """
    spec, level = _resolve(model_or_family, "patch")
    enabled = {"rms_norm": rms_norm, "layer_norm": layer_norm, "mlp": mlp, "rope": rope,
               "lm_head_loss": bool(fused_linear_cross_entropy or cross_entropy)}
    opts = {"fused": bool(fused_linear_cross_entropy), "ce": bool(cross_entropy)}
    report = PatchReport(family=spec.name, level=level)
    with _LOCK:
        release_unused()
        if level == "instance":
            actions = _plan_instance(model_or_family, spec, enabled, opts, report)
        else:
            actions = _plan_class(spec, enabled, opts, report)
        if strict and report.skipped:
            lines = "; ".join(f"{e.kind} {e.target}: {e.detail}" for e in report.skipped)
            raise ValueError(f"tigon.patch(strict=True) cannot patch {len(report.skipped)} target(s) of family "
                             f"{spec.name!r}: {lines}")
        for a in actions:
            a.apply()
            report.replaced.append(a.entry)
    off = [k for k in OPTION_KINDS if not enabled[k]]
    if off:
        report.notes.append("turned off: " + ", ".join(off))
    return report


def unpatch(model_or_family) -> PatchReport:
    """Undo :func:`patch` exactly.

    Args:
        model_or_family: a model: every Tigon instance forward in it is removed (``module.forward`` is the class's
            own again) and the rotary global is restored once no patched model of the family needs it. A family
            name: the classes' forward attributes and the module-global rotary function are put back as they were.
            Class-level and instance-level patches are undone separately.

    Returns:
        a :class:`PatchReport` with ``action="unpatch"``; ``replaced`` lists what was restored (empty when nothing
        was patched).

    Raises:
        TypeError / ValueError: as for :func:`patch` (not a module or string; unknown family name).
    """
    spec, level = _resolve(model_or_family, "unpatch")
    report = PatchReport(family=spec.name if spec else "none", level=level, action="unpatch")
    with _LOCK:
        release_unused()
        if level == "instance":
            for path, m in model_or_family.named_modules():
                mk = fw.tigon_mark(m.__dict__.get("forward"))
                if mk is None:
                    continue
                del m.__dict__["forward"]
                for sw in _SWITCHES.values():
                    sw.live.discard(m)
                report.replaced.append(PatchEntry(mk["kind"], path or f"({type(m).__name__})", "original forward"))
            for sw in list(_SWITCHES.values()):
                if sw.release():
                    report.replaced.append(PatchEntry("rope", sw.qualname, "original module global"))
        else:
            state = _CLASS_STATE.pop(spec.name, None)
            if state is None:
                report.notes.append(f"family {spec.name!r} was not patched at class level")
                return report
            for cls, original, kind in reversed(state.saved):
                target = f"{cls.__module__}.{cls.__qualname__}.forward"
                if fw.tigon_mark(cls.__dict__.get("forward")) is None:
                    report.skipped.append(PatchEntry(kind, target, "changed by someone else since; left alone"))
                    continue
                if original is _MISSING:
                    delattr(cls, "forward")
                else:
                    setattr(cls, "forward", original)
                report.replaced.append(PatchEntry(kind, target, "original forward"))
            if state.rope is not None:
                state.rope.class_level = False
                if state.rope.release():
                    report.replaced.append(PatchEntry("rope", state.rope.qualname, "original module global"))
                else:
                    report.notes.append(f"rope: {state.rope.qualname} stays a dispatcher for instance-patched models")
    return report


def patched_state() -> dict:
    """Diagnostics: families patched at class level and rotary globals currently dispatched (for ``tigon inspect``)."""
    with _LOCK:
        return {
            "class_level": {name: sorted({k for _, _, k in st.saved} | ({"rope"} if st.rope else set()))
                            for name, st in _CLASS_STATE.items()},
            "rope_dispatchers": {sw.qualname: {"class_level": sw.class_level, "patched_attention_modules": len(sw.live)}
                                 for sw in _SWITCHES.values()},
        }
