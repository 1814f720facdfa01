"""Whether an autograd.Function's backward owns its incoming gradient, so that it may write its result over it.

Liger-Kernel's ``in_place`` backwards (RMSNorm, poly_norm, fused add + RMSNorm) write dx over dy unconditionally,
which is wrong whenever anything else still reads dy: the gradient of ``y + r`` is one tensor handed to both
operands, and r's branch may run after y's; a ``grad_outputs`` tensor passed to ``torch.autograd.grad`` is the
caller's; a tensor hook may have kept it. Autograd itself has the same question when it stores a gradient in
``.grad`` without a copy (AccumulateGrad "steals" the buffer when its C++ use count shows no other owner), and
:func:`owns_grad` asks it the same way, from Python:

- the TensorImpl, the Python object and the storage have exactly the owners they have when a probe backward on the
  same call path, whose incoming gradient is known to be exclusively owned, looks at its own: C++ use counts
  (``Tensor._use_count()``, the storage's) and the Python reference count (``sys.getrefcount``), measured once per
  device type (see :func:`prepare`). Anything else that holds the gradient (another graph node's pending input
  buffer, the engine's root gradient, a caller's variable, a hook's list) adds at least one to one of them; no weak
  references;
- the storage is this tensor's alone and exactly its size (no view into a larger gradient whose other parts or
  base someone reads), contiguous, at offset 0.

The counts are measured rather than assumed because autograd's own share changes between releases: from torch 2.12
(pytorch/pytorch#177837) ``PyNode::apply`` drops its C++ list of the incoming gradients before calling the Python
backward, so the Python object is the tensor's one C++ owner there; in torch 2.11 and earlier the list keeps a second
reference for the whole call. A use count of 1 written as a constant (as here until 2026-12-05) answers "not owned"
to every gradient on torch 2.11, the GPU image's release: read from the two releases' sources, this is why
poly_norm's in-place tests saved nothing on the H200. The probe also runs on the op's own device type, so that a
difference between the CPU and an accelerator's backward path (a device thread, stream bookkeeping) cannot make
the two disagree.

Every check errs towards "not owned" (a new buffer, as without ``in_place``): a missing private API, a calibration
that failed, or ``torch.compile`` tracing (compiled autograd) all answer False.
"""

from __future__ import annotations

import sys
import threading
import weakref

import torch

from ..support import COMPILER, dynamo_compiling
from ._common import direct_backward
from .first_order import first_order

_BASELINES: dict[str, tuple[int, int, int]] = {}
"""Per device type: (Python refcount, tensor use count, storage use count) of an exclusively owned incoming gradient
on autograd's call path, as :func:`owns_grad` reads them (:func:`_record`, the probe's, the same way at the same depth);
(-1, -1, -1): the probe failed, never write in place."""
MEASURED = _BASELINES
"""The device types :func:`prepare` has measured (probe failures included): a forward asks
``x.device.type not in MEASURED`` before calling it (one Python frame less per call once measured)."""
_NEVER = (-1, -1, -1)


@direct_backward  # (the ops' backwards are called so: the same call path)
class _Probe(torch.autograd.Function):
    """A backward on the same call path as the ops' (the grad-mode check of
    :func:`~tigon.kernels.first_order.first_order` in the backward itself, then ``owns_grad(dy)``), whose incoming
    gradient is known to be exclusively owned (the fresh product of a MulBackward)."""

    seen: tuple[int, int, int] | None = None

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():
            return first_order(_Probe.backward, ctx, dy)
        _record(dy)
        return dy


def _record(dy: torch.Tensor) -> None:
    # owns_grad's steps, at the same depth (the storage's Python object is made by the size check first there, and
    # kept by the storage while the tensor holds it), then its counts read as it reads them: keep the two alike
    dy.untyped_storage().nbytes()
    storage = dy.untyped_storage()
    _Probe.seen = sys.getrefcount(dy), dy._use_count(), torch._C._storage_Use_Count(storage._cdata)


def prepare(device: torch.device) -> None:
    """Measure the baseline :func:`owns_grad` compares with, once per process and device type: a tiny forward and
    backward through :class:`_Probe` on ``device`` (the op's input's). Call it from the op's forward (eager, outside
    any backward: a backward run from inside another, on an accelerator's autograd thread, is best avoided); until it
    has run for dy's device type :func:`owns_grad` says False. Not measured under inference mode (no autograd to
    probe), while a CUDA graph is being captured (the probe's allocations and launches would join or break the
    capture) or while tracing: a later eager forward measures it."""
    kind = device.type
    if kind in _BASELINES or torch.is_inference_mode_enabled() or torch.compiler.is_compiling():
        return
    if kind == "cuda" and torch.cuda.is_current_stream_capturing():
        return
    _BASELINES[kind] = _isolated(lambda: _calibrate(device))


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
    return out[0] if out else _NEVER


def _calibrate(device: torch.device) -> tuple[int, int, int]:
    try:
        with torch.enable_grad():
            x = torch.zeros(2, device=device, requires_grad=True)
            (_Probe.apply(x) * torch.ones(2, device=device)).sum().backward()
        seen = _Probe.seen
    except Exception:  # a platform where the probe cannot run: never write in place
        seen = None
    _Probe.seen = None
    return seen if seen is not None else _NEVER


def owns_grad(dy: torch.Tensor, dtype: torch.dtype) -> bool:
    """True when ``dy``, the incoming gradient of an autograd.Function's backward, may be overwritten: nothing but
    autograd's call of this backward holds it (see the module docstring), it is contiguous, at offset 0 of a storage
    of exactly its size, and of ``dtype``.

    Call it directly from ``backward(ctx, dy)`` (no decorator: :func:`tigon.kernels.first_order.first_order`'s pattern),
    with ``dy`` the backward's own argument and no other local name bound to it (no view, reshape or
    ``.contiguous()`` of it kept either): the reference counts it compares are that call path's. False until
    :func:`prepare` has run for dy's device type.
    """
    base = _BASELINES.get(dy.device.type)
    if base is None or base == _NEVER or (dy.dtype != dtype or not dy.is_contiguous() or dy.storage_offset() != 0
            or dy.requires_grad or dynamo_compiling() or COMPILER._is_compiling_flag  # (is_compiling())
            or not hasattr(dy, "_use_count")
            or not hasattr(torch._C, "_storage_Use_Count")):
        return False
    if weakref.getweakrefs(dy):
        return False
    if dy.untyped_storage().nbytes() != dy.numel() * dy.element_size():
        return False
    # the counts, in this frame (a helper's would be one Python frame more per call); _record reads them alike
    storage = dy.untyped_storage()
    return (sys.getrefcount(dy), dy._use_count(), torch._C._storage_Use_Count(storage._cdata)) == base
