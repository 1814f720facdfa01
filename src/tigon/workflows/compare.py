"""Train the same model twice from the same seed, original and Tigon-patched, and compare.

Both runs start from identical weights (one model is built from the seed, each run trains a deep copy), see
identical batches (random windows of the corpus in :mod:`tigon.data`, drawn from the seed) and use the same
optimizer (AdamW). The patched run calls :func:`tigon.patch` on its copy (instance level) before training and
:func:`tigon.unpatch` afterwards. The result holds both loss curves, their largest relative difference, tokens/s
and peak memory of each run, the device, which backend the patched run's kernels took, and a verdict: whether the
losses agree within the bound expected for the run's dtype (:mod:`tigon.workflows.compare_verdict`).

Model: a preset (random weights from the seed), or ``model``: a ``config.json`` file, a checkpoint directory or a
Hub id already in the local Hugging Face cache (:mod:`tigon.workflows.model_source`; never downloaded). A directory or
cached snapshot with weights is fine-tuned from them; a config without weights gets random weights from the seed.

A vision-language model (Qwen2-VL, Qwen2.5-VL, LLaVA ...: :mod:`tigon.workflows.multimodal`) is built with
``AutoModelForImageTextToText``; each sequence of its batches holds one random image after its first token (the
grid families' image takes ``seq_len // 4`` tokens), whose placeholder tokens the labels ignore.

Precision: ``dtype="float32"`` trains in fp32. ``dtype="bfloat16"`` is pure bf16: weights, gradients and AdamW
state are all bf16 (no autocast, no fp32 master weights); simple, but expect larger loss differences than fp32.
``dtype="float16"`` is mixed precision: fp32 weights and AdamW state, the forward under
``torch.autocast(dtype=torch.float16)``, the loss scaled by ``torch.amp.GradScaler`` (steps whose gradients overflow
are skipped and the scale lowered, as in any fp16 training; the result lists those steps).

Backend: the patched run reports the path its ops took (:func:`tigon.support.describe_backend`). On a machine
without CUDA the kernels run in Triton's interpreter only when ``TRITON_INTERPRET=1`` was set before Tigon's
kernels were first imported (the ``tigon`` CLI does this); otherwise they fall back to the PyTorch reference.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import data as _data
from .. import presets as _presets
from . import compare_dist
from ._train import ProgressFn, RunStats, frozen_heap, loss_status, train
from .compare_verdict import LOSS_RTOL, judge_agreement
from .devices import device_name, device_str, resolve_device, versions
from .errors import ConfigError, error_text
from .e2e_models import cast_floating, take_rows
from .model_shapes import text_config
from .model_source import ModelSource, model_config, resolve_source
from .multimodal import is_vision_language, with_images

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTOCAST_DTYPES = ("float16",)  # trained as autocast over fp32 weights with a GradScaler; the others as pure dtype
PRECISION = {"float32": "float32", "bfloat16": "pure bfloat16 (weights, gradients, AdamW state)",
             "float16": "float16 autocast over float32 weights, torch.amp.GradScaler"}

# Defaults filled in per device when a CompareConfig field is None. The CPU default must finish well under two
# minutes on a 2-core machine with the patched run interpreted; a CUDA machine gets a bigger model.
DEFAULTS = {
    "cpu": dict(preset="tiny", steps=20, batch_size=2, seq_len=32),
    "cuda": dict(preset="small", steps=50, batch_size=8, seq_len=512),
}
PRETRAINED_LR = 1e-5  # default learning rate when fine-tuning a checkpoint given by --model
RANDOM_INIT_LR = 3e-4  # default learning rate for a --model config without weights (random weights from the seed)


@dataclass
class CompareConfig:
    """What to compare. ``None`` fields take the device's default (see :data:`DEFAULTS`).

    preset: a name from :data:`tigon.presets.PRESETS` (random weights from ``seed``); default "tiny" on CPU,
        "small" on CUDA. Mutually exclusive with ``model``.
    model: a ``config.json`` file, a checkpoint directory or a Hub id in the local Hugging Face cache (weights when
        the directory / snapshot has any, else random from ``seed``; its tokenizer when present); a preset name is
        taken as ``preset``.
    layers: override the number of decoder layers (``num_hidden_layers``), >= 1.
    steps: optimizer steps per run. batch_size: sequences per step. seq_len: tokens per sequence.
    lr: AdamW learning rate; default: the preset's ``lr``, 1e-5 for a checkpoint with weights, 3e-4 for a config.
    dtype: "float32", "bfloat16" (pure bf16 training) or "float16" (autocast with a GradScaler); see the module
        docstring.
    device: "auto" (CUDA if available), "cpu" or "cuda".
    seed: seeds the weights and the batches.
    nproc: processes (ranks), >= 1. 1: one process, as always. N > 1: :func:`run_compare` launches N ranks through
        ``torch.distributed.run`` (gloo on CPU, NCCL on CUDA, one GPU per rank), each trains its copy wrapped as
        ``parallel`` says on its own ``batch_size`` sequences (the global batch is N x ``batch_size``; tensor
        parallel: the same ``batch_size`` sequences on every rank), and rank 0 gathers the result
        (:mod:`tigon.workflows.compare_dist`).
    parallel: the wrapper when ``nproc`` > 1: "ddp" (``DistributedDataParallel``), "fsdp2" (``fully_shard`` on
        each decoder layer, then on the root), "tp" (torch's tensor-parallel plan of the decoder and the LM head,
        :func:`tigon.integrations.tp_plan.apply_decoder_tp`, the model patched after it) or "fsdp2_tp" (that plan in
        groups of 2 ranks, FSDP2 across the groups on a 2-D mesh; nproc a multiple of 2, >= 4). None: "ddp" when
        ``nproc`` > 1; given with ``nproc`` 1 it is an error (:func:`~tigon.workflows.compare_dist.check_nproc`).
    """

    preset: str | None = None
    model: str | None = None
    layers: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    lr: float | None = None
    dtype: str = "float32"
    device: str = "auto"
    seed: int = 0
    nproc: int = 1
    parallel: str | None = None


@dataclass
class CompareResult:
    """The outcome of :func:`run_compare`. Everything the CLI shows; :meth:`as_dict` is its JSON report.

    loss_original / loss_patched: per-step training loss (mean next-token cross-entropy, nats).
    rel_loss_diff: per step ``|patched - original| / |original|``; max_rel_loss_diff is its maximum (NaN if a loss
        is not finite) and max_rel_loss_diff_step the 1-based step where it occurs.
    tokens_per_s: {"original", "patched"}: input tokens (batch_size * seq_len per step) per second of step time,
        first step excluded when steps > 1. step_time_s: per-step seconds. wall_time_s: whole run incl. setup.
    peak_memory_bytes: {"original", "patched"}, bytes or None; peak_memory_method says what was measured.
    device / device_name: e.g. "cuda:0" / "NVIDIA H200".
    backend: "triton" | "interpreter" | "reference" | "mixed" | "none" for the patched run; backend_reason why;
        backend_usage: op -> backend -> calls during the patched run.
    patch: the :class:`tigon.PatchReport` as a dict. config: the resolved configuration. model / data: what was
        trained on. versions: library versions. notes: caveats for reading the numbers.
    status: {"original", "patched"}: "ok", "non-finite" (a NaN / inf loss) or "diverged" (the last loss far above
        the first and above a uniform guess; :func:`tigon.workflows._train.loss_status`); status_detail: why, ""
        when ok. ok: both runs ok (the CLI exits 1 otherwise: such losses say nothing about the kernels).
    grad_scaler: float16 only (else None): {"original", "patched"} -> {"final_scale", "skipped_steps"}, the
        GradScaler's scale after the run and the 1-based steps it skipped (gradients with inf / NaN).
    distributed: ``nproc`` > 1 only (else None): {"nproc", "parallel", "backend" (gloo / nccl), "launcher",
        "per_rank_batch_size", "global_batch_size"}. Then the losses are the mean over ranks of each rank's loss,
        tokens_per_s the global tokens per second of the slowest rank's step times, step_time_s per step the slowest
        rank's, peak_memory_bytes the largest rank's, backend_usage the calls of all ranks.
    ranks: ``nproc`` > 1 only (else None): per rank {"rank", "device", "peak_memory_bytes", "tokens_per_s",
        "wall_time_s", "loss_original", "loss_patched"} ({"original", "patched"} where both runs are meant).
    agreement: the verdict on the losses (:func:`judge_agreement`): {"verdict" ("agree", "differ" or "not judged"
        when a run is not ok), "dtype", "bound", "bound_reason", "steps_judged", "max_rel_loss_diff",
        "max_rel_loss_diff_step", "last_rel_loss_diff", "last_step", "summary" (the one-line result), "detail"}.
        losses_agree: True / False for "agree" / "differ", None when not judged (the CLI exits 3 on False).
    """

    config: dict[str, Any]
    model: dict[str, Any]
    data: dict[str, Any]
    loss_original: list[float]
    loss_patched: list[float]
    rel_loss_diff: list[float]
    max_rel_loss_diff: float
    max_rel_loss_diff_step: int
    tokens_per_s: dict[str, float]
    step_time_s: dict[str, list[float]]
    wall_time_s: dict[str, float]
    peak_memory_bytes: dict[str, int | None]
    peak_memory_method: str
    device: str
    device_name: str
    backend: str
    backend_reason: str
    backend_usage: dict[str, dict[str, int]]
    patch: dict[str, Any]
    versions: dict[str, str | None]
    grad_scaler: dict[str, dict[str, Any]] | None = None
    status: dict[str, str] = field(default_factory=dict)
    status_detail: dict[str, str] = field(default_factory=dict)
    ok: bool = True
    notes: list[str] = field(default_factory=list)
    distributed: dict[str, Any] | None = None
    ranks: list[dict[str, Any]] | None = None
    agreement: dict[str, Any] = field(default_factory=dict)
    losses_agree: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (non-finite floats stay NaN/inf)."""
        return dataclasses.asdict(self)


