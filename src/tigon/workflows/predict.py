"""The arithmetic of ``tigon profile``: the step's table, the patched step it predicts, and the advice per op.

Pure functions on numbers measured elsewhere (:mod:`tigon.workflows.profile` measures them), so that tests can feed
them synthetic host-bound, device-bound and mixed steps.

**The step model.** A training step is issued by the host (Python, dispatch, autograd, kernel launches: ``host_ms``
in all, H) and executed by the device (kernels and copies: ``device_ms``, D, the device's busy time). With the
launch queue between them the two overlap: a two-stage pipeline, whose makespan over a sequence of parts issued
in order is ``max_j (host time of parts 1..j + device time of parts j..n)`` (Johnson, "Optimal two- and
three-stage production schedules", 1954), at least ``max(H, D)``. The forward and backward interleave small,
host-heavy ops with long kernels finely, so they count as one part overlapped throughout; the optimizer step
that ends the step (the ``tail``: few launches, long kernels, nothing after it to overlap with) is a second part.
With a tail of ``h_t`` host and ``d_t`` device ms the model's step is::

    pipeline(H, D) = max(D, H - h_t + d_t, H)

What the measured step ``T`` spends beyond it (host syncs, phases where one side idles, launch latency) is the
``stall``, kept as it is. Replacing ``calls`` calls per step of an op whose forward + backward costs ``h`` host and
``d`` device ms by one costing ``h'`` and ``d'`` (in the forward and backward, not the tail) moves the totals to::

    H' = H + sum calls * (h' - h)        D' = D + sum calls * (d' - d)
    T' = T - pipeline(H, D) + pipeline(H', D')

so a step bound by its host gets slower when the replacement's launches cost more host time, however fast its
kernels are, and a device-bound step gains what the kernels save.

**The host side from whole parts** (:class:`HostModel`). A replaced op timed alone misses what it costs inside the
model (autograd's bookkeeping of custom Functions, the integration layer's Python, the code between replaced
modules): on a host-bound step the per-op host deltas predicted the patched step 13.6% short. ``H'`` is then taken
from whole decoder layers and the rest of the model measured original and patched
(:mod:`tigon.workflows.profile_layer`): ``H' = H + delta``, ``delta`` = layers x (patched layer - original layer) +
(patched rest - original rest). Leaving kinds out: each kind's *marginal* host change ``m_k = delta - delta_-k``
(``delta_-k``: the same measured under ``tigon.patch(model, k=False)``) is taken back, ``H'(S) = H + delta -
sum_{k not in S} m_k`` (kinds without a measured ``delta_-k``: their per-op host change), and nothing replaced is
``H``. The marginals add up exactly only when the kinds' host costs are independent: with every kind on, or one
left out, the prediction is a measurement; two or more left out, an approximation.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

MAX_ADVICE_KINDS = 10
"""At most this many patch kinds are searched exhaustively (2**n subsets) for the best set to replace."""
SLOWER_THRESHOLD = 0.005
"""A kind "slows the step" when leaving it out is predicted to shorten the step by more than this fraction."""


@dataclass(frozen=True)
class OpCost:
    """One forward + backward call of an op: ``host_ms`` the host's time to issue it (Python, dispatch, launches;
    the device not waited for), ``device_ms`` its kernels' time (ms; 0 on a CPU, where everything is host)."""

    host_ms: float
    device_ms: float

    def __post_init__(self):
        if not (self.host_ms >= 0 and self.device_ms >= 0):
            raise ValueError(f"OpCost: host_ms and device_ms must be >= 0, got {self.host_ms}, {self.device_ms}")


