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

The originals are the PyTorch code as Hugging Face runs it (each record's ``original``: mostly the
:mod:`tigon.reference` function, which is that code; torch's own LayerNorm; for the fused LM-head loss
HF's LM head in the input dtype followed by the loss on fp32-upcast logits, since the reference upcasts the matmul
to fp32, which is more exact than what Tigon replaces and so an unfair baseline in bf16).

The fallback is checked too: under :func:`tigon.support.force_reference` the Tigon op must return exactly
(``torch.equal``) what :mod:`tigon.reference` returns, outputs and gradients.

Shapes come from a model config (a preset, a ``config.json``, a checkpoint directory or a cached Hub id; default
``tiny`` on CPU, ``llama3-8b`` on CUDA) as :class:`~tigon.ops.ModelShapes` (:mod:`tigon.workflows.model_shapes`):
``tokens`` x hidden / intermediate / heads / head_dim / vocab ("model" rows), and the same with odd sizes ("odd" rows:
hidden, intermediate and vocab ``(3n/4) | 1``, head_dim an even size that is not a power of two, an odd token count). On
CPU, where the kernels run in Triton's interpreter, ``tokens`` defaults to :data:`CPU_TOKENS` and the vocabulary is
capped at :data:`CPU_MAX_VOCAB` (the result lists every cap); on CUDA the model's real sizes are used with
:data:`CUDA_TOKENS` tokens.

A model given explicitly (``--model``) also picks the ops: only those :func:`tigon.patch` runs in it
(:func:`model_ops`); where it runs none, there is nothing to verify and :func:`resolve_config` says so.

