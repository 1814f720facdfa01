"""Speed and peak memory of each op, per provider, on a model's shapes (library code behind ``tigon bench``).

The ops come from the op registry (:func:`tigon.ops.registry`): each record says how to build its inputs, what
its original PyTorch code is, how many bytes or FLOPs one call must move, and which peers implement it; this module
names no op.

Providers (:data:`PROVIDERS`): ``eager`` (the original PyTorch code, as Hugging Face writes it: the record's
``eager``), ``compile`` (torch.compile of eager), ``tigon``, ``tigon_compile`` (torch.compile of Tigon's call, for
the records with ``tigon_compile``: the post-training losses), Tigon's variants (the records' cases tagged
``"bench"``: ``tigon_inplace`` = ``inplace_backward=True``, the gradients written into the inputs' memory as
Liger always does; ``tigon_fwdgrad`` = the cross-entropy's ``grad_in_forward=True``, Liger's scheme; ``tigon_lean`` =
the fused linear cross-entropy's ``accum_dtype`` = the weight's dtype, Liger's memory; ``tigon_1gib`` /
``tigon_3gib`` = the post-training losses' ``memory=1 << 30`` / ``3 << 30``, a chunk budget in bytes) and the peers of
:data:`tigon.ops.PEER_MODULES` (``liger``, ``cce``) when installed; missing ones are skipped with a note. A
provider that fails on a shape (out of memory, unsupported dtype, a signature change) is recorded as a row with
``note="failed: ..."`` and the run goes on.

Timing (:mod:`tigon.workflows.timing`): on CUDA, ``triton.testing.do_bench`` (CUDA events; median with 20/80
percentiles) on fresh random inputs for every (op, provider, shape), rotating among enough input sets that
consecutive calls do not find their inputs in the L2 cache; on CPU a wall-clock median of a few calls (the numbers
then only show that the path runs: Tigon's kernels are executed by Triton's interpreter). Modes: ``fwd`` (training
forward, inputs require grad), ``bwd`` (the backward alone: a fresh, untimed forward before every sample, so
backward passes that can run only once per forward, such as Tigon's fused linear cross-entropy or an in-place
backward, are timed like the others; providers that do their gradient work in the forward show a small ``bwd``)
and ``fwd_bwd``. Peak extra memory: ``torch.cuda.max_memory_allocated`` during one forward+backward minus the
memory held before it (inputs and upstream gradient), in bytes; the gradients produced count as extra. Not
measured on CPU (``None``).

Ceilings measured in the same run (:func:`measure_ceilings`): device-to-device copy bandwidth (bytes read +
written / time) and the matmul rate (bf16 8192^3 on CUDA). Memory-bound ops report GB/s over their record's
*minimal* bytes and % of the copy bandwidth; matmul-bound ops TFLOP/s over their matmul FLOPs and % of the matmul
rate (no TFLOP/s for their ``bwd`` row: fused implementations form the gradients during the forward).
"""

from __future__ import annotations

import csv
import gc
import importlib.util
import itertools
import json
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Callable

import torch

from .. import ops as _ops
from ..ops import OpSpec
from .bench_model import (  # noqa: F401 (this module's API)
    config_dict, model_ops, ops_not_run_note, shapes_config, shapes_from_config,
)
from .devices import device_name
from .model_shapes import CPU_MAX_VOCAB, ConfigFieldError, config_field, text_config
from .timing import (  # noqa: F401 (KERNEL_TIME_NOTE, rotation_sets: part of this module's API)
    BWD_NOTE, KERNEL_TIME_NOTE, ROTATE_L2_MULTIPLE, backward, call_cost, differentiable_outputs, kernel_time,
    measure_ceilings, peak_extra_bytes, rotation_sets, set_bytes, time_backward, time_call,
)

PROVIDERS = _ops.providers()
"""Every provider name: eager, compile, tigon, Tigon's variants, then the peers (see the module docstring)."""
COMPILED = ("compile", _ops.TIGON_COMPILE)
"""The providers that run their call under ``torch.compile`` (``dynamic=False``, one compile per op and shape)."""
MODES = ("fwd", "bwd", "fwd_bwd")
SWEEPS = ("tokens", "hidden")

