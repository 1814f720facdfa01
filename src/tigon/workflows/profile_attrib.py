"""The host's time in each replaced module inside the training step (``tigon profile``'s in-step host costs).

:func:`tigon.workflows.timing.call_cost` times one op alone (its own forward, its own ``torch.autograd.grad``),
which misses what the op costs inside a step: there the original ops' backward runs within one autograd pass,
and a patched module adds the integration layer's own Python. This module measures it in the step itself:

* **Frames.** Each module the patch replaces (the patch report's targets: norms, MLPs, the attention modules of
  the rotary patch, decoder layers of the fused add + norm, the causal LM of the LM head + loss) is a *frame* of
  its patch kind; the backbone is a frame of no kind, so that the causal LM's frame holds only its LM head and
  loss. Host time (``clock``, ``time.perf_counter``) goes to the innermost open frame (its *self* time), per kind
  and direction (forward, backward), in :class:`FrameClock`.
* **Forward**: a forward pre-hook opens the module's frame, a forward hook closes it.
* **Backward**: the forward hooks pass the module's inputs and outputs (those that require grad, keyword
  arguments included) through an identity autograd node (:class:`_Mark`, no kernel); the output's node runs
  first in the module's backward (it opens the frame), the inputs' nodes run last (the last one closes it). A
  module without differentiable inputs (the causal LM, the backbone: token ids) stays open until the step's
  backward ends, nested frames pausing it.
* **The hooks' own time** is left out: every hook reads the clock on entry and exit and charges neither. What
  remains (the hooked ``Module.__call__`` path, the autograd engine running the identity nodes) is measured on an
  empty module (:func:`hook_overhead`) and subtracted: per frame of the kind and per frame opened directly inside
  one (:meth:`FrameClock.corrected`).
* **Marked host reads** (:mod:`tigon.kernels.host_wait`: the fused LM-head losses' ignored-row count) wait for
  the sleep kernel below whatever its length: their wait goes to no frame.
* **The steps** run as :func:`tigon.workflows.profile_events.step_issue` runs them: split into parts
  (:class:`~tigon.workflows.profile_events.StepParts`), each behind a sleep kernel
  (:func:`tigon.workflows.timing.issue_time`), so the host never waits for the device inside a frame; the time
  the parts' marks take (a sync, the sleep's launch) is left out like the hooks'. Only steps with the device held
  are counted (on a CPU every step: nothing to wait for).

All times are ms per step unless named otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import torch

from ..kernels.host_wait import watching

FORWARD, BACKWARD = "forward", "backward"


@dataclass
class KindHost:
    """In-step host time of one patch kind, ms per step: ``forward_ms`` and ``backward_ms`` (self time of its
    frames, the hooks' overhead subtracted), ``calls`` (its modules' forward calls per step)."""

    forward_ms: float = 0.0
    backward_ms: float = 0.0
    calls: int = 0

    @property
    def per_call_ms(self) -> float:
        """Forward + backward host time per call, ms (0 without calls)."""
        return (self.forward_ms + self.backward_ms) / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class HookOverhead:
    """What a hooked module costs beyond its own code, ms per call and direction (:func:`hook_overhead`):
    ``own_*`` charged to the module's frame, ``parent_*`` to the frame that calls it."""

    own_forward_ms: float = 0.0
    own_backward_ms: float = 0.0
    parent_forward_ms: float = 0.0
    parent_backward_ms: float = 0.0


