"""Every Triton kernel of :mod:`tigon.kernels` reads only ``tl.constexpr`` globals.

Triton's compiler refuses a plain Python number read as a global inside an ``@triton.jit`` function ("Cannot access
global variable ... from within @jit'ed function"), but its interpreter, which runs the kernels in this suite on a
CPU, accepts it: a constant written ``X = 0.25`` instead of ``X = tl.constexpr(0.25)`` passes every CPU test and
breaks the kernel on every GPU (session 17's ``JSD_NEAR``: 69 failures on an H100). This test finds such a global
without a GPU, from the functions' code.
"""

from __future__ import annotations

import importlib
import pkgutil

import triton.language as tl

import tigon.kernels as kernels


def _jit_functions():
    """(module name, function name, Python function) of every jitted function defined in tigon.kernels."""
    for info in pkgutil.iter_modules(kernels.__path__):
        mod = importlib.import_module(f"{kernels.__name__}.{info.name}")
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if callable(fn) and getattr(fn, "__module__", None) == mod.__name__ and hasattr(fn, "__code__"):
                yield mod.__name__, name, fn


def test_kernels_read_only_constexpr_globals():
    found = list(_jit_functions())
    assert len(found) > 50, "no jitted functions found: the test no longer sees them"
    bad = [f"{m}.{name} reads {g} = {fn.__globals__[g]!r}" for m, name, fn in found for g in fn.__code__.co_names
           if isinstance(fn.__globals__.get(g), (bool, int, float)) and not isinstance(fn.__globals__[g], tl.constexpr)]
    assert not bad, "wrap these globals in tl.constexpr(...):\n" + "\n".join(bad)
