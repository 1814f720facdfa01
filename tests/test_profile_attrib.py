"""tigon profile's in-step host time per replaced module (tigon.workflows.profile_attrib), on a fake clock: the
modules advance it by known amounts in their forward and backward, so each kind's self time is exact."""

import pytest
import torch

from tigon.workflows import profile_attrib as PA


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Tick(torch.autograd.Function):
    """Identity that advances ``clock`` by ``fwd`` s in its forward and ``bwd`` s in its backward."""

    @staticmethod
    def forward(ctx, x, clock, fwd, bwd):
        clock.t += fwd
        ctx.clock, ctx.bwd = clock, bwd
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        ctx.clock.t += ctx.bwd
        return g, None, None, None


class Leaf(torch.nn.Module):
    def __init__(self, clock, fwd, bwd):
        super().__init__()
        self.clock, self.fwd, self.bwd = clock, fwd, bwd

    def forward(self, x):
        return Tick.apply(x, self.clock, self.fwd, self.bwd)


class Block(torch.nn.Module):
    """Its own code costs 4 s forward, 40 s backward; norm 1 / 10, mlp 2 / 20 (called by keyword)."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.norm, self.mlp = Leaf(clock, 1.0, 10.0), Leaf(clock, 2.0, 20.0)

    def forward(self, x):
        x = Tick.apply(x, self.clock, 4.0, 40.0)
        h = x + self.norm(x)
        out = h + self.mlp(x=h)
        out.add_(0.0)  # in-place on the block's output stays legal with its identity node
        return out


class Net(torch.nn.Module):
    def __init__(self, clock):
        super().__init__()
        self.layers = torch.nn.ModuleList([Block(clock), Block(clock)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _step(net, attr, excluded_s=0.0):
    x = torch.ones(3, requires_grad=True)
    attr.recording = True
    out = net(x)
    with attr.frames.excluded():  # e.g. an IssueTimer mark: charged to nobody
        net.layers[0].clock.t += excluded_s
    out.sum().backward()
    attr.end_step()


def test_self_time_per_kind_forward_and_backward():
    clock = Clock()
    net = Net(clock)
    targets = PA.resolve_targets(net, {"layers.0": "layer", "layers.1": "layer", "layers.0.norm": "norm",
                                       "layers.1.norm": "norm", "layers.0.mlp": "mlp", "layers.1.mlp": "mlp"})
    attr = PA.HostAttribution(targets, clock=clock)
    try:
        for _ in range(2):
            _step(net, attr, excluded_s=1000.0)
    finally:
        attr.remove()
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in net.modules())
    got = attr.result(PA.HookOverhead())
    assert attr.steps == 2
    assert got["layer"] == PA.KindHost(8e3, 80e3, 2)  # 2 blocks' own code, ms; their children apart
    assert got["norm"] == PA.KindHost(2e3, 20e3, 2)
    assert got["mlp"] == PA.KindHost(4e3, 40e3, 2)  # called by keyword: its input's node still closes its frame
    assert got["mlp"].per_call_ms == pytest.approx(22e3)
    # the hooks' own cost: per frame of the kind, and per frame opened directly inside one of its frames
    over = PA.HookOverhead(own_forward_ms=1.0, own_backward_ms=2.0, parent_forward_ms=10.0, parent_backward_ms=20.0)
    corr = attr.result(over)
    assert corr["layer"].forward_ms == pytest.approx(8e3 - 2 * 1.0 - 4 * 10.0)
    assert corr["layer"].backward_ms == pytest.approx(80e3 - 2 * 2.0 - 4 * 20.0)
    assert corr["norm"].backward_ms == pytest.approx(20e3 - 2 * 2.0)


def test_a_bypassed_module_counts_for_the_kind_that_bypasses_it():
    """The fused decoder layer no longer calls its post-attention norm: in the original step that norm's time is
    part of the layer's kind, not a call of the norm's."""
    clock = Clock()
    net = Net(clock)
    paths = {"layers.0": "layer", "layers.1": "layer", "layers.0.norm": "norm", "layers.1.norm": "norm"}
    targets = PA.resolve_targets(net, paths, bypassed={"layers.1.norm": "layer"})
    assert targets[net.layers[1].norm] == ("layer", False) and targets[net.layers[0].norm] == ("norm", True)
    # patched, the bypassed module is not called, and a hook on it would make the patched layer fall back
    assert net.layers[1].norm not in PA.resolve_targets(net, paths, {"layers.1.norm": "layer"}, patched=True)
    attr = PA.HostAttribution(targets, clock=clock)
    try:
        _step(net, attr)
    finally:
        attr.remove()
    got = attr.result(PA.HookOverhead())
    # not a kind: the mlp's time is its caller's (the block)
    assert got["layer"] == PA.KindHost(2 * 4e3 + 2 * 2e3 + 1e3, 2 * 40e3 + 2 * 20e3 + 10e3, 2)
    assert got["norm"] == PA.KindHost(1e3, 10e3, 1)


def test_the_model_itself_and_pauses():
    """A path in parentheses is the model itself; a paused module (the backbone) holds its time for no kind, and
    frames without differentiable inputs stay open until the step ends."""
    clock = Clock()
    net = Net(clock)
    targets = PA.resolve_targets(net, {"(Net)": "head", "layers.1.mlp": "mlp", "missing.path": "mlp"})
    assert targets == {net: ("head", True), net.layers[1].mlp: ("mlp", True)}
    attr = PA.HostAttribution(targets, pauses=[net.layers[0]], clock=clock)
    try:
        _step(net, attr)
    finally:
        attr.remove()
    got = attr.result(PA.HookOverhead())
    assert got["mlp"] == PA.KindHost(2e3, 20e3, 1)
    assert got["head"] == PA.KindHost(4e3 + 1e3, 40e3 + 10e3, 1)  # layer 1 less its mlp; layer 0 paused


class Reader(torch.nn.Module):
    """Costs 1 s forward, then reads a device value (a marked host read: 500 s of waiting), then 2 s more."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def forward(self, x):
        from tigon.kernels.host_wait import host_read

        self.clock.t += 1.0
        host_read(lambda: setattr(self.clock, "t", self.clock.t + 500.0))
        self.clock.t += 2.0
        return x * 1.0


