"""DTensor inputs of the row-wise ops: run the op on each rank's local shard, redistributing only what must be.

A DTensor (``torch.distributed.tensor``, used by tensor / sequence parallelism) is a wrapper whose memory is not
its data, so a kernel must never see it (``tigon._checks.tensor`` raises TypeError for any such subclass). The
row-wise ops instead unwrap it here, as Liger-Kernel does for its RMSNorm and SwiGLU:

- **Rows** (``x``, ``residual``, ``gate``/``up``, ``q``/``k``): run on the local shard when no mesh dimension shards a
  dimension the op mixes (the normalised last dimension of a norm; the rotated head dimension and the positions
  of RoPE, whose cos/sin are per position). A placement that does is redistributed first, with one warning per
  op and reason that states the cost: ``Shard`` of a mixed dimension is all-gathered (each rank receives the
  other ranks' (n-1)/n of the tensor's bytes), ``Partial`` is all-reduced; the output is then sharded back the
  way the input was (a local slice: no communication). The other row inputs are redistributed to the first's
  placements.
- **Parameters** (``weight``, ``bias``) are read whole on every rank (a Replicate DTensor is used as it is, a
  sharded one is all-gathered). Their gradient on each rank is then that rank's rows' share: ``Partial`` over the
  mesh dimensions that shard the rows, so autograd sums it across ranks when it reaches the parameter.
- **Constants** (``cos``, ``sin``) are read whole (``full_tensor()``).

An ``AsyncCollectiveTensor`` (the plain result of a collective not waited for yet, which torch's tensor-parallel
styles return with ``use_local_output=True``, e.g. a ``RowwiseParallel`` projection's all-reduced output) is waited
for and passed on as the plain tensor it holds (:func:`waited`, differentiable, no copy).

The outputs are DTensors with the rows' placements. Gradients flow through ``to_local`` / ``from_local``, which
are differentiable. Ops that reduce across rows (the cross-entropy losses) and :func:`tigon.functional.glu_linear`
take no DTensor: TypeError; logits or an LM head sharded by vocabulary go to :mod:`tigon.ops.vocab_parallel`.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass

import torch

from .._checks import is_dtensor

_warned: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class DTensorRule:
    """How an op's arguments are unwrapped (see the module docstring).

    rows: names of the row inputs; the first one's placements are the outputs'. outputs: for each output, the row
    input whose placements it takes (one name: the op returns one tensor). params: parameter names. constants:
    names read whole. mixed_dims: ``f(bound arguments, ndim)`` -> the dimensions (non-negative) of the rows
    that the op mixes and so must not be sharded.
    """

    rows: tuple[str, ...]
    outputs: tuple[str, ...]
    params: tuple[str, ...] = ()
    constants: tuple[str, ...] = ()
    mixed_dims: object = None


def last_dim(_args, ndim: int) -> tuple[int, ...]:
    """A norm's mixed dimension: the normalised last one."""
    return (ndim - 1,)


def no_dims(_args, _ndim: int) -> tuple[int, ...]:
    """An element-wise op mixes no dimension: any sharding runs locally."""
    return ()


_PLAIN = (torch.Tensor, torch.nn.Parameter, float, int, str, bool, type(None))
"""Argument types that are never a DTensor: the wrapper's fast path checks ``type(a) in _PLAIN`` first (a plain
call costs one tuple membership test per argument, no generator, no import of torch.distributed)."""


def _any_dtensor(args, kwargs) -> bool:
    """Whether an argument is a DTensor or an AsyncCollectiveTensor (both unwrapped by the slow path)."""
    for a in args:
        if type(a) not in _PLAIN and (is_dtensor(a) or is_async_collective(a)):
            return True
    if kwargs:
        for a in kwargs.values():
            if type(a) not in _PLAIN and (is_dtensor(a) or is_async_collective(a)):
                return True
    return False


def is_async_collective(t) -> bool:
    """Whether ``t`` is a ``torch.distributed._functional_collectives.AsyncCollectiveTensor`` (without importing
    torch.distributed when it is not loaded)."""
    import sys

    mod = sys.modules.get("torch.distributed._functional_collectives")
    cls = getattr(mod, "AsyncCollectiveTensor", None) if mod is not None else None
    return cls is not None and isinstance(t, cls)


class _Wait(torch.autograd.Function):
    """The plain tensor an AsyncCollectiveTensor holds, once its collective is done; the gradient passes through."""

    @staticmethod
    def forward(ctx, t):
        return t.trigger_wait().view_as(t)  # a view of the held tensor: no copy, and not the holder's own object

    @staticmethod
    def backward(ctx, grad):
        return grad


def waited(t):
    """``t`` itself, or for an AsyncCollectiveTensor the plain tensor it holds after waiting for its collective
    (differentiable: the gradient reaches ``t`` unchanged). Anything else is returned as it is."""
    return _Wait.apply(t) if is_async_collective(t) else t


