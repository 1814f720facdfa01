"""One rank of tests/test_dtensor.py: the row-wise ops on DTensors against the same ops on whole plain tensors.

Run by the test as WORLD_SIZE processes (gloo on the CPU, or one NCCL rank on a GPU): ``python dtensor_worker.py``
with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TIGON_TEST_DEVICE set. Prints ``OK <checks>`` on success.
"""

import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import ranks  # noqa: E402
from tigon import functional as F  # noqa: E402

DEVICE = os.environ.get("TIGON_TEST_DEVICE", "cpu")
checks = 0


def _close(a, b, what):
    global checks
    a = a.full_tensor() if isinstance(a, DTensor) else a
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")
    checks += 1


def run(name, fn, rows, params, placements, consts=(), param_pl=None, warns=False):
    """fn(*rows, *params, *consts) on plain tensors and on DTensors (rows with ``placements``, params replicated or
    with ``param_pl``); compares the outputs and every gradient."""
    mesh = init_device_mesh(DEVICE, (dist.get_world_size(),))
    torch.manual_seed(1)  # the same upstream gradients on every rank
    rows = [r.to(DEVICE) for r in rows]
    params = [p.to(DEVICE) for p in params]
    consts = [c.to(DEVICE) for c in consts]
    plain = [t.clone().requires_grad_() for t in rows + params]
    out = fn(*plain, *consts)
    outs = out if isinstance(out, tuple) else (out,)
    ups = [torch.randn_like(o) for o in outs]
    torch.autograd.backward(outs, ups)
    d_rows = [distribute_tensor(r, mesh, placements[i] if isinstance(placements[0], list) else placements)
              .requires_grad_() for i, r in enumerate(rows)]
    d_params = [distribute_tensor(p, mesh, param_pl or [Replicate()]).requires_grad_() for p in params]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        d_out = fn(*d_rows, *d_params, *consts)
    assert bool([w for w in seen if "tigon." in str(w.message)]) == warns, (name, [str(w.message) for w in seen])
    d_outs = d_out if isinstance(d_out, tuple) else (d_out,)
    assert all(isinstance(o, DTensor) for o in d_outs), name
    torch.autograd.backward(d_outs, [distribute_tensor(u, mesh, o.placements) for u, o in zip(ups, d_outs)])
    for i, (o, ref) in enumerate(zip(d_outs, outs)):
        _close(o, ref.detach(), f"{name} output {i}")
    for i, (d, p) in enumerate(zip(d_rows + d_params, plain)):
        _close(d.grad, p.grad, f"{name} grad {i}")


def async_collective_input(mesh, x, w, residual):
    """A plain tensor that is a collective's result not waited for yet (AsyncCollectiveTensor, as torch's
    RowwiseParallel returns with use_local_output=True) reaches the row-wise ops: waited for, the op runs on its
    tensor, and the gradient flows back through the collective."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    world = dist.get_world_size()
    ref_x, ref_r = x.to(DEVICE).clone().requires_grad_(), residual.to(DEVICE).clone().requires_grad_()
    ref = F.fused_add_rms_norm(F.rms_norm(ref_x, w.to(DEVICE), 1e-6), ref_r, w.to(DEVICE), 1e-6)
    up = torch.randn_like(ref[0])
    (ref[0] * up).sum().backward()
    d = distribute_tensor(x.to(DEVICE), mesh, [Shard(0)]).requires_grad_()
    local = d.redistribute(mesh, [Replicate()], async_op=True).to_local()
    assert world == 1 or isinstance(local, AsyncCollectiveTensor), type(local)
    r = residual.to(DEVICE).clone().requires_grad_()
    got = F.fused_add_rms_norm(F.rms_norm(local, w.to(DEVICE), 1e-6), r, w.to(DEVICE), 1e-6)
    assert type(got[0]) is torch.Tensor, type(got[0])
    (got[0] * up).sum().backward()
    _close(got[0], ref[0].detach(), "rms_norm of an AsyncCollectiveTensor")
    _close(d.grad, ref_x.grad, "grad through the AsyncCollectiveTensor")
    _close(r.grad, ref_r.grad, "grad of the residual")


def main():
    dist.init_process_group("gloo" if DEVICE == "cpu" else "nccl")
    if DEVICE == "cuda":
        torch.cuda.set_device(0)
    world = dist.get_world_size()
    torch.manual_seed(0)  # the same whole tensors on every rank
    b, t, h = 2 * world, 3 * world, 16 * world
    x, w, bias = torch.randn(b, t, h), torch.rand(h) + 0.5, torch.randn(h)
    for pl, warns in (([Shard(0)], False), ([Shard(1)], False), ([Replicate()], False), ([Shard(2)], world > 1)):
        run(f"rms_norm {pl}", lambda x, w: F.rms_norm(x, w, 1e-6), [x], [w], pl, warns=warns)
    run("rms_norm sharded weight", lambda x, w: F.rms_norm(x, w, 1e-6), [x], [w], [Shard(1)], param_pl=[Shard(0)])
    run("layer_norm", lambda x, w, b_: F.layer_norm(x, w, b_, 1e-5), [x], [w, bias], [Shard(1)])
    run("fused_add_rms_norm", lambda x, r, w: F.fused_add_rms_norm(x, r, w, 1e-6),
        [x, torch.randn(b, t, h)], [w], [[Shard(0)], [Replicate()]])
    run("swiglu", F.swiglu, [x, torch.randn(b, t, h)], [], [Shard(2)])
    run("geglu", F.geglu, [x, torch.randn(b, t, h)], [], [Shard(1)])
    d = 8
    q, k = torch.randn(1, 2 * world, t, d), torch.randn(1, world, t, d)
    ang = torch.randn(1, t, d // 2).repeat(1, 1, 2)
    for pl, warns in (([Shard(1)], False), ([Shard(2)], world > 1)):
        run(f"rope {pl}", F.rope, [q, k], [], pl, consts=[ang.cos(), ang.sin()], warns=warns)
    mesh = init_device_mesh(DEVICE, (world,))
    async_collective_input(mesh, x, w, torch.randn(b, t, h))
    logits = distribute_tensor(torch.randn(4 * world, 10).to(DEVICE), mesh, [Shard(0)])
    try:
        F.cross_entropy(logits, torch.zeros(4 * world, dtype=torch.long, device=DEVICE))
        raise AssertionError("cross_entropy took a DTensor")
    except TypeError as e:
        assert "logits is a torch.distributed.tensor" in str(e), str(e)
    ranks.finish(f"OK {checks}")


if __name__ == "__main__":
    main()
