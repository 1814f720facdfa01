"""What :func:`tigon.patch` / :func:`tigon.unpatch` did: a plain dataclass, JSON-able, printable, rich-renderable."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from .. import support


_KIND_ORDER = ("rms_norm", "layer_norm", "fused_add_rms_norm", "mlp", "rope", "sinks", "vision_attention",
               "lm_head_loss", "lora")

KIND_CATEGORIES = {"rms_norm": "norms", "layer_norm": "norms", "fused_add_rms_norm": "residual_add_norm",
                   "rope": "rotary", "mlp": "mlp_activation", "sinks": "attention_sinks",
                   "vision_attention": "vision_attention", "lm_head_loss": "lm_head_loss"}
"""Patch kind -> the category ``tigon inspect`` counts it under (in this order)."""

FAMILY_CATEGORIES = frozenset({"attention_sinks", "vision_attention"})
"""Categories of some families' own kinds (GPT-OSS's sinks, vision towers' packed attention): ``tigon inspect`` lists
them only where a model has some."""

KIND_NOTES = {
    "rope": "rope: attention itself (softmax(QK^T)V) stays on PyTorch; only its apply_rotary_pos_emb call runs "
            "tigon.functional.rope.",
    "lm_head_loss": "lm_head_loss: the fused path applies in training with labels (logits=None then); without labels "
                    "or in eval the original forward runs.",
    "lora": "lora: each fused PEFT LoRA layer runs tigon.functional.lora_linear (base matmul and adapter in one node); "
            "in an MLP that runs as one LoRA node (mlp: lora_glu_mlp / lora_gate_up_mlp), or an attention whose "
            "q / k / v run with its rotary as one (rope: lora_qkv_rope), those projections are not "
            "called on their own.",
}
"""Patch kind -> what ``tigon inspect`` tells a user about it when the model has it."""

DRY_RUN_SILENT_NOTES = ("rope: transformers.",)
"""Prefixes of engine notes that a dry run on a weightless copy (``tigon inspect``) leaves out."""


@dataclass(frozen=True)
class PatchEntry:
    """One patched (or skipped) target.

    kind: ``"rms_norm"``, ``"layer_norm"``, ``"fused_add_rms_norm"`` (a decoder layer's residual add and
        post-attention norm), ``"mlp"``, ``"rope"``, ``"sinks"`` (an attention with sinks run by torch SDPA,
        :mod:`tigon.integrations.sink_attention`), ``"vision_attention"`` (a vision tower's packed attention batched
        by chunk length, :mod:`tigon.integrations.varlen_attention`), ``"lm_head_loss"`` or ``"lora"`` (a PEFT LoRA
        linear layer).
    target: a module path inside the model (``"model.layers.0.input_layernorm"``) for instance-level patches, or a
        qualified class / function name (``"transformers.models.llama.modeling_llama.LlamaRMSNorm.forward"``) for
        class-level patches.
    detail: for a replacement, what runs now; for a skipped target, why it was left alone.
    ops: for a replacement, the :mod:`tigon.functional` op(s) it runs (``("glu_linear",)`` for an MLP whose down
        projection is folded in, ``("fused_linear_cross_entropy",)`` for the LM head in training); empty for
        skipped entries, restorations, and class-level MLPs (the activation is read from each model's config).
    checkpoint_ops: the op(s) it runs instead inside a non-reentrant activation checkpoint (HF's gradient
        checkpointing), where they differ from ``ops``: ``("swiglu",)`` for a gated MLP whose down projection then
        runs as the module's own ``nn.Linear`` (:func:`tigon.integrations.child_calls.under_checkpoint`); ``()`` for a
        non-gated MLP, which runs its original forward there (``act_linear`` saves nothing a checkpoint keeps);
        None: ``ops``.
    """

    kind: str
    target: str
    detail: str = ""
    ops: tuple[str, ...] = ()
    checkpoint_ops: tuple[str, ...] | None = None


@dataclass
class PatchReport:
    """The outcome of :func:`tigon.patch` (``action="patch"``) or :func:`tigon.unpatch` (``action="unpatch"``).

    Attributes:
        family: the model family spec that was applied (``"llama"``), ``"generic"`` (the generic matcher), or a
            container's model type where its own class is of no family and its towers' are applied
            (``"llava_next_video (no family)"``).
        level: ``"instance"`` (a built model) or ``"class"`` (the family's classes, before building models).
        action: ``"patch"`` or ``"unpatch"``.
        replaced: entries that were replaced (for unpatch: restored).
        skipped: entries that were requested but could not be patched, with the reason. ``strict=True`` turns
            these into a ValueError.
        already_patched: entries that were already patched by Tigon (patching is idempotent).
        notes: free-text remarks: options that were turned off, kinds absent from the model, how rope is scoped.
    """

    family: str
    level: str
    action: str = "patch"
    replaced: list[PatchEntry] = field(default_factory=list)
    skipped: list[PatchEntry] = field(default_factory=list)
    already_patched: list[PatchEntry] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        """Number of replaced entries per kind, e.g. ``{"rms_norm": 5, "mlp": 2, "rope": 2, "lm_head_loss": 1}``."""
        return dict(Counter(e.kind for e in self.replaced))

    @property
    def skipped_counts(self) -> dict[str, int]:
        """Number of skipped entries per kind."""
        return dict(Counter(e.kind for e in self.skipped))

    @property
    def ok(self) -> bool:
        """True when nothing requested was skipped."""
        return not self.skipped

    def as_dict(self) -> dict:
        """A JSON-serialisable dict (entries as dicts, plus ``counts`` and ``skipped_counts``)."""
        d = asdict(self)
        d["counts"] = self.counts
        d["skipped_counts"] = self.skipped_counts
        return d

    # ---- rendering -------------------------------------------------------------------------------------------
    def _groups(self, entries: list[PatchEntry]) -> list[tuple[str, int, list[str], str]]:
        """Group entries by (kind, detail); layer indices in targets are folded to ``*``."""
        groups: dict[tuple[str, str], list[str]] = {}
        for e in entries:
            groups.setdefault((e.kind, e.detail), []).append(e.target)
        rows = []
        order = {k: i for i, k in enumerate(_KIND_ORDER)}
        for (kind, detail), targets in sorted(groups.items(), key=lambda kv: order.get(kv[0][0], len(order))):
            folded = list(dict.fromkeys(re.sub(r"\.\d+(?=\.|$)", ".*", t) for t in targets))
            rows.append((kind, len(targets), folded, detail))
        return rows

    def __str__(self) -> str:
        verb = "patched" if self.action == "patch" else "restored"
        lines = [f"tigon.{self.action}: family={self.family} level={self.level}"]
        for title, entries in ((verb, self.replaced), ("already patched", self.already_patched),
                               ("skipped", self.skipped)):
            if not entries:
                continue
            lines.append(f"  {title}:")
            for kind, n, targets, detail in self._groups(entries):
                lines.append(f"    {kind:<18} x{n:<4} {', '.join(targets)}")
                if detail:
                    lines.append(f"    {'':<24} -> {detail}")
        if not (self.replaced or self.already_patched or self.skipped):
            lines.append("  nothing to do")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_table(self):
        """A :class:`rich.table.Table` with one row per (status, kind, replacement) group."""
        from rich.table import Table

        table = Table(title=f"tigon.{self.action} ({self.family}, {self.level} level)")
        for col in ("status", "kind", "count", "targets", "detail"):
            table.add_column(col, overflow="fold")
        verb = "patched" if self.action == "patch" else "restored"
        for status, style, entries in ((verb, "green", self.replaced), ("already", "cyan", self.already_patched),
                                       ("skipped", "yellow", self.skipped)):
            for kind, n, targets, detail in self._groups(entries):
                table.add_row(f"[{style}]{status}[/]", kind, str(n), "\n".join(targets), detail)
        if self.notes:
            table.caption = "\n".join(self.notes)
        return table

    def __rich__(self):
        return self.to_table()


COMPILED_AS = {"lora_qkv_rope": ("lora_linear", "rope")}
"""Op of a report entry -> the ops that run in its place inside a torch.compile graph, where the entry's call does
not take it: a patched attention runs q / k / v one by one and its rotary as ``rope`` there
(:mod:`tigon.integrations.lora_qkv`)."""


def compile_note(report: PatchReport) -> str:
    """What the replaced ops run inside a torch.compile graph, in the current compile mode (one line, or ""): the
    entries' ops, those of :data:`COMPILED_AS` replaced by what runs in their place."""
    ops = sorted({o for e in report.replaced for op in e.ops for o in COMPILED_AS.get(op, (op,))})
    if not ops:
        return ""
    by = {"kernel": [], "inductor": []}
    for op in ops:
        by[support.compiled_choice(op)].append(op)
    parts = []
    if by["inductor"]:
        parts.append(f"{', '.join(by['inductor'])} {'leaves its' if len(by['inductor']) == 1 else 'leave their'} code "
                     "to Inductor (fused with their neighbours)")
    if by["kernel"]:
        parts.append(f"{', '.join(by['kernel'])} {'runs' if len(by['kernel']) == 1 else 'run'} Tigon's kernels")
    return (f"under torch.compile (compile mode {support.compile_mode()!r}, tigon.support.set_compile_mode): "
            + "; ".join(parts))