class FrameClock:
    """Self time of nested frames, per (kind, direction); pure bookkeeping on ``clock`` (seconds).

    Every entry point (:meth:`open`, :meth:`close`, :meth:`excluded`) charges the time since the last event to
    the innermost open frame, then restarts the count when it returns, so its own time is charged to nobody.
    A frame is ``(token, kind, direction)``; ``kind`` None: a frame that only pauses its parent (the backbone).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.stack: list[tuple[object, str | None, str]] = []
        self.seconds: dict[tuple[str, str], float] = {}
        self.frames: dict[tuple[str, str], int] = {}
        self.children: dict[tuple[str, str], int] = {}
        self.calls: dict[str, int] = {}
        self._last = clock()

    def _charge(self) -> None:
        now = self.clock()
        if self.stack:
            _, kind, d = self.stack[-1]
            if kind is not None:
                self.seconds[(kind, d)] = self.seconds.get((kind, d), 0.0) + now - self._last
        self._last = now

    def _restart(self) -> None:
        self._last = self.clock()

    def open(self, token: object, kind: str | None, direction: str, counted: bool = True) -> None:
        """Open a frame: ``counted`` forward frames count as calls of ``kind``."""
        self._charge()
        if self.stack and self.stack[-1][1] is not None:
            parent = self.stack[-1][1:]
            self.children[parent] = self.children.get(parent, 0) + 1
        self.stack.append((token, kind, direction))
        if kind is not None:
            self.frames[(kind, direction)] = self.frames.get((kind, direction), 0) + 1
            if counted and direction == FORWARD:
                self.calls[kind] = self.calls.get(kind, 0) + 1
        self._restart()

    def close(self, token: object, direction: str) -> None:
        """Close the frame ``(token, direction)`` and any left open above it (ignored when it is not open)."""
        self._charge()
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] is token and self.stack[i][2] == direction:
                del self.stack[i:]
                break
        self._restart()

    @contextlib.contextmanager
    def excluded(self):
        """Time inside the block is charged to nobody (an IssueTimer mark: a sync and the next sleep)."""
        self._charge()
        try:
            yield
        finally:
            self._restart()

    def wait_started(self) -> None:
        """A marked host read begins (:mod:`tigon.kernels.host_wait`): the time so far goes to the open frame."""
        self._charge()

    def wait_ended(self) -> None:
        """The read ended: its wait goes to no frame (a sync waits for the hold, not for the host's work)."""
        self._restart()

    def reset(self) -> None:
        """Close every frame (the end of a step); totals are kept."""
        self._charge()
        self.stack.clear()

    def corrected(self, overhead: HookOverhead, steps: int = 1) -> dict[str, KindHost]:
        """Per kind, ms per step over ``steps`` steps: the self time less ``overhead`` per frame of the kind and
        per frame opened directly inside one (never below 0)."""
        out = {}
        for kind in dict.fromkeys(k for k, _ in [*self.seconds, *self.frames]):
            ms = {}
            for d, own, parent in ((FORWARD, overhead.own_forward_ms, overhead.parent_forward_ms),
                                   (BACKWARD, overhead.own_backward_ms, overhead.parent_backward_ms)):
                raw = self.seconds.get((kind, d), 0.0) * 1e3 - self.frames.get((kind, d), 0) * own \
                    - self.children.get((kind, d), 0) * parent
                ms[d] = max(0.0, raw) / steps
            out[kind] = KindHost(ms[FORWARD], ms[BACKWARD], round(self.calls.get(kind, 0) / steps))
        return out


class _Mark(torch.autograd.Function):
    """Identity whose backward calls ``fn()`` first: the autograd engine runs it when the tensor's gradient is
    complete. Returns a detached alias (no kernel; not an autograd view, so in-place use of it stays legal)."""

    @staticmethod
    def forward(ctx, x, fn):
        ctx.fn = fn
        return x.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.fn()
        return grad, None


def _map_tensors(obj, fn):
    """``obj`` with ``fn`` applied to every tensor that requires grad in it (tensors, tuples, lists, dicts and
    ``ModelOutput``s, the latter updated in place); returns (new obj, how many were mapped)."""
    count = 0

    def go(o):
        nonlocal count
        if isinstance(o, torch.Tensor):
            if o.requires_grad:
                count += 1
                return fn(o)
            return o
        if isinstance(o, tuple) and not hasattr(o, "_fields"):
            return tuple(go(v) for v in o)
        if isinstance(o, list):
            return [go(v) for v in o]
        if isinstance(o, dict):
            for k in list(o.keys()):
                v = go(o[k])
                if v is not o[k]:
                    o[k] = v
            return o
        return o

    return go(obj), count


class _Call:
    """One forward call of a hooked module: its backward frame opens on its first output's gradient and closes
    when its last differentiable input's gradient is complete (``pending`` inputs left)."""

    __slots__ = ("opened", "pending")

    def __init__(self):
        self.opened, self.pending = False, 0


class HostAttribution:
    """Hooks that measure the host's self time of ``targets`` inside training steps (the module docstring).

    targets: module -> (kind, counted); ``counted`` False for a module whose time belongs to a kind that is not
    its own (the post-attention norm that the fused decoder layer bypasses once patched: part of that kind's
    original cost, not a call of it). pauses: modules whose frames have no kind (the backbone). ``recording``:
    hooks act only while True. ``remove()`` undoes the hooks.
    """

    def __init__(self, targets: Mapping[torch.nn.Module, tuple[str, bool]], pauses: Iterable[torch.nn.Module] = (),
                 clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.frames = FrameClock(clock)
        self.recording = False
        self.done: list[FrameClock] = []
        self._handles = []
        for m in pauses:
            if m not in targets:
                self._hook(m, None, False)
        for m, (kind, counted) in targets.items():
            self._hook(m, kind, counted)

    def _hook(self, m: torch.nn.Module, kind: str | None, counted: bool) -> None:
        open_calls = []

        def pre(module, args, kwargs):
            if not self.recording:
                return None
            fc = self.frames
            with fc.excluded():
                call = _Call()
                open_calls.append(call)
                (args, kwargs), call.pending = _map_tensors((args, kwargs), lambda t: _Mark.apply(
                    t, lambda: self._input_done(call)))
            fc.open(call, kind, FORWARD, counted)
            return args, kwargs

        def post(module, args, kwargs, output):
            if not self.recording or not open_calls:
                return None
            call, fc = open_calls.pop(), self.frames
            fc.close(call, FORWARD)
            with fc.excluded():
                output, _ = _map_tensors(output, lambda t: _Mark.apply(t, lambda: self._output_grad(call, kind)))
            return output

        pre.tigon_observer = post.tigon_observer = True  # (sharded_head.OBSERVER: the fused loss may skip the head)
        self._handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
        self._handles.append(m.register_forward_hook(post, with_kwargs=True, always_call=True))

    def _output_grad(self, call: _Call, kind: str | None) -> None:
        if not call.opened:
            call.opened = True
            self.frames.open(call, kind, BACKWARD)

    def _input_done(self, call: _Call) -> None:
        call.pending -= 1
        if call.pending <= 0 and call.opened:
            self.frames.close(call, BACKWARD)

    def wait_started(self) -> None:
        """As :meth:`FrameClock.wait_started` (the watcher of :mod:`tigon.kernels.host_wait`)."""
        self.frames.wait_started()

    def wait_ended(self) -> None:
        """As :meth:`FrameClock.wait_ended`."""
        self.frames.wait_ended()

    def end_step(self) -> None:
        """Close the frames left open (those without differentiable inputs) and keep the step's times apart."""
        self.frames.reset()
        self.done.append(self.frames)
        self.frames = FrameClock(self.clock)

    @property
    def steps(self) -> int:
        """Steps ended (:meth:`end_step`)."""
        return len(self.done)

    def result(self, overhead: HookOverhead) -> dict[str, KindHost]:
        """Per kind: the median over the steps of its forward and backward ms and calls per step, the hooks'
        ``overhead`` subtracted (:meth:`FrameClock.corrected`)."""
        steps = [f.corrected(overhead) for f in self.done]
        kinds = dict.fromkeys(k for s in steps for k in s)
        return {k: KindHost(statistics.median(s.get(k, KindHost()).forward_ms for s in steps),
                            statistics.median(s.get(k, KindHost()).backward_ms for s in steps),
                            round(statistics.median(s.get(k, KindHost()).calls for s in steps)))
                for k in kinds}

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class _Empty(torch.nn.Module):
    def forward(self, x):
        return x


class _Chain(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.inner = torch.nn.ModuleList(_Empty() for _ in range(n))

    def forward(self, x):
        for m in self.inner:
            x = m(x)
        return x


def hook_overhead(device: torch.device, calls: int = 64, reps: int = 5) -> HookOverhead:
    """The hooks' own cost per hooked module call, ms (the median of ``reps`` runs): a chain of ``calls`` empty
    modules (forward returns its input) inside an outer frame, forward and backward (``torch.autograd.grad``).
    ``own``: an empty module's measured self time; ``parent``: the outer frame's self time per inner call with
    the inner modules hooked, less the same with them unhooked (the plain ``Module.__call__`` a model pays too)."""
    x = torch.ones(8, device=device, requires_grad=True)
    chain = _Chain(calls)

    def measure(hook_inner: bool) -> dict[str, KindHost]:
        targets = {chain: ("outer", True), **({m: ("inner", True) for m in chain.inner} if hook_inner else {})}
        samples = []
        for _ in range(reps + 1):
            attr = HostAttribution(targets)
            attr.recording = True
            try:
                out = chain(x)
                torch.autograd.grad(out.sum(), [x])
                attr.end_step()
            finally:
                attr.remove()
            samples.append(attr.result(HookOverhead()))
        return {k: KindHost(statistics.median(s[k].forward_ms for s in samples[1:]),
                            statistics.median(s[k].backward_ms for s in samples[1:]), calls)
                for k in samples[-1]}

    hooked, plain = measure(True), measure(False)
    inner = hooked.get("inner", KindHost())
    return HookOverhead(inner.forward_ms / calls, inner.backward_ms / calls,
                        max(0.0, hooked["outer"].forward_ms - plain["outer"].forward_ms) / calls,
                        max(0.0, hooked["outer"].backward_ms - plain["outer"].backward_ms) / calls)


@dataclass
class InStepHost:
    """What :func:`in_step_host` measured: ``kinds`` (kind -> :class:`KindHost`, ms per step, issued behind a sleep),
    ``overhead`` (the :class:`HookOverhead` subtracted), ``steps`` (steps counted), ``unheld`` (below)."""

    kinds: dict[str, KindHost] = field(default_factory=dict)
    overhead: HookOverhead = field(default_factory=HookOverhead)
    steps: int = 0
    unheld: dict[str, KindHost] = field(default_factory=dict)
    """The same per kind from steps issued with the device running along (parts synchronised, no sleep), as in a
    host-bound step: the basis of ``tigon profile``'s pipeline (:mod:`tigon.workflows.predict`); {} on a CPU or
    when not measured."""


def resolve_targets(model: torch.nn.Module, targets: Mapping[str, str], bypassed: Mapping[str, str] = {},
                    patched: bool = False) -> dict[torch.nn.Module, tuple[str, bool]]:
    """Module -> (kind, counted) of ``model`` from the patch report's ``targets`` (path -> kind; a path in
    parentheses, ``"(LlamaForCausalLM)"``, is the model itself) and ``bypassed`` (path -> the kind that bypasses
    it). In the original model a bypassed module is timed as part of the kind that bypasses it, not counted as a
    call of its own; in the ``patched`` one it is not hooked (it is not called, and a hook on it makes the patched
    decoder layer fall back to the original forward: :mod:`tigon.integrations.child_calls`). Paths missing from
    ``model`` are skipped."""
    out = {}
    for path, kind in targets.items():
        counted = path not in bypassed
        if patched and not counted:
            continue
        try:
            m = model if path.startswith("(") else model.get_submodule(path)
        except AttributeError:
            continue
        out[m] = (bypassed.get(path, kind), counted)
    return out


def in_step_host(model: torch.nn.Module, batches: list[torch.Tensor], targets: Mapping[str, str], *,
                 device: torch.device, lr: float, bypassed: Mapping[str, str] = {}, patched: bool = False,
                 warmup: int = 1, rounds: int = 3, unheld_rounds: int = 3) -> InStepHost:
    """The host's self time per patch kind inside training steps of ``model`` (the module docstring), forward
    and backward apart, ms per step.

    Args:
        targets / bypassed / patched: as :func:`resolve_targets` (``patched``: ``model`` is patched by
            :func:`tigon.patch`).
        batches: token ids, used in turn; warmup: untimed steps first; rounds: as
            :func:`tigon.workflows.timing.issue_time` (1 on a CPU is enough: nothing waits).
        unheld_rounds: then this many steps with the device running along (each part after a sync, no sleep:
            ``InStepHost.unheld``, the median; about ``unheld_rounds`` steps' time more; none on a CPU).
    """
    from .profile_events import StepParts, make_step
    from .timing import DeviceHold, issue_once, issue_time

    step, hold = make_step(model, lr), DeviceHold(device)
    from ._train import param_dtype, step_inputs

    data = [step_inputs(b, device, param_dtype(model)) for b in batches]
    for i in range(warmup):
        step(data[i % len(data)])
    overhead = hook_overhead(device)
    backbone = model.get_decoder() if hasattr(model, "get_decoder") else None
    pauses = [m for m in [backbone] if isinstance(m, torch.nn.Module) and m is not model]
    attr = HostAttribution(resolve_targets(model, targets, bypassed, patched), pauses)
    parts = StepParts(model)
    turn = [0]

    class _Timer:
        """The run's IssueTimer, its marks charged to no frame; the optimizer's mark (make_step's last part)
        ends the model's frames."""

        def __init__(self, timer):
            self.timer = timer

        def start(self, label):
            self.timer.start(label)

        def mark(self, label):
            if label == "optimizer":
                attr.frames.reset()
            with attr.frames.excluded():
                self.timer.mark(label)

        def stop(self):
            return self.timer.stop()

    def run(timer, record: bool = False) -> None:
        attr.recording = record or not hold.active or any(h > 0 for h in timer.holds)
        parts.timer = proxy = _Timer(timer)
        try:
            step(data[turn[0] % len(data)], proxy)
        finally:
            parts.timer = None
            if attr.recording:
                attr.end_step()
            attr.recording = False
            turn[0] += 1

    unheld: dict[str, KindHost] = {}
    try:
        with watching(attr) if hold.active else contextlib.nullcontext():  # (a CPU's reads are host work)
            issue_time(run, hold, rounds=rounds)
            held, steps = attr.result(overhead), attr.steps
            if hold.active:  # then steps with the device running along: each part after a sync, no sleep
                attr.done = []
                for _ in range(unheld_rounds):
                    issue_once(lambda timer: run(timer, record=True), hold)
                unheld = attr.result(overhead) if attr.steps else {}
    finally:
        attr.remove()
        parts.remove()
    return InStepHost(held, overhead, steps, unheld)


def host_costs(original: InStepHost | None, tigon: InStepHost | None,
               unheld: bool = False) -> dict[str, tuple[float, float]]:
    """kind -> (original, Tigon) in-step host time per forward + backward call, ms, for the kinds measured with
    calls in both steps ({} when either is missing: the prediction then uses the isolated calls); ``unheld``: from
    the steps issued with the device running along (``InStepHost.unheld``)."""
    if original is None or tigon is None:
        return {}
    a, b = (original.unheld, tigon.unheld) if unheld else (original.kinds, tigon.kinds)
    return {k: (o.per_call_ms, b[k].per_call_ms) for k, o in a.items() if o.calls and k in b and b[k].calls}


def kind_report(kind: str, original: InStepHost | None, tigon: InStepHost | None) -> dict:
    """The JSON of one kind's in-step host time: ``{"original"|"tigon": {"forward_ms", "backward_ms" (per step),
    "calls" (per step), "per_call_ms" (forward + backward), "unheld_per_call_ms" (the same with the device
    running along; None: not measured)} or None}``."""
    def side(m: InStepHost | None):
        k = m.kinds.get(kind) if m is not None else None
        if k is None:
            return None
        u = m.unheld.get(kind)
        return {**dataclasses.asdict(k), "per_call_ms": k.per_call_ms,
                "unheld_per_call_ms": u.per_call_ms if u is not None and u.calls else None}

    return {"original": side(original), "tigon": side(tigon)}


def overhead_report(m: InStepHost) -> dict:
    """The JSON of a step's in-step measurement apart from its kinds: ``{"overhead": the hooks' own ms per call
    (:class:`HookOverhead`), "steps"}``."""
    return {"overhead": dataclasses.asdict(m.overhead), "steps": m.steps}
