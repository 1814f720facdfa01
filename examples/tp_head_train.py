"""A patched mini Llama whose LM head is tensor parallel by vocabulary (``ColwiseParallel``), on N processes.

    torchrun --nproc-per-node 2 examples/tp_head_train.py        # CPU (gloo, kernels interpreted) or GPUs (NCCL)
    torchrun --nproc-per-node 2 examples/tp_head_train.py --plan model          # the whole decoder: torch's TP plan
    torchrun --nproc-per-node 2 examples/tp_head_train.py --plan sequence-parallel
    torchrun --nproc-per-node 2 examples/tp_head_train.py --plan transformers   # transformers' own model.tp_plan
    torchrun --nproc-per-node 2 examples/tp_head_train.py --plan model --original  # unpatched: the same losses

``--plan``: ``head`` (the default) splits only the head; ``model`` also splits every decoder layer (colwise q/k/v,
gate/up; rowwise o/down; the embedding rowwise); ``sequence-parallel`` adds ``SequenceParallel`` norms (the
residual stream split over the tokens, which Tigon's norms take as local shards); ``transformers`` applies
transformers' own ``tp_plan`` styles (transformers 5.x, as ``from_pretrained(tp_plan="auto")`` applies them).

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
from tigon.integrations.tp_plan import apply_decoder_tp


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--plan", choices=("head", "model", "sequence-parallel", "transformers"), default="head")
    p.add_argument("--original", action="store_true", help="do not patch (the same steps' losses, to compare)")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dist.get_world_size(),))

    torch.manual_seed(0)  # the same weights on every rank before sharding
    model = transformers.AutoModelForCausalLM.from_config(_tiny.tiny_config("llama")).to(_tiny.DEVICE).train()
    if args.plan == "transformers":
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism  # transformers 5.x

        apply_tensor_parallelism(model, mesh, model._expand_parallel_plan(model.tp_plan))
    elif args.plan == "head":
        parallelize_module(model, mesh, {"lm_head": ColwiseParallel(output_layouts=Replicate())})
    else:  # torch's plan for the whole decoder (tigon.integrations.tp_plan.decoder_tp_plan, applied)
        apply_decoder_tp(model, mesh, sequence_parallel=args.plan == "sequence-parallel")
    if not args.original:
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
    dist.barrier()  # every rank's collectives done (async ones of the sequence-parallel plan too) before teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
