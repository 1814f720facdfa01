"""The ops: one module per op family, each holding the public function(s) and their records (:class:`OpSpec`).

An op module reads top to bottom: the public function (argument checks, the backend choice of
:func:`tigon.support.select_backend`, then the reference or the kernels of :mod:`tigon.kernels`, imported on the
first kernel call), then its record(s) in ``RECORDS``. Nothing here imports Triton.

:func:`registry` is what every workflow iterates: the records of the ops :mod:`tigon.functional` exports, in its
order. Adding an op is its module here, its kernels, its reference, its tests and one export line in
:mod:`tigon.functional` (docs/ADDING_AN_OP.md).
"""

from __future__ import annotations

import sys

from ._record import CATEGORIES, CATEGORY_LABELS, Case, ModelShapes, OpSpec

PEER_MODULES = {"liger": "liger_kernel", "quack": "quack", "cce": "cut_cross_entropy"}
"""The peer implementations an :attr:`OpSpec.peers` entry may name, and the package each needs."""

BASE_PROVIDERS = ("eager", "compile", "tigon")
"""The providers every op has in ``tigon bench``: its eager PyTorch code, torch.compile of it, and Tigon."""

TIGON_COMPILE = "tigon_compile"
"""The provider of Tigon's call under torch.compile, for the records with :attr:`OpSpec.tigon_compile`."""


def registry() -> dict[str, OpSpec]:
    """Every public op's record by name, in the order :mod:`tigon.functional` exports them.

    Raises:
        RuntimeError: an exported op's module has no record for it (an op added without its record).
    """
    from .. import functional

    out: dict[str, OpSpec] = {}
    for name in functional.OPS:
        module = sys.modules[getattr(functional, name).__module__]
        spec = next((r for r in getattr(module, "RECORDS", ()) if r.name == name), None)
        if spec is None:  # the export was wrapped or replaced (a test's spy): the op modules' records decide
            spec = next((r for m in list(sys.modules.values()) if m is not None
                         and m.__name__.startswith(f"{__name__}.") for r in getattr(m, "RECORDS", ())
                         if r.name == name), None)
        if spec is None:
            raise RuntimeError(f"tigon.functional.{name} has no OpSpec in {module.__name__}.RECORDS")
        out[name] = spec
    return out


def get(name: str) -> OpSpec:
    """The record of op ``name``.

    Raises:
        KeyError: no such op (the message lists them).
    """
    specs = registry()
    if name not in specs:
        raise KeyError(f"unknown op {name!r} (ops: {', '.join(specs)})")
    return specs[name]


def providers() -> tuple[str, ...]:
    """Every ``tigon bench`` provider name: :data:`BASE_PROVIDERS`, then the Tigon variants of the ops' bench
    cases (``tigon_inplace`` ...) and :data:`TIGON_COMPILE`, then the peers, each in the registry's order of first
    appearance."""
    specs = registry().values()
    variants = [c.provider for s in specs for c in s.cases_tagged("bench")]
    variants += [TIGON_COMPILE] if any(s.tigon_compile for s in specs) else []
    peers = [p for s in specs for p in s.peers]
    return tuple(dict.fromkeys([*BASE_PROVIDERS, *variants, *peers]))


__all__ = ["CATEGORIES", "CATEGORY_LABELS", "Case", "ModelShapes", "OpSpec", "PEER_MODULES", "BASE_PROVIDERS",
           "TIGON_COMPILE", "get", "providers", "registry"]
