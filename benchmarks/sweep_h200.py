"""The memory-bound ops' sweeps on one GPU (one device call): tokens 1k..64k for every op at Llama-3-8B shapes and
hidden 1024..16384 for the norms, forward and forward+backward, each provider side by side; JSON to --out.

    PYTHONPATH=src python3 benchmarks/sweep_h200.py --out sweep.json [--budget-s 540]
    PYTHONPATH=src python3 benchmarks/sweep_h200.py --plot-from sweep.json --plot-dir DIR   (PNGs, any machine)

Every op is timed as CUDA-graph replays (``tigon bench --cuda-graph``: kernel time without the host's launch /
autograd cost, which otherwise dominates the sub-millisecond points), except providers that wait on the host during
a call (Liger's cross-entropy), which no graph can capture: their kernels' durations are summed (torch.profiler).
``--plain-ops`` times the ops it names with plain ``do_bench`` instead (host time included: at small sizes it
measures the host). Same measurement code as ``tigon bench`` (tigon.workflows.bench). Session 7's sweeps timed
cross-entropy plainly.
Points are run smallest first and the JSON is rewritten after each op, so a run cut by --budget-s keeps what it
measured.
"""

import argparse
import json
import time

import torch

from tigon.presets import PRESETS
from tigon.workflows.bench import measure_ceilings, run_bench, shapes_from_config

TOKENS = [1024 << i for i in range(7)]
HIDDEN = [1024 << i for i in range(5)]


def plot(json_path: str, out_dir: str) -> list[str]:
    """sweep_<axis>_<op>.png per sweep of a JSON written by this script (tigon's bench plots: fwd+bwd time and
    peak memory against the sweep axis, one line per provider). Runs anywhere (no GPU needed)."""
    import os
    import tempfile

    from tigon._plot import plot_bench

    with open(json_path) as f:
        res = json.load(f)
    paths = []
    for key, sweep in res["sweeps"].items():
        if "rows" not in sweep:
            continue
        op, axis = key.split("/")
        with tempfile.TemporaryDirectory() as tmp:
            (written,) = plot_bench({"sweep": axis, "rows": sweep["rows"], "device": res["device"]}, tmp)
            dst = os.path.join(out_dir, f"sweep_{axis}_{op}.png")
            os.replace(written, dst)
            paths.append(dst)
    return paths


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="JSON to write (required unless --plot-from)")
    ap.add_argument("--plot-from", metavar="JSON", help="only draw the PNGs of an earlier run's JSON into --plot-dir")
    ap.add_argument("--plot-dir", default=".")
    ap.add_argument("--budget-s", type=float, default=540)
    ap.add_argument("--providers", default="eager,compile,tigon,tigon_inplace,liger")
    ap.add_argument("--ops", default="rms_norm,layer_norm,rope,swiglu,geglu,cross_entropy")
    ap.add_argument("--axes", default="tokens,hidden", help="tokens (every op) and/or hidden (the norms)")
    ap.add_argument("--plain-ops", default="", help="ops timed with plain do_bench (host time included)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="the tokens axis's points")
    args = ap.parse_args()
    if args.plot_from:
        print("\n".join(plot(args.plot_from, args.plot_dir)))
        return
    if not args.out:
        ap.error("--out is required")
    t0 = time.time()
    dev = torch.device("cuda")
    cfg = PRESETS["llama3-8b"]["config"]
    ceilings = measure_ceilings(dev)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceilings,
           "command": "PYTHONPATH=src python3 benchmarks/sweep_h200.py", "sweeps": {}}
    providers = args.providers.split(",")
    axes = args.axes.split(",")
    tokens = [int(n) for n in args.tokens.split(",")]
    plan = [(op, "tokens", [shapes_from_config(cfg, tokens=n)[op] for n in tokens])
            for op in args.ops.split(",") if "tokens" in axes]
    plan += [(op, "hidden", [dict(shapes_from_config(cfg, tokens=16384)[op], hidden=h) for h in HIDDEN])
             for op in ("rms_norm", "layer_norm") if op in args.ops.split(",") and "hidden" in axes]
    for op, axis, shapes in plan:
        if time.time() - t0 > args.budget_s:
            res["sweeps"][f"{op}/{axis}"] = {"note": "not run: time budget spent"}
            continue
        r = run_bench([op], {op: shapes}, providers, ceilings=ceilings, modes=("fwd", "fwd_bwd"),
                      cuda_graph=op not in args.plain_ops.split(","))
        res["sweeps"][f"{op}/{axis}"] = {"skipped": r.skipped, "rows": [dict(x.__dict__) for x in r.rows]}
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        worst = {}
        for x in r.rows:
            if x.ms is None:
                continue
            key = (x.mode, x.shape.get(axis if axis == "hidden" else "tokens"))
            worst.setdefault(key, {})[x.provider] = x.ms
        for (mode, point), d in sorted(worst.items()):
            best_other = min((v for k, v in d.items() if not k.startswith("tigon")), default=None)
            ours = min((v for k, v in d.items() if k.startswith("tigon")), default=None)
            ratio = ours / best_other if ours and best_other else float("nan")
            print(f"{op:14s} {axis:6s} {mode:7s} {point:6d} tigon/best-other {ratio:5.2f} "
                  + " ".join(f"{k}={v:.3f}" for k, v in d.items()), flush=True)
        print(f"[{time.time() - t0:.0f}s]", flush=True)
    print("done")


if __name__ == "__main__":
    main()