# Sizes per device: the default token count of a single-shape run and the points of each sweep.
SIZES = {
    "cuda": {"tokens": 16384, "sweep_tokens": [1024 << i for i in range(7)],      # 1k .. 64k
             "sweep_hidden": [1024 << i for i in range(5)]},                         # 1024 .. 16384
    "cpu": {"tokens": 64, "sweep_tokens": [16, 32, 64, 128], "sweep_hidden": [64, 128, 256, 512]},
}
CPU_NOTE = ("CPU timings are not meaningful: Tigon's kernels run in Triton's interpreter (Python) and the sizes "
            "are tiny; they only show that every path runs. Benchmark on a CUDA GPU.")


@dataclass
class BenchRow:
    """One measurement of one (op, provider, shape, mode).

    ms, ms_p20, ms_p80: median and 20th / 80th percentile time in milliseconds (``bwd`` measured as described in
        the module docstring; ``None`` for a failed provider).
    gbps, pct_copy_bw: achieved bandwidth over the op's minimal bytes in GB/s (1e9 bytes/s) and its % of the
        measured copy bandwidth (memory-bound ops).
    tflops, pct_matmul: achieved TFLOP/s over the op's matmul FLOPs and % of the measured matmul rate (fused
        linear cross-entropy).
    peak_extra_bytes: peak memory of one forward+backward above what was held before it, bytes (``fwd_bwd`` rows
        on CUDA; None elsewhere).
    note: how ``bwd`` was measured, or ``failed: <error>``.
    size: the shape as the op's record shows it (``"16384x4096"``; see ``size_formats`` of the result).
    """

    op: str
    provider: str
    shape: dict
    dtype: str
    mode: str
    ms: float | None = None
    ms_p20: float | None = None
    ms_p80: float | None = None
    gbps: float | None = None
    pct_copy_bw: float | None = None
    tflops: float | None = None
    pct_matmul: float | None = None
    peak_extra_bytes: int | None = None
    note: str = ""
    size: str = ""


@dataclass
class BenchResult:
    """Everything one ``tigon bench`` run measured; ``as_dict()`` is the JSON written by the CLI.

    device: "cpu" or the GPU's name. ceilings: ``{"copy_gbps", "matmul_tflops", ...}`` (see
    :func:`measure_ceilings`). rows: one :class:`BenchRow` per (op, provider, shape, mode). skipped: notes about
    providers that were not run. model: where the shapes came from. sweep: None, "tokens" or "hidden".
    config: the resolved request. notes: caveats for reading the numbers. size_formats: op -> what its rows'
    ``size`` shows (``"tokens x hidden"``).
    """

    device: str
    ceilings: dict
    rows: list[BenchRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    model: dict = field(default_factory=dict)
    sweep: str | None = None
    config: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    size_formats: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        """A JSON-serialisable dict of every field (rows as dicts)."""
        return {"device": self.device, "ceilings": self.ceilings, "skipped": self.skipped, "model": self.model,
                "sweep": self.sweep, "config": self.config, "notes": self.notes, "size_formats": self.size_formats,
                "rows": [asdict(r) for r in self.rows]}

    def write_json(self, path: str) -> None:
        """Write :meth:`as_dict` to ``path`` (indented JSON)."""
        with open(path, "w") as f:
            json.dump(self.as_dict(), f, indent=1)
            f.write("\n")

    def write_csv(self, path: str) -> None:
        """Write one CSV line per row: op, provider, mode, dtype, tokens, the shape as JSON, then the numbers."""
        cols = ["op", "provider", "mode", "dtype", "tokens", "shape", "ms", "ms_p20", "ms_p80", "gbps",
                "pct_copy_bw", "tflops", "pct_matmul", "peak_extra_bytes", "note"]
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for r in self.rows:
                d = asdict(r)
                d["tokens"] = r.shape.get("tokens")
                d["shape"] = json.dumps(r.shape, sort_keys=True)
                w.writerow(["" if d[c] is None else d[c] for c in cols])


# ----------------------------------------------------------------------------------------------- providers
def op_providers(spec: OpSpec) -> dict[str, Callable[..., object]]:
    """The providers that implement ``spec``, name -> ``callable(**inputs)``: eager and compile (the record's eager
    code), tigon (the op with its first case's options; with :attr:`OpSpec.tigon_compile` also ``tigon_compile``,
    the same call compiled), each bench case's Tigon variant, and the peers."""
    base = dict(spec.cases[0].options)
    eager = partial(spec.eager_fn, **base) if base else spec.eager_fn
    out = {"eager": eager, "compile": eager, "tigon": partial(spec.fn, **base) if base else spec.fn}
    if spec.tigon_compile:
        out[_ops.TIGON_COMPILE] = out["tigon"]
    for case in spec.cases_tagged("bench"):
        opts = {**base, **case.options}
        fn = case.fn or spec.fn
        out[case.provider] = partial(fn, **opts) if opts else fn
    out.update(spec.peers)
    return out


def available_providers(requested) -> tuple[list[str], list[str]]:
    """Split ``requested`` into (available, notes about the missing ones).

    Raises:
        ValueError: an unknown provider name.
    """
    ok, notes = [], []
    for p in requested:
        if p not in PROVIDERS:
            raise ValueError(f"unknown provider {p!r}; choose from {', '.join(PROVIDERS)}")
        mod = _ops.PEER_MODULES.get(p)
        if mod and importlib.util.find_spec(mod) is None:
            notes.append(f"{p}: not installed ({mod}), skipped")
            continue
        ok.append(p)
    return ok, notes


def _raise_recompile_limit() -> None:
    """A sweep recompiles the compiled provider per shape; keep dynamo from silently falling back to eager."""
    try:
        import torch._dynamo.config as dc
    except Exception:  # pragma: no cover
        return
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dc, name) and getattr(dc, name) < 64:
            setattr(dc, name, 64)


