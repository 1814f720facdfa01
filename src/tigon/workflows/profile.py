"""Where a training step's time goes, what Tigon replaces, and what patching should save (``tigon profile``).

1. **Profile the original step.** A Hugging Face causal LM (preset / config, random weights from the seed) runs
   ``warmup`` untimed steps, then one profiler warm-up step and ``steps`` profiled steps under
   :mod:`torch.profiler` (CPU and, on CUDA, CUDA activities). A step is forward with labels, backward, AdamW step,
   zero_grad.
2. **Attribute time to categories**: matmul, attention, norm, rotary, activation, LM head + loss, optimizer,
   other. Forward hooks open a ``record_function`` range around norm modules (``*RMSNorm`` / ``*LayerNorm``),
   attention modules (``*Attention``), MLP modules (``*MLP``), the decoder backbone and the whole causal LM (so
   what runs in the LM but outside the backbone is the LM head + loss); the family's module-global rotary
   function (``apply_rotary_pos_emb``) is wrapped in a range while profiling; the optimizer step and zero_grad run
   in a range too. Each profiled op goes to its innermost range, refined by its name (matmuls in an attention or
   MLP module count as matmul, ``scaled_dot_product_attention`` as attention, the rest of an MLP as activation).
   Backward ops are attributed through the autograd sequence number linking each backward node to the forward
   op that created it. Time is device (kernel) time on CUDA and self CPU time on CPU, per step in ms; what no op
   covers (idle device, Python and launch overhead) is the row ``unattributed``, so the rows add up to the
   profiled step time.
3. **Mark what Tigon replaces** (:func:`tigon.patch` on a weightless copy: the op each replacement runs and its
   record's profile category, :func:`tigon.ops.registry`) and **predict**
   the patched step: each replaced category's time is scaled by the op's measured tigon / eager fwd+bwd time ratio
   at this model's shapes (:func:`tigon.workflows.bench.run_bench`), and the saving is subtracted from the
   unprofiled original step time (on CPU the saving is first scaled by unprofiled / profiled step time, since the
   profiler's overhead inflates CPU op times).
4. **Measure** the patched step (unprofiled; and profiled, for a per-category comparison) and report prediction
   vs measurement.

On CPU Tigon's kernels run in Triton's interpreter: the patched step and the bench ratios then measure the
interpreter, and the prediction only shows that the pipeline works.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..ops import CATEGORIES as OP_CATEGORIES
from ._train import train
from .compare import ConfigError, _device_name, _device_str, versions
from .e2e import DTYPES, build_model, hf_config, model_info, random_batches

CATEGORIES = ("matmul", "attention", *OP_CATEGORIES, "optimizer", "other")
"""The step's categories: the ones Tigon's ops replace (:data:`tigon.ops.CATEGORIES`) and the rest."""
LABELS = {"matmul": "matmul", "attention": "attention", "norm": "norm", "rotary": "rotary",
          "activation": "activation", "lm_head_loss": "LM head + loss", "optimizer": "optimizer", "other": "other",
          "unattributed": "unattributed (idle / host overhead)"}
DEFAULTS = {
    "cpu": dict(model="tiny", layers=None, batch_size=2, seq_len=32, steps=2, warmup=1, dtype="float32"),
    "cuda": dict(model="llama3-8b", layers=2, batch_size=4, seq_len=2048, steps=5, warmup=3, dtype="bfloat16"),
}
ProgressFn = Callable[[str], None]
"""``progress(stage)``: called when a stage starts (e.g. "profile original", "bench tigon vs eager")."""

_RANGE = "tigon.cat/"
_BWD = "autograd::engine::evaluate_function: "
_MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
               "aten::addmv", "aten::mv", "aten::_scaled_mm", "aten::addbmm"}
_MATMUL_NODES = ("MmBackward", "AddmmBackward", "BmmBackward", "LinearBackward", "MvBackward", "BaddbmmBackward",
                 "AddmvBackward", "MatmulBackward")
_ATTENTION_KEYS = ("scaled_dot_product", "scaleddotproduct", "flash_attention", "flashattention",
                   "efficient_attention", "efficientattention", "cudnn_attention", "cudnnattention")


@dataclass
class ProfileConfig:
    """What ``tigon profile`` runs. ``None`` fields take the device's defaults (:data:`DEFAULTS`).

    model: preset name, config.json, checkpoint directory or cached Hub id (config only; random weights). layers: keep N
    decoder layers. batch_size, seq_len: tokens per step. steps: profiled (and timed) steps. warmup: untimed
    steps first. dtype: "bfloat16" or "float32". device: "auto", "cpu", "cuda". trace: write the original step's
    Chrome trace there (and the patched one next to it, ``<name>.patched<ext>``). predict: run the op bench and
    predict the patched step. patched: measure the patched step. lr, seed: AdamW learning rate, weights/batches.
    attn_implementation: transformers' attention for the model ("eager", "sdpa", ...; None: transformers' default),
    as for :class:`tigon.workflows.e2e.E2EConfig`.
    """

    model: str | None = None
    layers: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    steps: int | None = None
    warmup: int | None = None
    dtype: str | None = None
    device: str = "auto"
    trace: str | None = None
    predict: bool = True
    patched: bool = True
    lr: float = 1e-4
    seed: int = 0
    attn_implementation: str | None = None


@dataclass
class CategoryRow:
    """One category of the step.

    name / label: category key and display name. ms: per-step time of the original step (device time on CUDA,
    self CPU time on CPU), ms. pct: share of the profiled original step, %. replaced: Tigon replaces this
    category's code; tigon_op: by which op. bench_ratio: tigon / eager fwd+bwd time of that op at this model's
    shapes (< 1 is faster). predicted_ms: ms * bench_ratio (profiled units). patched_ms: the category's measured
    time in the profiled patched step.
    """

    name: str
    label: str
    ms: float
    pct: float
    replaced: bool = False
    tigon_op: str | None = None
    bench_ratio: float | None = None
    predicted_ms: float | None = None
    patched_ms: float | None = None


@dataclass
class ProfileResult:
    """The outcome of :func:`run_profile`; :meth:`as_dict` is the JSON report.

    categories: :class:`CategoryRow` per category plus ``unattributed``; their ``ms`` sum to
    ``profiled_step_ms``. time_basis: what the category times measure. profiled_step_ms /
    profiled_step_ms_patched: mean wall time of a profiled step (ms). step_ms_original / step_ms_patched: median
    unprofiled step (ms). predicted_step_ms_patched: the prediction (ms); prediction_error_pct:
    100 * (predicted - measured) / measured. bench: op -> {"eager_ms", "tigon_ms", "ratio"} (fwd+bwd).
    patch: what tigon.patch replaced (counts per kind). backend: the patched run's kernel path. traces: files
    written.
    """

    config: dict[str, Any]
    model: dict[str, Any]
    device: str
    device_name: str
    time_basis: str
    categories: list[CategoryRow]
    profiled_step_ms: float
    step_ms_original: float
    profiled_step_ms_patched: float | None = None
    step_ms_patched: float | None = None
    predicted_step_ms_patched: float | None = None
    prediction_error_pct: float | None = None
    bench: dict[str, dict[str, float | None]] = field(default_factory=dict)
    patch: dict[str, int] = field(default_factory=dict)
    backend: str | None = None
    traces: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------------------------
# annotation: record_function ranges around modules, the rotary function and the optimizer


class _Annotator:
    """Forward hooks that open a ``tigon.cat/<category>`` range around the model's parts; ``remove()`` undoes."""

    def __init__(self, model: torch.nn.Module):
        self._stack: list = []
        self._handles = []
        self._rotary: tuple | None = None
        backbone = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        for m in model.modules():
            if m is model:
                cat = "lm_head_loss"   # the LM's own forward minus the backbone: LM head, logits cast, loss
            elif m is backbone:
                cat = "model"
            elif m is head:
                cat = "lm_head_loss"
            else:
                cat = _module_category(m)
            if cat:
                self._hook(m, cat)
        self._wrap_rotary(model)

    def _hook(self, m: torch.nn.Module, cat: str) -> None:
        def pre(module, args, cat=cat):
            rf = torch.profiler.record_function(_RANGE + cat)
            rf.__enter__()
            self._stack.append(rf)

        def post(module, args, output):
            if self._stack:
                self._stack.pop().__exit__(None, None, None)

        self._handles.append(m.register_forward_pre_hook(pre))
        try:
            self._handles.append(m.register_forward_hook(post, always_call=True))
        except TypeError:  # older torch: no always_call
            self._handles.append(m.register_forward_hook(post))

    def _wrap_rotary(self, model: torch.nn.Module) -> None:
        from ..integrations.families import rotary_function

        found = rotary_function(model)
        if found is None:
            return
        mod, name = found
        orig = getattr(mod, name, None)
        if callable(orig):
            @functools.wraps(orig)
            def rotary(*args, __orig=orig, **kwargs):
                with torch.profiler.record_function(_RANGE + "rotary"):
                    return __orig(*args, **kwargs)

            setattr(mod, name, rotary)
            self._rotary = (mod, name, orig, rotary)

    def close_open_ranges(self) -> None:
        while self._stack:
            self._stack.pop().__exit__(None, None, None)

    def remove(self) -> None:
        self.close_open_ranges()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._rotary is not None:
            mod, name, orig, wrapper = self._rotary
            if getattr(mod, name) is wrapper:
                setattr(mod, name, orig)
            self._rotary = None


