"""tigon.integrations.trl.patch_trainer on Gemma 2 (a final-logit soft-cap): the switch is active, not skipped, and
TRL's trainers with and without it give the same losses, metrics and weights.

Tiny fp32 Gemma 2 models built from a config (no downloads: two layers, one sliding, one full; tied embeddings; the
final-logit soft-cap 3, with weights drawn wide enough (initializer_range 0.3, logits of std ~1.8) that the cap bends
the logits, where Gemma 2's 30 would leave a tiny model's logits as they are), the byte-level tokenizer and data of
tests/test_trl_switch.py. DPO asks TRL's fused head for ``mean_logits`` (its ``logits/*`` metrics), which the switch
computed only without a soft-cap; GKD's loss needs both models' capped logits, which the fused JSD did not take.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")

from test_trl_switch import (  # noqa: E402
    ALL, DEVICE, OPTION_STEPS, V, _kto, assert_same_run, byte_tokenizer, chat_data, common_args, gkd_trainer,
    preference_data, tiny_model, train,
)

from tigon import support  # noqa: E402
from tigon.integrations import trl as tigon_trl  # noqa: E402

SOFTCAP = 3.0


def gemma2(seed=0, **overrides):
    """A tiny fp32 Gemma 2 causal LM (the shapes of test_trl_switch's Llama), soft-cap ``SOFTCAP``."""
    cfg = transformers.Gemma2Config(**{
        **dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
               head_dim=16, vocab_size=V, max_position_embeddings=64, sliding_window=8, pad_token_id=256,
               bos_token_id=None, eos_token_id=257, final_logit_softcapping=SOFTCAP, initializer_range=0.3),
        **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.Gemma2ForCausalLM(cfg).float().to(DEVICE)


def test_dpo_trainer_on_gemma2(tmp_path):
    """Both heads (policy and reference) switched, with DPO's mean_logits under the soft-cap: the same losses,
    rewards, logits/* metrics (the capped logits' vocabulary mean), token accuracy, entropy and weights."""
    tok = byte_tokenizer()
    ds = preference_data()

    def run(switch):
        args = trl.DPOConfig(**common_args(tmp_path / str(switch), per_device_train_batch_size=2, max_length=24,
                                           loss_type=["sigmoid"], beta=0.1))
        trainer = trl.DPOTrainer(model=gemma2(), ref_model=gemma2(seed=1), args=args, train_dataset=ds,
                                 processing_class=tok)
        out, report = train(trainer, switch)  # strict: report.ok, Tigon's kernels ran
        if switch:
            assert [s.split(":")[0] for s in report.switched] == ["model", "ref_model"], str(report)
            # the policy's head asked for mean_logits (the reference's for log_probs alone); both capped
            assert "mean_logits" in report.switched[0] and all("soft-cap 3)" in s for s in report.switched), str(report)
        return out

    assert_same_run(run(True), run(False), ("rewards/chosen", "rewards/margins", "logps/rejected", "logits/chosen",
                                            "logits/rejected", "mean_token_accuracy", "entropy"))


def test_gkd_trainer_on_gemma2(tmp_path):
    """Student and teacher Gemma 2 (the teacher wider, as in test_trl_switch's GKD test): the fused JSD with both
    soft-caps gives TRL's losses on the models' capped logits, and the same weights."""
    data = chat_data(20)

    def run(switch):
        trainer = gkd_trainer(tmp_path / str(switch), gemma2(), gemma2(seed=1, initializer_range=0.5), data)
        out, report = train(trainer, switch)
        if switch:
            assert len(report.switched) == 1 and report.switched[0].startswith("compute_loss:"), str(report)
            assert "student soft-cap 3, teacher soft-cap 3" in report.switched[0], str(report)
        return out

    assert_same_run(run(True), run(False), ())


def test_gkd_with_one_soft_capped_model_is_switched_at_patch_time(tmp_path):
    """A soft-capped student or teacher beside an uncapped one (a Gemma 2 distilled into a Llama of its vocabulary):
    switched, each model's cap named (it fell back at patch time, strict=True raised); the loss equals TRL's on the
    models' own logits (the Llama's uncapped, the Gemma's capped) for one batch."""
    tok, ds = chat_data(4)
    for student, teacher, cap in ((gemma2(), tiny_model(), "student"), (tiny_model(), gemma2(seed=1), "teacher")):
        trainer = gkd_trainer(tmp_path / cap, student, teacher, (tok, ds), max_steps=1)
        batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        with torch.no_grad():
            want = trainer.compute_loss(trainer.model, batch)
        support.backend_usage(reset=True)
        report = tigon_trl.patch_trainer(trainer, strict=True)
        assert report.ok and f"{cap} soft-cap 3)" in report.switched[0], str(report)
        with torch.no_grad():
            got = trainer.compute_loss(trainer.model, batch)
        assert support.backend_usage()["fused_linear_jsd"] == {("triton" if DEVICE == "cuda" else "interpreter"): 1}
        torch.testing.assert_close(got, want, rtol=1e-5, atol=0)


@pytest.mark.skipif(not ALL, reason="more TRL trainers: on CUDA, or on CPU with TIGON_TRL_ALL=1")
def test_kto_trainer_on_gemma2_three_steps(tmp_path):
    """KTO asks for mean_logits too (its logits/* metrics)."""
    tok = byte_tokenizer()
    runs = [train(_kto(tmp_path / str(switch), tok, switch, model=gemma2), switch)[0] for switch in (True, False)]
    assert_same_run(*runs, ("logits/chosen",), steps=OPTION_STEPS)
