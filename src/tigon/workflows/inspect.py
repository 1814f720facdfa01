"""What :func:`tigon.patch` would do to a model, without loading it (``tigon inspect MODEL``).

MODEL is a preset name (:data:`tigon.presets.PRESETS`), a path to a Hugging Face ``config.json``, a local
checkpoint directory or a Hub id in the local Hugging Face cache (only its ``config.json`` is read, by
:func:`tigon.workflows.model_source.load_model_config`). The model is built from the config on PyTorch's ``meta``
device: modules and parameter shapes exist, no weights are read or allocated, so even the 8B presets take a second
or two. :func:`tigon.patch` is then applied to that weightless model at instance level and
undone with :func:`tigon.unpatch` at once; its report says, module by module, what would be replaced and what
would be skipped and why. Every other module is listed as left alone, with the reason.

Kinds (the keys of ``counts``) are the patch kinds of :mod:`tigon.integrations` (norms, the rotary call inside each
attention module, the gated MLP's activation, the LM head and the causal-LM loss fused in training), counted under
the categories of :data:`tigon.integrations.report.KIND_CATEGORIES`.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from ..integrations.report import DRY_RUN_SILENT_NOTES, KIND_NOTES
from ..integrations.report import FAMILY_CATEGORIES
from ..integrations.report import KIND_CATEGORIES as CATEGORIES  # patch kind -> category
from .dry_run import dry_run
from .errors import ConfigError, error_text
from .model_shapes import text_config
from .model_source import load_model_config

CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "vocab_size", "hidden_act", "hidden_activation",
                 "rms_norm_eps", "tie_word_embeddings", "final_logit_softcapping")


def _fields(config, names) -> dict[str, Any]:
    out = {}
    for name in names:
        try:
            value = getattr(config, name, None)
        except Exception:  # transformers' AmbiguousGlobalPerLayerAttributeError (not an AttributeError)
            value = None
        if value is not None:
            out[name] = value
    return out


def config_summary(config) -> dict[str, Any]:
    """The shape-relevant fields of a transformers config (absent ones left out), plus ``model_type``. A field that
    varies per layer (Gemma 4's ``head_dim``: its config raises on the global read) is left out too. A
    vision-language config gives its text decoder's fields, ``tie_word_embeddings`` from the outer config, and its
    vision encoder's as ``vision_model_type``, ``vision_num_hidden_layers``, ``vision_hidden_size``."""
    text = text_config(config)
    out: dict[str, Any] = {"model_type": getattr(config, "model_type", None), **_fields(text, CONFIG_FIELDS)}
    if text is not config:
        out.update(_fields(config, ("tie_word_embeddings",)))
        vision = getattr(config, "vision_config", None)
        if vision is not None:  # Qwen-VL's vision layers are `depth` (aliased `num_hidden_layers` in 5.2x only)
            fields = _fields(vision, ("model_type", "num_hidden_layers", "depth", "hidden_size", "embed_dim"))
            fields.setdefault("num_hidden_layers", fields.get("depth"))
            fields.pop("depth", None)
            out.update({f"vision_{k}": v for k, v in fields.items() if v is not None})
    return out


@dataclass
class InspectResult:
    """The outcome of :func:`run_inspect`; :meth:`as_dict` is what ``tigon inspect --json`` writes.

    Attributes:
        model: the MODEL argument; source: ``"preset:tiny"``, ``"config:/abs/config.json"``,
            ``"checkpoint:/abs/dir"`` or ``"hub:org/name"``.
        family: the Tigon family spec that applies (``"llama"``).
        architecture: the causal-LM class (``"LlamaForCausalLM"``); num_parameters: its parameter count.
        config: shape fields of the config (hidden_size, intermediate_size, layers, heads, vocab, activation ...).
        counts: modules that would be replaced, per patch kind (``{"mlp": 32, ...}``).
        categories: the same per category: ``norms``, ``residual_add_norm``, ``rotary``, ``mlp_activation``,
            ``lm_head_loss``, and ``attention_sinks`` where there are any (GPT-OSS).
        replaced: groups ``{"kind", "count", "targets", "detail"}``; targets fold layer indices to ``*``, detail
            says what would run instead.
        skipped: groups ``{"kind", "count", "targets", "reason"}`` the engine recognises (by the family spec or the
            generic matcher) and would leave alone.
        left_alone: every other module class: ``{"module", "count", "examples", "reason"}``.
        patch: the full :class:`~tigon.integrations.PatchReport` of the dry run (``as_dict()``, entry by entry).
        notes: how the dry run was done and the engine's notes.
    """

    model: str
    source: str
    family: str
    architecture: str
    num_parameters: int
    config: dict[str, Any]
    counts: dict[str, int]
    categories: dict[str, int]
    replaced: list[dict[str, Any]]
    skipped: list[dict[str, Any]]
    left_alone: list[dict[str, Any]]
    patch: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)


