"""Fused linear cross-entropy on one GPU: the issue's shapes with every provider side by side, a chunk-size sweep of
Tigon's two accumulation modes, and their numerics against float64. One device call (about two minutes); JSON to
--out, rewritten after each part.

    PYTHONPATH=src python3 benchmarks/flce_h200.py --out $OUT/flce_llama3-8b_h200_<date>.json \
        [--providers eager,compile,tigon,tigon_lean,liger,cce] [--skip-sweep] [--skip-numerics] \
        [--memory auto,low,67108864,...] [--skip-shapes]

Shapes: Llama-3-8B's LM head (H=4096, V=128256) at N=8192 and N=32768 tokens, Gemma-2-9B's (H=3584, V=256000,
final-logit softcap 30) at N=8192; bf16, 10% of the labels ignored; timed as ``tigon bench --op
fused_linear_cross_entropy --model M --tokens N`` does it (tigon.workflows.bench.run_op_bench: plain do_bench
medians of fwd, bwd and fwd+bwd, matmul rate measured in the same run). Chunk sweep, at N=8192 Llama shapes:
the default mode (fp32 grad_weight accumulator) with chunks of 1024 .. 8192 rows (the memory budget lifted so that
the rows are the ones asked for), and the lean mode (``accum_dtype=bf16``) with 2**24 .. 2**27-logit chunks; each
point sets the constants of tigon.kernels.fused_linear_cross_entropy for its run. Numerics: relative L2 error of
loss, grad_hidden and grad_weight against float64 for eager bf16 and both Tigon modes, upstream gradient 1.
``--memory``: the ``memory=`` option's points (``"auto"``, ``"low"``, or a budget in bytes), each timed and its peak
measured as a Tigon provider at Llama N=8192 and Gemma-2 N=8192, beside the providers' rows of those shapes.
Results: benchmarks/results/h200/flce_h200.json (an earlier version of this script; see the results README).
"""

import argparse
import json
import sys
import time
from unittest import mock

import torch

import tigon.functional as F
from tigon.numerics import rel_l2

OP = "fused_linear_cross_entropy"
SHAPES = (("llama3-8b", 8192), ("llama3-8b", 32768), ("gemma2-9b", 8192))
SWEEP_TOKENS, SWEEP_HIDDEN, SWEEP_VOCAB = 8192, 4096, 128256  # llama3-8b at 8192 tokens
FP32_CHUNK_ROWS = (1024, 2048, 4096, 8192)
LEAN_CHUNK_LOG2 = (24, 25, 26, 27)
NUMERICS = {"llama3_8192": (8192, 4096, 128256, None), "gemma2_4096": (4096, 3584, 256000, 30.0)}


def bench(providers: list[str], model: str, tokens: int) -> tuple[list[dict], dict]:
    """(fwd+bwd rows, ceilings) of ``tigon bench --op fused_linear_cross_entropy`` at one shape."""
    from tigon.workflows.bench import BenchConfig, run_op_bench

    r = run_op_bench(BenchConfig(ops=[OP], model=model, providers=providers, tokens=tokens)).as_dict()
    return [row for row in r["rows"] if row["mode"] == "fwd_bwd"], r["ceilings"]


def chunk_sweep(flce) -> list[dict]:
    """fwd+bwd time and peak extra memory of each chunk size of both accumulation modes at Llama N=8192."""
    n, h, v, dev = SWEEP_TOKENS, SWEEP_HIDDEN, SWEEP_VOCAB, torch.device("cuda")
    points = [("tigon", {"mode": "fp32"}, dict(MIN_CHUNK_ROWS_CUDA=rows, MAX_CHUNK_ELEMS_CUDA=rows * v,
                                                FLCE_BUDGET_BYTES_CUDA=1 << 50)) for rows in FP32_CHUNK_ROWS]
    points += [("tigon_lean", {"mode": "lean", "chunk_elems": 1 << k}, dict(LEAN_CHUNK_ELEMS=1 << k))
               for k in LEAN_CHUNK_LOG2]
    out = []
    for provider, rec, consts in points:
        with mock.patch.multiple(flce, **consts):
            rows, _ = bench([provider], "llama3-8b", n)
            rec["rows"] = flce.chunk_rows(n, v, h, dev, lean=provider == "tigon_lean",
                                          fp32_weight_grad=provider == "tigon")
        rec.update(ms=rows[0]["ms"], peak_extra_bytes=rows[0]["peak_extra_bytes"], note=rows[0]["note"])
        out.append(rec)
        print("sweep", rec, flush=True)
    return out


