"""``tigon compare``: train a model twice from one seed, original and Tigon-patched, and compare losses, speed and
memory (the workflow is :mod:`tigon.workflows.compare`; this module parses, renders and writes --json/--plot)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import warnings
from typing import Any

from ._render import _check_output, _console, _fail, _fmt_bytes, _fmt_rel, _print_footer, _quiet_transformers


def add_parser(sub) -> None:
    """Add the ``compare`` subcommand to ``sub`` (the subparsers of :func:`tigon.cli.build_parser`)."""
    from ..presets import PRESETS
    from ..workflows.compare import DEFAULTS, PRETRAINED_LR, RANDOM_INIT_LR

    p = sub.add_parser(
        "compare",
        help="train a model twice from one seed, original and Tigon-patched, and compare losses, speed, memory",
        description=(
            "Train the same model twice from the same seed and batches, original and Tigon-patched (tigon.patch), "
            "and report both loss curves, their largest relative difference, tokens/s, peak memory, the device and "
            "which backend the kernels took, and a verdict: whether the losses agree within the bound expected for "
            "the dtype (largest per-step relative difference <= 1e-3 in float32, 5e-2 in bfloat16 and float16). "
            "Without --preset/--model: a small Llama (random weights, byte-level tokens) on the text of Python's "
            "pydoc_data.topics."
        ),
        epilog=(
            "exit status: 0 both runs ok and their losses agree within the bound; 1 a run crashed (it raised: its "
            "status is 'crashed', with the exception's type and message), or its loss went "
            "NaN/inf or diverged (such losses say nothing about the kernels); 2 bad input; 3 both runs ok but the "
            "losses differ beyond the bound (a Tigon op computes something other than the original: tigon verify "
            "checks each op)."
        ),
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", metavar="NAME",
                     help=f"model shapes with random weights: {', '.join(PRESETS)} "
                          f"(default: {DEFAULTS['cpu']['preset']} on CPU, {DEFAULTS['cuda']['preset']} on CUDA)")
    src.add_argument("--model", metavar="MODEL",
                     help="a config.json (random weights), a checkpoint directory (its weights, if any, and "
                          "tokenizer) or a Hub id already in the local Hugging Face cache (never downloaded)")
    p.add_argument("--layers", type=int, metavar="N", help="keep N decoder layers (num_hidden_layers)")
    cpu, cuda = DEFAULTS["cpu"], DEFAULTS["cuda"]
    p.add_argument("--steps", type=int, metavar="N",
                   help=f"optimizer steps per run (default: {cpu['steps']} on CPU, {cuda['steps']} on CUDA)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help=f"sequences per step (default: {cpu['batch_size']} on CPU, {cuda['batch_size']} on CUDA)")
    p.add_argument("--seq-len", type=int, metavar="N",
                   help=f"tokens per sequence (default: {cpu['seq_len']} on CPU, {cuda['seq_len']} on CUDA)")
    p.add_argument("--lr", type=float,
                   help=f"AdamW learning rate (default: the preset's; for --model {_fmt_lr(PRETRAINED_LR)} with "
                        f"weights, {_fmt_lr(RANDOM_INIT_LR)} for a config without: random weights)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="float32; bfloat16 = weights, grads and AdamW state all in bf16; float16 = autocast over fp32 "
                        "weights with a GradScaler (default: float32)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: auto (CUDA if any)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seeds the weights and the batches (default: 0)")
    p.add_argument("--nproc", type=int, default=1, metavar="N",
                   help="processes: N > 1 launches N ranks through torch.distributed.run (gloo on CPU, NCCL on CUDA, "
                        "one GPU each), each training on its own --batch-size sequences; reports per-rank peak "
                        "memory and global tokens/s (default: 1, one process)")
    p.add_argument("--parallel", default=None, choices=["ddp", "fsdp2", "tp", "fsdp2_tp"],
                   help="needs --nproc > 1: DistributedDataParallel, FSDP2 fully_shard on each decoder layer and "
                        "the root, or tp: torch's tensor-parallel plan of the decoder and LM head, the ranks sharing "
                        "the sequences, or fsdp2_tp: tp in groups of 2 ranks, FSDP2 across them "
                        "(a 2-D mesh; --nproc >= 4) (default with --nproc > 1: ddp)")
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    p.add_argument("--plot", metavar="PATH", help="write a PNG of both loss curves and their relative difference")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no tables; one summary line")
    p.set_defaults(func=run)


def _fmt_lr(x: float) -> str:
    """A learning rate as the help writes it: ``1e-5``, ``3e-4``."""
    return f"{x:.0e}".replace("e-0", "e-")


def run(args: argparse.Namespace) -> int:
    """Run ``tigon compare`` with the parsed ``args``; returns the exit status."""
    from ..support import UnsupportedError
    from ..workflows.compare import CompareConfig, ConfigError, RunCrashed, resolve_config, run_compare
    from ..workflows.compare_dist import DistributedRunError

    prog = "tigon compare"
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        problem = _check_output(path, flag)
        if problem:
            return _fail(prog, problem)
    if args.plot:
        from matplotlib.figure import Figure

        formats = Figure().canvas.get_supported_filetypes()
        ext = os.path.splitext(args.plot)[1].lstrip(".").lower()
        if ext not in formats:
            return _fail(prog, f"--plot {args.plot}: unsupported image format {ext or '(none)'!r} "
                               f"(use one of {', '.join(sorted(formats))})")
    config = CompareConfig(
        preset=args.preset, model=args.model, layers=args.layers, steps=args.steps, batch_size=args.batch_size,
        seq_len=args.seq_len, lr=args.lr, dtype=args.dtype, device=args.device, seed=args.seed, nproc=args.nproc,
        parallel=args.parallel,
    )
    try:
        config = resolve_config(config)  # bad arguments fail here, before any progress display
    except ConfigError as e:
        return _fail(prog, str(e))
    _quiet_transformers()
    try:
        with warnings.catch_warnings():
            # Triton's interpreter computes in numpy, which warns on overflow and NaN; a run that produces them is
            # reported as non-finite or diverged instead.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"(numpy|triton)\.")
            if args.quiet:
                result = run_compare(config)
            else:
                with _RichProgress() as progress:
                    result = run_compare(config, progress=progress)
    except ConfigError as e:
        return _fail(prog, str(e))
    except UnsupportedError as e:  # strict mode (TIGON_STRICT=1) and no Triton path
        return _fail(prog, str(e))
    except DistributedRunError as e:  # --nproc N: the ranks crashed (their output was shown)
        return _fail(prog, str(e), 1)
    except RunCrashed as e:  # a run raised: its status is "crashed", with the exception's type and message
        if args.json:
            with open(args.json, "w") as f:
                json.dump(e.as_dict(), f, indent=2)
                f.write("\n")
        if args.quiet:
            print(f"status={e.run}:crashed")
        return _fail(prog, str(e), 1)
    report = result.as_dict()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    if args.plot:
        from .._plot import plot_compare

        plot_compare(report, args.plot)
    if args.quiet:
        print(_summary_line(report))
    else:
        _render_compare(report, written=[p for p in (args.json, args.plot) if p])
    if not report["ok"]:
        return _fail(prog, _status_text(report), 1)
    if report["losses_agree"] is False:
        return _fail(prog, f"{report['agreement']['summary']}; tigon verify checks each op", 3)
    return 0


class _RichProgress:
    """A rich progress bar (on stderr) fed by run_compare's ``progress(run, step, steps, loss)`` callback."""

    def __init__(self):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(),
            console=Console(stderr=True), transient=True,
        )
        self._tasks: dict[str, Any] = {}
        self._prep = None

    def __enter__(self):
        self._progress.__enter__()
        self._prep = self._progress.add_task("preparing (model, batches, warm-up)", total=None, loss="-")
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc)

    def __call__(self, run: str, step: int, steps: int, loss: float) -> None:
        if self._prep is not None:
            self._progress.remove_task(self._prep)
            self._prep = None
        if run not in self._tasks:
            self._tasks[run] = self._progress.add_task(run, total=steps, loss="-")
        self._progress.update(self._tasks[run], completed=step, loss=f"{loss:.4f}")