def _module_category(m: torch.nn.Module) -> str | None:
    name = type(m).__name__
    if name.endswith(("RMSNorm", "LayerNorm")) or isinstance(m, (torch.nn.LayerNorm, getattr(torch.nn, "RMSNorm",
                                                                                             torch.nn.LayerNorm))):
        return "norm"
    if name.endswith("Attention"):
        return "attention"
    if name.endswith("MLP"):
        return "mlp"
    return None


# ----------------------------------------------------------------------------------------------------------------
# classification of profiler events


def _is_matmul(names: list[str]) -> bool:
    return any(n in _MATMUL_OPS or n.startswith(_MATMUL_NODES) for n in names)


def _is_attention(names: list[str]) -> bool:
    return any(k in n.lower() for n in names for k in _ATTENTION_KEYS)


def _category(range_cat: str | None, names: list[str]) -> str:
    if range_cat in ("lm_head_loss", "optimizer", "norm", "rotary"):
        return range_cat
    if _is_matmul(names):
        return "matmul"
    if _is_attention(names):
        return "attention"
    if range_cat == "mlp":
        return "activation"
    if range_cat == "attention":
        return "attention"
    return "other"


def _self_time_us(e, cuda: bool) -> float:
    if cuda:
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)
    return float(e.self_cpu_time_total or 0)


