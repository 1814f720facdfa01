"""The rotary dispatcher: what the engine installs as a family's module-global rotary function
(``apply_rotary_pos_emb``) while patched models need it (see :mod:`tigon.integrations.engine`, "How rope is scoped at
instance level")."""

from __future__ import annotations

import importlib
import threading
import weakref
from dataclasses import dataclass

from . import rotary_forwards as rf

LOCK = threading.RLock()
"""Guards the switches and every patch / unpatch (:mod:`tigon.integrations.engine` takes it too)."""


class RopeSwitch:
    """The dispatcher installed as ``module.<function>`` and the reasons to keep it there."""

    def __init__(self, module, name: str, family: str, partial: bool = False, layout: str = "rotate_half",
                 head_axis: int = 1):
        self.module, self.name, self.family = module, name, family
        self.original = getattr(module, name)
        self.class_level = False
        self.partial = partial  # the function rotates the first cos.shape[-1] dims (RopeSpec.partial_rotary)
        self.layout, self.head_axis = layout, head_axis  # RopeSpec.layout / head_axis: which Tigon op, how called
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.dispatcher = rf.rope_dispatcher(self.original, family, self)

    @property
    def qualname(self) -> str:
        """``<modeling module>.<function>``, for reports."""
        return f"{self.module.__name__}.{self.name}"

    def install(self) -> None:
        """Put the dispatcher in the module's global (no-op when it is there)."""
        if getattr(self.module, self.name) is not self.dispatcher:
            setattr(self.module, self.name, self.dispatcher)

    def release(self) -> bool:
        """Restore the original global when nothing needs the dispatcher any more; True when restored."""
        if self.live or self.class_level:
            return False
        if getattr(self.module, self.name) is self.dispatcher:
            setattr(self.module, self.name, self.original)
        key = (self.module.__name__, self.name)
        if SWITCHES.get(key) is self:
            del SWITCHES[key]
            SPARE[key] = self
        return True

    def matches(self, module, name: str, family: str, partial: bool, layout: str, head_axis: int) -> bool:
        """Whether this (released) switch serves ``module.<name>`` as it is now with these settings."""
        return (self.module is module and self.name == name and getattr(module, name) is self.original
                and (self.family, self.partial, self.layout, self.head_axis) == (family, partial, layout, head_axis))


SWITCHES: dict[tuple[str, str], RopeSwitch] = {}
"""The switches in use, by (modeling module name, function name)."""

SPARE: dict[tuple[str, str], RopeSwitch] = {}
"""The last released switch of each global, taken again by :func:`switch` when the same function is patched anew:
its dispatcher (an object whose type ``torch.compile`` guards on) stays the same object, so a compiled model that is
unpatched and patched again is not recompiled for a new dispatcher each time (after 8 recompiles Dynamo would give up
and run the forward eagerly)."""


def switch(module, name: str, family: str, partial: bool = False, layout: str = "rotate_half",
           head_axis: int = 1) -> RopeSwitch:
    """The switch of ``module.<name>`` (one per modeling module and function), created on first use; ``partial``:
    calls with cos / sin narrower than the head go to Tigon too (:attr:`RopeSpec.partial_rotary
    <tigon.integrations.families.RopeSpec.partial_rotary>`); ``layout``, ``head_axis``: the function's
    :attr:`RopeSpec.layout <tigon.integrations.families.RopeSpec.layout>` and ``head_axis``."""
    key = (module.__name__, name)
    sw = SWITCHES.get(key)
    if sw is None:
        spare = SPARE.pop(key, None)
        if spare is not None and spare.matches(module, name, family, partial, layout, head_axis):
            sw = SWITCHES[key] = spare
        else:
            sw = SWITCHES[key] = RopeSwitch(module, name, family, partial, layout, head_axis)
    return sw


@dataclass(frozen=True)
class RopeTarget:
    """The rotary global a patched attention module needs: ``<module_name>.<function>``, dispatched for ``family``
    (``partial``, ``layout``, ``head_axis``: see :func:`switch`).

    Its :meth:`ensure` runs at the start of every patched attention forward (eagerly; not inside ``torch.compile``),
    so that attention modules that were never registered at patch time (copies made by ``copy.deepcopy``, models
    loaded by ``torch.load``), or whose dispatcher was released since (the model they were copied from was unpatched
    or garbage collected), still run Tigon's rope.
    """

    module_name: str
    function: str
    family: str
    partial: bool = False
    layout: str = "rotate_half"
    head_axis: int = 1

    def ensure(self, attention) -> None:
        """Register ``attention`` (a module) as live and install the dispatcher when either is missing.

        Raises:
            ImportError: the modeling module ``module_name`` cannot be imported.
        """
        sw = SWITCHES.get((self.module_name, self.function))
        # (``attention in sw.live``, as WeakSet.__contains__ answers it for a module: one Python frame less per call)
        if sw is not None and weakref.ref(attention) in sw.live.data and getattr(sw.module, sw.name) is sw.dispatcher:
            return
        with LOCK:
            sw = switch(importlib.import_module(self.module_name), self.function, self.family, self.partial,
                        self.layout, self.head_axis)
            sw.live.add(attention)
            sw.install()
