"""tigon.patch / tigon.unpatch on tiny Hugging Face models: same loss and gradients, exact restore, scoping."""

from __future__ import annotations

import copy
import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon import support  # noqa: E402
from tigon.integrations import patched_state  # noqa: E402
from tigon.integrations.marks import tigon_mark  # noqa: E402
from tigon.numerics import rel_l2  # noqa: E402

from _tiny_llama import (  # noqa: E402, F401 (_clean_state: the autouse fixture)
    B, DEVICE, LAYERS, T, TINY, V, _clean_state, assert_same_training_step, batch, build, loss_and_grads,
)


def test_loss_grads_and_report_counts():
    model = build()
    ids, labels = batch()
    support.backend_usage(reset=True)
    report = assert_same_training_step(model, input_ids=ids, labels=labels)
    assert report.family == "llama" and report.level == "instance" and not report.skipped
    assert report.counts == {"rms_norm": 2 * LAYERS + 1, "fused_add_rms_norm": LAYERS, "mlp": LAYERS, "rope": LAYERS,
                             "lm_head_loss": 1}
    used = support.backend_usage()
    for op in ("rms_norm", "glu_linear", "rope", "fused_linear_cross_entropy"):
        assert op in used, used
    targets = {e.target for e in report.replaced}
    assert {"model.layers.0.input_layernorm", "model.norm", "model.layers.1.mlp", "model.layers.0.self_attn"} <= targets
    json.dumps(report.as_dict())
    text = str(report)
    assert "rms_norm" in text and "x5" in text


def test_tied_embeddings():
    model = build(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids, labels = batch()
    assert_same_training_step(model, input_ids=ids, labels=labels)


def test_gradient_checkpointing_keeps_rope_scope():
    model = build()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    ids, labels = batch()
    support.backend_usage(reset=True)
    assert_same_training_step(model, input_ids=ids, labels=labels)
    # 2 layers forward + 2 recomputed in backward, all through the kernel
    assert support.backend_usage()["rope"].get("interpreter", 0) + support.backend_usage()["rope"].get("triton", 0) == 4
    # the fused residual add + norm too: transformers that checkpoint the layer's forward keep checkpointing it
    assert sum(support.backend_usage()["fused_add_rms_norm"].values()) == 2 * LAYERS


def test_num_items_in_batch_and_shift_labels():
    model = build()
    ids, labels = batch()
    n = torch.tensor(37, device=DEVICE)
    assert_same_training_step(model, input_ids=ids, labels=labels, num_items_in_batch=n)
    shift = torch.randint(0, V, (B, T), device=DEVICE)
    shift[1, -4:] = -100
    assert_same_training_step(model, input_ids=ids, labels=labels, shift_labels=shift)


def test_logits_to_keep():
    model = build()
    ids, _ = batch()
    keep = 5
    labels = ids[:, -keep:].clone()  # labels for the kept positions (what HF needs to compute a loss there)
    assert_same_training_step(model, input_ids=ids, labels=labels, logits_to_keep=keep)
    idx = torch.tensor([0, 3, 7, 15], device=DEVICE)
    assert_same_training_step(model, input_ids=ids, labels=ids[:, idx], logits_to_keep=idx)


def test_logits_returned_without_labels_or_in_eval():
    model = build()
    ids, labels = batch()
    with torch.no_grad():
        ref_train = model(input_ids=ids).logits
        model.eval()
        ref_eval = model(input_ids=ids, labels=labels)
        model.train()
    tigon.patch(model)
    with torch.no_grad():
        out = model(input_ids=ids)
        assert out.loss is None and out.logits.shape == (B, T, V)
        torch.testing.assert_close(out.logits, ref_train, rtol=1e-5, atol=1e-5)
        model.eval()
        out = model(input_ids=ids, labels=labels)
    assert out.logits is not None
    torch.testing.assert_close(out.logits, ref_eval.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, ref_eval.loss, rtol=1e-5, atol=0)


def test_return_dict_false_and_positional_labels():
    model = build()
    ids, labels = batch()
    ref = model(ids, None, None, None, None, labels, return_dict=False)
    tigon.patch(model)
    out = model(ids, None, None, None, None, labels, return_dict=False)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=0)


