"""DeepSeek-V4 (transformers >= 5.2x; issue 20) as a family spec: its RMSNorms, the clamped-SwiGLU shared expert
(``swiglu_limit``: glu_linear(limit=...)) and routed experts' ``_apply_gate`` (swiglu(limit=...)) and the fused LM-head
loss replaced, the weightless hyper-connection norm and the one-tensor rotary left alone with their reasons; loss and
gradients equal to the original's (fp32), the ops the report declares the ones that ran."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon import support  # noqa: E402
from tigon.numerics import rel_l2  # noqa: E402
from tigon.integrations.moe_experts import MOE_OPS  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

if "deepseek_v4" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
    pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V4", allow_module_level=True)


def tiny(**overrides):
    cfg = transformers.AutoConfig.for_model("deepseek_v4", **{**dict(
        vocab_size=96, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, q_lora_rank=32, o_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2,
        index_n_heads=2, index_head_dim=16, index_topk=4, o_groups=2, qk_rope_head_dim=8, sliding_window=8,
        num_nextn_predict_layers=0), **overrides})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg).to(DEVICE).train()


def step(model, ids, labels):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels)
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("experts, limit", [("grouped_mm", None), ("grouped_mm", 0.1), ("eager", 0.1)])
def test_family_report_and_training_step_equal_the_original(experts, limit):
    # grouped_mm (this config's default) and the eager loop both call the experts' _apply_gate. swiglu_limit 0.1
    # clamps a quarter of the gate values and half of the up values of this tiny model (its default 10 none): the
    # clamps' forward and zero gradients beyond them are then part of the step
    model = tiny(**({} if limit is None else {"swiglu_limit": limit}))
    model.config._experts_implementation = experts
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    labels = ids.clone()
    labels[0, :3] = -100
    ref, ref_grads = step(model, ids, labels)
    report = tigon.patch(model)
    assert report.family == "deepseek_v4"
    # q_a_norm, kv_norm, the compressor's kv_norm, input / post-attention norms per layer, the final norm; per layer
    # the shared expert (DeepseekV4MLP) and the routed experts' _apply_gate, both clamped at config.swiglu_limit
    assert report.counts == {"rms_norm": 11, "mlp": 4, "lm_head_loss": 1}, report
    mlps = {e.target.rsplit(".", 1)[-1]: e for e in report.replaced if e.kind == "mlp"}
    assert mlps["shared_experts"].ops == ("glu_linear",) and "limit=self.limit" in mlps["shared_experts"].detail
    # grouped_mm experts run the whole experts forward with Tigon's glue (moe_expert_gate with the limit)
    glue = experts == "grouped_mm"
    assert mlps["experts"].ops == (MOE_OPS if glue else ("swiglu",)) and "limit=self.limit" in mlps["experts"].detail
    gate = f"moe_expert_gate(activation='silu', limit={model.config.swiglu_limit:g})"
    assert not glue or gate in mlps["experts"].detail
    why = {e.kind: e.detail for e in report.skipped}
    assert "mlp" not in why and "one tensor per call" in why["rope"] and "rounded" in why["rms_norm"]
    support.backend_usage(reset=True)
    out, grads = step(model, ids, labels)
    used = support.backend_usage()
    # every layer's shared expert folds its down projection (glu_linear), the routed experts run swiglu (the glue)
    assert {"glu_linear", "rms_norm", "fused_linear_cross_entropy", *mlps["experts"].ops} <= set(used), used
    assert out.logits is None  # the fused loss ran: no logits
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * ref.loss.item()
    assert grads.keys() == ref_grads.keys()
    # all gradients as one vector within 1e-5; per parameter within 1e-4 of its own norm, floored at 1e-3 of the
    # largest: the router's gate gets ~1e-10 (its normalised top-k weights' gradients cancel), on which a relative
    # error says nothing, and the hyper-head's small gradients (~2e-3 of the largest) sit behind a sum over four
    # sigmoid-weighted streams where the fused loss's other summation order shows as ~1.3e-5
    flat = torch.cat([grads[n].flatten() for n in ref_grads])
    assert rel_l2(flat, torch.cat([g.flatten() for g in ref_grads.values()])) <= 1e-5
    scale = max(g.norm().item() for g in ref_grads.values())
    for n, g in ref_grads.items():
        assert (grads[n] - g).norm().item() <= 1e-4 * max(g.norm().item(), 1e-3 * scale), n
    tigon.unpatch(model)
    again, _ = step(model, ids, labels)
    assert again.logits is not None and again.loss.item() == ref.loss.item()


def test_class_level_patch_names_no_vision_tower():
    # a class-level patch of a text family whose rotary is left alone is not a vision-language container (the note
    # that sends the user to patch "its language model (and vision tower)" by name is for containers:
    # FamilySpec.container)
    try:
        report = tigon.patch("deepseek_v4")
        assert report.family == "deepseek_v4" and {e.kind for e in report.replaced} == {"rms_norm", "mlp",
                                                                                          "lm_head_loss"}
        assert not any("vision tower" in n for n in report.notes), report.notes
        model = tiny()
        ids = torch.randint(0, 96, (1, 8), generator=torch.Generator().manual_seed(2)).to(DEVICE)
        assert model(input_ids=ids, labels=ids).logits is None  # the class-level head ran
    finally:
        tigon.unpatch("deepseek_v4")


def test_support_table_case_is_what_the_patch_does():
    # model_matrix.TABLE_ONLY's entry (the README support table's DeepSeek-V4 row) holds this report's counts
    import model_matrix as mm

    model_type, overrides, family, counts, skipped = mm.TABLE_ONLY["deepseek_v4"]
    report = tigon.patch(mm.build(model_type, overrides))
    held = {}
    for e in report.skipped:
        held[e.kind] = held.get(e.kind, 0) + 1
    assert (report.family, report.counts, held) == (family, counts, skipped), report


# PEFT LoRA's usual targets as DeepSeek-V4 names them (kv_proj and gate_proj also match the compressor's, which
# compresses every 128 tokens here (heavily compressed attention): at 16 tokens its adapters get no gradient, in
# either model). o_a_proj is left out: its forward multiplies each group (o_groups) by its own slice of the weight,
# which PEFT's lora.Linear does not wrap (a shape error)
LORA_TARGETS = ["q_a_proj", "q_b_proj", "kv_proj", "o_b_proj", "gate_proj", "up_proj", "down_proj"]


def peft_tiny(model):
    peft = pytest.importorskip("peft")
    torch.manual_seed(1)  # random B (init_lora_weights=False): with PEFT's B = 0 every gradient of A would be zero
    return peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=LORA_TARGETS,
                                                      init_lora_weights=False))


@pytest.mark.parametrize("order", ["after_peft", "before_peft"])
def test_peft_lora_shared_expert_keeps_its_clamp(order):
    # the shared expert's gate / up / down are fused LoRA layers, but lora_glu_mlp takes no limit: the MLP declines the
    # one-node path (the report says why) and runs its projections as lora_linear around swiglu(limit=...). Patched
    # before get_peft_model, the second patch's already-patched entry says the same. Loss and every LoRA gradient equal
    # the unpatched PEFT model's, with swiglu_limit 0.1 clamping gate and up values of the shared expert
    ref = peft_tiny(tiny(swiglu_limit=0.1))
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    seen = []
    hooks = [ref.get_submodule(f"base_model.model.model.layers.0.mlp.shared_experts.{n}").register_forward_hook(
        lambda m, i, o: seen.append(o.detach())) for n in ("gate_proj", "up_proj")]
    ref_out, ref_grads = step(ref, ids, ids)
    for h in hooks:
        h.remove()
    assert (seen[0] > 0.1).any() and (seen[1].abs() > 0.1).any()  # the clamps are active
    if order == "after_peft":
        model = peft_tiny(tiny(swiglu_limit=0.1))
        entries = tigon.patch(model).replaced
    else:
        base = tiny(swiglu_limit=0.1)
        tigon.patch(base)
        model = peft_tiny(base)
        entries = tigon.patch(model).already_patched
    shared = [e for e in entries if e.kind == "mlp" and e.target.endswith("shared_experts")]
    assert len(shared) == 2
    for e in shared:
        assert e.ops == ("swiglu",) and "limit=self.limit" in e.detail, e
        assert "clamp (self.limit) is not taken by tigon.functional.lora_glu_mlp" in e.detail, e
    support.backend_usage(reset=True)
    out, grads = step(model, ids, ids)
    used = support.backend_usage()
    assert {"swiglu", "lora_linear"} <= set(used) and "lora_glu_mlp" not in used, used
    assert abs(out.loss.item() - ref_out.loss.item()) <= 1e-5 * ref_out.loss.item()
    trainable = {n for n, p in ref.named_parameters() if p.requires_grad}
    assert trainable == {n for n, p in model.named_parameters() if p.requires_grad}
    assert grads.keys() == ref_grads.keys() and set(grads) <= trainable
    assert all(n in grads for n in trainable if "compressor" not in n)
    for n, g in ref_grads.items():
        assert rel_l2(grads[n], g) <= 1e-5, n