The ops, their originals, input builders and option cases come from the op registry (:func:`tigon.ops.registry`:
each op's :class:`~tigon.ops.OpSpec` and its cases tagged ``"verify"``); this module names no op. A test can pass
its own registry (``run_verify(config, registry={...})``), e.g. one with a deliberately wrong op.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import ops as _ops
from .. import support
from ..numerics import FLOOR, compare, max_abs
from ..ops import Case, ModelShapes, OpSpec
from .compare import ConfigError
from .devices import DEVICES
from .model_shapes import CPU_MAX_VOCAB, ConfigFieldError
from .model_shapes import shapes_from_config as _model_shapes

FACTOR = 2.0
"""Tigon's error may be at most this multiple of the original's (or the dtype's floor)."""

FLOORS = {str(k).removeprefix("torch."): v for k, v in FLOOR.items() if k != torch.float64}
"""The floors of the pass rule by dtype name (from :data:`tigon.numerics.FLOOR`)."""

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_DTYPES = ("float32", "bfloat16")
DEFAULT_MODEL = {"cpu": "tiny", "cuda": "llama3-8b"}
CPU_TOKENS = 64
"""Default token count on CPU (the interpreter runs one program instance at a time)."""
CUDA_TOKENS = 4096
"""Default token count on CUDA (e.g. 2 sequences of 2048). (The vocabulary cap on CPU: CPU_MAX_VOCAB, from
:mod:`tigon.workflows.model_shapes`.)"""
SHAPE_VARIANTS = ("model", "odd")



def shapes_from_config(config, tokens: int, max_vocab: int | None = None) -> tuple[ModelShapes, list[str]]:
    """verify's :class:`~tigon.ops.ModelShapes` for a transformers config: ``tokens`` tokens as 2 sequences (1 for an
    odd count), and notes on what was capped (see :func:`tigon.workflows.model_shapes.shapes_from_config`).

    Raises:
        ConfigError: a required field is missing.
    """
    try:
        return _model_shapes(config, tokens, batch=2 if tokens % 2 == 0 else 1, max_vocab=max_vocab)
    except ConfigFieldError as e:
        raise ConfigError(str(e)) from e


Registry = dict[str, OpSpec]
"""op name -> record, as :func:`tigon.ops.registry` returns it."""

# ---- configuration and result ------------------------------------------------------------------------------------
@dataclass
class VerifyConfig:
    """What to verify. ``None`` fields take the device's defaults.

    ops: op names from :func:`tigon.ops.registry` (default: all, or with ``model_ops`` the model's). dtypes: names
    from :data:`DTYPES` (default: float32 and bfloat16). model: preset / config.json / checkpoint directory / cached
    Hub id (default ``tiny`` on CPU, ``llama3-8b`` on CUDA). model_ops: verify only the ops :func:`tigon.patch` runs
    in ``model`` (:func:`model_ops`); default: when ``model`` is given. device: "auto" (CUDA if available), "cpu" or
    "cuda". tokens: tokens per case (default 64 on CPU, 4096 on CUDA). max_vocab: vocabulary cap (default 1024 on
    CPU, none on CUDA; 0 = no cap). seed: seeds the inputs. lora_rank: find the model's ops with it wrapped by PEFT
    LoRA of that rank (:func:`tigon.workflows.lora.with_lora`, as ``tigon bench --e2e --lora``), so that the LoRA ops
    tigon.patch runs there are verified too, their rows at that rank (else 16: :attr:`ModelShapes.lora_rank`); implies
    ``model_ops``.
    """

    ops: list[str] | None = None
    dtypes: list[str] | None = None
    model: str | None = None
    device: str = "auto"
    tokens: int | None = None
    max_vocab: int | None = None
    seed: int = 0
    model_ops: bool | None = None
    lora_rank: int | None = None


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


def resolve_config(config: VerifyConfig, registry: Registry | None = None) -> VerifyConfig:
    """Validate ``config`` and fill its defaults; returns a new config (``device`` becomes "cpu" or "cuda").

    With ``model_ops`` (by default when ``config.model`` is given) the ops are those :func:`model_ops` finds, and
    op names given explicitly must be among them.

    Raises:
        ConfigError: unknown op, dtype or device, tokens < 2, max_vocab < 0, CUDA requested but absent; with
            ``model_ops``: a model that cannot be read, one in which tigon.patch runs no Tigon op ("nothing to
            verify"), or an op given by name that tigon.patch does not run there.
    """
    registry = _ops.registry() if registry is None else registry
    if config.device not in DEVICES:
        raise ConfigError(f"unknown device {config.device!r} (choose from {', '.join(DEVICES)})")
    if config.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but no CUDA device is available")
    device = config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    ops = _parse_list(config.ops) or ["all"]
    named = "all" not in ops  # "all" alone or among names (e.g. "all,<op>"): every op
    if not named:
        ops = list(registry)
    unknown = [o for o in ops if o not in registry]
    if unknown:
        raise ConfigError(f"unknown op {unknown[0]!r} (available: {', '.join(registry)})")
    given = config.model is not None or config.lora_rank is not None
    only_model = given if config.model_ops is None else bool(config.model_ops)
    model = config.model or DEFAULT_MODEL[device]
    if only_model:
        used = model_ops(model, registry, lora_rank=config.lora_rank)
        unused = [o for o in ops if o not in used]
        if named and unused:
            lora = f" wrapped with PEFT LoRA r={config.lora_rank}" if config.lora_rank is not None else ""
            if config.model is None:  # --lora alone: the default model picked the ops
                hint = (f"--lora without --model checks the default model ({model}): verify it without --lora, or "
                        "with --model of a model that runs it")
            else:
                hint = f"verify it without --model{' and --lora' if lora else ''}"
            raise ConfigError(f"--op {unused[0]}: tigon.patch runs no {unused[0]} in {model}{lora} (it runs "
                              f"{', '.join(used)}); {hint}")
        ops = [o for o in ops if o in used]
    dtypes = _parse_list(config.dtypes) or list(DEFAULT_DTYPES)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ConfigError(f"--dtype: unknown dtype {bad[0]!r} (choose from {', '.join(DTYPES)})")
    tokens = config.tokens if config.tokens is not None else (CPU_TOKENS if device == "cpu" else CUDA_TOKENS)
    if not isinstance(tokens, int) or tokens < 2:
        raise ConfigError(f"--tokens must be an integer >= 2, got {tokens!r}")
    max_vocab = config.max_vocab if config.max_vocab is not None else (CPU_MAX_VOCAB if device == "cpu" else 0)
    if not isinstance(max_vocab, int) or max_vocab < 0 or 0 < max_vocab < 2:
        raise ConfigError(f"--max-vocab must be 0 (no cap) or an integer >= 2, got {max_vocab!r}")
    return dataclasses.replace(config, ops=list(dict.fromkeys(ops)), dtypes=list(dict.fromkeys(dtypes)),
                               model=model, device=device, tokens=tokens, max_vocab=max_vocab, model_ops=only_model)


def model_ops(model: str, registry: Registry | None = None, *, lora_rank: int | None = None) -> list[str]:
    """The ops (registry names, in registry order) that :func:`tigon.patch` runs in MODEL with its default options:
    those its replacements declare in the dry run on the weightless model (:func:`tigon.workflows.dry_run.model_ops`,
    the source ``tigon bench --model`` reads too; with ``lora_rank``, the model wrapped with PEFT LoRA of that rank
    first).

    Raises:
        ConfigError: MODEL cannot be read or built; tigon.patch rejects it or replaces nothing in it that runs an op
            of ``registry`` (the message starts "nothing to verify" and names what was skipped).
    """
    from .dry_run import PatchRejected
    from .dry_run import model_ops as patched_ops
    from .model_source import load_model_config

    hf_config, _ = load_model_config(model)
    try:
        return patched_ops(hf_config, registry, lora_rank=lora_rank)
    except PatchRejected as e:
        raise ConfigError(f"nothing to verify in {model}: {e}") from e


def _has_sinks(hf_config) -> bool:
    """Whether the config's family declares attention with sinks (:attr:`FamilySpec.sinks`: GPT-OSS)."""
    from ..integrations.families import family_by_name

    try:
        return bool(family_by_name(str(getattr(hf_config, "model_type", ""))).sinks)
    except ValueError:  # no family of its own (the generic matcher declares no sinks)
        return False


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


def _fallback_mismatches(spec: OpSpec, case: Case, inputs: dict, seed: int) -> list[str]:
    """Names of the outputs / gradients where Tigon under force_reference differs from the reference."""
    with support.force_reference():
        t_out, t_grads = _outputs_and_grads(case.fn or spec.fn, inputs, spec.grad_inputs, seed)
    r_out, r_grads = _outputs_and_grads(spec.reference, inputs, spec.grad_inputs, seed)
    bad = []
    if len(t_out) != len(r_out):
        bad.append("outputs")
    for i, (a, b) in enumerate(zip(t_out, r_out)):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and torch.equal(a, b)) and not (a is None and b is None):
            bad.append(f"out{i if i else ''}")
    for k in spec.grad_inputs:
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