def categorize(events, cuda: bool) -> dict[str, float]:
    """Total self time (µs) per category of profiler ``events`` (``prof.events()``), see the module docstring.

    CPU-side events only; on CUDA each op's ``self_device_time_total`` (its kernels), on CPU its self CPU time.
    """
    cpu_events = [e for e in events if str(getattr(e, "device_type", "DeviceType.CPU")).endswith("CPU")]
    cpu_events.sort(key=lambda e: e.time_range.start)

    def info(e):
        """(backward node event or None, innermost range category or None, names from e up to the range)."""
        names, node, rng = [], None, None
        p = e
        while p is not None:
            n = p.name
            if n.startswith(_BWD):
                node = p
                break
            if n.startswith(_RANGE):
                rng = rng or n[len(_RANGE):]
                if rng:
                    break
            names.append(n)
            p = p.cpu_parent
        return node, rng, names

    fwd_seq: dict[int, str | None] = {}
    infos = []
    for e in cpu_events:
        node, rng, names = info(e)
        infos.append((e, node, rng, names))
        if node is None and getattr(e, "sequence_nr", -1) is not None and e.sequence_nr >= 0 \
                and not e.name.startswith(_RANGE):
            fwd_seq[e.sequence_nr] = rng  # the last op with this number is the one that created the node
    totals = {c: 0.0 for c in CATEGORIES}
    for e, node, rng, names in infos:
        t = _self_time_us(e, cuda)
        if t <= 0:
            continue
        if node is not None:
            node_name = node.name[len(_BWD):]
            cat = _category(fwd_seq.get(node.sequence_nr), [node_name, *names])
        else:
            cat = _category(rng if rng != "model" else None, names)
        totals[cat] += t
    return totals


