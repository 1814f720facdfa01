"""The rotary dispatcher: what the engine installs as a family's module-global rotary function (``apply_rotary_pos_emb``)
while patched models need it (see :mod:`tigon.integrations.engine`, "How rope is scoped at instance level")."""

from __future__ import annotations

import weakref

from . import forwards as fw


class RopeSwitch:
    """The dispatcher installed as ``module.<function>`` and the reasons to keep it there."""

    def __init__(self, module, name: str, family: str):
        self.module, self.name = module, name
        self.original = getattr(module, name)
        self.class_level = False
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.dispatcher = fw.rope_dispatcher(self.original, family, self)

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
        SWITCHES.pop((self.module.__name__, self.name), None)
        return True


SWITCHES: dict[tuple[str, str], RopeSwitch] = {}


def switch(module, name: str, family: str) -> RopeSwitch:
    """The switch of ``module.<name>`` (one per modeling module and function), created on first use."""
    key = (module.__name__, name)
    sw = SWITCHES.get(key)
    if sw is None:
        sw = SWITCHES[key] = RopeSwitch(module, name, family)
    return sw
