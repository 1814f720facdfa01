"""``tigon verify``: each op's outputs and gradients against PyTorch and float64 on a model's shapes (the checks are
:mod:`tigon.workflows.verify`); exit status 1 when anything fails."""

from __future__ import annotations

import argparse
from typing import Any

from ._render import (_check_output, _console, _csv_list, _dump_report, _fail, _fmt_rel, _names, _print_footer,
                      _quiet_transformers)


def add_parser(sub) -> None:
    """Add the ``verify`` subcommand to ``sub`` (the subparsers of :func:`tigon.cli.build_parser`)."""
    from ..presets import PRESETS
    from ..ops import registry
    from ..workflows import verify as V

    p = sub.add_parser(
        "verify",
        help="check each op's outputs and gradients against PyTorch and float64 on a model's shapes",
        description=(
            "For each op, dtype and shape (from the model config, plus odd sizes), run the Tigon op and the original "
            "PyTorch code forward and backward and compare every output and gradient with a float64 evaluation. "
            f"A tensor passes when tigon_err <= max({V.FACTOR:g} x original_err, floor) (relative L2; floors "
            + ", ".join(f"{k} {v:g}" for k, v in V.FLOORS.items()) + "). Also checks that with the kernels turned "
            "off (force_reference) the results equal the reference exactly. Exit status 1 when anything fails."
        ),
    )
    p.add_argument("--op", action="append", nargs="+", metavar="OP", type=_names,
                   help=f"ops to verify: names, comma-separated or repeated, or 'all' (default: all: "
                        f"{', '.join(registry())})")
    p.add_argument("--dtype", metavar="LIST", type=_names,
                   help=f"comma-separated dtypes from {', '.join(V.DTYPES)} (default: {','.join(V.DEFAULT_DTYPES)})")
    p.add_argument("--model", metavar="MODEL",
                   help=f"shapes from a preset ({', '.join(PRESETS)}), a config.json, a checkpoint directory or a "
                        f"cached Hub id (default: {V.DEFAULT_MODEL['cpu']} on CPU, {V.DEFAULT_MODEL['cuda']} on CUDA); "
                        "given, it also restricts the ops to those tigon.patch runs in that model (exit status 2 when "
                        "there are none)")
    p.add_argument("--lora", type=int, metavar="R",
                   help="find the model's ops with it wrapped by PEFT LoRA of rank R (as bench --e2e --lora): adds "
                        "the LoRA ops tigon.patch runs there (lora_linear, lora_glu_mlp / lora_gate_up_mlp); implies "
                        "--model's restriction (default model as above)")
    p.add_argument("--device", default="auto", choices=list(V.DEVICES), help="default: auto (CUDA if any)")
    p.add_argument("--tokens", type=int, metavar="N",
                   help=f"tokens per case (default: {V.CPU_TOKENS} on CPU, {V.CUDA_TOKENS} on CUDA)")
    p.add_argument("--max-vocab", type=int, metavar="N",
                   help=f"cap the vocabulary (default: {V.CPU_MAX_VOCAB} on CPU, none on CUDA; 0 = no cap)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seeds the inputs (default: 0)")
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table; failures and one summary line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``tigon verify`` with the parsed ``args``; returns the exit status."""
    import warnings

    from ..workflows.compare import ConfigError
    from ..workflows.model_source import load_model_config
    from ..workflows.verify import VerifyConfig, resolve_config, run_verify

    prog = "tigon verify"
    problem = _check_output(args.json, "--json")
    if problem:
        return _fail(prog, problem)
    ops = _csv_list(args.op)
    config = VerifyConfig(ops=ops or None, dtypes=args.dtype, model=args.model, device=args.device, tokens=args.tokens,
                          max_vocab=args.max_vocab, seed=args.seed, lora_rank=args.lora)
    _quiet_transformers()
    try:
        config = resolve_config(config)
        load_model_config(config.model)  # a bad MODEL fails here, before any progress display
        with warnings.catch_warnings():
            # Triton's interpreter evaluates exp() in numpy, which warns on overflow to inf (the correct limit).
            warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)
            if args.quiet:
                result = run_verify(config)
            else:
                with _VerifyProgress() as progress:
                    result = run_verify(config, progress=progress)
    except (ConfigError, ImportError) as e:
        return _fail(prog, str(e))
    report = result.as_dict()
    if args.json:
        _dump_report(args.json, report)
    if args.quiet:
        for row in result.failures:
            print(f"FAIL {row['op']} [{row['case']}] {row['dtype']} {row['shape']} {row['tensor']}: "
                  f"tigon {_fmt_rel(row['tigon_err'])} > bound {_fmt_rel(row['bound'])} "
                  f"(original {_fmt_rel(row['original_err'])})")
        print(_verify_summary(report))
    else:
        _render_verify(report, args.json)
    return 0 if report["passed"] else 1


class _VerifyProgress:
    """A rich progress bar (on stderr) fed by run_verify's ``progress(done, total, label)`` callback."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(SpinnerColumn(), TextColumn("verify"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("{task.description}"),
                                  console=Console(stderr=True), transient=True)
        self._task = None

    def __enter__(self):
        self._progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def __call__(self, done: int, total: int, label: str) -> None:
        if self._task is None:
            self._task = self._progress.add_task(label, total=total)
        self._progress.update(self._task, completed=done, description=label)