def _fold(targets: list[str]) -> list[str]:
    """Module paths with layer indices folded to ``*``, deduplicated in order."""
    return list(dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", ".*", t) for t in targets))


def _group(entries, detail_key: str) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str], list[str]] = {}
    for e in entries:
        groups.setdefault((e.kind, e.detail), []).append(e.target)
    order = list(CATEGORIES)
    rows = [{"kind": kind, "count": len(t), "targets": _fold(t), detail_key: detail}
            for (kind, detail), t in groups.items()]
    return sorted(rows, key=lambda r: order.index(r["kind"]) if r["kind"] in order else len(order))


def _why_left_alone(module, path: str, model, report, patched_paths: set[str]) -> str:
    """One line on why ``module`` (not patched itself) stays as it is."""
    name = type(module).__name__
    kinds = set(report.counts)
    parent_path = path.rsplit(".", 1)[0] if "." in path else ""
    if isinstance(module, torch.nn.Linear):
        if module is model.get_output_embeddings():
            if "lm_head_loss" in kinds:
                return ("LM head: in training with labels its matmul runs inside the fused linear + cross-entropy "
                        "(the logits are never materialised); otherwise unchanged")
            return "LM head: stays a plain matmul (the fused LM-head loss was not applied)"
        if parent_path in patched_paths and "mlp" in kinds and any(path.endswith(p) for p in
                                                                   (".gate_proj", ".up_proj", ".down_proj")):
            return "MLP projection: a matmul on cuBLAS, called by the patched MLP around the fused activation"
        return "projection: a matmul, stays on cuBLAS (compute-bound, nothing to fuse)"
    if isinstance(module, torch.nn.Embedding):
        return "token embedding: a gather, left to PyTorch"
    if name.endswith("RotaryEmbedding"):
        def beside(entries):  # the rotary entries of the attentions beside this module (under its parent)
            return [e for e in entries if CATEGORIES.get(e.kind) == "rotary"
                    and (not parent_path or e.target.startswith(parent_path + "."))]

        # the functions they run, from the rope entries' "function -> op" details (Llama 4's complex tables:
        # apply_rotary_emb / vision_apply_rotary_emb)
        rotations = sorted({e.detail.split(" -> ")[0] for e in beside(report.replaced) if " -> " in e.detail})
        if rotations:
            return (f"builds the rotary tables once per forward; the rotation itself ({', '.join(rotations)}) is what "
                    "Tigon replaces")
        if not beside(report.skipped) and any(CATEGORIES.get(k) == "rotary" for k in kinds):
            return "builds the rotary tables once per forward; the rotation itself is what Tigon replaces"
        return "builds the rotary tables once per forward; the rotation is not replaced either (see skipped)"
    if type(module).__module__.startswith("transformers.activations") or isinstance(
            module, (torch.nn.SiLU, torch.nn.GELU, torch.nn.Tanh, torch.nn.ReLU)):
        if parent_path in patched_paths:
            return ("the MLP's act_fn: the patched MLP fuses the activation into its kernel (gated, or act_linear's) "
                    "and no longer calls it")
        return "an activation outside a patched gated MLP"
    if isinstance(module, torch.nn.Dropout):
        return "dropout: no Tigon op"
    if name.endswith("Attention"):
        return "attention: stays on PyTorch (SDPA / flash attention); its rotary call was not patched"
    if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)):
        return "container"
    if name.endswith("DecoderLayer"):
        return "decoder layer: residual adds and calls; its norms, attention and MLP are listed separately"
    if any(True for _ in module.children()):
        if any(True for _ in module.parameters(recurse=False)):  # (DeepSeek-V4's hyper-connections, hash router)
            return f"no Tigon kernel for {name} (parameters of its own; its submodules are listed separately)"
        return "container: its submodules are listed separately"
    if isinstance(module, torch.nn.LayerNorm) or name.endswith("LayerNorm"):
        return ("LayerNorm: Tigon has a LayerNorm kernel, but this model's family has no spec and the generic "
                "matcher only recognises RMSNorm-like norms")
    return f"no Tigon kernel for {name}"


def _in_lora_layer(path: str, lora_layers: dict[str, bool]) -> str | None:
    """The reason for a module inside a PEFT LoRA layer (its base layer, adapters, dropout), or None when ``path``
    is in none; ``lora_layers``: LoRA layer path -> whether tigon.patch fused it."""
    parent = path
    while "." in parent:
        parent = parent.rsplit(".", 1)[0]
        if parent in lora_layers:
            if lora_layers[parent]:
                return ("part of a fused PEFT LoRA layer: its forward reads the base weight and the active "
                        "adapter's A / B directly (tigon.functional.lora_linear, or the MLP's one node)")
            return "part of a PEFT LoRA layer left to PEFT (see skipped: lora)"
    return None


