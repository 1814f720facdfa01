"""Where the time of a fused LM-head post-training loss goes: head matmuls counted, CUDA kernel time split into
matmuls and the rest, peak extra memory. A diagnostic beside ``tigon bench`` (which times the same calls): it answers
"how far from the matmul floor, and what else runs".

For each op (its registry record's bench inputs, at ``--tokens`` x ``--hidden`` x ``--vocab``, bf16) and provider
(``tigon``, ``tigon_lean``, ``eager`` ...: :func:`tigon.workflows.bench.op_providers`):

* ``head_matmuls``: the matmul work of one forward + backward in units of one (tokens x hidden x vocab) matmul
  (:func:`tigon.workflows.matmul_count.head_matmuls`): 3 for GRPO's policy, 4 for DPO (policy 3 + reference 1) and
  the JSD (2 logits + 2 gradients) when the gradients are formed in the forward;
* ``kernel_ms``: CUDA kernel time of one forward + backward (torch.profiler, the median call of ``--reps``), split
  into ``matmul_ms`` (cuBLAS / CUTLASS kernels) and ``other_ms``, with the ``top`` kernels by time;
* ``floor_ms``: head_matmuls x 2 N H V / ``--tflops`` (the measured bf16 matmul rate, 790 TFLOP/s on an H200);
* ``peak_extra_gib``: peak allocated memory of one forward + backward beyond the inputs;
* ``wall_ms``: (median, p20, p80) host-inclusive time of one forward + backward as ``tigon bench`` times it
  (:func:`tigon.workflows.timing.time_call`, at least 10 timed calls), so that ``wall_ms - kernel_ms`` is the time the
  device waited (on the host, or between kernels);
* ``host_ms`` / ``device_ms``: the host's issue time and the device's time of one call measured behind a GPU sleep
  (:func:`tigon.workflows.timing.call_cost`): host_ms > device_ms means the call is host-bound; ``syncs``: where the
  call makes the host wait (:func:`tigon.workflows.timing.sync_points`; [] expected);
* ``allocator``: per call in steady state, the caching allocator's device allocations and frees (cudaMalloc /
  cudaFree: a free synchronises the device), its out-of-memory retries (cached blocks released: a synchronisation)
  and ``torch.cuda.synchronize``-like waits it made, from ``torch.cuda.memory_stats`` over 5 calls (all 0 expected);
* ``phases``: per phase of the fused losses' code (:data:`PHASES`, ``record_function`` ranges put around those
  functions for one profiled call, removed after): calls, host ms and device ms (the kernels launched inside,
  nested phases included: the chunk loop holds the matmuls and row kernels). Printed as a table under each row.

Usage (GPU machine, repo root):
    PYTHONPATH=src python3 benchmarks/posttrain_breakdown.py \
        --out $OUT/posttrain-breakdown_llama3-8b-8k_h200_<date>.json
Smoke run of the script on a CPU (interpreted kernels, tiny shapes; times meaningless):
    PYTHONPATH=src python3 benchmarks/posttrain_breakdown.py --device cpu --tokens 32 --hidden 16 --vocab 40 --batch 4 \
        --reps 1 --providers tigon,eager
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import json
import os

import torch

if not torch.cuda.is_available():  # before tigon's kernels are imported: run them interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tigon import ops  # noqa: E402
from tigon.workflows.bench import op_providers  # noqa: E402
from tigon.workflows.matmul_count import head_matmuls  # noqa: E402
from tigon.workflows.timing import call_cost, differentiable_outputs, sync_points, time_call  # noqa: E402

PHASES = (
    # (module, attribute ("Class.method" for a method), label); a name imported into another module is wrapped
    # where it is called from
    ("tigon.ops.preference_formed", "_formed_plan", "plan (checks, chunk rule)"),
    ("tigon.ops.preference_formed", "_reference", "reference model: setup (or its own pass)"),
    ("tigon.ops.preference_formed", "pair_logps", "pair_logps (sequence sums, checks)"),
    ("tigon.ops.preference_formed", "preference_output", "outputs (formula, logits means)"),
    ("tigon.ops.preference_formed", "_formed_pass", "formed pass (chunk loop + Function)"),
    ("tigon.kernels.fused_linear_logprobs", "backward_over_chunks", "chunk loop"),
    ("tigon.kernels.fused_linear_jsd", "backward_over_chunks", "chunk loop"),
    ("tigon.kernels.fused_linear_logprobs", "logprobs_forward", "log-probs forward pass (no gradient)"),
    ("tigon.kernels.head_grads", "_Matmuls.logits", "logits matmul (policy / student, reference / teacher)"),
    ("tigon.kernels.head_grads", "_Matmuls.chunk_grads", "gradient matmuls (grad_hidden, grad_weight)"),
    ("tigon.kernels.fused_linear_logprobs", "rows_forward", "log-prob row kernel"),
    ("tigon.kernels.fused_linear_logprobs", "rows_grad_", "logits-gradient row kernel"),
    ("tigon.kernels.fused_linear_jsd", "jsd_rows", "JSD row kernel (both heads' rows)"),
    ("tigon.kernels.fused_linear_logprobs", "scale_grads", "backward: scale and cast the formed gradients"),
    ("tigon.kernels.fused_linear_jsd", "scale_grads", "backward: scale and cast the formed gradients"),
)
"""Where ``phases`` puts its ranges. What runs in a chunk loop but outside these (the loss formula's autograd per chunk
of the formed losses) shows as the loop's device / host time less its children's."""

MATMUL_NAMES = ("gemm", "cutlass", "nvjet", "sm90_xmma", "sm80_xmma", "cublas", "splitk", "aten::mm", "aten::addmm")
"""Substrings of the CUDA kernel names counted as matmuls (cuBLAS / CUTLASS / nvJet kernels)."""


def _loss(out) -> torch.Tensor:
    return differentiable_outputs(out)[0]


def _inputs(spec, shape: dict, device: torch.device, seed: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(seed)
    inputs = spec.make_inputs(shape, torch.bfloat16, device, gen, **spec.bench_inputs)
    for k in spec.grad_inputs:
        inputs[k].requires_grad_(True)
    return inputs


@contextlib.contextmanager
def phase_ranges():
    """``record_function`` ranges ``"phase: <label>"`` around the functions of :data:`PHASES` (those that exist),
    removed on exit."""
    saved = []
    for mod, attr, label in PHASES:
        try:
            owner = importlib.import_module(mod)
        except ImportError:
            continue
        *cls, fname = attr.split(".")
        if cls:
            owner = getattr(owner, cls[0], None)
        f = getattr(owner, fname, None) if owner is not None else None
        if f is None:
            continue

        def wrapped(*args, _f=f, _label="phase: " + label, **kwargs):
            with torch.profiler.record_function(_label):
                return _f(*args, **kwargs)

        saved.append((owner, fname, f))
        setattr(owner, fname, wrapped)
    try:
        yield
    finally:
        for owner, fname, f in reversed(saved):
            setattr(owner, fname, f)


def phases(step, cuda: bool) -> dict:
    """``{label: {"calls", "host_ms", "device_ms"}}`` of one profiled ``step()`` with :func:`phase_ranges`, plus
    ``"(whole call)"``: the call's host time and its kernels' time."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with phase_ranges():
        step()  # the wrapped functions once before the profile
        with torch.profiler.profile(activities=activities) as prof:
            with torch.profiler.record_function("phase: (whole call)"):
                step()
                if cuda:
                    torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.key.startswith("phase: "):
            dev = getattr(e, "device_time_total", None)
            dev = getattr(e, "cuda_time_total", 0.0) if dev is None else dev
            out[e.key[len("phase: "):]] = {"calls": e.count, "host_ms": round(e.cpu_time_total / 1e3, 3),
                                           "device_ms": round(dev / 1e3, 3)}
    return out


