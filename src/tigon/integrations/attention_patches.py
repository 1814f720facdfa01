"""The patches that switch a model's attention implementation (:mod:`tigon.integrations.attention_switch`), as the
engine applies them: GPT-OSS's sink attention on SDPA (:mod:`~tigon.integrations.sink_attention`) and the vision
towers' length-batched packed attention (:mod:`~tigon.integrations.varlen_attention`). Each is a ``tigon.patch``
option, the :class:`~tigon.integrations.family_spec.FamilySpec` field naming its attention classes, and a module with
``plan(model, families, report)``, ``restore(model, report)`` and ``CLASS_NOTE`` (instance level only)."""

from __future__ import annotations

import torch

from . import sink_attention, varlen_attention

PATCHES = (("sinks", "sinks", sink_attention), ("vision_attention", "varlen_attention", varlen_attention))
"""(``tigon.patch`` option, FamilySpec field, module) of each attention-implementation patch."""


def plan(model: torch.nn.Module, families: list, enabled: dict, report) -> list:
    """The actions of every enabled attention patch on ``model`` (instance level); skips go to ``report``."""
    return [a for option, _, module in PATCHES if enabled[option] for a in module.plan(model, families, report)]


def class_notes(spec, enabled: dict, report) -> None:
    """A class-level patch of ``spec``: say, for each enabled attention patch the family has, that it applies per
    model only."""
    for option, field, module in PATCHES:
        if enabled[option] and getattr(spec, field):
            report.notes.append(f"{option}: {module.CLASS_NOTE}: call tigon.patch(model)")


def restore(model: torch.nn.Module, report) -> None:
    """Undo every attention patch on ``model`` (``tigon.unpatch``)."""
    for _, _, module in PATCHES:
        module.restore(model, report)