def test_cross_entropy_option_in_eval():
    model = build().eval()
    ids, labels = batch()
    with torch.no_grad():
        ref = model(input_ids=ids, labels=labels)
    support.backend_usage(reset=True)
    report = tigon.patch(model, cross_entropy=True)
    assert any("tigon.functional.cross_entropy" in e.detail for e in report.replaced if e.kind == "lm_head_loss")
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels)
    assert "cross_entropy" in support.backend_usage()
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=0)


def test_patch_is_idempotent_and_unpatch_restores_exactly():
    import transformers.models.llama.modeling_llama as ml

    original_rope = ml.apply_rotary_pos_emb
    model = build()
    pristine = copy.deepcopy(model)
    ids, labels = batch()
    tigon.patch(model)
    assert ml.apply_rotary_pos_emb is not original_rope
    again = tigon.patch(model)
    assert again.replaced == [] and not again.skipped
    assert len(again.already_patched) == 2 * LAYERS + 1 + LAYERS + LAYERS + LAYERS + 1
    restored = tigon.unpatch(model)
    assert restored.action == "unpatch" and restored.counts["rms_norm"] == 2 * LAYERS + 1
    assert ml.apply_rotary_pos_emb is original_rope
    for m in model.modules():
        assert "forward" not in m.__dict__
    assert model.model.norm.forward.__func__ is ml.LlamaRMSNorm.forward
    with torch.no_grad():
        a, b = model(input_ids=ids, labels=labels), pristine(input_ids=ids, labels=labels)
    assert torch.equal(a.logits, b.logits) and torch.equal(a.loss, b.loss)
    assert tigon.unpatch(model).replaced == []


def test_rope_and_kernels_scoped_to_the_patched_model():
    patched, other = build(seed=0), build(seed=1)
    ids, _ = batch()
    tigon.patch(patched)
    support.backend_usage(reset=True)
    with torch.no_grad():
        other(input_ids=ids)
    assert support.backend_usage() == {}, "an unpatched model of the same family must not run Tigon ops"
    with torch.no_grad():
        patched(input_ids=ids)
    assert set(support.backend_usage()) >= {"rms_norm", "glu_linear", "rope"}
    # the dispatcher stays while one patched model is alive
    tigon.patch(other)
    tigon.unpatch(patched)
    import transformers.models.llama.modeling_llama as ml

    assert tigon_mark(ml.apply_rotary_pos_emb) is not None
    tigon.unpatch(other)
    assert tigon_mark(ml.apply_rotary_pos_emb) is None


def test_class_level_patch_and_unpatch():
    import transformers.models.llama.modeling_llama as ml
    import transformers.models.mistral.modeling_mistral as mm

    saved = {c: c.__dict__.get("forward") for c in (ml.LlamaRMSNorm, ml.LlamaMLP, ml.LlamaForCausalLM)}
    rope, mistral_rope, mistral_norm = ml.apply_rotary_pos_emb, mm.apply_rotary_pos_emb, mm.MistralRMSNorm.forward
    torch_fwds = (torch.nn.LayerNorm.forward, torch.nn.Linear.forward, torch.nn.Module.__call__)
    ids, labels = batch()
    reference = build()
    ref, ref_grads = loss_and_grads(reference, input_ids=ids, labels=labels)

    report = tigon.patch("llama")
    assert report.level == "class"
    assert report.counts == {"rms_norm": 1, "fused_add_rms_norm": 1, "mlp": 1, "rope": 1, "lm_head_loss": 1}
    assert tigon.patch("llama").already_patched and not tigon.patch("llama").replaced
    model = build()  # built after the patch
    assert tigon.patch(model).replaced == []  # already patched at class level
    out, grads = loss_and_grads(model, input_ids=ids, labels=labels)
    assert out.logits is None
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
    assert max(rel_l2(grads[n], ref_grads[n]) for n in ref_grads) < 1e-4
    # other families and torch.nn untouched
    assert mm.apply_rotary_pos_emb is mistral_rope and mm.MistralRMSNorm.forward is mistral_norm
    assert (torch.nn.LayerNorm.forward, torch.nn.Linear.forward, torch.nn.Module.__call__) == torch_fwds

    back = tigon.unpatch("llama")
    assert back.counts == {"rms_norm": 1, "fused_add_rms_norm": 1, "mlp": 1, "rope": 1, "lm_head_loss": 1}
    assert {c: c.__dict__.get("forward") for c in saved} == saved
    assert ml.apply_rotary_pos_emb is rope
    with torch.no_grad():
        assert model(input_ids=ids).logits is not None
    assert "not patched" in tigon.unpatch("llama").notes[0]


