"""Ops whose kernels have no custom op (``OpSpec.custom_op`` False: ``act_linear``, the LoRA ops; the MoE glue has
had its custom ops since, tests/test_compile.py) inside ``torch.compile``: a compiled graph
traces their references in every compile mode, and the backend count says so (``"inductor"``, once per trace, as the
other ops count theirs; before, the glue was not counted at all and ``act_linear`` counted as its kernels in mode
``"kernels"``), as does the patch report's compile note. Compiled with ``backend="aot_eager"`` (no codegen)."""

from __future__ import annotations

import pytest
import torch

import tigon.functional as TF
from tigon import support

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


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

    report = PatchReport(family="gpt2", level="instance")
    report.replaced.append(PatchEntry("mlp", "model.layers.0.mlp", "act_linear", ("act_linear",)))
    report.replaced.append(PatchEntry("rms_norm", "model.norm", "rms_norm", ("rms_norm",)))
    for mode in ("kernels", "auto", "inductor"):
        monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
        assert all(support.compiled_choice(op) == "inductor" for op in ("act_linear", "lora_linear")), mode
        note = compile_note(report)
        assert "act_linear" in note.split(" leave")[0], note
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    assert support.compiled_choice("rms_norm") == "kernel"  # an op with a custom op keeps its kernels there
