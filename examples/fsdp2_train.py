"""A patched mini Llama trained with FSDP2 (``torch.distributed.fsdp.fully_shard``) on N processes.

    torchrun --nproc-per-node 2 examples/fsdp2_train.py               # CPU (gloo, kernels interpreted) or GPUs (NCCL)
    torchrun --nproc-per-node 8 examples/fsdp2_train.py --head root   # LM head inside the root unit

Wraps the model as torchtitan does: each decoder layer its own unit, the final norm and the LM head one unit
(``--head group``; ``unit``: the head alone; ``root``: both in the root unit), then the root. ``tigon.patch`` runs
before wrapping (after works too); the fused LM-head loss reads the head's weight inside its unit's FSDP hooks, so
it is gathered once by FSDP and the gradient is reduce-scattered as usual. Each rank trains on its own text; rank 0
prints the patch report and the loss averaged over the ranks.
"""

from __future__ import annotations

import argparse
import os

import _tiny  # noqa: F401  (sets TRITON_INTERPRET on CPU before tigon is imported)
import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import tigon


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--head", choices=("group", "unit", "root"), default="group",
                   help="FSDP2 unit of the LM head: with the final norm (torchtitan), alone, or the root's")
    p.add_argument("--bf16", action="store_true", help="MixedPrecisionPolicy(param_dtype=torch.bfloat16)")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    mesh = init_device_mesh("cuda" if cuda else "cpu", (dist.get_world_size(),))

    torch.manual_seed(0)  # the same weights on every rank before sharding
    model = transformers.AutoModelForCausalLM.from_config(_tiny.tiny_config("llama")).to(_tiny.DEVICE).train()
    report = tigon.patch(model)
    if rank == 0:
        print(report)

    fsdp = {"mesh": mesh}
    if args.bf16:
        fsdp["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, **fsdp)
    if args.head == "group":
        fully_shard([model.model.norm, model.lm_head], **fsdp)
    elif args.head == "unit":
        fully_shard(model.lm_head, **fsdp)
    fully_shard(model, **fsdp)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step, ids in enumerate(_tiny.byte_batches(args.steps, seed=rank)):  # each rank its own batches
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)  # a sum (gloo has no average)
        if rank == 0:
            print(f"step {step}  loss {total.item() / dist.get_world_size():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
