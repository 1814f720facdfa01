"""Tigon: Triton kernels that make LLM training faster and lighter, and the tools to adopt them safely."""

from __future__ import annotations

__version__ = "0.1.0"

from . import functional, support  # noqa: E402
from .support import UnsupportedError, force_reference, set_strict  # noqa: E402


def __getattr__(name):  # lazy: keep `import tigon` light and free of transformers
    if name in ("patch", "unpatch", "PatchReport"):
        from . import integrations

        return getattr(integrations, name)
    if name == "AutoModelForCausalLM":
        from .auto import AutoModelForCausalLM

        return AutoModelForCausalLM
    if name == "nn":
        import importlib

        return importlib.import_module("tigon.nn")
    raise AttributeError(f"module 'tigon' has no attribute {name!r}")


__all__ = ["functional", "support", "patch", "unpatch", "PatchReport", "AutoModelForCausalLM", "force_reference",
           "set_strict", "UnsupportedError", "nn", "__version__"]
