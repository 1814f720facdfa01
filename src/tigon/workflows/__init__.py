"""Library workflows behind the ``tigon`` CLI; each returns a dataclass with ``as_dict()``.

compare
    :func:`run_compare`: train a model twice from one seed, original and Tigon-patched; loss curves, their
    largest relative difference, tokens/s, peak memory, device and backend.
"""

from .compare import CompareConfig, CompareResult, ConfigError, run_compare

__all__ = ["CompareConfig", "CompareResult", "ConfigError", "run_compare"]
