"""The report of ``tigon profile`` (:func:`tigon.workflows.profile.run_profile`): :class:`ProfileResult` (its JSON
form: :meth:`ProfileResult.as_dict`), the rows of the step's table (:class:`CategoryRow`, named by :data:`LABELS`, on
CPU :data:`CPU_LABELS`), and its ``limits`` rows, built from a step's measured cost (:func:`step_cost`,
:func:`_limits`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..ops import CATEGORY_LABELS
from . import predict as PR
from .timing import IssueTime

LABELS = {"matmul": "matmul", "attention": "attention", **CATEGORY_LABELS, "optimizer": "optimizer", "other": "other",
          "unlinked": "kernels linked to no op", "idle": "device idle (waiting on the host)"}
CPU_LABELS = {"unlinked": "kernels linked to no op", "idle": "outside any op (Python, hooks, profiler)"}


@dataclass
class CategoryRow:
    """One row of the step's table.

    name / label: key and display name (the categories, then ``unlinked`` and ``idle``). ms: per-step time in the
    profiled original step, ms; basis: what it measures (``"kernel"``: the kernels' time, self CPU time on CPU;
    ``"wall"``: the step's time the device was idle). pct: share of the profiled step, %. replaced: Tigon replaces
    code of this category; tigon_op: by which op(s). predicted_ms: the category's predicted time in the patched
    step (ms + the replaced calls' kernel-time change; host time on CPU). patched_ms: its time in the profiled
    patched step.
    """

    name: str
    label: str
    ms: float
    pct: float
    basis: str = "kernel"
    replaced: bool = False
    tigon_op: str | None = None
    predicted_ms: float | None = None
    patched_ms: float | None = None


@dataclass
class ProfileResult:
    """The outcome of :func:`~tigon.workflows.profile.run_profile`; :meth:`as_dict` is the JSON report.

    categories: :class:`CategoryRow` per category plus ``unlinked`` and ``idle``; their ``ms`` add up to
    ``profiled_step_ms``. time_basis: what the category times measure. attribution_scale: < 1 when the categories
    held more kernel time than the device was busy and were scaled down (:func:`tigon.workflows.predict.step_table`).
    profiled_step_ms / profiled_step_ms_patched: mean wall time of a profiled step. step_ms_original /
    step_ms_patched: median unprofiled step. limits: ``{"original"|"predicted"|"patched": {"step_ms", "host_ms",
    "device_ms", "optimizer_host_ms", "optimizer_device_ms", "model_ms", "bound"}}``: the step, the host's time to
    issue it, the device's time to run it, the optimizer's part of each, and the model's step
    (:attr:`tigon.workflows.predict.StepCost.pipeline_ms`), ms; on CUDA the measured rows also hold
    ``host_natural_ms`` (the parts' time without the sleep), ``host_parts``, ``host_waited`` (parts where the host
    waited for the device anyway), ``hold_ms`` (the longest sleep), ``syncs`` (:func:`tigon.workflows.timing.
    sync_points`), ``parts`` (label, host_ms, device_ms, waited per part) and ``device_ops`` (launches per
    profiled step).
    predicted_step_ms_patched: the prediction; prediction_error_pct: 100 * (predicted - measured) / measured.
    ops: per replaced kind, its calls per step, the per-call costs of the original code and of Tigon's op
    (:func:`tigon.workflows.timing.call_cost`: host and device ms, ...), what its calls change in H and D, the step
    predicted without it, ``slows_step`` and the ``patch_call`` leaving it out. advice: ``{"best_call",
    "best_keywords", "best_step_ms", "replace_nothing", "slower": [kinds]}`` (:func:`tigon.workflows.predict.advise`).
    patch: what tigon.patch replaced (counts per kind). backend: the patched run's kernel path. traces: files written.
    stage_s: seconds each stage took (its progress label -> s). host_in_step: ``{"original"|"patched":
    {"overhead", "steps"}}``, the hooks' own cost subtracted from the in-step host times and the steps measured
    (:func:`tigon.workflows.profile_attrib.in_step_host`); each op's ``in_step`` holds its kind's in-step host
    time, original and Tigon, ``host_basis`` says which host time the prediction used (``"layers"``,
    ``"in_step"`` or ``"isolated"``) and ``host_delta_ms_isolated`` is its ``host_delta_ms`` from the isolated
    calls; its
    ``original`` / ``tigon`` costs hold ``peak_extra_bytes``, what one isolated call allocates at its peak (CUDA).
    peak_memory_bytes_original / peak_memory_bytes_patched: the measured steps' peak memory (bytes, as ``tigon bench
    --e2e``), the memory side of the advice: a kind left out for speed gives back its memory saving.
    layers: the whole parts measured for the host prediction (:meth:`tigon.workflows.profile_layer.LayerCosts.
    as_dict`: per variant each layer group's and the rest's cost per forward + backward, and each variant's
    ``host_delta_ms`` / ``device_delta_ms`` per step); ``limits["predicted"]`` then says ``host_basis``
    (``"layers"`` or ``"per_op"``) and holds the per-op prediction beside it (``host_ms_per_op``,
    ``step_ms_per_op``), ``host_side`` (the parts' host time used: :data:`tigon.workflows.profile_layer.
    HOST_SIDE`), ``alternative`` (``{"host_side", "host_ms", "step_ms"}``: the prediction from the parts' other host
    time) and ``device_ms_layers`` (D + the parts' device change); each op's ``host_delta_ms`` is its
    marginal host change from the parts (``host_basis`` ``"layers"``), its ``host_delta_ms_per_op`` the per-op
    one (``host_basis_per_op``: ``"in_step"`` or ``"isolated"``).
    """

    config: dict[str, Any]
    model: dict[str, Any]
    device: str
    device_name: str
    time_basis: str
    categories: list[CategoryRow]
    profiled_step_ms: float
    step_ms_original: float
    attribution_scale: float = 1.0
    limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    profiled_step_ms_patched: float | None = None
    step_ms_patched: float | None = None
    predicted_step_ms_patched: float | None = None
    prediction_error_pct: float | None = None
    ops: list[dict[str, Any]] = field(default_factory=list)
    advice: dict[str, Any] = field(default_factory=dict)
    patch: dict[str, int] = field(default_factory=dict)
    backend: str | None = None
    traces: list[str] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    stage_s: dict[str, float] = field(default_factory=dict)
    host_in_step: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes_original: int | None = None
    peak_memory_bytes_patched: int | None = None
    layers: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)


def step_cost(step_ms: float, issue: IssueTime | None) -> PR.StepCost:
    """The :class:`~tigon.workflows.predict.StepCost` of a step of ``step_ms`` (ms) whose issue was measured as
    ``issue`` (:func:`~tigon.workflows.profile_events.step_issue`; its last part is the optimizer, the step's tail).
    Without a held device (None, or a CPU) everything is host time: ``H = T``, ``D = 0``. The unheld host time
    ``H_u`` (the pipeline's basis, :class:`~tigon.workflows.predict.StepCost`) is the parts' wall time without the
    sleep (``issue.natural_ms``)."""
    if issue is None or not issue.held:
        return PR.StepCost(step_ms, step_ms, 0.0)
    opt = issue.segments[-1]
    return PR.StepCost(step_ms, issue.host_ms, issue.device_ms, min(opt.host_ms, issue.host_ms),
                       min(opt.device_ms, issue.device_ms), issue.natural_ms)


def _limits(step: PR.StepCost, issue: IssueTime | None = None, syncs: list[str] | None = None) -> dict[str, Any]:
    out = {"step_ms": step.step_ms, "host_ms": step.host_ms, "device_ms": step.device_ms,
           "optimizer_host_ms": step.tail_host_ms, "optimizer_device_ms": step.tail_device_ms,
           "host_unheld_ms": step.host_unheld_ms, "host_scale": step.host_scale,
           "model_ms": step.pipeline_ms, "model_basis": "unheld host" if step.host_unheld_ms is not None
           else "held host", "stall_ms": step.stall_ms, "bound": step.bound}
    if issue is not None and issue.held:
        out.update(host_natural_ms=issue.natural_ms, host_parts=len(issue.segments), host_waited=issue.waited,
                   hold_ms=issue.hold_ms, syncs=list(syncs or []),
                   parts=[dataclasses.asdict(s) for s in issue.segments])
    return out
