"""TRL's DPOTrainer (or SFTTrainer) with Tigon's fused LM-head kernels, switched on by one call.

    python examples/trl_switch.py --steps 4 [--trainer sft] [--loss-type ipo] [--no-switch]
    python examples/trl_switch.py --trainer dpo --hidden 2048 --vocab 128256 --layers 2 --seq 1024 --batch 4 --steps 20

Builds a Llama policy and reference model (random weights, no download; tiny by default, or the sizes given) and a
byte-level tokenizer, trains on snippets of ``pydoc_data.topics``, and prints what
``tigon.integrations.trl.patch_trainer`` switched, the last logged metrics (all of TRL's, computed from Tigon's
per-token log-probabilities), the steps per second after the first step, and on CUDA the peak memory. Run it with and
without ``--no-switch`` to compare with TRL's own chunked LM head. With ``--vocab`` above 258 the token ids stay bytes
(0..255); the larger vocabulary only sizes the LM head.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import _tiny
import datasets
import torch
import transformers
import trl

from tigon import data, support
from tigon.integrations.trl import patch_trainer


class _StepClock(transformers.TrainerCallback):
    """Wall time of the steps after the first (compilation, warm-up)."""

    def __init__(self):
        self.start, self.steps = None, 0

    def on_step_end(self, args, state, control, **kw):
        if _tiny.DEVICE == "cuda":
            torch.cuda.synchronize()
        if self.start is None:
            self.start = time.perf_counter()
        else:
            self.steps += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trainer", choices=("dpo", "sft"), default="dpo")
    p.add_argument("--loss-type", default="sigmoid", help="a DPO loss type of TRL (sigmoid, ipo, hinge, ...)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--no-switch", action="store_true", help="TRL's own LM head (the baseline)")
    p.add_argument("--hidden", type=int, default=None)
    p.add_argument("--vocab", type=int, default=None)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--seq", type=int, default=48, help="max_length (tokens per sequence, prompt included)")
    p.add_argument("--batch", type=int, default=2)
    args = p.parse_args()

    sizes = {}
    if args.hidden:
        heads = max(args.hidden // 128, 1)
        sizes.update(hidden_size=args.hidden, intermediate_size=args.hidden * 7 // 2, num_attention_heads=heads,
                     num_key_value_heads=max(heads // 4, 1), head_dim=args.hidden // heads)
    if args.vocab:
        sizes.update(vocab_size=max(args.vocab, 258))
    if args.layers:
        sizes.update(num_hidden_layers=args.layers)
    sizes.update(max_position_embeddings=max(256, args.seq))
    tok = _tiny.byte_tokenizer()
    torch.manual_seed(0)
    policy = transformers.AutoModelForCausalLM.from_config(_tiny.tiny_config(**sizes)).to(_tiny.DEVICE)
    text = data.corpus_text()
    n_chars = args.seq  # one byte token per character
    snip = [text[i * n_chars:(i + 1) * n_chars] for i in range(max(64, args.batch * (args.steps + 1)))]
    clock = _StepClock()
    common = dict(max_steps=args.steps, per_device_train_batch_size=args.batch, logging_steps=1, report_to=[],
                  save_strategy="no", use_cpu=_tiny.DEVICE == "cpu", bf16=_tiny.DEVICE == "cuda",
                  max_length=args.seq)
    with tempfile.TemporaryDirectory() as out:
        if args.trainer == "dpo":
            ref = transformers.AutoModelForCausalLM.from_config(_tiny.tiny_config(**sizes)).to(_tiny.DEVICE)
            third = n_chars // 3
            ds = datasets.Dataset.from_dict({"prompt": [s[:third] for s in snip],
                                             "chosen": [s[third:2 * third] for s in snip],
                                             "rejected": [s[2 * third:] for s in snip]})
            cfg = trl.DPOConfig(output_dir=out, loss_type=[args.loss_type], **common)
            trainer = trl.DPOTrainer(model=policy, ref_model=ref, args=cfg, train_dataset=ds, processing_class=tok,
                                     callbacks=[clock])
        else:
            ds = datasets.Dataset.from_dict({"text": snip})
            cfg = trl.SFTConfig(output_dir=out, **common)
            trainer = trl.SFTTrainer(model=policy, args=cfg, train_dataset=ds, processing_class=tok,
                                     callbacks=[clock])
        print("TRL's own LM head (--no-switch)" if args.no_switch else patch_trainer(trainer))
        support.backend_usage(reset=True)
        if _tiny.DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        elapsed = time.perf_counter() - clock.start if clock.start is not None else float("nan")
    print("last step:", {k: v for k, v in trainer.state.log_history[-2].items()})
    if clock.steps:
        print(f"steps/s after the first: {clock.steps / elapsed:.3f} ({clock.steps} steps)")
    if _tiny.DEVICE == "cuda":
        print(f"peak CUDA memory: {torch.cuda.max_memory_allocated() / 2**30:.3f} GiB")
    print("Tigon ops that ran (op: {backend: calls}):", support.backend_usage())


if __name__ == "__main__":
    main()