def _status_text(r: dict[str, Any]) -> str:
    """``ok``, or which runs are non-finite / diverged and why."""
    bad = [f"the {run} run is {status}: {r['status_detail'][run]}" for run, status in r["status"].items()
           if status != "ok"]
    return "; ".join(bad) + "; lower --lr" if bad else "ok"


def _summary_line(r: dict[str, Any]) -> str:
    tps, a = r["tokens_per_s"], r["agreement"]
    status = "ok" if r["ok"] else ",".join(f"{run}:{s}" for run, s in r["status"].items() if s != "ok")
    verdict = a["verdict"].replace(" ", "_")
    line = f"status={status} verdict={verdict} max_rel_loss_diff={_fmt_rel(r['max_rel_loss_diff'])}"
    if a["verdict"] != "not judged":
        line += f" last_rel_loss_diff={_fmt_rel(r['rel_loss_diff'][-1])} bound={a['bound']:.0e}"
    line += (f" tokens_per_s original={tps['original']:.0f} patched={tps['patched']:.0f} device={r['device']} "
             f"backend={r['backend']}")
    dist = r.get("distributed")
    return line + (f" nproc={dist['nproc']} parallel={dist['parallel']}" if dist else "")


def _render_compare(r: dict[str, Any], written: list[str]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    cfg, model, data = r["config"], r["model"], r["data"]
    n = len(r["loss_original"])

    steps = Table(title="Loss per step", title_justify="left")
    steps.add_column("step", justify="right")
    steps.add_column("original", justify="right")
    steps.add_column("patched", justify="right")
    steps.add_column("rel. diff", justify="right")
    shown = list(range(n)) if n <= 30 else list(range(10)) + [None] + list(range(n - 10, n))
    for i in shown:
        if i is None:
            steps.add_row("…", "…", "…", "…")
            continue
        steps.add_row(str(i + 1), f"{r['loss_original'][i]:.6f}", f"{r['loss_patched'][i]:.6f}",
                      _fmt_rel(r["rel_loss_diff"][i]))
    if n > 30:
        steps.caption = f"{n} steps, 20 shown; all in --json"
    console.print(steps)

    runs = Table(title="Runs", title_justify="left")
    runs.add_column("")
    runs.add_column("original", justify="right")
    runs.add_column("patched", justify="right")
    for label, key, fmt in (
        ("tokens/s" + (" (global)" if r.get("distributed") else ""), "tokens_per_s", lambda v: f"{v:,.0f}"),
        ("peak memory" + (" (largest rank)" if r.get("distributed") else ""), "peak_memory_bytes", _fmt_bytes),
        ("wall time (s)", "wall_time_s", lambda v: f"{v:.1f}"),
    ):
        runs.add_row(label, fmt(r[key]["original"]), fmt(r[key]["patched"]))
    runs.add_row("median step (ms)", *(f"{statistics.median(r['step_time_s'][k]) * 1e3:.1f}"
                                       for k in ("original", "patched")))
    runs.add_row("final loss", f"{r['loss_original'][-1]:.6f}", f"{r['loss_patched'][-1]:.6f}")
    if r.get("grad_scaler"):
        runs.add_row("fp16 skipped steps", *(", ".join(map(str, r["grad_scaler"][k]["skipped_steps"])) or "none"
                                             for k in ("original", "patched")))
    runs.add_row("status", *(s if s == "ok" else f"[bold red]{s.upper()}[/]" for s in
                             (r["status"]["original"], r["status"]["patched"])))
    console.print(runs)
    if r.get("ranks"):
        console.print(_ranks_table(r))

    summary = Table(title="Summary", title_justify="left", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    a = r["agreement"]
    if not r["ok"]:
        summary.add_row("result", f"[bold red]FAILED[/]: {escape(_status_text(r))}")
    elif a["verdict"] == "differ":
        summary.add_row("result", f"[bold red]FAILED[/]: {escape(a['summary'])}")
    else:
        summary.add_row("result", f"[green]{escape(a['summary'])}[/]")
    summary.add_row("max rel. loss diff", f"{_fmt_rel(r['max_rel_loss_diff'])} (step {r['max_rel_loss_diff_step']})"
                    + (f"; {_fmt_rel(a['max_rel_loss_diff'])} (step {a['max_rel_loss_diff_step']}) over the "
                       f"{a['steps_judged']} steps judged" if a["detail"] else ""))
    summary.add_row("last rel. loss diff", f"{_fmt_rel(r['rel_loss_diff'][-1])} (step {n})")
    summary.add_row("bound", f"{a['bound']:.0e} for {a['dtype']}: {escape(a['bound_reason'])}")
    summary.add_row("device", f"{r['device']} ({r['device_name']})")
    summary.add_row("backend", f"{r['backend']}: {r['backend_reason']}")
    summary.add_row("ops (patched run)", ", ".join(f"{op} {'/'.join(f'{b} x{c}' for b, c in per.items())}"
                                                 for op, per in r["backend_usage"].items()) or "none")
    summary.add_row("patch", _patch_summary(r["patch"]))
    summary.add_row("model", f"{model['source']}: {model['architecture']}, {model['num_parameters']:,} parameters, "
                             f"{model['num_hidden_layers']} layers, hidden {model['hidden_size']}, "
                             f"vocab {model['vocab_size']}, weights {model['weights']}, {model['precision']}")
    summary.add_row("training", f"{n} steps x {cfg['batch_size']} x {cfg['seq_len']} tokens"
                                + (" per rank" if r.get("distributed") else "")
                                + f", AdamW lr {cfg['lr']:g}, seed {cfg['seed']}")
    if r.get("distributed"):
        d = r["distributed"]
        summary.add_row("processes", f"{d['nproc']} ({d['parallel']}, {d['backend']}, {d['launcher']}); global "
                                     f"batch {d['global_batch_size']} x {cfg['seq_len']} tokens; losses: the ranks' "
                                     "mean")
    summary.add_row("data", f"{data['corpus']} ({data['corpus_tokens']:,} tokens, {data['tokenizer']})")
    summary.add_row("versions", ", ".join(f"{k} {v}" for k, v in r["versions"].items() if v))
    console.print(summary)
    _print_footer(console, r["notes"], written)


def _ranks_table(r: dict[str, Any]):
    """Per rank: device, peak memory and tokens/s of each run (``tigon compare --nproc N``)."""
    from rich.table import Table

    table = Table(title="Ranks", title_justify="left")
    for name in ("rank", "device", "peak memory original", "peak memory patched", "tokens/s original",
                 "tokens/s patched"):
        table.add_column(name, justify="left" if name == "device" else "right")
    for rank in r["ranks"]:
        mem, tps = rank["peak_memory_bytes"], rank["tokens_per_s"]
        table.add_row(str(rank["rank"]), rank["device"], _fmt_bytes(mem["original"]), _fmt_bytes(mem["patched"]),
                      f"{tps['original']:,.0f}", f"{tps['patched']:,.0f}")
    table.caption = "tokens/s in the Runs table: all ranks' tokens per second of the slowest rank's step times"
    return table


def _patch_summary(patch: dict[str, Any]) -> str:
    """``family llama: replaced <kind> x5, mlp x2, ...; 0 skipped`` from PatchReport.as_dict()."""
    counts = patch.get("counts")
    if counts is None and isinstance(patch.get("replaced"), list):
        counts = {"modules": len(patch["replaced"])}
    if counts is None:
        return json.dumps(patch)[:120]
    head = f"family {patch['family']}: " if patch.get("family") else ""
    replaced = ", ".join(f"{k} x{v}" for k, v in counts.items()) or "nothing"
    skipped = patch.get("skipped") or []
    why = "; ".join(f"{e.get('kind')} {e.get('target')}: {e.get('detail')}" for e in skipped[:3]
                    if isinstance(e, dict))
    return f"{head}replaced {replaced}; {len(skipped)} skipped" + (f" ({why})" if why else "")