ALLOCATOR_STATS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")


def allocator_churn(step, calls: int = 5) -> dict:
    """Per call of ``step()`` (after a warm-up call), the increase of :data:`ALLOCATOR_STATS` in
    ``torch.cuda.memory_stats()`` (the keys this torch has)."""
    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    for _ in range(calls):
        step()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    return {k: (after[k] - before.get(k, 0)) / calls for k in ALLOCATOR_STATS if k in after}


def print_phases(row: dict) -> None:
    """The row's phases as a table on stdout."""
    if not row.get("phases"):
        return
    print(f"  {'phase':<56} {'calls':>5} {'host ms':>9} {'device ms':>10}")
    for label, p in sorted(row["phases"].items(), key=lambda kv: -kv[1]["device_ms"] - kv[1]["host_ms"] / 1e3):
        print(f"  {label:<56} {p['calls']:>5} {p['host_ms']:>9.3f} {p['device_ms']:>10.3f}")


def breakdown(name: str, provider: str, shape: dict, reps: int, tflops: float, top: int,
              device: torch.device) -> dict:
    """One (op, provider) row of the report (see the module docstring). On a CPU (a smoke run through the Triton
    interpreter) the times are the profiler's CPU op times and no memory is measured."""
    spec = ops.get(name)
    fn = op_providers(spec)[provider]
    cuda = device.type == "cuda"
    inputs = _inputs(spec, shape, device, 0)
    leaves = [inputs[k] for k in spec.grad_inputs]

    def step():
        for t in leaves:
            t.grad = None
        _loss(fn(**inputs)).backward()

    for _ in range(2):
        step()
    n, h, v = shape["tokens"], shape["hidden"], shape["vocab"]
    matmuls = head_matmuls(step, n, h, v)
    for t in leaves:
        t.grad = None
    peak = None
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    calls = []
    for _ in range(reps):
        with torch.profiler.profile(activities=[activity]) as prof:
            step()
            if cuda:
                torch.cuda.synchronize()
        by_kernel = collections.Counter()
        for e in prof.events():
            if cuda and e.device_type == torch.autograd.DeviceType.CUDA:
                by_kernel[e.name] += e.device_time_total / 1e3  # us -> ms
            elif not cuda and e.name.startswith("aten::"):
                by_kernel[e.name] += e.self_cpu_time_total / 1e3
        calls.append(by_kernel)
    wall = time_call(step, device)
    cost = call_cost(step, device, calls=2, groups=3) if cuda else {}
    syncs = sync_points(step, device)
    churn = allocator_churn(step) if cuda else {}
    by_phase = phases(step, cuda)
    mid = sorted(calls, key=lambda c: sum(c.values()))[len(calls) // 2]
    mm = sum(ms for k, ms in mid.items() if any(s in k.lower() for s in MATMUL_NAMES))
    total = sum(mid.values())
    return {"op": name, "provider": provider, "shape": shape, "head_matmuls": matmuls,
            "floor_ms": matmuls * 2 * n * h * v / (tflops * 1e12) * 1e3,
            "kernel_ms": total, "matmul_ms": mm, "other_ms": total - mm,
            "kernel_ms_spread": [round(sum(c.values()), 3) for c in calls],
            "peak_extra_gib": peak,
            "wall_ms": [round(x, 3) for x in wall],
            "host_ms": cost.get("host_ms"), "device_ms": cost.get("device_ms"), "syncs": syncs,
            "allocator": churn,
            "phases": by_phase,
            "top": [[k[:120], round(ms, 3)] for k, ms in mid.most_common(top)]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="fused_linear_grpo,fused_linear_dpo_loss,fused_linear_jsd")
    p.add_argument("--providers", default="tigon,tigon_lean,eager")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=128256)
    p.add_argument("--batch", type=int, default=8, help="sequences (GRPO's completions)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tflops", type=float, default=790.0, help="the bf16 matmul rate of the floor")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of the script itself (tiny shapes)")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    shape = {"tokens": args.tokens, "hidden": args.hidden, "vocab": args.vocab, "batch": args.batch}
    rows = []
    for name in args.ops.split(","):
        providers = op_providers(ops.get(name))
        for prov in args.providers.split(","):
            if prov not in providers:
                continue
            try:
                row = breakdown(name, prov, shape, args.reps, args.tflops, args.top, device)
            except Exception as e:  # noqa: BLE001 (recorded, the other rows still run)
                row = {"op": name, "provider": prov, "error": f"{type(e).__name__}: {e}"}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("top", "phases")}), flush=True)
            print_phases(row)
    if args.out:
        name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        with open(args.out, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