def test_other_family_model_untouched_by_llama_patch():
    mistral = build("mistral")
    ids, _ = batch()
    tigon.patch("llama")
    support.backend_usage(reset=True)
    with torch.no_grad():
        mistral(input_ids=ids)
    assert support.backend_usage() == {}


# norms per layer (+1 final): Qwen3 adds q_norm/k_norm, Gemma 2 pre/post feed-forward norms; Gemma 2 also
# exercises final logit softcapping and gelu-tanh (config.hidden_activation), Gemma the (1 + w) fp32 norm.
# Gemma 2's layers have sandwich norms (not the pre-norm form): no fused residual add there.
@pytest.mark.parametrize("family,norms,adds", [("mistral", 2, 1), ("qwen2", 2, 1), ("qwen3", 4, 1), ("gemma", 2, 1),
                                               ("gemma2", 4, 0)])
def test_other_families(family, norms, adds):
    model = build(family)
    ids, labels = batch()
    report = assert_same_training_step(model, input_ids=ids, labels=labels)
    assert report.family == family and not report.skipped
    expected = {"rms_norm": norms * LAYERS + 1, "mlp": LAYERS, "rope": LAYERS, "lm_head_loss": 1}
    assert report.counts == {**expected, **({"fused_add_rms_norm": LAYERS} if adds else {})}
    why = [n for n in report.notes if n.startswith("fused_add_rms_norm:")]
    assert len(why) == 1 and ("post-attention norms stay patched" in why[0] if adds else "not declared" in why[0])


def test_unsupported_models_raise_clear_errors():
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50))
    with pytest.raises(TypeError, match=r"GPT2LMHeadModel.*llama"):
        tigon.patch(gpt2)
    with pytest.raises(TypeError, match="Sequential"):
        tigon.patch(torch.nn.Sequential(torch.nn.LayerNorm(8)))
    with pytest.raises(ValueError, match=r"'gpt2'.*supported families: .*llama"):
        tigon.patch("gpt2")
    with pytest.raises(TypeError, match="family name"):
        tigon.patch(42)
    assert all("forward" not in m.__dict__ for m in gpt2.modules())


def test_unsupported_activation_strict_and_lenient():
    model = build(hidden_act="relu")
    with pytest.raises(ValueError, match=r"mlp model\.layers\.0\.mlp: activation 'relu'"):
        tigon.patch(model, strict=True)
    assert all("forward" not in m.__dict__ for m in model.modules()), "strict failure must change nothing"
    report = tigon.patch(model)
    assert report.skipped_counts == {"mlp": LAYERS}
    assert "mlp" not in report.counts and report.counts["rms_norm"] == 2 * LAYERS + 1


def test_custom_loss_function_is_kept():
    model = build()
    model.loss_function = lambda logits, labels, vocab_size, **kw: logits.float().mean()
    with pytest.raises(ValueError, match="custom loss_function"):
        tigon.patch(model, strict=True)
    report = tigon.patch(model)
    assert report.skipped_counts == {"lm_head_loss": 1}
    ids, labels = batch()
    out = model(input_ids=ids, labels=labels)
    assert out.logits is not None


def test_options_turn_parts_off():
    model = build()
    report = tigon.patch(model, rope=False, mlp=False, fused_add_rms_norm=False, fused_linear_cross_entropy=False)
    assert report.counts == {"rms_norm": 2 * LAYERS + 1}
    assert any("turned off" in n and "rope" in n for n in report.notes)
    import transformers.models.llama.modeling_llama as ml

    assert tigon_mark(ml.apply_rotary_pos_emb) is None
    more = tigon.patch(model)  # the rest can be added later
    assert more.counts == {"fused_add_rms_norm": LAYERS, "mlp": LAYERS, "rope": LAYERS, "lm_head_loss": 1}


def test_turning_a_kind_off_later_says_it_stays_patched():
    """A second call with a kind off does not unpatch it: the note says what stays patched (it said only "turned
    off: rms_norm" while the norms still ran Tigon's kernel), at instance and class level."""
    model = build()
    tigon.patch(model)
    note = next(n for n in tigon.patch(model, rms_norm=False).notes if n.startswith("turned off"))
    assert f"still patched by an earlier tigon.patch: rms_norm x{2 * LAYERS + 1}" in note
    assert "tigon.unpatch(model)" in note
    tigon.unpatch(model)
    assert "still patched" not in " ".join(tigon.patch(model, rms_norm=False).notes)
    tigon.unpatch(model)
    tigon.patch("llama")
    try:
        note = next(n for n in tigon.patch("llama", mlp=False).notes if n.startswith("turned off"))
        assert "still patched by an earlier tigon.patch: mlp x1" in note and "tigon.unpatch('llama')" in note
    finally:
        tigon.unpatch("llama")



