"""The op record (:class:`OpSpec`): one per public op, declared at the bottom of the op's module in :mod:`tigon.ops`.

A record holds everything a workflow needs to know about an op, so that ``tigon verify``, ``tigon bench``,
``tigon profile``, ``tigon env``, the CLI and the tests iterate :func:`tigon.ops.registry` and name no op
themselves (the pattern of PyTorch's OpInfo, ``torch/testing/_internal/opinfo/core.py``, with far fewer fields:
one per question a workflow asks).

This module imports no Triton: records are read before ``TRITON_INTERPRET`` is decided (the CLI lists op names
while it builds its parser), and the kernels are defined only on the first kernel call.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .._checks import ALIAS, UNSET


MODES = ("fwd", "fwd_bwd")
"""The modes ``min_bytes`` and ``flops`` are asked for: the forward, and the forward plus the backward (``bwd``
is their difference)."""

CATEGORY_LABELS = {"norm": "norm", "rotary": "rotary", "activation": "activation", "lm_head_loss": "LM head + loss",
                   "lora": "LoRA layers (base matmul + adapter)", "moe": "MoE routing glue (gather, gate, combine)"}
"""What ``tigon profile`` calls the parts of a training step Tigon's ops replace (an op record's ``category``) ->
the label of its row in profile's table. A new category is added here and nowhere else."""
CATEGORIES = tuple(CATEGORY_LABELS)



