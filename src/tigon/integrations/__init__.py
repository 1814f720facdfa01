"""Hugging Face integration: one declarative spec per model family, one engine that applies it.

>>> import tigon
>>> report = tigon.patch(model)          # instance level: this model only
>>> print(report)                        # what was replaced, what was skipped and why
>>> tigon.unpatch(model)                 # exactly the original again
>>> tigon.patch("llama")                 # class level: every Llama built afterwards (and before)
>>> model = tigon.AutoModelForCausalLM.from_pretrained(path)   # build + instance-level patch; model.tigon_report

See :mod:`tigon.integrations.families` for the specs (adding a family is adding data there),
:mod:`tigon.integrations.engine` for how patches are applied and how the rotary function is scoped, and
:mod:`tigon.integrations.generic` for models of no registered family (numerical probes per module).
TRL's trainers: :func:`tigon.integrations.trl.patch_trainer` (``from tigon.integrations.trl import patch_trainer``)
switches a built trainer's loss to the fused LM-head kernels. Importing this package does not import transformers;
patching does (and the TRL switch imports TRL when called).
"""

from __future__ import annotations

from .causal_lm import causal_lm_loss, causal_lm_loss_from_logits, shifted_targets, slice_to_keep
from .engine import patch, patched_state, unpatch
from .generic import generic_matches
from .families import (
    ACTIVATIONS,
    FAMILIES,
    CausalLMSpec,
    DecoderLayerSpec,
    FamilySpec,
    MLPSpec,
    NormSpec,
    RopeSpec,
    Unsupported,
    family_by_name,
    register_family,
)
from .report import PatchEntry, PatchReport

__all__ = [
    "patch", "unpatch", "PatchReport", "PatchEntry", "patched_state",
    "FamilySpec", "NormSpec", "MLPSpec", "RopeSpec", "CausalLMSpec", "DecoderLayerSpec", "Unsupported", "FAMILIES",
    "ACTIVATIONS",
    "register_family", "family_by_name", "generic_matches",
    "causal_lm_loss", "causal_lm_loss_from_logits", "shifted_targets", "slice_to_keep",
]
