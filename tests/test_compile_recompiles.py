"""torch.compile of a patched model: Tigon adds no recompilation the unpatched model does not have.

Each check counts the graphs a counting backend (``aot_eager`` underneath, as tests/test_compile.py) receives while
the same calls run through the unpatched and the patched model; a recompile costs users a whole model's compile time
and counts against Dynamo's recompile limit (8 by default, then the frame runs eagerly).
"""

from __future__ import annotations

import threading

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _model(patched: bool):
    transformers = pytest.importorskip("transformers")
    import tigon
    from tigon.presets import build_config

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(build_config("tiny")).float().to(DEVICE).train()
    if patched:
        tigon.patch(model)
    return model


def _compiles(model, calls, between=None) -> list[int]:
    """The graphs compiled by each call of ``calls`` ((batch, seq) pairs: a training step each) on ``model``;
    ``between(i)`` runs after the i-th call."""
    count = [0]
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        count[0] += 1
        return aot_eager(gm, example_inputs)

    compiled = torch.compile(model, backend=backend)
    seen = []
    for batch, seq in calls:
        before = count[0]
        ids = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seq)).to(DEVICE)
        compiled(input_ids=ids, labels=ids).loss.backward()
        seen.append(count[0] - before)
        if between is not None:
            between(len(seen))
    return seen


@pytest.mark.slow
def test_second_call_of_a_new_thread_does_not_recompile(monkeypatch):
    """The rotary dispatch's thread-local state exists in every thread from its first read
    (tigon.integrations.rotary_forwards._Scope): a plain ``threading.local`` whose ``depth`` the first call set made
    Dynamo's ``not hasattr(_scope, 'depth')`` guard fail on the second call, and the whole model compiled twice in
    each new thread (in "auto" mode, the first compiled call of a process). A thread of its own gives this test
    fresh thread-local state whatever ran before it in the process."""
    monkeypatch.setenv("TIGON_COMPILE_OPS", "auto")
    calls = [(2, 16), (2, 16)]
    expected = _compiles(_model(False), calls)
    torch._dynamo.reset()
    found = {}
    thread = threading.Thread(target=lambda: found.update(seen=_compiles(_model(True), calls)))
    thread.start()
    thread.join()
    assert found["seen"] == expected == [1, 0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "kernels"])
def test_eager_calls_between_compiled_calls_do_not_recompile(mode, monkeypatch):
    """The ops' caches of validated eager calls (``_CALLS`` in tigon.ops.rms_norm, glu, rope...) are not read
    under torch.compile: once a graph has dynamic shapes (``dynamic=True``, or Dynamo's automatic dynamic shapes
    after a second sequence length) a lookup with a symbolic shape in its key made Dynamo guard on the cache's size
    (``len(glu._CALLS) != 2``), so any eager call with a new shape (an eager evaluation, a reference model, a
    second model) recompiled the compiled patched model at its next call."""
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    eager = _model(True)

    def eager_step(seq):
        ids = torch.randint(0, 256, (2, seq), generator=torch.Generator().manual_seed(seq)).to(DEVICE)
        eager(input_ids=ids, labels=ids).loss.backward()

    eager_step(40)  # (an empty cache was guarded differently)
    # the second call's new length: one graph with a dynamic length, as the unpatched model; no more after that
    seen = _compiles(_model(True), [(2, 16), (2, 24), (2, 32)], between=lambda i: i == 2 and eager_step(48))
    assert seen == [1, 1, 0]


@pytest.mark.slow
def test_unpatch_and_patch_again_do_not_recompile(monkeypatch):
    """A compiled model unpatched and patched again (a user comparing the two) keeps its graphs: the rotary
    dispatcher (tigon.integrations.rotary_switch.SPARE), the causal-mask wrappers (causal_mask._SPARE) and the
    decoder's hook ids (causal_mask._HOOK_IDS) come back as the same objects. New ones recompiled the whole model at
    every cycle (Dynamo guards on the dispatcher's type and on the hook ids), and after 8 cycles Dynamo ran it
    eagerly. Unpatched, the model holds none of Tigon's hooks."""
    import tigon

    monkeypatch.setenv("TIGON_COMPILE_OPS", "auto")
    model = _model(True)
    hooks = lambda m: (dict(m._forward_pre_hooks), dict(m._forward_hooks))  # noqa: E731
    plain = hooks(model.model)

    def cycle(i):
        tigon.unpatch(model)
        assert hooks(model.model) == ({}, {}) != plain
        tigon.patch(model)
        assert hooks(model.model).__repr__() == plain.__repr__()

    assert _compiles(model, [(2, 16)] * 4, between=cycle) == [1, 0, 0, 0]
    tigon.unpatch(model)