@dataclass(frozen=True)
class ModelShapes:
    """A model's sizes and family semantics; each op takes its slice with :attr:`OpSpec.shape_of`.

    tokens (batch x sequence, flattened), batch (the rotary op's batch; seq = tokens // batch), hidden, intermediate,
    heads (query heads), kv_heads, head_dim, vocab: counts. rms_eps, rms_casting_mode, rms_offset: the family's
    RMSNorm (Gemma: ``"gemma"``, 1.0). rope_theta: the rotary base. rotary_dim: the rotated dims of each head
    under partial rotary (GPT-NeoX / Pythia, phi, StableLM), None when the whole head is rotated. softcap: the final
    logit soft-cap (Gemma 2), or None. lora_rank: the adapters' rank r of the LoRA ops' rows (``tigon verify
    --lora R`` sets it; otherwise 16, PEFT fine-tuning's usual r). experts, top_k, expert_intermediate: a
    mixture-of-experts model's routed experts, experts per token and each expert's intermediate size (None: the
    model's ``intermediate``); 8 and 2 for a dense model (the MoE ops' rows then time a Mixtral-like routing).
    activation: the gated MLP's, as :func:`tigon.functional.glu_linear` names it (``"silu"``, ``"gelu"``,
    ``"gelu_tanh"``: Gemma). Built from a config by :func:`tigon.workflows.model_shapes.shapes_from_config`.
    """

    tokens: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    batch: int = 1
    rms_eps: float = 1e-6
    rms_casting_mode: str = "llama"
    rms_offset: float = 0.0
    rope_theta: float = 10000.0
    softcap: float | None = None
    rotary_dim: int | None = None
    lora_rank: int = 16
    experts: int = 8
    top_k: int = 2
    expert_intermediate: int | None = None
    activation: str = "silu"

    @property
    def seq(self) -> int:
        """Positions per sequence: ``tokens // batch``."""
        return max(1, self.tokens // self.batch)

    def odd(self) -> ModelShapes:
        """The "odd" variant of verify: hidden, intermediate, vocab -> ``(3n/4) | 1``; head_dim -> an even size that
        is not a power of two (a partial rotary_dim scaled with it, kept even); tokens -> odd when more than 2
        (batch 1)."""
        tokens = self.tokens - 1 if self.tokens % 2 == 0 and self.tokens > 2 else self.tokens
        head_dim = _even_not_pow2(self.head_dim)
        rotary = None if self.rotary_dim is None else max(2, self.rotary_dim * head_dim // self.head_dim // 2 * 2)
        return dataclasses.replace(self, tokens=tokens, batch=1, hidden=_odd(self.hidden),
                                   intermediate=_odd(self.intermediate), head_dim=head_dim, rotary_dim=rotary,
                                   expert_intermediate=(None if self.expert_intermediate is None
                                                        else _odd(self.expert_intermediate)),
                                   vocab=_odd(self.vocab))


def _odd(n: int) -> int:
    return max(3, (n * 3) // 4) | 1


def _even_not_pow2(d: int) -> int:
    m = max(6, (d * 3 // 4) // 2 * 2)
    return m + 2 if m & (m - 1) == 0 else m


@dataclass(frozen=True)
class Case:
    """A named option set of an op.

    label: shown in reports (``"default"``, ``"label_smoothing=0.1"``); unique within an op.
    options: keyword options passed to the op, its reference and its original after the inputs.
    inputs: keyword options of :attr:`OpSpec.make_inputs` (e.g. ``ignore_every=4``, ``class_weights=True``).
    tags: who uses the case: ``"verify"`` (a ``tigon verify`` row), ``"bench"`` (a ``tigon bench`` provider named
        :attr:`provider`), ``"quick"`` (the tests' small grid).
    variants: the verify shapes it runs on, a subset of ``("model", "odd")``.
    fn: what runs instead of the op's :attr:`OpSpec.fn` (e.g. the op on a non-leaf view of its input), or None.
    provider: the bench provider name of a ``"bench"`` case (``"tigon_inplace"``).
    unit_upstream: verify's backward takes upstream gradient 1 (``loss.backward()``) instead of a random one.
    """

    label: str = "default"
    options: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)
    tags: frozenset[str] = frozenset({"verify", "quick"})
    variants: tuple[str, ...] = ("model", "odd")
    fn: Callable | None = None
    provider: str | None = None
    unit_upstream: bool = False

    def __post_init__(self):
        unknown = set(self.tags) - {"verify", "bench", "quick"}
        if unknown:
            raise ValueError(f"Case {self.label!r}: unknown tags {sorted(unknown)}")
        if ("bench" in self.tags) != (self.provider is not None):
            raise ValueError(f"Case {self.label!r}: a bench case needs a provider name, and only a bench case has one")
        if not set(self.variants) <= {"model", "odd"}:
            raise ValueError(f"Case {self.label!r}: variants must be a subset of ('model', 'odd'), got {self.variants}")


UNDER_COMPILE = ("kernel", "inductor")
"""The values of :attr:`OpSpec.under_compile`."""
PROPERTY_VALUES: Mapping[str, tuple] = {
    "reduction": ("mean", "sum", "none"),
    "ignore_index": (-100, 0),  # 0: a real class id (a padding token 0), so some drawn targets are ignored too
    "ignore_every": (1, 2, 3),  # :func:`targets`' pattern; 1: every target ignored (an all-ignored batch)
}
"""Values the property tests (tests/test_properties.py) draw for a keyword of an op's ``fn`` or ``make_inputs`` of
this name, besides its default and the values the record's cases give it (:meth:`OpSpec.option_space`): option
names that several ops share with one meaning. A builder marks ignored targets with the op's default
``ignore_index`` (as :func:`targets` does); a drawn ``ignore_index`` relabels them."""

INPLACE_OPTIONS = ("inplace_backward",)
"""Options with which an op writes its gradients into its inputs' memory by design (each op documents it): the
property tests check that every other call leaves the caller's tensors as they were."""

Builder = Callable[..., dict]
"""``make_inputs(shape, dtype, device, gen, **case.inputs) -> {name: tensor or option}`` (no tensor requires grad)."""


@dataclass(frozen=True)
class OpSpec:
    """Everything the workflows need to know about one public op (see the module docstring).

    name: the registry key, the ``tigon.functional`` name, the CLI choice.
    summary: one line for ``--help``, ``tigon env`` and the docs.
    fn: the public function (``tigon.functional.<name>``).
    reference: the plain-PyTorch definition with the same signature and semantics (:mod:`tigon.reference`): the
        fallback, the tests' oracle, and what ``fn`` must equal bit for bit under ``force_reference``.
    original: what Hugging Face / PyTorch runs at the input dtype, taking the same inputs and options (verify's
        error baseline); original_name says what it is in one line.
    eager: the plain PyTorch code ``tigon bench`` and ``tigon profile`` time as ``eager`` and ``compile`` at the
        default options (default: ``original``).
    make_inputs: builds the keyword inputs from :attr:`shape_of`'s dict (see :data:`Builder`); random values come
        from ``gen``, a generator on ``device``.
    shape_of: the op's sizes (and family options such as eps or theta) from a :class:`ModelShapes`.
    size_format, size_label: how a shape is shown (``"tokens x hidden"``; ``label(shape) -> "16384x4096"``).
    grad_inputs: the inputs whose gradients are checked and timed.
    min_bytes: ``min_bytes(shape, element_bytes, mode) -> bytes`` the op must move (each input read once, each
        output written once) for ``mode`` in :data:`MODES`; memory-bound ops. flops: ``flops(shape, mode)`` for
        matmul-bound ops. Exactly one of the two.
    cases: named option sets (:class:`Case`); the first is what ``tigon bench``'s ``tigon`` provider runs.
    bench_inputs: options of ``make_inputs`` for ``tigon bench`` and ``tigon profile`` (e.g. 10% ignored targets,
        as in training batches).
    peers: other implementations to time, ``{"liger": fn(**inputs)}``; see :data:`tigon.ops.PEER_MODULES`.
    host_syncs: bench providers that wait on the host during a call (no CUDA graph can capture them).
    grads_in_forward: bench providers whose forward forms the gradient (their ``bwd`` row gets no GB/s).
    tigon_compile: ``tigon bench`` also times ``tigon_compile``: the ``tigon`` provider's call under
        ``torch.compile`` (next to ``compile``, the original's), for ops whose call a compiled training step traces
        with its host-side code (the post-training losses, whose gradients formed in the forward are then the
        ``tigon::formed_head_grads`` custom op).
    bench_notes: provider -> what a reader of its ``tigon bench`` rows should know (printed when it ran), e.g.
        which memory an in-place variant writes.
    category: what ``tigon profile`` calls the step's time this op replaces (``"norm"``, ``"rotary"``,
        ``"activation"``, ``"lm_head_loss"``, ``"lora"``).
    sweeps: the bench sweep axes that apply (``"tokens"``, the default; ``"hidden"`` also for ops whose shape has a
        ``hidden`` entry that the sweep replaces: the row-wise norms).
    under_compile: what the op runs inside a ``torch.compile`` graph in compile mode ``"auto"``
        (:func:`tigon.support.set_compile_mode`): ``"kernel"`` (its Triton kernels as a custom op, opaque to
        Inductor) or ``"inductor"`` (its reference, traced, so Inductor fuses it with its neighbours: for row-wise
        ops, whose kernel is a fusion barrier that costs more than it saves there).
    custom_op: whether the op's kernels are a ``torch.library`` custom op that a compiled graph can call (compile
        mode ``"kernels"``). Without one (False) a compiled graph traces its reference in every mode, which
        :func:`tigon.support.compiled_choice` (the backend count, the patch report's compile note) then says;
        ``under_compile`` must be ``"inductor"``.
    leading_dims: the inputs that take any leading dimensions, (..., N) for the (tokens, N) that ``make_inputs``
        builds (the norms' x, the GLUs' gate and up); the property tests view their tokens as (batch, seq, N).
    host_bound_elements: the size (elements of the op's first input: the GLUs' tokens x intermediate) at or below
        which a module patched by ``tigon.patch`` runs on a CUDA GPU the original module's own code (its ATen ops,
        whose C++ autograd nodes cost the host less than the op's Python ``autograd.Function`` and Triton launches)
        instead of the kernels: sizes where a training step waits on the host, not on the kernels, so the original's
        extra memory passes cost less than the host time saved. The original's numerics exactly, as unpatched.
        0: always the kernels. ``TIGON_HOST_BOUND_ELEMENTS`` overrides it for every op (0 turns it off), for
        measuring; the patch report states the threshold.
    """

    name: str
    summary: str
    fn: Callable
    reference: Callable
    original: Callable
    original_name: str
    make_inputs: Builder
    shape_of: Callable[[ModelShapes], dict]
    size_format: str
    size_label: Callable[[dict], str]
    grad_inputs: tuple[str, ...]
    category: str
    min_bytes: Callable[[dict, int, str], float] | None = None
    flops: Callable[[dict, str], float] | None = None
    eager: Callable | None = None
    cases: tuple[Case, ...] = (Case(),)
    bench_inputs: Mapping[str, Any] = field(default_factory=dict)
    peers: Mapping[str, Callable] = field(default_factory=dict)
    host_syncs: tuple[str, ...] = ()
    grads_in_forward: tuple[str, ...] = ()
    tigon_compile: bool = False
    bench_notes: Mapping[str, str] = field(default_factory=dict)
    sweeps: tuple[str, ...] = ("tokens",)
    under_compile: str = "kernel"
    custom_op: bool = True
    leading_dims: tuple[str, ...] = ()
    host_bound_elements: int = 0

    def __post_init__(self):
        if not isinstance(self.host_bound_elements, int) or self.host_bound_elements < 0:
            raise ValueError(f"{self.name}: host_bound_elements must be an int >= 0, got {self.host_bound_elements!r}")
        if self.under_compile not in UNDER_COMPILE:
            raise ValueError(f"{self.name}: under_compile must be one of {UNDER_COMPILE}, got {self.under_compile!r}")
        if not self.custom_op and self.under_compile != "inductor":
            raise ValueError(f"{self.name}: an op without a custom op (custom_op=False) runs its traced reference "
                             f"under torch.compile: under_compile must be 'inductor', got {self.under_compile!r}")
        if (self.min_bytes is None) == (self.flops is None):
            raise ValueError(f"OpSpec {self.name!r}: give exactly one of min_bytes (memory-bound) and flops")
        labels = [c.label for c in self.cases]
        if len(set(labels)) != len(labels) or not self.cases_tagged("verify"):
            raise ValueError(f"OpSpec {self.name!r}: case labels must be unique, one case at least for verify: "
                             f"{labels}")
        providers = [c.provider for c in self.cases if c.provider]
        if len(set(providers)) != len(providers):
            raise ValueError(f"OpSpec {self.name!r}: bench providers of the cases repeat: {providers}")
        fn_args, ref_args = _params(self.fn), _params(self.reference)
        n = min(len(fn_args), len(ref_args))
        if fn_args[:n] != ref_args[:n]:
            raise ValueError(f"OpSpec {self.name!r}: fn {fn_args} and reference {ref_args} must take the same "
                             "positional arguments")
        if self.category not in CATEGORIES:
            raise ValueError(f"OpSpec {self.name!r}: category must be one of {CATEGORIES}, got {self.category!r}")
        if not set(self.sweeps) <= {"tokens", "hidden"}:
            raise ValueError(f"OpSpec {self.name!r}: sweeps must be a subset of ('tokens', 'hidden')")
        if not set(self.leading_dims) <= set(fn_args):
            raise ValueError(f"OpSpec {self.name!r}: leading_dims {self.leading_dims} must name inputs of fn {fn_args}")

    @property
    def eager_fn(self) -> Callable:
        """The function bench times as ``eager`` (``eager``, else ``original``)."""
        return self.eager if self.eager is not None else self.original

    def cases_tagged(self, tag: str) -> tuple[Case, ...]:
        """The cases carrying ``tag`` (``"verify"``, ``"bench"`` or ``"quick"``)."""
        return tuple(c for c in self.cases if tag in c.tags)

    def case(self, label: str) -> Case:
        """The case called ``label`` (KeyError when absent)."""
        for c in self.cases:
            if c.label == label:
                return c
        raise KeyError(f"{self.name}: no case {label!r} (cases: {', '.join(c.label for c in self.cases)})")

    def option_space(self) -> tuple[dict[str, tuple], dict[str, tuple]]:
        """(options, inputs): for each keyword of ``fn`` (options) and of ``make_inputs`` (inputs) that a case sets or
        :data:`PROPERTY_VALUES` names, the values the property tests draw: its default, the cases' values, then
        :data:`PROPERTY_VALUES`' (each once, in that order)."""
        def space(fn: Callable, key: str) -> dict[str, tuple]:
            defaults = _defaults(fn)
            values: dict[str, list] = {}
            for name in [*(n for c in self.cases for n in getattr(c, key)), *PROPERTY_VALUES]:
                if name in defaults and name not in values:
                    seen = [defaults[name], *(getattr(c, key)[name] for c in self.cases if name in getattr(c, key)),
                            *PROPERTY_VALUES.get(name, ())]
                    values[name] = [v for i, v in enumerate(seen) if v not in seen[:i]]
            return {k: tuple(v) for k, v in values.items()}

        return space(self.fn, "options"), space(self.make_inputs, "inputs")

    def bytes_moved(self, shape: dict, element_bytes: int, mode: str) -> float | None:
        """Minimal bytes of one call in ``mode`` (``"fwd"``, ``"bwd"``, ``"fwd_bwd"``), or None (matmul-bound)."""
        if self.min_bytes is None:
            return None
        if mode == "bwd":
            return self.min_bytes(shape, element_bytes, "fwd_bwd") - self.min_bytes(shape, element_bytes, "fwd")
        return self.min_bytes(shape, element_bytes, mode)

    def flops_of(self, shape: dict, mode: str) -> float | None:
        """Matmul FLOPs of one call in ``mode``, or None (memory-bound; and for ``"bwd"``: fused implementations
        form the gradients in the forward)."""
        if self.flops is None or mode == "bwd":
            return None
        return self.flops(shape, mode)


def _params(fn: Callable) -> list[str]:
    """The names of ``fn``'s positional-or-keyword parameters, in order."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return []
    return [p.name for p in sig.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]


def _defaults(fn: Callable) -> dict[str, Any]:
    """``fn``'s keyword parameters that have a default, with it (not the required ones whose default is
    :data:`tigon._checks.UNSET`, and Liger-Kernel's names of them, whose default is :data:`~tigon._checks.ALIAS`)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # pragma: no cover - builtins
        return {}
    return {p.name: p.default for p in sig.parameters.values()
            if p.default is not p.empty and p.default is not UNSET and p.default is not ALIAS}


def sizes(*keys: str) -> dict[str, Any]:
    """:class:`OpSpec`'s ``size_format`` and ``size_label`` for a shape shown as its ``keys`` joined by ``x``
    (``"tokens x hidden"``, ``"16384x4096"``)."""
    return {"size_format": " x ".join(keys), "size_label": lambda s: "x".join(str(s[k]) for k in keys)}


# ---- random inputs (shared by the records' builders) -------------------------------------------------------------
def randn(gen: torch.Generator, shape, dtype, device, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
    """Normal values drawn by ``gen`` (on its own device), scaled, then cast and moved to ``device``."""
    return (torch.randn(shape, generator=gen, device=gen.device) * std + mean).to(device=device, dtype=dtype)


def rand(gen: torch.Generator, shape, dtype, device, low: float = 0.5, high: float = 1.5) -> torch.Tensor:
    """Uniform values in [low, high) drawn by ``gen``, cast and moved to ``device``."""
    return (torch.rand(shape, generator=gen, device=gen.device) * (high - low) + low).to(device=device, dtype=dtype)


def targets(gen: torch.Generator, n: int, vocab: int, device, ignore_every: int = 0,
            ignore_index: int = -100) -> torch.Tensor:
    """(n,) int64 class indices in [0, vocab), every ``ignore_every``-th set to ``ignore_index`` (0: none)."""
    t = torch.randint(0, vocab, (n,), generator=gen, device=gen.device)
    if ignore_every:
        t[::ignore_every] = ignore_index
    return t.to(device)


# ---- peers ---------------------------------------------------------------------------------------------------------
def liger(attr: str, *args: str, **kwargs: str) -> Callable:
    """A bench peer: Liger-Kernel's ``liger_kernel.transformers.functional.<attr>`` (imported on the first call),
    called with the inputs named by ``args`` positionally and ``kwargs`` (Liger keyword -> input name)."""

    def call(**inputs):
        from liger_kernel.transformers import functional as LF

        return getattr(LF, attr)(*(inputs[a] for a in args), **{k: inputs[v] for k, v in kwargs.items()})

    call.__qualname__ = f"liger_kernel.transformers.functional.{attr}"
    return call
