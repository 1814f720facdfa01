"""What the ``tigon`` commands share: the argument parser class and usage errors (``_Parser``, ``_fail``,
``_csv_list``), output-path checks run before a long job (``_check_output``, ``_check_output_dir``), JSON reports,
the stdout console and report footers, number and byte formatting, and the stage progress bar.

Imports nothing of Tigon's kernels, Triton or rich at module import time (rich is imported where it is used).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are one line on stderr (exit status 2)."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def _fail(prog: str, message: str, status: int = 2) -> int:
    print(f"{prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return status


def _check_output(path: str | None, flag: str) -> str | None:
    """Why ``path`` cannot be written (checked before a long run, by opening it), or None."""
    if path is None:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        return f"{flag} {path}: directory {parent} does not exist"
    if os.path.isdir(path):
        return f"{flag} {path}: is a directory"
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return f"{flag} {path}: cannot be written ({e.strerror or e})"
    if not existed:
        os.remove(path)
    return None


def _check_output_dir(path: str | None, flag: str) -> str | None:
    """Why files cannot be written into directory ``path`` (created later if missing), or None."""
    if path is None:
        return None
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{flag} {path}: not a directory"
    target = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(target):
        return f"{flag} {path}: directory {target} does not exist"
    try:
        import tempfile

        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as e:
        return f"{flag} {path}: cannot write into {target} ({e.strerror or e})"
    return None


def _quiet_transformers() -> None:
    """Hide transformers' own progress bars and info logs (weight loading) so the CLI output stays ours."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is needed by compare anyway
        return
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _dump_report(path: str, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON (non-finite floats as Infinity/NaN, as json does)."""
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def _console():
    """The stdout console for reports. Off a terminal (logs, CI, pipes) rich would wrap at 80 columns and drop or
    truncate table columns; there we use 160 unless COLUMNS says otherwise."""
    import sys

    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=160)


def _print_footer(console, notes, written) -> None:
    """Notes (dim) and the files written (a path or a list of paths) under a rendered report."""
    from rich.markup import escape

    for note in notes:
        console.print(f"[dim]note: {escape(note)}[/dim]", highlight=False)
    for path in ([written] if isinstance(written, str) else (written or [])):
        console.print(f"wrote {path}", highlight=False)


def _names(value: str) -> str:
    """argparse ``type`` of a comma-separated list of names: rejects an empty list or an empty name in it."""
    import argparse

    if not value.strip() or any(not item.strip() for item in value.split(",")):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {value!r} (an empty name)")
    return value


def _csv_list(values) -> list[str] | None:
    """``--op a b --op c,d`` / ``--providers a,b`` -> flat list (None when not given)."""
    if not values:
        return None
    if isinstance(values, str):
        values = [values]
    flat = []
    for v in values:
        flat.extend(v if isinstance(v, list) else [v])
    return [x for item in flat for x in str(item).split(",") if x]


def _fmt_bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.1f} MiB"


def _fmt_rel(x: float) -> str:
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.2e}"


def _num(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    s = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return f"{s}{unit}"


def _layers(model: dict[str, Any]) -> str:
    n = model.get("num_hidden_layers")
    return f"{n} layer{'' if n == 1 else 's'}"


def _run_staged(run, config, quiet: bool, total: int | None = None):
    """``run(config)``, with a stage progress bar on stderr (``total`` stages, or unknown) unless ``quiet``."""
    if quiet:
        return run(config)
    with _StageProgress(total) as progress:
        return run(config, progress=progress)


class _StageProgress:
    """A rich progress bar (stderr) fed by ``progress(label)`` before each of ``total`` tasks (total None: spinner).

    Shown only on a terminal: on a pipe or a file, rich would leave an empty line on stderr when it stops.
    """

    def __init__(self, total: int | None):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        columns = [SpinnerColumn(), TextColumn("{task.description}")]
        if total is not None:
            columns += [BarColumn(), MofNCompleteColumn()]
        self._progress = (Progress(*columns, TimeElapsedColumn(), console=console, transient=True)
                          if console.is_terminal else None)
        self._total = total
        self._task = None
        self._started = False

    def __enter__(self):
        if self._progress is not None:
            self._progress.__enter__()
            self._task = self._progress.add_task("preparing", total=self._total)
        return self

    def __exit__(self, *exc):
        return self._progress.__exit__(*exc) if self._progress is not None else None

    def __call__(self, label: str, *rest) -> None:
        if self._progress is None:
            return
        if rest:  # e2e: (provider, step, total)
            step, total = rest
            self._progress.update(self._task, description=f"{label} step {step}/{total}")
            return
        if self._started and self._total is not None:
            self._progress.advance(self._task)
        self._started = True
        self._progress.update(self._task, description=label)