def accepts_dtensor(rule: DTensorRule, *, asked_inside: bool = False):
    """Decorate a public op: DTensor arguments are unwrapped by ``rule`` (module docstring), plain calls pass
    straight through (one type check per argument).

    ``asked_inside``: ``fn`` itself, not wrapped (no Python frame of a wrapper per call), with ``rule`` attached: the
    op asks :func:`dtensor_call` itself where its cache of validated calls (:func:`tigon.support.remember_call`)
    misses. A hit needs no asking: the cache keys hold the arguments' types, and only calls of plain tensors (which
    passed the op's checks, that refuse tensor subclasses) are remembered."""

    def deco(fn):
        sig = inspect.signature(fn)
        if asked_inside:
            fn.dtensor_rule, fn.dtensor_signature = rule, sig
            return fn

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for a in args:  # (_any_dtensor, inline for the positional arguments: a plain call is one loop)
                if type(a) not in _PLAIN and (is_dtensor(a) or is_async_collective(a)):
                    break
            else:
                if not kwargs or not _any_dtensor((), kwargs):
                    return fn(*args, **kwargs)
            args = tuple(waited(a) for a in args)
            kwargs = {k: waited(v) for k, v in kwargs.items()}
            if not _any_dtensor(args, kwargs):
                return fn(*args, **kwargs)
            return _run_local(fn, fn.__name__, rule, sig.bind(*args, **kwargs))

        wrapper.dtensor_rule = rule
        return wrapper

    return deco


def dtensor_call(fn, *args, **kwargs):
    """For an op decorated with ``accepts_dtensor(rule, asked_inside=True)``, called by it with its arguments where
    its cache missed: the op's result for DTensor (or AsyncCollectiveTensor) arguments, unwrapped by its rule as
    :func:`accepts_dtensor`'s wrapper does; None for plain arguments (the op then goes on with its checks)."""
    if not _any_dtensor(args, kwargs):
        return None
    args = tuple(waited(a) for a in args)
    kwargs = {k: waited(v) for k, v in kwargs.items()}
    if not _any_dtensor(args, kwargs):
        return fn(*args, **kwargs)
    return _run_local(fn, fn.__name__, fn.dtensor_rule, fn.dtensor_signature.bind(*args, **kwargs))


def _warn_once(op: str, reason: str) -> None:
    if (op, reason) not in _warned:
        _warned.add((op, reason))
        warnings.warn(f"tigon.{op}: {reason}", stacklevel=4)


def _local_placements(op: str, name: str, t, mixed: tuple[int, ...]):
    """The placements ``t`` (a DTensor row input) is redistributed to (mixed dimensions unsharded, Partial
    reduced), and the placements its outputs are returned in."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    run, back = [], []
    for mesh_dim, p in enumerate(t.placements):
        if t.device_mesh.size(mesh_dim) == 1:  # one rank along it: nothing is split, nothing to gather
            run.append(p)
            back.append(p)
        elif isinstance(p, Shard) and p.dim % t.ndim in mixed:
            mib = t.numel() * t.element_size() / 2**20
            _warn_once(op, f"{name} is sharded over dimension {p.dim % t.ndim}, which the op mixes: it is "
                           f"all-gathered over mesh dimension {mesh_dim} first (each rank receives (n-1)/n of "
                           f"{name}'s {mib:.4g} MiB), and the output is sharded back (no communication)")
            run.append(Replicate())
            back.append(p)
        elif isinstance(p, Partial):
            _warn_once(op, f"{name} is Partial over mesh dimension {mesh_dim}: it is all-reduced first (the output "
                           "is Replicate there)")
            run.append(Replicate())
            back.append(Replicate())
        else:
            run.append(p)
            back.append(p)
    return tuple(run), tuple(back)


def _run_local(fn, op: str, rule: DTensorRule, bound: inspect.BoundArguments):
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    args = bound.arguments
    first = args[rule.rows[0]]
    if not isinstance(first, DTensor):
        raise TypeError(f"tigon.{op}: a DTensor argument needs {rule.rows[0]} to be a DTensor too (its placements "
                        f"decide the outputs'), got a {type(first).__name__}")
    mesh = first.device_mesh
    mixed = rule.mixed_dims(args, first.ndim)
    run_pl, back_pl = _local_placements(op, rule.rows[0], first, mixed)
    dt = {}  # row name -> the redistributed DTensor
    for name in rule.rows:
        t = args.get(name)
        if t is None:
            continue
        if not isinstance(t, DTensor):
            raise TypeError(f"tigon.{op}: {name} must be a DTensor like {rule.rows[0]} (mesh {mesh}), got a "
                            f"{type(t).__name__}")
        if t.device_mesh != mesh:
            raise ValueError(f"tigon.{op}: {name} and {rule.rows[0]} must be on one device mesh")
        if tuple(t.placements) != run_pl:
            t = t.redistribute(mesh, run_pl)
        dt[name] = t
        args[name] = waited(t.to_local())  # a redistributed DTensor's local tensor may be one not waited for
    # a parameter's local gradient is this rank's rows' share: Partial where the rows are sharded
    grad_pl = tuple(Partial() if isinstance(p, Shard) else Replicate() for p in run_pl)
    for name in rule.params:
        p = args.get(name)
        if isinstance(p, DTensor):
            if p.device_mesh != mesh:
                raise ValueError(f"tigon.{op}: {name} and {rule.rows[0]} must be on one device mesh")
            whole = p if all(isinstance(q, Replicate) for q in p.placements) else \
                p.redistribute(mesh, (Replicate(),) * mesh.ndim)
            args[name] = waited(whole.to_local(grad_placements=grad_pl))
    for name in rule.constants:
        c = args.get(name)
        if isinstance(c, DTensor):
            args[name] = waited(c.full_tensor())
    out = fn(*bound.args, **bound.kwargs)

    def wrap(local, like):
        src = dt[like]
        d = DTensor.from_local(local, mesh, src.placements, run_check=False, shape=src.shape, stride=src.stride())
        return d.redistribute(mesh, back_pl) if tuple(back_pl) != tuple(src.placements) else d

    if len(rule.outputs) == 1:
        return wrap(out, rule.outputs[0])
    return type(out)(wrap(o, like) for o, like in zip(out, rule.outputs))
