"""tigon.integrations.trl.patch_trainer: TRL's trainers with and without the switch give the same losses and weights.

Tiny fp32 Llama models built from a config (no downloads), a byte-level tokenizer built in memory, English text from
``pydoc_data.topics`` (tigon.data). Each trainer test trains the same model ten steps (five on CPU: CI time) with and
without the switch and compares every logged value (losses 1e-5 relative) and every parameter at the end; more options
and trainers run three steps each on CUDA, or on CPU with TIGON_TRL_ALL=1. Skipped as a whole without TRL 1.x (the GPU
image has no TRL).
"""

from __future__ import annotations

import copy
import importlib
import math
import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
trl_utils = importlib.import_module("trl.trainer.utils")
if not hasattr(trl_utils, "add_fused_lm_head"):
    pytest.skip("TRL without add_fused_lm_head (older than 1.x): the switch falls back there", allow_module_level=True)

from tigon import data, support  # noqa: E402
from tigon.integrations import trl as tigon_trl  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
V = 300
RTOL = 1e-5
PARAM_RTOL = 1e-4
"""AdamW divides each update by the root of its second moment: an element whose gradient is at rounding level moves by
up to the learning rate whichever way the rounding went, so after ten steps the weights agree to 1e-4, not 1e-5."""
STEPS = 10 if DEVICE == "cuda" else 5
"""Steps of the trainer tests: ten on CUDA; five on CPU (CI time: the interpreted head dominates), which still span
the learning-rate decay, gradient accumulation and GRPO's generation every second step."""


