"""The op table (issue 28): per op and provider, forward + backward ms host-inclusive and as kernel time, one
``tigon bench`` process per provider and timing basis, merged into one table, JSON and plot.

    PYTHONPATH=src python3 benchmarks/op_table.py --model llama3-8b --out-dir $OUT
        # the issue's table: rms_norm, layer_norm, swiglu, rope, fused_add_rms_norm at 16384 tokens and
        # cross_entropy at 8192 (x 128256), for QuACK, Liger's CuTe DSL backend, Liger (Triton), torch.compile,
        # eager and Tigon; both bases; writes op-table_llama3-8b_h200_<date>.{json,png} and the ops-*.json sources
    python3 benchmarks/op_table.py --from-dir DIR          # the table of JSON files already written, on any machine
    PYTHONPATH=src python3 benchmarks/op_table.py --model tiny --tokens 64 --providers eager,tigon --ops rms_norm \\
        --bases host --gpu cpu --out-dir /tmp/op-table     # CPU: only shows that every path runs

Each (provider, basis, token count) runs ``python3 -m tigon.cli bench --op <ops> --model <model> --tokens N
--providers <p> [--cuda-graph] --json <file> --quiet`` in a fresh process (``_tables.py``'s launcher, shared with
``e2e_table.py``: compile caches, allocator state and import-time switches never leak between providers), writing
``ops-<provider>-<basis>-<N>_<model>_<gpu>_<date>.json`` into ``--out-dir``. ``liger_cutedsl`` is ``liger`` with
``LIGER_KERNEL_IMPL=cutedsl`` in its environment (Liger-Kernel's opt-in CuTe DSL backend, chosen when it is imported;
a Liger release without that backend runs its Triton kernels under that name: compare the two columns); ``quack`` is
QuACK's CuTe DSL kernels (``tigon.ops``' peer, RMSNorm, fused add + RMSNorm and cross-entropy); any ``tigon_*``
variant of ``tigon bench`` may be added to ``--providers``. A provider is not launched for ops it does not implement
(``tigon.ops``: those cells read ``n/a``); one that is not installed, fails or runs past ``--timeout`` is a cell
saying so, with the reason below the table.

Bases (``--bases``), both in milliseconds per call, medians (``tigon.workflows.timing``):
    host    host-inclusive: plain ``triton.testing.do_bench`` (CUDA events around back-to-back calls), so the
            Python, dispatcher, autograd and launch cost of each call counts where the GPU waits on it;
    kernel  kernel time: ``tigon bench --cuda-graph``, CUDA-graph replays of the call (the host's cost left out).
            A provider that waits on the host inside the call cannot be captured (Liger's cross-entropy: ``.item()``):
            ``tigon bench`` times its kernels' summed durations with the profiler instead, the gaps between them
            left out; such cells carry a dagger and ``tigon bench``'s note.
Inputs rotate among enough sets that no call finds them in the L2 cache. Modes (``--modes``): ``fwd_bwd``
(default: forward + backward), ``fwd``, ``bwd`` (the backward alone, after an untimed forward; timed with events in
both bases). A cell reads ``host ms / kernel ms (P%)``: P is the kernel-time row's share of the copy bandwidth
``tigon bench`` measured in the same process (over the op's minimal bytes; memory-bound ops only). The last column is
Tigon's ratio to the fastest other provider in each basis: that provider's ms / Tigon's ms (> 1: Tigon is faster).

The JSON (``op-table_<model>_<gpu>_<date>.json``) holds every source row (with its basis, token count and file), the
merged table per mode, the markdown, each source's ceilings and notes, and the exact commands run (with their extra
environment, status and seconds). The PNG has one panel per op: per provider, kernel time beside host-inclusive time.
Token counts (``--tokens``): ``N`` for every op, or ``op=N,...`` over the default 16384 (cross_entropy 8192), or
``N,op=M``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _tables.py, beside this file

from _tables import ENV_VARIANTS, gpu_tag, launch, model_name, parse_keyed, provider_timeout, today  # noqa: E402

DEFAULT_OPS = "rms_norm,layer_norm,cross_entropy,swiglu,rope,fused_add_rms_norm"
DEFAULT_PROVIDERS = "quack,liger_cutedsl,liger,compile,eager,tigon"
"""Issue 28's columns, in its order."""
DEFAULT_TOKENS = "16384,cross_entropy=8192"
BASES = {"host": (), "kernel": ("--cuda-graph",)}
"""Basis -> ``tigon bench`` flags: host-inclusive (plain do_bench) and kernel time (CUDA-graph replays)."""
MODES = ("fwd", "bwd", "fwd_bwd")
LABELS = {"quack": "QuACK", "liger_cutedsl": "Liger CuTe DSL", "liger": "Liger Triton", "compile": "torch.compile",
          "eager": "eager", "tigon": "Tigon"}