# ---- torch.compile(dynamic=True): a Python float becomes a symbolic float --------------------------------------
def _dynamic_cases():
    import tigon.functional as TF

    h, v = 32, 40
    w, b, head = torch.randn(h), torch.randn(h), torch.randn(v, h)
    rows = lambda n: (torch.randn(n, 8, h),)  # noqa: E731
    pairs = lambda n: (torch.randn(n, 8, h), torch.randn(n, 8, h))  # noqa: E731
    logp = lambda n: (torch.randn(n * 8, v).log_softmax(-1), torch.randn(n * 8, v).log_softmax(-1))  # noqa: E731
    return {  # each op with its float arguments at their defaults (a default is a symbolic float too)
        "rms_norm": (lambda x: TF.rms_norm(x, w), rows),
        "fused_add_rms_norm": (lambda x, r: TF.fused_add_rms_norm(x, r, w), pairs),
        "layer_norm": (lambda x: TF.layer_norm(x, w, b), rows),
        "swiglu": (lambda g, u: TF.swiglu(g, u, limit=7.0), pairs),
        "clamped_swiglu": (lambda gu: TF.clamped_swiglu(gu), rows),
        "jsd": (lambda a, c: TF.jsd(a, c), logp),
        "fused_linear_cross_entropy": (lambda x, y: TF.fused_linear_cross_entropy(x, head, y, softcap=30.0),
                                       lambda n: (torch.randn(n * 8, h), torch.randint(0, v, (n * 8,)))),
        "fused_linear_logprobs": (lambda x, y: TF.fused_linear_logprobs(x, head, y),  # (temperature's check)
                                  lambda n: (torch.randn(n * 8, h), torch.randint(0, v, (n * 8,)))),
    }


@pytest.mark.parametrize("mode", ["auto", "kernels"])
@pytest.mark.parametrize("op", list(_dynamic_cases()))
def test_functional_ops_compile_whole_with_dynamic_shapes(op, mode, monkeypatch):
    """Under ``torch.compile(dynamic=True)`` Dynamo traces a Python float (an op's ``eps`` default, a module's
    ``variance_epsilon``) as a symbolic float; the argument checks' ``math.isfinite`` on one was a graph break
    ("torch.* op returned non-Tensor"), so a patched model compiled with ``dynamic=True`` fell back to eager around
    every norm and GLU. The checks compare instead (``tigon._checks.finite``): one graph, eager's values, no
    recompile for a new batch size."""
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    fn, make = _dynamic_cases()[op]
    compiled = torch.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True)
    for n in (2, 3):
        args = [a.to(DEVICE).requires_grad_(a.is_floating_point()) for a in make(n)]
        eager = fn(*[a.detach() for a in args])
        out = compiled(*args)
        eager, out = (eager, out) if isinstance(out, tuple) else ((eager,), (out,))
        for e, o in zip(eager, out):
            torch.testing.assert_close(o, e, atol=1e-5, rtol=1e-5)
        sum(o.float().sum() for o in out).backward()
        assert all(a.grad is not None for a in args if a.requires_grad)


@pytest.mark.slow
def test_patched_model_compiles_whole_with_dynamic_shapes(monkeypatch):
    """A patched model under ``torch.compile(dynamic=True, fullgraph=True)``: compiles as the unpatched one does
    (as many graphs, none for a new sequence length or batch size) and gives the eager model's loss."""
    monkeypatch.setenv("TIGON_COMPILE_OPS", "auto")
    calls = [(2, 16), (2, 24), (3, 24)]
    count = [0]
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        count[0] += 1
        return aot_eager(gm, example_inputs)

    seen = {}
    for patched in (False, True):
        torch._dynamo.reset()
        model = _model(patched)
        eager = _model(patched)
        compiled = torch.compile(model, backend=backend, dynamic=True, fullgraph=True)
        seen[patched] = []
        for batch, seq in calls:
            before = count[0]
            ids = torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seq)).to(DEVICE)
            loss = compiled(input_ids=ids, labels=ids).loss
            torch.testing.assert_close(loss, eager(input_ids=ids, labels=ids).loss, atol=1e-5, rtol=1e-5)
            loss.backward()
            seen[patched].append(count[0] - before)
    assert seen[True] == seen[False]
    assert seen[True][1:] == [0, 0]
