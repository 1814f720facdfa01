"""Instance-level patches that survive Hugging Face's hub kernels (the ``kernels`` package) re-kernelizing a model.

transformers prepares some layer classes for kernels from the Hub with ``use_kernel_forward_from_hub`` (the RMSNorms
of Llama, Qwen2 / 3, Mistral, Phi-3, Mixtral, Qwen2-MoE, ...): such a class has ``kernel_layer_name`` and a
``kernel_condition``. With ``kernels`` installed, ``from_pretrained`` kernelizes the model (``use_kernels`` is on by
default), and kernelizes it again at every mode change (``model.train()`` / ``model.eval()``, which the HF Trainer
calls at each step): ``kernels.kernelize`` sets or deletes the instance ``forward`` of every module of such a class.
That deleted Tigon's instance-level forward without a word (a Llama loaded with ``from_pretrained``, patched, then
``model.train()``: its five RMSNorms ran transformers' forward again, the report still listing them as patched).

The ``kernels`` package's own per-instance opt-out is the class's ``kernel_condition(module)``: a module for which it
returns False is not kernelized. While a module of such a class carries Tigon's instance forward, :func:`guard`
wraps the class's condition so that it returns False for modules whose ``forward`` is Tigon's, and what the class's
own condition returns for any other. :func:`release` puts the class's own condition back once no live module of the
class carries Tigon's forward (after :func:`tigon.unpatch`, or once the patched models are garbage collected: noticed
at the next patch / unpatch call). A ``torch.load`` of a patched model registers its modules when unpickled
(:mod:`tigon.integrations.persist`); a ``copy.deepcopy`` is guarded while the model it was copied from (or any other
patched model with modules of the class) is alive.
"""

from __future__ import annotations

import weakref

from .marks import tigon_mark

_MISSING = object()


class Guard:
    """The wrapped ``kernel_condition`` of one class and the patched modules that need it."""

    def __init__(self, cls: type):
        self.cls = cls
        self.saved = cls.__dict__.get("kernel_condition", _MISSING)  # what to put back (absent: inherited)
        previous = getattr(cls, "kernel_condition", None)  # the condition in effect (a plain function, or None)
        self.live: weakref.WeakSet = weakref.WeakSet()

        def kernel_condition(module) -> bool:
            if tigon_mark(module.__dict__.get("forward")) is not None:
                return False  # Tigon's forward stays: kernelize leaves this module alone
            return True if previous is None else bool(previous(module))

        self.installed = staticmethod(kernel_condition)

    def install(self) -> None:
        """Put the wrapped condition on the class (no-op when it is there)."""
        if self.cls.__dict__.get("kernel_condition") is not self.installed:
            self.cls.kernel_condition = self.installed

    def release(self) -> bool:
        """Put the class's own condition back when no live module of it carries Tigon's forward; True when done.
        A condition changed by someone else since is left alone."""
        for module in list(self.live):
            if tigon_mark(module.__dict__.get("forward")) is None:
                self.live.discard(module)
        if self.live:
            return False
        if self.cls.__dict__.get("kernel_condition") is self.installed:
            if self.saved is _MISSING:
                delattr(self.cls, "kernel_condition")
            else:
                setattr(self.cls, "kernel_condition", self.saved)
        GUARDS.pop(self.cls, None)
        return True


GUARDS: dict[type, Guard] = {}
"""Class -> its guard, while a module of the class carries Tigon's instance forward."""


def guard(module) -> None:
    """Keep ``module``'s instance ``forward`` (Tigon's, set now or just before) through ``kernels.kernelize``, when
    its class is prepared for hub kernels (has ``kernel_layer_name``); nothing otherwise."""
    cls = type(module)
    if getattr(cls, "kernel_layer_name", None) is None:
        return
    g = GUARDS.get(cls)
    if g is None:
        g = GUARDS[cls] = Guard(cls)
    g.live.add(module)
    g.install()


def release() -> list[str]:
    """Restore the own ``kernel_condition`` of every class no live patched module needs; returns their qualnames."""
    return [f"{cls.__module__}.{cls.__qualname__}" for cls, g in list(GUARDS.items()) if g.release()]
