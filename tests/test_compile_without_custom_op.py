"""Ops whose kernels have no custom op (``OpSpec.custom_op`` False: the MoE glue ``moe_gather`` /
``moe_expert_gate`` / ``moe_combine``, ``act_linear``, the LoRA ops) inside ``torch.compile``: a compiled graph
traces their references in every compile mode, and the backend count says so (``"inductor"``, once per trace, as the
other ops count theirs; before, the glue was not counted at all and ``act_linear`` counted as its kernels in mode
``"kernels"``), as does the patch report's compile note. Compiled with ``backend="aot_eager"`` (no codegen)."""

from __future__ import annotations

import pytest
import torch

import tigon.functional as TF
from tigon import support
from tigon.ops.moe_glue import routing

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _glue(x, weights, positions, offsets, gate_bias, down_bias):
    rows = TF.moe_gather(x, positions)
    h = TF.moe_expert_gate(torch.cat([rows, rows * 0.5], dim=1), offsets, gate_bias)
    return TF.moe_combine(h, weights, positions, offsets, down_bias)


def _inputs():
    g = torch.Generator().manual_seed(0)
    r = routing(g, 6, 4, 2, DEVICE)
    x = torch.randn(6, 8, generator=g).to(DEVICE)
    weights = torch.rand(6, 2, generator=g).to(DEVICE)
    return x, weights, r["positions"], r["offsets"], torch.randn(4, 16, generator=g).to(DEVICE), \
        torch.randn(4, 8, generator=g).to(DEVICE)


@pytest.mark.parametrize("mode", ["kernels", "auto"])
def test_compiled_glue_counts_its_traced_reference(mode, monkeypatch):
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    args = _inputs()
    eager = [t.clone().requires_grad_(t.is_floating_point()) for t in args]
    traced = [t.clone().requires_grad_(t.is_floating_point()) for t in args]
    expected = _glue(*eager)
    support.backend_usage(reset=True)
    fn = torch.compile(_glue, backend="aot_eager", fullgraph=True)
    got = fn(*traced)
    fn(*traced)  # the cached graph: no new decision
    usage = support.backend_usage(reset=True)
    assert {op: usage.get(op) for op in ("moe_gather", "moe_expert_gate", "moe_combine")} == \
        {op: {"inductor": 1} for op in ("moe_gather", "moe_expert_gate", "moe_combine")}, usage
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    seed = torch.randn_like(got)
    (got * seed).sum().backward()
    (expected * seed).sum().backward()
    for e, c in zip(eager, traced):
        if e.grad is not None:
            torch.testing.assert_close(c.grad, e.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["kernels", "auto"])
def test_compiled_act_linear_counts_its_traced_reference(mode, monkeypatch):
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(6, 16, generator=g).to(DEVICE), torch.randn(8, 16, generator=g).to(DEVICE)
    support.backend_usage(reset=True)
    got = torch.compile(lambda h, w: TF.act_linear(h, w, activation="gelu"), backend="aot_eager", fullgraph=True)(h, w)
    assert support.backend_usage(reset=True)["act_linear"] == {"inductor": 1}
    torch.testing.assert_close(got, TF.act_linear(h, w, activation="gelu"), rtol=1e-5, atol=1e-6)


def test_compiled_choice_without_custom_op_is_inductor_in_every_mode(monkeypatch):
    from tigon.integrations.report import PatchEntry, PatchReport, compile_note

    report = PatchReport(family="olmoe", level="instance")
    report.replaced.append(PatchEntry("mlp", "model.layers.0.mlp.experts", "glue", ("moe_gather", "moe_expert_gate",
                                                                                    "moe_combine")))
    report.replaced.append(PatchEntry("rms_norm", "model.norm", "rms_norm", ("rms_norm",)))
    for mode in ("kernels", "auto", "inductor"):
        monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
        assert all(support.compiled_choice(op) == "inductor" for op in ("moe_gather", "moe_expert_gate",
                                                                         "moe_combine", "act_linear",
                                                                         "lora_linear")), mode
        note = compile_note(report)
        assert "moe_combine, moe_expert_gate, moe_gather" in note.split(" leave")[0], note
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    assert support.compiled_choice("rms_norm") == "kernel"  # an op with a custom op keeps its kernels there
