"""Recompute ``tigon profile``'s prediction of the patched step from recorded GPU runs (issue 24), offline, on a CPU.

    PYTHONPATH=src python3 benchmarks/predict_recompute.py [--out-dir benchmarks/results/cpu] [FILE ...]

Each recorded ``tigon profile`` JSON holds what the prediction is made from: the original step's time ``T``, its
host time held (``limits.original.host_ms``) and unheld (``host_natural_ms``), its device time and optimizer tail,
each replaced op's isolated costs (``ops[].original`` / ``ops[].tigon``: host held, ``natural_ms`` unheld, device,
``waited``) and in-step host per call (``ops[].in_step``), and, where measured, the whole parts' device change
(``layers.device_delta_ms``). This script rebuilds :class:`tigon.workflows.predict.StepCost` and the
:class:`~tigon.workflows.predict.OpChange` s from them exactly as :func:`tigon.workflows.profile.run_profile` does
now (:func:`tigon.workflows.predict.call_costs`) and prints, per row, the recorded prediction, the recomputed one
and the measured patched step (``step_ms_patched``), with the error ``100 * (predicted - measured) / measured``.

Two "oracle" columns test the step model alone: the patched step predicted from the patched step's *own* measured
host and device time (``limits.patched``), in the held basis (the model before) and the unheld one (now). A row
where even the unheld oracle misses is one whose recorded measurements disagree with each other (the host's speed
changed between the timed step and its host measurement): no prediction from them can land within the target.

Nothing here runs a GPU; the inputs are the committed JSON files of the runs named in ``ROWS``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))

from tigon.workflows import predict as PR  # noqa: E402

R = os.path.join(HERE, "results")
ROWS = {
    "h100 s18 qwen2.5-0.5b 24L 4x1024": "h100/session18/predict-profile_qwen2.5-0.5b_h100_20261205.json",
    "h100 s25 llama3-8b 4L 4x2048": "h100/session25/c4/profile_llama3-8b.json",
    "h100 s25 qwen2-7b 4L 4x2048": "h100/session25/c4/profile_qwen2-7b.json",
    "h200 s12 qwen2.5-0.5b 24L 4x1024": "h200/profile-host_qwen2.5-0.5b-4x1024_h200_20261204.json",
    "h200 s13 qwen2.5-0.5b 24L 4x1024": "h200/session13/profile-attrib_qwen2.5-0.5b-4x1024_h200_20261204.json",
    "h200 s23 qwen2.5-0.5b 24L 4x1024": "h200/session23/c5/profile_qwen2.5-0.5b.json",
    "h200 s23 llama3.2-1b 16L 4x2048": "h200/session23/c5/profile_llama3.2-1b.json",
}
"""Row -> recorded JSON under ``benchmarks/results``. Left out: ``h200/profile-predict_qwen2.5-0.5b-4x1024_h200_
20261202.json`` (its host time was measured at 1 x 32 tokens, 144 ms above its 102 ms step, and it has no unheld host
time) and ``h200/profile_llama3-8b_2l.json`` (before the host and device measurement: no ``limits``)."""
TARGET_PCT = 7.0


def step_of(lim: dict, step_ms: float) -> PR.StepCost:
    """The :class:`~tigon.workflows.predict.StepCost` of one side's ``limits`` (``original`` or ``patched``)."""
    return PR.StepCost(step_ms, lim["host_ms"], lim["device_ms"], lim.get("optimizer_host_ms", 0.0),
                       lim.get("optimizer_device_ms", 0.0), lim.get("host_natural_ms"))


def changes_of(report: dict) -> tuple[list[PR.OpChange], dict[str, str]]:
    """The recorded ops as ``OpChange`` s (costs per :func:`~tigon.workflows.predict.call_costs`), and kind -> the
    host basis used. ``ops[].calls`` is the calls with every kind on; the bypassed calls are added back so that
    :func:`~tigon.workflows.predict.calls_per_kind` gives them again."""
    ops = report.get("ops") or []
    bypassed: dict[str, int] = {}
    for o in ops:
        for k, n in (o.get("bypasses") or {}).items():
            bypassed[k] = bypassed.get(k, 0) + n
    out, basis = [], {}
    for o in ops:
        ins = o.get("in_step") or {}
        a, b = ins.get("original"), ins.get("tigon")
        in_step = (a["per_call_ms"], b["per_call_ms"]) if a and b and a.get("calls") and b.get("calls") else None
        ua, ub = (a or {}).get("unheld_per_call_ms"), (b or {}).get("unheld_per_call_ms")
        unheld = (ua, ub) if in_step is not None and ua is not None and ub is not None else None
        orig, tig, basis[o["kind"]] = PR.call_costs(o["original"], o["tigon"], in_step, unheld)
        out.append(PR.OpChange(o["kind"], o["op"], o["keyword"], o["calls"] + bypassed.get(o["kind"], 0), orig, tig,
                               o.get("bypasses") or {}))
    return out, basis