def _verify_counts(r: dict[str, Any]) -> tuple[int, int, int, int]:
    ok = sum(1 for row in r["results"] if row["passed"])
    exact = sum(1 for f in r["fallback"] if f["equal"])
    return ok, len(r["results"]), exact, len(r["fallback"])


def _verify_summary(r: dict[str, Any]) -> str:
    ok, n, exact, nf = _verify_counts(r)
    status = "passed" if r["passed"] else "FAILED"
    errs = f", {len(r['errors'])} errors" if r["errors"] else ""
    return (f"tigon verify: {status}: {ok}/{n} tensors within bound, {exact}/{nf} fallback checks exact{errs}; "
            f"device={r['device']} backend={r['backend']} model={r['model']['source']} "
            f"time={r['elapsed_s']:.1f}s")


def _render_verify(r: dict[str, Any], written: str | None) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
    console.print(f"[bold]tigon verify[/] {escape(r['model']['source'])} on {r['device']}, backend {r['backend']}: "
                  "relative L2 error (err) and max |x - truth| against float64, Tigon and the original",
                  highlight=False)
    by_op: dict[str, list[dict[str, Any]]] = {}
    for row in r["results"]:
        by_op.setdefault(row["op"], []).append(row)
    for op, rows in by_op.items():
        table = Table(title=f"{op}  [dim](original: {escape(r['originals'].get(op, '?'))})[/]", title_justify="left",
                      box=box.SIMPLE_HEAD, collapse_padding=True, pad_edge=False)
        for col in ("case", "dtype", "shape", "tensor", "err\ntigon", "err\noriginal", "max|Δ|\ntigon",
                    "max|Δ|\noriginal", "bound", ""):
            numeric = col[:3] in ("err", "max", "bou")
            table.add_column(col, justify="right" if numeric else "left", no_wrap=col != "case", overflow="fold",
                             min_width=10 if col == "case" else None)
        last = None
        for row in rows:
            unit = (row["case"], row["dtype"], row["shape"])
            if last is not None and unit != last:
                table.add_section()
            shown = (unit[0], short.get(unit[1], unit[1]), unit[2].replace(", ", "\n")) if unit != last else ("",) * 3
            last = unit
            mark = "[green]ok[/]" if row["passed"] else "[bold red]FAIL[/]"
            table.add_row(*shown, row["tensor"], *(f"{row[k]:.1e}" for k in ("tigon_err", "original_err",
                                                                             "tigon_max_abs", "original_max_abs",
                                                                             "bound")), mark)
        console.print(table)
    bad_fallback = [f for f in r["fallback"] if not f["equal"]]
    for f in bad_fallback:
        console.print("[bold red]FAIL[/] fallback " + escape(f"{f['op']} [{f['case']}] {f['dtype']} {f['shape']}: "
                      f"differs from the reference in {', '.join(f['mismatched'])}"), highlight=False)
    for e in r["errors"]:
        console.print("[bold red]ERROR[/] " + escape(f"{e['op']} [{e['case']}] {e['dtype']} {e['variant']}: "
                                                     f"{e['error']}"), highlight=False)
    ok, n, exact, nf = _verify_counts(r)
    summary = Table(title="Summary", title_justify="left", show_header=False)
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    summary.add_row("result", "[green]passed[/]" if r["passed"] else "[bold red]FAILED[/]")
    summary.add_row("tensors within bound", f"{ok}/{n}")
    summary.add_row("fallback exact", f"{exact}/{nf} (force_reference: outputs and gradients equal the reference)")
    summary.add_row("device", f"{r['device']} ({r['device_name']})")
    decided: dict[tuple[str, str], list[str]] = {}
    for d, b in r["backends"].items():
        decided.setdefault((b["backend"], b["reason"]), []).append(d)
    summary.add_row("backend", f"{r['backend']} (ran); decided: " + "; ".join(
        f"{backend} for {', '.join(ds)} ({reason})" for (backend, reason), ds in decided.items()))
    m = r["shapes"]["model"]
    summary.add_row("shapes", f"tokens {m['tokens']}, hidden {m['hidden']}, intermediate {m['intermediate']}, "
                              f"heads {m['heads']}/{m['kv_heads']} x {m['head_dim']}, vocab {m['vocab']}; odd rows: "
                              + ", ".join(f"{k} {v}" for k, v in r["shapes"]["odd"].items()
                                          if k in ("tokens", "hidden", "intermediate", "head_dim", "vocab")))
    for cap in r["caps"]:
        summary.add_row("capped", cap)
    summary.add_row("originals", "\n".join(f"{op}: {escape(name)}" for op, name in r["originals"].items()))
    summary.add_row("time", f"{r['elapsed_s']:.1f} s")
    console.print(summary)
    _print_footer(console, r["notes"], written)
