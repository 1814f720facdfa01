"""Out-of-range targets on the kernel path: recorded by the loss kernels, raised on the host without a device sync.

A target outside ``[0, V)`` that is not ``ignore_index`` gives that token a NaN loss (the kernels never read out of
bounds). Checking the targets before the launch would read them on the host: a device synchronisation per call,
which stalls the host's run-ahead (issue 28's host cost). Instead the cross-entropy forward kernel writes any such
target into a one-element int64 buffer that lives in pinned host memory, mapped into the device's address space
(CUDA unified addressing: the kernel stores straight to host memory). Every later launch of a loss kernel, forward
or backward, first reads that buffer on the host (no sync: a plain memory read) and raises when a bad target was
recorded, naming it.

So on CUDA the error comes at the first loss launch after the GPU has run the bad call's forward: usually that
call's backward when the host waited for the GPU (``loss.item()``, a full queue), else the next call. The bad
call's loss is NaN. On the CPU the targets are checked up front (no device to wait for), and torch raises for
CPU-side indexing as well. torch's own CUDA cross-entropy stops the process with a device-side assert instead
(the CUDA context is then unusable); this check leaves the context working.
"""

from __future__ import annotations

import numpy as np
import torch

NONE_SEEN = -(2**63)
"""The buffer's value while no bad target was recorded (int64's minimum)."""

_buffers: dict[tuple[str, int | None], tuple[torch.Tensor, np.ndarray]] = {}
_by_device: dict[torch.device, torch.Tensor] = {}
"""buffer()'s answers by device object, so that a launch reads no ``device.type`` (~0.5 us); never stale: a device's
buffer lives as long as the process."""


def buffer(device: torch.device) -> torch.Tensor:
    """The (1,) int64 buffer a loss kernel on ``device`` records a bad target in.

    CUDA: pinned host memory (the kernel writes it through unified addressing; the host reads it with no sync).
    Elsewhere (the CPU under Triton's interpreter): an ordinary CPU tensor.
    """
    t = _by_device.get(device)
    if t is None:
        t = _by_device[device] = _buffer(device)
    return t


def _buffer(device: torch.device) -> torch.Tensor:
    key = (device.type, device.index)
    entry = _buffers.get(key)
    if entry is None:
        t = torch.full((1,), NONE_SEEN, dtype=torch.int64, pin_memory=device.type == "cuda")
        entry = _buffers[key] = (t, t.numpy())
    return entry[0]


def raise_if_seen() -> None:
    """Raise ValueError if a loss kernel recorded a target outside ``[0, V)`` other than ``ignore_index``.

    Reads the buffers on the host (no device sync); resets the one it raises for, so one bad call raises once.

    Raises:
        ValueError: naming the bad target and the device.
    """
    for (dev_type, index), (_, view) in _buffers.items():
        bad = int(view[0])
        if bad != NONE_SEEN:
            view[0] = NONE_SEEN
            where = dev_type if index is None else f"{dev_type}:{index}"
            raise ValueError(
                f"tigon cross-entropy: target {bad} is outside [0, vocabulary size) and is not ignore_index "
                f"(found by a loss kernel on {where}; that call's loss is NaN). Targets must be class indices in "
                "[0, V) or ignore_index")