class RunCrashed(RuntimeError):
    """A training run of :func:`run_compare` raised an exception (the model's forward or backward, the optimizer,
    building or patching its copy): ``run`` ("original" or "patched") crashed in its warm-up step (``warm_up``) or
    in its measured run after ``steps_done`` steps; ``error`` is the exception (also this one's ``__cause__``).
    KeyboardInterrupt, a rejected configuration (:class:`ConfigError`) and strict mode's UnsupportedError are not
    wrapped. The CLI reports the run's status as ``crashed`` with ``error``'s type and message, exit status 1.

    status / status_detail: ``{"original", "patched"}``: the crashed run's ``"crashed"`` and
    ``"<type>: <message> (<where>)"``; the other's ``"not run"`` (its measured run had not run: the runs' warm-up
    steps come first, then the original's run, then the patched one's), or its loss status
    (:func:`~tigon.workflows._train.loss_status`) when it had run. config: the resolved configuration."""

    def __init__(self, run: str, error: Exception, *, warm_up: bool, steps_done: int, config: dict[str, Any],
                 other: tuple[str, str] | None = None):
        self.run, self.error, self.warm_up, self.steps_done, self.config = run, error, warm_up, steps_done, config
        where = "its warm-up step" if warm_up else f"step {steps_done + 1}"
        first = "original" if run == "patched" else "patched"
        self.status = {run: "crashed", first: (other or ("not run", ""))[0]}
        self.status_detail = {run: f"{type(error).__name__}: {error_text(error)} (in {where})",
                              first: (other or ("", f"the {run} run crashed first"))[1]}
        super().__init__(f"the {run} run crashed: {self.status_detail[run]}")

    def as_dict(self) -> dict[str, Any]:
        """The JSON report of a crashed comparison: ``ok`` (False), ``status``, ``status_detail``, ``config``."""
        return {"ok": False, "status": {k: self.status[k] for k in ("original", "patched")},
                "status_detail": {k: self.status_detail[k] for k in ("original", "patched")}, "config": self.config}


