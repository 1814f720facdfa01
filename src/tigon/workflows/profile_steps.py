"""Profiling training steps of one model under :mod:`torch.profiler` for ``tigon profile`` (step 6 of
:mod:`tigon.workflows.profile`): :func:`profile_steps` runs ``batches[:warmup]`` unprofiled, then the profiler's
warm-up step, then the profiled steps, with :class:`~tigon.workflows.profile_events.Annotator`'s ``record_function``
ranges around the model's modules and the optimizer step in a range of its own, and attributes the profiler's events
to categories per step (:func:`~tigon.workflows.profile_events.categorize`; :class:`StepProfile`).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from ._train import param_dtype, step_inputs
from .profile_events import RANGE, Annotator, categorize, device_busy_us, device_op_count, make_step


@dataclass
class StepProfile:
    """What :func:`profile_steps` measured, per step: ``categories`` (ms of each category, :func:`categorize`),
    ``step_ms`` (mean wall time of a profiled step), ``busy_ms`` (the device's busy time; on CPU the ops' summed
    self CPU time) and ``device_ops`` (kernels, copies and sets the device ran: launches)."""

    categories: dict[str, float]
    step_ms: float
    busy_ms: float
    device_ops: float = 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_steps(model: torch.nn.Module, batches: list[torch.Tensor], *, device: torch.device, lr: float,
                  warmup: int, trace: str | None = None) -> StepProfile:
    """Profile training steps of ``model`` (step 6 of :mod:`tigon.workflows.profile`) and return a :class:`StepProfile`.

    ``batches[:warmup]`` run unprofiled, the next one is the profiler's warm-up, the rest are profiled. Writes a
    Chrome trace of the profiled steps to ``trace`` when given.

    Raises:
        ValueError: fewer than ``warmup + 2`` batches.
    """
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    cuda = device.type == "cuda"
    model.train()
    annot = Annotator(model)
    active = len(batches) - warmup - 1
    if active < 1:
        raise ValueError("profile_steps needs warmup + 2 batches at least")
    train_step = make_step(model, lr, lambda: record_function(RANGE + "optimizer"))
    dtype = param_dtype(model)

    def step(batch) -> None:
        train_step(batch)
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
            step(step_inputs(b, device, dtype))
        _sync(device)
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
                     on_trace_ready=ready) as prof:
            for i, b in enumerate(batches[warmup:]):
                _sync(device)
                t0 = time.perf_counter()
                step(step_inputs(b, device, dtype))
                _sync(device)
                if i >= 1:
                    times.append((time.perf_counter() - t0) * 1e3)
                prof.step()
    finally:
        annot.remove()
    events = held.get("events") or []
    cats = {c: us / 1e3 / active for c, us in categorize(events, cuda).items()}
    busy = device_busy_us(events) / 1e3 / active if cuda else sum(cats.values())
    return StepProfile(cats, statistics.fmean(times), busy, device_op_count(events) / active if cuda else 0.0)
