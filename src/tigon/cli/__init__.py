"""The ``tigon`` command line. It parses arguments, calls a workflow in :mod:`tigon.workflows`, and renders the
result (rich progress bar and tables, ``--json``, ``--plot``); it computes nothing itself.

Subcommands, one module each with ``add_parser(sub)``, ``run(args) -> int`` and its renderers: ``compare`` (train
original vs Tigon-patched and compare), ``env`` (accelerator, versions, backend per op x dtype), ``inspect`` (what
tigon.patch would replace in a model, config only), ``verify`` (each op against PyTorch and float64), ``bench`` (speed
and memory per op and provider, or whole training steps), ``profile`` (where the step's time goes, predicted vs
measured speed-up). What they share is in :mod:`tigon.cli._render`.

Exit status: 0 on success; 2 on bad input or a usage error (one line on stderr); 1 when ``verify`` finds a failure or
a ``compare`` run crashed, is non-finite or diverged; 3 when ``compare``'s runs are ok but their losses differ beyond
the bound for the dtype (:data:`tigon.workflows.compare_verdict.LOSS_RTOL`); 130 when interrupted. The command modules
import their workflows inside ``add_parser``/``run``, never at module import, so that ``main`` can set TRITON_INTERPRET
(:func:`_enable_interpreter`) before any Triton kernel module loads.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import bench, compare, env, inspect, profile, verify
from ._render import _fail, _Parser

_COMMANDS = (compare, env, inspect, verify, bench, profile)  # in the order of `tigon --help`


def build_parser() -> argparse.ArgumentParser:
    """The ``tigon`` argument parser (one subparser per command module)."""
    from .. import __version__

    parser = _Parser(prog="tigon", description="Triton kernels for LLM training, and the tools to adopt them safely.")
    parser.add_argument("--version", action="version", version=f"tigon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in _COMMANDS:
        command.add_parser(sub)
    return parser


def _enable_interpreter(device: str | None) -> None:
    """Run Tigon's kernels in Triton's interpreter when they will see CPU tensors.

    Must happen before any ``tigon.ops`` module is imported (they are imported lazily, on the first kernel call).
    """
    import torch

    if device == "cpu" or (device in (None, "auto") and not torch.cuda.is_available()):
        os.environ.setdefault("TRITON_INTERPRET", "1")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tigon`` console script; returns the exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # a subcommand's unknown flag: its own parser says so (``tigon compare: error``), not the top level
        commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.get(getattr(args, "command", None), parser).error(f"unrecognized arguments: {' '.join(extra)}")
    _enable_interpreter(getattr(args, "device", None))
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return _fail("tigon", "interrupted", 130)