@dataclass(frozen=True)
class OpChange:
    """What one patch kind changes in the step.

    kind: the :func:`tigon.patch` kind (``"mlp"``); op: the Tigon op it runs (``"swiglu"``); keyword: the
    ``tigon.patch`` keyword that leaves it out (``"mlp"``; the LM head's is ``"fused_linear_cross_entropy"``).
    calls: replaced calls per step (modules it patches, each run once per step). original / tigon: the
    :class:`OpCost` of one call of the code it replaces and of Tigon's op. bypasses: kind -> calls of that kind
    the replacement no longer makes when this kind is on (a fused decoder layer no longer calls its post-attention
    norm: ``{"rms_norm": layers}``).
    """

    kind: str
    op: str
    keyword: str
    calls: int
    original: OpCost
    tigon: OpCost
    bypasses: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self):
        if self.calls < 0 or any(v < 0 for v in self.bypasses.values()):
            raise ValueError(f"OpChange {self.kind}: calls and bypassed calls must be >= 0")


@dataclass(frozen=True)
class StepCost:
    """A training step, ms per step: ``step_ms`` its measured time (T), ``host_ms`` the host's time to issue it (H),
    ``device_ms`` the device's busy time (D); ``tail_host_ms`` / ``tail_device_ms`` the part of each in the step's
    last phase, the optimizer (see the module docstring; 0: no tail)."""

    step_ms: float
    host_ms: float
    device_ms: float
    tail_host_ms: float = 0.0
    tail_device_ms: float = 0.0

    def __post_init__(self):
        if not (self.step_ms > 0 and self.host_ms >= 0 and self.device_ms >= 0):
            raise ValueError(f"StepCost: step_ms must be > 0 and host_ms, device_ms >= 0, got {self.step_ms}, "
                             f"{self.host_ms}, {self.device_ms}")
        if not (0 <= self.tail_host_ms <= self.host_ms and 0 <= self.tail_device_ms <= self.device_ms):
            raise ValueError(f"StepCost: the tail's times must be >= 0 and within the step's, got host "
                             f"{self.tail_host_ms} of {self.host_ms}, device {self.tail_device_ms} of "
                             f"{self.device_ms}")

    @property
    def pipeline_ms(self) -> float:
        """The model's step: ``max(D, H - tail_host + tail_device, H)`` (the module docstring)."""
        return max(self.device_ms, self.host_ms - self.tail_host_ms + self.tail_device_ms, self.host_ms)

    @property
    def bound(self) -> str:
        """``"host"`` when the host's part of :attr:`pipeline_ms` is the larger (the device waits on it during the
        forward and backward), else ``"device"``."""
        return "host" if self.host_ms - self.tail_host_ms + self.tail_device_ms > self.device_ms else "device"

    @property
    def stall_ms(self) -> float:
        """``T - pipeline_ms``: what the step spends beyond the model (negative within measurement noise)."""
        return self.step_ms - self.pipeline_ms


@dataclass(frozen=True)
class HostModel:
    """The host side of the patched step from whole parts (the module docstring): ``delta_ms`` = ``H' - H`` with
    every kind replaced, ms per step; ``without_ms``: kind -> ``H' - H`` with every kind but that one replaced
    (kinds missing: their per-op host change is taken back instead)."""

    delta_ms: float
    without_ms: Mapping[str, float] = field(default_factory=dict)

    def marginal_ms(self, kind: str) -> float | None:
        """What replacing ``kind`` adds to the host's time with every other kind replaced, ms per step (None when
        not measured)."""
        w = self.without_ms.get(kind)
        return None if w is None else self.delta_ms - w


def calls_per_kind(changes: Iterable[OpChange], enabled: Iterable[str]) -> dict[str, int]:
    """Replaced calls per step of each enabled kind: its ``calls`` less those that an enabled kind bypasses."""
    on = set(enabled)
    changes = [c for c in changes if c.kind in on]
    out = {c.kind: c.calls for c in changes}
    for c in changes:
        for kind, n in c.bypasses.items():
            if kind in out:
                out[kind] = max(0, out[kind] - n)
    return out


