"""The training loop shared by the workflows, with honest timing and peak-memory measurement.

Peak memory
-----------
CUDA
    ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats``: the most bytes held by
    PyTorch's caching allocator at once during the run (weights, gradients, AdamW state, activations, kernel
    workspaces). The model is moved to the device inside the measured region, so its weights count.
CPU (Linux)
    The growth of the process's resident set: the kernel's high-water mark ``VmHWM`` (reset through
    ``/proc/self/clear_refs`` before the run) minus the resident set at the start of the run. Freed heap is
    returned to the OS first (``malloc_trim``) so an earlier run does not lend the later one its pages, and
    :func:`tigon.workflows.compare.run_compare` runs one throwaway step of each path beforehand so that one-time
    allocations (lazy library state, first imports) do not land in the first run. It counts everything the
    process touched during the run, PyTorch or not (for the interpreter: its numpy temporaries), at page
    granularity, so small models read as a few MB of noise. Where ``/proc`` is unavailable it is ``None``.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

ProgressFn = Callable[[str, int, int, float], None]
"""``progress(run, step, steps, loss)``: called after each optimizer step; ``step`` counts from 1."""


# ----------------------------------------------------------------------------------------------------------------
# peak memory


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        import os

        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _hwm_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def frozen_heap():
    """Context manager: one full garbage collection, then every object alive now is left out of later collections
    (:func:`gc.freeze`) until exit (:func:`gc.unfreeze`). The collections :func:`train` and :class:`PeakMemory` make
    around each run then scan only what the runs created, not all of torch, transformers and Triton (about a third
    of a second per collection on a 2-core machine, eight of them per ``tigon compare``). Garbage the runs create is
    collected as before."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class PeakMemory:
    """Context manager measuring the peak memory of the code inside it, in bytes (see the module docstring).

    After exit: ``peak_bytes`` (int or None) and ``method`` (a short description of what was measured).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.peak_bytes: int | None = None
        self.peak_requested_bytes: int | None = None  # CUDA: the peak of the sizes asked for, before block rounding
        self.method = ""
        self._base: int | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.method = "torch.cuda.max_memory_allocated (after reset_peak_memory_stats)"
        else:
            _malloc_trim()
            self._base = _rss_bytes() if _reset_hwm() else None
            self.method = (
                "growth of the process resident set: VmHWM (reset via /proc/self/clear_refs) minus RSS at the start"
                if self._base is not None
                else "unavailable (needs Linux /proc/self/clear_refs)"
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
            requested = torch.cuda.memory_stats(self.device).get("requested_bytes.all.peak")
            self.peak_requested_bytes = int(requested) if requested is not None else None
        elif self._base is not None:
            hwm = _hwm_bytes()
            self.peak_bytes = None if hwm is None else max(0, hwm - self._base)


# ----------------------------------------------------------------------------------------------------------------
# run health

DIVERGENCE_FACTOR = 1.5
"""A run whose last loss exceeds this multiple of max(first loss, ln(vocab)) has diverged (see :func:`loss_status`)."""


def loss_status(losses: list[float], vocab: int) -> tuple[str, str]:
    """Whether a training run's losses are healthy: ``(status, detail)``.

    status: ``"ok"``; ``"non-finite"`` when a loss is NaN or infinite (detail: the first such step, 1-based); or
    ``"diverged"`` when the last loss exceeds :data:`DIVERGENCE_FACTOR` x max(first loss, ln(vocab)), ln(vocab)
    being the loss (nats) of a uniform guess over the vocabulary: the run ended far worse than it started and than
    guessing. detail is ``""`` when ok.

    Args:
        losses: per-step losses in nats. vocab: the model's vocabulary size (>= 2).

    Raises:
        ValueError: ``vocab`` < 2.
    """
    if not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"vocab must be an integer >= 2, got {vocab!r}")
    bad = [i for i, x in enumerate(losses, 1) if not math.isfinite(x)]
    if bad:
        return "non-finite", (f"loss {losses[bad[0] - 1]} at step {bad[0]}"
                              + (f", {len(bad)} of {len(losses)} losses not finite" if len(bad) > 1 else ""))
    if len(losses) > 1:
        ceiling = DIVERGENCE_FACTOR * max(losses[0], math.log(vocab))
        if losses[-1] > ceiling:
            return "diverged", (f"final loss {losses[-1]:.4g} > {DIVERGENCE_FACTOR:g} x max(first loss "
                                f"{losses[0]:.4g}, ln(vocab {vocab}) {math.log(vocab):.4g}) = {ceiling:.4g}")
    return "ok", ""


# ----------------------------------------------------------------------------------------------------------------
# training


@dataclass
class RunStats:
    """What one training run measured.

    losses: per-step training loss (float, the model's mean next-token cross-entropy in nats).
    step_times_s: per-step wall time in seconds (forward + backward + optimizer step, device synchronized).
    tokens_per_step: input tokens per step (batch_size * seq_len).
    tokens_per_s: tokens_per_step * timed steps / their total time; the first step is left out when there is more
        than one (it carries one-time costs: kernel compilation, allocator warm-up).
    wall_time_s: total seconds of the run, setup included.
    peak_memory_bytes / peak_memory_method: see :class:`PeakMemory`; peak_requested_bytes: CUDA only, the peak of the
        sizes requested from the caching allocator (``requested_bytes.all.peak``), which leaves out the rounding of
        blocks the allocator hands out (a reused cached block is not split when less than 1 MiB would remain).
    backend_usage: Tigon op calls per backend during the run (:func:`tigon.support.backend_usage`).
    grad_scale / skipped_steps: float16 autocast only (else None / []): the GradScaler's scale after the run, and the
        1-based steps it skipped because their gradients held inf or NaN.
    """

    losses: list[float] = field(default_factory=list)
    step_times_s: list[float] = field(default_factory=list)
    tokens_per_step: int = 0
    tokens_per_s: float = 0.0
    wall_time_s: float = 0.0
    peak_memory_bytes: int | None = None
    peak_memory_method: str = ""
    peak_requested_bytes: int | None = None
    backend_usage: dict[str, dict[str, int]] = field(default_factory=dict)
    grad_scale: float | None = None
    skipped_steps: list[int] = field(default_factory=list)


def step_inputs(batch, device: torch.device | None = None, dtype: torch.dtype | None = None) -> dict:
    """The forward arguments of one training step on ``batch``, moved to ``device`` (None: where they are): a
    (batch, seq) int64 tensor of token ids is both ``input_ids`` and ``labels`` (Hugging Face shifts the labels); a
    dict (a vision-language batch, :func:`tigon.workflows.multimodal.with_images`) is taken as it is, its floating
    tensors (pixels) cast to ``dtype`` when given."""
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device, non_blocking=True)
        return {"input_ids": batch, "labels": batch}
    return {k: v.to(device, dtype if dtype is not None and v.is_floating_point() else None, non_blocking=True)
            for k, v in batch.items()}


def batch_ids(batch) -> torch.Tensor:
    """The (B, T) token ids of a batch as :func:`step_inputs` takes it: the tensor itself, or a vision-language
    model's dict's ``input_ids`` (image placeholder tokens included)."""
    return batch if isinstance(batch, torch.Tensor) else batch["input_ids"]


def batch_tokens(batch) -> int:
    """Text tokens (image placeholder tokens included) of a batch as :func:`step_inputs` takes it."""
    return int(batch_ids(batch).numel())


def param_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of ``model``'s first floating-point parameter (what its pixel inputs are cast to), or None."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(
    make_model: Callable[[], torch.nn.Module],
    batches: list[torch.Tensor],
    *,
    lr: float,
    device: torch.device,
    name: str,
    progress: ProgressFn | None = None,
    autocast: torch.dtype | None = None,
) -> RunStats:
    """Train the model ``make_model()`` returns for ``len(batches)`` AdamW steps and measure it.

    ``make_model`` runs inside the measured region, so the model's weights count towards peak memory; it must
    return the model on ``device`` in its training dtype. Each step: ``model(**step_inputs(b), use_cache=False)``
    (token ids: ``input_ids=b, labels=b``, Hugging Face shifts the labels; a vision-language batch: its dict),
    ``loss.backward()``, ``AdamW.step()``, ``zero_grad()``.
    With ``autocast`` the forward runs under ``torch.autocast(device.type, dtype=autocast)``; for torch.float16 the
    loss is scaled by a ``torch.amp.GradScaler`` (``scaler.scale(loss).backward()``, ``scaler.step``,
    ``scaler.update``), which skips the steps whose gradients overflow.

    Args:
        make_model: builds (or moves) the model; called once.
        batches: one per step (CPU; moved to ``device`` per step): (batch, seq) int64 token ids, or dicts of forward
            arguments (:func:`step_inputs`).
        lr: AdamW learning rate (other AdamW settings are PyTorch's defaults).
        device: where the run happens.
        name: the run's name passed to ``progress``.
        progress: optional ``progress(name, step, steps, loss)`` callback.
        autocast: None (train in the weights' dtype), or the autocast dtype (torch.float16 or torch.bfloat16) over
            float32 weights.
    """
    from tigon import support

    stats = RunStats(tokens_per_step=batch_tokens(batches[0]) if batches else 0)
    support.backend_usage(reset=True)
    start = time.perf_counter()
    with PeakMemory(device) as mem:
        model = make_model()
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device.type) if autocast == torch.float16 else None
        dtype = param_dtype(model)
        for step, batch in enumerate(batches, start=1):
            inputs = step_inputs(batch, device, dtype)
            _sync(device)
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=autocast) if autocast is not None else contextlib.nullcontext():
                loss = model(**inputs, use_cache=False).loss
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scale = scaler.get_scale()
                scaler.step(optimizer)
                scaler.update()
                if scaler.get_scale() < scale:  # the scaler lowers its scale exactly when it skipped the step
                    stats.skipped_steps.append(step)
            optimizer.zero_grad(set_to_none=True)
            value = float(loss.detach().float().item())
            _sync(device)
            stats.step_times_s.append(time.perf_counter() - t0)
            stats.losses.append(value)
            if progress is not None:
                progress(name, step, len(batches), value)
        if scaler is not None:
            stats.grad_scale = float(scaler.get_scale())
        del optimizer, loss
    stats.wall_time_s = time.perf_counter() - start
    stats.peak_memory_bytes, stats.peak_memory_method = mem.peak_bytes, mem.method
    stats.peak_requested_bytes = mem.peak_requested_bytes
    stats.backend_usage = support.backend_usage(reset=True)
    timed = stats.step_times_s[1:] if len(stats.step_times_s) > 1 else stats.step_times_s
    stats.tokens_per_s = stats.tokens_per_step * len(timed) / sum(timed) if timed and sum(timed) > 0 else 0.0
    # The caller still holds the model (to unpatch it); drop our reference and the autograd graph.
    del model
    gc.collect()
    return stats
