"""TRL's DPOTrainer (or SFTTrainer) with Tigon's fused LM-head kernels, switched on by one call.

    python examples/trl_switch.py --steps 4 [--trainer sft] [--loss-type ipo]

Builds a tiny Llama policy and reference model (random weights, no download) and a byte-level tokenizer, trains on
snippets of ``pydoc_data.topics``, and prints what ``tigon.integrations.trl.patch_trainer`` switched and the last
logged metrics (all of TRL's, computed from Tigon's per-token log-probabilities).
"""

from __future__ import annotations

import argparse
import tempfile

import _tiny
import datasets
import torch
import transformers
import trl

from tigon import data, support
from tigon.integrations.trl import patch_trainer


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainer", choices=("dpo", "sft"), default="dpo")
    p.add_argument("--loss-type", default="sigmoid", help="a DPO loss type of TRL (sigmoid, ipo, hinge, ...)")
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()

    tok = _tiny.byte_tokenizer()
    torch.manual_seed(0)
    policy = transformers.AutoModelForCausalLM.from_config(_tiny.tiny_config()).to(_tiny.DEVICE)
    text = data.corpus_text()
    snip = [text[i * 40:(i + 1) * 40] for i in range(32)]
    common = dict(max_steps=args.steps, per_device_train_batch_size=2, logging_steps=1, report_to=[],
                  save_strategy="no", use_cpu=_tiny.DEVICE == "cpu", bf16=_tiny.DEVICE == "cuda")
    with tempfile.TemporaryDirectory() as out:
        if args.trainer == "dpo":
            ref = transformers.AutoModelForCausalLM.from_config(_tiny.tiny_config()).to(_tiny.DEVICE)
            ds = datasets.Dataset.from_dict({"prompt": [s[:12] for s in snip], "chosen": [s[12:26] for s in snip],
                                             "rejected": [s[26:] for s in snip]})
            cfg = trl.DPOConfig(output_dir=out, max_length=48, loss_type=[args.loss_type], **common)
            trainer = trl.DPOTrainer(model=policy, ref_model=ref, args=cfg, train_dataset=ds, processing_class=tok)
        else:
            ds = datasets.Dataset.from_dict({"text": snip})
            cfg = trl.SFTConfig(output_dir=out, max_length=32, **common)
            trainer = trl.SFTTrainer(model=policy, args=cfg, train_dataset=ds, processing_class=tok)
        print(patch_trainer(trainer))
        support.backend_usage(reset=True)
        trainer.train()
    print("last step:", {k: v for k, v in trainer.state.log_history[-2].items()})
    print("Tigon ops that ran (op: {backend: calls}):", support.backend_usage())


if __name__ == "__main__":
    main()