def _spy_flce(monkeypatch):
    """Record the ``accum_dtype`` keyword of every tigon.functional.fused_linear_cross_entropy call."""
    import tigon.functional as TF

    seen, real = [], TF.fused_linear_cross_entropy

    def spy(*args, **kwargs):
        seen.append(kwargs.get("accum_dtype", "absent"))
        return real(*args, **kwargs)

    monkeypatch.setattr(TF, "fused_linear_cross_entropy", spy)
    return seen


def test_fused_loss_options_reach_the_function(monkeypatch):
    seen = _spy_flce(monkeypatch)
    model = build()
    ids, labels = batch()
    ref, ref_grads = loss_and_grads(model, input_ids=ids, labels=labels)
    report = tigon.patch(model, fused_linear_cross_entropy={"accum_dtype": torch.float32})
    try:
        [head] = [e for e in report.replaced if e.kind == "lm_head_loss"]
        assert "fused_linear_cross_entropy(accum_dtype=torch.float32)" in head.detail
        out, grads = loss_and_grads(model, input_ids=ids, labels=labels)
    finally:
        tigon.unpatch(model)
    assert seen == [torch.float32] and out.logits is None
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
    assert max(rel_l2(grads[n], ref_grads[n]) for n in ref_grads) < 1e-4
    report = tigon.patch(model)  # without options: the function's defaults
    try:
        assert "fused_linear_cross_entropy (logits=None)" in str(report.as_dict())
        loss_and_grads(model, input_ids=ids, labels=labels)
    finally:
        tigon.unpatch(model)
    assert seen[-1] == "absent"


def test_fused_loss_accum_dtype_of_the_weight_bf16(monkeypatch):
    seen = _spy_flce(monkeypatch)
    model = build().to(torch.bfloat16)
    ids, labels = batch()
    tigon.patch(model)
    try:
        ref, ref_grads = loss_and_grads(model, input_ids=ids, labels=labels)
    finally:
        tigon.unpatch(model)
    tigon.patch(model, fused_linear_cross_entropy={"accum_dtype": torch.bfloat16})
    try:
        out, grads = loss_and_grads(model, input_ids=ids, labels=labels)
    finally:
        tigon.unpatch(model)
    assert seen == ["absent", torch.bfloat16]
    assert out.loss.item() == pytest.approx(ref.loss.item(), rel=1e-3)
    assert rel_l2(grads["lm_head.weight"].float(), ref_grads["lm_head.weight"].float()) < 2e-2


def test_fused_loss_memory_option(monkeypatch):
    import tigon.functional as TF

    seen, real = [], TF.fused_linear_cross_entropy

    def spy(*args, **kwargs):
        seen.append(kwargs.get("memory", "absent"))
        return real(*args, **kwargs)

    monkeypatch.setattr(TF, "fused_linear_cross_entropy", spy)
    model = build()
    ids, labels = batch()
    ref, ref_grads = loss_and_grads(model, input_ids=ids, labels=labels)
    report = tigon.patch(model, fused_linear_cross_entropy={"memory": 1 << 20})
    try:
        [head] = [e for e in report.replaced if e.kind == "lm_head_loss"]
        assert "memory=1048576" in head.detail
        out, grads = loss_and_grads(model, input_ids=ids, labels=labels)
    finally:
        tigon.unpatch(model)
    assert seen == [1 << 20] and out.logits is None
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
    assert max(rel_l2(grads[n], ref_grads[n]) for n in ref_grads) < 1e-4
    for bad in ("lots", -5, 2.0):
        with pytest.raises(ValueError, match="'memory'"):
            tigon.patch(model, fused_linear_cross_entropy={"memory": bad})


def test_fused_loss_options_at_class_level(monkeypatch):
    seen = _spy_flce(monkeypatch)
    report = tigon.patch("llama", fused_linear_cross_entropy={"accum_dtype": torch.float32})
    [head] = [e for e in report.replaced if e.kind == "lm_head_loss"]
    assert "accum_dtype=torch.float32" in head.detail
    model = build()
    ids, labels = batch()
    out, _ = loss_and_grads(model, input_ids=ids, labels=labels)
    assert out.logits is None and seen == [torch.float32]


