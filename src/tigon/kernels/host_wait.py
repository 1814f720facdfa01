"""The host syncs Tigon's ops make on purpose, marked so that timing tools can tell the wait from the host's work.

A few ops read a device value on the host: the fused LM-head losses find the rows whose target is not ignored
(:mod:`tigon.kernels.ignored_rows`: ``nonzero``, or per-group counts), the vocab-parallel cross-entropy reads its
shard's width (:mod:`tigon.ops.vocab_parallel`). Such a read waits until the device has run everything queued
before it. Inside a training step that wait is not host work: the device is busy meanwhile, and a device-bound step
loses only the launch latency after it. ``tigon profile`` times the host's work behind a sleep kernel that holds the
device (:class:`tigon.workflows.timing.DeviceHold`), so an unmarked read waits for the whole sleep: the fused
cross-entropy's 0.5 ms of host work in a Llama-3-8B step was measured as 296 ms on an H100 (session 25), and the
profile then advised against the op that saved 17 ms of device time.

Every such read runs through :func:`host_read`. A timing tool registers a watcher (:func:`watching`): an object with
``wait_started()`` and ``wait_ended()``, called around each read on whatever thread makes it (autograd's backward
thread included). Without watchers :func:`host_read` costs one list check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")


class Watcher(Protocol):
    """Told around each marked host read: ``wait_started()`` just before it, ``wait_ended()`` just after."""

    def wait_started(self) -> None: ...

    def wait_ended(self) -> None: ...


_WATCHERS: list[Watcher] = []


def host_read(read: Callable[[], T]) -> T:
    """``read()``, a call that makes the host wait for the device (``nonzero``, ``.tolist()``, ``.item()`` of a
    device tensor), with the watchers told before and after (in reverse order after; also when ``read`` raises,
    whose exception propagates, and when a watcher raises: each watcher told ``wait_started`` is told
    ``wait_ended``)."""
    if not _WATCHERS:
        return read()
    with contextlib.ExitStack() as told:  # every watcher told wait_started is told wait_ended, whatever raises
        for w in list(_WATCHERS):
            w.wait_started()
            told.callback(w.wait_ended)
        return read()


@contextlib.contextmanager
def watching(watcher: Watcher) -> Iterator[Watcher]:
    """Register ``watcher`` for the block (nested blocks stack: the outer watcher is told first)."""
    _WATCHERS.append(watcher)
    try:
        yield watcher
    finally:  # this very object, the last one registered (list.remove compares with ==: an equal watcher's entry)
        del _WATCHERS[max(i for i, w in enumerate(_WATCHERS) if w is watcher)]