def host_delta(changes: list[OpChange], on: Iterable[str], host: HostModel | None = None) -> float:
    """``H' - H`` when the kinds ``on`` are replaced, ms per step: from ``host`` when given (``delta - sum of the
    marginals of the kinds left out``; 0 when none is on), else the per-op host changes (the module docstring)."""
    on = set(on)
    if host is None or not any(c.kind in on for c in changes):
        calls = calls_per_kind(changes, on)
        return sum(calls.get(c.kind, 0) * (c.tigon.host_ms - c.original.host_ms) for c in changes)
    every = calls_per_kind(changes, [c.kind for c in changes])
    out = host.delta_ms
    for c in changes:
        if c.kind not in on:
            m = host.marginal_ms(c.kind)
            out -= every.get(c.kind, 0) * (c.tigon.host_ms - c.original.host_ms) if m is None else m
    return out


def predict(step: StepCost, changes: Iterable[OpChange], enabled: Iterable[str] | None = None,
            host: HostModel | None = None) -> StepCost:
    """The patched step when the kinds ``enabled`` (default: every change's) are replaced (see the module docstring).

    ``host``: take ``H'`` from whole parts (:class:`HostModel`), else from the per-op host changes. ``D'`` is
    always the per-op device changes (the kernels' time, which isolated calls measure faithfully).

    Returns:
        a :class:`StepCost` of ``H'``, ``D'`` (the tail unchanged) and ``T' = T - pipeline(H, D) + pipeline(H',
        D')`` (at least 0.1% of ``T``).
    """
    changes = list(changes)
    on = [c.kind for c in changes] if enabled is None else list(enabled)
    calls = calls_per_kind(changes, on)
    h = step.host_ms + host_delta(changes, on, host)
    d = step.device_ms + sum(calls.get(c.kind, 0) * (c.tigon.device_ms - c.original.device_ms) for c in changes)
    new = StepCost(step.step_ms, max(step.tail_host_ms, h), max(step.tail_device_ms, d), step.tail_host_ms,
                   step.tail_device_ms)
    t = step.step_ms - step.pipeline_ms + new.pipeline_ms
    return dataclasses.replace(new, step_ms=max(t, 1e-3 * step.step_ms))


@dataclass
class KindAdvice:
    """The predicted effect of one patch kind.

    kind, op, keyword: as :class:`OpChange`. calls: its calls per step with every kind on. host_delta_ms,
    device_delta_ms: what its calls change in H and D (ms per step; negative saves). step_ms_without: the predicted
    step with every other kind replaced and this one left out. slows_step: leaving it out is predicted to be faster
    (by more than :data:`SLOWER_THRESHOLD`). patch_call: the ``tigon.patch`` call that leaves it out.
    """

    kind: str
    op: str
    keyword: str
    calls: int
    host_delta_ms: float
    device_delta_ms: float
    step_ms_without: float
    slows_step: bool
    patch_call: str


@dataclass
class Advice:
    """The advice of :func:`advise`: per kind, and the best set of kinds to replace.

    step_ms_all: the predicted step with every kind replaced. kinds: :class:`KindAdvice` per kind. best_keywords:
    the ``tigon.patch`` keywords to set to False for the best predicted step (empty: patch everything);
    best_step_ms: that step; best_call: that call as text; replace_nothing: every replacement is predicted to slow
    the step (the best is not to patch).
    """

    step_ms_all: float
    kinds: list[KindAdvice]
    best_keywords: list[str]
    best_step_ms: float
    best_call: str
    replace_nothing: bool = False


def patch_call(keywords_off: Iterable[str]) -> str:
    """``tigon.patch(model, a=False, ...)`` for the keywords in ``keywords_off`` (``tigon.patch(model)`` if none)."""
    args = "".join(f", {k}=False" for k in sorted(set(keywords_off)))
    return f"tigon.patch(model{args})"


