"""The end-to-end table: one process per provider (``tigon bench --e2e``), then ratios and a plot.

    PYTHONPATH=src python3 benchmarks/e2e_table.py --model qwen2.5-0.5b --batch-size 4 --seq-len 1024 --out-dir $OUT
        # the default providers: HF, HF + compile, Liger (Triton and its CuTe DSL backend), Tigon, Tigon + compile
    python3 benchmarks/e2e_table.py --from-dir DIR [--png table.png]     # merge JSON files already written

Each provider runs in a fresh ``python3 -m tigon.cli bench --e2e --providers <p>`` process (so compile caches,
allocator state and monkey-patches never leak between providers; the launcher, limits and file names are
``_tables.py``'s, shared with ``op_table.py``), writing ``e2e-<p>_<model>_<gpu>_<date>.json``
into ``--out-dir``. The merged table prints tokens/s, step time, peak memory and each provider's ratio to
``original`` and to ``original_compile``; ``--png`` (default ``<out-dir>/e2e_<model>_<gpu>_<date>.png``) plots
tokens/s and peak GiB per provider. ``--timeout`` (s) bounds each provider's process: one number for all, or a
default and per-provider limits, ``--timeout 60,original_compile=110,tigon_compile=110`` (compilation's time).

Besides ``tigon bench --e2e``'s providers, :data:`VARIANTS` names a provider run with its own environment or
arguments: ``liger_cutedsl`` is ``liger`` with Liger-Kernel's opt-in CuTe DSL backend (``LIGER_KERNEL_IMPL=cutedsl``,
picked at import, hence its own process); ``tigon_sac`` and ``original_sac`` are ``tigon`` and ``original`` under
``--gradient-checkpointing selective`` (:mod:`tigon.checkpointing`: each layer keeps the
matmul and attention outputs that fit ``--checkpoint-budget-gb``), whatever ``--gradient-checkpointing`` the other
providers run with, so that one table holds Hugging Face's checkpointing and the selective one (a line per such
provider says what its layers kept and the recompute avoided). ``--lora R`` wraps every provider's model in PEFT
LoRA (``tigon bench --lora``), ``--gradient-checkpointing`` turns on checkpointing in every provider's model,
``--kernel-summary`` profiles each provider's last step and prints its GPU time by kernel kind (the JSON rows hold the
top kernels by name). MFU is printed next to tokens/s (CUDA; ``tigon.workflows.e2e``).

    PYTHONPATH=src python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 \
        --gradient-checkpointing non_reentrant --kernel-summary --steps 4 --warmup 2 \
        --providers original,liger,tigon,original_sac,tigon_sac --out-dir $OUT     # issue 26's full-depth rows
    PYTHONPATH=src python3 benchmarks/e2e_table.py --model qwen2.5-vl-7b --layers 4 --batch-size 4 --seq-len 2048 \
        --providers original,original_compile,tigon,tigon_compile,tigon_lean,liger --timeout 900 --out-dir $OUT
                                                        # a vision-language row: text + one image per sequence
    PYTHONPATH=src python3 benchmarks/e2e_table.py --model benchmarks/configs/gpt-oss-20b --layers 4 \
        --batch-size 4 --seq-len 2048 --timeout 60,original_compile=110,tigon_compile=110 --out-dir $OUT
                                                        # a MoE row from a config.json (benchmarks/configs/README.md)

``--model`` takes what ``tigon bench --e2e`` does: a preset, a config.json or its directory, a cached Hub id; the file
names carry the directory's name (:func:`model_name`).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _tables.py, beside this file

from _tables import (ENV_VARIANTS, gpu_tag, launch, model_name, provider_timeout,  # noqa: E402, F401 (the API)
                     today)

SELECTIVE = ("--gradient-checkpointing", "selective")
VARIANTS = {**{p: (base, env, ()) for p, (base, env) in ENV_VARIANTS.items()},
            **{f"{p}_sac": (p, {}, SELECTIVE) for p in ("tigon", "original")}}  # not liger: its RoPE works in place
"""Table provider -> (``tigon bench --e2e`` provider, extra environment of its process, arguments that replace the
table's own for it)."""


DEFAULT_PROVIDERS = "original,original_compile,liger,liger_cutedsl,tigon,tigon_compile"
"""Issue 28's table: every provider a user could pick. A peer that is not installed, or fails (Liger's CuTe DSL fused
linear CE needs SM100), is a row with its status, not a missing line."""


def run_providers(args) -> list[str]:
    """Run each provider in its own process (:func:`_tables.launch`); returns the JSON paths written."""
    os.makedirs(args.out_dir, exist_ok=True)
    paths = []
    for p in args.providers.split(","):
        path = os.path.join(args.out_dir, f"e2e-{p}_{args.tag}.json")
        base, env, own = VARIANTS.get(p, (p, {}, ()))
        cmd = [sys.executable, "-m", "tigon.cli", "bench", "--e2e", "--model", args.model, "--providers", base,
               "--batch-size", str(args.batch_size), "--seq-len", str(args.seq_len), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--quiet", "--json", path]
        if args.layers:
            cmd += ["--layers", str(args.layers)]
        if args.image_tokens:
            cmd += ["--image-tokens", str(args.image_tokens)]
        if args.lora:
            cmd += ["--lora", str(args.lora)]
        checkpointing = "selective" if own == SELECTIVE else args.gradient_checkpointing
        if checkpointing:
            cmd += ["--gradient-checkpointing", checkpointing]
        if checkpointing == "selective" and args.checkpoint_budget_gb is not None:
            cmd += ["--checkpoint-budget-gb", str(args.checkpoint_budget_gb)]
        if args.kernel_summary:
            cmd += ["--kernel-summary"]
        launch(cmd, path, p, base=base, env=env, limit=provider_timeout(args.timeout, p),
               failed_report=lambda why, p=p: {"model": {"source": args.model}, "device_name": None,
                                               "rows": [{"provider": p, "status": "failed", "note": why}]})
        paths.append(path)
    return paths


def merge(paths: list[str]) -> list[dict]:
    """The rows of the given e2e JSON reports (one provider each, or several), in file order."""
    rows = []
    for path in paths:
        with open(path) as f:
            report = json.load(f)
        for r in report["rows"]:
            rows.append(dict(r, model=report["model"].get("source"), device_name=report.get("device_name")))
    return rows


def table(rows: list[dict]) -> str:
    """tokens/s, step ms, peak GiB and the ratios to original / original_compile, one line per provider."""
    by = {r["provider"]: r for r in rows if r["status"] == "ok"}

    def ratio(r, base):
        b = by.get(base)
        return f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x" if b and r.get("tokens_per_s") else "-"

    lines = [f"{'provider':24s} {'tok/s':>9s} {'step ms':>8s} {'MFU':>6s} {'peak GiB':>9s} {'vs original':>12s} "
             f"{'vs orig+compile':>16s} {'vs liger':>9s}"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['provider']:24s} {r['status']}: {r['note'][:80]}")
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") else "-"
        lines.append(f"{r['provider']:24s} {r['tokens_per_s']:9,.0f} {r['step_ms']:8.2f} {mfu:>6s} "
                     f"{r['peak_memory_bytes'] / 2**30:9.2f} {ratio(r, 'original'):>12s} "
                     f"{ratio(r, 'original_compile'):>16s} {ratio(r, 'liger'):>9s}")
    return "\n".join(lines)


def checkpoint_lines(rows: list[dict]) -> str:
    """Per provider under selective checkpointing: the GiB its layers kept and the recompute avoided."""
    lines = []
    for r in rows:
        c = r.get("checkpointing")
        if c and c.get("policy") == "selective":
            lines.append(f"{r['provider']:24s} kept {c['kept_bytes'] / 2**30:.2f} GiB of budget "
                         f"{c['budget_bytes'] / 2**30:.2f}, recompute avoided {c['flops_avoided'] / 1e12:.1f} TFLOP "
                         f"= {c['ms_avoided']:.1f} ms/step at {c['tflops']:.0f} TFLOP/s")
    return "\n".join(lines)


def kernel_table(rows: list[dict]) -> str:
    """Per provider with a kernel summary (``--kernel-summary``): the profiled step's GPU ms by kernel kind."""
    sums = [(r["provider"], r["kernel_summary"]) for r in rows if r.get("kernel_summary")]
    if not sums:
        return ""
    kinds = sorted({k for _, s in sums for k in s["by_kind"]})
    lines = [f"{'GPU ms of one step':24s} {'total':>8s} " + " ".join(f"{k:>10s}" for k in kinds)]
    for p, s in sums:
        lines.append(f"{p:24s} {s['device_ms']:8.1f} " + " ".join(f"{s['by_kind'].get(k, 0):10.1f}" for k in kinds))
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """Two bar charts: tokens/s and peak memory (GiB) per provider."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    names = [r["provider"] for r in ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.bar(names, [r["tokens_per_s"] / 1e3 for r in ok], color="tab:blue")
    a.set_ylabel("thousand tokens / s (higher is better)")
    b.bar(names, [r["peak_memory_bytes"] / 2**30 for r in ok], color="tab:orange")
    b.set_ylabel("peak memory, GiB (lower is better)")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=30)
    title = f"{ok[0]['model']} on {ok[0]['device_name']}" if ok else "e2e"
    fig.suptitle(f"training step, {title} (one process per provider)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def merged_tag(paths: list[str]) -> str | None:
    """The tag of merged files ``e2e-<provider>_<tag>.json`` (the first one's; None without files), so that
    ``--from-dir``'s plot is named after the rows it merged, not after --model's default."""
    for path in paths:
        with open(path) as f:
            rows = json.load(f).get("rows") or []
        base = os.path.basename(path)
        for r in rows:
            head = f"e2e-{r.get('provider')}_"
            if base.startswith(head) and base.endswith(".json"):
                return base[len(head):-len(".json")]
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--image-tokens", type=int, help="a vision-language model's image tokens per sequence")
    ap.add_argument("--lora", type=int, help="PEFT LoRA rank for every provider's model (tigon bench --lora)")
    ap.add_argument("--gradient-checkpointing", choices=("non_reentrant", "reentrant", "selective"),
                    help="tigon bench --gradient-checkpointing for every provider (the *_sac variants: selective)")
    ap.add_argument("--checkpoint-budget-gb", type=float,
                    help="tigon bench --checkpoint-budget-gb for the providers under selective checkpointing")
    ap.add_argument("--kernel-summary", action="store_true",
                    help="tigon bench --kernel-summary: each provider's last step profiled, kernels by kind printed")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--providers", default=DEFAULT_PROVIDERS)
    ap.add_argument("--out-dir", default="out")
    ap.add_argument("--gpu", help="the GPU's name in the file names (default: h200 / h100 / the device's name, cpu)")
    ap.add_argument("--timeout", default="240",
                    help="seconds per provider's process: N, or N,provider=M,... (default 240)")
    ap.add_argument("--from-dir", help="merge the e2e-*.json files of this folder instead of running")
    ap.add_argument("--png", help="the plot's path")
    args = ap.parse_args()
    try:
        for p in args.providers.split(","):
            provider_timeout(args.timeout, p)
    except ValueError as e:
        ap.error(f"--timeout: {e}")
    date = today()
    args.gpu = args.gpu or gpu_tag()
    lora = f"-lora{args.lora}" if args.lora else ""
    layers = f"-{args.layers}l" if args.layers else ""
    gc = "-gc" if args.gradient_checkpointing else ""
    args.tag = f"{model_name(args.model)}{lora}{layers}{gc}-{args.batch_size}x{args.seq_len}_{args.gpu}_{date}"
    paths = sorted(glob.glob(os.path.join(args.from_dir, "e2e-*.json"))) if args.from_dir else run_providers(args)
    rows = merge(paths)
    print(table(rows))
    print(checkpoint_lines(rows))
    print(kernel_table(rows))
    tag = merged_tag(paths) if args.from_dir else args.tag
    png = args.png or os.path.join(args.from_dir or args.out_dir, f"e2e_{tag or args.tag}.png")
    if rows:
        plot(rows, png)
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