def _fn_for(spec: OpSpec, provider: str, compiled: dict):
    fn = op_providers(spec)[provider]
    if provider in COMPILED:
        if (spec.name, provider) not in compiled:
            _raise_recompile_limit()
            compiled[spec.name, provider] = torch.compile(fn, dynamic=False)
        fn = compiled[spec.name, provider]
    return fn


def _make(spec: OpSpec, shape: dict, dtype: torch.dtype, device: torch.device) -> dict:
    """Fresh random inputs of ``spec`` at ``shape`` (its ``bench_inputs`` options), the grad inputs requiring grad."""
    gen = torch.Generator(device=device)
    gen.seed()
    inputs = spec.make_inputs(shape, dtype, device, gen, **spec.bench_inputs)
    for k in spec.grad_inputs:
        t = inputs[k]
        if t._is_view():
            # A view (e.g. q / k sliced from a qkv projection's layout) cannot be a leaf that CUDA-graph timing
            # detaches in place (triton's do_bench_cudagraph): the same values and strides in storage of its own.
            own = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            inputs[k] = t = own.copy_(t)
        t.requires_grad_(True)
    return inputs


def _calls(spec: OpSpec, provider: str, shape: dict, dtype: torch.dtype, device: torch.device, compiled: dict):
    """(fwd, fwd_bwd, inputs, douts, leaves, all_leaves) for timing ``provider`` on ``spec`` at ``shape``: the two
    calls rotate among enough input sets that consecutive calls miss the L2 cache; ``inputs``, ``douts`` and
    ``leaves`` are the first set, ``all_leaves`` every set's gradient inputs."""
    fn = _fn_for(spec, provider, compiled)
    inputs = _make(spec, shape, dtype, device)
    leaves = [inputs[k] for k in spec.grad_inputs]
    # Upstream gradients: random for tensors; 1 for a scalar loss, as loss.backward() gives it (Liger's
    # cross-entropy and Tigon's grad_in_forward skip their scaling pass then).
    douts = [torch.ones_like(t) if t.dim() == 0 else torch.randn_like(t)
             for t in differentiable_outputs(fn(**inputs))]
    # Input sets rotated call after call, so that repeated calls do not find their inputs in the L2 cache.
    sets = [(inputs, douts)]
    for _ in range(rotation_sets(set_bytes(inputs, douts), device) - 1):
        more = _make(spec, shape, dtype, device)
        sets.append((more, [d.clone() if d.dim() == 0 else torch.randn_like(d) for d in douts]))
    all_leaves = [s[0][k] for s in sets for k in spec.grad_inputs]
    for t in all_leaves:
        t.grad = None
    turn = itertools.cycle(sets)

    def fwd():
        return fn(**next(turn)[0])

    def fwd_bwd():
        ins, ds = next(turn)
        backward(differentiable_outputs(fn(**ins)), ds, [ins[k] for k in spec.grad_inputs])

    return fwd, fwd_bwd, inputs, douts, leaves, all_leaves