@pytest.mark.parametrize("options, match", [({"chunk_size": 4}, "'chunk_size'"),
                                            ({"accum_dtype": "bf16"}, "accum_dtype"),
                                            ({"accum_dtype": torch.int32}, "accum_dtype")])
def test_fused_loss_bad_options_raise_and_change_nothing(options, match):
    model = build()
    with pytest.raises(ValueError, match=match):
        tigon.patch(model, fused_linear_cross_entropy=options)
    with pytest.raises(ValueError, match=match):
        tigon.patch("llama", fused_linear_cross_entropy=options)
    assert not any(tigon_mark(m.__dict__.get("forward")) for m in model.modules())
    assert patched_state()["class_level"] == {}


@pytest.mark.parametrize("value", [None, "x", ["accum_dtype"], 1])
def test_fused_loss_flag_must_be_bool_or_dict(value):
    model = build()
    with pytest.raises(TypeError, match="fused_linear_cross_entropy must be True, False or a dict"):
        tigon.patch(model, fused_linear_cross_entropy=value)
    assert not any(tigon_mark(m.__dict__.get("forward")) for m in model.modules())


def test_fused_loss_accum_dtype_checked_against_the_head_at_patch_time():
    model = build()  # float32 LM head
    with pytest.raises(ValueError, match="differs from the LM head's dtype torch.float32"):
        tigon.patch(model, fused_linear_cross_entropy={"accum_dtype": torch.bfloat16})
    assert not any(tigon_mark(m.__dict__.get("forward")) for m in model.modules())


def test_model_class_names_its_family():
    import transformers.models.llama.modeling_llama as ml

    saved = ml.LlamaRMSNorm.__dict__.get("forward")
    report = tigon.patch(ml.LlamaForCausalLM)
    assert report.level == "class" and report.family == "llama" and report.counts["rms_norm"] == 1
    assert tigon.unpatch(ml.LlamaForCausalLM).counts["rms_norm"] == 1
    assert ml.LlamaRMSNorm.__dict__.get("forward") is saved
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*no registered family"):
        tigon.patch(transformers.GPT2LMHeadModel)
    with pytest.raises(TypeError, match="family= is only for models"):
        tigon.patch(ml.LlamaForCausalLM, family="llama")


@pytest.mark.parametrize("family", ["mistral", "glm4"])  # glm4: its rope layout is skipped, still nothing matches
def test_forced_family_that_matches_nothing_raises(family):
    model = build()
    with pytest.raises(TypeError, match=rf"family '{family}' matched nothing in LlamaForCausalLM"):
        tigon.patch(model, family=family)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_detected_family_with_nothing_to_patch_does_not_raise():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(**TINY)
    holder = torch.nn.Sequential(LlamaRotaryEmbedding(cfg), torch.nn.Linear(4, 4))
    report = tigon.patch(holder)
    assert report.family == "llama" and report.replaced == []


def test_class_level_options_conflict_names_the_family():
    tigon.patch("llama")
    model = build()
    with pytest.raises(ValueError, match=r"class level: call tigon.unpatch\('llama'\)"):
        tigon.patch(model, fused_linear_cross_entropy=False, cross_entropy=True)


def test_subclass_of_a_family_class():
    import transformers.models.llama.modeling_llama as ml

    class MyLlama(ml.LlamaForCausalLM):
        pass

    assert tigon.patch(MyLlama).family == "llama"
    tigon.unpatch(MyLlama)
    with pytest.raises(TypeError, match="got the class LlamaConfig"):
        tigon.patch(transformers.LlamaConfig)


def test_repatching_with_other_loss_options_raises():
    model = build()
    tigon.patch(model)
    assert tigon.patch(model).already_patched  # same options: idempotent
    with pytest.raises(ValueError, match=r"already patched with .*cross_entropy.*unpatch"):
        tigon.patch(model, fused_linear_cross_entropy=False, cross_entropy=True)
    # None and float32 both mean fp32 accumulation: the same options
    assert tigon.patch(model, fused_linear_cross_entropy={"accum_dtype": torch.float32}).already_patched
    with pytest.raises(ValueError, match="already patched"):
        tigon.patch(model, cross_entropy=True)
    tigon.unpatch(model)
    report = tigon.patch(model, fused_linear_cross_entropy=False, cross_entropy=True)
    assert report.counts["lm_head_loss"] == 1
    ids, labels = batch()
    assert model(input_ids=ids, labels=labels).logits is not None  # the fused path is off now


