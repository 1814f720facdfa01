"""The devices the tools run on and the versions they report: ``--device`` resolved, a device's name and string,
the installed versions (compare, verify, bench, e2e, profile and env share them)."""

from __future__ import annotations

import os
import platform

import torch

from .errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")
"""The values of the tools' ``--device``."""


def resolve_device(name: str) -> torch.device:
    """The device of a tool's ``--device`` (one of :data:`DEVICES`; "auto": CUDA when available, else the CPU).

    Raises:
        ConfigError: an unknown name, or "cuda" without a CUDA device.
    """
    if name not in DEVICES:
        raise ConfigError(f"unknown device {name!r} (choose from {', '.join(DEVICES)})")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda was requested but no CUDA device is available")
    return torch.device(name)


def device_str(device: torch.device) -> str:
    """``"cuda:<index>"`` (the current device's index when ``device`` has none) or the device type."""
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name and core count (/proc/cpuinfo; else platform's processor)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    """Versions of Python, Tigon, PyTorch, Triton and Transformers (None when not installed)."""
    import tigon

    from ..support import triton_version

    try:
        import transformers

        tf = transformers.__version__
    except ImportError:  # pragma: no cover
        tf = None
    return {
        "python": platform.python_version(),
        "tigon": tigon.__version__,
        "torch": torch.__version__,
        "triton": triton_version(),
        "transformers": tf,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
    }
