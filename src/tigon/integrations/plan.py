"""What a patch plan is made of, shared by the instance-level and class-level planners of
:mod:`tigon.integrations.engine`: an action (a report entry and the closure that applies it), the import of a
family's modeling module, the check that a target already patched carries the requested LM-head-loss options, the
note on residual adds that stay unfused, and the skipped entry of an LM head no family declares."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

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
