"""Tigon under PEFT LoRA (with a trainable LM head), gradient checkpointing, the HF Trainer and TRL's SFTTrainer.

Tiny fp32 Llama models built from a config (no downloads), text from ``pydoc_data.topics`` (tigon.data). Every test
trains the same model with and without Tigon and compares the losses step by step.
"""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import tigon  # noqa: E402
from tigon import data, support  # noqa: E402
from tigon.integrations import causal_lm  # noqa: E402
from tigon.numerics import rel_l2  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
B, T, V = 2, 8, 300
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LOSS_RTOL = 1e-5


def config(**overrides):
    cfg = transformers.LlamaConfig(**{
        **dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, vocab_size=V, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
               eos_token_id=2), **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def build(patched: bool, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    if patched:
        model = tigon.AutoModelForCausalLM.from_config(config(**overrides))
    else:
        model = transformers.AutoModelForCausalLM.from_config(config(**overrides))
    return model.float().to(DEVICE)


def lora(model, targets=LORA_TARGETS, modules_to_save=("lm_head",), **options):
    torch.manual_seed(1)  # LoRA init
    cfg = peft.LoraConfig(**{**dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets),
                                    modules_to_save=list(modules_to_save) or None), **options})
    return peft.get_peft_model(model, cfg)


OTHER_KINDS_OFF = dict(rms_norm=False, rope=False, mlp=False, layer_norm=False, fused_add_rms_norm=False,
                       fused_linear_cross_entropy=False)
"""tigon.patch options that leave only the LoRA layers to patch."""


def batches(steps: int, seed: int = 3):
    tokens = data.byte_tokens(data.corpus_text()[:20000])
    return [b.to(DEVICE) for b in data.fixed_batches(tokens, steps, B, T, seed)]


def train(model, steps: int = 3, lr: float = 1e-2):
    """AdamW steps on fixed batches; returns (losses, whether logits were materialised at each step)."""
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses, materialised = [], []
    for ids in batches(steps):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        materialised.append(out.logits is not None)
    return losses, materialised


def assert_losses_match(got, ref, rtol=LOSS_RTOL):
    assert len(got) == len(ref)
    for step, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= rtol * abs(b), f"step {step}: {a} vs {b}"