def memory_sweep(values: list[str]) -> list[dict]:
    """fwd+bwd time and peak extra memory of each ``memory=`` value (``"auto"``, ``"low"`` or bytes) at the Llama
    and Gemma-2 shapes of N=8192, timed as the ``tigon_lean`` provider with its case's options replaced."""
    import dataclasses

    import tigon.ops.fused_linear_cross_entropy as rec_mod
    from tigon.ops import Case

    spec = rec_mod.RECORDS[0]
    out = []
    for model in ("llama3-8b", "gemma2-9b"):
        for raw in values:
            memory = raw if raw in ("auto", "low") else int(raw)
            case = Case(f"bench: memory={raw}", options={"memory": memory}, tags=frozenset({"bench"}),
                        provider="tigon_lean")
            cases = tuple(c for c in spec.cases if c.provider != "tigon_lean") + (case,)
            with mock.patch.object(rec_mod, "RECORDS", (dataclasses.replace(spec, cases=cases),)):
                rows, _ = bench(["tigon_lean"], model, 8192)
            rec = dict(model=model, memory=raw, ms=rows[0]["ms"], peak_extra_bytes=rows[0]["peak_extra_bytes"],
                       note=rows[0]["note"])
            out.append(rec)
            print("memory", rec, flush=True)
    return out


def numerics(n, h, v, softcap, device) -> dict:
    """Relative L2 errors of loss, grad_hidden and grad_weight against float64, per computation."""
    torch.manual_seed(0)
    hid = torch.randn(n, h, device=device, dtype=torch.bfloat16)
    w = (torch.randn(v, h, device=device) * h ** -0.5).to(torch.bfloat16)
    t = torch.randint(0, v, (n,), device=device)
    t[torch.rand(n, device=device) < 0.1] = -100

    def run(fn, dtype):
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

    truth = run(eager, torch.float64)
    out = {}
    for name, fn in (("eager", eager),
                     ("tigon", lambda a, b: F.fused_linear_cross_entropy(a, b, t, softcap=softcap)),
                     ("tigon_lean", lambda a, b: F.fused_linear_cross_entropy(a, b, t, softcap=softcap,
                                                                             accum_dtype=torch.bfloat16))):
        got = run(fn, torch.bfloat16)
        out[name] = {k: rel_l2(x, y) for k, x, y in zip(("loss", "grad_hidden", "grad_weight"), got, truth)}
        del got
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--providers", default="eager,compile,tigon,tigon_lean,liger,cce")
    ap.add_argument("--skip-sweep", action="store_true", help="no chunk-size sweep")
    ap.add_argument("--skip-numerics", action="store_true", help="no float64 comparison")
    ap.add_argument("--skip-shapes", action="store_true", help="no providers' rows at the issue's shapes")
    ap.add_argument("--memory", help="comma-separated memory= values to time (auto, low, or bytes)")
    args = ap.parse_args(argv)
    import tigon.kernels.fused_linear_cross_entropy as flce

    t0 = time.time()
    command = "PYTHONPATH=src python3 benchmarks/flce_h200.py " + " ".join(sys.argv[1:] if argv is None else argv)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": None, "command": command,
           "rows": [], "chunk_sweep": [], "memory_sweep": [], "numerics": {}}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)

    for model, tokens in () if args.skip_shapes else SHAPES:
        rows, ceilings = bench(args.providers.split(","), model, tokens)
        res["ceilings"] = res["ceilings"] or ceilings
        res["rows"] += rows
        for r in rows:
            ms = f"{r['ms']:8.2f} ms {r['pct_matmul'] or 0:5.1f}%" if r["ms"] else r["note"][:80]
            print(f"{model:10s} {tokens:6d} {r['provider']:11s} {ms} "
                  f"{(r['peak_extra_bytes'] or 0) / 2**30:6.2f} GiB  [{time.time() - t0:.0f}s]", flush=True)
        save()
    if args.memory:
        res["memory_sweep"] = memory_sweep(args.memory.split(","))
        save()
    if not args.skip_sweep:
        res["chunk_sweep"] = chunk_sweep(flce)
        save()
    if not args.skip_numerics:
        for name, (n, h, v, softcap) in NUMERICS.items():
            res["numerics"][name] = numerics(n, h, v, softcap, torch.device("cuda"))
            print("numerics", name, res["numerics"][name], flush=True)
        save()
    print(f"done in {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
