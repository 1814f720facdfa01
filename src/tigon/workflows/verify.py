"""Check every Tigon op against the PyTorch code it replaces, on a model's shapes (``tigon verify``).

For each op (and, for the two cross-entropy ops, each main option), each dtype and two shapes, the Tigon op and
the *original* (the PyTorch implementation it replaces, eager, at the same dtype) are both run forward and
backward, and each output and each input gradient is compared with a float64 evaluation of the original
(:func:`tigon.numerics.compare`; random non-uniform upstream gradients). Reported per tensor: the relative L2
error ``||x - truth|| / ||truth||`` and the largest absolute error ``max |x - truth|``, for Tigon and for the
original.

Pass rule, per tensor::

    tigon_err <= bound = max(FACTOR * original_err, floor[dtype of the tensor]),   FACTOR = 2

with the floors of :data:`tigon.numerics.FLOOR` (relative L2):

    float32   1e-5    (fp32 results must be within ~1e-5 of float64 whatever the original achieves)
    bfloat16  1e-4    (in practice the bound is 2x the original's own rounding error, ~1e-3)
    float16   2e-5

The floor only matters where the original is (nearly) exact; otherwise Tigon may be at most twice as far from
float64 as the PyTorch code it replaces.

The originals are the PyTorch code as Hugging Face runs it: the :mod:`tigon.reference` functions for rms_norm,
rope, swiglu / geglu and cross_entropy (they are that code), ``torch.nn.functional.layer_norm``, and for
fused_linear_cross_entropy HF's LM head in the input dtype followed by the loss on fp32-upcast logits (the
reference upcasts the matmul to fp32, which is more exact than what Tigon replaces, so it would be an unfair
baseline in bf16).

The fallback is checked too: under :func:`tigon.support.force_reference` the Tigon op must return exactly
(``torch.equal``) what :mod:`tigon.reference` returns, outputs and gradients.

Shapes come from a model config (a preset, a ``config.json`` or a checkpoint directory; default ``tiny`` on CPU,
``llama3-8b`` on CUDA): ``tokens`` x hidden / intermediate / heads / head_dim / vocab ("model" rows), and the
same with odd sizes ("odd" rows: hidden, intermediate and vocab ``(3n/4) | 1``, head_dim an even size that is not
a power of two, an odd token count). On CPU, where the kernels run in Triton's interpreter, ``tokens`` defaults
to :data:`CPU_TOKENS` and the vocabulary is capped at :data:`CPU_MAX_VOCAB` (the result lists every cap); on
CUDA the model's real sizes are used with :data:`CUDA_TOKENS` tokens.

Cases live in :data:`REGISTRY` (op -> list of :class:`VerifyCase`); :func:`register` adds one, e.g. a test that
registers a deliberately wrong op and expects verify to fail.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import functional as F
from .. import support
from ..numerics import FLOOR, compare, max_abs
from ..reference import cross_entropy as ref_ce
from ..reference import fused_linear_cross_entropy as ref_flce
from ..reference import glu as ref_glu
from ..reference import layer_norm as ref_ln
from ..reference import rms_norm as ref_rms
from ..reference import rope as ref_rope
from .compare import ConfigError

FACTOR = 2.0
"""Tigon's error may be at most this multiple of the original's (or the dtype's floor)."""

FLOORS = {str(k).removeprefix("torch."): v for k, v in FLOOR.items() if k != torch.float64}
"""The floors of the pass rule by dtype name (from :data:`tigon.numerics.FLOOR`)."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_DTYPES = ("float32", "bfloat16")
DEFAULT_MODEL = {"cpu": "tiny", "cuda": "llama3-8b"}
CPU_TOKENS = 64
"""Default token count on CPU (the interpreter runs one program instance at a time)."""
CUDA_TOKENS = 4096
"""Default token count on CUDA (e.g. 2 sequences of 2048)."""
CPU_MAX_VOCAB = 1024
"""Default vocabulary cap on CPU; e.g. Llama 3's 128,256 classes are far too slow interpreted."""
SHAPE_VARIANTS = ("model", "odd")


# ---- shapes ------------------------------------------------------------------------------------------------------
def _odd(n: int) -> int:
    return max(3, (n * 3) // 4) | 1


def _even_not_pow2(d: int) -> int:
    m = max(6, (d * 3 // 4) // 2 * 2)
    return m + 2 if m & (m - 1) == 0 else m


@dataclass(frozen=True)
class Shapes:
    """The sizes the cases are built from (all counts; ``tokens`` = batch x sequence, flattened).

    tokens, hidden, intermediate, heads (query heads), kv_heads, head_dim, vocab; rms_eps, rms_casting_mode and
    rms_offset of the family's RMSNorm (Gemma: ``"gemma"``, 1.0); rope_theta, the rotary base.
    """

    tokens: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    rms_eps: float = 1e-6
    rms_casting_mode: str = "llama"
    rms_offset: float = 0.0
    rope_theta: float = 10000.0

    def odd(self) -> Shapes:
        """The "odd" variant: hidden, intermediate, vocab -> ``(3n/4) | 1``; head_dim -> even, not a power of
        two; tokens -> odd."""
        tokens = self.tokens - 1 if self.tokens % 2 == 0 and self.tokens > 2 else self.tokens
        return dataclasses.replace(self, tokens=tokens, hidden=_odd(self.hidden),
                                   intermediate=_odd(self.intermediate), head_dim=_even_not_pow2(self.head_dim),
                                   vocab=_odd(self.vocab))


def shapes_from_config(config, tokens: int, max_vocab: int | None = None) -> tuple[Shapes, list[str]]:
    """:class:`Shapes` for a transformers config, and notes on what was capped.

    Args:
        config: a transformers config with hidden_size, intermediate_size, num_attention_heads, vocab_size.
        tokens: tokens per case (>= 2).
        max_vocab: cap on the vocabulary (None or 0: no cap).

    Raises:
        ConfigError: a required field is missing.
    """
    need = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    missing = [n for n in need if not isinstance(getattr(config, n, None), int)]
    if missing:
        raise ConfigError(f"the model config has no {', '.join(missing)} (model_type "
                          f"{getattr(config, 'model_type', None)!r}); verify needs a decoder-only LM config")
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    casting, offset = "llama", 0.0
    try:
        from ..integrations.families import family_by_name

        spec = family_by_name(getattr(config, "model_type", "") or "")
        rms = next((n for n in spec.norms if n.kind == "rms_norm"), None)
        if rms is not None:
            casting, offset = rms.casting_mode, rms.offset
    except ValueError:  # not a Tigon family: Llama's RMSNorm semantics
        pass
    rope = getattr(config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    theta = theta or getattr(config, "rope_theta", None) or 10000.0
    vocab, caps = config.vocab_size, []
    if max_vocab and vocab > max_vocab:
        caps.append(f"vocab {vocab} capped to {max_vocab} (interpreted kernels are too slow at full size; "
                    "--max-vocab changes the cap)")
        vocab = max_vocab
    shapes = Shapes(tokens=tokens, hidden=config.hidden_size, intermediate=config.intermediate_size, heads=heads,
                    kv_heads=getattr(config, "num_key_value_heads", None) or heads, head_dim=head_dim, vocab=vocab,
                    rms_eps=float(getattr(config, "rms_norm_eps", None) or 1e-6), rms_casting_mode=casting,
                    rms_offset=offset, rope_theta=float(theta))
    return shapes, caps


# ---- the originals (what Tigon replaces, as Hugging Face / PyTorch compute it) ----------------------------------
def torch_layer_norm(x, weight, bias, eps=1e-5):
    """``torch.nn.functional.layer_norm`` over the last dimension (what ``nn.LayerNorm`` calls)."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def hf_linear_cross_entropy(hidden, weight, target, bias=None, *, logit_scale=1.0, class_weight=None, **kw):
    """Hugging Face's LM head + loss: ``lm_head`` in the input dtype, then the loss on fp32-upcast logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if logit_scale != 1.0:
        logits = logits * logit_scale
    return ref_ce.cross_entropy(logits, target, class_weight, **kw)


# ---- the case registry -------------------------------------------------------------------------------------------
Builder = Callable[[Shapes, torch.dtype, torch.device, torch.Generator], dict]


@dataclass(frozen=True)
class VerifyCase:
    """One op (and option set) to verify.

    op: the op name (``--op`` selects by it); case: the option label (``"default"``, ``"label_smoothing=0.1"``).
    build: ``build(shapes, dtype, device, generator) -> inputs``, the keyword arguments of ``tigon`` and
        ``original`` (tensors on ``device``; random values from ``generator``, a generator on ``device``, so that
        the large CUDA inputs are not drawn on the host).
    grad_inputs: names of the inputs whose gradients are compared.
    tigon: the function under test; original: the PyTorch code it replaces (the error baseline);
    reference: what ``tigon`` must equal exactly under :func:`tigon.support.force_reference` (default: original).
    original_name: one line saying what ``original`` is (shown in the report).
    variants: which shapes to run, a subset of ("model", "odd").
    unit_upstream: backward with upstream gradient 1 (``loss.backward()``) instead of a random one.
    """

    op: str
    build: Builder
    grad_inputs: tuple[str, ...]
    tigon: Callable
    original: Callable
    reference: Callable | None = None
    case: str = "default"
    original_name: str = ""
    variants: tuple[str, ...] = SHAPE_VARIANTS
    unit_upstream: bool = False


REGISTRY: dict[str, list[VerifyCase]] = {}
"""op name -> its cases, in registration order."""


def register(case: VerifyCase) -> None:
    """Add ``case`` to :data:`REGISTRY` (replacing a case with the same op and case label)."""
    cases = REGISTRY.setdefault(case.op, [])
    cases[:] = [c for c in cases if c.case != case.case] + [case]


def unregister(op: str) -> None:
    """Remove every case of ``op`` from :data:`REGISTRY` (no error when absent)."""
    REGISTRY.pop(op, None)


def _randn(gen, shape, dtype, device, std=1.0, mean=0.0):
    return (torch.randn(shape, generator=gen, device=gen.device) * std + mean).to(device=device, dtype=dtype)


def _rand(gen, shape, dtype, device, low=0.5, high=1.5):
    return (torch.rand(shape, generator=gen, device=gen.device) * (high - low) + low).to(device=device, dtype=dtype)


def build_rms_norm(s: Shapes, dtype, device, gen) -> dict:
    """x (tokens, hidden), weight (hidden,), the family's eps / offset / casting mode."""
    return dict(x=_randn(gen, (s.tokens, s.hidden), dtype, device, 3.0, 0.5),
                weight=_rand(gen, (s.hidden,), dtype, device), eps=s.rms_eps, offset=s.rms_offset,
                casting_mode=s.rms_casting_mode)


def build_layer_norm(s: Shapes, dtype, device, gen) -> dict:
    """x (tokens, hidden), weight and bias (hidden,), eps 1e-5."""
    return dict(x=_randn(gen, (s.tokens, s.hidden), dtype, device, 3.0, 1.5),
                weight=_rand(gen, (s.hidden,), dtype, device), bias=_randn(gen, (s.hidden,), dtype, device),
                eps=1e-5)


def build_rope(s: Shapes, dtype, device, gen) -> dict:
    """q (B, heads, T, head_dim), k (B, kv_heads, T, head_dim) as HF attention makes them (transposed views of
    the projections), cos / sin (1, T, head_dim) HF tables in the input dtype; B x T = tokens (B = 2 when even)."""
    b = 2 if s.tokens % 2 == 0 else 1
    t, d = s.tokens // b, s.head_dim
    q = _randn(gen, (b, t, s.heads * d), dtype, device).view(b, t, s.heads, d).transpose(1, 2)
    k = _randn(gen, (b, t, s.kv_heads * d), dtype, device).view(b, t, s.kv_heads, d).transpose(1, 2)
    inv_freq = 1.0 / s.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    emb = torch.cat((torch.arange(t, dtype=torch.float32)[:, None] * inv_freq,) * 2, dim=-1)[None]
    return dict(q=q, k=k, cos=emb.cos().to(device, dtype), sin=emb.sin().to(device, dtype))


def build_glu(s: Shapes, dtype, device, gen) -> dict:
    """gate and up (tokens, intermediate); gate with std 3 so the activation's tails are reached."""
    return dict(gate=_randn(gen, (s.tokens, s.intermediate), dtype, device, 3.0),
                up=_randn(gen, (s.tokens, s.intermediate), dtype, device))


def build_glu_linear(s: Shapes, dtype, device, gen) -> dict:
    """gate and up as :func:`build_glu`, the down projection's weight (hidden, intermediate) with std
    1/sqrt(intermediate)."""
    return dict(build_glu(s, dtype, device, gen),
                weight=_randn(gen, (s.hidden, s.intermediate), dtype, device, 1.0 / math.sqrt(s.intermediate)))


def _targets(gen, n, v, device, ignore_every):
    t = torch.randint(0, v, (n,), generator=gen, device=gen.device)
    if ignore_every:
        t[::ignore_every] = -100
    return t.to(device)


def ce_builder(ignore_every: int = 0, class_weights: bool = False, **options) -> Builder:
    """A cross_entropy builder: logits (tokens, vocab) with std 3, targets (every ``ignore_every``-th -100),
    with ``class_weights`` a ``weight`` (vocab,) float32 in [0.5, 1.5), and ``options`` passed to the op."""

    def build(s: Shapes, dtype, device, gen) -> dict:
        extra = {}
        if class_weights:
            extra["weight"] = (torch.rand(s.vocab, generator=gen, device=gen.device) + 0.5).to(device)
        return dict(logits=_randn(gen, (s.tokens, s.vocab), dtype, device, 3.0),
                    target=_targets(gen, s.tokens, s.vocab, device, ignore_every), **extra, **options)

    return build


def _ce_flag(flag: str) -> Callable:
    """F.cross_entropy with ``flag`` (inplace_backward / grad_in_forward) set, on a view of the logits: as the LM
    head's output would be, a non-leaf whose gradient flows back (grad_in_forward refuses leaves)."""

    def run(logits, target, **kw):
        return F.cross_entropy(logits.view_as(logits), target, **kw, **{flag: True})

    return run


def flce_builder(ignore_every: int = 0, **options) -> Builder:
    """A fused_linear_cross_entropy builder: hidden (tokens, hidden), LM-head weight (vocab, hidden) scaled so the
    logits have std ~2, targets as :func:`ce_builder`, no bias (Llama-style head)."""

    def build(s: Shapes, dtype, device, gen) -> dict:
        w = _randn(gen, (s.vocab, s.hidden), dtype, device, 2.0 / math.sqrt(s.hidden))
        return dict(hidden=_randn(gen, (s.tokens, s.hidden), dtype, device), weight=w,
                    target=_targets(gen, s.tokens, s.vocab, device, ignore_every), **options)

    return build


LOSS_OPTIONS: dict[str, tuple[int, dict]] = {
    "ignore_index=-100": (4, {}),
    "label_smoothing=0.1": (0, {"label_smoothing": 0.1}),
    "z_loss=1e-4": (0, {"lse_square_scale": 1e-4}),
    "softcap=5.0": (0, {"softcap": 5.0}),
    "reduction=none": (4, {"reduction": "none"}),
}
"""The option rows of the two cross-entropy ops (run on the model shapes): label -> (ignore every n-th target,
options). ``ignore_index`` rows ignore every 4th target; ``reduction=none`` also has ignored targets."""


def _register_builtin() -> None:
    register(VerifyCase("rms_norm", build_rms_norm, ("x", "weight"), F.rms_norm, ref_rms.rms_norm,
                        original_name="HF LlamaRMSNorm / GemmaRMSNorm math (tigon.reference.rms_norm)"))
    register(VerifyCase("layer_norm", build_layer_norm, ("x", "weight", "bias"), F.layer_norm, torch_layer_norm,
                        reference=ref_ln.layer_norm, original_name="torch.nn.functional.layer_norm"))
    register(VerifyCase("rope", build_rope, ("q", "k"), F.rope, ref_rope.rope,
                        original_name="HF apply_rotary_pos_emb (tigon.reference.rope)"))
    register(VerifyCase("swiglu", build_glu, ("gate", "up"), F.swiglu, ref_glu.swiglu,
                        original_name="silu(gate) * up (HF LlamaMLP)"))
    geglu = lambda gate, up: F.geglu(gate, up, approximate="tanh")  # noqa: E731
    geglu_ref = lambda gate, up: ref_glu.geglu(gate, up, approximate="tanh")  # noqa: E731
    register(VerifyCase("geglu", build_glu, ("gate", "up"), geglu, geglu_ref, case="approximate=tanh",
                        original_name="gelu(gate, approximate='tanh') * up (HF GemmaMLP)"))
    for act, hf in (("silu", "HF LlamaMLP"), ("gelu_tanh", "HF GemmaMLP")):
        register(VerifyCase("glu_linear", build_glu_linear, ("gate", "up", "weight"),
                            functools.partial(F.glu_linear, activation=act),
                            functools.partial(ref_glu.glu_linear, activation=act), case=f"activation={act}",
                            original_name=f"down_proj({act}(gate) * up) ({hf})"))
    ce_name = "torch cross-entropy on fp32-upcast logits, as HF's loss (tigon.reference.cross_entropy)"
    flce_name = "HF LM head (F.linear in the input dtype) + the loss on fp32-upcast logits"
    register(VerifyCase("cross_entropy", ce_builder(), ("logits",), F.cross_entropy, ref_ce.cross_entropy,
                        original_name=ce_name))
    register(VerifyCase("fused_linear_cross_entropy", flce_builder(), ("hidden", "weight"),
                        F.fused_linear_cross_entropy, hf_linear_cross_entropy,
                        reference=ref_flce.fused_linear_cross_entropy, original_name=flce_name))
    for label, (every, opts) in LOSS_OPTIONS.items():
        register(VerifyCase("cross_entropy", ce_builder(every, **opts), ("logits",), F.cross_entropy,
                            ref_ce.cross_entropy, case=label, original_name=ce_name, variants=("model",)))
    register(VerifyCase("cross_entropy", ce_builder(4, class_weights=True), ("logits",), F.cross_entropy,
                        ref_ce.cross_entropy, case="weight", original_name=ce_name, variants=("model",)))
    register(VerifyCase("cross_entropy", ce_builder(4, lse_square_scale=1e-4), ("logits",),
                        _ce_flag("inplace_backward"), ref_ce.cross_entropy, case="inplace_backward=True",
                        original_name=ce_name, variants=("model",)))
    # grad_in_forward rounds the gradient in the forward and again when the backward scales it by an upstream other
    # than 1 (up to 2x the original's bf16 error, as its docstring says); verified for what it is for,
    # loss.backward(), where the upstream is 1 and the gradient is rounded once.
    register(VerifyCase("cross_entropy", ce_builder(4, lse_square_scale=1e-4), ("logits",),
                        _ce_flag("grad_in_forward"), ref_ce.cross_entropy, case="grad_in_forward=True (upstream 1)",
                        original_name=ce_name, variants=("model",), unit_upstream=True))
    for label, (every, opts) in LOSS_OPTIONS.items():
        register(VerifyCase("fused_linear_cross_entropy", flce_builder(every, **opts), ("hidden", "weight"),
                            F.fused_linear_cross_entropy, hf_linear_cross_entropy,
                            reference=ref_flce.fused_linear_cross_entropy, case=label, original_name=flce_name,
                            variants=("model",)))


_register_builtin()


# ---- configuration and result ------------------------------------------------------------------------------------
@dataclass
class VerifyConfig:
    """What to verify. ``None`` fields take the device's defaults.

    ops: op names from :data:`REGISTRY` (default: all). dtypes: names from :data:`DTYPES` (default: float32 and
    bfloat16). model: preset / config.json / checkpoint directory (default ``tiny`` on CPU, ``llama3-8b`` on CUDA).
    device: "auto" (CUDA if available), "cpu" or "cuda". tokens: tokens per case (default 64 on CPU, 4096 on
    CUDA). max_vocab: vocabulary cap (default 1024 on CPU, none on CUDA; 0 = no cap). seed: seeds the inputs.
    """

    ops: list[str] | None = None
    dtypes: list[str] | None = None
    model: str | None = None
    device: str = "auto"
    tokens: int | None = None
    max_vocab: int | None = None
    seed: int = 0


@dataclass
class VerifyRow:
    """One compared tensor. Errors against float64: ``*_err`` relative L2, ``*_max_abs`` max |x - truth|."""

    op: str
    case: str
    dtype: str
    shape: str
    variant: str
    tensor: str
    tigon_err: float
    original_err: float
    tigon_max_abs: float
    original_max_abs: float
    bound: float
    passed: bool


@dataclass
class FallbackRow:
    """The fallback check of one case: under force_reference, Tigon's outputs and gradients equal the reference's
    bit for bit (``equal``); ``mismatched`` names the tensors that differ."""

    op: str
    case: str
    dtype: str
    shape: str
    variant: str
    equal: bool
    mismatched: list[str] = field(default_factory=list)


@dataclass
class VerifyResult:
    """The outcome of :func:`run_verify`; :meth:`as_dict` is what ``tigon verify --json`` writes.

    passed: every row passed, every fallback check was exact and no case raised.
    device, device_name: where it ran. backend: the path Tigon's ops took (``triton``, ``interpreter``,
    ``reference``, ``mixed``); backends: per dtype, what :func:`tigon.support.decide` says and why;
    backend_usage: calls per op and backend (the fallback checks excluded).
    model: source and config summary; shapes: the "model" and "odd" :class:`Shapes`; caps: what was scaled down.
    factor, floors: the pass rule. originals: op -> what the original is.
    results: :class:`VerifyRow` dicts; fallback: :class:`FallbackRow` dicts; errors: cases that raised.
    """

    passed: bool
    device: str
    device_name: str
    backend: str
    backends: dict[str, dict[str, str]]
    backend_usage: dict[str, dict[str, int]]
    model: dict[str, Any]
    shapes: dict[str, dict[str, Any]]
    caps: list[str]
    config: dict[str, Any]
    factor: float
    floors: dict[str, float]
    originals: dict[str, str]
    results: list[dict[str, Any]]
    fallback: list[dict[str, Any]]
    errors: list[dict[str, Any]]
    versions: dict[str, str | None]
    elapsed_s: float
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (non-finite errors stay inf/NaN)."""
        return dataclasses.asdict(self)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The result rows that failed."""
        return [r for r in self.results if not r["passed"]]


ProgressFn = Callable[[int, int, str], None]


def _parse_list(value) -> list[str]:
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else [p for v in value for p in str(v).split(",")]
    return [i.strip() for i in items if i.strip()]


def resolve_config(config: VerifyConfig, registry: dict[str, list[VerifyCase]] | None = None) -> VerifyConfig:
    """Validate ``config`` and fill its defaults; returns a new config (``device`` becomes "cpu" or "cuda").

    Raises:
        ConfigError: unknown op, dtype or device, tokens < 2, max_vocab < 0, CUDA requested but absent.
    """
    registry = REGISTRY if registry is None else registry
    if config.device not in DEVICES:
        raise ConfigError(f"unknown device {config.device!r} (choose from {', '.join(DEVICES)})")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but no CUDA device is available")
    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    ops = _parse_list(config.ops) or ["all"]
    if "all" in ops:  # "all" alone or among names (e.g. "all,rms_norm"): every op
        ops = list(registry)
    unknown = [o for o in ops if o not in registry]
    if unknown:
        raise ConfigError(f"unknown op {unknown[0]!r} (available: {', '.join(registry)})")
    dtypes = _parse_list(config.dtypes) or list(DEFAULT_DTYPES)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ConfigError(f"unknown dtype {bad[0]!r} (choose from {', '.join(DTYPES)})")
    tokens = config.tokens if config.tokens is not None else (CPU_TOKENS if device == "cpu" else CUDA_TOKENS)
    if not isinstance(tokens, int) or tokens < 2:
        raise ConfigError(f"--tokens must be an integer >= 2, got {tokens!r}")
    max_vocab = config.max_vocab if config.max_vocab is not None else (CPU_MAX_VOCAB if device == "cpu" else 0)
    if not isinstance(max_vocab, int) or max_vocab < 0 or 0 < max_vocab < 2:
        raise ConfigError(f"--max-vocab must be 0 (no cap) or an integer >= 2, got {max_vocab!r}")
    return dataclasses.replace(config, ops=list(dict.fromkeys(ops)), dtypes=list(dict.fromkeys(dtypes)),
                               model=config.model or DEFAULT_MODEL[device], device=device, tokens=tokens,
                               max_vocab=max_vocab)


# ---- running -----------------------------------------------------------------------------------------------------
def _shape_label(inputs: dict, names) -> str:
    """``"x 64x128, weight 128"``: the sizes of the differentiable inputs."""
    return ", ".join(f"{n} {'x'.join(map(str, inputs[n].shape))}" for n in names
                     if isinstance(inputs.get(n), torch.Tensor))


def _outputs_and_grads(fn, inputs: dict, grad_inputs, seed: int):
    leaves = {k: (v.detach().clone().requires_grad_(k in grad_inputs) if isinstance(v, torch.Tensor) else v)
              for k, v in inputs.items()}
    out = fn(**leaves)
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    diff = []
    for o in outs:
        if isinstance(o, torch.Tensor) and o.requires_grad:
            gen = torch.Generator(device=o.device).manual_seed(seed + len(diff))
            diff.append((o, torch.randn(o.shape, generator=gen, device=o.device).to(o.dtype)))
    grads = {}
    if diff and grad_inputs:
        gs = torch.autograd.grad([o for o, _ in diff], [leaves[k] for k in grad_inputs], [u for _, u in diff],
                                 allow_unused=True)
        grads = dict(zip(grad_inputs, gs))
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outs], grads


def _fallback_mismatches(case: VerifyCase, inputs: dict, seed: int) -> list[str]:
    """Names of the outputs / gradients where Tigon under force_reference differs from the reference."""
    reference = case.reference or case.original
    with support.force_reference():
        t_out, t_grads = _outputs_and_grads(case.tigon, inputs, case.grad_inputs, seed)
    r_out, r_grads = _outputs_and_grads(reference, inputs, case.grad_inputs, seed)
    bad = []
    if len(t_out) != len(r_out):
        bad.append("outputs")
    for i, (a, b) in enumerate(zip(t_out, r_out)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and torch.equal(a, b)) and not (a is None and b is None):
            bad.append(f"out{i if i else ''}")
    for k in case.grad_inputs:
        a, b = t_grads.get(k), r_grads.get(k)
        if (a is None) != (b is None) or (a is not None and not (a.dtype == b.dtype and torch.equal(a, b))):
            bad.append(f"grad_{k}")
    return bad


class _Recorder:
    """Wraps an original so that :func:`tigon.numerics.compare`'s own evaluations of it can be read back.

    compare() runs the original three times: a no-grad probe and a differentiable run on float64 copies (the
    truth), and a differentiable run at the input dtype. The recorder keeps the outputs of the two differentiable
    runs and, through tensor hooks on the inputs, the gradients compare() takes, so the original's max-abs error
    comes out of the same evaluations (compare() itself reports only Tigon's).
    """

    def __init__(self, fn: Callable, grad_inputs):
        self.fn, self.grad_inputs = fn, tuple(grad_inputs)
        self.runs: list[dict] = []

    def __call__(self, **kwargs):
        out = self.fn(**kwargs)
        if torch.is_grad_enabled():
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            floats = [v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
            run = {"truth": bool(floats) and all(v.dtype == torch.float64 for v in floats), "grads": {},
                   "outs": [o.detach() if isinstance(o, torch.Tensor) else o for o in outs]}
            for k in self.grad_inputs:
                t = kwargs.get(k)
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(lambda g, k=k, run=run: run["grads"].__setitem__(k, g.detach()))
            self.runs.append(run)
        return out

    def max_abs(self) -> dict[str, float] | None:
        """Tensor name (``"out"``, ``"out1"``, ``"grad_x"``) -> the original's max |x - truth|, or None when the
        runs could not be told apart."""
        truth = [r for r in self.runs if r["truth"]]
        same = [r for r in self.runs if not r["truth"]]
        if len(truth) != 1 or len(same) != 1:
            return None
        t, o = truth[0], same[0]
        res = {f"out{i if i else ''}": max_abs(a, b) for i, (a, b) in enumerate(zip(o["outs"], t["outs"]))
               if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)}
        for k in self.grad_inputs:
            if k in t["grads"]:
                res[f"grad_{k}"] = max_abs(o["grads"][k], t["grads"][k]) if k in o["grads"] else float("nan")
        return res


def _usage_delta(total: dict, before: dict, after: dict) -> None:
    for op, per in after.items():
        for backend, n in per.items():
            d = n - before.get(op, {}).get(backend, 0)
            if d:
                total.setdefault(op, {})
                total[op][backend] = total[op].get(backend, 0) + d


def _seed(*parts) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode())


def plan(config: VerifyConfig, registry: dict[str, list[VerifyCase]] | None = None):
    """The units :func:`run_verify` will run: a list of ``(case, variant, dtype name)`` for a resolved config."""
    registry = REGISTRY if registry is None else registry
    return [(case, variant, dtype) for op in config.ops for case in registry[op] for variant in case.variants
            for dtype in config.dtypes]


def run_verify(
    config: VerifyConfig,
    progress: ProgressFn | None = None,
    *,
    registry: dict[str, list[VerifyCase]] | None = None,
) -> VerifyResult:
    """Verify the selected ops against their originals and float64 (see the module docstring).

    Args:
        config: what to verify; ``None`` fields take the device's defaults (:func:`resolve_config`).
        progress: optional ``progress(done, total, label)``, called before each unit (op x case x shape x dtype)
            and once at the end with ``done == total``.
        registry: the cases to draw from (default :data:`REGISTRY`).

    Returns:
        a :class:`VerifyResult`; ``passed`` is False when any tensor exceeds its bound, a fallback check is not
        exact or a case raised (recorded in ``errors``, the run continues).

    Raises:
        ConfigError: bad configuration, or a model config that cannot be read or lacks the needed sizes.
    """
    from .compare import _device_name, _device_str, versions
    from .inspect import config_summary, load_model_config

    registry = REGISTRY if registry is None else registry
    cfg = resolve_config(config, registry)
    device = torch.device(cfg.device)
    hf_config, source = load_model_config(cfg.model)
    shapes, caps = shapes_from_config(hf_config, cfg.tokens, cfg.max_vocab)
    by_variant = {"model": shapes, "odd": shapes.odd()}
    units = plan(cfg, registry)
    started = time.perf_counter()
    rows: list[VerifyRow] = []
    fallback: list[FallbackRow] = []
    errors: list[dict[str, Any]] = []
    usage: dict[str, dict[str, int]] = {}
    for i, (case, variant, dname) in enumerate(units):
        label = f"{case.op} {case.case} {variant} {dname}"
        if progress is not None:
            progress(i, len(units), label)
        dtype = DTYPES[dname]
        gen = torch.Generator(device=device).manual_seed(_seed(cfg.seed, case.op, case.case, variant, dname))
        up_seed = _seed(cfg.seed, "upstream", case.op, case.case, variant, dname) % (2**31)
        where = dict(op=case.op, case=case.case, dtype=dname, variant=variant)
        try:
            inputs = case.build(by_variant[variant], dtype, device, gen)
            shape = _shape_label(inputs, case.grad_inputs)
            before = support.backend_usage()
            original = _Recorder(case.original, case.grad_inputs)
            checks = compare(case.tigon, original, inputs, case.grad_inputs, factor=FACTOR, upstream_seed=up_seed,
                             unit_upstream=case.unit_upstream)
            _usage_delta(usage, before, support.backend_usage())
            orig_max_abs = original.max_abs()
            if orig_max_abs is None:  # compare() changed how it calls the original: measure it against itself
                orig_max_abs = {c.tensor: c.tigon_max_abs for c in compare(
                    case.original, case.original, inputs, case.grad_inputs, upstream_seed=up_seed,
                    unit_upstream=case.unit_upstream)}
        except Exception as e:  # a crashing op fails verify; the other cases still run
            errors.append(dict(where, error=f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]))
            continue
        for c in checks:
            rows.append(VerifyRow(case.op, case.case, dname, shape, variant, c.tensor, c.tigon_err, c.original_err,
                                  c.tigon_max_abs, orig_max_abs.get(c.tensor, float("nan")), c.bound, c.passed))
        try:
            bad = _fallback_mismatches(case, inputs, up_seed)
            fallback.append(FallbackRow(case.op, case.case, dname, shape, variant, not bad, bad))
        except Exception as e:
            errors.append(dict(where, error=f"fallback: {type(e).__name__}: {' '.join(str(e).split())}"[:500]))
    if progress is not None:
        progress(len(units), len(units), "done")
    elapsed = time.perf_counter() - started

    backends = {}
    for dname in cfg.dtypes:
        d = support.decide(device, DTYPES[dname])
        backends[dname] = {"backend": d.backend, "reason": d.reason}
    backend = support.describe_backend(usage)
    notes = []
    if backend == "interpreter":
        notes.append("the Tigon ops ran in Triton's CPU interpreter: the real kernel code, executed by Python; "
                     "shapes are scaled down on CPU (tokens, vocabulary cap).")
    elif backend == "reference":
        notes.append("no kernel ran: every Tigon op fell back to the PyTorch reference (see backends).")
    notes.append(f"pass rule per tensor: tigon_err <= max({FACTOR:g} x original_err, floor[dtype of the tensor]); "
                 f"floors (relative L2): " + ", ".join(f"{k} {v:g}" for k, v in FLOORS.items()) + ".")
    notes.append("errors are against a float64 evaluation of the original on the same inputs; err = relative L2, "
                 "max_abs = largest absolute difference; upstream gradients are random.")
    passed = bool(rows) and all(r.passed for r in rows) and all(f.equal for f in fallback) and not errors
    originals = {}
    for case, _, _ in units:
        originals.setdefault(case.op, case.original_name or getattr(case.original, "__qualname__", repr(case.original)))
    return VerifyResult(
        passed=passed,
        device=_device_str(device),
        device_name=_device_name(device),
        backend=backend,
        backends=backends,
        backend_usage=usage,
        model={"source": str(source), **config_summary(hf_config)},
        shapes={k: dataclasses.asdict(v) for k, v in by_variant.items()},
        caps=caps,
        config=dataclasses.asdict(cfg),
        factor=FACTOR,
        floors=dict(FLOORS),
        originals=originals,
        results=[dataclasses.asdict(r) for r in rows],
        fallback=[dataclasses.asdict(f) for f in fallback],
        errors=errors,
        versions=versions(),
        elapsed_s=elapsed,
        notes=notes,
    )