def test_a_marked_host_read_is_charged_to_no_frame():
    """A sync inside a replaced module waits for the device hold, not for the host's work (the fused cross-entropy's
    ignored-row count once measured 296 ms of 'host time' in an 8B step)."""
    from tigon.kernels.host_wait import watching

    clock = Clock()
    net = torch.nn.Sequential(Reader(clock))
    attr = PA.HostAttribution(PA.resolve_targets(net, {"0": "head"}), clock=clock)
    try:
        with watching(attr):
            x = torch.ones(3, requires_grad=True)
            attr.recording = True
            net(x).sum().backward()
            attr.end_step()
    finally:
        attr.remove()
    assert attr.result(PA.HookOverhead())["head"] == PA.KindHost(3e3, 0.0, 1)


def test_host_costs_and_reports():
    orig = PA.InStepHost({"mlp": PA.KindHost(2.0, 4.0, 3), "norm": PA.KindHost(1.0, 1.0, 2)})
    tigon = PA.InStepHost({"mlp": PA.KindHost(3.0, 3.0, 3), "norm": PA.KindHost(0.0, 0.0, 0)}, steps=3)
    assert PA.host_costs(orig, tigon) == {"mlp": (2.0, 2.0)}  # no calls in the patched step: not measured
    assert PA.host_costs(orig, None) == {}
    rep = PA.kind_report("mlp", orig, None)
    assert rep == {"original": {"forward_ms": 2.0, "backward_ms": 4.0, "calls": 3, "per_call_ms": 2.0,
                                "unheld_per_call_ms": None}, "tigon": None}
    assert PA.overhead_report(tigon)["steps"] == 3
    # the unheld steps' times (the device running along) are kept apart and reported beside the held ones
    orig.unheld, tigon.unheld = {"mlp": PA.KindHost(1.0, 2.0, 3)}, {"mlp": PA.KindHost(1.5, 1.5, 3)}
    assert PA.host_costs(orig, tigon, unheld=True) == {"mlp": (1.0, 1.0)}
    assert PA.kind_report("mlp", orig, tigon)["original"]["unheld_per_call_ms"] == 1.0