# ----------------------------------------------------------------------------------------------------------------
# helpers


def _validate(cfg: CompareConfig) -> None:
    if cfg.preset is not None and cfg.model is not None:
        raise ConfigError("give either --preset or --model, not both")
    if cfg.preset is not None and cfg.preset not in _presets.PRESETS:
        raise ConfigError(f"unknown preset {cfg.preset!r} (available: {', '.join(_presets.PRESETS)})")
    if cfg.model is not None:
        resolve_source(cfg.model, "--model")
    for name, minimum in (("layers", 1), ("steps", 1), ("batch_size", 1), ("seq_len", 2)):
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or value < minimum):
            raise ConfigError(f"--{name.replace('_', '-')} must be an integer >= {minimum}, got {value!r}")
    if cfg.lr is not None and not (isinstance(cfg.lr, (int, float)) and math.isfinite(cfg.lr) and cfg.lr > 0):
        raise ConfigError(f"--lr must be a positive number, got {cfg.lr!r}")
    if cfg.dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {cfg.dtype!r} (choose from {', '.join(DTYPES)})")
    compare_dist.check_nproc(cfg.nproc, cfg.parallel, "cpu")


def _hf_config(cfg: CompareConfig) -> tuple[Any, ModelSource]:
    """The transformers config of the preset or ``--model`` (with ``layers`` applied) and its source; cheap, no
    weights."""
    if cfg.model is None:
        return model_config(cfg.preset, cfg.layers, "--preset")
    return model_config(cfg.model, cfg.layers, "--model", presets=False)