TIGON = "tigon"
DAGGER = "\u2020"


def op_tokens(spec, ops: list[str]) -> dict[str, int]:
    """Each op's token count from ``--tokens`` (see the module docstring)."""
    default, own = parse_keyed(spec)
    if default is None:
        default, base = parse_keyed(DEFAULT_TOKENS)
        own = {**base, **own}
    return {op: int(own.get(op, default)) for op in ops}


def token_groups(tokens: dict[str, int]) -> dict[int, list[str]]:
    """Token count -> its ops (in the given order): one ``tigon bench`` process per group."""
    groups: dict[int, list[str]] = {}
    for op, n in tokens.items():
        groups.setdefault(n, []).append(op)
    return groups


def implemented(ops: list[str], providers: list[str]) -> dict[str, list[str]] | None:
    """Op -> the providers (of ``providers``) that implement it (``tigon.ops``; a variant counts as its base), or
    None when ``tigon`` cannot be imported here."""
    try:
        from tigon import ops as registry
        from tigon.workflows.bench import op_providers
    except ImportError:
        return None
    specs = registry.registry()
    out = {}
    for op in ops:
        have = op_providers(specs[op]) if op in specs else {}
        out[op] = [p for p in providers if ENV_VARIANTS.get(p, (p,))[0] in have]
    return out


def failed_report(model: str, provider: str, base: str, basis: str, tokens: int, ops: list[str], why: str) -> dict:
    """A ``tigon bench`` report whose rows (every op and mode) say why there are no numbers."""
    return {"device": None, "ceilings": {}, "skipped": [], "model": {"name": model}, "sweep": None,
            "config": {"ops": ops, "model": model, "providers": [base], "tokens": tokens,
                       "cuda_graph": basis == "kernel"},
            "notes": [], "size_formats": {},
            "rows": [{"op": op, "provider": provider, "shape": {}, "dtype": None, "mode": m, "ms": None,
                      "pct_copy_bw": None, "note": f"failed: {why}", "size": ""} for op in ops for m in MODES]}


def commands(args) -> list[dict]:
    """The runs of the table: provider, basis, token count, ops, base provider, environment, argv, JSON path."""
    ops, providers = args.ops.split(","), args.providers.split(",")
    impl = implemented(ops, providers)
    runs = []
    for p in providers:
        base, env = ENV_VARIANTS.get(p, (p, {}))
        for basis in args.bases.split(","):
            for n, group in token_groups(op_tokens(args.tokens, ops)).items():
                here = [op for op in group if impl is None or p in impl[op]]
                if not here:
                    continue
                path = os.path.join(args.out_dir, f"ops-{p}-{basis}-{n}_{args.tag}.json")
                cmd = [sys.executable, "-m", "tigon.cli", "bench", "--op", ",".join(here), "--model", args.model,
                       "--tokens", str(n), "--providers", base, *BASES[basis], "--json", path, "--quiet"]
                runs.append({"provider": p, "basis": basis, "tokens": n, "ops": here, "base": base, "env": env,
                             "argv": cmd, "path": path})
    return runs


def run_table(args) -> list[str]:
    """Run every (provider, basis, token count) in its own process; returns the JSON paths written."""
    os.makedirs(args.out_dir, exist_ok=True)
    paths = []
    for r in commands(args):
        p, basis, n, here = r["provider"], r["basis"], r["tokens"], r["ops"]
        launch(r["argv"], r["path"], p, base=r["base"], env=r["env"], limit=provider_timeout(args.timeout, p),
               failed_report=lambda why: failed_report(args.model, p, r["base"], basis, n, here, why),
               extra={"basis": basis, "tokens": n, "ops": here})
        paths.append(r["path"])
    return paths


