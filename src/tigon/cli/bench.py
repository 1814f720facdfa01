"""``tigon bench``: speed and peak memory of each op per provider on a model's shapes (:mod:`tigon.workflows.bench`),
or with --e2e whole training steps per provider (:mod:`tigon.workflows.e2e`)."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any

from ._render import (_check_output, _check_output_dir, _console, _csv_list, _dump_report, _fail, _fmt_bytes, _layers,
                      _names, _num, _print_footer, _quiet_transformers, _run_staged)


def add_parser(sub) -> None:
    """Add the ``bench`` subcommand to ``sub`` (the subparsers of :func:`tigon.cli.build_parser`)."""
    from ..ops import registry
    from ..presets import PRESETS
    from ..workflows.bench import PROVIDERS, SWEEPS
    from ..workflows.e2e import E2E_PROVIDERS, PATCH_VARIANTS

    p = sub.add_parser(
        "bench",
        help="speed and peak memory of each op per provider on a model's shapes; --e2e: whole training steps",
        description=(
            "Time every op (fwd, bwd, fwd+bwd: medians with 20/80 percentiles) and its peak extra memory for each "
            "provider on a model's shapes, against the copy bandwidth and matmul rate measured in the same run "
            "(GB/s and % for memory-bound ops, TFLOP/s and % for the fused linear cross-entropy). Providers that "
            "are not installed are skipped with a note; a provider failing on a shape is recorded, not fatal. "
            "With --e2e: training steps of the whole model, original vs Tigon-patched (vs Liger when installed): "
            "tokens/s and peak memory. E2E providers: original (Hugging Face's code), tigon (tigon.patch), "
            + "".join(f"{name} ({text}), " for name, (text, _) in PATCH_VARIANTS.items())
            + "liger (Liger-Kernel, when installed)."
        ),
    )
    p.add_argument("--op", action="append", nargs="+", metavar="OP", type=_names,
                   help=f"ops to run ({', '.join(registry())}), or 'all' (default: the ops the model calls; the norms "
                        "for --sweep hidden)")
    p.add_argument("--model", metavar="MODEL",
                   help=f"a preset ({', '.join(PRESETS)}), a config.json, a checkpoint directory or a cached Hub "
                        "id; only its config is read (default: tiny on CPU, llama3-8b on CUDA)")
    p.add_argument("--providers", metavar="LIST", type=_names,
                   help=f"comma-separated: {','.join(PROVIDERS)} (default: all; without compile, tigon_compile on "
                        f"CPU); with --e2e: {','.join(E2E_PROVIDERS)} (see the description above)")
    p.add_argument("--sweep", choices=SWEEPS,
                   help="tokens: 1k..64k tokens on CUDA (powers of two), tiny sizes on CPU; hidden: the norms at "
                        "hidden 1024..16384")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                   help="input dtype (default: bfloat16; with --e2e: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--tokens", type=int, metavar="N", help="tokens per op without --sweep (16384 CUDA, 64 CPU)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: auto (CUDA if any)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="time CUDA-graph replays: the kernels' own time without host launch/autograd overhead "
                        "(providers that wait on the host: their kernels' summed durations)")
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    p.add_argument("--csv", metavar="PATH", help="write one CSV line per measurement")
    p.add_argument("--plot-dir", metavar="DIR", help="write bench_<op>.png (time and memory against the sweep axis)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no tables; one summary line")
    g = p.add_argument_group("end to end (--e2e)")
    g.add_argument("--e2e", action="store_true", help="time whole training steps instead of single ops")
    g.add_argument("--layers", type=int, metavar="N", help="keep N decoder layers (default on CUDA: llama3-8b, 2)")
    g.add_argument("--batch-size", type=int, metavar="N", help="sequences per step (2 on CPU, 4 on CUDA)")
    g.add_argument("--seq-len", type=int, metavar="N", help="tokens per sequence (32 on CPU, 2048 on CUDA)")
    g.add_argument("--image-tokens", type=int, metavar="N",
                   help="a vision-language model's image tokens per sequence (Qwen-VL, GLM-4V, Gemma 4: the image's "
                        "size; default --seq-len / 4; an error for the other families, whose count their config "
                        "fixes, and for text-only models)")
    g.add_argument("--steps", type=int, metavar="N", help="timed steps (2 on CPU, 10 on CUDA)")
    g.add_argument("--warmup", type=int, metavar="N", help="untimed steps first (1 on CPU, 3 on CUDA)")
    g.add_argument("--seed", type=int, default=0, metavar="N", help="weights and batches (default: 0)")
    g.add_argument("--attn-implementation", metavar="NAME",
                   help="transformers' attention implementation for the model: eager, sdpa, flash_attention_2, "
                        "flex_attention, ... or a Hub kernel org/repo (default: transformers' default)")
    g.add_argument("--lora", type=int, metavar="R",
                   help="LoRA fine-tuning: wrap every provider's model with PEFT LoRA of rank R on "
                        "q/k/v/o/gate/up/down (alpha 2R, dropout 0, LM head frozen; needs peft)")
    g.add_argument("--gradient-checkpointing", choices=("non_reentrant", "reentrant", "selective"),
                   help="activation checkpointing on every provider's model before its patch: Hugging Face's "
                        "(use_reentrant False / True), or selective: non-reentrant, each layer keeping the matmul "
                        "and attention outputs that fit --checkpoint-budget-gb (tigon.checkpointing)")
    g.add_argument("--checkpoint-budget-gb", type=float, metavar="GB",
                   help="with --gradient-checkpointing selective: GiB the layers may keep over plain checkpointing "
                        "(default: the room a full fine-tune's peak at the optimizer step leaves, the run's foreach "
                        "AdamW temporary included: tigon.checkpointing.auto_budget)")
    g.add_argument("--kernel-summary", action="store_true",
                   help="profile each provider's last step (not timed) and report its GPU kernels by name and kind")
    g.add_argument("--nproc", type=int, metavar="N",
                   help="processes: N > 1 launches N ranks through torch.distributed.run (gloo on CPU, NCCL on CUDA, "
                        "one GPU each), each on its own --batch-size sequences; per-rank peak memory, global tokens/s "
                        "(default: 1)")
    g.add_argument("--parallel", choices=("ddp", "fsdp2"),
                   help="with --nproc > 1: DistributedDataParallel, or FSDP2 fully_shard on each decoder layer and "
                        "the root (default: ddp)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``tigon bench`` with the parsed ``args``; returns the exit status."""
    prog = "tigon bench"
    for path, flag in ((args.json, "--json"), (args.csv, "--csv")):
        problem = _check_output(path, flag)
        if problem:
            return _fail(prog, problem)
    problem = _check_output_dir(args.plot_dir, "--plot-dir")
    if problem:
        return _fail(prog, problem)
    e2e_only = [f for f, v in (("--layers", args.layers), ("--batch-size", args.batch_size),
                               ("--seq-len", args.seq_len), ("--image-tokens", args.image_tokens),
                               ("--steps", args.steps), ("--warmup", args.warmup),
                               ("--attn-implementation", args.attn_implementation), ("--lora", args.lora),
                               ("--gradient-checkpointing", args.gradient_checkpointing),
                               ("--checkpoint-budget-gb", args.checkpoint_budget_gb),
                               ("--kernel-summary", args.kernel_summary or None), ("--nproc", args.nproc),
                               ("--parallel", args.parallel))
                if v is not None]
    ops_only = [f for f, v in (("--op", args.op), ("--sweep", args.sweep), ("--tokens", args.tokens),
                               ("--csv", args.csv), ("--plot-dir", args.plot_dir),
                               ("--cuda-graph", args.cuda_graph or None)) if v is not None]
    if args.e2e and ops_only:
        return _fail(prog, f"{', '.join(ops_only)} {'does' if len(ops_only) == 1 else 'do'} not apply to --e2e")
    if not args.e2e and e2e_only:
        return _fail(prog, f"{', '.join(e2e_only)} {'needs' if len(e2e_only) == 1 else 'need'} --e2e")
    _quiet_transformers()
    return _bench_e2e(args, prog) if args.e2e else _bench_ops(args, prog)