def _load(cfg: CompareConfig, hf_config, dtype: torch.dtype, source: ModelSource):
    """(base model on CPU in ``dtype``, tokenizer or None, description dict); weights from disk when ``source`` has
    any, else random from ``cfg.seed``. Built by ``AutoModelForCausalLM``, or ``AutoModelForImageTextToText`` for a
    vision-language config (:func:`tigon.workflows.multimodal.auto_class`)."""
    from .multimodal import auto_class

    auto = auto_class(hf_config)
    torch.manual_seed(cfg.seed)
    if not source.has_weights:
        base = auto.from_config(hf_config)
        weights = f"random (seed {cfg.seed})"
    else:
        try:
            base = auto.from_pretrained(source.path, config=hf_config, local_files_only=True, dtype=dtype)
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"--model {cfg.model}: cannot load a causal LM: {error_text(e)}") from e
        weights = "from the checkpoint"
    tokenizer = None
    if source.has_tokenizer:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(source.directory, local_files_only=True)
        except Exception:  # a tokenizer that does not load: fall back to byte ids
            tokenizer = None
    return cast_floating(base, dtype), tokenizer, {"source": str(source), "weights": weights}


def _check_host_memory(cfg: CompareConfig) -> None:
    """Refuse a CPU run whose parameters alone cannot fit in memory (:func:`tigon.workflows.host_memory.check_fits`:
    the model, the training copy and its gradients and AdamW states, per rank), before anything is built."""
    from .host_memory import check_config_fits

    try:
        hfc = _hf_config(cfg)[0]
    except ConfigError:  # (reported with its own message when the run builds the model)
        return
    what = (f"--preset {cfg.preset}" if cfg.model is None else f"--model {cfg.model}") + \
        (f" --layers {cfg.layers}" if cfg.layers is not None else "")
    check_config_fits(hfc, cfg.dtype, what, processes=cfg.nproc)