def bench_one(spec: OpSpec, provider: str, shape: dict, dtype: torch.dtype, device: torch.device,
              ceilings: dict, compiled: dict, modes=MODES, cuda_graph: bool = False) -> list[BenchRow]:
    """Time one (op, provider, shape) in each of ``modes`` and measure its peak extra memory.

    Returns one :class:`BenchRow` per mode (ms, GB/s or TFLOP/s against ``ceilings``; the ``fwd_bwd`` row holds
    the peak extra bytes on CUDA). Exceptions of the provider propagate (:func:`run_bench` records them).
    """
    fwd, fwd_bwd, inputs, douts, leaves, all_leaves = _calls(spec, provider, shape, dtype, device, compiled)
    fn = _fn_for(spec, provider, compiled)
    results: dict[str, tuple[float, float, float]] = {}
    by_kernels = cuda_graph and device.type == "cuda" and provider in spec.host_syncs

    def timed(f):
        if by_kernels:
            return kernel_time(f, grad_to_none=all_leaves)
        return time_call(f, device, grad_to_none=all_leaves, cuda_graph=cuda_graph)

    if "fwd" in modes:
        results["fwd"] = timed(fwd)
    if "fwd_bwd" in modes or "bwd" in modes:
        results["fwd_bwd"] = timed(fwd_bwd)
    if "bwd" in modes:
        results["bwd"] = time_backward(lambda: fn(**inputs), douts, device, leaves, results["fwd_bwd"][0])
    peak = peak_extra_bytes(fwd_bwd, leaves, device)
    elem = torch.finfo(dtype).bits // 8
    rows = []
    for mode in modes:
        ms, p20, p80 = results[mode]
        row = BenchRow(spec.name, provider, dict(shape), str(dtype).replace("torch.", ""), mode, ms, p20, p80,
                       peak_extra_bytes=peak if mode == "fwd_bwd" else None,
                       note=BWD_NOTE if mode == "bwd" else KERNEL_TIME_NOTE if by_kernels else "",
                       size=spec.size_label(shape))
        nbytes, flops = spec.bytes_moved(shape, elem, mode), spec.flops_of(shape, mode)
        if mode == "bwd" and provider in spec.grads_in_forward:
            nbytes = None  # its backward only scales (or keeps) a gradient the forward wrote: no op bytes to rate
        if nbytes and ms and ms > 0:
            row.gbps = nbytes / (ms * 1e-3) / 1e9
            if ceilings.get("copy_gbps"):
                row.pct_copy_bw = 100.0 * row.gbps / ceilings["copy_gbps"]
        if flops and ms and ms > 0:
            row.tflops = flops / (ms * 1e-3) / 1e12
            if ceilings.get("matmul_tflops"):
                row.pct_matmul = 100.0 * row.tflops / ceilings["matmul_tflops"]
        rows.append(row)
    return rows


def op_cost(spec: OpSpec, provider: str, shape: dict, dtype: torch.dtype, device: torch.device) -> dict:
    """What one forward + backward of ``provider`` on ``spec`` at ``shape`` costs the host and the device, for
    ``tigon profile``'s prediction (:mod:`tigon.workflows.predict`).

    Returns:
        :func:`tigon.workflows.timing.call_cost`'s dict: ``host_ms`` the host's time to issue one call (the device
        held busy by a sleep kernel, so the host never waits for it), ``device_ms`` the device's time to run it
        (CUDA events, its kernels back to back), ``natural_ms``, ``waited``, ``hold_ms``; on CPU the call's wall
        time as ``host_ms`` and 0 device ms. No profiler runs (it would slow the host afterwards). Exceptions of
        the provider propagate. Also ``peak_extra_bytes``: what one call allocates at its peak above its inputs
        (:func:`peak_extra_bytes`; None off CUDA).
    """
    _, fwd_bwd, _, _, first, leaves = _calls(spec, provider, shape, dtype, device, {})
    return {**call_cost(fwd_bwd, device, grad_to_none=leaves),
            "peak_extra_bytes": peak_extra_bytes(fwd_bwd, first, device)}


