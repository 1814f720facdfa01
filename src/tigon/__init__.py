"""Tigon: Triton kernels that make LLM training faster and lighter, and the tools to adopt them safely.

The public API is :data:`__all__` (``dir(tigon)`` lists it too): ``patch`` / ``unpatch`` / ``PatchReport`` and
``AutoModelForCausalLM`` (Hugging Face integration), the backend switches ``force_reference`` / ``set_strict`` and
their exceptions and warning, and the public subpackages (``functional``, ``nn``, ``support``, ``integrations``,
``reference``, ``ops``, ``numerics``, ``presets``, ``workflows``, ``checkpointing``). Everything that needs
transformers or more than torch is loaded on first access, so ``import tigon`` stays light.
"""

__version__ = "0.1.0"

import importlib as _importlib  # noqa: E402

from . import functional, support  # noqa: E402
from .support import TigonFallbackWarning, UnsupportedError, force_reference, set_strict  # noqa: E402

_LAZY = {  # name -> (module, attribute or None for the module itself); loaded on first access
    "patch": ("tigon.integrations", "patch"),
    "unpatch": ("tigon.integrations", "unpatch"),
    "PatchReport": ("tigon.integrations", "PatchReport"),
    "AutoModelForCausalLM": ("tigon.auto", "AutoModelForCausalLM"),
    **{name: (f"tigon.{name}", None)
       for name in ("nn", "integrations", "reference", "ops", "numerics", "presets", "workflows",
                    "checkpointing")},
}

__all__ = ["__version__", "patch", "unpatch", "PatchReport", "AutoModelForCausalLM", "force_reference", "set_strict",
           "UnsupportedError", "TigonFallbackWarning", "functional", "support", *sorted(set(_LAZY) - {
               "patch", "unpatch", "PatchReport", "AutoModelForCausalLM"})]


def __getattr__(name: str):
    """The lazy names of :data:`_LAZY` (PEP 562); AttributeError for anything else."""
    if name not in _LAZY:
        raise AttributeError(f"module 'tigon' has no attribute {name!r}")
    module, attr = _LAZY[name]
    mod = _importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)


def __dir__() -> list[str]:
    """The module's attributes and the lazy public names not loaded yet (so ``dir(tigon)`` shows ``patch``)."""
    return sorted(set(globals()) | set(__all__))
