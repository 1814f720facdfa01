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


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _model(patched: bool):
    transformers = pytest.importorskip("transformers")
    import tigon
    from tigon.presets import build_config

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(build_config("tiny")).float().to(DEVICE).train()
    if patched:
        tigon.patch(model)
    return model


def _compiles(model, calls) -> list[int]:
    """The graphs compiled by each call of ``calls`` ((batch, seq) pairs: a training step each) on ``model``."""
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
