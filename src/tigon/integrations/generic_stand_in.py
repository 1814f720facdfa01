"""CPU stand-ins for the generic matcher's probes of weightless (``meta``) modules (:mod:`tigon.integrations.generic`).

A meta module has no values to probe, so the matcher probes a CPU copy with random parameters instead, once per group
of modules that differ only in weight values (:func:`fingerprint`; :func:`probe_meta`). A copy of full size costs what
the module's weights would: one MLP of a 36B model (hidden 5120, intermediate 27648) is ~1.7 GB of fp32 and seconds of
random numbers. So the MLP probe runs on a *shrunk* copy (:func:`stand_in` with ``shrink=True``): every dimension of
:data:`SHRINK_FROM` or more elements among its parameters and buffers is divided by one common factor (the largest
divisor of their greatest common divisor that leaves the smallest of them :data:`SHRINK_TO` wide or wider), in the
tensors' shapes and in the submodules' public integer attributes equal to such a dimension (``in_features``,
``out_features``, ``intermediate_size`` ...). One factor for all keeps every linear relation between the widths (a
fused gate-up projection stays twice the intermediate size); smaller dimensions (a LoRA rank) are kept. What the probe
checks, that the module computes ``down(act(gate(x)) * up(x))``, does not depend on the widths; a forward that reads a
width from elsewhere (the shared config) and fails on the shrunk copy is probed again on a full-size one
(:func:`probe_meta`'s ``retry_full``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch

SHRINK_FROM = 256
"""Dimensions of at least this many elements are shrunk in a shrunk stand-in (smaller ones are kept)."""
SHRINK_TO = 32
"""The smallest width a shrunk dimension may get (the narrowest of them gets at least this, where a factor allows)."""


def randn(shape, device, dtype=torch.float32, seed=0) -> torch.Tensor:
    """Standard normal values of ``shape`` from their own generator (``seed``; the global RNG is not advanced), drawn
    in fp32 on the CPU, then moved to ``device`` / ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


def is_meta(module: torch.nn.Module) -> bool:
    """Whether any parameter of ``module`` is on the ``meta`` device (a weightless model)."""
    return any(p.is_meta for p in module.parameters())


def fingerprint(module: torch.nn.Module) -> tuple:
    """What decides a module's output besides its weight values, for reusing one probe across modules: for it and
    every submodule, the class, the shapes and dtypes of its parameters and buffers, and its public attributes
    (plain values compared by value, anything else, such as the shared config object, by identity). Two of
    Gemma-3n's MLPs differ only in ``activation_sparsity``, for instance."""

    def key(v):
        if isinstance(v, (bool, int, float, str, type(None))):
            return v
        if isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float, str, type(None))) for x in v):
            return tuple(v)
        return ("id", id(v))

    def tensors(d):
        return tuple((n, tuple(t.shape), t.dtype) for n, t in d.items() if t is not None)

    return tuple((path, type(m), tensors(m._parameters), tensors(m._buffers),
                  tuple(sorted((k, key(v)) for k, v in vars(m).items() if not k.startswith("_") and k != "training")))
                 for path, m in module.named_modules())


def _large_dims(module: torch.nn.Module) -> set[int]:
    return {n for t in (*module.parameters(), *module.buffers()) for n in t.shape if n >= SHRINK_FROM}


def shrink_factor(module: torch.nn.Module) -> int:
    """The common factor by which :func:`stand_in` divides ``module``'s dimensions of :data:`SHRINK_FROM` or more
    elements (see the module docstring); 1 when there are none or no factor fits."""
    dims = _large_dims(module)
    if not dims:
        return 1
    g, cap = math.gcd(*dims), min(dims) // SHRINK_TO
    return max((f for f in range(1, min(g, cap) + 1) if g % f == 0), default=1)


def stand_in(module: torch.nn.Module, shrink: bool = False) -> torch.nn.Module:
    """A CPU copy of the meta-device ``module`` for probing only: random parameters (standard normal, scaled by
    1/sqrt(fan-in) for those of two or more dimensions), uninitialised buffers, the training flags of ``module``.

    Args:
        module: a module whose parameters and buffers are on the ``meta`` device.
        shrink: divide its large dimensions by :func:`shrink_factor` (see the module docstring); False: full size.
    """
    f = shrink_factor(module) if shrink else 1
    dims = _large_dims(module) if f > 1 else set()

    def width(n: int) -> int:
        return n // f if n in dims else n

    c = copy.deepcopy(module)
    made: dict[int, torch.nn.Parameter] = {}  # a parameter held by two submodules stays one
    for m in c.modules():
        for name, t in m._parameters.items():
            if t is not None and id(t) not in made:
                shape = tuple(width(n) for n in t.shape)
                scale = shape[-1] ** -0.5 if len(shape) > 1 else 1.0
                value = (randn(shape, "cpu", seed=11 + len(made)) * scale).to(t.dtype)
                made[id(t)] = torch.nn.Parameter(value, requires_grad=t.requires_grad)
            if t is not None:
                m._parameters[name] = made[id(t)]
        for name, t in m._buffers.items():
            if t is not None:
                m._buffers[name] = torch.empty(tuple(width(n) for n in t.shape), dtype=t.dtype)
        for k, v in list(vars(m).items()):  # in_features, intermediate_size ... of a shrunk dimension
            if not k.startswith("_") and type(v) is int and v in dims:
                setattr(m, k, width(v))
    return c


def probe_meta(cache: dict, kind: str, m: torch.nn.Module, probe: Callable, *args,
               shrink: bool = False, retry_full: Callable[[object], bool] | None = None):
    """``probe(m, *args)``; for a meta module ``m``, ``probe`` of a :func:`stand_in` (shrunk if ``shrink``), once per
    ``(kind, fingerprint(m), args)`` in ``cache``. ``retry_full(result)`` true: the shrunk stand-in's result is
    replaced by that of a full-size one (a probe that failed on the shrunk copy, see the module docstring)."""
    if not is_meta(m):
        return probe(m, *args)
    key = (kind, fingerprint(m), args)
    if key not in cache:
        result = probe(stand_in(m, shrink), *args)
        if shrink and retry_full is not None and retry_full(result) and shrink_factor(m) > 1:
            result = probe(stand_in(m), *args)
        cache[key] = result
    return cache[key]