def _probe_patch(hf_config, patch_fn, unpatch_fn) -> None:
    """Fail fast, before any training, when ``patch_fn`` rejects this model: the engine's dry run on the weightless
    model (:func:`tigon.workflows.dry_run.dry_run`) decides as the patched run will. Only its rejection counts; a
    model the dry run cannot build or patch otherwise is left to the real patch of the patched run.
    """
    from .dry_run import PatchRejected, dry_run

    try:
        with dry_run(hf_config, patch_fn, unpatch_fn):
            pass
    except PatchRejected:
        raise
    except Exception:
        return


def _rel_diffs(a: list[float], b: list[float]) -> list[float]:
    out = []
    for x, y in zip(a, b):
        if not (math.isfinite(x) and math.isfinite(y)):
            out.append(float("nan"))
        elif x == 0.0:
            out.append(0.0 if y == 0.0 else float("inf"))
        else:
            out.append(abs(y - x) / abs(x))
    return out


# ----------------------------------------------------------------------------------------------------------------
# the workflow


def resolve_config(config: CompareConfig) -> CompareConfig:
    """Validate ``config`` and fill its ``None`` fields with the device's defaults; returns a new config.

    ``device`` becomes "cpu" or "cuda"; ``preset`` is set unless ``model`` is (a preset name given as ``model``
    moves to ``preset``). Cheap: reads no file (checks that ``model`` exists).

    Raises:
        ConfigError: a bad value (unknown preset or dtype, ``model`` neither a file, a directory with config.json
            nor a Hub id in the local cache, counts < 1, ...).
    """
    _validate(config)
    device = resolve_device(config.device)
    defaults = DEFAULTS[device.type]
    cfg = dataclasses.replace(config, device=device.type)
    cfg.parallel = compare_dist.check_nproc(cfg.nproc, cfg.parallel, device.type)
    source = resolve_source(cfg.model, "--model") if cfg.model is not None else None
    if source is not None and source.kind == "preset":
        cfg.preset, cfg.model, source = cfg.model, None, None
    if cfg.model is None and cfg.preset is None:
        cfg.preset = defaults["preset"]
    for name in ("steps", "batch_size", "seq_len"):
        if getattr(cfg, name) is None:
            setattr(cfg, name, defaults[name])
    if cfg.lr is None:
        if source is None:
            cfg.lr = _presets.PRESETS[cfg.preset]["lr"]
        else:
            cfg.lr = PRETRAINED_LR if source.has_weights else RANDOM_INIT_LR
    return cfg


