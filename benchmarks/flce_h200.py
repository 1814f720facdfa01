"""Fused linear cross-entropy on one GPU: the issue's shapes side by side, a chunk-size sweep and the numerics of
both accumulation modes. One device call; writes JSON to --out.

    PYTHONPATH=src python3 benchmarks/flce_h200.py --out flce.json [--providers eager,compile,tigon,tigon_lean,liger,cce]

Shapes: Llama-3-8B LM head (H=4096, V=128256) at N=8192 and N=32768 tokens, Gemma-2 (H=3584, V=256000, final-logit
softcap 30) at N=8192; bf16, 10% of labels ignored, forward + backward, through tigon.workflows.bench (do_bench
medians, ceilings measured in the same run). Chunk sweep: Tigon's default (fp32 accumulation) with chunks of
1024 .. 8192 rows and the lean mode with 2**24 .. 2**27-logit chunks, at N=8192 Llama shapes. Numerics: relative
L2 error of loss, grad_hidden and grad_weight against float64, for eager bf16 and both Tigon modes, upstream 1.
"""

import argparse
import json
import time

import torch

import tigon.functional as F
import tigon.kernels.fused_linear_cross_entropy as flce_ops
from tigon.workflows.bench import CASES, bench_one, measure_ceilings


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def numerics(n, h, v, softcap, device):
    torch.manual_seed(0)
    hid = torch.randn(n, h, device=device, dtype=torch.bfloat16)
    w = (torch.randn(v, h, device=device) * h ** -0.5).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device=device)
    t[torch.rand(n, device=device) < 0.1] = -100
    out = {}

    def run(name, fn, dtype):
        a = hid.to(dtype).clone().requires_grad_()
        b = w.to(dtype).clone().requires_grad_()
        loss = fn(a, b)
        loss.backward()
        return loss.detach().double(), a.grad, b.grad

    def eager(a, b):
        z = (a @ b.T).float() if a.dtype != torch.float64 else a @ b.T
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        return torch.nn.functional.cross_entropy(z, t)

    truth = run("truth", eager, torch.float64)
    for name, fn in (("eager", eager),
                     ("tigon", lambda a, b: F.fused_linear_cross_entropy(a, b, t, softcap=softcap)),
                     ("tigon_lean", lambda a, b: F.fused_linear_cross_entropy(a, b, t, softcap=softcap,
                                                                             accum_dtype=torch.bfloat16))):
        r = run(name, fn, torch.bfloat16)
        out[name] = {k: rel(x, y) for k, x, y in zip(("loss", "grad_hidden", "grad_weight"), r, truth)}
        del r
        torch.cuda.empty_cache()
    return out


def row_dict(rows):
    return [dict(r.__dict__) for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--providers", default="eager,compile,tigon,tigon_lean,liger,cce")
    ap.add_argument("--skip-sweep", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    t0 = time.time()
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": measure_ceilings(dev),
           "rows": [], "chunk_sweep": [], "numerics": {}}
    print("ceilings", res["ceilings"], flush=True)
    case = CASES["fused_linear_cross_entropy"]
    shapes = [dict(tokens=8192, hidden=4096, vocab=128256, softcap=None),
              dict(tokens=32768, hidden=4096, vocab=128256, softcap=None),
              dict(tokens=8192, hidden=3584, vocab=256000, softcap=30.0)]
    compiled = {}
    providers = [p for p in args.providers.split(",") if p in case.providers]
    for shape in shapes:
        for p in providers:
            try:
                rows = bench_one(case, p, shape, torch.bfloat16, dev, res["ceilings"], compiled, modes=("fwd_bwd",))
            except Exception as e:
                rows = []
                res["rows"].append({"provider": p, "shape": shape, "note": f"failed: {type(e).__name__}: {e}"[:300]})
            res["rows"] += row_dict(rows)
            for r in rows:
                print(f"{shape['tokens']:6d} {shape['vocab']:7d} {p:11s} {r.ms:8.2f} ms {r.pct_matmul or 0:5.1f}% "
                      f"{(r.peak_extra_bytes or 0) / 2**30:6.2f} GiB  [{time.time() - t0:.0f}s]", flush=True)
            torch.cuda.empty_cache()
    if not args.skip_sweep:
        base = dict(tokens=8192, hidden=4096, vocab=128256, softcap=None)
        saved = (flce_ops.MAX_CHUNK_ELEMS_CUDA, flce_ops.MIN_CHUNK_ROWS_CUDA, flce_ops.LEAN_CHUNK_ELEMS)
        for rows in (1024, 2048, 4096, 8192):
            flce_ops.MAX_CHUNK_ELEMS_CUDA = rows * 128256
            flce_ops.MIN_CHUNK_ROWS_CUDA = rows  # rows = max(H, MIN) capped by MAX_CHUNK_ELEMS / V
            r = bench_one(case, "tigon", base, torch.bfloat16, dev, res["ceilings"], compiled, modes=("fwd_bwd",))[0]
            res["chunk_sweep"].append({"mode": "fp32", "rows": flce_ops.chunk_rows(8192, 128256, 4096, dev),
                                       "ms": r.ms, "peak_extra_bytes": r.peak_extra_bytes})
            print("sweep fp32", res["chunk_sweep"][-1], flush=True)
        flce_ops.MAX_CHUNK_ELEMS_CUDA, flce_ops.MIN_CHUNK_ROWS_CUDA, _ = saved
        for log2 in (24, 25, 26, 27):
            flce_ops.LEAN_CHUNK_ELEMS = 1 << log2
            r = bench_one(case, "tigon_lean", base, torch.bfloat16, dev, res["ceilings"], compiled,
                          modes=("fwd_bwd",))[0]
            res["chunk_sweep"].append({"mode": "lean", "chunk_elems": 1 << log2,
                                       "rows": flce_ops.chunk_rows(8192, 128256, 4096, dev, lean=True),
                                       "ms": r.ms, "peak_extra_bytes": r.peak_extra_bytes})
            print("sweep lean", res["chunk_sweep"][-1], flush=True)
        flce_ops.LEAN_CHUNK_ELEMS = saved[2]
    for name, (n, h, v, sc) in {"llama3_8192": (8192, 4096, 128256, None),
                                "gemma2_4096": (4096, 3584, 256000, 30.0)}.items():
        res["numerics"][name] = numerics(n, h, v, sc, dev)
        print("numerics", name, res["numerics"][name], flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    print(f"done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
