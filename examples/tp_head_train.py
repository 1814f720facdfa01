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
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

import tigon


def plan(model, kind: str) -> dict:
    """torch's tensor-parallel plan ``kind`` for a Llama (module docstring)."""
    if kind == "head":
        return {"lm_head": ColwiseParallel(output_layouts=Replicate())}
    sp = kind == "sequence-parallel"
    into = {"input_layouts": Shard(1)} if sp else {}  # the layer's input arrives split over the tokens
    back = {"output_layouts": Shard(1), "use_local_output": False} if sp else {}
    out = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), **back),
           "lm_head": ColwiseParallel(output_layouts=Replicate(), **into)}
    if sp:
        out["model.norm"] = SequenceParallel()
    for i in range(len(model.model.layers)):
        p = f"model.layers.{i}."
        out.update({p + f"self_attn.{n}_proj": ColwiseParallel(**into) for n in "qkv"})
        out.update({p + f"mlp.{n}_proj": ColwiseParallel(**into) for n in ("gate", "up")})
        out.update({p + "self_attn.o_proj": RowwiseParallel(**back), p + "mlp.down_proj": RowwiseParallel(**back)})
        if sp:
            out.update({p + "input_layernorm": SequenceParallel(), p + "post_attention_layernorm": SequenceParallel()})
    return out


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
    else:
        parallelize_module(model, mesh, plan(model, args.plan))
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
