"""``tigon env``: the accelerator, library versions, and which backend each op x dtype takes (for bug reports);
the report comes from :mod:`tigon.workflows.env`."""

from __future__ import annotations

import argparse
from typing import Any

from ._render import _check_output, _console, _dump_report, _fail, _print_footer


_BACKEND_STYLE = {"triton": "green", "interpreter": "cyan", "reference": "yellow"}


def add_parser(sub) -> None:
    """Add the ``env`` subcommand to ``sub`` (the subparsers of :func:`tigon.cli.build_parser`)."""
    p = sub.add_parser(
        "env",
        help="accelerator, library versions, and which backend each op x dtype takes (for bug reports)",
        description=(
            "Print the accelerator and its compute capability (or 'none: CPU'), the Python / torch / triton / "
            "transformers versions, whether Triton's interpreter is on, and for every op x dtype (float32, "
            "bfloat16, float16) which backend Tigon would take and why, and the Liger-Kernel ops Tigon has no "
            "replacement for, with the reason. Runs no kernel. Paste it into bug reports."
        ),
    )
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``tigon env`` with the parsed ``args``; returns the exit status."""
    from ..workflows.env import run_env

    problem = _check_output(args.json, "--json")
    if problem:
        return _fail("tigon env", problem)
    report = run_env().as_dict()
    if args.json:
        _dump_report(args.json, report)
    _render_env(report, args.json)
    return 0


def _render_env(r: dict[str, Any], written: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    info = Table(title="tigon env", title_justify="left", show_header=False)
    info.add_column(style="bold")
    info.add_column(overflow="fold")
    cc = f" (compute capability {r['compute_capability']})" if r["compute_capability"] else ""
    info.add_row("accelerator", f"{r['accelerator']}{cc}")
    for g in r["gpus"]:
        info.add_row(f"  gpu {g['index']}", f"{g['name']}, compute capability {g['compute_capability']}, "
                                            f"{g['memory_gib']} GiB")
    info.add_row("device (decisions)", r["device"])
    info.add_row("cpu", r["cpu"])
    info.add_row("platform", r["platform"])
    for k, v in r["versions"].items():
        if v is not None or k in ("torch", "triton", "transformers"):
            info.add_row(k, str(v) if v is not None else "not installed")
    info.add_row("triton interpreter", "on (TRITON_INTERPRET=1)" if r["triton_interpreter"] else "off")
    info.add_row("strict mode", "on (TIGON_STRICT=1)" if r["strict"] else "off")
    info.add_row("kernels disabled", "yes (TIGON_DISABLE=1)" if r["disabled"] else "no")
    set_vars = ", ".join(f"{k}={v}" for k, v in r["env"].items() if v is not None)
    info.add_row("environment", set_vars or "none of " + ", ".join(r["env"]))
    console.print(info)

    dtypes = list(dict.fromkeys(row["dtype"] for row in r["backends"]))
    reasons = {reason: n for n, reason in enumerate(dict.fromkeys(row["reason"] for row in r["backends"]), 1)}
    grid = Table(title=f"Backend per op and dtype on {r['device']}", title_justify="left")
    grid.add_column("op", no_wrap=True)
    for d in dtypes:
        grid.add_column(d, no_wrap=True)
    by_op: dict[str, dict[str, dict[str, str]]] = {}
    for row in r["backends"]:
        by_op.setdefault(row["op"], {})[row["dtype"]] = row
    for op, per in by_op.items():
        cells = []
        for d in dtypes:
            row = per[d]
            mark = f" [dim]\\[{reasons[row['reason']]}][/]" if len(reasons) > 1 else ""
            cells.append(f"[{_BACKEND_STYLE.get(row['backend'], 'white')}]{row['backend']}[/]{mark}")
        grid.add_row(op, *cells)
    if len(reasons) > 1:
        grid.caption = "\n".join(f"\\[{n}] {escape(reason)}" for reason, n in reasons.items())
    else:
        grid.caption = f"why: {escape(next(iter(reasons)))}"
    grid.caption_justify = "left"
    console.print(grid)
    _render_liger(console, r["liger"])
    _print_footer(console, r["notes"], written)


def _render_liger(console, rows: list[dict[str, Any]]) -> None:
    """The Liger-Kernel names without a Tigon replacement, grouped by reason (the JSON has every name)."""
    from rich.markup import escape
    from rich.table import Table

    why: dict[str, list[str]] = {}
    for row in rows:
        if row["tigon"] is None:
            why.setdefault(row["note"], []).append(row["liger"])
    table = Table(title=f"Liger-Kernel ops: {len(rows) - sum(map(len, why.values()))} of {len(rows)} names replaced "
                        "(tigon env --json lists each); not in Tigon:", title_justify="left")
    table.add_column("Liger-Kernel", overflow="fold")
    table.add_column("why not", overflow="fold")
    for note, names in why.items():
        table.add_row(", ".join(names), escape(note))
    console.print(table)