def plan(config: VerifyConfig, registry: Registry | None = None) -> list[tuple[OpSpec, Case, str, str]]:
    """The units :func:`run_verify` will run: ``(op record, case, variant, dtype name)`` for a resolved config."""
    registry = _ops.registry() if registry is None else registry
    return [(registry[op], case, variant, dtype) for op in config.ops for case in registry[op].cases_tagged("verify")
            for variant in case.variants for dtype in config.dtypes]


def run_verify(
    config: VerifyConfig,
    progress: ProgressFn | None = None,
    *,
    registry: Registry | None = None,
) -> VerifyResult:
    """Verify the selected ops against their originals and float64 (see the module docstring).

    Args:
        config: what to verify; ``None`` fields take the device's defaults (:func:`resolve_config`).
        progress: optional ``progress(done, total, label)``, called before each unit (op x case x shape x dtype)
            and once at the end with ``done == total``.
        registry: the op records to draw from (default :func:`tigon.ops.registry`).

    Returns:
        a :class:`VerifyResult`; ``passed`` is False when any tensor exceeds its bound, a fallback check is not
        exact or a case raised (recorded in ``errors``, the run continues).

    Raises:
        ConfigError: bad configuration, or a model config that cannot be read or lacks the needed sizes.
    """
    from .devices import device_name, device_str, versions
    from .inspect import config_summary
    from .model_source import load_model_config

    registry = _ops.registry() if registry is None else registry
    cfg = resolve_config(config, registry)
    device = torch.device(cfg.device)
    hf_config, source = load_model_config(cfg.model)
    shapes, caps = shapes_from_config(hf_config, cfg.tokens, cfg.max_vocab)
    if cfg.lora_rank is not None:  # the LoRA rows at the rank the model is wrapped with
        shapes = dataclasses.replace(shapes, lora_rank=cfg.lora_rank)
    by_variant = {"model": shapes, "odd": shapes.odd()}
    units = plan(cfg, registry)
    started = time.perf_counter()
    rows: list[VerifyRow] = []
    fallback: list[FallbackRow] = []
    errors: list[dict[str, Any]] = []
    usage: dict[str, dict[str, int]] = {}
    for i, (spec, case, variant, dname) in enumerate(units):
        label = f"{spec.name} {case.label} {variant} {dname}"
        if progress is not None:
            progress(i, len(units), label)
        dtype = DTYPES[dname]
        gen = torch.Generator(device=device).manual_seed(_seed(cfg.seed, spec.name, case.label, variant, dname))
        up_seed = _seed(cfg.seed, "upstream", spec.name, case.label, variant, dname) % (2**31)
        where = dict(op=spec.name, case=case.label, dtype=dname, variant=variant)
        try:
            inputs = {**spec.make_inputs(spec.shape_of(by_variant[variant]), dtype, device, gen, **case.inputs),
                      **case.options}
            shape = _shape_label(inputs, spec.grad_inputs)
            before = support.backend_usage()
            original = _Recorder(spec.original, spec.grad_inputs)
            checks = compare(case.fn or spec.fn, original, inputs, spec.grad_inputs, factor=FACTOR,
                             upstream_seed=up_seed, unit_upstream=case.unit_upstream)
            _usage_delta(usage, before, support.backend_usage())
            orig_max_abs = original.max_abs()
            if orig_max_abs is None:  # compare() changed how it calls the original: measure it against itself
                orig_max_abs = {c.tensor: c.tigon_max_abs for c in compare(
                    spec.original, spec.original, inputs, spec.grad_inputs, upstream_seed=up_seed,
                    unit_upstream=case.unit_upstream)}
        except Exception as e:  # a crashing op fails verify; the other cases still run
            errors.append(dict(where, error=f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]))
            continue
        for c in checks:
            rows.append(VerifyRow(spec.name, case.label, dname, shape, variant, c.tensor, c.tigon_err,
                                  c.original_err, c.tigon_max_abs, orig_max_abs.get(c.tensor, float("nan")), c.bound,
                                  c.passed))
        try:
            bad = _fallback_mismatches(spec, case, inputs, up_seed)
            fallback.append(FallbackRow(spec.name, case.label, dname, shape, variant, not bad, bad))
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
    if getattr(hf_config, "vision_config", None) is not None:
        notes.append("vision-language model: the shapes are its text decoder's; the vision encoder's ops (its norms, "
                     "MLPs) run the same kernels at its own width.")
    if cfg.model_ops:
        lora = f" wrapped with PEFT LoRA r={cfg.lora_rank}" if cfg.lora_rank is not None else ""
        notes.append(f"ops: those tigon.patch runs in {cfg.model}{lora} ({', '.join(cfg.ops)}); run without --model to "
                     "verify every op.")
    if cfg.model_ops and _has_sinks(hf_config):
        notes.append("attention with sinks: tigon.patch runs it on torch SDPA (tigon.integrations.sink_attention), no "
                     "op of the registry, so it is not verified here; tests/test_sink_attention.py checks it against "
                     "transformers' eager attention, and tigon compare --model trains both models.")
    if any(op.startswith("lora_") for op in cfg.ops):
        notes.append(f"LoRA rows: adapters of rank {shapes.lora_rank}"
                     f"{'' if cfg.lora_rank is not None else ' (the records default)'}, trained-like B (PEFT starts B "
                     "at 0).")
    notes.append(f"pass rule per tensor: tigon_err <= max({FACTOR:g} x original_err, floor[dtype of the tensor]); "
                 f"floors (relative L2): " + ", ".join(f"{k} {v:g}" for k, v in FLOORS.items()) + ".")
    notes.append("errors are against a float64 evaluation of the original on the same inputs; err = relative L2, "
                 "max_abs = largest absolute difference; upstream gradients are random.")
    passed = bool(rows) and all(r.passed for r in rows) and all(f.equal for f in fallback) and not errors
    originals = {spec.name: spec.original_name for spec, *_ in units}
    return VerifyResult(
        passed=passed,
        device=device_str(device),
        device_name=device_name(device),
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