def enable_checkpointing(model):
    """Non-reentrant activation checkpointing (newer transformers renamed gradient_checkpointing_enable)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def saved_head(model):
    return model.base_model.model.lm_head.modules_to_save["default"].weight


@pytest.mark.parametrize("order", ["tigon_then_peft", "peft_then_tigon"])
def test_lora_with_trainable_head_matches_unpatched(order):
    ref_model = lora(build(False))
    ref, ref_mat = train(ref_model)
    assert all(ref_mat)
    if order == "tigon_then_peft":
        model = lora(build(True))
    else:
        model = lora(build(False))
        report = tigon.patch(model)
        assert report.counts == {"rms_norm": 5, "fused_add_rms_norm": 2, "mlp": 2, "rope": 2, "lm_head_loss": 1,
                                 "lora": 14}, report
    support.backend_usage(reset=True)
    got, mat = train(model)
    assert not any(mat), "the fused head must run on the modules_to_save copy (logits=None)"
    assert "fused_linear_cross_entropy" in support.backend_usage()
    assert_losses_match(got, ref)
    # the trainable copy was trained identically, the frozen original untouched
    assert rel_l2(saved_head(model), saved_head(ref_model)) < 1e-4
    original = model.base_model.model.lm_head.original_module.weight
    torch.testing.assert_close(original, ref_model.base_model.model.lm_head.original_module.weight, rtol=0, atol=0)


def test_lora_on_the_lm_head_falls_back_and_says_so():
    targets = LORA_TARGETS + ("lm_head",)
    ref, _ = train(lora(build(False), targets, modules_to_save=()))
    # patched after PEFT: the report says why the head is left alone
    model = lora(build(False), targets, modules_to_save=())
    report = tigon.patch(model)
    assert report.skipped_counts == {"lm_head_loss": 1}
    assert "LoRA" in report.skipped[0].detail
    got, mat = train(model)
    assert all(mat)
    assert_losses_match(got, ref)
    # patched before PEFT: the forward notices at call time, warns once and runs the original
    model = lora(build(True), targets, modules_to_save=())
    causal_lm._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, mat = train(model)
    assert all(mat)
    assert_losses_match(got, ref)
    assert sum("LoRA" in str(w.message) for w in caught) == 1  # once, not per step


def test_lora_with_gradient_checkpointing():
    def prepared(patched):
        model = build(patched)
        enable_checkpointing(model)
        return lora(model)

    ref, _ = train(prepared(False))
    support.backend_usage(reset=True)
    got, mat = train(prepared(True))
    assert not any(mat)
    assert_losses_match(got, ref)
    # 2 layers x 3 steps, each rotary call once in the forward and once more in the backward's recomputation
    assert sum(support.backend_usage()["rope"].values()) == 2 * 3 * 2


def _trainer_losses(model, tmp_path, steps=2):
    tokens = data.byte_tokens(data.corpus_text()[:20000])
    rows = [{"input_ids": b[0], "labels": b[0].clone()} for b in data.fixed_batches(tokens, 8, 1, T, seed=5)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=B, learning_rate=1e-3,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=DEVICE == "cpu", seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_hf_trainer_two_steps(tmp_path):
    ref = _trainer_losses(build(False), tmp_path / "ref")
    model = build(True)
    assert model.tigon_report.counts == {"rms_norm": 5, "fused_add_rms_norm": 2, "mlp": 2, "rope": 2,
                                         "lm_head_loss": 1}
    support.backend_usage(reset=True)
    got = _trainer_losses(model, tmp_path / "tigon")
    assert len(got) == 2
    assert_losses_match(got, ref)
    assert "fused_linear_cross_entropy" in support.backend_usage()


def test_hf_trainer_with_lora(tmp_path):
    ref = _trainer_losses(lora(build(False)), tmp_path / "ref")
    got = _trainer_losses(lora(build(True)), tmp_path / "tigon")  # patched before PEFT: LoRA layers are PEFT's
    assert_losses_match(got, ref)
    model = lora(build(False))
    assert tigon.patch(model).counts["lora"] == 14  # patched after PEFT: fused LoRA layers too
    support.backend_usage(reset=True)
    got = _trainer_losses(model, tmp_path / "fused")
    assert_losses_match(got, ref)
    assert "lora_linear" in support.backend_usage()


def byte_tokenizer():
    """A byte-level BPE tokenizer without merges, built in memory: ids 0..255 are bytes, then <pad> and <eos>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<pad>"], vocab["<eos>"] = len(vocab), len(vocab) + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def test_trl_sft_trainer_two_steps(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    tok = byte_tokenizer()
    text = data.corpus_text()
    ds = datasets.Dataset.from_dict({"text": [text[i * 40:(i + 1) * 40] for i in range(8)]})

    # TRL >= 1.x installs its own chunked LM head for SFT (per-token log-probs, entropy, accuracy); older TRL reads
    # outputs.logits for those metrics, which Tigon's fused loss does not materialise, so it is turned off there
    trl_fused_head = hasattr(importlib.import_module("trl.trainer.sft_trainer"), "add_fused_lm_head")

    def losses(patched, out):
        torch.manual_seed(0)
        cfg = config(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None)
        model = transformers.AutoModelForCausalLM.from_config(cfg).float().to(DEVICE)
        if patched:
            tigon.patch(model, fused_linear_cross_entropy=trl_fused_head)
        args = trl.SFTConfig(
            output_dir=str(out), max_steps=2, per_device_train_batch_size=B, max_length=16, logging_steps=1,
            report_to=[], save_strategy="no", use_cpu=DEVICE == "cpu", learning_rate=1e-3, seed=0, bf16=False,
            gradient_checkpointing=True, disable_tqdm=True)
        trainer = trl.SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    ref = losses(False, tmp_path / "ref")
    support.backend_usage(reset=True)
    got = losses(True, tmp_path / "tigon")
    assert len(got) == 2
    assert_losses_match(got, ref)
    used = support.backend_usage()
    # TRL's own fused head replaces Tigon's there; under the (non-reentrant) gradient checkpointing the MLP runs swiglu
    # and the down projection's nn.Linear (integrations.child_calls.under_checkpoint), not glu_linear
    assert {"rms_norm", "swiglu", "rope"} <= set(used) and "glu_linear" not in used, used


def test_auto_model_options_and_from_pretrained(tmp_path):
    model = build(True)
    assert model.tigon_report.family == "llama" and model.tigon_report.level == "instance"
    tigon.unpatch(model)
    model.save_pretrained(tmp_path)
    loaded = tigon.AutoModelForCausalLM.from_pretrained(tmp_path, rope=False, fused_linear_cross_entropy=False,
                                                        attn_implementation="eager")
    assert type(loaded).__name__ == "LlamaForCausalLM"
    assert loaded.tigon_report.counts == {"rms_norm": 5, "fused_add_rms_norm": 2, "mlp": 2}
    assert any("turned off" in n for n in loaded.tigon_report.notes)
    with pytest.raises(OSError, match="from_pretrained"):
        tigon.AutoModelForCausalLM()