def device_model(report: dict, changes: list[PR.OpChange]) -> PR.HostModel | None:
    """The whole parts' device change (``layers.device_delta_ms``) as a :class:`~tigon.workflows.predict.HostModel`
    of device times; None when not recorded."""
    deltas = (report.get("layers") or {}).get("device_delta_ms") or {}
    if deltas.get("patched") is None:
        return None
    kws = [c.keyword for c in changes]
    without = {c.kind: deltas[f"without {c.keyword}"] for c in changes
               if kws.count(c.keyword) == 1 and deltas.get(f"without {c.keyword}") is not None}
    return PR.HostModel(deltas["patched"], without)


def _err(p: float | None, m: float | None) -> float | None:
    return None if p is None or not m else 100.0 * (p - m) / m


def recompute(name: str, report: dict) -> dict:
    """One row: recorded and recomputed prediction, measured patched step, errors, oracles and the advice."""
    lim, measured = report["limits"], report.get("step_ms_patched")
    step = step_of(lim["original"], report["step_ms_original"])
    changes, basis = changes_of(report)
    dev = device_model(report, changes)
    pred = PR.predict(step, changes, device=dev)
    adv = PR.advise(step, changes, device=dev)
    row = {"row": name, "device_name": report.get("device_name"), "step_ms_original": step.step_ms,
           "bound": step.bound, "host_ms": step.host_ms, "host_unheld_ms": step.host_unheld_ms,
           "host_scale": step.host_scale, "device_ms": step.device_ms, "stall_ms": step.stall_ms,
           "recorded_prediction_ms": report.get("predicted_step_ms_patched"),
           "recorded_error_pct": _err(report.get("predicted_step_ms_patched"), measured),
           "predicted_ms": pred.step_ms, "measured_ms": measured, "error_pct": _err(pred.step_ms, measured),
           "predicted_host_unheld_ms": pred.host_unheld_ms, "predicted_device_ms": pred.device_ms,
           "device_basis": "whole parts" if dev is not None else "per op", "host_basis": basis,
           "advice": adv.best_call, "slower": [a.kind for a in adv.kinds if a.slows_step]}
    if "patched" in lim and measured:
        p = lim["patched"]
        row["measured_host_unheld_ms"], row["measured_device_ms"] = p.get("host_natural_ms"), p["device_ms"]
        for tag, unheld in (("held", False), ("unheld", True)):
            o = step_of(lim["original"], step.step_ms)
            q = step_of(p, measured)
            if not unheld:
                o, q = PR.StepCost(*[getattr(o, f) for f in ("step_ms", "host_ms", "device_ms", "tail_host_ms",
                                                              "tail_device_ms")]), \
                    PR.StepCost(*[getattr(q, f) for f in ("step_ms", "host_ms", "device_ms", "tail_host_ms",
                                                          "tail_device_ms")])
            t = o.step_ms - o.pipeline_ms + q.pipeline_ms
            row[f"oracle_{tag}_ms"], row[f"oracle_{tag}_error_pct"] = t, _err(t, measured)
    return row


def _f(v, fmt="{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def markdown(rows: list[dict]) -> str:
    """The table as markdown."""
    head = ("| row | bound | T | H held / unheld / D | recorded prediction (error) | **recomputed (error)** | "
            "measured patched | H_u' / D' predicted (measured) | oracle held / unheld error | advice |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        e = r["error_pct"]
        mark = "" if e is None or abs(e) <= TARGET_PCT else " (outside)"
        lines.append(
            f"| {r['row']} | {r['bound']} | {_f(r['step_ms_original'])} | {_f(r['host_ms'])} / "
            f"{_f(r['host_unheld_ms'])} / {_f(r['device_ms'])} | {_f(r['recorded_prediction_ms'])} "
            f"({_f(r['recorded_error_pct'], '{:+.1f}')}%) | **{_f(r['predicted_ms'])} "
            f"({_f(e, '{:+.1f}')}%)**{mark} | {_f(r['measured_ms'])} | {_f(r['predicted_host_unheld_ms'])} / "
            f"{_f(r['predicted_device_ms'])} ({_f(r.get('measured_host_unheld_ms'))} / "
            f"{_f(r.get('measured_device_ms'))}) | {_f(r.get('oracle_held_error_pct'), '{:+.1f}')}% / "
            f"{_f(r.get('oracle_unheld_error_pct'), '{:+.1f}')}% | `{r['advice']}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="*", help="recorded tigon profile JSON files (default: ROWS)")
    p.add_argument("--out-dir", help="write predict_recompute.{md,json} there")
    args = p.parse_args(argv)
    named = {os.path.basename(f): f for f in args.files} if args.files else {k: os.path.join(R, v)
                                                                            for k, v in ROWS.items()}
    rows = []
    for name, path in named.items():
        with open(path) as f:
            rows.append(recompute(name, json.load(f)))
    table = markdown(rows)
    print(table)
    if args.out_dir:
        os.makedirs(args.out_dir, exist_ok=True)
        with open(os.path.join(args.out_dir, "predict_recompute.json"), "w") as f:
            json.dump({"command": "python3 benchmarks/predict_recompute.py --out-dir " + args.out_dir,
                       "target_pct": TARGET_PCT, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out_dir, "predict_recompute.md"), "w") as f:
            f.write("tigon profile's prediction recomputed from recorded GPU runs (ms per step; error = (predicted - "
                    f"measured) / measured; target +-{TARGET_PCT:.0f}%)\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
