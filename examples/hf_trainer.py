"""The Hugging Face Trainer on a Tigon-patched model: nothing changes but the model construction.

    python examples/hf_trainer.py --steps 4

The Trainer passes ``num_items_in_batch`` for gradient accumulation; the fused LM-head loss honours it exactly as
transformers' own causal-LM loss does.
"""

from __future__ import annotations

import argparse
import tempfile

import _tiny
import torch
import transformers

import tigon


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="llama")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=2)
    args = p.parse_args()

    torch.manual_seed(0)
    model = tigon.AutoModelForCausalLM.from_config(_tiny.tiny_config(args.family))
    print(model.tigon_report)

    rows = [{"input_ids": b[0], "labels": b[0].clone()} for b in _tiny.byte_batches(64, batch_size=1, seq_len=32)]
    with tempfile.TemporaryDirectory() as out:
        targs = transformers.TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=2,
            gradient_accumulation_steps=args.grad_accum, learning_rate=3e-3, logging_steps=1, report_to=[],
            save_strategy="no", use_cpu=_tiny.DEVICE == "cpu", dataloader_num_workers=0)
        trainer = transformers.Trainer(model=model, args=targs, train_dataset=rows)
        trainer.train()
    for h in trainer.state.log_history:
        if "loss" in h:
            print(f"step {h['step']}: loss {h['loss']:.4f}")


if __name__ == "__main__":
    main()