def test_hook_overhead_is_measured():
    over = PA.hook_overhead(torch.device("cpu"), calls=16, reps=2)
    assert over.own_forward_ms >= 0 and over.own_backward_ms >= 0
    assert over.parent_forward_ms >= 0 and over.parent_backward_ms >= 0
    assert over.own_forward_ms < 1.0  # ms per call: far below any module's


def test_in_step_host_on_a_model():
    """The patch report's targets of a tiny Llama, timed in its training step; the hooks are gone afterwards."""
    from tigon.workflows.e2e_models import build_model, hf_config, random_batches

    hfc, _ = hf_config("tiny", 1)
    model = build_model(hfc, torch.float32, torch.device("cpu"), 0)
    targets = {"(LlamaForCausalLM)": "lm_head_loss", "model.layers.0": "fused_add_rms_norm",
               "model.layers.0.self_attn": "rope", "model.layers.0.mlp": "mlp",
               "model.layers.0.input_layernorm": "rms_norm", "model.layers.0.post_attention_layernorm": "rms_norm",
               "model.norm": "rms_norm"}
    got = PA.in_step_host(model, random_batches(int(hfc.vocab_size), 1, 1, 8, 0), targets,
                          device=torch.device("cpu"), lr=1e-3,
                          bypassed={"model.layers.0.post_attention_layernorm": "fused_add_rms_norm"}, rounds=1)
    assert got.steps == 1 and got.unheld == {}  # nothing held on a CPU: no unheld steps apart
    assert {k: v.calls for k, v in got.kinds.items()} == {"lm_head_loss": 1, "fused_add_rms_norm": 1, "rope": 1,
                                                         "mlp": 1, "rms_norm": 2}
    assert all(v.forward_ms > 0 and v.backward_ms > 0 for v in got.kinds.values())
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())


def test_a_watcher_that_raises_leaves_no_other_in_a_wait():
    # host_wait: a watcher whose wait_started or wait_ended raises (a CUDA error launching the IssueTimer's hold)
    # must not leave the watchers told before it waiting (a FrameClock would charge the wait to its frame)
    from tigon.kernels import host_wait as hw

    class Watcher:
        def __init__(self, fail=""):
            self.fail, self.depth = fail, 0

        def wait_started(self):
            self.depth += 1
            if self.fail == "start":
                raise RuntimeError("start")

        def wait_ended(self):
            self.depth -= 1
            if self.fail == "end":
                raise RuntimeError("end")

    for fail in ("start", "end"):
        outer, inner = Watcher(), Watcher(fail)
        with hw.watching(outer), hw.watching(inner):
            with pytest.raises(RuntimeError, match=fail):
                hw.host_read(lambda: 1)
        assert outer.depth == 0, fail
    assert hw._WATCHERS == []


def test_watching_unregisters_its_own_watcher():
    # watchers that compare equal (a dataclass): leaving the inner block unregisters the inner one, not the outer
    from dataclasses import dataclass

    from tigon.kernels import host_wait as hw

    @dataclass
    class Counter:
        n: int = 0

        def wait_started(self):
            self.n += 1

        def wait_ended(self):
            pass

    outer, inner = Counter(), Counter()
    with hw.watching(outer):
        with hw.watching(inner):
            pass
        assert len(hw._WATCHERS) == 1 and hw._WATCHERS[0] is outer
    assert hw._WATCHERS == []
