"""Does a Tigon-patched Hugging Face model compile without graph breaks, and does the compiled train step run?

For one preset (default: Llama-3-8B shapes cut to 2 layers, bf16, on the GPU), with and without ``tigon.patch``:

1. ``torch._dynamo.explain`` of a training forward (input_ids + labels): graph count, graph-break count, the
   reasons (first line and the innermost frame), and which ``tigon::`` custom ops the graphs contain. Breaks the
   unpatched model also has are Hugging Face's; the difference is Tigon's (``tigon_breaks``, expected 0).
2. A training step (forward + backward + AdamW) in eager mode and under ``torch.compile`` (inductor unless
   ``--backend``; ``fullgraph=True`` first, recorded, then without it if that failed): whether it runs, compile
   time, median step time and peak memory.
3. The compiled patched model against the eager patched one on the same first batch: loss and the gradients' relative
   L2 errors (inductor reorders bf16 arithmetic, so small differences are expected; large ones are a bug).

Usage (GPU machine, repo root):
    PYTHONPATH=src python3 benchmarks/compile_check.py --out $OUT/compile-check_llama3-8b-2l_h200_<date>.json
Local smoke run on a CPU (kernels through the Triton interpreter):
    PYTHONPATH=src python3 benchmarks/compile_check.py --preset tiny --dtype float32 --seq 32 --steps 2 \
        --backend aot_eager --out /tmp/cc.json
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time
import traceback

import torch

if not torch.cuda.is_available():  # before tigon's kernels are imported: run them interpreted
    os.environ.setdefault("TRITON_INTERPRET", "1")

import tigon  # noqa: E402
from tigon.numerics import rel_l2  # noqa: E402
from tigon.presets import build_config  # noqa: E402


def _where(reason) -> str:
    """The innermost frame of a break's user stack, preferring Tigon's own code."""
    stack = list(getattr(reason, "user_stack", []) or [])
    ours = [f for f in stack if "tigon" in f.filename]
    f = (ours or stack or [None])[-1]
    return f"{f.filename.split('site-packages/')[-1].split('src/')[-1]}:{f.lineno} in {f.name}" if f else "?"


def explain(model, batch) -> dict:
    torch._dynamo.reset()
    t = time.perf_counter()
    ex = torch._dynamo.explain(model)(**batch)
    ops: dict[str, int] = {}
    for gm in ex.graphs:
        for node in gm.graph.nodes:
            name = str(node.target)
            if node.op == "call_function" and name.startswith("tigon."):
                ops[name] = ops.get(name, 0) + 1
    return {
        "graph_count": ex.graph_count,
        "graph_break_count": ex.graph_break_count,
        # explain does not count a break after the last tensor op (no graph follows it), but lists its reason
        "break_reasons": [{"reason": r.reason.strip().split("\n")[0], "where": _where(r)} for r in ex.break_reasons],
        "tigon_ops_in_graphs": ops,
        "seconds": round(time.perf_counter() - t, 2),
    }


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def train_steps(model, batch, steps: int, compile_kwargs: dict | None) -> dict:
    """``steps`` AdamW steps of ``model`` (eager, or compiled with ``compile_kwargs``); the first one includes the
    compilation."""
    fn = torch.compile(model, **compile_kwargs) if compile_kwargs is not None else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=True)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for _ in range(steps):
        _sync()
        t = time.perf_counter()
        loss = fn(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
    out = {"ok": True, "first_step_s": round(times[0], 2), "losses": [round(v, 5) for v in losses]}
    if len(times) > 1:
        out["median_step_ms"] = round(statistics.median(times[1:]) * 1e3, 2)
    if torch.cuda.is_available():
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def compiled_steps(model, batch, steps: int, backend: str) -> dict:
    """train_steps under torch.compile with fullgraph=True; on failure, the error and a run without it."""
    base = {} if backend == "inductor" else {"backend": backend}
    try:
        res = train_steps(model, batch, steps, {**base, "fullgraph": True})
        res["fullgraph"] = True
        return res
    except Exception as e:  # noqa: BLE001 - recorded, then retried without fullgraph
        err = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        print("fullgraph=True failed:", err, flush=True)
        traceback.print_exc()
    torch._dynamo.reset()
    try:
        res = train_steps(model, batch, steps, base)
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        return {"ok": False, "fullgraph": False, "fullgraph_error": err, "error": f"{type(e).__name__}: {e}"[:2000]}
    res.update(fullgraph=False, fullgraph_error=err)
    return res


def compare_grads(eager_model, compiled_model, batch, backend: str) -> dict:
    """One forward + backward of each (same weights): loss and per-parameter gradient relative L2 errors."""
    torch._dynamo.reset()
    base = {} if backend == "inductor" else {"backend": backend}
    le = eager_model(**batch).loss
    le.backward()
    lc = torch.compile(compiled_model, **base)(**batch).loss
    lc.backward()
    errs = {name: rel_l2(pc.grad.float(), pe.grad.float())
            for (name, pe), pc in zip(eager_model.named_parameters(), compiled_model.parameters())
            if pe.grad is not None and pc.grad is not None}
    worst = max(errs, key=errs.get) if errs else None
    eager_model.zero_grad(set_to_none=True)
    compiled_model.zero_grad(set_to_none=True)
    le, lc = le.item(), lc.item()
    return {"loss_eager": le, "loss_compiled": lc, "loss_rel_diff": abs(lc - le) / max(abs(le), 1e-12),
            "grad_rel_l2_max": errs[worst] if worst else None, "grad_rel_l2_worst_param": worst,
            "grad_rel_l2_median": statistics.median(errs.values()) if errs else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6, help="train steps per variant (the first compiles)")
    ap.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, ...)")
    ap.add_argument("--skip-unpatched-compile", action="store_true", help="no compiled step of the unpatched model")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "out"), "compile_check.json"))
    args = ap.parse_args(argv)

    import transformers

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    cfg = build_config(args.preset, args.layers)
    torch.manual_seed(0)
    with device:
        base = transformers.AutoModelForCausalLM.from_config(cfg).to(dtype).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, min(cfg.vocab_size, 32000), (args.batch, args.seq), generator=g).to(device)
    labels = ids.clone()
    labels[:, : args.seq // 8] = -100  # a prompt that is not trained on
    batch = {"input_ids": ids, "labels": labels}

    def build(patched: bool):
        model = copy.deepcopy(base)
        if patched:
            tigon.patch(model)
        return model

    result: dict = {
        "env": {"torch": torch.__version__, "transformers": transformers.__version__,
                "triton": getattr(sys.modules.get("triton"), "__version__", None) or tigon.support.triton_version(),
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "tigon_backend": tigon.support.decide(device, dtype).backend},
        "config": {k: getattr(args, k) for k in ("preset", "layers", "dtype", "batch", "seq", "steps", "backend")},
    }

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    result["explain"] = {name: explain(build(name == "patched"), batch) for name in ("unpatched", "patched")}
    ex_u, ex_p = result["explain"]["unpatched"], result["explain"]["patched"]
    result["tigon_graph_breaks"] = ex_p["graph_break_count"] - ex_u["graph_break_count"]
    result["tigon_break_reasons"] = len(ex_p["break_reasons"]) - len(ex_u["break_reasons"])
    for name, ex in result["explain"].items():
        print(f"explain {name:9s}: {ex['graph_count']} graph(s), {ex['graph_break_count']} break(s), "
              f"{len(ex['break_reasons'])} reason(s), tigon ops {ex['tigon_ops_in_graphs']}", flush=True)
        for r in ex["break_reasons"]:
            print(f"    {r['reason'][:150]}  @ {r['where']}", flush=True)
    save()

    result["numerics"] = compare_grads(build(True), build(True), batch, args.backend)
    print("numerics:", result["numerics"], flush=True)
    save()

    steps = {"eager_unpatched": lambda: train_steps(build(False), batch, args.steps, None),
             "eager_patched": lambda: train_steps(build(True), batch, args.steps, None),
             "compiled_patched": lambda: compiled_steps(build(True), batch, args.steps, args.backend)}
    if not args.skip_unpatched_compile:
        steps["compiled_unpatched"] = lambda: compiled_steps(build(False), batch, args.steps, args.backend)
    result["train_step"] = {}
    for name, run in steps.items():
        torch._dynamo.reset()
        gc.collect()  # the previous variant's (and the numerics check's) models, so peaks do not carry over
        if device.type == "cuda":
            torch.cuda.empty_cache()
        try:
            result["train_step"][name] = run()
        except Exception as e:  # noqa: BLE001 - keep the other variants' results
            traceback.print_exc()
            result["train_step"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}
        print(f"train {name:18s}: {result['train_step'][name]}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        save()

    cp = result["train_step"]["compiled_patched"]
    cu = result["train_step"].get("compiled_unpatched", {})
    # fullgraph may fail for Hugging Face's own reasons; then it must fail for the unpatched model too.
    fullgraph_ok = cp.get("fullgraph", False) or cu.get("fullgraph") is False
    result["ok"] = bool(result["tigon_graph_breaks"] == 0 and result["tigon_break_reasons"] <= 0
                        and ex_p["tigon_ops_in_graphs"] and cp.get("ok") and fullgraph_ok)
    save()
    print(f"ok={result['ok']}  tigon graph breaks: {result['tigon_graph_breaks']}  -> {args.out}", flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
