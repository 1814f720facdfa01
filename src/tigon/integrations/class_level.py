"""Class-level patching (``tigon.patch("llama")``): the plan over a family's classes and rotary function, and the
state :func:`tigon.integrations.engine.unpatch` restores from (what each class defined before, the rotary switch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import components
from . import decoder_layer as dl
from . import moe_experts
from .families import FamilySpec
from .marks import tigon_mark
from .mlp_forwards import clamped_hook_problem, default_experts_gate
from .plan import MISSING, Action, check_same_options, import_family, note_residual_adds
from .report import PatchEntry, PatchReport
from .rotary_switch import SWITCHES, RopeSwitch, switch


@dataclass
class ClassState:
    """A family's class-level patch: (class, attribute, original or MISSING, kind) per replaced attribute, and its
    rotary switches (one per rotary function: DeepSeek-V3 has two)."""

    saved: list[tuple[type, str, object, str]] = field(default_factory=list)  # (class, attr, original|MISSING, kind)
    ropes: list[RopeSwitch] = field(default_factory=list)


CLASS_STATE: dict[str, ClassState] = {}


def plan_class(spec: FamilySpec, enabled: dict, opts: dict, report: PatchReport) -> list[Action]:
    """Actions patching the family's classes (and rotary function) for every model of it; problems go to the
    report. Nothing is changed until an action is applied."""
    mod = import_family(spec)
    actions: list[Action] = []
    for kind, name, comp in components.components(spec, enabled):
        cls = components.resolve_class(mod, name)
        attr = components.attr(comp)
        target = f"{name if '.' in name else spec.module + '.' + name}.{attr}"
        if cls is None:
            report.skipped.append(PatchEntry(kind, target, "class not found in this transformers"))
            continue
        if (problem := components.class_level_problem(kind, comp, cls)) is not None:
            report.skipped.append(PatchEntry(kind, target, problem))
            continue
        if (mk := tigon_mark(cls.__dict__.get(attr))) is not None:
            check_same_options(mk, target, opts, class_level=True)
            report.already_patched.append(PatchEntry(kind, target, "class level"))
            continue
        if kind == "mlp" and comp.experts and (comp.activation == "clamped_swiglu" or comp.limit is not None):
            if (problem := clamped_hook_problem(cls, comp)) is not None:
                report.skipped.append(PatchEntry(kind, target, problem))
                continue
        elif kind == "mlp" and comp.experts:
            hook, default = getattr(cls, attr, None), default_experts_gate()
            if hook is None or hook is not default:
                report.skipped.append(PatchEntry(kind, target, "no default _apply_gate hook on this class"))
                continue
        if kind == "fused_add_rms_norm" and (problem := dl.decoder_layer_problem(cls, comp)) is not None:
            report.skipped.append(PatchEntry(kind, target, problem))
            continue
        fn = components.factory(kind, comp, spec.name, spec.module, getattr(cls, attr), opts)
        binds = [(attr, fn)]
        detail, ops = components.describe(kind, comp, None, opts), components.ops(kind, comp, None, opts)
        if kind == "mlp" and comp.experts and moe_experts.class_glue(cls):  # the glue forward beside _apply_gate
            binds.append(("forward", moe_experts.experts_forward(comp, spec.name, cls.forward, class_level=True)))
            detail, ops = moe_experts.describe(None, comp, detail), moe_experts.MOE_OPS
        actions.append(Action(PatchEntry(kind, target, detail, ops), class_apply(spec.name, cls, binds, kind)))
    if enabled["rope"] and spec.rope is not None:
        problem = components.rope_problem(spec, mod)
        if problem is not None:
            report.skipped.append(PatchEntry("rope", f"{spec.module}.{spec.rope.function}", problem))
        for rope in () if problem is not None else components.rope_candidates(spec.rope, mod):
            target = f"{spec.module}.{rope.function}"
            sw = SWITCHES.get((spec.module, rope.function))
            if sw is not None and sw.class_level:
                report.already_patched.append(PatchEntry("rope", target, "class level"))
                continue
            op = components.rope_op(rope)
            partial = ("calls with partial rotary rotate the first cos.shape[-1] dims" if rope.partial_rotary
                       else "calls with partial rotary run the original")
            actions.append(Action(PatchEntry("rope", target, f"tigon.functional.{op} for every model of the family "
                                              f"({partial})", (op,)),
                                   class_rope_apply(spec, mod, rope)))
    if spec.container:
        report.notes.append(f"{spec.name}: its language model (and vision tower) are classes of other families; a "
                            "class-level patch of this family leaves them alone (patch those families by name too, "
                            "or patch a built model: tigon.patch(model) applies every family it contains)")
    else:
        note_residual_adds(spec, enabled, report)
    return actions


def class_apply(family: str, cls: type, binds: list[tuple[str, object]], kind: str):
    """Set each ``(attribute, replacement)`` of ``binds`` on ``cls``, saving what the class defined for unpatch."""
    def apply():
        state = CLASS_STATE.setdefault(family, ClassState())
        for attr, fn in binds:
            state.saved.append((cls, attr, cls.__dict__.get(attr, MISSING), kind))
            setattr(cls, attr, fn)
    return apply


def class_rope_apply(spec: FamilySpec, mod, rope):
    """Install the dispatcher of ``rope`` (one of the family's single-function rotary specs) at class level."""
    def apply():
        state = CLASS_STATE.setdefault(spec.name, ClassState())
        sw = switch(mod, rope.function, spec.name, rope.partial_rotary, rope.layout, rope.head_axis)
        sw.class_level = True
        sw.install()
        state.ropes.append(sw)
    return apply


def turned_off_note(model_or_family, spec: FamilySpec | None, level: str, off: list[str],
                    attrs: tuple[str, ...]) -> str:
    """The report note on the kinds ``off`` turned off in this :func:`~tigon.integrations.engine.patch` call, naming
    those an earlier call left patched: turning a kind off does not unpatch it. A model (``level == "instance"``):
    its modules whose instance or class attribute in ``attrs`` carries Tigon's mark of such a kind, and the family's
    class-level rotary dispatcher; a family: its class-level state (:data:`CLASS_STATE`)."""
    counts: dict[str, int] = {}
    state = CLASS_STATE.get(spec.name) if spec is not None else None
    by_class = level != "instance"  # some of them patched at class level (undone by unpatching the family)
    if level == "instance":
        for m in model_or_family.modules():
            for attr in attrs:
                mk, on_class = tigon_mark(m.__dict__.get(attr)), False
                if mk is None:
                    mk, on_class = tigon_mark(getattr(type(m), attr, None)), True
                if mk is not None and mk["kind"] in off:
                    counts[mk["kind"]] = counts.get(mk["kind"], 0) + 1
                    by_class |= on_class
    elif state is not None:
        for _, _, _, kind in state.saved:
            if kind in off:
                counts[kind] = counts.get(kind, 0) + 1
    if state is not None and state.ropes and "rope" in off and "rope" not in counts:
        counts["rope"], by_class = len(state.ropes), True
    note = "turned off: " + ", ".join(off)
    if counts:
        who = f"tigon.unpatch({spec.name!r})" if by_class else "tigon.unpatch(model)"
        note += ("; still patched by an earlier tigon.patch: " + ", ".join(f"{k} x{n}" for k, n in counts.items())
                 + f" (turning a kind off does not unpatch it: {who} first, then patch with it off)")
    return note
