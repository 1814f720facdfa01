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

**The host's time basis: unheld.** ``H`` is measured with the device held busy by a sleep kernel (so that the
host never waits for it), which leaves every launch of a part pending at once; in a host-bound step the launch
queue is nearly empty. Held host time overstates the step's: on the recorded host-bound rows (Qwen2.5-0.5B, 24
layers, 4 x 1024) ``H`` exceeded the step itself by 4-22%, more for the patched model than the original (its
Triton launches inflate more), so ``T - pipeline`` went negative and the held host change reached the step at
full weight (+13.9% on the H100's row). The pipeline is therefore taken in the *unheld* basis: ``H_u`` = the same
parts timed with the device running along (``host_unheld_ms``, :attr:`StepCost.issue_host_ms`), and each call's
host change in the same basis (:attr:`OpCost.host_unheld_ms`; missing: the held time scaled by the step's
``H_u / H``, :attr:`StepCost.host_scale`). With the patched step's own measured ``H_u'`` and ``D'``, this model
lands within 3.4% of the measured patched step on six of the seven recorded GPU rows, the held one within 11%
on four (``benchmarks/predict_recompute.py``, "oracle" columns).

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
SLOWER_THRESHOLD = 0.02
"""A kind "slows the step" when leaving it out is predicted to shorten the step by more than this fraction. 2%: below
it the gain is inside a measured step's own run-to-run spread and the prediction's error (target +-7%; on an H100 on
2026-12-07 the Qwen2.5-0.5B row was predicted 3.6% above its measured step), while leaving a kind out has a sure
cost in memory (the fused loss's: that row's 4096 x 151936 logits, 1.16 GiB in bf16, plus their fp32 upcast). At
0.5% that row was advised to leave the fused loss out for 0.7% (76.6 against 77.1 ms predicted;
``benchmarks/results/h100/session31/pred``)."""


@dataclass(frozen=True)
class OpCost:
    """One forward + backward call of an op: ``host_ms`` the host's time to issue it with the device held (Python,
    dispatch, launches; the device not waited for), ``device_ms`` its kernels' time (ms; 0 on a CPU, where
    everything is host); ``host_unheld_ms`` the host's time with the device running along, as in a host-bound
    step (None: not measured; :func:`predict` then scales ``host_ms`` by the step's :attr:`StepCost.host_scale`).
    """

    host_ms: float
    device_ms: float
    host_unheld_ms: float | None = None

    def __post_init__(self):
        if not (self.host_ms >= 0 and self.device_ms >= 0):
            raise ValueError(f"OpCost: host_ms and device_ms must be >= 0, got {self.host_ms}, {self.device_ms}")
        if self.host_unheld_ms is not None and not self.host_unheld_ms >= 0:
            raise ValueError(f"OpCost: host_unheld_ms must be >= 0 or None, got {self.host_unheld_ms}")

    def unheld_ms(self, scale: float) -> float:
        """The host time per call in the unheld basis: ``host_unheld_ms``, else ``scale`` x ``host_ms``."""
        return self.host_ms * scale if self.host_unheld_ms is None else self.host_unheld_ms


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
    """A training step, ms per step: ``step_ms`` its measured time (T), ``host_ms`` the host's time to issue it
    with the device held (H), ``device_ms`` the device's busy time (D); ``tail_host_ms`` / ``tail_device_ms`` the
    part of each in the step's last phase, the optimizer (held basis; see the module docstring; 0: no tail);
    ``host_unheld_ms`` the host's time with the device running along (``H_u``, the module docstring; None: not
    measured, the held time is the basis)."""

    step_ms: float
    host_ms: float
    device_ms: float
    tail_host_ms: float = 0.0
    tail_device_ms: float = 0.0
    host_unheld_ms: float | None = None

    def __post_init__(self):
        if not (self.step_ms > 0 and self.host_ms >= 0 and self.device_ms >= 0):
            raise ValueError(f"StepCost: step_ms must be > 0 and host_ms, device_ms >= 0, got {self.step_ms}, "
                             f"{self.host_ms}, {self.device_ms}")
        if not (0 <= self.tail_host_ms <= self.host_ms and 0 <= self.tail_device_ms <= self.device_ms):
            raise ValueError(f"StepCost: the tail's times must be >= 0 and within the step's, got host "
                             f"{self.tail_host_ms} of {self.host_ms}, device {self.tail_device_ms} of "
                             f"{self.device_ms}")
        if self.host_unheld_ms is not None and not self.host_unheld_ms >= 0:
            raise ValueError(f"StepCost: host_unheld_ms must be >= 0 or None, got {self.host_unheld_ms}")

    @property
    def issue_host_ms(self) -> float:
        """The host's time in the step, the pipeline's basis: ``min(H, H_u)`` (``H`` without ``H_u``; above ``H``
        the unheld time holds waits for the device, not host work)."""
        return self.host_ms if self.host_unheld_ms is None else min(self.host_ms, self.host_unheld_ms)

    @property
    def host_scale(self) -> float:
        """``issue_host_ms / H`` (1 without ``H_u`` or when ``H`` is 0): what converts held host times to the
        unheld basis."""
        return self.issue_host_ms / self.host_ms if self.host_ms > 0 else 1.0

    @property
    def pipeline_ms(self) -> float:
        """The model's step: ``max(D, s (H - tail_host) + tail_device, s H)``, ``s`` = :attr:`host_scale` (the
        module docstring)."""
        s = self.host_scale
        return max(self.device_ms, s * (self.host_ms - self.tail_host_ms) + self.tail_device_ms, s * self.host_ms)

    @property
    def bound(self) -> str:
        """``"host"`` when the host's part of :attr:`pipeline_ms` is the larger (the device waits on it during the
        forward and backward), else ``"device"``."""
        s = self.host_scale
        return "host" if s * (self.host_ms - self.tail_host_ms) + self.tail_device_ms > self.device_ms else "device"

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


def _unheld_ratio(call: Mapping) -> float | None:
    """``min(1, natural / host)`` of an isolated call's cost (:func:`tigon.workflows.timing.call_cost`'s dict) where
    it is host-bound (kernels shorter than its host time) and did not wait for the device; else None."""
    host, nat = call.get("host_ms"), call.get("natural_ms")
    if not host or nat is None or call.get("waited") or call.get("device_ms", 0.0) >= host:
        return None
    return min(1.0, nat / host)


def call_costs(original: Mapping, tigon: Mapping, in_step: tuple[float, float] | None = None,
               in_step_unheld: tuple[float, float] | None = None) -> tuple[OpCost, OpCost, str]:
    """The :class:`OpCost` pair of one replaced op from what ``tigon profile`` measured, and the host basis used.

    Args:
        original, tigon: the isolated calls' costs (:func:`tigon.workflows.timing.call_cost`'s dicts: ``host_ms``,
            ``device_ms``, ``natural_ms``, ``waited``).
        in_step: (original, Tigon) host ms per call inside the step, held (:mod:`tigon.workflows.profile_attrib`).
        in_step_unheld: the same with the device running along (None: not measured).

    Returns:
        (original, tigon, basis). Device time: the isolated calls'. Host time: the in-step one where measured,
        else the isolated one. Unheld host time: ``in_step_unheld`` where measured, else the held time times the
        isolated call's own ``natural / host`` (each op's launches inflate differently behind a sleep; only for a
        host-bound call, else None: the step's scale). When either isolated call ``waited`` for the device behind
        the sleep (a sync the profile does not mark), its host times hold that wait, in the step too: the host
        change is not measurable and is taken as none (both sides the original's), basis ``"waited"``.
    """
    if original.get("waited") or tigon.get("waited"):
        h = in_step[0] if in_step is not None else original["host_ms"]
        hu = in_step_unheld[0] if in_step_unheld is not None else None
        return (OpCost(h, original["device_ms"], hu), OpCost(h, tigon["device_ms"], hu), "waited")
    out = []
    for i, call in enumerate((original, tigon)):
        host = call["host_ms"] if in_step is None else in_step[i]
        if in_step_unheld is not None:
            unheld = in_step_unheld[i]
        else:
            r = _unheld_ratio(call)
            unheld = None if r is None else host * r
        out.append(OpCost(host, call["device_ms"], unheld))
    basis = "in_step_unheld" if in_step_unheld is not None else "in_step" if in_step is not None else "isolated"
    return out[0], out[1], basis


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


def _delta(changes: list[OpChange], on: Iterable[str], parts: HostModel | None, per_call, scale: float = 1.0
           ) -> float:
    """The step's change when the kinds ``on`` are replaced: ``scale`` x ``parts``' change (its delta less the
    marginals of the kinds left out; a kind without one: its per-op change) when given and a kind is on, else the
    per-op changes ``calls x (per_call(tigon) - per_call(original))``."""
    on = set(on)
    if parts is None or not any(c.kind in on for c in changes):
        calls = calls_per_kind(changes, on)
        return sum(calls.get(c.kind, 0) * (per_call(c.tigon) - per_call(c.original)) for c in changes)
    every = calls_per_kind(changes, [c.kind for c in changes])
    out = scale * parts.delta_ms
    for c in changes:
        if c.kind not in on:
            m = parts.marginal_ms(c.kind)
            out -= every.get(c.kind, 0) * (per_call(c.tigon) - per_call(c.original)) if m is None else scale * m
    return out


def host_delta(changes: list[OpChange], on: Iterable[str], host: HostModel | None = None,
               scale: float | None = None) -> float:
    """``H' - H`` when the kinds ``on`` are replaced, ms per step: from ``host`` when given (``delta - sum of the
    marginals of the kinds left out``; 0 when none is on), else the per-op host changes (the module docstring).
    ``scale`` None: the held basis (``host_ms``); else the unheld basis (each call's :meth:`OpCost.unheld_ms` with
    this ``scale``; ``host``'s held change times ``scale``)."""
    if scale is None:
        return _delta(list(changes), on, host, lambda c: c.host_ms)
    return _delta(list(changes), on, host, lambda c: c.unheld_ms(scale), scale)


def device_delta(changes: list[OpChange], on: Iterable[str], device: HostModel | None = None) -> float:
    """``D' - D`` when the kinds ``on`` are replaced, ms per step: from whole parts' device change ``device`` (a
    :class:`HostModel` of device times) when given, else the replaced calls' kernel-time changes."""
    return _delta(list(changes), on, device, lambda c: c.device_ms)


def predict(step: StepCost, changes: Iterable[OpChange], enabled: Iterable[str] | None = None,
            host: HostModel | None = None, device: HostModel | None = None) -> StepCost:
    """The patched step when the kinds ``enabled`` (default: every change's) are replaced (see the module docstring).

    ``host``: take the host change from whole parts (:class:`HostModel`), else from the per-op host changes.
    ``device``: take ``D'`` from whole parts' device change (the same fields, device times), else from the per-op
    kernel-time changes (isolated calls measure kernels faithfully; whole parts also hold the code between them).
    Both host bases are carried: ``H'`` held (``H`` + the held changes) and, when ``step`` has ``H_u``, ``H_u'`` =
    ``H_u`` + the unheld changes, the pipeline's basis.

    Returns:
        a :class:`StepCost` of ``H'``, ``D'``, ``H_u'`` (the tail unchanged) and ``T' = T - pipeline(step) +
        pipeline(new)`` (at least 0.1% of ``T``).
    """
    changes = list(changes)
    on = [c.kind for c in changes] if enabled is None else list(enabled)
    h = step.host_ms + host_delta(changes, on, host)
    d = step.device_ms + device_delta(changes, on, device)
    hu = None
    if step.host_unheld_ms is not None:
        hu = max(0.0, step.issue_host_ms + host_delta(changes, on, host, step.host_scale))
    h = max(step.tail_host_ms, h)
    new = StepCost(step.step_ms, h, max(step.tail_device_ms, d), step.tail_host_ms, step.tail_device_ms,
                   None if hu is None else max(hu, step.host_scale * step.tail_host_ms))
    t = step.step_ms - step.pipeline_ms + new.pipeline_ms
    return dataclasses.replace(new, step_ms=max(t, 1e-3 * step.step_ms))


@dataclass
class KindAdvice:
    """The predicted effect of one patch kind.

    kind, op, keyword: as :class:`OpChange`. calls: its calls per step with every kind on. host_delta_ms,
    device_delta_ms: what its calls change in H (held basis) and D (ms per step; negative saves; the marginal
    change from whole parts where measured). host_delta_unheld_ms: its host change in the unheld basis, the one
    the prediction uses (None without the step's unheld host time). step_ms_without: the predicted
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
    host_delta_unheld_ms: float | None = None


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


def advise(step: StepCost, changes: Iterable[OpChange], host: HostModel | None = None,
           device: HostModel | None = None) -> Advice:
    """Per kind: the step predicted without it (every other kind replaced), and whether replacing it slows the
    step; and the set of kinds whose replacement gives the fastest predicted step (every subset tried, up to
    :data:`MAX_ADVICE_KINDS` kinds; greedily leaving kinds out beyond). ``host``, ``device``: as :func:`predict`
    (a kind's ``host_delta_ms`` / ``device_delta_ms`` is then its marginal change, where measured).

    Raises:
        ValueError: two changes of the same kind.
    """
    changes = list(changes)
    kinds = [c.kind for c in changes]
    if len(set(kinds)) != len(kinds):
        raise ValueError(f"advise: one change per kind, got {kinds}")
    keyword = {c.kind: c.keyword for c in changes}
    all_ms = predict(step, changes, host=host, device=device).step_ms
    calls = calls_per_kind(changes, kinds)
    out = []
    for c in changes:
        rest = [k for k in kinds if k != c.kind]
        without = predict(step, changes, rest, host, device).step_ms
        hu = None if step.host_unheld_ms is None else (host_delta(changes, kinds, host, step.host_scale)
                                                      - host_delta(changes, rest, host, step.host_scale))
        out.append(KindAdvice(c.kind, c.op, c.keyword, calls.get(c.kind, 0),
                              host_delta(changes, kinds, host) - host_delta(changes, rest, host),
                              device_delta(changes, kinds, device) - device_delta(changes, rest, device), without,
                              without < all_ms * (1 - SLOWER_THRESHOLD), patch_call([c.keyword]), hu))

    def cost(on) -> float:
        return predict(step, changes, on, host, device).step_ms

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