# ----------------------------------------------------------------------------------------------------------------
# profiling one model


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_steps(model: torch.nn.Module, batches: list[torch.Tensor], *, device: torch.device, lr: float,
                  warmup: int, trace: str | None = None) -> tuple[dict[str, float], float]:
    """Profile training steps of ``model``: (per-step ms per category incl. "unattributed", mean step ms).

    ``batches[:warmup]`` run unprofiled, the next one is the profiler's warm-up, the rest are profiled. Writes a
    Chrome trace of the profiled steps to ``trace`` when given.
    """
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    cuda = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    annot = _Annotator(model)
    active = len(batches) - warmup - 1
    if active < 1:
        raise ValueError("profile_steps needs warmup + 2 batches at least")

    def step(batch):
        batch = batch.to(device, non_blocking=True)
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        with record_function(_RANGE + "optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        annot.close_open_ranges()

    held: dict[str, Any] = {}

    def ready(p):
        held["events"] = p.events()
        if trace:
            p.export_chrome_trace(trace)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    times = []
    try:
        for b in batches[:warmup]:
            step(b)
        _sync(device)
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
                     on_trace_ready=ready) as prof:
            for i, b in enumerate(batches[warmup:]):
                _sync(device)
                t0 = time.perf_counter()
                step(b)
                _sync(device)
                if i >= 1:
                    times.append((time.perf_counter() - t0) * 1e3)
                prof.step()
    finally:
        annot.remove()
    totals = categorize(held.get("events") or [], cuda)
    per_step = {c: us / 1e3 / active for c, us in totals.items()}
    step_ms = statistics.fmean(times)
    per_step["unattributed"] = max(0.0, step_ms - sum(per_step.values()))
    return per_step, step_ms


# ----------------------------------------------------------------------------------------------------------------
# the workflow


def resolve_profile(config: ProfileConfig) -> ProfileConfig:
    """Validate ``config`` and fill defaults; returns a new config.

    Raises:
        ConfigError: bad counts, dtype, device or attn_implementation, or a --trace path in a missing directory.
    """
    from .e2e import resolve_step_config

    cfg = resolve_step_config(config, DEFAULTS)
    if cfg.trace is not None and not os.path.isdir(os.path.dirname(os.path.abspath(cfg.trace))):
        raise ConfigError(f"--trace {cfg.trace}: directory {os.path.dirname(os.path.abspath(cfg.trace))} "
                          "does not exist")
    return cfg