def config(**overrides):
    cfg = transformers.LlamaConfig(**{
        **dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
               head_dim=16, vocab_size=V, max_position_embeddings=64, pad_token_id=256, bos_token_id=None,
               eos_token_id=257), **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(config(**overrides)).float().to(DEVICE)


def byte_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    table = {c: i for i, c in enumerate(sorted(alphabet, key=_byte_of))}
    table["<pad>"], table["<eos>"] = 256, 257
    tok = Tokenizer(models.BPE(vocab=table, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _byte_of(ch: str) -> int:
    """GPT-2's printable character -> the byte it stands for."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(map(chr, cs), bs))[ch]


def snippets(n, width, start=0):
    text = data.corpus_text()
    return [text[start + i * width:start + (i + 1) * width] for i in range(n)]


TIMING = ("runtime", "per_second", "step_time")
"""Logged keys that measure time, not the training."""


def assert_same_run(got, ref, metrics, steps=STEPS):
    """Every logged value of every step equal: losses within RTOL, gradient norms within PARAM_RTOL, the trainer's
    other metrics (rewards, log-probabilities, entropy, token accuracy, KL, clip ratios ...) within RTOL (absolute
    1e-6 near 0); every parameter tensor within PARAM_RTOL of its norm. ``metrics``: keys that must be logged."""
    (hg, pg), (hr, pr) = got, ref
    logged = [h for h in hr if "loss" in h and "train_loss" not in h]
    assert len(hg) == len(hr) and len(logged) == steps, (hg, hr)
    for g, r in zip(hg, hr):
        assert set(g) == set(r), (g, r)
        for k, b in r.items():
            if any(t in k for t in TIMING) or not isinstance(b, (int, float)):
                continue
            rtol = PARAM_RTOL if k == "grad_norm" else RTOL
            assert g[k] == pytest.approx(b, rel=rtol, abs=1e-6 if k != "loss" else 1e-7), (k, g, r)
    assert all(k in h for h in logged for k in metrics), (metrics, logged[0])
    for name, p in pr.items():
        err = (pg[name] - p).norm() / p.norm().clamp(min=1e-12)
        assert err <= PARAM_RTOL, (name, float(err))


def train(trainer, switch):
    report = None
    if switch:
        report = tigon_trl.patch_trainer(trainer, strict=True)
        assert report.ok, str(report)
        support.backend_usage(reset=True)
    trainer.train()
    if switch:  # Tigon's kernels ran (compiled on CUDA, interpreted on CPU), not the PyTorch reference
        used = support.backend_usage()
        assert used and all(set(b) <= {"triton", "interpreter"} for b in used.values()), used
    params = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    return (list(trainer.state.log_history), params), report


def common_args(out, **kw):
    return {**dict(output_dir=str(out), max_steps=STEPS, logging_steps=1, report_to=[], save_strategy="no",
                   use_cpu=DEVICE == "cpu", seed=0, bf16=False, disable_tqdm=True, learning_rate=1e-3), **kw}


# ---- the head itself ------------------------------------------------------------------------------------------------


ALL_OUTPUTS = ("log_probs", "entropy", "mean_logits", "is_top1", "log_sum_sq_probs")


class BareSFT(trl.SFTTrainer):
    """An SFTTrainer that holds only a model: the switch reads nothing else off a trainer of this kind."""

    def __init__(self, model):
        self.model = model


@pytest.mark.parametrize("temperature, extra, outputs", [
    (1.0, {}, ALL_OUTPUTS),
    (0.7, {"logits_scaling": 0.25}, ALL_OUTPUTS),
    (0.9, {"final_logit_softcapping": 3.0}, ALL_OUTPUTS),
    (0.8, {"final_logit_softcapping": 2.0, "logits_scaling": 0.5}, ("log_probs", "mean_logits")),
])
def test_fused_head_outputs_match_trls(temperature, extra, outputs):
    """Every field of TRL's FusedCausalLMOutput, and the gradients of a loss on them, equal TRL's own head (with its
    temperature, a logit scale (Granite's logits_scaling), a final-logit soft-cap: mean_logits too, the row kernel's
    mean of the capped logits, where the switch fell back before)."""
    ref = tiny_model(**extra)
    got = copy.deepcopy(ref)
    for m in (ref, got):
        trl_utils.add_fused_lm_head(m, temperature=temperature, outputs=outputs)
    Trainer = BareSFT

    report = tigon_trl.patch_trainer(Trainer(got), strict=True)
    assert report.ok and "fused_linear_logprobs" in str(report)
    ids = torch.randint(0, 256, (2, 12), device=DEVICE)
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, 9:] = -100
    res = []
    support.backend_usage(reset=True)
    for m in (ref, got):
        o = m(input_ids=ids, labels=labels, fused_lm_head=True, num_items_in_batch=7)
        (o.loss + (0.3 * o.entropy.sum() if o.entropy is not None else 0.0)).backward()
        res.append((o, {n: p.grad.clone() for n, p in m.named_parameters()}))
    (o_ref, g_ref), (o_got, g_got) = res
    used = support.backend_usage()
    assert set(used) == {"fused_linear_logprobs"}, used  # is_top1 too: no fused_linear_cross_entropy pass
    assert torch.equal(o_got.label_mask, o_ref.label_mask)
    assert (o_got.is_top1 is None) == (o_ref.is_top1 is None) == ("is_top1" not in outputs)
    assert "is_top1" not in outputs or torch.equal(o_got.is_top1, o_ref.is_top1)
    assert "mean_logits" not in outputs or not o_got.mean_logits.requires_grad
    for f in ("loss",) + tuple(o for o in outputs if o != "is_top1"):
        torch.testing.assert_close(getattr(o_got, f), getattr(o_ref, f), rtol=RTOL, atol=1e-6, msg=f)
    for n in g_ref:
        torch.testing.assert_close(g_got[n], g_ref[n], rtol=RTOL, atol=1e-6, msg=n)
    # the plain forward (generation, evaluation) is the model's own
    torch.testing.assert_close(got(input_ids=ids).logits, ref(input_ids=ids).logits)
    assert tigon_trl.unpatch_trainer(Trainer.__new__(Trainer)) is False


@pytest.mark.parametrize("outputs", [("log_probs", "entropy", "is_top1"), ALL_OUTPUTS],
                         ids=["sft", "dpo-use_weighting"])
def test_switched_head_runs_the_head_matmul_once_in_forward(outputs):
    """SFT's outputs (log-probabilities, entropy, is_top1 for the token accuracy) and DPO's with WPO weights
    (``use_weighting=True``: also mean_logits and log_sum_sq_probs, from the same row pass):
    one pass over the LM head, the scored tokens' logits once (tigon.workflows.matmul_count.head_matmuls, every 2-D
    matmul counted, the backbone's subtracted). The switch took log_sum_sq_probs from a second no-gradient pass at half
    the temperature before: 2 head matmuls."""
    from tigon.workflows.matmul_count import head_matmuls

    model = tiny_model()
    trl_utils.add_fused_lm_head(model, temperature=0.9, outputs=outputs)
    assert tigon_trl.patch_trainer(BareSFT(model), strict=True).ok
    ids = torch.randint(0, 256, (2, 12), device=DEVICE)
    labels = ids.clone()
    labels[0, :5] = -100
    scored, dims = int((labels[:, 1:] != -100).sum()), (model.config.hidden_size, V)
    out = []
    total = head_matmuls(lambda: out.append(model(input_ids=ids, labels=labels, fused_lm_head=True)), scored, *dims)
    backbone = head_matmuls(lambda: model.model(input_ids=ids, use_cache=False), scored, *dims)
    assert out[0].is_top1 is not None and out[0].is_top1.dtype == torch.bool
    if "log_sum_sq_probs" in outputs:
        sq = out[0].log_sum_sq_probs
        assert sq is not None and not sq.requires_grad and (sq[~out[0].label_mask] == 0).all()
    assert total - backbone == pytest.approx(1.0)


def test_fallbacks_warn_once_and_strict_raises():
    plain = tiny_model()  # no TRL fused head on it
    with pytest.warns(support.TigonFallbackWarning, match="add_fused_lm_head"):
        report = tigon_trl.patch_trainer(BareSFT(plain))
    assert not report.ok and report.fallbacks and "fallback" in str(report)
    with pytest.raises(support.UnsupportedError, match="add_fused_lm_head"):
        tigon_trl.patch_trainer(BareSFT(tiny_model()), strict=True)

    capped = tiny_model(final_logit_softcapping=3.0)  # mean_logits under a soft-cap: switched too (it fell back)
    trl_utils.add_fused_lm_head(capped, outputs=ALL_OUTPUTS)
    report = tigon_trl.patch_trainer(BareSFT(capped), strict=True)
    assert report.ok and "mean_logits" in report.switched[0] and "soft-cap 3)" in report.switched[0], str(report)

    with pytest.raises(TypeError, match="trainer must be one of"):
        tigon_trl.patch_trainer(object())
    with pytest.raises(ValueError, match="memory"):
        tigon_trl.patch_trainer(BareSFT(capped), memory="lots")


def test_moe_load_balancing_loss_is_reported_at_patch_time():
    """A trainer with ``aux_loss_enabled`` (an MoE policy, router_aux_loss_coef != 0) asks for router logits in every
    policy call, which run TRL's head: the report said "ok" until the first step, and strict=True raised only there."""
    model = tiny_model()
    trl_utils.add_fused_lm_head(model)
    trainer = BareSFT(model)
    trainer.aux_loss_enabled = True
    with pytest.warns(support.TigonFallbackWarning, match="router logits"):
        report = tigon_trl.patch_trainer(trainer)
    assert not report.ok and report.fallbacks == [f"model: {tigon_trl.trl_heads.ROUTER_LOGITS}"], str(report)
    strict = BareSFT(tiny_model())
    trl_utils.add_fused_lm_head(strict.model)
    strict.aux_loss_enabled = True
    with pytest.raises(support.UnsupportedError, match="router logits"):
        tigon_trl.patch_trainer(strict, strict=True)


def test_without_trl_the_switch_says_so(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "trl", None)  # as if TRL were not installed
    with pytest.raises(ImportError, match="needs TRL"):
        tigon_trl.patch_trainer(object())


def test_unpatch_restores_trls_head_and_patching_twice_is_a_no_op():
    model = tiny_model()
    trl_utils.add_fused_lm_head(model)
    trl_forward = model.forward
    trainer = BareSFT(model)
    report = tigon_trl.patch_trainer(trainer)
    assert report.ok and tigon_trl.is_switched(trainer) and model.forward != trl_forward
    assert tigon_trl.patch_trainer(trainer) is report and "already switched" in report.notes[-1]
    assert report.as_dict()["ok"] is True
    assert tigon_trl.unpatch_trainer(trainer) is True and model.forward == trl_forward
    assert not tigon_trl.is_switched(trainer) and tigon_trl.unpatch_trainer(trainer) is False


# ---- the trainers, ten steps each ------------------------------------------------------------------------------------


def test_sft_trainer_ten_steps(tmp_path):
    """Two micro-batches per step: TRL divides the summed per-token loss by num_items_in_batch, the scored tokens of
    the whole step; entropy and token accuracy come from the switched head's per-token values."""
    tok = byte_tokenizer()
    ds = datasets.Dataset.from_dict({"text": snippets(40, 24)})

    def run(switch):
        args = trl.SFTConfig(**common_args(tmp_path / str(switch), per_device_train_batch_size=2, max_length=16,
                                           gradient_accumulation_steps=2))
        trainer = trl.SFTTrainer(model=tiny_model(), args=args, train_dataset=ds, processing_class=tok)
        return train(trainer, switch)[0]

    assert_same_run(run(True), run(False), ("entropy", "mean_token_accuracy"))


def preference_data(n=20):
    prompts, chosen, rejected = snippets(n, 8), snippets(n, 8, start=4000), snippets(n, 12, start=9000)
    return datasets.Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected})


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_trainer_ten_steps_with_reference_model(tmp_path, loss_type):
    tok = byte_tokenizer()
    ds = preference_data()

    def run(switch):
        args = trl.DPOConfig(**common_args(tmp_path / str(switch), per_device_train_batch_size=2, max_length=24,
                                           loss_type=[loss_type], beta=0.1))
        trainer = trl.DPOTrainer(model=tiny_model(), ref_model=tiny_model(seed=1), args=args, train_dataset=ds,
                                 processing_class=tok)
        out, report = train(trainer, switch)
        if switch:
            assert any(s.startswith("ref_model:") for s in report.switched), str(report)
        return out

    assert_same_run(run(True), run(False), ("rewards/chosen", "rewards/margins", "logps/rejected", "logits/chosen",
                                            "mean_token_accuracy", "entropy"))


def test_dpo_reference_model_under_accelerates_mixed_precision(tmp_path):
    """bf16 mixed precision: accelerate's ``prepare_model`` wraps the reference model's forward (TRL's fused one,
    installed first) in autocast and fp32 outputs. The switch reads TRL's head through that wrapper, wraps Tigon's
    forward the same way, and unpatch_trainer restores both (found on an H100, where the reference model fell back to
    TRL's path with bf16 on)."""
    tok = byte_tokenizer()
    args = trl.DPOConfig(**common_args(tmp_path, per_device_train_batch_size=2, max_length=24, max_steps=2,
                                       beta=0.1, bf16=True))
    trainer = trl.DPOTrainer(model=tiny_model(), ref_model=tiny_model(seed=1), args=args,
                             train_dataset=preference_data(8), processing_class=tok)
    ref = trainer.ref_model
    if not tigon_trl.trl_heads.amp_wrapped(ref):
        pytest.skip("accelerate did not wrap the reference model's forward for mixed precision here")
    wrapped, original = ref.forward, ref._original_forward
    report = tigon_trl.patch_trainer(trainer, strict=True)
    assert any(s.startswith("ref_model:") for s in report.switched), str(report)
    assert hasattr(ref.forward.__func__, "__wrapped__")  # still under accelerate's autocast / fp32-outputs wrapper
    trainer.train()
    assert all(math.isfinite(h["loss"]) for h in trainer.state.log_history if "loss" in h)
    assert tigon_trl.unpatch_trainer(trainer) is True
    assert ref.forward == wrapped and ref._original_forward == original


def test_dpo_trainer_with_lora_and_no_reference_model(tmp_path):
    """PEFT LoRA without a reference model: TRL scores the reference through the policy with its adapters disabled,
    so through the policy's (switched) head. Four steps (CI time)."""
    peft = pytest.importorskip("peft")
    tok = byte_tokenizer()
    ds = preference_data()

    def run(switch):
        args = trl.DPOConfig(**common_args(tmp_path / str(switch), per_device_train_batch_size=2, max_length=24,
                                           loss_type=["sigmoid"], beta=0.1, learning_rate=1e-2, max_steps=4))
        torch.manual_seed(1)
        lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
        trainer = trl.DPOTrainer(model=tiny_model(), args=args, train_dataset=ds, processing_class=tok,
                                 peft_config=lora)
        out, report = train(trainer, switch)
        if switch:
            assert [s.split(":")[0] for s in report.switched] == ["model"], str(report)
        return out

    assert_same_run(run(True), run(False), ("rewards/chosen", "rewards/margins", "logps/rejected"), steps=4)


def test_dpo_precomputed_reference_is_reported_as_trls(tmp_path):
    """precompute_ref_log_probs=True: DPOTrainer.__init__ scores the training set with TRL's own head before
    patch_trainer can run; the report said "2 switched" and nothing else, as if the reference log-probabilities of
    the training were Tigon's. Now a note says which pass was TRL's."""
    args = trl.DPOConfig(**common_args(tmp_path, per_device_train_batch_size=2, max_length=24, max_steps=1,
                                       beta=0.1, precompute_ref_log_probs=True))
    support.backend_usage(reset=True)
    trainer = trl.DPOTrainer(model=tiny_model(), ref_model=tiny_model(seed=1), args=args,
                             train_dataset=preference_data(4), processing_class=byte_tokenizer())
    assert "ref_chosen_logps" in trainer.train_dataset.column_names
    assert not support.backend_usage()  # the precompute ran before the switch: TRL's head
    report = tigon_trl.patch_trainer(trainer, strict=True)
    assert report.ok and any(n.startswith("precompute_ref_log_probs: TRL computed") for n in report.notes), str(report)


def distinct_share(completions, **_):
    """A fake reward: the share of distinct characters in each completion."""
    return [len(set(text)) / max(len(text), 1) for text in completions]


def test_grpo_trainer_ten_steps_with_generation_and_kl(tmp_path, loss_type="dapo"):
    """Generation on CPU, a fake reward, the k3 KL to a reference model (beta 0.04), two optimisation passes per
    generation (importance ratios and clipping away from 1). One loss type: the switch computes the per-token
    log-probabilities and entropies, and every loss type is TRL's formula on them
    (test_fused_head_outputs_match_trls)."""
    tok = byte_tokenizer()
    tiny_model().save_pretrained(tmp_path / "policy")  # GRPO builds its reference model (beta > 0) from a path
    tok.save_pretrained(tmp_path / "policy")
    ds = datasets.Dataset.from_dict({"prompt": snippets(STEPS, 6)})

    def run(switch):
        args = trl.GRPOConfig(**common_args(tmp_path / str(switch), per_device_train_batch_size=4, num_generations=4,
                                            max_completion_length=6, beta=0.04, loss_type=loss_type,
                                            temperature=0.9, num_iterations=2))
        trainer = trl.GRPOTrainer(model=str(tmp_path / "policy"), reward_funcs=distinct_share, args=args,
                                  train_dataset=ds, processing_class=tok)
        out, report = train(trainer, switch)
        if switch:
            assert any(s.startswith("ref_model:") for s in report.switched), str(report)
        return out

    assert_same_run(run(True), run(False), ("kl", "entropy", "clip_ratio/region_mean"))


def chat_data(n):
    """(tokenizer with a chat template, n user / assistant conversations): GKD's data."""
    tok = byte_tokenizer()
    tok.chat_template = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}a:{% endif %}")
    ds = datasets.Dataset.from_dict({"messages": [
        [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        for q, a in zip(snippets(n, 8), snippets(n, 10, start=5000))]})
    return tok, ds


def gkd_trainer(out, student, teacher, data, **kw):
    """An off-policy (lmbda 0) GKDTrainer, beta 0.3, on ``data`` (:func:`chat_data`); ``kw``: GKDConfig's."""
    gkd = pytest.importorskip("trl.experimental.gkd")
    tok, ds = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-API and migration warnings of TRL
        args = gkd.GKDConfig(**common_args(out, per_device_train_batch_size=2, max_length=24, lmbda=0.0, beta=0.3,
                                           **kw))
        return gkd.GKDTrainer(model=student, teacher_model=teacher, args=args, train_dataset=ds, processing_class=tok)


def test_gkd_trainer_ten_steps(tmp_path):
    """GKD (off-policy, lmbda 0). The teacher's weights are drawn wider (initializer_range 0.5) so that the divergence
    is far from 0: at a JSD of 3e-3 (two near-uniform tiny models) TRL's own fp32 formula is 5e-5 off float64 by
    cancellation (Tigon's kernel 4e-7), more than the 1e-5 the runs are compared at."""
    data = chat_data(20)

    def run(switch):
        trainer = gkd_trainer(tmp_path / str(switch), tiny_model(), tiny_model(seed=1, initializer_range=0.5), data)
        out, report = train(trainer, switch)
        if switch:
            assert report.switched[0].startswith("compute_loss:"), str(report)
            batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
            with pytest.raises(support.UnsupportedError, match="return_outputs"):  # strict: no silent fallback
                trainer.compute_loss(trainer.model, batch, return_outputs=True)
            assert tigon_trl.unpatch_trainer(trainer) and "compute_loss" not in trainer.__dict__
        return out

    assert_same_run(run(True), run(False), ())


def test_gkd_trainer_under_bf16_mixed_precision_runs_the_backbones_under_autocast(tmp_path):
    """bf16=True: accelerate puts autocast around each prepared model's forward; the switched GKD loss calls the
    backbones directly, and ran them in float32 (the fp32 run's loss, 1e-3 away from TRL's bf16 one). Now it enters
    the trainer's autocast: the student backbone runs under it and two steps log TRL's bf16 losses."""
    data = chat_data(4)
    autocast_seen = []

    def run(switch):
        trainer = gkd_trainer(tmp_path / str(switch), tiny_model(), tiny_model(seed=1, initializer_range=0.5), data,
                              max_steps=2, bf16=True)
        if switch:
            assert tigon_trl.patch_trainer(trainer, strict=True).ok
            trainer.model.model.register_forward_hook(
                lambda *_: autocast_seen.append(torch.is_autocast_enabled(DEVICE)))
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h]

    got, ref = run(True), run(False)
    assert autocast_seen and all(autocast_seen), autocast_seen
    assert got == pytest.approx(ref, rel=1e-4), (got, ref)


# ---- more options and trainers, three steps each: on CUDA, or on CPU with TIGON_TRL_ALL=1 (about a minute) -------

OPTION_STEPS = 3
ALL = DEVICE == "cuda" or __import__("os").environ.get("TIGON_TRL_ALL") == "1"


def _sft(tmp, tok, switch, **kw):
    ds = datasets.Dataset.from_dict({"text": snippets(40, 24)})
    args = trl.SFTConfig(**common_args(tmp, per_device_train_batch_size=2, max_length=16, max_steps=OPTION_STEPS,
                                       **kw))
    return trl.SFTTrainer(model=tiny_model(), args=args, train_dataset=ds, processing_class=tok)


def _dpo(tmp, tok, switch, **kw):
    args = trl.DPOConfig(**common_args(tmp, per_device_train_batch_size=2, max_length=24, max_steps=OPTION_STEPS,
                                       beta=0.1, **kw))
    return trl.DPOTrainer(model=tiny_model(), ref_model=tiny_model(seed=1), args=args, train_dataset=preference_data(),
                          processing_class=tok)


def _online(cls, cfg):
    def build(tmp, tok, switch, **kw):
        if not (tmp.parent / "policy").exists():
            tiny_model().save_pretrained(tmp.parent / "policy")
            tok.save_pretrained(tmp.parent / "policy")
        args = cfg(**common_args(tmp, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                                 max_steps=OPTION_STEPS, **kw))
        return cls(model=str(tmp.parent / "policy"), reward_funcs=distinct_share, args=args,
                   train_dataset=datasets.Dataset.from_dict({"prompt": snippets(OPTION_STEPS * 2, 6)}),
                   processing_class=tok)
    return build


def _kto(tmp, tok, switch, model=tiny_model, **kw):
    n = 16
    ds = datasets.Dataset.from_dict({"prompt": snippets(n, 8), "completion": snippets(n, 10, start=3000),
                                     "label": [i % 2 == 0 for i in range(n)]})
    args = trl.KTOConfig(**common_args(tmp, per_device_train_batch_size=4, max_length=24, max_steps=OPTION_STEPS,
                                       **kw))
    return trl.KTOTrainer(model=model(), ref_model=model(seed=1), args=args, train_dataset=ds, processing_class=tok)


@pytest.mark.skipif(not ALL, reason="more TRL options: on CUDA, or on CPU with TIGON_TRL_ALL=1")
@pytest.mark.parametrize("build, options", [
    (_sft, dict(packing=True, padding_free=True)),
    (_sft, dict(loss_type="dft")),
    (_dpo, dict(use_weighting=True)),  # WPO: log_sum_sq_probs
    (_dpo, dict(precompute_ref_log_probs=True)),
    (_dpo, dict(ld_alpha=0.5, loss_type=["hinge"])),
    (_online(trl.GRPOTrainer, trl.GRPOConfig), dict(cast_lm_head_to_fp32=True, beta=0.04, loss_type="bnpo")),
    (_online(trl.GRPOTrainer, trl.GRPOConfig), dict(loss_type="sapo", temperature=0.8)),
    (_online(trl.RLOOTrainer, trl.RLOOConfig), dict(beta=0.04)),
    (_kto, dict()),
    (_dpo, dict(loss_type=["sigmoid", "hinge", "exo_pair", "nca_pair", "robust", "aot", "apo_down", "sft"],
                loss_weights=[1.0, 0.5, 0.3, 0.2, 0.1, 0.2, 0.3, 0.5], label_smoothing=0.1)),
    (_dpo, dict(f_divergence_type="js_divergence", sync_ref_model=True, ref_model_sync_steps=1)),
    (_online(trl.GRPOTrainer, trl.GRPOConfig), dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.04,
                                                    num_iterations=2, epsilon_high=0.3, mask_truncated_completions=True,
                                                    top_entropy_quantile=0.5)),
], ids=["sft-packing-padding-free", "sft-dft", "dpo-wpo", "dpo-precomputed-ref", "dpo-ld-alpha-hinge",
        "grpo-fp32-head-bnpo", "grpo-sapo", "rloo-kl", "kto", "dpo-weighted-loss-types", "dpo-js-sync-ref",
        "grpo-sequence-level"])
def test_more_trainer_options_three_steps(tmp_path, build, options):
    tok = byte_tokenizer()
    runs = [train(build(tmp_path / str(switch), tok, switch, **options), switch)[0] for switch in (True, False)]
    assert_same_run(*runs, (), steps=OPTION_STEPS)
