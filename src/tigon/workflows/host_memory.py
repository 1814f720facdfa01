"""Will a CPU training run fit in this machine's memory? A lower bound checked before the model is built, so that a
run far too large for the host ends with a one-line error instead of the kernel's out-of-memory killer.

The bound counts parameters only (no activations, no allocator slack): the model that stays built while the runs
train, plus the training copy's weights, gradients and AdamW's two states, all in the training dtype. Memory beyond
it can still run out; memory below it surely does (swap aside).
"""

from __future__ import annotations

import os

from .errors import ConfigError

TENSORS_PER_PARAMETER = 5
"""The kept model, and the training copy's weights, gradients, AdamW ``exp_avg`` and ``exp_avg_sq``."""


def available_bytes() -> int | None:
    """Memory a new allocation can get without swapping: ``psutil``'s ``available`` (else ``MemAvailable`` of
    ``/proc/meminfo``), capped by a cgroup v2 limit (``memory.max - memory.current``) where one is set; None when
    none of these can be read."""
    avail = None
    try:
        import psutil

        avail = int(psutil.virtual_memory().available)
    except Exception:  # (not installed, or no /proc)
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        avail = int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            current = int(f.read().strip())
        if limit != "max":
            room = max(int(limit) - current, 0)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def check_fits(num_parameters: int, element_size: int, what: str, *, processes: int = 1,
               available: int | None = None) -> None:
    """Raise when ``processes`` CPU training runs of ``num_parameters`` parameters in ``element_size``-byte
    elements cannot fit in ``available`` bytes (default: :func:`available_bytes`; unknown: no check).

    Raises:
        ConfigError: naming the estimate, the memory available and what to change; ``what`` names the model
            (``"--preset llama3-8b --layers 1"``).
    """
    if available is None:
        available = available_bytes()
    need = num_parameters * element_size * TENSORS_PER_PARAMETER * processes
    if available is None or need <= available:
        return
    ranks = f" x {processes} processes" if processes > 1 else ""
    halve = " or --dtype bfloat16" if element_size > 2 else ""
    raise ConfigError(
        f"{what} needs at least {need / 2**30:.1f} GiB of memory to train on the CPU ({num_parameters / 1e9:.2f}e9 "
        f"parameters x {element_size} bytes x {TENSORS_PER_PARAMETER}: the model, the training copy's weights, "
        f"gradients and AdamW's two states{ranks}), {available / 2**30:.1f} GiB is available: choose a smaller "
        f"preset, fewer --layers{halve}")


def check_config_fits(hf_config, dtype: str, what: str, *, processes: int = 1) -> None:
    """:func:`check_fits` for a Hugging Face config: its parameters counted on a meta-device model (nothing
    allocated), ``dtype`` "bfloat16" (2 bytes an element) or another (4). A config the meta build cannot make is not
    checked here (the run reports it when it builds the model). Shared by ``tigon compare`` and ``tigon bench --e2e``.

    Raises:
        ConfigError: as :func:`check_fits`.
    """
    from .dry_run import build_meta_model

    try:
        params = sum(p.numel() for p in build_meta_model(hf_config).parameters())
    except Exception:  # (reported with its own message when the run builds the model)
        return
    check_fits(params, 2 if dtype == "bfloat16" else 4, what, processes=processes)
