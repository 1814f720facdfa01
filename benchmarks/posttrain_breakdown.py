"""Where the time of a fused LM-head post-training loss goes: head matmuls counted, CUDA kernel time split into
matmuls and the rest, peak extra memory. A diagnostic beside ``tigon bench`` (which times the same calls): it answers
"how far from the matmul floor, and what else runs".

For each op (its registry record's bench inputs, at ``--tokens`` x ``--hidden`` x ``--vocab``, bf16) and provider
(``tigon``, ``tigon_lean``, ``eager`` ...: :func:`tigon.workflows.bench.op_providers`):

* ``head_matmuls``: the matmul work of one forward + backward in units of one (tokens x hidden x vocab) matmul
  (:func:`tigon.workflows.timing.head_matmuls`): 3 for GRPO's policy, 4 for DPO (policy 3 + reference 1) and the JSD
  (2 logits + 2 gradients) when the gradients are formed in the forward;
* ``kernel_ms``: CUDA kernel time of one forward + backward (torch.profiler, the median call of ``--reps``), split
  into ``matmul_ms`` (cuBLAS / CUTLASS kernels) and ``other_ms``, with the ``top`` kernels by time;
* ``floor_ms``: head_matmuls x 2 N H V / ``--tflops`` (the measured bf16 matmul rate, 790 TFLOP/s on an H200);
* ``peak_extra_gib``: peak allocated memory of one forward + backward beyond the inputs.

Usage (GPU machine, repo root):
    PYTHONPATH=src python3 benchmarks/posttrain_breakdown.py --out $OUT/posttrain-breakdown_llama3-8b-8k_h200_<date>.json
Smoke run of the script on a CPU (interpreted kernels, tiny shapes; times meaningless):
    PYTHONPATH=src python3 benchmarks/posttrain_breakdown.py --device cpu --tokens 32 --hidden 16 --vocab 40 --batch 4 \
        --reps 1 --providers tigon,eager
"""

from __future__ import annotations

import argparse
import collections
import json
import os

import torch

if not torch.cuda.is_available():  # before tigon's kernels are imported: run them interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tigon import ops  # noqa: E402
from tigon.workflows.bench import op_providers  # noqa: E402
from tigon.workflows.timing import differentiable_outputs, head_matmuls  # noqa: E402

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
    mid = sorted(calls, key=lambda c: sum(c.values()))[len(calls) // 2]
    mm = sum(ms for k, ms in mid.items() if any(s in k.lower() for s in MATMUL_NAMES))
    total = sum(mid.values())
    return {"op": name, "provider": provider, "shape": shape, "head_matmuls": matmuls,
            "floor_ms": matmuls * 2 * n * h * v / (tflops * 1e12) * 1e3,
            "kernel_ms": total, "matmul_ms": mm, "other_ms": total - mm,
            "kernel_ms_spread": [round(sum(c.values()), 3) for c in calls],
            "peak_extra_gib": peak,
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
            print(json.dumps({k: v for k, v in row.items() if k != "top"}), flush=True)
    if args.out:
        name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
        with open(args.out, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
