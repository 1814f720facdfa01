"""TRL's SFTTrainer on a Tigon-patched model (optionally with LoRA), on plain text with a byte-level tokenizer.

    python examples/trl_sft.py --steps 4 [--lora]

Recent TRL installs its own chunked LM head on the model for SFT (it needs per-token log-probabilities, entropy and
accuracy, not just the loss), so there Tigon's fused LM-head loss is bypassed; Tigon's RMSNorm, gated-MLP and rotary
kernels still run inside the model. Older TRL computes those metrics from ``outputs.logits``, which Tigon's fused
loss does not materialise: patch with ``fused_linear_cross_entropy=False`` there (done below automatically). With
``--lora`` the trainer wraps the patched model with ``get_peft_model``, whose LoRA layers did not exist at the first
patch: the script patches ``trainer.model`` again so that they run Tigon's LoRA ops (``lora_linear``, ...).
"""

from __future__ import annotations

import argparse
import importlib
import tempfile

import _tiny
import datasets
import torch
import trl

import tigon
from tigon import data, support


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="llama")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lora", action="store_true")
    args = p.parse_args()

    tok = _tiny.byte_tokenizer()
    trl_fused_head = hasattr(importlib.import_module("trl.trainer.sft_trainer"), "add_fused_lm_head")
    torch.manual_seed(0)
    model = tigon.AutoModelForCausalLM.from_config(_tiny.tiny_config(args.family),
                                                   fused_linear_cross_entropy=trl_fused_head)
    print(model.tigon_report)

    text = data.corpus_text()
    ds = datasets.Dataset.from_dict({"text": [text[i * 200:(i + 1) * 200] for i in range(64)]})
    peft_config = None
    if args.lora:
        import peft

        peft_config = peft.LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as out:
        sft = trl.SFTConfig(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=2, max_length=32, logging_steps=1,
            report_to=[], save_strategy="no", use_cpu=_tiny.DEVICE == "cpu", learning_rate=3e-3,
            bf16=_tiny.DEVICE == "cuda")
        trainer = trl.SFTTrainer(model=model, args=sft, train_dataset=ds, processing_class=tok,
                                 peft_config=peft_config)
        if args.lora:  # the trainer wrapped the patched model with get_peft_model: patch again for its LoRA layers
            print(tigon.patch(trainer.model))
        support.backend_usage(reset=True)
        trainer.train()
    print("Tigon ops that ran (op: {backend: calls}):", support.backend_usage())


if __name__ == "__main__":
    main()
