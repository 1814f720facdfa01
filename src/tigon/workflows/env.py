"""What this machine gives Tigon: accelerator, library versions, and the backend each op would take (``tigon env``).

:func:`run_env` gathers, without running any kernel:

- the accelerator: every visible CUDA/ROCm GPU with its compute capability and memory, or ``"none: CPU"``;
- Python, Tigon, PyTorch, Triton, Transformers and CUDA versions, the platform and the CPU;
- whether Triton's interpreter is on (``TRITON_INTERPRET=1``) and the Tigon switches (``TIGON_STRICT``,
  ``TIGON_DISABLE``);
- for every op of the registry (:func:`tigon.ops.registry`) and every dtype in :data:`DTYPES`, the backend
  :func:`tigon.support.decide` picks for tensors on the default device (CUDA device 0 if any, else CPU) and why;
- every Liger-Kernel op name with what replaces it in Tigon, or why nothing does
  (:data:`tigon.liger_coverage.LIGER_OPS`).

The result is meant to be pasted into a bug report (``tigon env``, or ``tigon env --json env.json``).
"""

from __future__ import annotations

import dataclasses
import os
import platform
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import support
from ..liger_coverage import LIGER_OPS
from ..ops import registry

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes Tigon has kernels for (name -> torch dtype)."""

ENV_VARS = ("TRITON_INTERPRET", "TIGON_STRICT", "TIGON_DISABLE", "CUDA_VISIBLE_DEVICES")


@dataclass
class BackendRow:
    """The path one op takes for one dtype on the default device (:func:`tigon.support.decide`)."""

    op: str
    dtype: str
    backend: str
    reason: str


@dataclass
class EnvResult:
    """The outcome of :func:`run_env`; :meth:`as_dict` is what ``tigon env --json`` writes.

    Attributes:
        device: the device the backend decisions are for: ``"cuda:0"`` when CUDA is available, else ``"cpu"``.
        accelerator: the name of that GPU, or ``"none: CPU"``.
        compute_capability: ``"major.minor"`` of that GPU, or None on CPU.
        gpus: every visible GPU: ``{"index", "name", "compute_capability", "memory_gib"}`` (GiB = 2**30 bytes).
        cpu: the CPU model and core count.
        platform: ``platform.platform()``.
        versions: python, tigon, torch, triton, transformers, cuda (None when absent), hip (ROCm builds).
        triton_interpreter: True when ``TRITON_INTERPRET=1``, i.e. Tigon's kernels run in Triton's interpreter.
        strict: strict mode (``TIGON_STRICT=1``): a fallback to the reference raises instead of warning.
        disabled: ``TIGON_DISABLE=1``: every op runs the PyTorch reference.
        env: the values of the environment variables that steer Tigon (None when unset).
        backends: one :class:`BackendRow` per op x dtype.
        liger: one ``{"liger", "tigon", "note"}`` per Liger-Kernel name (:data:`tigon.liger_coverage.LIGER_OPS`);
            ``tigon`` None where Tigon has nothing, ``note`` then says why.
        notes: remarks for reading the table.
    """

    device: str
    accelerator: str
    compute_capability: str | None
    gpus: list[dict[str, Any]]
    cpu: str
    platform: str
    versions: dict[str, str | None]
    triton_interpreter: bool
    strict: bool
    disabled: bool
    env: dict[str, str | None]
    backends: list[BackendRow] = field(default_factory=list)
    liger: list[dict[str, str | None]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field."""
        return dataclasses.asdict(self)

    def backend_of(self, op: str, dtype: str) -> BackendRow:
        """The row for ``op`` x ``dtype`` (KeyError when absent)."""
        for row in self.backends:
            if row.op == op and row.dtype == dtype:
                return row
        raise KeyError((op, dtype))


def _gpus() -> list[dict[str, Any]]:
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({"index": i, "name": props.name, "compute_capability": f"{props.major}.{props.minor}",
                    "memory_gib": round(props.total_memory / 2**30, 1)})
    return out


def run_env(device: str | torch.device | None = None) -> EnvResult:
    """Describe the environment and the backend of every op x dtype.

    Args:
        device: the device to decide for; default CUDA device 0 when available, else the CPU.

    Returns:
        an :class:`EnvResult`. Nothing is computed on the device; no kernel is compiled.
    """
    from .devices import device_name, versions

    if device is None:
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    gpus = _gpus()
    if dev.type == "cuda":
        gpu = gpus[dev.index]
        accelerator, capability = gpu["name"], gpu["compute_capability"]
    else:
        accelerator, capability = "none: CPU", None
    vers = versions()
    vers["hip"] = torch.version.hip
    rows = []
    for op in registry():
        for name, dtype in DTYPES.items():
            d = support.decide(dev, dtype)
            rows.append(BackendRow(op, name, d.backend, d.reason))
    interp = support.interpreter_enabled()
    notes = []
    disabled = os.environ.get("TIGON_DISABLE", "0") == "1"
    if disabled:
        notes.append("TIGON_DISABLE=1: the kernels are turned off; every op runs the PyTorch reference.")
    elif dev.type == "cpu" and interp:
        notes.append("no CUDA device: the kernels run in Triton's CPU interpreter (correct but slow; the tigon CLI "
                     "sets TRITON_INTERPRET=1 on machines without CUDA).")
    elif dev.type == "cpu":
        notes.append("no CUDA device and TRITON_INTERPRET is not 1: every op runs the PyTorch reference.")
    if dev.type == "cuda" and interp and not disabled:
        notes.append("TRITON_INTERPRET=1 on a CUDA machine: the kernels are interpreted, not compiled.")
    if support.is_strict():
        notes.append("strict mode: an op that would fall back to the reference raises tigon.UnsupportedError.")
    notes.append("the backend is decided per call from the tensors' device and dtype; other dtypes (e.g. float64) "
                 "always run the reference.")
    return EnvResult(
        device=f"cuda:{dev.index}" if dev.type == "cuda" else dev.type,
        accelerator=accelerator,
        compute_capability=capability,
        gpus=gpus,
        cpu=device_name(torch.device("cpu")),
        platform=platform.platform(),
        versions=vers,
        triton_interpreter=interp,
        strict=support.is_strict(),
        disabled=disabled,
        env={k: os.environ.get(k) for k in ENV_VARS},
        backends=rows,
        liger=[dataclasses.asdict(op) for op in LIGER_OPS],
        notes=notes,
    )
