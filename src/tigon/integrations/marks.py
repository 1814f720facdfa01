"""The mark of Tigon's replacement functions: the attribute :data:`MARK` (``{"kind": ..., "family": ...}`` plus facts of
the patch, e.g. the options it was built with), set by :func:`mark` and read by :func:`tigon_mark`, so that the engine,
unpatching, persistence and the tools recognise Tigon's own patches.

Every replacement carries it: the norm, MLP, attention, decoder-layer, LM-head and LoRA-layer forwards, MoE experts'
``_apply_gate`` and the rotary dispatcher. A replacement forward is a plain function ``forward(self, ...)`` usable both
as a class attribute (class-level patch) and bound to one instance with :class:`types.MethodType` (instance-level
patch), built with ``functools.wraps(original)`` so that ``inspect.signature`` (used by Trainer and generate) still
sees the original.
"""

from __future__ import annotations

MARK = "__tigon_patch__"


def mark(fn, kind: str, family: str, **extra):
    """Tag ``fn`` as a Tigon replacement of ``kind`` for ``family`` (plus ``extra`` facts, e.g. the options it was
    built with) and return it."""
    setattr(fn, MARK, {"kind": kind, "family": family, **extra})
    return fn


def tigon_mark(fn) -> dict | None:
    """The MARK dict of a function or bound method, or None when it is not Tigon's."""
    return getattr(getattr(fn, "__func__", fn), MARK, None)