def advise(step: StepCost, changes: Iterable[OpChange], host: HostModel | None = None) -> Advice:
    """Per kind: the step predicted without it (every other kind replaced), and whether replacing it slows the
    step; and the set of kinds whose replacement gives the fastest predicted step (every subset tried, up to
    :data:`MAX_ADVICE_KINDS` kinds; greedily leaving kinds out beyond). ``host``: as :func:`predict` (a kind's
    ``host_delta_ms`` is then its marginal host change, where measured).

    Raises:
        ValueError: two changes of the same kind.
    """
    changes = list(changes)
    kinds = [c.kind for c in changes]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"advise: one change per kind, got {kinds}")
    keyword = {c.kind: c.keyword for c in changes}
    all_ms = predict(step, changes, host=host).step_ms
    calls = calls_per_kind(changes, kinds)
    out = []
    for c in changes:
        n = calls.get(c.kind, 0)
        without = predict(step, changes, [k for k in kinds if k != c.kind], host).step_ms
        m = host.marginal_ms(c.kind) if host is not None else None
        out.append(KindAdvice(c.kind, c.op, c.keyword, n, n * (c.tigon.host_ms - c.original.host_ms) if m is None
                              else m, n * (c.tigon.device_ms - c.original.device_ms), without,
                              without < all_ms * (1 - SLOWER_THRESHOLD), patch_call([c.keyword])))

    def cost(on) -> float:
        return predict(step, changes, on, host).step_ms

    if len(kinds) <= MAX_ADVICE_KINDS:
        subsets = (s for r in range(len(kinds), -1, -1) for s in itertools.combinations(kinds, r))
        best = min(subsets, key=cost)  # ties: the first, i.e. the most kinds replaced
    else:
        best = list(kinds)
        while best:
            trial = min(([k for k in best if k != drop] for drop in best), key=cost)
            if cost(trial) >= cost(best):
                break
            best = trial
    best_ms = cost(best)
    if best_ms >= all_ms * (1 - SLOWER_THRESHOLD):  # not worth a different call
        best, best_ms = list(kinds), all_ms
    off = [keyword[k] for k in kinds if k not in best]
    return Advice(all_ms, out, off, best_ms, patch_call(off), replace_nothing=bool(kinds) and not best)


# ------------------------------------------------------------------------------------------------ the step's table
@dataclass
class TableRow:
    """One row of the step's table: ``name``, ``ms`` per step, ``pct`` of the step, ``basis`` (what ``ms``
    measures: ``"kernel"`` time of the ops' kernels, or ``"wall"`` time of the step not covered by kernels)."""

    name: str
    ms: float
    pct: float
    basis: str


def step_table(kernel_ms: Mapping[str, float], device_busy_ms: float, step_ms: float
               ) -> tuple[list[TableRow], float]:
    """The rows of the step's table: each category's kernel time, the kernels no op was linked to, and the device's
    idle time, adding up to ``step_ms``.

    Args:
        kernel_ms: category -> kernel time per step attributed to it (ms).
        device_busy_ms: the device's busy time per step (the union of its kernels' intervals), ms.
        step_ms: the step's wall time (ms, > 0).

    Returns:
        (rows, scale): the category rows (``kernel``), ``"unlinked kernels"`` (busy time no category holds) and
        ``"device idle"`` (``step_ms`` - busy: the device waiting for the host), every row >= 0 and their sum
        ``step_ms``; ``scale`` < 1 when the categories held more kernel time than the device was busy (time counted
        twice) and were scaled down to fit, else 1. The busy time is capped at ``step_ms`` likewise.

    Raises:
        ValueError: ``step_ms`` <= 0 or a negative time.
    """
    if not step_ms > 0:
        raise ValueError(f"step_table: step_ms must be > 0, got {step_ms}")
    if device_busy_ms < 0 or any(v < 0 for v in kernel_ms.values()):
        raise ValueError("step_table: kernel and busy times must be >= 0")
    busy = min(device_busy_ms, step_ms)
    total = sum(kernel_ms.values())
    scale = busy / total if total > busy and total > 0 else 1.0
    rows = [TableRow(name, ms * scale, 0.0, "kernel") for name, ms in kernel_ms.items()]
    rows.append(TableRow("unlinked", max(0.0, busy - total * scale), 0.0, "kernel"))
    rows.append(TableRow("idle", step_ms - busy, 0.0, "wall"))
    for r in rows:
        r.pct = 100.0 * r.ms / step_ms
    return rows, scale