# ------------------------------------------------------------------------------------------------------ merging
def source_tag(path: str) -> str:
    """``<model>_<gpu>_<date>`` of a source file's name (the last three fields: the kind may hold underscores)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return "_".join(stem.rsplit("_", 3)[1:])


def load(paths: list[str]) -> list[dict]:
    """The reports at ``paths``, each with its ``file`` name."""
    out = []
    for path in paths:
        with open(path) as f:
            out.append(dict(json.load(f), file=os.path.basename(path)))
    return out


def _basis(report: dict) -> str:
    run = report.get("table_run") or {}
    return run.get("basis") or ("kernel" if (report.get("config") or {}).get("cuda_graph") else "host")


def status_of(text: str) -> str:
    """The word a cell shows for a failure note: not installed, timed out or failed."""
    text = text or ""
    if "not installed" in text:
        return "not installed"
    if "timed out" in text:
        return "timed out"
    return "failed"


def _ordered(found, wanted: str | None, default: str) -> list[str]:
    if wanted:
        return [x for x in wanted.split(",") if x]
    order = default.split(",")
    found = list(dict.fromkeys(found))
    return sorted(found, key=lambda x: (order.index(x) if x in order else len(order), found.index(x)))


def merge(reports: list[dict], modes=("fwd_bwd",), ops: str | None = None, providers: str | None = None,
          bases: str | None = None) -> dict:
    """The merged table of ``reports`` (``tigon bench`` JSON, one provider and basis each).

    Returns ``{"ops", "providers", "bases", "modes", "rows", "runs", "table", "notes", "sources"}``: ``rows`` every
    source row with ``basis``, ``tokens`` and ``file``; ``table[mode]`` one entry per op with ``size``, ``cells``
    (provider -> basis -> ``{"status", "ms", "pct_copy_bw", "note"}``) and ``ratio`` (basis -> ``{"ratio",
    "fastest_other"}`` or None).
    """
    rows, runs, sources, notes = [], [], [], []
    for rep in reports:
        basis, run = _basis(rep), rep.get("table_run") or {}
        tokens = run.get("tokens") or (rep.get("config") or {}).get("tokens")
        for r in rep.get("rows", []):
            rows.append(dict(r, basis=basis, tokens=tokens, file=rep["file"], device=rep.get("device")))
        provider = run.get("provider") or next((r["provider"] for r in rep.get("rows", [])), None)
        run_ops = run.get("ops") or (rep.get("config") or {}).get("ops") or []
        runs.append(dict(run, provider=provider, basis=basis, ops=run_ops, file=rep["file"],
                         skipped=rep.get("skipped", [])))
        sources.append({"file": rep["file"], "device": rep.get("device"), "ceilings": rep.get("ceilings"),
                        "model": rep.get("model"), "config": rep.get("config"), "notes": rep.get("notes", []),
                        "skipped": rep.get("skipped", []), "table_run": run or None})
        notes += rep.get("notes", [])
    op_list = _ordered([r["op"] for r in rows] + [o for run in runs for o in run["ops"]], ops, DEFAULT_OPS)
    prov_list = _ordered([run["provider"] for run in runs if run["provider"]] + [r["provider"] for r in rows],
                         providers, DEFAULT_PROVIDERS)
    basis_list = _ordered([run["basis"] for run in runs], bases, ",".join(BASES))
    index = {(r["op"], r["provider"], r["basis"], r["mode"]): r for r in rows}
    def place(run):
        return (prov_list.index(run["provider"]) if run["provider"] in prov_list else len(prov_list),
                basis_list.index(run["basis"]) if run["basis"] in basis_list else len(basis_list),
                -(run.get("tokens") or 0), run["file"])

    runs.sort(key=place)

    def cell(op, p, basis, mode):
        r = index.get((op, p, basis, mode))
        if r is not None and r.get("ms") is not None:
            return {"status": "ok", "ms": r["ms"], "pct_copy_bw": r.get("pct_copy_bw"),
                    "note": r.get("note", "") if mode != "bwd" else ""}
        if r is not None:
            return {"status": status_of(r.get("note")), "ms": None, "note": r.get("note", "")}
        mine = [run for run in runs if run["provider"] == p and run["basis"] == basis]
        covering = [run for run in mine if op in run["ops"]]
        for run in covering:
            if run.get("status") not in (None, "ok"):  # cut short before this op's rows
                return {"status": status_of(run.get("why")) if run["status"] != "timed out" else "timed out",
                        "ms": None, "note": run.get("why", "")}
            skipped = "; ".join(s for s in run["skipped"] if s.startswith(f"{p}:") or "not installed" in s)
            if skipped:
                return {"status": status_of(skipped), "ms": None, "note": skipped}
        if mine:
            return {"status": "n/a", "ms": None, "note": f"{p} does not implement {op}"}
        return {"status": "not run", "ms": None, "note": ""}

    table = {}
    for mode in modes:
        entries = []
        for op in op_list:
            sizes = [r.get("size") for r in rows if r["op"] == op and r.get("size")]
            cells = {p: {b: cell(op, p, b, mode) for b in basis_list} for p in prov_list}
            ratio = {}
            if TIGON in prov_list:
                for b in basis_list:
                    mine = cells[TIGON][b]["ms"]
                    others = [(c[b]["ms"], p) for p, c in cells.items()
                              if not p.startswith(TIGON) and c[b]["ms"] is not None]
                    if mine and others:
                        best, who = min(others)
                        ratio[b] = {"ratio": best / mine, "fastest_other": who}
                    else:
                        ratio[b] = None
            entries.append({"op": op, "size": sizes[0] if sizes else "", "cells": cells, "ratio": ratio})
        table[mode] = entries
    return {"ops": op_list, "providers": prov_list, "bases": basis_list, "modes": list(modes), "rows": rows,
            "runs": runs, "table": table, "notes": list(dict.fromkeys(notes)), "sources": sources}


def _cell_text(c: dict, bases: list[str]) -> str:
    parts = []
    for b in bases:
        x = c[b]
        parts.append(f"{x['ms']:.3f}{DAGGER if x.get('note') else ''}" if x["status"] == "ok" else x["status"])
    text = " / ".join(parts)
    pct = next((c[b].get("pct_copy_bw") for b in ("kernel", "host") if b in c and c[b]["status"] == "ok"), None)
    return text + (f" ({pct:.0f}%)" if pct is not None else "")


def markdown(merged: dict) -> str:
    """The table per mode (markdown), the failures' reasons and the notes of ``tigon bench``."""
    bases, provs = merged["bases"], merged["providers"]
    names = {"host": "host-inclusive (plain do_bench)", "kernel": "kernel time (CUDA-graph replays)"}
    devices = sorted({r["device"] for r in merged["rows"] if r.get("device")})
    out = []
    for mode in merged["modes"]:
        out.append(f"### {mode}, ms per call: {' / '.join(names.get(b, b) for b in bases)}"
                   + (f"; {', '.join(devices)}" if devices else ""))
        out.append("")
        head = ["op", "size", *[LABELS.get(p, p) for p in provs]]
        if TIGON in provs:
            head.append(f"Tigon vs fastest other ({' / '.join(bases)})")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
        for e in merged["table"][mode]:
            line = [e["op"], e["size"], *[_cell_text(e["cells"][p], bases) for p in provs]]
            if TIGON in provs:
                line.append(" / ".join(f"{x['ratio']:.2f}x vs {LABELS.get(x['fastest_other'], x['fastest_other'])}"
                                       if x else "-" for x in (e["ratio"][b] for b in bases)))
            out.append("| " + " | ".join(line) + " |")
        out.append("")
    out.append("(P%): the kernel-time row's share of the copy bandwidth measured in the same process "
               "(host-inclusive where no kernel time); ratio: the fastest other provider's ms / Tigon's ms.")
    why: dict[tuple, list[str]] = {}
    daggers = []
    for mode in merged["modes"]:
        for e in merged["table"][mode]:
            for p, c in e["cells"].items():
                for b, x in c.items():
                    if x["status"] not in ("ok", "n/a", "not run"):
                        why.setdefault((p, x["status"], x["note"]), []).append(f"{e['op']} {b}")
                    elif x["status"] == "ok" and x.get("note"):
                        daggers.append(x["note"])
    for note in dict.fromkeys(daggers):
        out.append(f"{DAGGER} {note}")
    for (p, status, note), where in why.items():
        note = note[len("failed: "):] if note.startswith("failed: ") else note
        out.append(f"- {LABELS.get(p, p)} {status} ({', '.join(dict.fromkeys(where))}): {note}")
    if merged["notes"]:
        out.append("")
        out += [f"- {n}" for n in merged["notes"]]
    return "\n".join(out)


