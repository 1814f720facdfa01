"""Where a training step's time goes, what limits it, and what patching it will do (``tigon profile``).

1. **Time the original step** as ``tigon bench --e2e`` does (:func:`tigon.workflows.e2e.run_provider`: the same
   code, model, batches and AdamW): the median of ``steps`` unprofiled steps after ``warmup`` is the step ``T`` the
   user sees. A step is forward with labels, backward, AdamW step, zero_grad(set_to_none=True).
2. **Measure what limits it**, on the same trained model (:func:`tigon.workflows.profile_events.step_issue`): the
   host's time to issue a full-size step ``H`` and the device's time to run it ``D``. The step is split into
   parts (embedding, each decoder layer's forward and backward, optimizer), each of fewer launches than the
   launch queue holds, and each issued behind a ``torch.cuda._sleep`` that keeps the device busy, so the host
   never waits for it: ``H`` is the parts' ``time.perf_counter`` time, ``D`` their CUDA-event time. Parts where the
   host waits anyway (a sync inside the step, a full launch queue) are reported. On CPU everything is host time
   (``H = T``, ``D = 0``).
3. **Measure each replaced op** at this model's shapes, the code it replaces (the record's ``eager``) and Tigon's,
   the same way: the host's time to issue one forward + backward and the device's time to run it
   (:func:`tigon.workflows.bench.op_cost`); the calls per step are the modules :func:`tigon.patch` replaces on a
   weightless copy of the model. The host side is also measured inside the original and the patched step (the
   self time of each replaced module, forward and backward: :func:`tigon.workflows.profile_attrib.in_step_host`),
   (kept in the report, and the per-op host change where the whole parts below are missing).
   **Measure whole parts** on the trained original model (:mod:`tigon.workflows.profile_layer`): one forward +
   backward of a decoder layer (one per group of alike layers) and of the rest of the model (embedding, final
   norm, LM head + loss), host and device time as for ``H``, unpatched, under ``tigon.patch(model)`` and under
   ``tigon.patch(model, keyword=False)`` per patch keyword (about 10 parts of ~53 calls each for a Llama-like
   model). They hold what isolated ops miss: autograd's bookkeeping of custom Functions, the integration layer's
   Python, the code between replaced modules.
4. **Predict** the patched step from both sides (:func:`tigon.workflows.predict.predict`:
   ``T' = T - pipeline(H, D) + pipeline(H', D')``, ``H'`` = ``H`` + layers x the layer's host change + the rest's
   (:class:`tigon.workflows.predict.HostModel`), ``D'`` = ``D`` + the replaced calls' kernel-time change) and
   **advise** per op: which replacements are predicted to slow the step (from the whole parts measured with that
   kind left out), the ``tigon.patch`` call that leaves them out and its predicted step
   (:func:`tigon.workflows.predict.advise`).
5. **Measure** the patched step as in 1 and 2, for the comparison.
6. **Profile** the original and the patched step (:mod:`tigon.workflows.profile_steps`: at most
   :data:`PROFILED_STEPS` steps under :mod:`torch.profiler`, after everything unprofiled: a profiler session leaves
   CUPTI attached, which slows later launches) and **attribute the device's time to categories**
   (:mod:`tigon.workflows.profile_events`): matmul, attention, norm, rotary, activation, LM head + loss, LoRA
   layers (``--lora``), optimizer, other. Forward hooks open a ``record_function`` range around norm, attention and
   MLP modules, PEFT's LoRA layers, the decoder backbone and the whole causal LM (what runs outside the backbone is
   the LM head + loss); the family's rotary function and the optimizer step run in a range too. Each op's kernels
   go to its innermost range, refined by its name (the ops of Tigon's LoRA nodes, named after them, are LoRA
   layers: base matmul, adapter, and in a LoRA MLP node its GLU too); backward ops follow the forward op that
   created their autograd node. Times are kernel time per step on CUDA (self CPU time on CPU); kernels linked to no
   op and the device's idle time get their own rows, so the rows add up to the profiled step
   (:func:`tigon.workflows.predict.step_table`).

On CPU Tigon's kernels run in Triton's interpreter: the patched step and the op costs then measure the
interpreter, and the prediction only shows that the pipeline works.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import predict as PR
from .compare import ConfigError
from .devices import device_name, device_str, versions
from .e2e import DEFAULTS, DTYPES, run_provider
from .lora import with_lora
from .e2e_models import build_model, hf_config, model_info, step_batches
from .host_memory import check_config_fits
from .profile_events import CATEGORIES, step_issue  # noqa: F401 (re-exported)
from . import profile_attrib as PA
from . import profile_layer as PL
from .profile_attrib import in_step_host
from .profile_notes import PROFILED_STEPS, add_notes as _add_notes  # noqa: F401 (re-exported)
from .profile_report import CPU_LABELS, LABELS, CategoryRow, ProfileResult, _limits, step_cost
from .profile_steps import StepProfile, profile_steps

ProgressFn = Callable[[str], None]
"""``progress(stage)``: called when a stage starts (e.g. "profile original step")."""


@dataclass
class ProfileConfig:
    """What ``tigon profile`` runs. ``None`` fields take the device's defaults (:data:`DEFAULTS`).

    model: preset name, config.json, checkpoint directory or cached Hub id (config only; random weights). layers: keep N
    decoder layers. batch_size, seq_len: tokens per step. steps: profiled (and timed) steps. warmup: untimed
    steps first. dtype: "bfloat16" or "float32". device: "auto", "cpu", "cuda". trace: write the original step's
    Chrome trace there (and the patched one next to it, ``<name>.patched<ext>``). predict: run the op bench and
    predict the patched step. patched: measure the patched step. lr, seed: AdamW learning rate, weights/batches.
    attn_implementation: transformers' attention for the model ("eager", "sdpa", ...; None: transformers' default),
    as for :class:`tigon.workflows.e2e.E2EConfig`. lora_rank: both models wrapped by PEFT as for ``bench --e2e --lora``
    (:func:`tigon.workflows.lora.with_lora`); the LoRA layers' time is a category of its own (``lora``).
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
    lora_rank: int | None = None


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


