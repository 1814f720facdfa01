"""One device call's worth of work on the H200: compiled tests, `tigon compare` on a Llama-3-8B preset, and the
op benchmarks side by side with eager, torch.compile and the peers. Writes everything under $OUT (or ./out).

Usage (on the GPU machine, repo root):  PYTHONPATH=src python3 benchmarks/h200_suite.py [--skip-tests] [--ops ...]
"""

import argparse
import json
import os
import subprocess
import sys
import time

OUT = os.environ.get("OUT", "out")


def sh(cmd, log):
    t = time.time()
    print(f"$ {cmd}", flush=True)
    with open(os.path.join(OUT, log), "w") as f:
        rc = subprocess.call(cmd, shell=True, stdout=f, stderr=subprocess.STDOUT)
    tail = open(os.path.join(OUT, log)).read()[-1500:]
    print(tail, f"\n[rc={rc}, {time.time() - t:.0f}s]", flush=True)
    return rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-tests", action="store_true")
    ap.add_argument("--skip-compare", action="store_true")
    ap.add_argument("--ops", default="rms_norm,layer_norm,rope,swiglu,geglu,cross_entropy,fused_linear_cross_entropy")
    ap.add_argument("--providers", default="eager,compile,tigon,liger,cce")
    ap.add_argument("--tokens", type=int, default=16384)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    env = "PYTHONPATH=src PYTHONUNBUFFERED=1"
    if not args.skip_tests:
        sh(f"{env} python3 -m pytest -q -x -p no:cacheprovider tests", "pytest.log")
    if not args.skip_compare:
        sh(f"{env} python3 -m tigon.cli compare --preset llama3-8b --layers 2 --dtype bfloat16 "
           f"--json {OUT}/compare_llama3-8b_2l_bf16.json --plot {OUT}/compare_llama3-8b_2l_bf16.png", "compare.log")
    if args.ops:
        sys.path.insert(0, "src")
        import torch

        from tigon.presets import PRESETS
        from tigon.workflows.bench import run_bench, shapes_from_config

        shapes = shapes_from_config(PRESETS["llama3-8b"]["config"], tokens=args.tokens)
        ops = args.ops.split(",")
        res = run_bench(ops, {op: [shapes[op]] for op in ops}, args.providers.split(","),
                        dtype=torch.bfloat16, progress=lambda s: print("bench", s, flush=True))
        with open(os.path.join(OUT, "bench_llama3-8b.json"), "w") as f:
            json.dump(res.as_dict(), f, indent=1)
        print("ceilings", res.ceilings, "skipped", res.skipped)
        for r in res.rows:
            if r.mode == "bwd":
                continue
            extra = f"{r.pct_copy_bw:.0f}%bw" if r.pct_copy_bw else (f"{r.tflops:.0f}TF" if r.tflops else "")
            mem = f"{r.peak_extra_bytes / 2**20:.0f}MiB" if r.peak_extra_bytes is not None else ""
            ms = f"{r.ms:.3f}" if r.ms is not None else "-"
            print(f"{r.op:28s} {r.provider:8s} {r.mode:8s} {ms:>9s} ms {extra:>8s} {mem:>9s} {r.note[:90]}")


if __name__ == "__main__":
    main()