# ---- fused LoRA layers (tigon.functional.lora_linear) ---------------------------------------------------------------
def _trainable_grads(model):
    return {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_fused_lora_loss_and_every_adapter_gradient_match_peft():
    # random B (init_lora_weights=False): with PEFT's B = 0 every gradient of A would be zero
    ref = lora(build(False), modules_to_save=(), init_lora_weights=False)
    model = copy.deepcopy(ref)
    report = tigon.patch(model)
    assert report.counts["lora"] == 14 and not report.skipped, report
    ids = batches(1)[0]
    support.backend_usage(reset=True)
    losses = []
    for m in (ref, model):
        m.train()
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        losses.append(out.loss.item())
    # o as lora_linear, each layer's q / k / v and rotary as one lora_qkv_rope node (tests/test_lora_qkv_rope.py),
    # each layer's LoRA MLP as one lora_glu_mlp node (tests/test_lora_mlp.py)
    usage = support.backend_usage()
    assert sum(usage["lora_linear"].values()) == 2 and sum(usage["lora_glu_mlp"].values()) == 2, usage
    assert sum(usage["lora_qkv_rope"].values()) == 2 and "rope" not in usage, usage
    assert_losses_match([losses[1]], [losses[0]])
    want, got = _trainable_grads(ref), _trainable_grads(model)
    assert len(want) == 28 and set(got) == set(want)  # A and B of 7 projections x 2 layers
    for name in want:
        assert rel_l2(got[name], want[name]) < 1e-5, name
    # the frozen LM head (no modules_to_save): the fused loss forms no weight gradient
    assert model.base_model.model.lm_head.weight.grad is None


def test_fused_lora_20_steps_on_text_match_peft():
    ref, _ = train(lora(build(False), modules_to_save=()), steps=20)
    model = lora(build(False), modules_to_save=())
    assert tigon.patch(model, **OTHER_KINDS_OFF).counts == {"lora": 14}
    support.backend_usage(reset=True)
    got, _ = train(model, steps=20)
    assert_losses_match(got, ref)
    assert sum(support.backend_usage()["lora_linear"].values()) == 14 * 20


@pytest.mark.parametrize("options, reason", [
    ({"lora_dropout": 0.1}, "lora_dropout=0.1"),
    ({"use_dora": True}, "DoRA"),
])
def test_lora_layers_that_are_not_fused_are_reported(options, reason):
    model = lora(build(False), modules_to_save=(), **options)
    report = tigon.patch(model, **OTHER_KINDS_OFF)
    assert report.skipped_counts == {"lora": 14} and not report.replaced
    assert all(reason in e.detail for e in report.skipped), report


def test_several_active_adapters_are_reported_one_active_is_fused():
    model = lora(build(False), modules_to_save=())
    model.add_adapter("other", peft.LoraConfig(r=2, target_modules=list(LORA_TARGETS)))
    assert tigon.patch(model, **OTHER_KINDS_OFF).counts == {"lora": 14}  # two loaded, "default" active
    tigon.unpatch(model)
    model.base_model.set_adapter(["default", "other"])
    report = tigon.patch(model, **OTHER_KINDS_OFF)
    assert report.skipped_counts == {"lora": 14}
    assert "2 active adapters (default, other)" in report.skipped[0].detail


def test_merge_unmerge_disable_save_and_merge_and_unload(tmp_path):
    model = lora(build(False), modules_to_save=(), init_lora_weights=False)
    ref = copy.deepcopy(model).eval()
    tigon.patch(model, **OTHER_KINDS_OFF)
    model.eval()
    ids = batches(1)[0]

    def logits(m):
        with torch.no_grad():
            return m(input_ids=ids).logits

    def fused_calls():
        return sum(support.backend_usage(reset=True).get("lora_linear", {}).values())

    want = logits(ref)
    support.backend_usage(reset=True)
    torch.testing.assert_close(logits(model), want, rtol=1e-5, atol=1e-5)
    assert fused_calls() == 14
    model.base_model.merge_adapter()  # merged: PEFT's forward (base layer alone)
    torch.testing.assert_close(logits(model), want, rtol=1e-4, atol=1e-4)
    assert fused_calls() == 0
    model.base_model.unmerge_adapter()  # fused again
    torch.testing.assert_close(logits(model), want, rtol=1e-4, atol=1e-4)
    assert fused_calls() == 14
    with ref.disable_adapter():
        base = logits(ref)
    with model.disable_adapter():
        torch.testing.assert_close(logits(model), base, rtol=1e-5, atol=1e-5)
        assert fused_calls() == 0
    # save_pretrained writes the adapters alone, exactly PEFT's, and they load into an unpatched model
    model.save_pretrained(tmp_path / "patched")
    ref.save_pretrained(tmp_path / "ref")
    loaded = peft.PeftModel.from_pretrained(build(False), tmp_path / "patched").eval()
    torch.testing.assert_close(logits(loaded), want, rtol=1e-5, atol=1e-5)
    assert (sorted(p.name for p in (tmp_path / "patched").iterdir())
            == sorted(p.name for p in (tmp_path / "ref").iterdir()))
    # merge_and_unload: plain nn.Linear layers with the adapters merged in, the patch gone with the LoRA layers
    merged = model.merge_and_unload()
    assert not any(isinstance(m, peft.tuners.lora.LoraLayer) for m in merged.modules())
    torch.testing.assert_close(logits(merged), want, rtol=1e-4, atol=1e-4)
    assert fused_calls() == 0


def test_unpatch_restores_peft_forward():
    model = lora(build(False), modules_to_save=())
    tigon.patch(model)
    restored = tigon.unpatch(model)
    assert sum(e.kind == "lora" for e in restored.replaced) == 14
    assert not any("forward" in vars(m) for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer))