def run_inspect(model: str, *, lora_rank: int | None = None, patch_fn=None, unpatch_fn=None) -> InspectResult:
    """Dry-run :func:`tigon.patch` on MODEL built from its config on the meta device.

    Args:
        model: a preset name, a ``config.json`` path, a checkpoint directory or a Hub id in the local cache (see
            :func:`~tigon.workflows.model_source.load_model_config`).
        lora_rank: wrap the model with PEFT LoRA of that rank first (see :func:`inspect_config`).
        patch_fn, unpatch_fn: replace :func:`tigon.patch` / :func:`tigon.unpatch` (for tests).

    Returns:
        an :class:`InspectResult` (see :func:`inspect_config`).

    Raises:
        ConfigError: MODEL cannot be read or built (see :func:`~tigon.workflows.model_source.load_model_config`,
            :func:`~tigon.workflows.dry_run.build_meta_model`), or ``tigon.patch`` does not support its family (the
            message names the supported families).
    """
    config, source = load_model_config(model)
    return inspect_config(config, model=model, source=str(source), lora_rank=lora_rank, patch_fn=patch_fn,
                          unpatch_fn=unpatch_fn)


def inspect_config(config, *, model: str = "", source: str = "", lora_rank: int | None = None, patch_fn=None,
                   unpatch_fn=None) -> InspectResult:
    """What :func:`tigon.patch` does to the causal LM of a transformers ``config``: the report of the engine's own
    decisions on the weightless model (:func:`~tigon.workflows.dry_run.dry_run`), grouped, with every other module
    listed as left alone and why. Nothing is allocated and nothing of the process's state changes.

    Args:
        config: a transformers config of a causal LM.
        model, source: what :class:`InspectResult` shows as MODEL and its source (``"preset:tiny"``).
        lora_rank: wrap the weightless model with PEFT LoRA of that rank first, as ``tigon bench --e2e --lora R``
            does (:func:`tigon.workflows.lora.with_lora`): the report then lists the LoRA layers fused
            (``lora_linear``), the MLPs that run with their adapters as one node (``lora_glu_mlp`` /
            ``lora_gate_up_mlp``) and what is not, with the reasons.
        patch_fn, unpatch_fn: replace :func:`tigon.patch` / :func:`tigon.unpatch` (for tests).

    Raises:
        ConfigError: the model cannot be built, PEFT is missing or finds no target projection (``lora_rank``), or
            ``tigon.patch`` refuses it (:class:`~tigon.workflows.dry_run.PatchRejected`).
    """
    with dry_run(config, patch_fn, unpatch_fn, lora_rank=lora_rank) as (meta, report):
        modules = dict(meta.named_modules())

        # Engine targets are module paths, except the root model, which it names "(ClassName)".
        def path_of(target: str) -> str:
            return "" if target == f"({type(meta).__name__})" else target

        patched_paths = {path_of(e.target) for e in report.replaced}
        lora_layers = {e.target: e in report.replaced for e in report.replaced + report.skipped if e.kind == "lora"}
        touched = patched_paths | {path_of(e.target) for e in report.skipped + report.already_patched}
        left: dict[str, list[str]] = {}
        reasons: dict[str, str] = {}
        for path, m in modules.items():
            if path in touched:
                continue
            reason = _in_lora_layer(path, lora_layers) or _why_left_alone(m, path, meta, report, patched_paths)
            key = f"{type(m).__name__}\x00{reason}"
            left.setdefault(key, []).append(path or f"({type(m).__name__})")
            reasons[key] = reason
        left_alone = [{"module": key.split("\x00")[0], "count": len(paths), "examples": _fold(paths)[:4],
                       "reason": reasons[key]} for key, paths in left.items()]
        order = list(CATEGORIES)
        counts = dict(sorted(report.counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99))
        categories: Counter = Counter()
        for kind, n in counts.items():
            categories[CATEGORIES.get(kind, kind)] += n
        notes = [
            "config only: the model was built on the meta device (no weights read or allocated) and patched at "
            "instance level, then unpatched at once.",
        ]
        if lora_rank is not None:
            from .lora import LORA_TARGETS

            notes.append(f"wrapped first by PEFT: LoRA r={lora_rank} (alpha {2 * lora_rank}, dropout 0) on the "
                         "projections it has of " + ", ".join(LORA_TARGETS) + " (as tigon bench --e2e --lora).")
        notes += [KIND_NOTES[kind] for kind in counts if kind in KIND_NOTES]
        notes += [n for n in report.notes if not n.startswith(DRY_RUN_SILENT_NOTES)]
        return InspectResult(
            model=model,
            source=source,
            family=report.family,
            architecture=type(meta).__name__,
            num_parameters=sum(p.numel() for p in meta.parameters()),
            config=config_summary(config),
            counts=counts,
            categories={**{c: categories.get(c, 0) for c in dict.fromkeys(CATEGORIES.values())
                           if c not in FAMILY_CATEGORIES or categories.get(c)},
                        **({"lora": categories["lora"]} if "lora" in categories else {})},
            replaced=_group(report.replaced, "detail"),
            skipped=_group(report.skipped, "reason"),
            left_alone=left_alone,
            patch=report.as_dict(),
            notes=notes,
        )
