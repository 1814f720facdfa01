"""A patched mini Llama whose LM head is tensor parallel by vocabulary (``ColwiseParallel``), on N processes.

    torchrun --nproc-per-node 2 examples/tp_head_train.py        # CPU (gloo, kernels interpreted) or GPUs (NCCL)

Each rank holds V/N rows of ``lm_head.weight`` (a ``Shard(0)`` DTensor). The original head all-gathers the (tokens,
V) logits on every rank (``output_layouts=Replicate()``); the patched model's loss runs vocabulary-parallel
(:func:`tigon.functional.vocab_parallel_fused_linear_cross_entropy`): per token chunk, each rank's logits from its own
rows, the row max and sum-exp all-reduced, no logits gathered or kept. The ranks share the batch (tensor
parallelism); rank 0 prints the patch report and the loss.
"""

from __future__ import annotations

import argparse
import os

import _tiny  # noqa: F401  (sets TRITON_INTERPRET on CPU before tigon is imported)
import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

import tigon


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dist.get_world_size(),))

    torch.manual_seed(0)  # the same weights on every rank before sharding
    model = transformers.AutoModelForCausalLM.from_config(_tiny.tiny_config("llama")).to(_tiny.DEVICE).train()
    parallelize_module(model, mesh, {"lm_head": ColwiseParallel(output_layouts=Replicate())})
    report = tigon.patch(model)  # the head's loss: vocabulary-parallel
    if dist.get_rank() == 0:
        print(report)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step, ids in enumerate(_tiny.byte_batches(args.steps, seed=0)):  # the same batches on every rank
        loss = model(input_ids=ids, labels=ids).loss  # identical on every rank
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print(f"step {step}  loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