def plot(merged: dict, path: str, mode: str = "fwd_bwd") -> None:
    """One panel per op: per provider, kernel time beside host-inclusive time (ms, lower is better)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = merged["table"].get(mode) or next(iter(merged["table"].values()))
    provs, bases = merged["providers"], [b for b in ("kernel", "host") if b in merged["bases"]]
    colors = {"kernel": "tab:blue", "host": "tab:orange"}
    labels = {"kernel": "kernel time (CUDA graphs)", "host": "host-inclusive (plain do_bench)"}
    n = len(entries)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.6 * rows), squeeze=False)
    width = 0.8 / max(len(bases), 1)
    for ax, e in zip(axes.flat, entries):
        for i, b in enumerate(bases):
            xs = [k + (i - (len(bases) - 1) / 2) * width for k in range(len(provs))]
            ms = [e["cells"][p][b]["ms"] or 0 for p in provs]
            ax.bar(xs, ms, width, color=colors[b], label=labels[b])
            for x, p in zip(xs, provs):
                c = e["cells"][p][b]
                if c["status"] != "ok":
                    ax.text(x, 0, " " + c["status"], rotation=90, ha="center", va="bottom", fontsize=7,
                            color="gray")
        ax.set_xticks(range(len(provs)))
        ax.set_xticklabels([LABELS.get(p, p) for p in provs], rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{e['op']} {e['size']}", fontsize=10)
        ax.set_ylabel("ms (lower is better)")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles, names = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper right", fontsize=8)
    devices = sorted({r["device"] for r in merged["rows"] if r.get("device")})
    fig.suptitle(f"{mode}, one process per provider and basis" + (f", {', '.join(devices)}" if devices else ""))
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3-8b", help="what tigon bench --model takes (default llama3-8b)")
    ap.add_argument("--ops", help=f"comma-separated (default {DEFAULT_OPS}; with --from-dir: those found)")
    ap.add_argument("--providers", help=f"comma-separated: tigon bench's, liger_cutedsl, tigon_* variants (default "
                                        f"{DEFAULT_PROVIDERS}; with --from-dir: those found)")
    ap.add_argument("--tokens", default=DEFAULT_TOKENS,
                    help=f"N, op=N,... over the default, or N,op=M (default {DEFAULT_TOKENS})")
    ap.add_argument("--bases", help="host,kernel (default both): host-inclusive and CUDA-graph kernel time")
    ap.add_argument("--modes", default="fwd_bwd", help="comma-separated of fwd,bwd,fwd_bwd, or all (default fwd_bwd)")
    ap.add_argument("--out-dir", default="out")
    ap.add_argument("--gpu", help="the GPU's name in the file names (default: h200 / h100 / the device's name, cpu)")
    ap.add_argument("--timeout", default="300,compile=900",
                    help="seconds per process: N, or N,provider=M,... (default 300,compile=900)")
    ap.add_argument("--from-dir", help="the table of the ops-*.json files of this folder instead of running")
    ap.add_argument("--json", help="the merged JSON's path (default <dir>/op-table_<model>_<gpu>_<date>.json)")
    ap.add_argument("--png", help="the plot's path (default beside the JSON)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    modes = list(MODES) if args.modes == "all" else args.modes.split(",")
    if any(m not in MODES for m in modes):
        ap.error(f"--modes: choose from {', '.join(MODES)} or all")
    if args.bases and any(b not in BASES for b in args.bases.split(",")):
        ap.error(f"--bases: choose from {', '.join(BASES)}")
    if args.from_dir:
        paths = sorted(glob.glob(os.path.join(args.from_dir, "ops-*.json")))
        if not paths:
            ap.error(f"--from-dir: no ops-*.json in {args.from_dir}")
        tag = source_tag(paths[0])
        out_dir = args.from_dir
    else:
        args.ops, args.providers = args.ops or DEFAULT_OPS, args.providers or DEFAULT_PROVIDERS
        args.bases = args.bases or ",".join(BASES)
        try:
            for p in args.providers.split(","):
                provider_timeout(args.timeout, p)
            op_tokens(args.tokens, args.ops.split(","))
        except ValueError as e:
            ap.error(str(e))
        tag = args.tag = f"{model_name(args.model)}_{args.gpu or gpu_tag()}_{today()}"
        out_dir = args.out_dir
        if args.dry_run:
            from _tables import command_line

            for r in commands(args):
                print(command_line(r["argv"], r["env"]))
            return
        paths = run_table(args)
    merged = merge(load(paths), modes, args.ops, args.providers, args.bases)
    text = markdown(merged)
    print(text)
    json_path = args.json or os.path.join(out_dir, f"op-table_{tag}.json")
    png = args.png or os.path.splitext(json_path)[0] + ".png"
    merged["commands"] = [{k: run.get(k) for k in ("provider", "basis", "tokens", "ops", "cmd", "env", "status",
                                                   "why", "seconds", "file")} for run in merged["runs"]]
    merged["markdown"] = text
    with open(json_path, "w") as f:
        json.dump(merged, f, indent=1)
    plot(merged, png, modes[-1] if "fwd_bwd" not in modes else "fwd_bwd")
    print(f"wrote {json_path}\nwrote {png}")


if __name__ == "__main__":
    main()
