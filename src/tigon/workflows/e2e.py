"""End-to-end training-step benchmark (library code behind ``tigon bench --e2e``).

One Hugging Face causal LM, built from a preset / config (random weights from the seed), trained for
``warmup + steps`` AdamW steps by each provider in turn, on the same random token batches:

``original``
    the model as Hugging Face writes it.
``tigon``
    the same model after :func:`tigon.patch` (instance level; :func:`tigon.unpatch` afterwards).
``tigon_lean``, ``tigon_low``
    :func:`tigon.patch` with the keywords of :data:`PATCH_VARIANTS`: grad_weight accumulated in the model's dtype
    (Liger-Kernel's default; the same as ``tigon`` in float32), or ``memory="low"`` (Liger's peak in the fused
    LM-head loss with exact gradients, :mod:`tigon.kernels.flce_sliced`: one matmul more than ``tigon``).
``original_compile``, ``tigon_compile``
    ``torch.compile(model)`` of the original / the patched model (default Inductor settings; the warm-up steps
    absorb the compilation). ``tigon_compile`` runs Tigon's compile mode ``"auto"`` (the row-wise ops leave their
    code to Inductor, the losses keep their kernels: :func:`tigon.support.set_compile_mode`).
``tigon_compile_kernels``
    the same with compile mode ``"kernels"``: every patched op as its Triton custom op, which Inductor cannot fuse
    with its neighbours (what ``"auto"`` is measured against).
``liger``
    the same model after Liger-Kernel's ``_apply_liger_kernel_to_instance(model=...)`` (or its model-type specific
    ``apply_liger_kernel_to_<type>(model=...)``) when ``liger_kernel`` is installed. Liger also rebinds globals of
    the transformers modeling module and class attributes (e.g. the causal LM's ``forward``); they are put back
    after the run (:class:`GlobalsGuard`) so that later runs in the process see the original code.

Providers run in the order of :data:`E2E_PROVIDERS` (Liger last, since it rebinds globals; dynamo's caches are
reset after each compiled provider).
``attn_implementation`` (``--attn-implementation``) is passed to ``AutoModelForCausalLM.from_config`` for every
provider ("eager", "sdpa", "flash_attention_2", ...; ``None``: transformers' default; the implementation the
model got is recorded in the result's ``model``).

A vision-language model (a config with a ``vision_config``: Qwen2.5-VL, LLaVA ...) is built with
``AutoModelForImageTextToText`` and each sequence of its batches holds one random image
(:func:`tigon.workflows.e2e_models.step_batches`; the grid families' image takes ``seq_len // 4`` of the sequence's
tokens); ``--layers`` keeps that many layers of its text decoder, the vision encoder stays whole; tokens/s counts
the sequences' tokens, image tokens included; the MFU counts the vision encoder's parameters for the image's patches
only (:func:`tigon.workflows.e2e_models.model_info`).

Per provider: tokens/s (batch * seq_len tokens over the median step time of the steps after the warm-up), the
median step time with its 20/80 percentiles (ms), the peak memory of the run in bytes (CUDA:
``torch.cuda.max_memory_allocated``, weights + gradients + AdamW state + activations; CPU: resident-set growth,
see :mod:`tigon.workflows._train`) and the per-step losses. A provider that fails (out of memory, an unsupported
family, Liger not installed or without a patch for the model type) gets a row with ``status`` "failed" / "skipped"
and a note; the others still run.

LoRA (``--lora R``, :attr:`E2EConfig.lora_rank`): every provider's model is wrapped after its patch (Liger's) by
PEFT's ``get_peft_model`` with LoRA of rank R (``lora_alpha`` 2R, no dropout) on q/k/v/o/gate/up/down, the adapters
in the model's dtype (``autocast_adapter_dtype=False``); base weights, embeddings and the LM head are frozen, so the
optimizer updates the adapters only. The Tigon providers then call :func:`tigon.patch` on the PEFT model, which also
fuses the LoRA layers (:func:`tigon.functional.lora_linear`).

Gradient checkpointing (``--gradient-checkpointing non_reentrant|reentrant|selective``,
:attr:`E2EConfig.gradient_checkpointing`): every provider's model gets activation checkpointing through
:func:`tigon.checkpointing.enable` right after it is built, before any patch (Liger's, PEFT's, Tigon's), as a
user's script does before handing the model to a trainer: Hugging Face's (``use_reentrant`` False / True), or
``selective``: non-reentrant, each layer keeping the matmul and attention outputs that
:func:`tigon.checkpointing.plan` chooses within ``--checkpoint-budget-gb`` (:attr:`E2EConfig.checkpoint_budget_gb`;
default :func:`tigon.checkpointing.auto_budget` with ``optimizer="adamw_torch"``, the AdamW the run steps: the room a
full fine-tune's peak, at the optimizer step, leaves the activations before it; with ``--lora`` it is enabled on the
PEFT model, whose LoRA projections it does not keep). The row's ``checkpointing`` says what was kept and the recompute
avoided.
``liger`` fails under ``selective``: Liger-Kernel's RoPE rotates the kept q / k projections' outputs in place
(see :mod:`tigon.checkpointing`).

MFU (CUDA): model FLOPs per token ``6 x matmul parameters`` (the forward and backward matmuls of every weight that
multiplies activations: the input embedding, a lookup, is left out unless tied to the head; of a MoE layer's experts
only the ``top_k / num_experts`` share a token is routed to: :func:`tigon.workflows.e2e_models.matmul_parameters`;
attention's own FLOPs left out, the PaLM paper's convention without its attention term) times tokens/s, over the bf16
matmul rate measured at the start of the same run (:func:`tigon.workflows.timing.measure_ceilings`). With LoRA the
frozen weights count ``4 x`` (forward and the input gradient; no weight gradient) and the adapters' own FLOPs (about
``6 r (d_in + d_out)`` per projection) are left out. With gradient checkpointing the recomputed forward is not
counted (it is overhead, not model FLOPs).

``--kernel-summary`` (:attr:`E2EConfig.kernel_summary`): the last step of each provider runs under
``torch.profiler`` and is left out of the timing; the row carries its kernels summed by name and kind, and per
matmul op and input shapes (:mod:`tigon.workflows.step_trace`), so that providers can be compared kernel by kernel.

Precision: ``bfloat16`` (the CUDA default) is pure bf16 training as in ``tigon compare``: weights, gradients and
AdamW state all bf16; ``float32`` is the CPU default.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib.util
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._train import batch_ids, batch_tokens, train
from .liger_patch import GlobalsGuard, LigerUnsupported, apply_liger
from .step_trace import StepTracer
from . import compare_dist
from .compare import ConfigError, error_text
from .devices import device_name, device_str, resolve_device, versions
from .e2e_models import build_model, check_attn_implementation, hf_config, model_info, step_batches, take_rows
from .host_memory import check_config_fits
from .lora import LORA_TARGETS, check_lora, with_lora
from ..checkpointing import DEFAULT_TFLOPS

PATCH_VARIANTS = {
    "tigon_lean": ("tigon.patch with fused_linear_cross_entropy={'accum_dtype': the model's dtype}: grad_weight "
                   "accumulated in that dtype, less memory for slightly less accurate gradients",
                   lambda dtype: dict(fused_linear_cross_entropy={"accum_dtype": dtype})),
    "tigon_low": ("tigon.patch with fused_linear_cross_entropy={'memory': 'low'}: Liger's memory in the LM-head "
                  "loss, exact gradients, one matmul more",
                  lambda dtype: dict(fused_linear_cross_entropy={"memory": "low"})),
}
"""Provider -> (what it is, ``tigon.patch`` keywords for the model's dtype): run like ``tigon`` with those keywords."""
E2E_PROVIDERS = ("original", "original_compile", "tigon", "tigon_compile", "tigon_compile_kernels", *PATCH_VARIANTS,
                 "liger")
COMPILE_MODE = {"tigon_compile": "auto", "tigon_compile_kernels": "kernels"}
"""Tigon's compile mode (:func:`tigon.support.set_compile_mode`) of the compiled Tigon providers."""
MODEL_FLOPS_PER_PARAM = 6
"""Model FLOPs per token per parameter of a training step (forward 2, backward 4): the MFU numerator."""
FROZEN_FLOPS_PER_PARAM = 4
"""The same for a frozen weight (LoRA's base weights): forward 2, input gradient 2, no weight gradient."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULTS = {
    "cpu": dict(model="tiny", layers=None, batch_size=2, seq_len=32, steps=2, warmup=1, dtype="float32"),
    "cuda": dict(model="llama3-8b", layers=2, batch_size=4, seq_len=2048, steps=10, warmup=3, dtype="bfloat16"),
}
ProgressFn = Callable[[str, int, int], None]
"""``progress(provider, step, total_steps)``: after every optimizer step (warm-up included), ``step`` from 1."""


@dataclass
class E2EConfig:
    """What ``tigon bench --e2e`` measures. ``None`` fields take the device's defaults (:data:`DEFAULTS`).

    model: preset name, config.json file, checkpoint directory or cached Hub id (its config only: weights are
        random from the seed, the step time does not depend on them). layers: keep N decoder layers.
        batch_size, seq_len: tokens per step = batch_size * seq_len. steps: timed steps; warmup: untimed steps before
        them (compilation, autotuning, allocator warm-up). providers: subset of :data:`E2E_PROVIDERS` (default: all;
        on the CPU all but the compiled ones). dtype: "bfloat16" or "float32". device: "auto", "cpu", "cuda". lr:
        AdamW learning rate. seed: weights and batches.
        attn_implementation: transformers' attention ("eager", "sdpa", "flash_attention_2", a Hub kernel
        "org/repo", ...); None: transformers' default. lora_rank: wrap every provider's model with PEFT LoRA of
        this rank (see the module docstring); None: full fine-tuning. gradient_checkpointing: one of
        :data:`CHECKPOINTING` or None (off). checkpoint_budget_gb: with ``"selective"``, the GiB its layers may keep
        over plain checkpointing (None: :func:`tigon.checkpointing.auto_budget`). kernel_summary: profile each
        provider's last step (needs steps >= 2; that step is left out of the timing).
        image_tokens: a vision-language model's image tokens per sequence for the families whose image size is
        free (:func:`tigon.workflows.multimodal.with_images`); None: ``seq_len // 4``.
        nproc: processes, >= 1; N > 1 launches N ranks through ``torch.distributed.run`` (gloo on CPU, NCCL on CUDA,
        one GPU each) and every provider's model is wrapped as ``parallel`` says ("ddp" or "fsdp2"; None: "ddp";
        :func:`tigon.workflows.compare_dist.wrap`, after the provider's patch, before torch.compile), each rank on its
        own ``batch_size`` sequences (:func:`run_e2e`).
    """

    model: str | None = None
    layers: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    steps: int | None = None
    warmup: int | None = None
    providers: list[str] | None = None
    dtype: str | None = None
    device: str = "auto"
    lr: float = 1e-4
    seed: int = 0
    attn_implementation: str | None = None
    lora_rank: int | None = None
    gradient_checkpointing: str | None = None
    checkpoint_budget_gb: float | None = None
    kernel_summary: bool = False
    nproc: int = 1
    parallel: str | None = None
    image_tokens: int | None = None


CHECKPOINTING = ("non_reentrant", "reentrant", "selective")
"""The values of :attr:`E2EConfig.gradient_checkpointing`: HF's ``use_reentrant`` False / True, or Tigon's selective
policy (:func:`tigon.checkpointing.enable`)."""

@dataclass
class E2ERow:
    """One provider's run.

    status: "ok", "failed" (an exception; see note) or "skipped" (not installed). tokens_per_s: tokens per second
    of median step time. step_ms / step_ms_p20 / step_ms_p80: timed steps' median and percentiles, ms.
    step_times_ms: every step, warm-up included. peak_memory_bytes: bytes or None; peak_requested_bytes: CUDA, the
    same peak before the allocator's block rounding (see :class:`tigon.workflows._train.RunStats`). losses: per
    step, warm-up included. backend: Tigon's backend for the run ("triton", "interpreter", "reference", "inductor",
    "mixed", "none"); backends: per op, the calls per backend (``tigon.support.backend_usage``; under
    torch.compile one count per compiled graph).
    patch: what the provider's patch replaced (counts per kind), when known. note: caveats or the error.
    mfu: model FLOPs utilisation (0..1, CUDA; see the module docstring), or None. kernel_summary: with
    ``--kernel-summary``, :func:`tigon.workflows.step_trace.summarize` of the provider's last step.
    checkpointing: with ``--gradient-checkpointing``, :meth:`tigon.checkpointing.CheckpointPlan.as_dict` of the
    provider's model (what each layer kept, bytes, recompute FLOPs and ms avoided at the measured matmul rate) and
    its ``describe`` text.
    ranks: ``nproc`` > 1 only (else None): per rank {"rank", "device", "peak_memory_bytes", "tokens_per_s" (the rank's
    own tokens over its own median step), "step_ms"}; then the row's step times are the slowest rank's, tokens_per_s
    global (all ranks' tokens over that median), peak memory the largest rank's, losses the ranks' mean.
    """

    provider: str
    status: str = "ok"
    tokens_per_s: float | None = None
    step_ms: float | None = None
    step_ms_p20: float | None = None
    step_ms_p80: float | None = None
    step_times_ms: list[float] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    peak_requested_bytes: int | None = None
    losses: list[float] = field(default_factory=list)
    backend: str | None = None
    backends: dict[str, dict[str, int]] = field(default_factory=dict)
    patch: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    mfu: float | None = None
    kernel_summary: dict[str, Any] | None = None
    ranks: list[dict[str, Any]] | None = None
    checkpointing: dict[str, Any] | None = None


@dataclass
class E2EResult:
    """The outcome of :func:`run_e2e`; :meth:`as_dict` is the JSON report.

    config: the resolved configuration. model: source, architecture, parameters, sizes. rows: one
    :class:`E2ERow` per provider. speedup: provider -> original step_ms / provider step_ms. memory_ratio:
    provider -> peak memory / original peak memory. peak_memory_method: how memory was measured.
    distributed: ``nproc`` > 1 only (else None): {"nproc", "parallel", "backend", "per_rank_batch_size",
    "global_batch_size"}.
    """

    config: dict[str, Any]
    model: dict[str, Any]
    device: str
    device_name: str
    rows: list[E2ERow]
    speedup: dict[str, float | None]
    memory_ratio: dict[str, float | None]
    peak_memory_method: str
    versions: dict[str, str | None]
    notes: list[str] = field(default_factory=list)
    distributed: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)


def _positive(name: str, value, minimum: int = 1) -> None:
    if value is not None and (not isinstance(value, int) or value < minimum):
        raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= {minimum}, got {value!r}")


def _pct(values: list[float], q: float) -> float:
    return float(torch.tensor(values, dtype=torch.float64).quantile(q).item())


# ----------------------------------------------------------------------------------------------------------------
# the workflow


def resolve_step_config(config, defaults: dict):
    """Shared by ``--e2e`` and ``tigon profile``: resolve the device, fill ``None`` fields (model, layers,
    batch_size, seq_len, steps, warmup, dtype) from ``defaults[device type]`` and check them; returns a copy.

    Raises:
        ConfigError: unknown device, dtype or attn_implementation, counts < 1 (warmup < 0, seq_len < 2).
    """
    device = resolve_device(config.device)
    d = defaults[device.type]
    cfg = dataclasses.replace(config, device=device.type)
    if cfg.model is None:
        cfg.model = d["model"]
        if cfg.layers is None:
            cfg.layers = d["layers"]
    for name in ("batch_size", "seq_len", "steps", "warmup", "dtype"):
        if getattr(cfg, name) is None:
            setattr(cfg, name, d[name])
    for name, low in (("layers", 1), ("batch_size", 1), ("seq_len", 2), ("steps", 1), ("warmup", 0)):
        _positive(name, getattr(cfg, name), low)
    check_lora(getattr(cfg, "lora_rank", None))
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"--dtype {cfg.dtype!r} is not available for whole training steps (bench --e2e, profile): "
                          f"choose from {', '.join(DTYPES)} (pure bfloat16, no fp16 mixed precision)")
    check_attn_implementation(getattr(cfg, "attn_implementation", None))
    return cfg


def resolve_e2e(config: E2EConfig) -> E2EConfig:
    """Validate ``config`` and fill its ``None`` fields with the device's defaults; returns a new config.

    Raises:
        ConfigError: unknown provider / dtype / device / attn_implementation, counts < 1.
    """
    cfg = resolve_step_config(config, DEFAULTS)
    default = [p for p in E2E_PROVIDERS if cfg.device == "cuda" or "_compile" not in p]  # CPU: no Inductor runs
    providers = [p for item in (cfg.providers or default) for p in item.split(",") if p]
    for p in providers:
        if p not in E2E_PROVIDERS:
            raise ConfigError(f"unknown provider {p!r} for --e2e (choose from {', '.join(E2E_PROVIDERS)})")
    cfg.providers = list(dict.fromkeys(providers))
    if cfg.gradient_checkpointing is not None and cfg.gradient_checkpointing not in CHECKPOINTING:
        raise ConfigError(f"--gradient-checkpointing must be one of {', '.join(CHECKPOINTING)}, got "
                          f"{cfg.gradient_checkpointing!r}")
    budget = cfg.checkpoint_budget_gb
    if budget is not None and cfg.gradient_checkpointing != "selective":
        raise ConfigError("--checkpoint-budget-gb applies to --gradient-checkpointing selective only, got "
                          f"--gradient-checkpointing {cfg.gradient_checkpointing or 'not given'}")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not 0 <= budget < float("inf")):  # nan fails both comparisons
        raise ConfigError(f"--checkpoint-budget-gb must be a finite number >= 0 (GiB), got {budget!r}")
    if cfg.kernel_summary and cfg.device != "cuda":
        raise ConfigError("--kernel-summary needs a CUDA device (it sums the GPU kernels of a profiled step)")
    if cfg.kernel_summary and cfg.steps < 2:
        raise ConfigError(f"--kernel-summary needs --steps >= 2 (the profiled last step is not timed), got {cfg.steps}")
    _positive("image_tokens", cfg.image_tokens)
    cfg.parallel = compare_dist.check_nproc(cfg.nproc, cfg.parallel, cfg.device, compare_dist.DATA_PARALLEL)
    return cfg


def run_provider(provider: str, hfc, cfg, batches: list[torch.Tensor], *, info: dict | None = None,
                 progress=None, notes: list[str] | None = None,
                 then: Callable[[torch.nn.Module], None] | None = None,
                 untimed_last: bool = False,
                 wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> tuple[E2ERow, str]:
    """Train one provider's model on ``batches`` and time its steps: the measurement of ``tigon bench --e2e``, which
    ``tigon profile`` shares so that the two agree for the same model, batch and provider.

    The model (``cfg``'s dtype, device, seed, attn_implementation and lora_rank; :data:`E2E_PROVIDERS` says what
    each provider does to it) trains ``len(batches)`` AdamW steps in :func:`tigon.workflows._train.train`; the
    row's step time is the median (20th / 80th percentiles) of the steps after ``cfg.warmup``, ms. ``then(model)``,
    when given, runs after the training on the still-patched model (before :func:`tigon.unpatch` and cleanup).
    ``info`` gets the model's ``attn_implementation``; ``notes`` a line when Liger's rebinding was undone.
    ``cfg.gradient_checkpointing`` (when the config has it) turns on checkpointing before any patch
    (:func:`enable_checkpointing`; the row's ``checkpointing`` says what it keeps);
    ``untimed_last``: the last step (profiled by the caller) is left out of the timing.
    ``progress(name, step, total, loss)`` after each step. ``wrap(model)``, when given, wraps the model for
    data-parallel training after its patch and before torch.compile (``tigon bench --e2e --nproc N``).

    Returns:
        (an :class:`E2ERow` with status "ok", how peak memory was measured); a failing provider raises.

    Raises:
        whatever building, patching or training the model raises (out of memory, an unsupported family).
    """
    import tigon
    from .. import support

    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    batch = tuple(batch_ids(batches[0]).shape[:2])
    row, held = E2ERow(provider), {}

    def make_model():
        model = build_model(hfc, dtype, device, cfg.seed, cfg.attn_implementation)
        model.train()
        if info is not None:
            info.setdefault("attn_implementation", getattr(model.config, "_attn_implementation", None))
        mode, budget = getattr(cfg, "gradient_checkpointing", None), getattr(cfg, "checkpoint_budget_gb", None)
        lora = getattr(cfg, "lora_rank", None) is not None
        if mode is not None and not (lora and mode == "selective"):
            held["checkpointing"] = enable_checkpointing(model, mode, batch, budget)
        if provider == "liger" and mode == "selective":
            raise ValueError("--gradient-checkpointing selective with liger: Liger-Kernel's RoPE rotates q and k in "
                             "place in the projections' outputs that the selective checkpoint keeps, so its "
                             "recomputation would rotate them twice (wrong gradients); run liger under non_reentrant")
        if provider == "liger":
            held["guard"] = GlobalsGuard([type(model).__module__, "torch.nn.functional",
                                           "transformers.loss.loss_utils"])
            held["liger"] = apply_liger(model)
        if lora:
            model = with_lora(model, cfg.lora_rank)
            if mode == "selective":  # planned on the PEFT model: its frozen base weights, its LoRA layers left out
                held["checkpointing"] = enable_checkpointing(model, mode, batch, budget)
        if provider in ("tigon", "tigon_compile", "tigon_compile_kernels"):
            held["report"] = tigon.patch(model)
        elif provider in PATCH_VARIANTS:
            held["report"] = tigon.patch(model, **PATCH_VARIANTS[provider][1](dtype))
        held["model"] = model
        if wrap is not None:
            model = wrap(model)
        if provider.endswith(("_compile", "_compile_kernels")):
            if provider in COMPILE_MODE:
                held["mode"] = support.compile_mode()
                support.set_compile_mode(COMPILE_MODE[provider])
            return torch.compile(model)
        return model

    try:
        stats = train(make_model, batches, lr=cfg.lr, device=device, name=provider, progress=progress)
        end = len(stats.step_times_s) - (1 if untimed_last else 0)
        timed = [t * 1e3 for t in stats.step_times_s[cfg.warmup:end]] or [t * 1e3 for t in stats.step_times_s]
        row.step_times_ms = [t * 1e3 for t in stats.step_times_s]
        row.step_ms = statistics.median(timed)
        row.step_ms_p20, row.step_ms_p80 = _pct(timed, 0.2), _pct(timed, 0.8)
        row.tokens_per_s = batch_tokens(batches[0]) / (row.step_ms * 1e-3) if row.step_ms > 0 else None
        row.peak_memory_bytes, row.peak_requested_bytes = stats.peak_memory_bytes, stats.peak_requested_bytes
        row.losses = stats.losses
        row.backend = support.describe_backend(stats.backend_usage)
        row.backends = stats.backend_usage
        if then is not None:
            then(held["model"])
    finally:
        model = held.pop("model", None)
        if provider.startswith("tigon") and model is not None:
            tigon.unpatch(model)
        if "_compile" in provider:
            torch._dynamo.reset()
        if "mode" in held:
            support.set_compile_mode(held.pop("mode"))
        if "guard" in held:
            changed = held.pop("guard").restore()
            if changed and notes is not None:
                notes.append(f"liger rebound {len(changed)} module globals / class attributes; restored after its run")
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "report" in held:
        row.patch = held["report"].as_dict().get("counts", {})
    if "liger" in held:
        row.patch = {"modules with a Liger forward": held["liger"]["patched_modules"]}
        row.note = f"liger_kernel.transformers.{held['liger']['function']}(model=...)"
    if "checkpointing" in held:
        tflops = (info or {}).get("matmul_tflops") or DEFAULT_TFLOPS
        plan = held["checkpointing"]
        row.checkpointing = {**plan.as_dict(tflops), "describe": plan.describe(tflops)}
    return row, stats.peak_memory_method


def enable_checkpointing(model: torch.nn.Module, mode: str, batch: tuple[int, int],
                         budget_gb: float | None = None):
    """Activation checkpointing of ``mode`` (one of :data:`CHECKPOINTING`) on ``model`` through
    :func:`tigon.checkpointing.enable`, at ``batch`` = (rows, sequence length) for the selective plan, within
    ``budget_gb`` GiB (None: its automatic budget); returns the :class:`tigon.checkpointing.CheckpointPlan`."""
    from .. import checkpointing

    if mode == "selective":
        budget = None if budget_gb is None else int(budget_gb * 2**30)
        # the optimizer _train.train builds: torch.optim.AdamW with PyTorch's default implementation
        return checkpointing.enable(model, "selective", batch=batch, budget_bytes=budget,
                                    optimizer="adamw_torch" if budget is None else None)
    return checkpointing.enable(model, "full", reentrant=mode == "reentrant")


def run_e2e(config: E2EConfig, progress: ProgressFn | None = None) -> E2EResult:
    """Time ``warmup + steps`` training steps of one model per provider (see the module docstring).

    Args:
        config: what to run; ``None`` fields take the device's defaults.
        progress: optional ``progress(provider, step, total)`` after every step.

    Returns:
        an :class:`E2EResult`; providers that fail are rows with ``status="failed"`` and the error as note.

    Raises:
        ConfigError: a bad configuration or an unreadable model config.
    """
    cfg = resolve_e2e(config)
    device = torch.device(cfg.device)
    rank = world = wrap = None
    if cfg.nproc > 1:
        if not compare_dist.in_process_group():
            return compare_dist.launch(cfg, progress, workflow="e2e")  # N ranks, rank 0's result
        rank, world = compare_dist.rank_and_world(cfg.nproc)
        if device.type == "cuda":
            device = compare_dist.rank_device()
        wrap = functools.partial(compare_dist.wrap, parallel=cfg.parallel, device=device)
        if rank != 0:
            progress = None
    hfc, source = hf_config(cfg.model, cfg.layers)
    if device.type == "cpu":  # refused before any model is built: a silent out-of-memory kill otherwise
        check_config_fits(hfc, cfg.dtype, f"--model {cfg.model} --layers {cfg.layers}", processes=cfg.nproc)
    # N ranks: each step's global batch of N x batch_size sequences from the seed, rank r takes its own rows
    batches = step_batches(hfc, cfg.warmup + cfg.steps, cfg.batch_size * (world or 1), cfg.seq_len, cfg.seed,
                           cfg.image_tokens)
    if rank is not None:
        batches = [take_rows(b, rank * cfg.batch_size, (rank + 1) * cfg.batch_size) for b in batches]
    info = model_info(hfc, source, batches[0])
    info["dtype"] = cfg.dtype
    notes: list[str] = []
    if isinstance(batches[0], dict):  # a vision-language model: one image per sequence
        info["image_tokens_per_sequence"] = n = int((batches[0]["labels"][0] == -100).sum())
        notes.append(f"vision-language model: each sequence holds one random image ({n} image tokens, ignored by the "
                     f"loss; {info['vision_positions_per_sequence']} patches through the vision encoder); tokens/s "
                     "counts the image tokens as tokens.")
    if device.type == "cuda":
        from .timing import measure_ceilings

        info["matmul_tflops"] = measure_ceilings(device)["matmul_tflops"]
    rows: list[E2ERow] = []
    method = ""
    order = [p for p in E2E_PROVIDERS if p in cfg.providers]  # liger last: it rebinds globals
    for provider in order:
        if provider == "liger" and importlib.util.find_spec("liger_kernel") is None:
            rows.append(E2ERow(provider, status="skipped", note="liger_kernel is not installed"))
            continue

        tracer = StepTracer(at=cfg.warmup + cfg.steps) if cfg.kernel_summary else None

        def on_step(name, step, total, loss, provider=provider, tracer=tracer):
            if tracer is not None:
                tracer.after_step(step)
            if progress is not None:
                progress(provider, step, total)

        try:
            row, used = run_provider(provider, hfc, cfg, batches, info=info, progress=on_step, notes=notes,
                                     untimed_last=tracer is not None, wrap=wrap)
            if row.tokens_per_s and info.get("matmul_tflops"):
                per_param = FROZEN_FLOPS_PER_PARAM if cfg.lora_rank else MODEL_FLOPS_PER_PARAM
                row.mfu = row.tokens_per_s * per_param * info["matmul_parameters"] / (info["matmul_tflops"] * 1e12)
            row.kernel_summary = tracer.summary if tracer is not None else None
            method = method or used
        except LigerUnsupported as e:  # Liger has no patch for the family: a skipped row, not HF's code as liger
            row = E2ERow(provider, status="skipped", note=error_text(e, 600))
        except Exception as e:  # one provider failing (OOM, unsupported model) must not end the run
            row = E2ERow(provider, status="failed", note=f"{type(e).__name__}: {error_text(e, 600)}")
        rows.append(row)
    if rank is None:
        return _result(cfg, device, info, rows, method, notes)
    per_rank: list[Any] = [None] * world
    torch.distributed.all_gather_object(per_rank, (device_str(device), rows))
    rows = [_aggregate_rows(cfg, [(d, r[i]) for d, r in per_rank], info) for i in range(len(rows))]
    result = _result(cfg, device, info, rows, method + "; the largest rank's (each rank's under the row's ranks)",
                     notes)
    result.distributed = {"nproc": world, "parallel": cfg.parallel, "backend": torch.distributed.get_backend(),
                          "per_rank_batch_size": cfg.batch_size, "global_batch_size": cfg.batch_size * world}
    result.notes.insert(1, f"{world} processes ({cfg.parallel}), each on its own {cfg.batch_size} sequences: a step's "
                           "time is the slowest rank's, tokens/s counts all ranks' tokens, peak memory is the largest "
                           "rank's, the losses are the ranks' mean; each rank's own under ranks.")
    return result


def _aggregate_rows(cfg: E2EConfig, ranked: list[tuple[str, E2ERow]], info: dict) -> E2ERow:
    """One provider's row over all ranks (``ranked``: each rank's device and row, in rank order)."""
    bad = [(i, r) for i, (_, r) in enumerate(ranked) if r.status != "ok"]
    if bad:
        i, r = bad[0]
        return dataclasses.replace(r, note=f"rank {i}: {r.note}")
    rows = [r for _, r in ranked]
    first, world = rows[0], len(rows)
    out = dataclasses.replace(first)
    out.step_times_ms = [max(r.step_times_ms[s] for r in rows) for s in range(len(first.step_times_ms))]
    end = len(out.step_times_ms) - (1 if cfg.kernel_summary else 0)
    timed = out.step_times_ms[cfg.warmup:end] or out.step_times_ms
    out.step_ms = statistics.median(timed)
    out.step_ms_p20, out.step_ms_p80 = _pct(timed, 0.2), _pct(timed, 0.8)
    out.tokens_per_s = world * cfg.batch_size * cfg.seq_len / (out.step_ms * 1e-3) if out.step_ms > 0 else None
    peaks = [r.peak_memory_bytes for r in rows]
    out.peak_memory_bytes = None if None in peaks else max(peaks)
    requested = [r.peak_requested_bytes for r in rows]
    out.peak_requested_bytes = None if None in requested else max(requested)
    out.losses = [sum(r.losses[s] for r in rows) / world for s in range(len(first.losses))]
    backends: dict[str, dict[str, int]] = {}
    for r in rows:
        for op, per in r.backends.items():
            for name, calls in per.items():
                backends.setdefault(op, {})[name] = backends.get(op, {}).get(name, 0) + calls
    out.backends = backends
    if out.mfu is not None and out.tokens_per_s and info.get("matmul_tflops"):  # over the ceiling of every GPU
        per_param = FROZEN_FLOPS_PER_PARAM if cfg.lora_rank else MODEL_FLOPS_PER_PARAM
        out.mfu = out.tokens_per_s * per_param * info["matmul_parameters"] / (world * info["matmul_tflops"] * 1e12)
    out.ranks = [{"rank": i, "device": d, "peak_memory_bytes": r.peak_memory_bytes, "tokens_per_s": r.tokens_per_s,
                  "step_ms": r.step_ms} for i, (d, r) in enumerate(ranked)]
    return out


def _result(cfg: E2EConfig, device, info, rows: list[E2ERow], method: str, notes: list[str]) -> E2EResult:
    base = next((r for r in rows if r.provider == "original" and r.status == "ok"), None)
    speedup, memory = {}, {}
    for r in rows:
        ok = base is not None and r.status == "ok"
        speedup[r.provider] = base.step_ms / r.step_ms if ok and r.step_ms else None
        memory[r.provider] = (r.peak_memory_bytes / base.peak_memory_bytes
                              if ok and r.peak_memory_bytes and base.peak_memory_bytes else None)
    notes = list(notes)
    if cfg.lora_rank is not None:
        notes.insert(0, f"LoRA r={cfg.lora_rank} (alpha {2 * cfg.lora_rank}, dropout 0) on {', '.join(LORA_TARGETS)} "
                        "via PEFT get_peft_model(autocast_adapter_dtype=False), adapters in the model dtype; base "
                        "weights, embeddings and LM head frozen; Tigon patches after PEFT wraps the model.")
    if cfg.gradient_checkpointing is not None:
        plan = next((r.checkpointing["describe"] for r in rows if r.checkpointing), None)
        notes.insert(0, f"gradient checkpointing ({cfg.gradient_checkpointing}) enabled on every provider's model "
                        "before its patch (tigon.checkpointing.enable" + (f"): {plan}" if plan else ")."))
    notes.insert(0, f"tokens/s: batch_size * seq_len = {cfg.batch_size * cfg.seq_len} tokens over the median of "
                    f"{cfg.steps} step(s) after {cfg.warmup} warm-up step(s); a step is forward, backward, "
                    "AdamW step and zero_grad.")
    if device.type == "cpu":
        notes.append("CPU: Tigon's kernels run in Triton's interpreter, so the tigon row measures the interpreter, "
                     "not the kernels; compare speed on a CUDA GPU. CPU peak memory is growth of the process's "
                     "resident set, which depends on what earlier runs in the same process already allocated "
                     "(run order), so the memory ratio is only indicative there.")
    return E2EResult(config=dataclasses.asdict(cfg), model=info, device=device_str(device),
                     device_name=device_name(device), rows=rows, speedup=speedup, memory_ratio=memory,
                     peak_memory_method=method, versions=versions(), notes=notes)