def test_fused_lora_with_gradient_checkpointing():
    def prepared(patched):
        model = build(False)
        enable_checkpointing(model)
        model = lora(model)
        if patched:
            assert tigon.patch(model).counts["lora"] == 14
        return model

    ref, _ = train(prepared(False))
    support.backend_usage(reset=True)
    got, _ = train(prepared(True))
    assert_losses_match(got, ref)
    # o / gate / up (6 layers; down runs as plain matmuls inside the checkpoint) and each attention's q / k / v with
    # its rotary (one lora_qkv_rope node) x 3 steps, once in the forward and once more in the backward's recomputation
    usage = support.backend_usage()
    assert sum(usage["lora_linear"].values()) == 6 * 3 * 2 and sum(usage["lora_qkv_rope"].values()) == 2 * 3 * 2


def _saved_activation_bytes(model, ids) -> int:
    """Bytes of the distinct storages autograd saves in one training forward, parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen.setdefault(ptr, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(seen.values())


def test_fused_lora_layers_save_no_more_activations_than_peft():
    ids = batches(1)[0]
    sizes = {}
    for fuse in (False, True):
        model = lora(build(False), modules_to_save=())
        tigon.patch(model, lora=fuse)
        support.backend_usage(reset=True)
        sizes[fuse] = _saved_activation_bytes(model, ids)
        assert ("lora_linear" in support.backend_usage()) == fuse
    # each fused layer keeps x (shared with its neighbours) and the r-wide x A^T, as PEFT's layers do between them
    assert sizes[True] <= sizes[False], sizes


def test_hooks_on_the_frozen_lm_head_keep_its_call():
    # the fused loss reads the head's weight and never calls it: a hook on the head (here one that scales the
    # logits), added after tigon.patch or before, made it compute another loss silently; now the original forward
    # runs (a warning at the call, the reason in the report), and Tigon's own profiler ranges do not count
    from tigon.workflows.profile_events import Annotator

    ref = lora(build(False), modules_to_save=(), init_lora_weights=False)
    model = copy.deepcopy(ref)
    tigon.patch(model, **{**OTHER_KINDS_OFF, "fused_linear_cross_entropy": True})
    ids = batches(1)[0]

    def loss(m):
        m.train()
        return m(input_ids=ids, labels=ids).loss.item()

    support.backend_usage(reset=True)
    ranges = Annotator(model)  # forward hooks on the head that only open profiler ranges: still fused
    assert_losses_match([loss(model)], [loss(ref)])
    ranges.remove()
    assert "fused_linear_cross_entropy" in support.backend_usage()
    handles = [m.base_model.model.lm_head.register_forward_hook(lambda mod, args, out: out * 0.5)
               for m in (ref, model)]
    support.backend_usage(reset=True)
    with pytest.warns(UserWarning, match="the LM head .*has hooks"):
        assert_losses_match([loss(model)], [loss(ref)])
    assert "fused_linear_cross_entropy" not in support.backend_usage()
    other = copy.deepcopy(model)
    tigon.unpatch(other)
    report = tigon.patch(other)
    assert any(e.kind == "lm_head_loss" and "has hooks" in e.detail for e in report.skipped), report
    for h in handles:
        h.remove()
    support.backend_usage(reset=True)
    assert_losses_match([loss(model)], [loss(ref)])
    assert "fused_linear_cross_entropy" in support.backend_usage()
