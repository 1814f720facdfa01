"""The ``tigon`` command line. It parses arguments, calls a workflow in :mod:`tigon.workflows`, and renders the
result (rich progress bar and tables, ``--json``, ``--plot``); it computes nothing itself.

Subcommands: ``compare`` (train original vs Tigon-patched and compare), ``env`` (accelerator, versions, backend
per op x dtype), ``inspect`` (what tigon.patch would replace in a model, config only), ``verify`` (each op against
PyTorch and float64; exit status 1 on failure). Bad input ends with a one-line error on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ._render import (_check_output, _check_output_dir, _console, _csv_list, _dump_report, _fail, _fmt_bytes,
                      _fmt_rel, _layers, _num, _Parser, _print_footer, _quiet_transformers, _run_staged)


def build_parser() -> argparse.ArgumentParser:
    """The ``tigon`` argument parser (one subparser per workflow)."""
    from .. import __version__

    parser = _Parser(prog="tigon", description="Triton kernels for LLM training, and the tools to adopt them safely.")
    parser.add_argument("--version", action="version", version=f"tigon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    from . import compare

    compare.add_parser(sub)
    from . import env

    env.add_parser(sub)
    from . import inspect

    inspect.add_parser(sub)
    from . import verify

    verify.add_parser(sub)
    from . import bench

    bench.add_parser(sub)
    from . import profile

    profile.add_parser(sub)
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
    args = parser.parse_args(argv)
    _enable_interpreter(getattr(args, "device", None))
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return _fail("tigon", "interrupted", 130)


# ----------------------------------------------------------------------------------------------------------------
# compare


# ----------------------------------------------------------------------------------------------------------------
# env, inspect, verify


# ----------------------------------------------------------------------------------------------------------------
# bench, profile
