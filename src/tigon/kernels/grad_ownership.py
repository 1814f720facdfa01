"""Whether an autograd.Function's backward owns its incoming gradient, so that it may write its result over it.

Liger-Kernel's ``in_place`` backwards (RMSNorm, poly_norm, fused add + RMSNorm) write dx over dy unconditionally,
which is wrong whenever anything else still reads dy: the gradient of ``y + r`` is one tensor handed to both
operands, and r's branch may run after y's; a ``grad_outputs`` tensor passed to ``torch.autograd.grad`` is the
caller's; a tensor hook may have kept it. Autograd itself has the same question when it stores a gradient in
``.grad`` without a copy (AccumulateGrad "steals" the buffer when its C++ use count shows no other owner), and
:func:`owns_grad` asks it the same way, from Python:

- the TensorImpl has one C++ owner (``Tensor._use_count() == 1``: the Python object autograd handed us; another
  graph node's pending input buffer or the engine's root gradient would be a second);
- the Python object has only the references autograd's call path itself holds (``sys.getrefcount``, compared with
  the count a probe backward sees on the same path, measured once: a hook's list or a caller's variable adds one);
  no weak references;
- the storage is this tensor's alone and exactly its size (no view into a larger gradient whose other parts or
  base someone reads), contiguous, at offset 0.

Every check errs towards "not owned" (a new buffer, as without ``in_place``): a missing private API, a calibration
that failed, or ``torch.compile`` tracing (compiled autograd) all answer False.
"""

from __future__ import annotations

import sys
import threading
import weakref

import torch

from ._common import once_differentiable

_BASELINE: tuple[int, int] | None = None  # (Python refcount, storage use count) on autograd's path; (-1, -1): never


def _counts(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return sys.getrefcount(t), torch._C._storage_Use_Count(storage._cdata)


class _Probe(torch.autograd.Function):
    """A backward on the same call path as the ops' (``once_differentiable``, then ``owns_grad(dy)``), whose
    incoming gradient is known to be exclusively owned (the fresh product of a MulBackward)."""

    seen: tuple[int, int] | None = None

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        _record(dy)
        return dy


def _record(dy: torch.Tensor) -> None:  # the same depth as owns_grad's call of _counts
    _Probe.seen = _counts(dy)


def prepare() -> None:
    """Measure the baseline :func:`owns_grad` compares with, once per process: a tiny CPU forward and backward
    through :class:`_Probe`. Call it from the op's forward (eager, outside any backward: a backward run from inside
    another, on an accelerator's autograd thread, is best avoided); until it has run :func:`owns_grad` says False."""
    global _BASELINE
    if _BASELINE is None and not torch.is_inference_mode_enabled():  # (no autograd there to probe)
        _BASELINE = _isolated(_calibrate)


def _isolated(fn):
    """``fn()`` run on a thread of its own, so that none of the caller's thread-local autograd state sees the probe:
    the first call often comes from inside an activation checkpoint, whose saved-tensor hooks would take the probe's
    saved tensors (and its backward, run inside the checkpointed forward, would start a recomputation), and whose
    selective-checkpoint dispatch mode would count its ops (issue 26: the first checkpointed step of a process failed
    with "A different number of tensors was saved during the original forward and recomputation")."""
    out = []
    thread = threading.Thread(target=lambda: out.append(fn()), name="tigon-grad-ownership-probe")
    thread.start()
    thread.join()
    return out[0] if out else (-1, -1)


def _calibrate() -> tuple[int, int]:
    try:
        with torch.enable_grad():
            x = torch.zeros(2, requires_grad=True)
            (_Probe.apply(x) * torch.ones(2)).sum().backward()
        seen = _Probe.seen
    except Exception:  # a platform where the probe cannot run: never write in place
        seen = None
    return seen if seen is not None else (-1, -1)


def owns_grad(dy: torch.Tensor, dtype: torch.dtype) -> bool:
    """True when ``dy``, the incoming gradient of an autograd.Function's backward, may be overwritten: nothing but
    autograd's call of this backward holds it (see the module docstring), it is contiguous, at offset 0 of a storage
    of exactly its size, and of ``dtype``.

    Call it directly from ``backward(ctx, dy)`` (decorated with :func:`tigon.kernels._common.once_differentiable`),
    with ``dy`` the backward's own argument and no other local name bound to it: the Python reference count it
    compares is that call path's. False until :func:`prepare` has run.
    """
    if _BASELINE is None or (dy.dtype != dtype or not dy.is_contiguous() or dy.storage_offset() != 0 or dy.requires_grad
            or torch.compiler.is_compiling() or not hasattr(dy, "_use_count")
            or not hasattr(torch._C, "_storage_Use_Count")):
        return False
    if dy._use_count() != 1 or weakref.getweakrefs(dy):
        return False
    if dy.untyped_storage().nbytes() != dy.numel() * dy.element_size():
        return False
    return _counts(dy) == _BASELINE
