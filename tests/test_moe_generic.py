"""MoE families through the generic matcher (tigon.integrations.generic_moe): transformers v5 experts modules get the
probed ``_apply_gate`` hook and the grouped_mm glue forward, the LM head keeps the router loss where HF adds it (or is
skipped with the reason); one training step's loss, aux loss and every gradient equal the unpatched model's in fp32;
``tigon inspect``'s dry run decides the same. Every model here is patched with ``family="generic"``: MiniMax has no
data, the others (Qwen2-MoE, ERNIE-4.5-MoE, GLM-4-MoE, EXAONE-MoE) have since become data, tested with the MoE
families added as data (PhiMoE, FlexOlmo, MiniMax-M2, ...) in tests/test_families.py and tests/test_moe_experts.py."""

from __future__ import annotations

import functools

import pytest
import torch

import tigon
import model_matrix as mm
from test_families import assert_same_step
from tigon.integrations.moe_experts import MOE_OPS

pytest.importorskip("transformers.integrations.moe")


GENERIC = functools.partial(tigon.patch, family="generic")


def experts_entries(report):
    return [e for e in report.replaced if e.kind == "mlp" and e.target.rsplit(".", 1)[-1] == "experts"]


@pytest.mark.parametrize("case", list(mm.GENERIC_MOE))
def test_generic_experts_step_equals_the_original(case):
    from tigon.workflows.inspect import inspect_config

    model_type, overrides, family, counts, skipped, _ = mm.GENERIC_MOE[case]
    mm.require_family(model_type)
    original, patched = mm.build(model_type, overrides), mm.build(model_type, overrides)
    report = tigon.patch(patched, family="generic")
    assert (report.family, report.counts, report.skipped_counts) == (family, counts, skipped), str(report)
    entries = experts_entries(report)
    assert len(entries) == sum(1 for m in patched.modules() if type(m).__name__.endswith("Experts")), str(report)
    assert all(e.ops == MOE_OPS and "moe_expert_gate(activation='silu')" in e.detail for e in entries), str(report)
    assert all("_apply_gate" in m.__dict__ and "forward" in m.__dict__
               for m in patched.modules() if type(m).__name__.endswith("Experts"))
    dry = inspect_config(mm.config(model_type, overrides), patch_fn=GENERIC, unpatch_fn=tigon.unpatch).patch
    assert (dry["family"], dry["counts"]) == (family, counts)
    assert sorted((e["kind"], e["target"]) for e in dry["skipped"]) == sorted((e.kind, e.target)
                                                                               for e in report.skipped)
    assert_same_step(original, patched, report)  # loss, aux_loss (where HF adds it), every gradient; the ops ran
    tigon.unpatch(patched)
    assert not any("forward" in m.__dict__ or "_apply_gate" in m.__dict__ for m in patched.modules())


def test_other_experts_implementations_keep_only_the_gate_hook():
    model_type, overrides = mm.GENERIC_MOE["generic-qwen2_moe"][:2]
    model = mm.build(model_type, {**overrides, "experts_implementation": "batched_mm"})
    entries = experts_entries(GENERIC(model))
    assert entries and all(e.ops == ("swiglu",) for e in entries)
    assert all("forward left as is (config._experts_implementation is 'batched_mm'" in e.detail for e in entries)
    tigon.unpatch(model)
    eager = mm.build(model_type, {**overrides, "experts_implementation": "eager"})
    report = GENERIC(eager)
    assert not experts_entries(report)
    assert sum("config._experts_implementation is 'eager'" in e.detail for e in report.skipped) == mm.L, report
    tigon.unpatch(eager)


def test_mixtral_under_generic_keeps_the_router_loss():
    # a family with data, forced through the generic matcher: the same experts and router loss as its spec gives
    model = mm.build("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                                     experts_implementation="grouped_mm"))
    original = mm.build("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                                        experts_implementation="grouped_mm"))
    report = tigon.patch(model, family="generic")
    assert report.counts == {"rms_norm": 5, "mlp": 2, "rope": 2, "lm_head_loss": 1}, str(report)
    assert_same_step(original, model, report)
    tigon.unpatch(model)


def _custom_aux_head():
    """A Qwen2-MoE head whose loss adds its router loss twice (a head the generic probe must not reproduce)."""
    from transformers.models.qwen2_moe import modeling_qwen2_moe as qm

    class DoubledAuxHead(qm.Qwen2MoeForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, labels=None, output_router_logits=None, **kwargs):
            out = super().forward(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                                  output_router_logits=output_router_logits, **kwargs)
            if out.loss is not None and out.aux_loss is not None:
                out.loss = out.loss + self.router_aux_loss_coef * out.aux_loss
            return out

    return DoubledAuxHead, qm


def test_a_router_loss_the_probe_cannot_reproduce_skips_the_head(monkeypatch):
    cls, qm = _custom_aux_head()
    model_type, overrides = mm.GENERIC_MOE["generic-qwen2_moe"][:2]
    mm.build(model_type, overrides)  # (transformers caches that the family's classes take an experts implementation:
    torch.manual_seed(0)  # a subclass defined here inherits it only once the family's own class was built)
    model = cls(mm.config(model_type, overrides)).train()
    report = GENERIC(model)
    why = next(e.detail for e in report.skipped if e.kind == "lm_head_loss")
    assert "load_balancing_loss_func" in why and "family spec is needed" in why  # (no such function in this module)
    assert experts_entries(report)  # the experts are patched all the same
    tigon.unpatch(model)
    monkeypatch.setitem(globals(), "load_balancing_loss_func", qm.load_balancing_loss_func)
    report = GENERIC(model)
    why = next(e.detail for e in report.skipped if e.kind == "lm_head_loss")
    assert "loss is not the cross-entropy + router_aux_loss_coef x aux_loss" in why, why
    tigon.unpatch(model)


def test_experts_with_a_custom_gate_or_forward_are_left_with_the_reason(monkeypatch):
    model_type, overrides = mm.GENERIC_MOE["generic-qwen2_moe"][:2]
    model = mm.build(model_type, overrides)
    experts = next(m for m in model.modules() if type(m).__name__.endswith("Experts"))
    monkeypatch.setattr(type(experts), "_apply_gate", lambda self, gate_up: gate_up[:, ::2])
    report = GENERIC(model)
    assert not experts_entries(report)
    assert sum("defines its own _apply_gate" in e.detail for e in report.skipped) == mm.L, report
    tigon.unpatch(model)
    monkeypatch.undo()
    monkeypatch.setattr(type(experts), "forward", lambda self, h, index, weights: h)
    report = GENERIC(model)
    assert sum("is not transformers' experts dispatcher" in e.detail for e in report.skipped) == mm.L, report
    tigon.unpatch(model)
