"""``tigon profile``: where the training step's time goes, what Tigon replaces, and the predicted vs measured
speed-up (the measurements are :mod:`tigon.workflows.profile`)."""

from __future__ import annotations

import argparse
from typing import Any

from ._render import (_check_output, _console, _dump_report, _fail, _fmt_bytes, _layers, _num, _print_footer,
                      _quiet_transformers, _run_staged)


def add_parser(sub) -> None:
    """Add the ``profile`` subcommand to ``sub`` (the subparsers of :func:`tigon.cli.build_parser`)."""
    from ..presets import PRESETS

    p = sub.add_parser(
        "profile",
        help="where the training step's time goes, what Tigon replaces, and the predicted vs measured speed-up",
        description=(
            "Profile the original training step with torch.profiler and group its time (device time on CUDA, "
            "self CPU time on CPU) into matmul, attention, norm, rotary, activation, LM head + loss, optimizer "
            "and other, plus kernels linked to no op and the device's idle time; measure what limits the step "
            "(the host's time to issue it at full size, with the device held busy by a sleep kernel so the host "
            "never waits, and the device's time to run it); measure each replaced op's host and device "
            "time (original and Tigon) at this model's shapes; predict the patched step from both, say which "
            "replacements would slow it and the tigon.patch call that leaves them out; then measure the patched "
            "step."
        ),
    )
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help=f"a preset ({', '.join(PRESETS)}), a config.json, a checkpoint directory or a cached Hub "
                        "id (default: tiny on CPU, llama3-8b with 2 layers on CUDA)")
    p.add_argument("--layers", type=int, metavar="N", help="keep N decoder layers")
    p.add_argument("--batch-size", type=int, metavar="N", help="sequences per step (2 on CPU, 4 on CUDA)")
    p.add_argument("--seq-len", type=int, metavar="N", help="tokens per sequence (32 on CPU, 2048 on CUDA)")
    p.add_argument("--steps", type=int, metavar="N",
                   help="timed steps, as tigon bench --e2e (2 on CPU, 10 on CUDA); at most 3 of them are profiled")
    p.add_argument("--warmup", type=int, metavar="N", help="untimed steps first (1 on CPU, 3 on CUDA)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], help="bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="default: auto (CUDA if any)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="weights and batches (default: 0)")
    p.add_argument("--attn-implementation", metavar="NAME",
                   help="transformers' attention implementation for the model: eager, sdpa, flash_attention_2, "
                        "flex_attention, ... or a Hub kernel org/repo (default: transformers' default)")
    p.add_argument("--lora", type=int, metavar="R",
                   help="LoRA fine-tuning as bench --e2e --lora R: both models wrapped by PEFT (rank R, alpha 2R, "
                        "dropout 0); the LoRA layers' time gets its own row")
    p.add_argument("--trace", metavar="PATH",
                   help="write the original step's Chrome trace (and the patched one as <name>.patched<ext>)")
    p.add_argument("--no-predict", action="store_true",
                   help="skip the op measurements, the prediction and the advice")
    p.add_argument("--no-patched", action="store_true", help="do not run the patched model")
    p.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress and no tables; one summary line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``tigon profile`` with the parsed ``args``; returns the exit status."""
    from ..workflows.compare import ConfigError
    from ..workflows.profile import ProfileConfig, resolve_profile, run_profile

    prog = "tigon profile"
    for path, flag in ((args.json, "--json"), (args.trace, "--trace")):
        problem = _check_output(path, flag)
        if problem:
            return _fail(prog, problem)
    config = ProfileConfig(model=args.model, layers=args.layers, batch_size=args.batch_size, seq_len=args.seq_len,
                           steps=args.steps, warmup=args.warmup, dtype=args.dtype, device=args.device,
                           trace=args.trace, predict=not args.no_predict, patched=not args.no_patched,
                           seed=args.seed, attn_implementation=args.attn_implementation, lora_rank=args.lora)
    _quiet_transformers()
    try:
        resolve_profile(config)
        result = _run_staged(run_profile, config, args.quiet)
    except (ConfigError, ValueError) as e:
        return _fail(prog, str(e))
    report = result.as_dict()
    if args.json:
        _dump_report(args.json, report)
    if args.quiet:
        lim, err = report["limits"]["original"], report["prediction_error_pct"]
        print(f"step_ms original={_num(report['step_ms_original'])} "
              f"predicted={_num(report['predicted_step_ms_patched'])} patched={_num(report['step_ms_patched'])} "
              f"error={'' if err is None else f'{err:+.1f}%'} host={_num(lim['host_ms'])} "
              f"busy={_num(lim['device_ms'])} bound={lim['bound']} "
              f"advice={(report['advice'] or {}).get('best_call', '')!r} device={report['device']}")
    else:
        _render_profile(report, [p for p in [args.json, *report["traces"]] if p])
    return 0


def _render_profile(r: dict[str, Any], written: list[str]) -> None:
    from rich.table import Table

    console = _console()
    cfg, model = r["config"], r["model"]
    table = Table(title=f"tigon profile: {model['source']} ({_layers(model)}), "
                        f"{cfg['batch_size']} x {cfg['seq_len']} tokens, {cfg['dtype']}, {r['device']}",
                  title_justify="left", caption=f"ms per profiled step; {r['time_basis']}")
    for col in ("category", "ms", "%", "Tigon op", "predicted ms", "patched ms"):
        table.add_column(col, justify="left" if col in ("category", "Tigon op") else "right", overflow="fold")
    for c in r["categories"]:
        name = f"[bold]{c['label']}[/]" if c["replaced"] else c["label"]
        table.add_row(name, _num(c["ms"]), f"{c['pct']:.1f}", c["tigon_op"] or "",
                      _num(c["predicted_ms"]) if c["predicted_ms"] is not None else "",
                      _num(c["patched_ms"]) if c["patched_ms"] is not None else "")
    table.add_section()
    table.add_row("profiled step", _num(r["profiled_step_ms"]), "100", "", "",
                  _num(r["profiled_step_ms_patched"]) if r["profiled_step_ms_patched"] else "")
    console.print(table)
    _render_limits(console, r)
    if r["ops"]:
        ops = Table(title="Replaced ops: per forward + backward call (host = time to issue it, device = its "
                          "kernels; alone, and the host's inside the step), and per step", title_justify="left",
                    caption="in step: the host's self time in the replaced modules during the step (forward + "
                            "backward per call, the hooks' own cost subtracted); a step host change with L is "
                            "what leaving the kind out of the whole layers and the rest gives back (the per-op "
                            "change in parentheses), with * the in-step one (the isolated calls' in parentheses)")
        for col in ("patch kind", "op", "calls", "original host / device ms", "Tigon host / device ms",
                    "in step: original / Tigon host ms", "step: host / device ms", "step without it",
                    "peak MiB a call: original / Tigon", "advice"):
            ops.add_column(col, justify="left" if col in ("patch kind", "op", "advice") else "right",
                           overflow="fold")
        for o in r["ops"]:
            ops.add_row(o["kind"], o["op"], str(o["calls"]),
                        f"{o['original']['host_ms']:.3f} / {o['original']['device_ms']:.3f}",
                        f"{o['tigon']['host_ms']:.3f} / {o['tigon']['device_ms']:.3f}", _in_step(o["in_step"]),
                        _step_delta(o), _num(o["step_ms_without"]), _peak_pair(o),
                        f"[bold]slows the step: {o['patch_call']}[/]" if o["slows_step"] else "keep")
        console.print(ops)
    summary = Table(title="Step time (unprofiled, median)", title_justify="left", show_header=False)
    summary.add_column(style="bold")
    summary.add_column(overflow="fold")
    summary.add_row("original", f"{_num(r['step_ms_original'])} ms")
    if r["predicted_step_ms_patched"] is not None:
        summary.add_row("patched, predicted", f"{_num(r['predicted_step_ms_patched'])} ms "
                                              f"({r['step_ms_original'] / r['predicted_step_ms_patched']:.2f}x)")
    if r["step_ms_patched"] is not None:
        err = r["prediction_error_pct"]
        summary.add_row("patched, measured", f"{_num(r['step_ms_patched'])} ms "
                                             f"({r['step_ms_original'] / r['step_ms_patched']:.2f}x)"
                        + (f"; prediction off by {err:+.1f}%" if err is not None else ""))
    for side in ("original", "patched"):
        peak = r.get(f"peak_memory_bytes_{side}")
        if peak is not None:
            summary.add_row(f"peak memory, {side}", _fmt_bytes(peak))
    if r["advice"]:
        best = r["advice"]
        if best["replace_nothing"]:
            text = "leave the model unpatched: every replacement is predicted to slow the step"
        elif best["best_keywords"]:
            text = f"{best['best_call']}: predicted {_num(best['best_step_ms'])} ms"
        else:
            text = f"{best['best_call']} (every replacement is predicted to help)"
        summary.add_row("advice", text)
    summary.add_row("patch", ", ".join(f"{k} x{v}" for k, v in r["patch"].items()) or "nothing replaced")
    if r["backend"]:
        summary.add_row("backend", r["backend"])
    summary.add_row("model", f"{model.get('architecture')}, {model.get('num_parameters') or 0:,} parameters, "
                             f"hidden {model.get('hidden_size')}, vocab {model.get('vocab_size')}")
    summary.add_row("device", f"{r['device']} ({r['device_name']})")
    console.print(summary)
    _print_footer(console, r["notes"], written)


def _in_step(s: dict[str, Any]) -> str:
    """``"original / Tigon"`` in-step host ms per call of one kind (``-`` for a side not measured)."""
    return " / ".join(f"{v['per_call_ms']:.3f}" if v else "-" for v in (s["original"], s["tigon"]))


def _step_delta(o: dict[str, Any]) -> str:
    """The step's host / device change of one kind, ms: ``"+1.0L (-2.0) / -4.5"``, L = from the whole layers and
    the rest measured with the kind left out (in parentheses the per-op host change), * = from the in-step host
    time (in parentheses the isolated calls')."""
    if o["host_basis"] == "layers":
        return (f"{o['host_delta_ms']:+.1f}L ({o.get('host_delta_ms_per_op', o['host_delta_ms_isolated']):+.1f})"
                f" / {o['device_delta_ms']:+.1f}")
    if o["host_basis"] != "in_step":
        return f"{o['host_delta_ms']:+.1f} / {o['device_delta_ms']:+.1f}"
    return f"{o['host_delta_ms']:+.1f}* ({o['host_delta_ms_isolated']:+.1f}) / {o['device_delta_ms']:+.1f}"


def _render_limits(console, r: dict[str, Any]) -> None:
    from rich.table import Table

    orig = r["limits"]["original"]
    caption = (f"host: the time to issue a full step, in {orig['host_parts']} parts each behind a sleep kernel that "
               "keeps the device busy (no waits); device: the CUDA-event time of those parts; * = the host waited "
               "for the device in some part (see the notes)" if "host_parts" in orig
               else "CPU: nothing runs asynchronously, so host = the step time and device = 0")
    t = Table(title="What limits the step (ms): host = time to issue it, device = time to run it",
              title_justify="left", caption=caption)
    for col in ("", "step", "host", "device", "bound"):
        t.add_column(col, justify="left" if col in ("", "bound") else "right")
    for key, label in (("original", "original, measured"), ("predicted", "patched, predicted"),
                       ("patched", "patched, measured")):
        lim = r["limits"].get(key)
        if lim:
            t.add_row(label, _num(lim["step_ms"]), _num(lim["host_ms"]) + ("*" if lim.get("host_waited") else ""),
                      _num(lim["device_ms"]), lim["bound"])
            if key == "predicted" and lim.get("host_basis") == "layers":
                t.add_row("  per-op host changes instead", _num(lim["step_ms_per_op"]), _num(lim["host_ms_per_op"]),
                          _num(lim["device_ms"]), "")
            elif key == "predicted" and lim.get("layers"):
                t.add_row("  whole layers' host instead", _num(lim["layers"]["step_ms"]),
                          _num(lim["layers"]["host_ms"]), _num(lim["device_ms"]), "")
            if key == "predicted" and lim.get("layers"):
                if lim.get("alternative"):
                    alt = lim["alternative"]
                    t.add_row(f"  layers' {alt['host_side']} instead", _num(alt["step_ms"]), _num(alt["host_ms"]),
                              _num(lim["device_ms"]), "")
    console.print(t)


def _peak_pair(o: dict) -> str:
    """``"original / Tigon"`` peak extra MiB of one isolated call, or ``""`` when not measured (CPU)."""
    a, b = o["original"].get("peak_extra_bytes"), o["tigon"].get("peak_extra_bytes")
    return "" if a is None or b is None else f"{a / 2**20:.0f} / {b / 2**20:.0f}"