def _replacements(hfc, lora_rank: int | None = None) -> tuple[list[dict], dict[str, list[str]], dict[str, int],
                                                             list[str], dict]:
    """What tigon.patch replaces, from its dry run on a weightless copy of the model: (kinds, category -> Tigon ops,
    patch counts, notes, paths). kinds: ``{"kind", "op", "keyword", "calls", "bypasses"}`` per replaced kind that
    runs an op of the registry; calls = the modules it patches (each runs once per step); bypasses: kind -> patched
    modules of that kind the replacement no longer calls (the mark's ``bypasses`` children). paths: ``{"targets":
    {module path: kind}, "bypassed": {path of a bypassed module: the kind that bypasses it}}`` (for
    :func:`tigon.workflows.profile_attrib.in_step_host`). ``lora_rank``: PEFT wraps the model first; MLPs that all
    run as one LoRA node, and attentions whose q / k / v run with the rotary as one, are measured as that op, and
    the LoRA layers inside such a node count as bypassed."""
    from ..integrations.engine import PATCH_KEYWORDS
    from ..integrations.families import ADAPTERS, kind_op
    from ..integrations.marks import tigon_mark
    from ..integrations.moe_experts import MOE_GATE_OP
    from ..integrations.report import KIND_CATEGORIES
    from ..ops import registry
    from .dry_run import PatchRejected, dry_run

    lora_mlp_ops = {a.mlp_op for a in ADAPTERS} | {a.gate_up_op for a in ADAPTERS}
    lora_qkv_ops = {a.qkv_rope_op for a in ADAPTERS} - {None}  # an attention's q / k / v and rotary as one node
    ran: dict[str, set] = {}  # kind -> the op tuples its replacements declare
    bypass: dict[str, dict[str, int]] = {}
    paths: dict[str, dict[str, str]] = {"targets": {}, "bypassed": {}}
    try:
        with dry_run(hfc, lora_rank=lora_rank) as (model, report):
            counts, skipped = report.counts, list(report.skipped)
            kind_of = {e.target: e.kind for e in report.replaced}
            paths["targets"] = dict(kind_of)
            for e in report.replaced:
                ran.setdefault(e.kind, set()).add(e.ops)
                try:
                    m = model.get_submodule(e.target)
                except AttributeError:
                    continue
                mk = tigon_mark(m.__dict__.get("forward")) or {}
                children = mk.get("bypasses", ())
                if e.ops and e.ops[0] in lora_mlp_ops:  # the LoRA MLP's node runs its projections' adapters
                    children = tuple(n for n, _ in m.named_children())
                elif e.ops and e.ops[0] in lora_qkv_ops:  # the attention's node runs q / k / v's adapters
                    children = mk.get("qkv", ())
                for child in children:
                    if (k := kind_of.get(f"{e.target}.{child}")) is not None:
                        paths["bypassed"][f"{e.target}.{child}"] = e.kind
                        bypass.setdefault(e.kind, {})[k] = bypass.get(e.kind, {}).get(k, 0) + 1
    except PatchRejected as e:
        return [], {}, {}, [f"nothing is replaced: {e}"], paths
    specs = registry()
    order = list(KIND_CATEGORIES)
    kinds, cats = [], {}
    for kind in sorted(counts, key=lambda k: order.index(k) if k in order else len(order)):
        declared = [op for ops in ran.get(kind, ()) for op in ops]
        one = declared[0] if len(declared) == 1 else None
        # the op the replacement declared where it is the LoRA node, or a bandwidth op like the kind's usual one
        # (GPT-OSS's clamped_swiglu); not one with matmuls inside (a Llama MLP's glu_linear: the category table
        # scales the activation category by the op's ratio)
        if one in lora_mlp_ops | lora_qkv_ops or (one in specs and specs[one].flops is None):
            op = one
        elif MOE_GATE_OP in declared:  # MoE experts with Tigon's glue forward: the gate holds the activation
            op = MOE_GATE_OP
        else:
            op = kind_op(kind, hfc)
        if op in specs:
            kinds.append({"kind": kind, "op": op, "keyword": PATCH_KEYWORDS.get(kind, kind), "calls": counts[kind],
                          "bypasses": bypass.get(kind, {})})
            cats.setdefault(specs[op].category, []).append(op)
    notes = [f"tigon.patch skipped {e.kind} {e.target}: {e.detail}" for e in skipped]
    notes += [f"{kind} ({counts[kind]} module{'s' * (counts[kind] != 1)}) is replaced but not timed apart: it runs "
              f"no op of the registry ({UNTIMED.get(kind, kind)}); the per-op prediction leaves it out, and the "
              f"advice's calls keep it (tigon.patch(model, {PATCH_KEYWORDS.get(kind, kind)}=False) turns it off)"
              for kind in counts if kind != "lora" and kind_op(kind, hfc) not in specs]
    return kinds, cats, counts, notes, paths


