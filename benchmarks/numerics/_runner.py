"""What the numerics studies in this folder share: their command line (``--out JSON`` plus the study's own flags),
the record they write (the study's results with the command, torch version and device), and the two error measures
they report: the relative L2 error against a float64 truth (``tigon.numerics.rel_l2``, the measure of the tests and
``tigon verify``) and the largest relative distance of a loss curve from a reference curve."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import torch

from tigon.numerics import rel_l2

__all__ = ["max_rel_distance", "rel_l2", "run"]


def max_rel_distance(losses: list[float], ref: list[float]) -> float:
    """max over steps of |loss - ref| / |ref|."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, ref))


def run(doc: str, study: Callable[[argparse.Namespace], dict],
        add_arguments: Callable[[argparse.ArgumentParser], None] | None = None, argv=None) -> int:
    """Parse the command line (``doc``: the script's docstring, its first paragraph the description), run
    ``study(args)`` and write its results to ``--out`` (when given) as
    ``{"command", "torch", "device", **results}``."""
    first, _, rest = doc.strip().partition("\n\n")
    ap = argparse.ArgumentParser(description=first, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", metavar="JSON", help="write the results, with the command and versions, as JSON")
    if add_arguments:
        add_arguments(ap)
    args = ap.parse_args(argv)
    results = study(args)
    if args.out:
        record = {"command": "PYTHONPATH=src python3 " + " ".join(sys.argv),
                  "torch": torch.__version__,
                  "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", **results}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    return 0