def test_glu_linear_on_meta_tensors():
    meta = torch.device("meta")
    out = tigon.functional.glu_linear(torch.empty(4, 8, device=meta), torch.empty(4, 8, device=meta),
                                      torch.empty(3, 8, device=meta))
    assert out.shape == (4, 3) and out.is_meta


def test_patch_flags_must_be_bools():
    # checked before anything is resolved or patched (a family name would otherwise patch at class level)
    for kwargs, needle in (({"cross_entropy": {"label_smoothing": 0.5}}, "takes no options"),
                           ({"rms_norm": "no"}, "rms_norm must be True or False"),
                           ({"strict": 1}, "strict must be True or False")):
        with pytest.raises(TypeError, match=needle):
            tigon.patch("llama", **kwargs)
    assert not patched_state()["class_level"]


# ---- the residual add fused into the post-attention norm (fused_add_rms_norm) ------------------------------------
def test_decoder_layers_fuse_the_residual_add_into_the_post_attention_norm():
    model = build()
    ids, labels = batch()
    calls = []
    orig = tigon.functional.fused_add_rms_norm
    report = assert_same_training_step(model, input_ids=ids, labels=labels)
    assert report.counts["fused_add_rms_norm"] == LAYERS
    entry = next(e for e in report.replaced if e.kind == "fused_add_rms_norm")
    assert entry.target == "model.layers.0" and "fused_add_rms_norm" in entry.detail
    # the patched layer really calls the fused op (once per layer per forward) and stays exact with it
    tigon.patch(model)
    try:
        tigon.functional.fused_add_rms_norm = lambda *a, **k: calls.append(1) or orig(*a, **k)
        model(input_ids=ids, labels=labels).loss.backward()
    finally:
        tigon.functional.fused_add_rms_norm = orig
        tigon.unpatch(model)
    assert len(calls) == LAYERS
    assert all("forward" not in vars(m) for m in model.modules())  # unpatch restored every layer


def test_fused_add_rms_norm_can_be_turned_off_and_is_class_level_too():
    model = build()
    report = tigon.patch(model, fused_add_rms_norm=False)
    try:
        assert "fused_add_rms_norm" not in report.counts and "turned off: fused_add_rms_norm" in report.notes
    finally:
        tigon.unpatch(model)
    report = tigon.patch("llama")
    try:
        assert any(e.kind == "fused_add_rms_norm" and e.target.endswith("LlamaDecoderLayer.forward")
                   for e in report.replaced)
        model = build()
        ids, labels = batch()
        tigon.unpatch("llama")
        ref, ref_grads = loss_and_grads(model, input_ids=ids, labels=labels)
        tigon.patch("llama")
        out, grads = loss_and_grads(model, input_ids=ids, labels=labels)
        assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
        assert max(rel_l2(grads[n], ref_grads[n]) for n in ref_grads) < 1e-4
    finally:
        tigon.unpatch("llama")


def test_a_decoder_layer_of_another_form_is_skipped_with_the_reason():
    from transformers.models.llama import modeling_llama as M

    class DropoutLayer(M.LlamaDecoderLayer):  # an extra statement: not the pre-norm form the fused forward assumes
        def forward(self, hidden_states, attention_mask=None, **kwargs):
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask, **kwargs)
            hidden_states = residual + torch.nn.functional.dropout(hidden_states, 0.0)
            residual = hidden_states
            hidden_states = self.post_attention_layernorm(hidden_states)
            hidden_states = self.mlp(hidden_states)
            hidden_states = residual + hidden_states
            return hidden_states

    from tigon.integrations.families import LLAMA
    from tigon.integrations.decoder_layer import decoder_layer_problem

    spec = LLAMA.decoder_layers[0]
    assert decoder_layer_problem(M.LlamaDecoderLayer, spec) is None
    assert "not the pre-norm form" in decoder_layer_problem(DropoutLayer, spec)
    model = build()
    model.model.layers[0].__class__ = DropoutLayer
    report = tigon.patch(model)
    try:
        skipped = {e.target: e.detail for e in report.skipped if e.kind == "fused_add_rms_norm"}
        assert "model.layers.0" in skipped and "overrides" in skipped["model.layers.0"]
        assert report.counts["fused_add_rms_norm"] == LAYERS - 1
    finally:
        tigon.unpatch(model)