def _replaced_categories(hfc) -> tuple[dict[str, str], dict[str, int], list[str]]:
    """(category -> Tigon op, patch counts, notes) from tigon.patch's dry run on a weightless copy of the model."""
    from ..integrations.families import kind_op
    from ..integrations.report import KIND_CATEGORIES
    from ..ops import registry
    from .dry_run import PatchRejected, dry_run

    try:
        with dry_run(hfc) as (_, report):
            counts = report.counts
            skipped = list(report.skipped)
    except PatchRejected as e:
        return {}, {}, [f"nothing is replaced: {e}"]
    specs = registry()
    ops: dict[str, str] = {}
    order = list(KIND_CATEGORIES)
    for kind in sorted(counts, key=lambda k: order.index(k) if k in order else len(order)):
        op = kind_op(kind, hfc)
        if op in specs:  # one op per category, in the kinds' order: the plain norm before the fused add + norm
            ops.setdefault(specs[op].category, op)
    notes = [f"tigon.patch skipped {e.kind} {e.target}: {e.detail}" for e in skipped]
    return ops, counts, notes


def _bench_ratios(hfc, ops: dict[str, str], cfg: ProfileConfig, device, dtype) -> dict[str, dict]:
    from .bench import run_bench, shapes_from_config

    cfg_dict = hfc.to_dict()
    cfg_dict.setdefault("head_dim", getattr(hfc, "head_dim", None))
    shapes = shapes_from_config(cfg_dict, tokens=cfg.batch_size * cfg.seq_len, batch=cfg.batch_size)
    names = sorted(set(ops.values()))
    res = run_bench(names, {op: [shapes[op]] for op in names}, ["eager", "tigon"], dtype, device, ceilings={},
                    modes=("fwd_bwd",))
    out = {}
    for op in names:
        ms = {r.provider: r.ms for r in res.rows if r.op == op and r.mode == "fwd_bwd"}
        e, t = ms.get("eager"), ms.get("tigon")
        out[op] = {"eager_ms": e, "tigon_ms": t, "ratio": t / e if e and t else None}
    return out


