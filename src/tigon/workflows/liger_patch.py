"""Liger-Kernel on a model instance, for the end-to-end benchmark's ``liger`` provider
(:mod:`tigon.workflows.e2e`): which apply function fits, and putting back the module globals and class attributes
that Liger rebinds, so that later runs in the same process see the original code."""

from __future__ import annotations

import sys
from typing import Any

import torch




class GlobalsGuard:
    """Snapshot of module globals and class attributes that a monkey-patching library may rebind; ``restore()``.

    Covers the given modules' ``__dict__`` and, for every class defined in them, its ``__dict__``, ``__name__``
    and ``__qualname__``.
    """

    def __init__(self, module_names):
        self._mods = []
        for name in module_names:
            mod = sys.modules.get(name)
            if mod is None:
                continue
            classes = [(c, dict(vars(c)), c.__name__, c.__qualname__) for c in list(vars(mod).values())
                       if isinstance(c, type) and c.__module__ == name]
            self._mods.append((mod, dict(vars(mod)), classes))

    def restore(self) -> list[str]:
        """Put everything back; returns the names that had changed."""
        changed = []
        for mod, saved, classes in self._mods:
            changed += _restore_dict(mod, saved, vars(mod), setattr, delattr, mod.__name__)
            for cls, cdict, name, qual in classes:
                changed += _restore_dict(cls, cdict, vars(cls), type.__setattr__, type.__delattr__,
                                         f"{mod.__name__}.{name}")
                if cls.__name__ != name or cls.__qualname__ != qual:
                    cls.__name__, cls.__qualname__ = name, qual
                    changed.append(f"{mod.__name__}.{name}.__name__")
        return changed


def _restore_dict(obj, saved: dict, current, set_, del_, label: str) -> list[str]:
    changed = []
    for k in [k for k in list(current) if k not in saved]:
        try:
            del_(obj, k)
            changed.append(f"{label}.{k}")
        except (AttributeError, TypeError):
            pass
    for k, v in saved.items():
        if k in ("__dict__", "__weakref__"):
            continue
        if current.get(k, _MISSING) is not v:
            try:
                set_(obj, k, v)
                changed.append(f"{label}.{k}")
            except (AttributeError, TypeError):
                pass
    return changed


_MISSING = object()


class LigerUnsupported(RuntimeError):
    """Liger-Kernel has no patch for the model's type (:func:`apply_liger`); the e2e row is "skipped"."""


def liger_model_types() -> set[str] | None:
    """The model types of the installed Liger-Kernel's ``MODEL_TYPE_TO_APPLY_LIGER_FN`` (what its instance function
    patches), or None when Liger is not installed or has no such table."""
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        return None
    return set(MODEL_TYPE_TO_APPLY_LIGER_FN)


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


def apply_liger(model: torch.nn.Module) -> dict[str, Any]:
    """Apply Liger-Kernel to ``model`` (instance); returns ``{"function", "patched_modules"}``.

    Tries ``liger_kernel.transformers._apply_liger_kernel_to_instance(model=model)``, then
    ``apply_liger_kernel_to_<model_type>(model=model)``.

    ``patched_modules`` counts the submodules that got their own ``forward`` (0 can also mean that this Liger
    version patches classes instead; the run's speed tells).

    Liger's instance function only logs and returns for a model type missing from its
    ``MODEL_TYPE_TO_APPLY_LIGER_FN`` (OLMoE, say): such a model would run as Hugging Face wrote it under Liger's
    name, so a type that neither that table nor an ``apply_liger_kernel_to_<model_type>`` names raises
    :class:`LigerUnsupported` before anything is applied.

    Raises:
        ImportError: liger_kernel is not installed. LigerUnsupported: Liger has no patch for this model type.
        RuntimeError: no apply function fits this model type.
    """
    import liger_kernel.transformers as lt

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    table = liger_model_types()
    if table is not None and model_type not in table and getattr(lt, f"apply_liger_kernel_to_{model_type}",
                                                                  None) is None:
        raise LigerUnsupported(f"Liger has no patch for {model_type!r} (liger_kernel "
                               f"{_version('liger_kernel')}: not in MODEL_TYPE_TO_APPLY_LIGER_FN, no "
                               f"apply_liger_kernel_to_{model_type}); the row would be Hugging Face's own code")
    before = _forward_overrides(model)
    fn = getattr(lt, "_apply_liger_kernel_to_instance", None)
    if fn is None:
        try:
            from liger_kernel.transformers.monkey_patch import _apply_liger_kernel_to_instance as fn
        except ImportError:
            fn = None
    used = None
    if fn is not None:
        fn(model=model)
        used = "_apply_liger_kernel_to_instance"
    if _forward_overrides(model) == before and model_type:
        specific = getattr(lt, f"apply_liger_kernel_to_{model_type}", None)
        if specific is not None:
            specific(model=model)
            used = f"apply_liger_kernel_to_{model_type}"
    if used is None:
        raise RuntimeError(f"liger_kernel has no apply function for model type {model_type!r}")
    return {"function": used, "patched_modules": _forward_overrides(model) - before}


def _forward_overrides(model: torch.nn.Module) -> int:
    return sum(1 for m in model.modules() if "forward" in vars(m))