def _bench_ops(args: argparse.Namespace, prog: str) -> int:
    from ..workflows.bench import BenchConfig, available_providers, plan, resolve_bench, run_op_bench
    from ..workflows.compare import ConfigError

    config = BenchConfig(ops=_csv_list(args.op), model=args.model, providers=_csv_list(args.providers),
                         sweep=args.sweep, dtype=args.dtype or "bfloat16", tokens=args.tokens, device=args.device,
                         cuda_graph=args.cuda_graph)
    try:
        resolved, shapes, _, _ = resolve_bench(config)
        total = len(plan(resolved.ops, shapes, available_providers(resolved.providers)[0]))
        # The JSON is rewritten after every (op, provider, shape): a run cut short by a time limit keeps its rows.
        run = functools.partial(run_op_bench, on_rows=(lambda r: r.write_json(args.json)) if args.json else None)
        result = _run_staged(run, config, args.quiet, total)
    except (ConfigError, ValueError) as e:
        return _fail(prog, str(e))
    report = result.as_dict()
    written = []
    if args.json:
        result.write_json(args.json)
        written.append(args.json)
    if args.csv:
        result.write_csv(args.csv)
        written.append(args.csv)
    if args.plot_dir:
        from .._plot import plot_bench

        os.makedirs(args.plot_dir, exist_ok=True)
        written += plot_bench(report, args.plot_dir)
    if args.quiet:
        ok = [r for r in report["rows"] if r["ms"] is not None]
        failed = sum(1 for r in report["rows"] if r["ms"] is None)
        print(f"rows={len(ok)} failed={failed} ops={','.join(resolved.ops)} "
              f"providers={','.join(sorted({r['provider'] for r in ok}))} device={report['device']}")
    else:
        _render_bench(report, written)
    return 0


