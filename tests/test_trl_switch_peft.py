"""tigon.integrations.trl.patch_trainer with PEFT models the switch cannot take: said, not trained silently.

GKD's switched loss calls each model's backbone and LM head directly (tigon.integrations.trl_heads.gkd_loss). A PEFT
prompt-learning model (prompt tuning, prefix tuning, P-tuning) adds its virtual tokens in the PEFT model's own
forward, which that call skips: the switch reported "ok" under strict=True and trained nothing (the soft prompt got
no gradient, grad_norm 0 at every step). Now such a student or teacher falls back at patch time (TRL's own
compute_loss, which is what runs; strict=True raises). Tiny fp32 Llama models and data of tests/test_trl_switch.py.
"""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")
peft = pytest.importorskip("peft")

from test_trl_switch import chat_data, common_args, tiny_model  # noqa: E402

from tigon import support  # noqa: E402
from tigon.integrations import trl as tigon_trl  # noqa: E402


def _gkd(out, data, student, teacher, peft_config=None):
    gkd = pytest.importorskip("trl.experimental.gkd")
    tok, ds = data
    args = gkd.GKDConfig(**common_args(out, per_device_train_batch_size=2, max_length=24, lmbda=0.0, beta=0.3,
                                       max_steps=1))
    return gkd.GKDTrainer(model=student, teacher_model=teacher, args=args, train_dataset=ds, processing_class=tok,
                          peft_config=peft_config)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")
def test_gkd_with_a_prompt_learning_student_or_teacher_falls_back(tmp_path):
    data = chat_data(4)
    prompt = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3)
    student = _gkd(tmp_path / "s", data, tiny_model(), tiny_model(seed=1), peft_config=prompt)
    with pytest.raises(support.UnsupportedError, match="prompt learning"):
        tigon_trl.patch_trainer(student, strict=True)
    with pytest.warns(support.TigonFallbackWarning, match="student: PEFT prompt learning"):
        report = tigon_trl.patch_trainer(student)
    assert not report.ok and not report.switched and "compute_loss" not in student.__dict__, str(report)

    prefix_teacher = peft.get_peft_model(tiny_model(seed=1), peft.PrefixTuningConfig(
        task_type="CAUSAL_LM", num_virtual_tokens=2))
    teacher = _gkd(tmp_path / "t", data, tiny_model(), prefix_teacher)
    with pytest.raises(support.UnsupportedError, match="teacher: PEFT prompt learning"):
        tigon_trl.patch_trainer(teacher, strict=True)

    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    assert tigon_trl.patch_trainer(_gkd(tmp_path / "l", data, tiny_model(), tiny_model(seed=1), lora), strict=True).ok
