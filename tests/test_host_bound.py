"""The host-bound choice of a patched MLP: on a CUDA GPU, calls at or below the op record's ``host_bound_elements``
run the original forward (its ATen ops: less host time; its numerics exactly). On this machine the GPU check is
stubbed (the kernels run interpreted), so what is tested is the decision, its threshold, its override and its
report; the host time it saves is measured by benchmarks/host_issue.py and the e2e rows on the GPU."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon import ops, support  # noqa: E402
from tigon.integrations import mlp_host_bound  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


_PATCHED = []  # the models _models patched in the running test, unpatched after it (no rotary dispatcher left behind)


@pytest.fixture(autouse=True)
def _unpatch_after():
    yield
    while _PATCHED:
        tigon.unpatch(_PATCHED.pop())


def _models():
    """(HF LlamaForCausalLM, the same weights patched, report): 1 layer, 6 tokens x 40 intermediate (240 elements)."""
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=32, head_dim=8)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).to(DEVICE)
    patched = transformers.LlamaForCausalLM(cfg).to(DEVICE)
    patched.load_state_dict(hf.state_dict())
    report = tigon.patch(patched)
    _PATCHED.append(patched)
    return hf, patched, report


def _mlp_step(mlp, x):
    x = x.clone().requires_grad_()
    out = mlp(x)
    out.backward(torch.ones_like(out))
    grads = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad(set_to_none=True)
    return out.detach(), x.grad, grads


@pytest.mark.parametrize("limit", [None, "240", "239", "0"])
def test_small_calls_run_the_original_mlp_on_the_gpu(monkeypatch, limit):
    # The record's default (2^23) and an override of 240 elements cover the 6 x 40 call: the original forward runs
    # (bit for bit HF's, and no Tigon op); 239 and 0 (off) leave it to the kernels.
    if limit is None:  # the record's (conftest sets 0: the kernels, for every other test)
        monkeypatch.delenv("TIGON_HOST_BOUND_ELEMENTS", raising=False)
    else:
        monkeypatch.setenv("TIGON_HOST_BOUND_ELEMENTS", limit)
    monkeypatch.setattr(mlp_host_bound, "_on_compiled_gpu", lambda x, compiling=None: True)
    hf, patched, _ = _models()
    x = torch.randn(2, 3, 16, device=DEVICE)
    support.backend_usage(reset=True)
    got = _mlp_step(patched.model.layers[0].mlp, x)
    used = support.backend_usage()
    want = _mlp_step(hf.model.layers[0].mlp, x)
    if limit in (None, "240"):
        assert not used
        for a, b in zip([got[0], got[1], *got[2]], [want[0], want[1], *want[2]]):
            assert torch.equal(a, b)
    else:
        assert "glu_linear" in used
        torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_off_the_gpu_the_kernels_run(monkeypatch):
    # Under the interpreter (and on CPU) the choice never applies: the tests and tools see the kernels.
    _, patched, _ = _models()
    support.backend_usage(reset=True)
    _mlp_step(patched.model.layers[0].mlp, torch.randn(2, 3, 16, device=DEVICE))
    assert "glu_linear" in support.backend_usage()
    assert not mlp_host_bound._on_compiled_gpu(torch.zeros(1))


def test_threshold_is_the_records_and_reported(monkeypatch):
    monkeypatch.delenv("TIGON_HOST_BOUND_ELEMENTS", raising=False)
    assert ops.get("swiglu").host_bound_elements == ops.get("geglu").host_bound_elements == 1 << 23
    _, _, report = _models()
    detail = {e.target: e.detail for e in report.replaced}
    assert f"at most {1 << 23} tokens x intermediate elements runs the original forward" in detail["model.layers.0.mlp"]
    monkeypatch.setenv("TIGON_HOST_BOUND_ELEMENTS", "0")  # off: not reported
    _, _, report = _models()
    assert "runs the original forward" not in {e.target: e.detail for e in report.replaced}["model.layers.0.mlp"]


def test_bad_threshold_raises(monkeypatch):
    monkeypatch.setenv("TIGON_HOST_BOUND_ELEMENTS", "lots")
    with pytest.raises(ValueError, match="TIGON_HOST_BOUND_ELEMENTS must be an integer >= 0"):
        support.host_bound_elements(5)
    monkeypatch.setenv("TIGON_HOST_BOUND_ELEMENTS", "-3")
    with pytest.raises(ValueError, match="TIGON_HOST_BOUND_ELEMENTS"):
        support.host_bound_elements(5)
    monkeypatch.setenv("TIGON_HOST_BOUND_ELEMENTS", "7")
    assert support.host_bound_elements(5) == 7
    monkeypatch.delenv("TIGON_HOST_BOUND_ELEMENTS")
    assert support.host_bound_elements(5) == 5
    monkeypatch.setenv("TIGON_HOST_BOUND_ELEMENTS", "")  # empty: unset
    assert support.host_bound_elements(5) == 5


def test_record_rejects_a_negative_threshold():
    import dataclasses

    with pytest.raises(ValueError, match="host_bound_elements must be an int >= 0"):
        dataclasses.replace(ops.get("swiglu"), host_bound_elements=-1)