def _render_bench(r: dict[str, Any], written: list[str]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    rows = r["rows"]
    by = {}
    for row in rows:
        by[(row["op"], json.dumps(row["shape"], sort_keys=True), row["provider"], row["mode"])] = row
    axis = {"tokens": "tokens", "hidden": "hidden"}.get(r.get("sweep"))
    formats = ", ".join(f"{op} {fmt}" for op, fmt in r.get("size_formats", {}).items()
                        if any(x["op"] == op for x in rows))
    table = Table(title=f"tigon bench: {r['model'].get('name', '')} shapes, {rows[0]['dtype'] if rows else ''}, "
                        f"{r['device']}", title_justify="left",
                  caption="ms: medians (fwd+bwd: p20-p80); throughput: fwd+bwd over minimal bytes / matmul FLOPs, "
                          "% of the measured ceiling; mem: peak extra memory of fwd+bwd; size: " + (axis or formats))
    for col, just in (("op", "left"), ("size", "left"), ("provider", "left"), ("fwd", "right"), ("bwd", "right"),
                      ("fwd+bwd", "right"), ("throughput", "right"), ("mem", "right"), ("vs eager", "right")):
        table.add_column(col, justify=just, overflow="fold")
    failures = []
    last_op = None
    for (op, shape_key, prov, mode), row in by.items():
        if mode != "fwd_bwd":
            continue
        if last_op is not None and op != last_op:
            table.add_section()
        last_op = op
        shape = row["shape"]
        size = str(shape.get(axis)) if axis else row.get("size") or " ".join(f"{k}={v}" for k, v in shape.items())
        if row["ms"] is None:
            failures.append(f"{op} {prov} ({size}): {row['note']}")
            table.add_row(op, size, prov, "-", "-", "[red]failed[/]", "", "", "")
            continue
        fwd, bwd = by.get((op, shape_key, prov, "fwd")), by.get((op, shape_key, prov, "bwd"))
        thr = "-"
        if row["gbps"] is not None:
            thr = _num(row["gbps"], " GB/s") + (f"\n{row['pct_copy_bw']:.0f}%" if row["pct_copy_bw"] else "")
        elif row["tflops"] is not None:
            thr = _num(row["tflops"], " TFLOP/s") + (f"\n{row['pct_matmul']:.0f}%" if row["pct_matmul"] else "")
        eager = by.get((op, shape_key, "eager", "fwd_bwd"))
        vs = f"{eager['ms'] / row['ms']:.3g}x" if eager and eager["ms"] and prov != "eager" else ""
        spread = f"\n({_num(row['ms_p20'])}-{_num(row['ms_p80'])})" if row["ms_p20"] is not None else ""
        table.add_row(op, size, prov, _num(fwd["ms"]) if fwd else "-", _num(bwd["ms"]) if bwd else "-",
                      _num(row["ms"]) + spread, thr, _fmt_bytes(row["peak_extra_bytes"]) if
                      row["peak_extra_bytes"] is not None else "-", vs)
    console.print(table)
    c = r["ceilings"]
    if c.get("copy_gbps"):
        console.print(f"ceilings: copy {_num(c['copy_gbps'])} GB/s, matmul {_num(c['matmul_tflops'])} TFLOP/s "
                      f"({c.get('matmul_dtype')} {c.get('matmul_size')}^3), {c.get('note', '')}", highlight=False)
    for f in failures:
        console.print(f"[red]{escape(f)}[/red]", highlight=False)
    for s in r["skipped"]:
        console.print(f"[yellow]skipped: {escape(s)}[/yellow]", highlight=False)
    _print_footer(console, r["notes"], written)


def _bench_e2e(args: argparse.Namespace, prog: str) -> int:
    from ..workflows.compare import ConfigError
    from ..workflows.compare_dist import DistributedRunError
    from ..workflows.e2e import E2EConfig, resolve_e2e, run_e2e

    config = E2EConfig(model=args.model, layers=args.layers, batch_size=args.batch_size, seq_len=args.seq_len,
                       image_tokens=args.image_tokens, steps=args.steps, warmup=args.warmup,
                       providers=_csv_list(args.providers), dtype=args.dtype, device=args.device, seed=args.seed,
                       attn_implementation=args.attn_implementation, lora_rank=args.lora,
                       gradient_checkpointing=args.gradient_checkpointing,
                       checkpoint_budget_gb=args.checkpoint_budget_gb, kernel_summary=args.kernel_summary,
                       nproc=1 if args.nproc is None else args.nproc, parallel=args.parallel)
    try:
        resolve_e2e(config)
        result = _run_staged(run_e2e, config, args.quiet)
    except (ConfigError, ValueError) as e:
        return _fail(prog, str(e))
    except DistributedRunError as e:  # --nproc N: the ranks crashed (their output was shown)
        return _fail(prog, str(e), 1)
    report = result.as_dict()
    if args.json:
        _dump_report(args.json, report)
    if args.quiet:
        print(" ".join(f"{row['provider']}={_num(row['tokens_per_s'])}tok/s" if row["status"] == "ok"
                       else f"{row['provider']}={row['status']}" for row in report["rows"])
              + f" device={report['device']}")
        for row in report["rows"]:  # why a provider did not run (one line each, on stderr)
            if row["status"] != "ok" and row.get("note"):
                print(f"{row['provider']} {row['status']}: {row['note']}", file=sys.stderr)
    else:
        _render_e2e(report, args.json)
    return 0


def _render_e2e(r: dict[str, Any], written: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    cfg, model = r["config"], r["model"]
    table = Table(title=f"tigon bench --e2e: {model['source']} ({_layers(model)}), "
                        f"{cfg['batch_size']} x {cfg['seq_len']} tokens, {cfg['dtype']}, {r['device']}"
                        + (f", {r['distributed']['nproc']} ranks ({r['distributed']['parallel']}, "
                           f"{r['distributed']['backend']}): per rank" if r.get("distributed") else ""),
                  title_justify="left")
    for col in ("provider", "tokens/s", "step ms (p20-p80)", "speed-up", "MFU", "peak memory", "memory",
                "loss (first)", "backend / patch"):
        table.add_column(col, justify="left" if col in ("provider", "backend / patch") else "right",
                         overflow="fold")
    for row in r["rows"]:
        p = row["provider"]
        if row["status"] != "ok":
            table.add_row(p, f"[yellow]{row['status']}[/]", "", "", "", "", "", "", escape(row["note"]))
            continue
        sp, mem = r["speedup"].get(p), r["memory_ratio"].get(p)
        patch = ", ".join(f"{k} x{v}" for k, v in row["patch"].items()) if row["patch"] else ""
        table.add_row(p, _num(row["tokens_per_s"]),
                      f"{_num(row['step_ms'])} ({_num(row['step_ms_p20'])}-{_num(row['step_ms_p80'])})",
                      f"{sp:.2f}x" if sp else "-", f"{row['mfu']:.1%}" if row.get("mfu") else "-",
                      _fmt_bytes(row["peak_memory_bytes"]),
                      f"{mem:.2f}x" if mem else "-", f"{row['losses'][0]:.4f}" if row["losses"] else "-",
                      escape(f"{row['backend']}" + (f"; {patch}" if patch else "")))
    console.print(table)
    if r.get("distributed"):
        ranks = Table(title="Ranks: peak memory, tokens/s", title_justify="left",
                      caption="the table above: the largest rank's memory, all ranks' tokens/s over the slowest "
                              "rank's step times")
        ranks.add_column("provider")
        n = r["distributed"]["nproc"]
        for i in range(n):
            ranks.add_column(f"rank {i}", justify="right")
        for row in r["rows"]:
            if row.get("ranks"):
                ranks.add_row(row["provider"], *(f"{_fmt_bytes(x['peak_memory_bytes'])}, {_num(x['tokens_per_s'])}"
                                                 for x in row["ranks"]))
        console.print(ranks)
    console.print(f"model: {model.get('architecture')}, {model.get('num_parameters') or 0:,} parameters, hidden "
                  f"{model.get('hidden_size')}, vocab {model.get('vocab_size')}, attention "
                  f"{model.get('attn_implementation') or 'default'}; device {r['device_name']}; "
                  f"memory: {r['peak_memory_method']}", highlight=False)
    _print_footer(console, r["notes"], written)