def run_compare(
    config: CompareConfig,
    progress: ProgressFn | None = None,
    *,
    patch_fn: Callable | None = None,
    unpatch_fn: Callable | None = None,
) -> CompareResult:
    """Train original and Tigon-patched copies of one model on the same batches and compare them.

    Args:
        config: what to train; ``None`` fields take the device's defaults.
        progress: optional ``progress(run, step, steps, loss)`` called after every step; ``run`` is "original"
            or "patched", ``step`` counts from 1.
        patch_fn / unpatch_fn: replace :func:`tigon.patch` / :func:`tigon.unpatch` (for tests). ``patch_fn(model)``
            must return an object with ``as_dict()``.

    Returns:
        a :class:`CompareResult`.

    Raises:
        ConfigError: bad configuration (including a seq_len beyond the model's max_position_embeddings), missing or
            unloadable checkpoint, or a model family that ``tigon.patch``
            rejects (it raised ValueError or TypeError).
        RunCrashed: a training run raised (its exception is the cause: e.g. transformers' own router loss on a
            model whose kept layers have no router).
    """
    cfg = resolve_config(config)
    if cfg.device == "cpu" and not (cfg.nproc > 1 and compare_dist.in_process_group()):
        _check_host_memory(cfg)  # (the launching process, for all its ranks)
    rank = world = None
    if cfg.nproc > 1:
        if not compare_dist.in_process_group():
            return compare_dist.launch(cfg, progress)  # N ranks through torch.distributed.run, rank 0's result
        rank, world = compare_dist.rank_and_world(cfg.nproc)
        if rank != 0:
            progress = None
    device, dtype = torch.device(cfg.device), DTYPES[cfg.dtype]
    if rank is not None and device.type == "cuda":
        device = compare_dist.rank_device()
    autocast = dtype if cfg.dtype in AUTOCAST_DTYPES else None
    if patch_fn is None or unpatch_fn is None:
        import tigon

        patch_fn = patch_fn or tigon.patch
        unpatch_fn = unpatch_fn or tigon.unpatch
    from .. import support

    hf_config, source = _hf_config(cfg)
    max_pos = getattr(text_config(hf_config), "max_position_embeddings", None)
    if isinstance(max_pos, int) and cfg.seq_len > max_pos:
        raise ConfigError(f"--seq-len {cfg.seq_len} exceeds the model's max_position_embeddings ({max_pos})")
    _probe_patch(hf_config, patch_fn, unpatch_fn)
    base, tokenizer, model_info = _load(cfg, hf_config, torch.float32 if autocast else dtype, source)

    out_emb = base.get_output_embeddings()
    vocab = int(out_emb.weight.shape[0]) if out_emb is not None else int(text_config(hf_config).vocab_size)
    text = _data.corpus_text()
    tokens, tok_name = None, "utf-8 bytes"
    if tokenizer is not None:
        tokens = _data.tokenizer_tokens(text, tokenizer)
        if tokens.numel() < len(text) // 16:  # a tokenizer without a vocabulary: use bytes instead
            tokens = None
        else:
            tok_name = type(tokenizer).__name__
    if tokens is None:
        if vocab < 256:
            raise ConfigError(f"byte-level token ids need a vocabulary of >= 256 entries, the model has {vocab}")
        tokens = _data.byte_tokens(text)
    if int(tokens.max()) >= vocab:
        raise ConfigError(f"the tokenizer produces id {int(tokens.max())} but the model's vocabulary is {vocab}")
    try:
        # N ranks: the global batch of N x batch_size sequences is drawn from the seed, each rank takes its slice
        # (tensor parallel: one share, the same rows on every rank)
        dp, dp_rank = compare_dist.data_parallel(cfg.parallel, rank or 0, world or 1)
        batches = _data.fixed_batches(tokens, cfg.steps, cfg.batch_size * dp, cfg.seq_len, cfg.seed)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if is_vision_language(hf_config):  # one random image per sequence, its placeholder tokens ignored by the loss
        batches = [with_images(b, hf_config, seed=cfg.seed + i) for i, b in enumerate(batches)]
    if rank is not None:
        batches = [take_rows(b, dp_rank * cfg.batch_size, (dp_rank + 1) * cfg.batch_size) for b in batches]
    wrap = (lambda model: model) if rank is None else functools.partial(compare_dist.wrap, parallel=cfg.parallel,
                                                                         device=device)

    def make_original():
        return wrap(copy.deepcopy(base).to(device))

    patched: dict[str, Any] = {}

    tp_first = rank is not None and cfg.parallel not in compare_dist.DATA_PARALLEL  # patch the parallelized model

    def make_patched():
        model = copy.deepcopy(base).to(device)
        if tp_first:
            model = wrap(model, stage="tp")
        try:
            patched["report"] = patch_fn(model)
        except (ValueError, TypeError) as e:
            from .dry_run import rejected

            raise rejected(e) from e
        patched["model"] = model
        return wrap(model, stage="rest") if tp_first else wrap(model)

    done: dict[str, int] = {}  # run -> steps finished (for the step a crash happened at)

    def tracked(name, step, steps, loss):
        done[name] = step
        if progress is not None:
            progress(name, step, steps, loss)

    def run(which: str, make, batches, warm_up: bool = False, other: tuple[str, str] | None = None):
        done[which] = 0
        try:
            return train(make, batches, lr=cfg.lr, device=device, autocast=autocast,
                         name="warm-up" if warm_up else which, progress=None if warm_up else tracked)
        except (ConfigError, support.UnsupportedError):
            raise
        except Exception as e:  # (not KeyboardInterrupt) the run crashed: the CLI's "crashed" status
            raise RunCrashed(which, e, warm_up=warm_up, steps_done=done[which], config=dataclasses.asdict(cfg),
                             other=other) from e

    with frozen_heap():  # fast gc.collect() around the runs
        if device.type == "cpu":
            # One throwaway step per path first, so that one-time allocations (lazy library state, the interpreter's
            # first imports) do not land in the first measured run's resident-set growth. CUDA needs no warm-up: its
            # peak counts tensors only, and tokens/s leaves the first (compiling) step out anyway.
            run("original", make_original, batches[:1], warm_up=True)
            try:
                run("patched", make_patched, batches[:1], warm_up=True)
            finally:
                if "model" in patched:
                    unpatch_fn(patched.pop("model"))
            patched.clear()

        torch.manual_seed(cfg.seed)
        original = run("original", make_original, batches)
        torch.manual_seed(cfg.seed)
        try:
            patched_stats = run("patched", make_patched, batches, other=loss_status(original.losses, vocab))
        finally:
            if "model" in patched:
                unpatch_fn(patched.pop("model"))

    per_rank = None
    if rank is not None:  # every rank gets every rank's measurements, and reports their aggregate
        per_rank = compare_dist.gather(device, original, patched_stats)
        replicas = world // dp  # ranks that train on the same tokens (tensor parallel)
        original, patched_stats = (compare_dist.aggregate([r["stats"][i] for r in per_rank], replicas) for i in (0, 1))
    result = _result(cfg, device, dtype, hf_config, base, model_info, tok_name, tokens, original, patched_stats,
                     patched["report"], support, vocab)
    if per_rank is not None:
        compare_dist.annotate(result, per_rank, cfg)
    if isinstance(batches[0], dict):
        n = int((batches[0]["labels"][0] == -100).sum())
        result.data["image_tokens_per_sequence"] = n
        result.notes.append(f"vision-language model: each sequence holds one random image ({n} image tokens, "
                            "ignored by the loss) after its first token; tokens/s counts them as tokens.")
    return result