def run_profile(config: ProfileConfig, progress: ProgressFn | None = None) -> ProfileResult:
    """Profile the original training step by category, predict and measure the Tigon-patched step.

    Args:
        config: what to run; ``None`` fields take the device's defaults.
        progress: optional ``progress(stage)`` at the start of each stage.

    Returns:
        a :class:`ProfileResult` (see the module docstring for the method).

    Raises:
        ConfigError: bad configuration or an unreadable model config.
    """
    import tigon
    from .. import support

    cfg = resolve_profile(config)
    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    hfc, source = hf_config(cfg.model, cfg.layers)
    info = model_info(hfc, source)
    info["dtype"] = cfg.dtype
    vocab = int(hfc.vocab_size)
    n_timed = cfg.warmup + cfg.steps
    timed_batches = random_batches(vocab, n_timed, cfg.batch_size, cfg.seq_len, cfg.seed)
    prof_batches = random_batches(vocab, cfg.warmup + 1 + cfg.steps, cfg.batch_size, cfg.seq_len, cfg.seed + 1)
    notes: list[str] = []
    say = progress or (lambda stage: None)

    def median_step(patch: bool) -> tuple[float, str]:
        held: dict[str, Any] = {}

        def make():
            model = build_model(hfc, dtype, device, cfg.seed, cfg.attn_implementation)
            if patch:
                tigon.patch(model)
            held["model"] = model
            return model

        try:
            stats = train(make, timed_batches, lr=cfg.lr, device=device, name="patched" if patch else "original")
        finally:
            model = held.pop("model", None)
            if patch and model is not None:
                tigon.unpatch(model)
            del model
            _free(device)
        timed = stats.step_times_s[cfg.warmup:] or stats.step_times_s
        return statistics.median(timed) * 1e3, support.describe_backend(stats.backend_usage)

    def profiled(patch: bool, trace: str | None) -> tuple[dict[str, float], float]:
        model = build_model(hfc, dtype, device, cfg.seed, cfg.attn_implementation)
        try:
            if patch:
                tigon.patch(model)
            return profile_steps(model, prof_batches, device=device, lr=cfg.lr, warmup=cfg.warmup, trace=trace)
        finally:
            if patch:
                tigon.unpatch(model)
            del model
            _free(device)

    say("time original step")
    step_orig, _ = median_step(False)
    say("profile original step")
    traces = []
    cats, prof_ms = profiled(False, cfg.trace)
    if cfg.trace:
        traces.append(cfg.trace)
    replaced, counts, patch_notes = _replaced_categories(hfc)
    notes += patch_notes
    bench: dict[str, dict] = {}
    if cfg.predict and replaced:
        say("bench replaced ops (tigon vs eager)")
        try:
            bench = _bench_ratios(hfc, replaced, cfg, device, dtype)
        except Exception as e:  # the prediction is optional: record why it is missing
            notes.append(f"bench for the prediction failed: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
    rows = []
    for c in (*CATEGORIES, "unattributed"):
        ms = cats.get(c, 0.0)
        row = CategoryRow(c, LABELS[c], ms, 100.0 * ms / prof_ms if prof_ms > 0 else 0.0)
        if c in replaced:
            row.replaced, row.tigon_op = True, replaced[c]
            ratio = bench.get(replaced[c], {}).get("ratio")
            if ratio is not None:
                row.bench_ratio, row.predicted_ms = ratio, ms * ratio
        rows.append(row)
    predicted = None
    if bench and any(r.predicted_ms is not None for r in rows):
        saved = sum(r.ms - r.predicted_ms for r in rows if r.predicted_ms is not None)
        scale = 1.0 if device.type == "cuda" else (step_orig / prof_ms if prof_ms > 0 else 1.0)
        predicted = max(1e-6, step_orig - scale * saved)
    result = ProfileResult(
        config=dataclasses.asdict(cfg), model=info, device=_device_str(device), device_name=_device_name(device),
        time_basis=("CUDA kernel time (self device time of each op)" if device.type == "cuda"
                    else "self CPU time (inflated by the profiler's overhead)"),
        categories=rows, profiled_step_ms=prof_ms, step_ms_original=step_orig, bench=bench, patch=counts,
        predicted_step_ms_patched=predicted, traces=traces, versions=versions(), notes=notes)
    if cfg.patched and counts:
        say("time patched step")
        result.step_ms_patched, result.backend = median_step(True)
        say("profile patched step")
        trace_p = None
        if cfg.trace:
            stem, ext = os.path.splitext(cfg.trace)
            trace_p = f"{stem}.patched{ext or '.json'}"
        cats_p, result.profiled_step_ms_patched = profiled(True, trace_p)
        if trace_p:
            traces.append(trace_p)
        for row in rows:
            row.patched_ms = cats_p.get(row.name, 0.0)
        if predicted is not None and result.step_ms_patched:
            result.prediction_error_pct = 100.0 * (predicted - result.step_ms_patched) / result.step_ms_patched
    _add_notes(result, device)
    return result


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _add_notes(r: ProfileResult, device: torch.device) -> None:
    steps = r.config["steps"]
    r.notes.insert(0, f"categories: {r.time_basis} per step, mean of {steps} profiled step(s); 'unattributed' is "
                      "the profiled step's wall time not covered by any op (idle device, host overhead, kernels the "
                      "profiler could not link to an op), so the rows add up to the profiled step.")
    r.notes.append("prediction: original step - sum over replaced categories of time * (1 - tigon/eager fwd+bwd "
                   "ratio of the op at this model's shapes)" + (", savings scaled by unprofiled/profiled step time"
                                                                if device.type == "cpu" else ""))
    if device.type == "cpu":
        r.notes.append("CPU: Tigon's kernels run in Triton's interpreter, so the patched step, the bench ratios and "
                       "the prediction measure the interpreter; run on a CUDA GPU for real numbers.")
    elif r.step_ms_original and r.profiled_step_ms and r.profiled_step_ms > 1.5 * r.step_ms_original:
        r.notes.append("the profiled step is much slower than the unprofiled one: the step may be bound by the "
                       "host (launch overhead), where device-time savings do not shorten the step.")
