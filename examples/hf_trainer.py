"""The Hugging Face Trainer on a Tigon-patched model: nothing changes but the model construction.

    python examples/hf_trainer.py --steps 4
    torchrun --nproc-per-node 2 examples/hf_trainer.py                                 # DDP (GPUs, or CPU: gloo)
    accelerate launch --config_file examples/configs/fsdp2.yaml examples/hf_trainer.py  # FSDP2 (GPUs)
    torchrun --nproc-per-node 2 examples/hf_trainer.py --deepspeed examples/configs/zero3.json  # ZeRO-3 (GPUs)
    deepspeed --num_gpus 2 examples/hf_trainer.py --deepspeed examples/configs/zero3.json   # DeepSpeed's launcher
    ... --original                                                # the unpatched model: compare the logged losses

Several processes: the Trainer (through accelerate) wraps the model as the launcher's settings or ``--deepspeed``
say; ``tigon.patch`` ran before, at construction. accelerate runs FSDP and DeepSpeed only on GPU-like devices: on a
CPU-only machine the FSDP config trains under DDP (this script says so) and a DeepSpeed run counts one process
per rank (each rank would train on the same batches), so run those two on GPUs
(tests/test_trainer_distributed.py runs them on CPU ranks with test-only shims).

The Trainer passes ``num_items_in_batch`` for gradient accumulation; the fused LM-head loss honours it exactly as
transformers' own causal-LM loss does.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import _tiny
import torch
import transformers

import tigon


def parse_args(argv=None) -> argparse.Namespace:
    """The command line; ``--local_rank`` (the ``deepspeed`` launcher passes it) sets ``LOCAL_RANK`` where the
    launcher did not, which the Trainer reads."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="llama")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=2)
    p.add_argument("--deepspeed", metavar="JSON", help="a DeepSpeed config (TrainingArguments(deepspeed=...))")
    p.add_argument("--original", action="store_true", help="the unpatched model (the losses to compare)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None,
                   help="this process's GPU on its node (set by the deepspeed launcher; torchrun sets LOCAL_RANK)")
    args = p.parse_args(argv)
    if args.local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    return args


def main():
    args = parse_args()

    torch.manual_seed(0)  # the same weights on every rank
    auto = transformers.AutoModelForCausalLM if args.original else tigon.AutoModelForCausalLM
    model = auto.from_config(_tiny.tiny_config(args.family))
    rank0 = int(os.environ.get("RANK", 0)) == 0
    if rank0 and not args.original:
        print(model.tigon_report)

    rows = [{"input_ids": b[0], "labels": b[0].clone()} for b in _tiny.byte_batches(64, batch_size=1, seq_len=32)]
    with tempfile.TemporaryDirectory() as out:
        targs = transformers.TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=2,
            gradient_accumulation_steps=args.grad_accum, learning_rate=3e-3, logging_steps=1, report_to=[],
            save_strategy="no", use_cpu=_tiny.DEVICE == "cpu" and not args.deepspeed, dataloader_num_workers=0,
            deepspeed=args.deepspeed)
        trainer = transformers.Trainer(model=model, args=targs, train_dataset=rows)
        if rank0 and os.environ.get("ACCELERATE_USE_FSDP", "false") == "true" and not trainer.is_fsdp_enabled:
            print("note: accelerate runs FSDP on GPUs only; on this machine the Trainer uses "
                  f"{trainer.accelerator.distributed_type.value}")
        trainer.train()
    if trainer.is_world_process_zero():
        print(f"{trainer.accelerator.num_processes} process(es), model wrapped as "
              f"{type(trainer.model_wrapped).__name__}")
        for h in trainer.state.log_history:
            if "loss" in h:  # averaged over the processes by the Trainer
                print(f"step {h['step']}: loss {h['loss']:.4f}")


if __name__ == "__main__":
    main()
