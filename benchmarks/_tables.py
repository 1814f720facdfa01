"""What the one-process-per-provider tables share (``e2e_table.py``, ``op_table.py``): the providers run with an
environment of their own, ``N,name=M`` limits, file names, and the launcher that keeps a failed provider as a report
saying why.

Each provider runs in a fresh ``python3 -m tigon.cli bench ...`` process, so compile caches, allocator state,
monkey-patches and import-time switches (Liger's ``LIGER_KERNEL_IMPL``) never leak between providers. A process that
runs past its limit or exits without writing its JSON report leaves a report written here instead (the script's
``failed_report(why)``), so the table has a cell or row that says so, never a missing one. Every report the launcher
saw gets a ``table_run`` entry: the exact command, its extra environment, the status and the seconds it took.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Callable

CUTEDSL_ENV = {"LIGER_KERNEL_IMPL": "cutedsl"}
"""Liger-Kernel's opt-in CuTe DSL backend, picked when ``liger_kernel`` is imported (hence a process of its own)."""
ENV_VARIANTS = {"liger_cutedsl": ("liger", CUTEDSL_ENV)}
"""Table provider -> (``tigon bench`` provider, extra environment of its process), for both tables."""


def model_name(model: str) -> str:
    """A file-name-safe name of ``--model``: a preset or Hub id as given (``/`` as ``--``), a config directory or
    ``config.json`` file by its directory's name (``benchmarks/configs/gpt-oss-20b`` -> ``gpt-oss-20b``)."""
    if os.path.exists(model):
        path = os.path.abspath(model)
        if os.path.isfile(path):
            path = os.path.dirname(path)
        return os.path.basename(path.rstrip(os.sep))
    return model.replace("/", "--")


def gpu_tag() -> str:
    """The file names' device: h200 / h100 for those cards, else the CUDA device's name in lower case without spaces,
    cpu without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name()
    for card in ("H200", "H100"):
        if card in name:
            return card.lower()
    return name.lower().replace("nvidia ", "").replace(" ", "-")


def today() -> str:
    """The date field of result file names, ``YYYYMMDD`` (benchmarks/README.md, naming)."""
    return datetime.date.today().strftime("%Y%m%d")


def parse_keyed(spec) -> tuple[float | None, dict[str, float]]:
    """``"N,name=M,..."`` -> (N or None, {name: M}); a bare number -> (it, {})."""
    if isinstance(spec, (int, float)):
        return float(spec), {}
    default, own = None, {}
    for item in str(spec).split(","):
        if not item.strip():
            continue
        name, eq, value = item.strip().rpartition("=")
        if eq:
            own[name.strip()] = float(value)
        else:
            default = float(value)
    return default, own


def keyed_value(spec, name: str, what: str = "provider") -> float:
    """``name``'s value from ``spec`` (:func:`parse_keyed`): its own, else the default.

    Raises:
        ValueError: neither (or a value that is not a number).
    """
    default, own = parse_keyed(spec)
    if name in own:
        return own[name]
    if default is None:
        raise ValueError(f"{spec!r} gives no default for {what} {name!r}")
    return default


def provider_timeout(spec, provider: str) -> float:
    """``provider``'s limit (s) from ``--timeout``: a number, or ``"N,name=M,..."`` (default N, provider name M)."""
    return keyed_value(spec, provider, "provider")


def relabel(path: str, name: str) -> None:
    """Name the rows of a variant's JSON report after the variant."""
    with open(path) as f:
        report = json.load(f)
    for r in report["rows"]:
        r["provider"] = name
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def command_line(cmd: list[str], env: dict) -> str:
    """``cmd`` as one shell line, its extra environment first (``LIGER_KERNEL_IMPL=cutedsl python3 -m ...``)."""
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(c) for c in cmd])


def _last_line(text) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:400] if lines else ""


def launch(cmd: list[str], path: str, provider: str, *, base: str, env: dict, limit: float,
           failed_report: Callable[[str], dict], extra: dict | None = None) -> dict:
    """Run ``cmd`` (which writes the JSON report ``path``) under ``env`` added to this environment, for at most
    ``limit`` s; its stderr is passed on once it ends, and its last line is the reason a failed run gives.

    No report written (non-zero exit, time limit): ``failed_report(why)`` is written there; a report the process
    wrote before it failed or ran out of time (``tigon bench`` rewrites its JSON after every measurement) is kept,
    with the rows it has. A variant (``base`` != ``provider``): the rows are named ``provider``. Either way the report
    gets ``table_run`` (the returned record: provider, cmd, env, status ``ok`` / ``failed`` / ``timed out``, why,
    seconds, and ``extra``'s items), so that a reader tells a cut-short report from a complete one.
    """
    start = time.perf_counter()
    status, why = "ok", ""
    try:
        done = subprocess.run(cmd, timeout=limit, check=False, env={**os.environ, **env}, stderr=subprocess.PIPE)
        err = done.stderr
        if done.returncode:
            status, why = "failed", f"the process exited with status {done.returncode}"
    except subprocess.TimeoutExpired as e:
        err, status, why = e.stderr, "timed out", f"timed out after {limit:g} s (--timeout)"
    if err:
        sys.stderr.write(err.decode(errors="replace") if isinstance(err, bytes) else err)
    wrote = os.path.exists(path)
    if status != "ok":
        last = _last_line(err) if status == "failed" else ""
        why += ("" if wrote else " and wrote no report") + (f": {last}" if last else "")
        print(f"{provider}: {why}", file=sys.stderr)
    if not wrote:  # a report that says so, not a missing one
        status = status if status != "ok" else "failed"
        why = why or "the process exited with status 0 and wrote no report"
        with open(path, "w") as f:
            json.dump(failed_report(why), f, indent=1)
    elif base != provider:
        relabel(path, provider)
    record = {"provider": provider, "cmd": command_line(cmd, env), "env": dict(env), "status": status, "why": why,
              "seconds": round(time.perf_counter() - start, 1), **(extra or {})}
    with open(path) as f:
        report = json.load(f)
    report["table_run"] = record
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    return record