def plan(ops, shapes: dict[str, list[dict]], providers, registry: dict[str, OpSpec] | None = None
         ) -> list[tuple[str, str, dict]]:
    """The (op, provider, shape) triples :func:`run_bench` will measure, in order (for progress bars)."""
    specs = _ops.registry() if registry is None else registry
    return [(op, p, s) for op in ops for s in shapes[op] for p in providers if p in op_providers(specs[op])]


def run_bench(ops, shapes: dict[str, list[dict]], providers, dtype=torch.bfloat16, device=None,
              progress: Callable[[str], None] | None = None, ceilings: dict | None = None,
              modes=MODES, cuda_graph: bool = False, registry: dict[str, OpSpec] | None = None,
              on_rows: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """Benchmark ``ops`` x ``providers`` x shapes. ``shapes[op]`` is a list of shape dicts (a sweep).

    Args:
        ops: op names (:func:`tigon.ops.registry`).
        shapes: op -> list of shape dicts (see :func:`shapes_from_config`).
        providers: names from :data:`PROVIDERS`; those not installed are skipped (``result.skipped``), those
            without an implementation of an op are not run for it.
        dtype, device: inputs' dtype and device (default CUDA when available).
        progress: called with a label before each (op, provider, shape).
        ceilings: reuse these instead of measuring (:func:`measure_ceilings`); ``{}`` skips the % columns.
        modes: subset of :data:`MODES`.
        cuda_graph: time fwd and fwd_bwd as CUDA-graph replays (kernel time without host overhead; CUDA only).
        registry: the op records to draw from (default :func:`tigon.ops.registry`).
        on_rows: called with the result so far after each (op, provider, shape), e.g. to write it to disk so that
            a run stopped by a time limit keeps what it measured.

    Returns:
        a :class:`BenchResult`; a provider that raises on a shape gets one ``fwd_bwd`` row with ``ms=None`` and
        ``note="failed: ..."``.

    Raises:
        ValueError: an unknown op or provider.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    specs = _ops.registry() if registry is None else registry
    for op in ops:
        if op not in specs:
            raise ValueError(f"unknown op {op!r}; choose from {', '.join(specs)}")
    avail, notes = available_providers(providers)
    result = BenchResult(device_name(device) if device.type == "cuda" else "cpu",
                         measure_ceilings(device, dtype) if ceilings is None else dict(ceilings), skipped=notes)
    result.size_formats = {op: specs[op].size_format for op in ops}
    compiled: dict = {}
    for op, p, shape in plan(ops, shapes, avail, specs):
        if progress:
            progress(f"{op} {p} {specs[op].size_label(shape)}")
        try:
            result.rows.extend(bench_one(specs[op], p, shape, dtype, device, result.ceilings, compiled, modes,
                                         cuda_graph))
        except Exception as e:  # a provider failing must not stop the run: record it
            from .compare import error_text

            result.rows.append(BenchRow(op, p, dict(shape), str(dtype).replace("torch.", ""), "fwd_bwd",
                                        note=f"failed: {type(e).__name__}: {error_text(e)}",
                                        size=specs[op].size_label(shape)))
        if on_rows:
            on_rows(result)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


# ----------------------------------------------------------------------------------------------- the workflow
@dataclass
class BenchConfig:
    """What ``tigon bench`` measures. ``None`` fields take defaults.

    ops: op names (:func:`tigon.ops.registry`), or ``["all"]``; default: the ops the model calls (:func:`model_ops`;
        for ``sweep="hidden"``, the ops whose records sweep the hidden size).
    model: preset name, config.json, checkpoint directory or cached Hub id (shapes only; no weights are read); default
        "tiny" on CPU, "llama3-8b" on CUDA.
    providers: names from :data:`PROVIDERS`; default all (without ``compile`` on CPU, where inductor compiles
        for minutes).
    sweep: None (one shape), "tokens" (:data:`SIZES`: 1k..64k tokens on CUDA) or "hidden" (the row-wise ops whose
        records list it, hidden 1024..16384 on CUDA at ``tokens`` tokens).
    dtype: "bfloat16", "float16" or "float32". tokens: tokens of a single-shape run (16384 CUDA, 64 CPU).
    device: "auto", "cpu" or "cuda".
    cuda_graph: time CUDA-graph replays (the kernels' own time, without host launch / autograd overhead).
    """

    ops: list[str] | None = None
    model: str | None = None
    providers: list[str] | None = None
    sweep: str | None = None
    dtype: str = "bfloat16"
    tokens: int | None = None
    device: str = "auto"
    cuda_graph: bool = False


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def resolve_bench(config: BenchConfig) -> tuple[BenchConfig, dict[str, list[dict]], dict, list[str]]:
    """Validate ``config`` and fill defaults: (resolved config, shapes per op, model description, notes).

    Cheap: reads a config file at most and, for the default ops, patches the weightless model (:func:`model_ops`;
    well under a second for a 70B model of a registered family). Raises:
        ConfigError: unknown op / provider / sweep / dtype / device, a sweep "hidden" with ops that do not sweep
            it, tokens < 1, an unreadable model config, default ops of a model tigon.patch runs none in.
    """
    from .devices import resolve_device
    from .errors import ConfigError

    device = resolve_device(config.device)
    sizes = SIZES[device.type]
    if config.sweep not in (None, *SWEEPS):
        raise ConfigError(f"unknown sweep {config.sweep!r} (choose from {', '.join(SWEEPS)})")
    if config.dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {config.dtype!r} (choose from {', '.join(DTYPES)})")
    if config.tokens is not None and (not isinstance(config.tokens, int) or config.tokens < 1):
        raise ConfigError(f"--tokens must be an integer >= 1, got {config.tokens!r}")
    if config.cuda_graph and device.type != "cuda":
        raise ConfigError("--cuda-graph needs a CUDA device")
    model = config.model or ("llama3-8b" if device.type == "cuda" else "tiny")
    full, desc = config_dict(model, text=False)
    # a vision-language model's sizes are its text decoder's; its ops are every tower's
    cfg = text_config(shapes_config(model, full))
    notes = []
    specs = _ops.registry()
    hidden_ops = [n for n, s in specs.items() if "hidden" in s.sweeps]
    ops = [o for item in (config.ops or []) for o in item.split(",") if o]
    if not ops:
        ops = hidden_ops if config.sweep == "hidden" else model_ops(model, notes)
    elif "all" in ops:
        ops = hidden_ops if config.sweep == "hidden" else list(specs)
    for op in ops:
        if op not in specs:
            raise ConfigError(f"unknown op {op!r} (choose from {', '.join(specs)}, or all)")
    ops = list(dict.fromkeys(ops))
    if config.ops and "all" not in config.ops:  # ops named with --op: say which the model does not run
        note = ops_not_run_note(model, ops)
        if note:
            notes.append(note)
    if config.sweep == "hidden" and any(op not in hidden_ops for op in ops):
        raise ConfigError(f"--sweep hidden applies to the row-wise ops only ({', '.join(hidden_ops)}), got "
                          f"{', '.join(op for op in ops if op not in hidden_ops)}")
    if config.providers:
        providers = [p for item in config.providers for p in item.split(",") if p]
    else:
        providers = [p for p in PROVIDERS if not (device.type == "cpu" and p in COMPILED)]
        if device.type == "cpu":
            notes.append(f"{', '.join(COMPILED)}: not run by default on CPU (inductor compile time); ask with "
                         "--providers")
    for p in providers:
        if p not in PROVIDERS:
            raise ConfigError(f"unknown provider {p!r} (choose from {', '.join(PROVIDERS)})")
    providers = list(dict.fromkeys(providers))
    tokens = config.tokens or sizes["tokens"]
    cap = CPU_MAX_VOCAB if device.type == "cpu" else None
    vocab = config_field(cfg, "vocab_size", 0)
    if cap and isinstance(vocab, int) and vocab > cap:
        notes.append(f"vocab {vocab} capped to {cap} on CPU (interpreted kernels are too slow at full size)")
    try:
        if config.sweep == "tokens":
            per_n = [shapes_from_config(cfg, tokens=n, max_vocab=cap) for n in sizes["sweep_tokens"]]
            shapes = {op: [per[op] for per in per_n] for op in ops}
        elif config.sweep == "hidden":
            per = shapes_from_config(cfg, tokens=tokens, max_vocab=cap)
            shapes = {op: [dict(per[op], hidden=h) for h in sizes["sweep_hidden"]] for op in ops}
        else:
            per = shapes_from_config(cfg, tokens=tokens, max_vocab=cap)
            shapes = {op: [per[op]] for op in ops}
    except ConfigFieldError as e:
        raise ConfigError(f"--model {model}: {e}") from e
    desc.update(name=model, model_type=full.get("model_type"),
                **{k: config_field(cfg, k) for k in ("hidden_size", "intermediate_size", "vocab_size",
                                                     "num_attention_heads", "num_key_value_heads")})
    idle = [p for p in providers if not any(p in op_providers(specs[op]) for op in ops)]
    if idle and config.providers:  # named with --providers: one note each
        notes += [f"{p}: implements none of the requested ops ({', '.join(ops)})" for p in idle]
    elif idle:  # the default list: one line
        notes.append(f"not run (none of the requested ops): {', '.join(idle)}")
    if device.type == "cpu":
        notes.append(CPU_NOTE)
    resolved = BenchConfig(ops=ops, model=model, providers=providers, sweep=config.sweep, dtype=config.dtype,
                           tokens=tokens, device=device.type, cuda_graph=config.cuda_graph)
    return resolved, shapes, desc, notes


def run_op_bench(config: BenchConfig, progress: Callable[[str], None] | None = None,
                 on_rows: Callable[[BenchResult], None] | None = None) -> BenchResult:
    """``tigon bench``: resolve ``config`` (:func:`resolve_bench`) and run :func:`run_bench` on the model's shapes
    (``on_rows``: see :func:`run_bench`; it sees the rows and ceilings, not yet the model and notes).

    Returns:
        a :class:`BenchResult` with ``model``, ``sweep``, ``config`` and ``notes`` filled in.

    Raises:
        ConfigError: see :func:`resolve_bench`; also when no requested provider is installed and implements one of
            the ops.
    """
    cfg, shapes, desc, notes = resolve_bench(config)
    avail, missing = available_providers(cfg.providers)
    specs = _ops.registry()
    if not any(p in op_providers(specs[op]) for op in cfg.ops for p in avail):
        from .compare import ConfigError

        raise ConfigError("none of the requested providers can run " + ", ".join(cfg.ops) + ": "
                          + ("; ".join(missing) if missing else f"{', '.join(cfg.providers)} implement none of them"))
    result = run_bench(cfg.ops, shapes, cfg.providers, DTYPES[cfg.dtype], torch.device(cfg.device), progress,
                       cuda_graph=cfg.cuda_graph, on_rows=on_rows)
    result.model, result.sweep, result.config = desc, cfg.sweep, asdict(cfg)
    result.notes = notes + result.notes
    ran = {(r.op, r.provider) for r in result.rows}
    result.notes += [f"{op} {provider}: {note}" for op in cfg.ops for provider, note in specs[op].bench_notes.items()
                     if (op, provider) in ran]
    if cfg.cuda_graph:
        result.notes.append("cuda_graph: fwd and fwd_bwd are CUDA-graph replays (triton.testing.do_bench_cudagraph): "
                            "kernel time without the host's launch and autograd cost; bwd rows are still timed "
                            "with events around an eager backward. Small inputs rotate among several sets "
                            f"(together >= {ROTATE_L2_MULTIPLE} x the L2 cache), since replays do not flush it. "
                            "Providers that wait on the host during a call (Liger's cross-entropy: .item()) cannot "
                            "be captured: their fwd and fwd_bwd are their kernels' summed durations per call "
                            "(torch.profiler; the gaps between kernels left out).")
    return result


def speedups(result: BenchResult | dict, mode: str = "fwd_bwd", baseline: str = "eager") -> dict:
    """``{(op, shape_json, provider): baseline_ms / provider_ms}`` for the rows of ``mode`` (None if not timed)."""
    rows = result["rows"] if isinstance(result, dict) else [asdict(r) for r in result.rows]
    base = {(r["op"], json.dumps(r["shape"], sort_keys=True)): r["ms"] for r in rows
            if r["provider"] == baseline and r["mode"] == mode}
    out = {}
    for r in rows:
        if r["mode"] != mode:
            continue
        key = (r["op"], json.dumps(r["shape"], sort_keys=True))
        b = base.get(key)
        out[key + (r["provider"],)] = b / r["ms"] if b and r["ms"] else None
    return out