def _result(cfg, device, dtype, hf_config, base, model_info, tok_name, tokens, original: RunStats,
            patched: RunStats, report, support, vocab: int) -> CompareResult:
    rel = _rel_diffs(original.losses, patched.losses)
    health = {"original": loss_status(original.losses, vocab), "patched": loss_status(patched.losses, vocab)}
    if any(math.isnan(r) for r in rel):
        max_rel, max_step = float("nan"), next(i for i, r in enumerate(rel, 1) if math.isnan(r))
    else:
        max_step = max(range(len(rel)), key=rel.__getitem__) + 1
        max_rel = rel[max_step - 1]
    backend = support.describe_backend(patched.backend_usage)
    reason = support.decide(device, dtype).reason
    text = text_config(hf_config)  # a vision-language model's sizes are its text decoder's
    model_info.update(
        model_type=getattr(hf_config, "model_type", None),
        architecture=type(base).__name__,
        num_parameters=sum(p.numel() for p in base.parameters()),
        hidden_size=getattr(text, "hidden_size", None),
        num_hidden_layers=getattr(text, "num_hidden_layers", None),
        vocab_size=getattr(text, "vocab_size", None),
        dtype=cfg.dtype,
        precision=PRECISION[cfg.dtype],
    )
    scaler = None
    if original.grad_scale is not None:
        scaler = {run: {"final_scale": s.grad_scale, "skipped_steps": s.skipped_steps}
                  for run, s in (("original", original), ("patched", patched))}
    notes = [
        "tokens/s counts input tokens (batch_size * seq_len) per second of step time (forward, backward, AdamW); "
        + ("the first step is excluded (one-time compilation and warm-up)." if len(original.losses) > 1
           else "a single step includes one-time compilation and warm-up."),
        f"peak memory: {original.peak_memory_method}; includes the run's own copy of the weights.",
    ]
    if backend == "interpreter":
        notes.append("the patched run executed the Triton kernels in Triton's CPU interpreter (Python, one program "
                     "instance at a time), so its tokens/s measures the interpreter, not the kernels' speed.")
    elif backend == "reference":
        notes.append("the patched run fell back to the PyTorch reference ops: no Triton kernel ran.")
    elif backend == "none":
        notes.append("no Tigon op ran in the patched run (tigon.patch replaced nothing that the model calls).")
    elif backend == "mixed":
        notes.append("the patched run's ops took different backends; see backend_usage.")
    if support.describe_backend(original.backend_usage) != "none":
        notes.append("unexpected: Tigon ops ran during the original run (was the model patched at class level?).")
    if scaler and any(v["skipped_steps"] for v in scaler.values()):
        notes.append("float16: the GradScaler skipped the steps whose gradients overflowed (original "
                     f"{scaler['original']['skipped_steps']}, patched {scaler['patched']['skipped_steps']}) and "
                     "lowered its scale, as in any fp16 training; the losses of those steps are still shown.")
    for run, (status, detail) in health.items():
        if status != "ok":
            notes.append(f"the {run} run is {status}: {detail}; losses of such a run say nothing about the kernels "
                         "(lower --lr, or train in float32).")
    agreement = judge_agreement(rel, cfg.dtype, {run: status for run, (status, _) in health.items()}, scaler)
    if agreement["detail"]:
        notes.append(f"verdict: {agreement['detail']}.")
    if agreement["verdict"] == "differ":
        notes.append("the losses differ beyond what rounding explains for this dtype: an op computes something other "
                     "than the original; `tigon verify` checks each op against float64 (the bound's reason: "
                     f"{agreement['bound_reason']}).")
    elif cfg.dtype != "float32":
        notes.append(f"the {cfg.dtype} bound ({LOSS_RTOL[cfg.dtype]:.0e}) is loose, as rounding in {cfg.dtype} "
                     "needs: it catches gross errors only (a 1% error of one op stays below it); check a patch in "
                     f"float32 (the default, bound {LOSS_RTOL['float32']:.0e}) first.")
    return CompareResult(
        config=dict(dataclasses.asdict(cfg), layers=getattr(text, "num_hidden_layers", cfg.layers)),
        model=model_info,
        data={"corpus": _data.CORPUS_NAME, "tokenizer": tok_name, "corpus_tokens": int(tokens.numel()),
              "tokens_per_step": original.tokens_per_step},
        loss_original=original.losses,
        loss_patched=patched.losses,
        rel_loss_diff=rel,
        max_rel_loss_diff=max_rel,
        max_rel_loss_diff_step=max_step,
        tokens_per_s={"original": original.tokens_per_s, "patched": patched.tokens_per_s},
        step_time_s={"original": original.step_times_s, "patched": patched.step_times_s},
        wall_time_s={"original": original.wall_time_s, "patched": patched.wall_time_s},
        peak_memory_bytes={"original": original.peak_memory_bytes, "patched": patched.peak_memory_bytes},
        peak_memory_method=original.peak_memory_method,
        device=device_str(device),
        device_name=device_name(device),
        backend=backend,
        backend_reason=reason,
        backend_usage=patched.backend_usage,
        patch=report.as_dict() if hasattr(report, "as_dict") else dict(report or {}),
        versions=versions(),
        grad_scaler=scaler,
        status={run: status for run, (status, _) in health.items()},
        status_detail={run: detail for run, (_, detail) in health.items()},
        ok=all(status == "ok" for status, _ in health.values()),
        notes=notes,
        agreement=agreement,
        losses_agree=None if agreement["verdict"] == "not judged" else agreement["verdict"] == "agree",
    )