UNTIMED = {"sinks": "eager attention with sinks run by torch SDPA",
           "vision_attention": "the vision tower's attention calls batched by chunk length"}
"""What a replaced kind that runs no op of the registry does instead (the profile's note on it)."""


def _op_costs(hfc, ops: list[str], cfg: ProfileConfig, device, dtype, notes: list[str]) -> dict[str, dict]:
    """op -> {"eager": cost, "tigon": cost} at this model's shapes (:func:`tigon.workflows.bench.op_cost`); an op
    whose measurement fails is left out with a note."""
    from ..ops import registry
    from .bench import op_cost, shapes_from_config

    cfg_dict = hfc.to_dict()
    cfg_dict.setdefault("head_dim", getattr(hfc, "head_dim", None))
    shapes = shapes_from_config(cfg_dict, tokens=cfg.batch_size * cfg.seq_len, batch=cfg.batch_size)
    specs, out = registry(), {}
    for op in dict.fromkeys(ops):
        try:
            out[op] = {p: op_cost(specs[op], p, shapes[op], dtype, device) for p in ("eager", "tigon")}
        except Exception as e:  # the prediction is optional: record why an op is missing from it
            notes.append(f"measuring {op} failed, left out of the prediction: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}")
        _free(device)
    return out


def run_profile(config: ProfileConfig, progress: ProgressFn | None = None) -> ProfileResult:
    """Time the original training step, measure what limits it, predict the Tigon-patched step and advise per op,
    measure the patched step, then profile both (see the module docstring).

    Every unprofiled measurement runs before the first profiler session: after one, CUPTI stays attached to the
    process and slows every later kernel launch (pytorch/pytorch#144455), which made the host look slower.

    Args:
        config: what to run; ``None`` fields take the device's defaults.
        progress: optional ``progress(stage)`` at the start of each stage.

    Returns:
        a :class:`ProfileResult`.

    Raises:
        ConfigError: bad configuration or an unreadable model config; a CPU run whose parameters cannot fit in the
            memory available (:func:`tigon.workflows.host_memory.check_config_fits`, as ``tigon bench --e2e``).
    """
    import tigon

    cfg = resolve_profile(config)
    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    cuda = device.type == "cuda"
    hfc, source = hf_config(cfg.model, cfg.layers, "MODEL")
    if not cuda:  # refused before any model is built, as bench --e2e does: a silent out-of-memory kill otherwise
        check_config_fits(hfc, cfg.dtype, f"MODEL {cfg.model} --layers {cfg.layers}")
    timed_batches = step_batches(hfc, cfg.warmup + cfg.steps, cfg.batch_size, cfg.seq_len, cfg.seed)
    prof_batches = step_batches(hfc, cfg.warmup + 1 + min(cfg.steps, PROFILED_STEPS), cfg.batch_size, cfg.seq_len,
                                cfg.seed + 1)
    info = model_info(hfc, source, timed_batches[0])
    info["dtype"] = cfg.dtype
    notes: list[str] = []
    stage_s: dict[str, float] = {}
    clock = [time.perf_counter(), None]

    def say(stage: str) -> None:
        """Start ``stage`` ("" at the end): the previous one's seconds go to ``stage_s``."""
        now = time.perf_counter()
        if clock[1] is not None:
            stage_s[clock[1]] = now - clock[0]
        clock[:] = [now, stage]
        if progress is not None and stage:
            progress(stage)

    def timed(provider: str):
        """The e2e bench's row of ``provider`` and, on CUDA, its step's issue measurement on the trained model;
        then, for the prediction, the host's time in the replaced modules inside the step (``in_step``)."""
        held: dict[str, Any] = {}

        def then(model):
            if cuda:
                try:
                    held["issue"], held["syncs"] = step_issue(model, timed_batches[:2], device=device, lr=cfg.lr)
                except Exception as e:  # keep the step's time and the profile; say why H and D are missing
                    notes.append(f"measuring the {provider} step's host and device time failed, so H = T and D = 0 "
                                 f"for it: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
            if cfg.predict and paths["targets"]:
                try:
                    held["in_step"] = in_step_host(
                        model, timed_batches[:2], paths["targets"], device=device, lr=cfg.lr, rounds=3 if cuda else 1,
                        bypassed=paths["bypassed"], patched=provider != "original")
                except Exception as e:  # the prediction falls back on the isolated calls' host time
                    notes.append(f"measuring the replaced modules' host time inside the {provider} step failed, so "
                                 f"the prediction uses their isolated calls': {type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:300]}")
            if cfg.predict and kinds and provider == "original":
                say("measure whole decoder layers and the rest of the model, original and patched")
                try:
                    layer_costs.append(PL.measure_variants(model, timed_batches[0], device, targets=paths["targets"],
                                                           keywords={k["kind"]: k["keyword"] for k in kinds}))
                except Exception as e:  # the prediction falls back on the per-op host changes
                    notes.append(f"measuring whole decoder layers failed, so the host prediction adds the per-op "
                                 f"host changes: {type(e).__name__}: {' '.join(str(e).split())[:300]}")

        row, _ = run_provider(provider, hfc, cfg, timed_batches, info=info, then=then)
        in_step[provider] = held.get("in_step")
        return row, held.get("issue"), held.get("syncs", [])

    def profiled(patch: bool, trace: str | None) -> StepProfile:
        model = build_model(hfc, dtype, device, cfg.seed, cfg.attn_implementation)
        if cfg.lora_rank is not None:
            model = with_lora(model, cfg.lora_rank)
        try:
            if patch:
                tigon.patch(model)
            return profile_steps(model, prof_batches, device=device, lr=cfg.lr, warmup=cfg.warmup, trace=trace)
        finally:
            if patch:
                tigon.unpatch(model)
            del model
            _free(device)

    kinds, replaced, counts, patch_notes, paths = _replacements(hfc, cfg.lora_rank)
    notes += patch_notes
    in_step: dict[str, Any] = {}
    layer_costs: list[PL.LayerCosts] = []
    say("time original step (as tigon bench --e2e), then its host and device time")
    row_o, issue_o, syncs_o = timed("original")
    step = step_cost(row_o.step_ms, issue_o)
    costs: dict[str, dict] = {}
    if cfg.predict and kinds:
        say("measure replaced ops (host and device time, original and Tigon)")
        costs = _op_costs(hfc, [k["op"] for k in kinds], cfg, device, dtype, notes)
    row_p = None
    if cfg.patched and counts:
        say("time patched step (as tigon bench --e2e), then its host and device time")
        row_p, issue_p, syncs_p = timed("tigon")
    say("profile original step")
    traces = []
    prof = profiled(False, cfg.trace)
    if cfg.trace:
        traces.append(cfg.trace)
    host = PA.host_costs(in_step.get("original"), in_step.get("tigon"))
    host_u = PA.host_costs(in_step.get("original"), in_step.get("tigon"), unheld=True)
    changes, host_basis = [], {}
    for k in kinds:
        if k["op"] in costs:
            o, t, host_basis[k["kind"]] = PR.call_costs(costs[k["op"]]["eager"], costs[k["op"]]["tigon"],
                                                        host.get(k["kind"]), host_u.get(k["kind"]))
            changes.append(PR.OpChange(k["kind"], k["op"], k["keyword"], k["calls"], o, t, k["bypasses"]))
            if host_basis[k["kind"]] == "waited":
                notes.append(f"{k['kind']} ({k['op']}): an isolated call waited for the device behind the sleep (a "
                             "sync), so its host time holds device time; its host change is taken as none")
    table, scale = PR.step_table(prof.categories, prof.busy_ms, prof.step_ms)
    labels = {**LABELS, **({} if cuda else CPU_LABELS)}
    rows = [CategoryRow(r.name, labels[r.name], r.ms, r.pct, r.basis) for r in table]
    calls = PR.calls_per_kind(changes, [c.kind for c in changes])
    for row in rows:
        ops = replaced.get(row.name)
        if ops:
            row.replaced, row.tigon_op = True, ", ".join(ops)
            mine = [c for c in changes if c.op in ops]
            if mine:
                delta = sum(calls[c.kind] * ((c.tigon.device_ms - c.original.device_ms) if cuda
                                             else (c.tigon.host_ms - c.original.host_ms)) for c in mine)
                row.predicted_ms = max(0.0, row.ms + delta)
    limits = {"original": {**_limits(step, issue_o, syncs_o), "device_ops": prof.device_ops}}
    result = ProfileResult(
        config=dataclasses.asdict(cfg), model=info, device=device_str(device), device_name=device_name(device),
        time_basis=("kernel time (the ops' CUDA kernels) per step; 'device idle' is wall time" if cuda
                    else "self CPU time per step (inflated by the profiler's overhead)"),
        categories=rows, profiled_step_ms=prof.step_ms, step_ms_original=row_o.step_ms, attribution_scale=scale,
        limits=limits, patch=counts, traces=traces, versions=versions(), notes=notes,
        host_in_step={("patched" if p == "tigon" else p): PA.overhead_report(m) for p, m in in_step.items() if m},
        peak_memory_bytes_original=row_o.peak_memory_bytes)
    if layer_costs:
        result.layers = layer_costs[0].as_dict()
        notes += [f"layers: {n}" for n in layer_costs[0].notes]
    if changes:
        hm, extra = PL.prediction(step, changes, layer_costs[0] if layer_costs else None)
        dm = PL.device_model(layer_costs[0], changes) if layer_costs else None
        pred, adv = PR.predict(step, changes, host=hm, device=dm), PR.advise(step, changes, hm, dm)
        extra["device_basis"] = "whole parts" if dm is not None else "per op"
        result.predicted_step_ms_patched = pred.step_ms
        result.limits["predicted"] = {**_limits(pred), **extra}
        calls_all = PR.calls_per_kind(changes, [c.kind for c in changes])
        for c, a in zip(changes, adv.kinds):
            per_op_basis = host_basis.get(c.kind, "isolated")
            result.ops.append({**dataclasses.asdict(a), "original": costs[c.op]["eager"],
                               "tigon": costs[c.op]["tigon"], "bypasses": dict(c.bypasses),
                               "host_basis": "layers" if hm and hm.marginal_ms(c.kind) is not None else per_op_basis,
                               "host_delta_ms_per_op": calls_all.get(c.kind, 0) * (c.tigon.host_ms
                                                                                   - c.original.host_ms),
                               "host_basis_per_op": per_op_basis,
                               "host_delta_ms_isolated": a.calls * (costs[c.op]["tigon"]["host_ms"]
                                                                    - costs[c.op]["eager"]["host_ms"]),
                               "in_step": PA.kind_report(c.kind, in_step.get("original"), in_step.get("tigon"))})
        result.advice = {"best_call": adv.best_call, "best_keywords": adv.best_keywords,
                         "best_step_ms": adv.best_step_ms, "replace_nothing": adv.replace_nothing,
                         "slower": [a.kind for a in adv.kinds if a.slows_step]}
    if row_p is not None:
        result.step_ms_patched, result.backend = row_p.step_ms, row_p.backend
        result.peak_memory_bytes_patched = row_p.peak_memory_bytes
        say("profile patched step")
        trace_p = None
        if cfg.trace:
            stem, ext = os.path.splitext(cfg.trace)
            trace_p = f"{stem}.patched{ext or '.json'}"
        prof_p = profiled(True, trace_p)
        result.profiled_step_ms_patched = prof_p.step_ms
        result.limits["patched"] = {**_limits(step_cost(row_p.step_ms, issue_p), issue_p, syncs_p),
                                    "device_ops": prof_p.device_ops}
        if trace_p:
            traces.append(trace_p)
        table_p, _ = PR.step_table(prof_p.categories, prof_p.busy_ms, prof_p.step_ms)
        patched = {r.name: r.ms for r in table_p}
        for row in rows:
            row.patched_ms = patched.get(row.name, 0.0)
        if result.predicted_step_ms_patched is not None and result.step_ms_patched:
            result.prediction_error_pct = 100.0 * (result.predicted_step_ms_patched - result.step_ms_patched) \
                / result.step_ms_patched
    say("")  # the last stage's seconds
    result.stage_s = stage_s
    _add_notes(result, device)
    return result


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
