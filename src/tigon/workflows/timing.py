"""Timing primitives of ``tigon bench`` and ``tigon profile``, as the device method says (METHOD.md): medians of
CUDA-event timings with the L2 cache flushed or inputs rotated, CUDA-graph replays for small launches, and the
copy-bandwidth and matmul ceilings measured in the same run.

All times are milliseconds; ``(median, p20, p80)`` triples.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels.host_wait import watching

MIN_SAMPLES = 10
"""Timed calls at least, per :func:`time_call` on CUDA. ``triton.testing.do_bench`` times ``int(rep / estimate)``
calls with ``rep`` = 100 ms: one call for anything over 50 ms (issue 29's DPO and JSD rows at Llama-3-8B's head were
single samples, their p20 = p80 = median: DPO's forward + backward 66.0 ms against 54.1 + 2.6 for its two halves),
so a slower call is timed again with ``rep`` stretched to this many calls."""


def time_call(fn: Callable[[], object], device: torch.device, grad_to_none=None, cpu_reps: int = 3,
              cuda_graph: bool = False) -> tuple[float, float, float]:
    """(median, p20, p80) in ms of ``fn()``; gradients of ``grad_to_none`` are reset between calls. On CUDA at least
    :data:`MIN_SAMPLES` timed calls (a call over 100 ms / MIN_SAMPLES is timed a second time, with more calls).

    ``cuda_graph``: time replays of a CUDA graph of ``fn`` (``triton.testing.do_bench_cudagraph``), which removes
    the host's launch and autograd overhead and leaves the kernels' own time.
    """
    if device.type == "cuda":
        import triton.testing

        if cuda_graph:
            q = triton.testing.do_bench_cudagraph(fn, rep=100, grad_to_none=grad_to_none, quantiles=[0.5, 0.2, 0.8])
        else:
            q = triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none,
                                        quantiles=[0.5, 0.2, 0.8])
            if q[0] * MIN_SAMPLES > 100:  # fewer than MIN_SAMPLES calls were timed: again, with enough
                q = triton.testing.do_bench(fn, warmup=25, rep=(MIN_SAMPLES + 0.5) * q[0], grad_to_none=grad_to_none,
                                            quantiles=[0.5, 0.2, 0.8])
        return float(q[0]), float(q[1]), float(q[2])
    fn()
    samples = []
    for _ in range(cpu_reps):
        if grad_to_none:
            for t in grad_to_none:
                t.grad = None
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return statistics.median(samples), samples[0], samples[-1]


def _warmed(fn: Callable[[], object], grad_to_none, warmup: int = 3) -> Callable[[], None]:
    """``fn`` with the gradients of ``grad_to_none`` cleared before each call, after ``warmup`` warm-up calls."""
    def call():
        for t in grad_to_none or ():
            t.grad = None
        fn()

    for _ in range(warmup):
        call()
    return call


def kernel_time(fn: Callable[[], object], grad_to_none=None, reps: int = 20) -> tuple[float, float, float]:
    """(median, p20, p80) in ms over ``reps`` calls of the GPU time of one call of ``fn()``: the durations of the
    kernels and memory operations it runs, summed (``torch.profiler``, one profile per call). For code that waits
    on the host and so cannot be captured in a CUDA graph: like a graph replay, it leaves out the host's time
    between launches (and, unlike one, the gaps between kernels: it can only flatter the code it times)."""
    from torch.profiler import ProfilerActivity, profile

    call = _warmed(fn, grad_to_none)
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        samples.append(sum(e.time_range.elapsed_us() for e in prof.events()  # ranges' device copies left out
                           if e.device_type == torch.autograd.DeviceType.CUDA
                           and not getattr(e, "is_user_annotation", False)) * 1e-3)
    q = statistics.quantiles(samples, n=5, method="inclusive")  # the 20th, 40th, 60th and 80th percentiles
    return statistics.median(samples), q[0], q[3]


KERNEL_TIME_NOTE = "kernel time (torch.profiler): waits on the host, so no CUDA graph"
BWD_NOTE = "backward alone: a fresh forward before each sample, untimed"


def time_backward(fwd: Callable[[], object], douts: list[torch.Tensor], device: torch.device, leaves,
                  fwd_bwd_ms: float) -> tuple[float, float, float]:
    """(median, p20, p80) in ms of the backward alone of ``fwd()``'s outputs with upstream gradients ``douts``.

    Every sample runs a fresh forward (untimed), so backward passes that can run only once per forward (gradients
    formed in the forward, gradients written in place) are timed like the others. On CUDA: CUDA events around the
    backward, the L2 cache flushed before it (as ``triton.testing.do_bench`` does), about 100 ms of samples.
    """
    def sample_once():
        for t in leaves:
            t.grad = None
        return differentiable_outputs(fwd())

    if device.type != "cuda":
        backward(sample_once(), douts, leaves)
        samples = []
        for _ in range(3):
            out = sample_once()
            t0 = time.perf_counter()
            backward(out, douts, leaves)
            samples.append((time.perf_counter() - t0) * 1e3)
        samples.sort()
        return statistics.median(samples), samples[0], samples[-1]
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device=device)
    n = int(min(1000, max(5, 100.0 / max(fwd_bwd_ms, 1e-3))))
    for _ in range(min(n, 10)):  # warm-up
        backward(sample_once(), douts, leaves)
    samples = []
    for _ in range(n):
        out = sample_once()
        cache.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backward(out, douts, leaves)
        end.record()
        samples.append((start, end))
        del out
    torch.cuda.synchronize(device)
    ms = sorted(s.elapsed_time(e) for s, e in samples)
    q = torch.tensor(ms).quantile(torch.tensor([0.5, 0.2, 0.8])).tolist()
    return float(q[0]), float(q[1]), float(q[2])


def _copy_ms(n: int, dtype: torch.dtype, device: torch.device) -> float:
    src = torch.randn(n, device=device, dtype=dtype)
    dst = torch.empty_like(src)
    return time_call(lambda: dst.copy_(src), device)[0]


def _matmul_ms(m: int, dtype: torch.dtype, device: torch.device) -> float:
    a = torch.randn(m, m, device=device, dtype=dtype)
    b = torch.randn(m, m, device=device, dtype=dtype)
    return time_call(lambda: a @ b, device)[0]


def measure_ceilings(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Copy bandwidth and matmul rate, measured now on ``device``.

    Returns:
        ``{"copy_gbps": GB/s (bytes read + written per second, 1e9), "matmul_tflops": TFLOP/s of a square
        matmul, "copy_bytes": bytes copied, "matmul_size": n of the n^3 matmul, "matmul_dtype": str, "note"}``.
        On CUDA: a 1 GiB bf16 device-to-device copy and a bf16 8192^3 matmul. On CPU a 32 MiB copy and a 512^3
        matmul in ``dtype`` (the CPU numbers only make the % columns defined).
    """
    cuda = device.type == "cuda"
    n = (1 << 29) if cuda else (1 << 24)
    mm_dtype = torch.bfloat16 if cuda else dtype
    copy_dtype = torch.bfloat16 if cuda else torch.float16
    copy_bytes = 2 * n * torch.finfo(copy_dtype).bits // 8
    copy = copy_bytes / (_copy_ms(n, copy_dtype, device) * 1e-3) / 1e9
    m = 8192 if cuda else 512
    ms = _matmul_ms(m, mm_dtype, device)
    if cuda:
        torch.cuda.empty_cache()
    return {"copy_gbps": copy, "matmul_tflops": 2 * m**3 / (ms * 1e-3) / 1e12, "copy_bytes": copy_bytes,
            "matmul_size": m, "matmul_dtype": str(mm_dtype).replace("torch.", ""),
            "note": "measured on CUDA" if cuda else "measured on CPU (small sizes; not a GPU ceiling)"}


def differentiable_outputs(o) -> list[torch.Tensor]:
    """The differentiable outputs of a provider call (one tensor, or several: (q, k) of the rotary op)."""
    outs = list(o) if isinstance(o, (tuple, list)) else [o]
    return [t for t in outs if isinstance(t, torch.Tensor) and t.requires_grad]


ROTATE_L2_MULTIPLE = 4


def set_bytes(inputs: dict, douts: list[torch.Tensor]) -> int:
    """Bytes of the tensors among ``inputs`` and of the upstream gradients ``douts``."""
    tensors = [t for t in inputs.values() if isinstance(t, torch.Tensor)] + list(douts)
    return sum(t.numel() * t.element_size() for t in tensors)


def rotation_sets(set_bytes: int, device: torch.device) -> int:
    """How many input sets :func:`tigon.workflows.bench.bench_one` rotates through: enough that
    ``ROTATE_L2_MULTIPLE`` x the L2 cache is touched between two uses of one set (CUDA; at most 64 sets), 1 on CPU
    or for sets that large.

    Why: a CUDA-graph replay does not flush the cache between calls, so small inputs timed over one buffer
    measure the L2 cache (METHOD: rotate among several input sets), and an op that overwrites its inputs in place
    touches half the bytes of one that writes new outputs, so only it stays in the cache.
    """
    if device.type != "cuda" or set_bytes <= 0:
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 50 * 2**20
    return int(max(1, min(64, -(-ROTATE_L2_MULTIPLE * l2 // set_bytes))))


def backward(outs: list[torch.Tensor], douts: list[torch.Tensor], inputs: list[torch.Tensor]) -> None:
    """The gradients of ``inputs`` for upstream gradients ``douts`` of ``outs`` (``torch.autograd.grad``), dropped.

    Not ``.backward()``: accumulating into ``.grad`` copies a gradient that two inputs share (``x + residual`` gives
    both the same tensor, so autograd clones it for one leaf), which inside a model flows on to the producers
    uncopied; timing that copy would charge the op with autograd's leaf bookkeeping.
    """
    torch.autograd.grad(outs, inputs, douts, allow_unused=True)


# ---------------------------------------------------------------------------------------------------------------
# the host's issue time: the device held busy by a sleep kernel, so that the host never waits for it

LAUNCH_QUEUE_DEPTH = 1024
"""About this many kernel launches can be pending on a CUDA stream; past it a launch blocks the host until the
device has run some. Code is therefore timed in parts that each launch fewer (:class:`IssueTimer`)."""
MAX_HOLD_MS = 4000.0
"""The longest sleep :func:`issue_time` queues before one part of the code (ms)."""


class DeviceHold:
    """Holds ``device`` busy while the host issues work: :meth:`hold` queues ``torch.cuda._sleep`` for about
    ``ms`` on the current stream and records a CUDA event after it. The work issued next waits behind the sleep,
    so neither a full device nor a short kernel makes the host wait, unless the code synchronises (``.item()``,
    ``nonzero``, a copy to the host, the allocator freeing cached blocks) or fills the launch queue
    (:data:`LAUNCH_QUEUE_DEPTH`); then the event has completed when the code returns (:meth:`done`).

    The sleep's clock cycles per ms are measured once per device with CUDA events. On a CPU device
    (``active`` False) nothing is held: every method is a no-op and the code's time is its wall time.
    """

    _cycles_per_ms: dict[int, float] = {}

    def __init__(self, device: torch.device):
        self.device = device
        self.active = device.type == "cuda"
        if self.active:
            index = device.index if device.index is not None else torch.cuda.current_device()
            if index not in self._cycles_per_ms:
                self._cycles_per_ms[index] = self._calibrate()
            self.cycles_per_ms = self._cycles_per_ms[index]

    def _calibrate(self) -> float:
        torch.cuda.synchronize(self.device)
        torch.cuda._sleep(1000)  # first launch: module loading
        n = 20_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(n)
        end.record()
        end.synchronize()
        return n / max(start.elapsed_time(end), 1e-3)

    def sync(self) -> None:
        """Wait until the device has run everything queued."""
        if self.active:
            torch.cuda.synchronize(self.device)

    def hold(self, ms: float):
        """Queue a sleep of about ``ms`` (none for 0) and return an event recorded after it (None on a CPU)."""
        if not self.active:
            return None
        if ms > 0:
            torch.cuda._sleep(int(ms * self.cycles_per_ms))
        return self.record()

    def record(self):
        """An event recorded now on the current stream (None on a CPU)."""
        if not self.active:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    @staticmethod
    def done(event) -> bool:
        """Whether the device has reached ``event`` (False for None)."""
        return event is not None and event.query()

    @staticmethod
    def elapsed_ms(start, end) -> float:
        """Device time between two events of :meth:`record`, ms (0 on a CPU); both must be done."""
        return 0.0 if start is None else float(start.elapsed_time(end))


@dataclass
class Segment:
    """One part of code timed by :class:`IssueTimer`: ``label``; ``host_ms`` the host's time from its start to the
    next mark (ms); ``device_ms`` the device's time from the end of the hold before it to the work issued up to
    that mark (ms; its kernels back to back when the hold outlasted the issue, 0 on a CPU); ``waited``: the hold
    had ended when the part's issue ended, so the host may have waited for the device inside it; ``natural_ms``
    (from :func:`issue_time`): the part's host time in its run without a hold, the device running along (None:
    not measured)."""

    label: str
    host_ms: float
    device_ms: float
    waited: bool = False
    natural_ms: float | None = None


class IssueTimer:
    """Times the parts of some code between marks, with the device held busy before each part
    (:class:`DeviceHold`): ``start(label)``, then ``mark(label)`` wherever a new part begins (from hooks too, e.g.
    in the autograd thread), then ``stop()``. Before each part the device is synchronised (untimed) and a sleep of
    ``holds_ms[k]`` ms (part k; the last value for later parts, 0: no hold) is queued, so that a part launching
    fewer than :data:`LAUNCH_QUEUE_DEPTH` kernels is issued without the host ever waiting: its host time is the
    wall time (``clock``, seconds) until the next mark, its device time the events' time after the hold.

    A marked host read (:func:`tigon.kernels.host_wait.host_read`; the timer watches them while registered with
    :func:`tigon.kernels.host_wait.watching`, as :func:`issue_time` does) waits for the hold whatever its length: its
    wait is left out of the part's host time, the device's time up to it is kept, and the part goes on behind a new
    hold of the same length (its queuing untimed), so a part with marked reads is timed as one without them; the
    read's own kernels (a ``nonzero``, a copy of a few bytes) are left out of the device time.
    """

    def __init__(self, hold: DeviceHold, holds_ms=(0.0,), clock: Callable[[], float] = time.perf_counter):
        self.hold, self.holds, self.clock = hold, list(holds_ms) or [0.0], clock
        self._open, self._wait, self._parts, self.segments = None, None, [], []  # _wait: (clock, event) at a read
        self._spans, self._waited_s = [], 0.0  # the open part's device spans before its marked reads; their waits
        self._caught_up = False  # a hold of the open part had ended when a marked read began

    def _hold_ms(self) -> float:
        return self.holds[min(len(self._parts), len(self.holds) - 1)]

    def _arm(self, label: str) -> None:
        self.hold.sync()
        ms = self._hold_ms()
        ev = self.hold.hold(ms)
        self._spans, self._waited_s, self._caught_up = [], 0.0, False
        self._open = (label, ev, ms > 0, self.clock())

    def _close(self) -> None:
        t = self.clock()
        label, ev, held, t0 = self._open
        waited = held and (self._caught_up or self.hold.done(ev))
        host_ms = (t - t0 - self._waited_s) * 1e3
        self._parts.append((label, host_ms, [*self._spans, (ev, self.hold.record())], waited))
        self._open = None

    def wait_started(self) -> None:
        """A marked host read begins (:mod:`tigon.kernels.host_wait`): the device work issued so far ends a span. A
        hold that had already ended here (the issue before the read caught up with the device: a full launch queue,
        a hold too short) marks the part ``waited``, as at its end: the read's new hold would hide it. Nothing on a
        CPU (``hold.active`` False): there the read is the host's own work (a CPU ``nonzero``), not a wait."""
        if self._open is not None and self.hold.active:
            t = self.clock()
            _, ev, held, _ = self._open
            self._caught_up = self._caught_up or (held and self.hold.done(ev))
            self._wait = (t, self.hold.record())

    def wait_ended(self) -> None:
        """A marked host read ended: its wait leaves the part's host time, and a new hold starts the next span."""
        if self._open is None or self._wait is None:
            return
        (t_wait, before), self._wait = self._wait, None
        label, ev, held, t0 = self._open
        self._spans.append((ev, before))
        ev = self.hold.hold(self._hold_ms())
        self._waited_s += self.clock() - t_wait
        self._open = (label, ev, held, t0)

    def start(self, label: str) -> None:
        """Begin the first part, ``label``."""
        self._parts.clear()
        self._arm(label)

    def mark(self, label: str) -> None:
        """End the current part and begin the next, ``label`` (ignored outside start/stop)."""
        if self._open is not None:
            self._close()
            self._arm(label)

    def stop(self) -> list[Segment]:
        """End the last part, wait for the device and return the parts (also kept as ``segments``).

        Raises:
            RuntimeError: no part is open (``start`` was not called, or ``stop`` was already).
        """
        if self._open is None:
            raise RuntimeError("IssueTimer.stop: no part is open; call start(label) first")
        self._close()
        self.hold.sync()
        self.segments = [Segment(label, ms, sum(self.hold.elapsed_ms(a, b) for a, b in spans), waited)
                         for label, ms, spans, waited in self._parts]
        return self.segments


@dataclass
class IssueTime:
    """What :func:`issue_time` measured. segments: per part, the median over the clean rounds (``waited``: the
    host waited for the device in every attempt; its ``host_ms`` is then its time without a hold, which includes
    that wait). host_ms / device_ms: their sums, ms. natural_ms: the parts' wall time without a hold, summed (the
    host's time including its waits for the device, but for marked host reads'). hold_ms: the longest hold used.
    rounds: clean rounds per part (at least). held: False on a CPU (host time = wall time, device 0)."""

    segments: list[Segment]
    host_ms: float
    device_ms: float
    natural_ms: float
    hold_ms: float
    rounds: int
    held: bool

    @property
    def waited(self) -> list[str]:
        """Labels of the parts where the host waited for the device despite the hold."""
        return [s.label for s in self.segments if s.waited]


def issue_once(run: Callable[[IssueTimer], None], hold: DeviceHold, holds=(0.0,),
               clock: Callable[[], float] = time.perf_counter) -> list[Segment]:
    """One run of ``run(timer)`` under an :class:`IssueTimer` with the sleeps ``holds`` (ms per part; ``(0.0,)``:
    none, the device running along), the timer watching Tigon's marked host reads; its parts (ms), the timer
    stopped if ``run`` left a part open. What :func:`issue_time` repeats."""
    timer = IssueTimer(hold, holds, clock)
    with watching(timer):
        run(timer)
    return timer.stop() if timer._open is not None else timer.segments


def issue_time(run: Callable[[IssueTimer], None], hold: DeviceHold, *, rounds: int = 3, retries: int = 2,
               margin: float = 2.0, floor_ms: float = 1.0, grow: float = 4.0,
               clock: Callable[[], float] = time.perf_counter, max_hold_ms: float = MAX_HOLD_MS) -> IssueTime:
    """The host's issue time and the device's time of code split into parts by an :class:`IssueTimer`.

    ``run(timer)`` runs the code once, calling ``timer.start`` / ``mark`` / ``stop`` itself (it must split it
    into the same parts every time). Method: one run without a hold gives each part's wall time; then runs with
    each part behind a sleep of ``margin`` x that time + ``floor_ms`` (the calibration); a part whose sleep had
    ended when its issue ended gets ``grow`` x the sleep (at most ``retries`` times, at most ``max_hold_ms``) and
    is timed again, in up to ``retries`` more runs; a part that still catches up waits for the device whatever the
    hold (a sync inside it, or more pending launches than the queue holds) and is reported ``waited``; a marked host
    read's wait is left out (:class:`IssueTimer`). On a CPU (``hold.active`` False) the ``rounds`` runs' wall times
    are the host time and the device time is 0.

    Returns:
        an :class:`IssueTime` (ms).

    Raises:
        RuntimeError: ``run`` split the code into a different number of parts than in its first run.
    """
    def once(holds) -> list[Segment]:
        return issue_once(run, hold, holds, clock)

    natural = once([0.0])
    n = len(natural)
    if not hold.active:  # nothing to hold: every run is a sample of the wall time
        samples, holds, runs = [[s] for s in natural], [0.0], rounds - 1
    else:
        samples = [[] for _ in range(n)]
        holds, runs = [min(max_hold_ms, margin * s.host_ms + floor_ms) for s in natural], rounds + retries
    last, grown = list(natural), [0] * n
    for _ in range(runs):
        segs = once(holds)
        if len(segs) != n:
            raise RuntimeError(f"issue_time: the code ran in {len(segs)} parts, first in {n}")
        for k, s in enumerate(segs):
            last[k] = s
            if not s.waited:
                samples[k].append(s)
            elif grown[k] < retries:
                holds[k], grown[k] = min(max_hold_ms, holds[k] * grow), grown[k] + 1
        if all(len(x) >= rounds for x in samples):
            break
    out = []
    for k in range(n):
        if samples[k]:
            out.append(Segment(natural[k].label, statistics.median(s.host_ms for s in samples[k]),
                               statistics.median(s.device_ms for s in samples[k]),
                               natural_ms=natural[k].host_ms if hold.active else None))
        else:  # the host waits for the device here whatever the hold: its own wall time, wait included
            out.append(Segment(natural[k].label, natural[k].host_ms,
                               min(natural[k].device_ms, last[k].device_ms), waited=True,
                               natural_ms=natural[k].host_ms))
    return IssueTime(out, sum(s.host_ms for s in out), sum(s.device_ms for s in out),
                     sum(s.host_ms for s in natural), max(holds), min(len(x) for x in samples), hold.active)


def call_cost(fn: Callable[[], object], device: torch.device, grad_to_none=None, calls: int = 4,
              groups: int = 5, rounds: int = 2) -> dict:
    """The host's time to issue one call of ``fn()`` and the device's time to run it, ms: what the call costs
    each side of a training step that overlaps them (``tigon profile``'s prediction).

    Method (:func:`issue_time`): ``groups`` groups of ``calls`` back-to-back calls, each group issued behind a
    sleep kernel that outlasts it, timed with ``time.perf_counter`` until the last call returns (host) and with
    CUDA events from the sleep's end to the last call's work (device: its kernels back to back, launch gaps
    included); medians over the groups of ``rounds`` rounds, divided by ``calls``. Gradients of ``grad_to_none``
    are reset before every call; three warm-up calls first. On a CPU: the call's wall time as host time (one
    warm-up call, then ``rounds`` calls), 0 device time.

    Returns:
        ``{"host_ms", "device_ms", "natural_ms" (the call's time without the sleep, the host's waits
        included), "waited" (the host waited for the device behind the sleep too: the call synchronises or
        launches more than the queue holds), "hold_ms"}``. Exceptions of ``fn`` propagate.
    """
    cuda = device.type == "cuda"
    call = _warmed(fn, grad_to_none, 3 if cuda else 1)
    calls, groups = (calls, groups) if cuda else (1, 1)

    def run(timer: IssueTimer) -> None:
        for g in range(groups):
            (timer.mark if g else timer.start)(f"group {g}")
            for _ in range(calls):
                call()
        timer.stop()

    t = issue_time(run, DeviceHold(device), rounds=rounds)
    clean = [s for s in t.segments if not s.waited] or t.segments
    return {"host_ms": statistics.median(s.host_ms for s in clean) / calls,
            "device_ms": statistics.median(s.device_ms for s in clean) / calls,
            "natural_ms": t.natural_ms / (calls * groups), "waited": bool(t.waited), "hold_ms": t.hold_ms}


def sync_points(fn: Callable[[], object], device: torch.device) -> list[str]:
    """Where ``fn()`` makes the host wait for the device, as ``torch.cuda.set_sync_debug_mode("warn")`` reports
    it: ``"file:line: message"`` per distinct warning ([] on a CPU, or when nothing synchronises). Runs ``fn``
    once. Waits the debug mode cannot see (the allocator freeing cached blocks, a full launch queue) are left to
    :func:`issue_time`'s ``waited``."""
    import os
    import warnings

    if device.type != "cuda":
        fn()
        return []
    before = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(before)
    found = (f"{os.path.basename(w.filename)}:{w.lineno}: {str(w.message).splitlines()[0][:120]}" for w in caught
             if "synchroniz" in str(w.message))
    return list(dict.fromkeys(found))


def peak_extra_bytes(fwd_bwd: Callable[[], object], leaves, device: torch.device) -> int | None:
    """Bytes one ``fwd_bwd()`` allocates above what is allocated before it (its peak, gradients of ``leaves``
    cleared first); None off CUDA."""
    if device.type != "cuda":
        return None
    for t in leaves:
        t.grad = None
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fwd_bwd()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - base
