"""What a patch plan is made of, shared by the instance-level and class-level planners of
:mod:`tigon.integrations.engine`: an action (a report entry and the closure that applies it), the import of a
family's modeling module, the check that a target already patched carries the requested LM-head-loss options, and
the note on residual adds that stay unfused."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from .causal_lm import loss_options
from .families import FamilySpec
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
