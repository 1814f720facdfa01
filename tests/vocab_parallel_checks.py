"""The vocabulary-parallel checks of tests/distributed_worker.py (run on every rank of its gloo launch).

``functional``: :func:`tigon.functional.vocab_parallel_cross_entropy` and the fused linear variant, each rank holding
its columns of the logits (plain shard with ``vocab_start``, and a ``Shard(1)`` DTensor) or its rows of the head (a
``Shard(0)`` DTensor weight and bias, and a plain shard whose vocabulary size is found by an all-reduce), against the
float64 reference on the whole tensors: the loss and every gradient (each rank's shard of the logits' / weight's /
bias's, the hidden states' whole) within 1e-5. V = 37 classes: unequal shards.

A model trained with a vocabulary-parallel head: tests/tensor_parallel_checks.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from tigon import functional as F
from tigon.reference.cross_entropy import cross_entropy as ref_ce
from tigon.reference.fused_linear_cross_entropy import fused_linear_cross_entropy as ref_flce

N, V, H = 6, 37, 8
OPTIONS = ({"reduction": "sum", "label_smoothing": 0.2, "lse_square_scale": 1e-2, "softcap": 3.0},
           {"reduction": "none", "label_smoothing": 0.1})  # mean, each option alone: tests/test_vocab_parallel.py


def _close(got, want, what: str) -> float:
    got, want = (got.full_tensor() if isinstance(got, DTensor) else got).detach(), want.detach()
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")
    return float((got.double() - want.double()).abs().max())


def _upstream(ref):
    g = torch.Generator().manual_seed(7)  # the same on every rank
    return torch.randn(ref.shape, generator=g, dtype=ref.dtype) if ref.dim() else torch.tensor(1.5, dtype=ref.dtype)


def functional() -> str:
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)  # the same whole tensors on every rank
    logits = torch.randn(N, V, generator=g) * 3
    hidden, weight = torch.randn(N, H, generator=g), torch.randn(V, H, generator=g) / 2
    bias = torch.randn(V, generator=g)
    target = torch.randint(0, V, (N,), generator=g)
    target[1] = -100
    cuts = [int(c[0]) for c in torch.arange(V).tensor_split(world)] + [V]
    worst = 0.0
    for kw in OPTIONS:
        x64 = logits.double().requires_grad_()
        want = ref_ce(x64, target, **kw)
        up = _upstream(want)
        (want * up).sum().backward()
        # this rank's plain columns
        mine = logits[:, cuts[rank]:cuts[rank + 1]].clone().requires_grad_()
        loss = F.vocab_parallel_cross_entropy(mine, target, vocab_start=cuts[rank], **kw)
        (loss * up.float()).sum().backward()
        worst = max(worst, _close(loss, want, f"{kw} loss"),
                    _close(mine.grad, x64.grad[:, cuts[rank]:cuts[rank + 1]], f"{kw} grad of the shard"))
        # a DTensor sharded on the vocabulary
        d = distribute_tensor(logits, mesh, [Shard(1)]).requires_grad_()
        loss = F.vocab_parallel_cross_entropy(d, target, **kw)
        (loss * up.float()).sum().backward()
        worst = max(worst, _close(loss, want, f"{kw} DTensor loss"), _close(d.grad, x64.grad, f"{kw} DTensor grad"))
        # the fused head: DTensor weight and bias (ColwiseParallel), plain hidden states
        h64, w64, b64 = (t.double().requires_grad_() for t in (hidden, weight, bias))
        want = ref_flce(h64, w64, target, b64, **kw)
        (want * up).sum().backward()
        # hidden plain, or (reduction="none") sequence parallel: a Shard(0) DTensor, all-gathered first
        h = (distribute_tensor(hidden, mesh, [Shard(0)]) if kw.get("reduction") == "none" else hidden.clone())
        h.requires_grad_()
        dw = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()
        db = distribute_tensor(bias, mesh, [Shard(0)]).requires_grad_()
        loss = F.vocab_parallel_fused_linear_cross_entropy(h, dw, target, db, **kw)
        (loss * up.float()).sum().backward()
        worst = max(worst, _close(loss, want, f"{kw} fused loss"), _close(h.grad, h64.grad, f"{kw} grad hidden"),
                    _close(dw.grad, w64.grad, f"{kw} grad weight"), _close(db.grad, b64.grad, f"{kw} grad bias"))
    # the fused head from a plain shard, the vocabulary size found by an all-reduce (label smoothing needs it)
    w = weight[cuts[rank]:cuts[rank + 1]]
    loss = F.vocab_parallel_fused_linear_cross_entropy(hidden, w, target, vocab_start=cuts[rank], **kw)
    worst = max(worst, _close(loss, ref_flce(hidden.double(), weight.double(), target, **kw), "fused, plain shard"))
    return f"max abs diff {worst:.1e}"
