"""Compile for an NVIDIA Hopper GPU (sm_90) every Triton kernel variant that a CPU test run launched through Triton's
interpreter: the CUDA compile check that CI runs without a GPU.

The interpreter runs a kernel's Python, and accepts code that Triton's compiler refuses (a plain float global read by
a kernel, a constexpr branch with mismatched types, ...): session 18 met 69 CUDA failures of kernels whose every CPU
test passed. Triton's compiler needs no GPU to build a kernel for a named target (MLIR passes, LLVM, then the ptxas
that ships with Triton's wheel), so the CPU run can compile what it interpreted:

1. while the tests run, :class:`Recorder` notes each interpreted launch: the kernel (module and name) and its
   arguments, described (a tensor by its dtype, other values as they are);
2. at the end, :func:`compile_launches` (in a fresh interpreter without ``TRITON_INTERPRET``, where the kernels are
   ``triton.JITFunction`` s) builds each launch's signature as Triton's launcher would (pointers by dtype, ints as
   i32 or i64, constexprs by value; without the launcher's specialisation of ints equal to 1 or divisible by 16,
   which only narrows the same code) and compiles, per kernel, a few variants in which every argument's dtype and
   every constexpr's value that the tests launched occurs at least once (:func:`cover`).

Block sizes the CPU paths choose for the interpreter alone (``head_grads.CAST_BLOCK_INTERPRETED``: one program per
large range) are not what CUDA launches: a constexpr power of two above :data:`MAX_BLOCK` is compiled at
:data:`MAX_BLOCK` instead (the same code; compiling a 2^18-element block takes minutes).

Used by ``tests/conftest.py`` when ``TIGON_CUDA_COMPILE=1`` (``make test`` sets it): a variant that fails to compile
fails the session, each failure printed with the kernel, its signature and constexprs and the compiler's message.
By hand::

    TRITON_INTERPRET=1 TIGON_CUDA_COMPILE=1 python -m pytest tests/test_rms_norm.py
    python tests/cuda_compile.py LAUNCHES.pkl   # launches saved by Recorder.save; prints JSON

Where the installed Triton cannot compile for CUDA here (no NVIDIA backend or ptxas, or its compile API changed),
the check says so and is skipped, not failed.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import time

TARGET = ("cuda", 90, 32)
"""(backend, compute capability, warp size) compiled for: Hopper (H100 / H200), the GPUs Tigon is measured on."""
MAX_BLOCK = 16384
"""The largest power-of-two constexpr compiled as launched (see the module docstring)."""
MAX_VARIANTS = 8
"""Variants compiled per kernel at most (:func:`cover`): a whole CPU suite launches about 1,600 distinct variants of
40 kernels, which take over 5 minutes to compile on two cores; 8 per kernel keep the check near a minute."""
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
PTR = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64", "int64": "i64", "int32": "i32",
       "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1", "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5"}


class Recorder:
    """Notes every launch of an interpreted Triton kernel (``InterpretedFunction.run``) while installed: ``launches``
    maps (module, qualified name) to the set of (args, kwargs) descriptions (:func:`describe`). ``prefix``: only
    kernels of modules whose name starts with it (the session's check: ``"tigon."``, not a test's own kernels)."""

    def __init__(self, prefix: str = ""):
        self.launches: dict[tuple[str, str], set] = {}
        self.prefix = prefix
        self._original = None

    def install(self) -> None:
        from triton.runtime import interpreter

        cls = interpreter.InterpretedFunction
        original = self._original = cls.run
        launches, prefix = self.launches, self.prefix

        def run(fn, *args, grid, warmup, **kwargs):
            try:
                key = (fn.fn.__module__, fn.fn.__qualname__)
                if key[0].startswith(prefix):
                    launches.setdefault(key, set()).add(
                        (tuple(map(describe, args)), tuple(sorted((k, describe(v)) for k, v in kwargs.items()))))
            except Exception:  # noqa: BLE001 - noting must never change what the test runs
                pass
            return original(fn, *args, grid=grid, warmup=warmup, **kwargs)

        cls.run = run

    def uninstall(self) -> None:
        if self._original is not None:
            from triton.runtime import interpreter

            interpreter.InterpretedFunction.run = self._original
            self._original = None

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            pickle.dump(self.launches, f)


def describe(value):
    """A launch argument as the compile needs it and a set can hold: a tensor as ("tensor", dtype name); a Triton
    dtype as ("tl", name); numbers, bools, strings and None as they are; anything else as ("object", type name)."""
    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype).removeprefix("torch."))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    name = type(value).__name__
    if name == "dtype" and type(value).__module__.startswith("triton"):
        return ("tl", str(value))
    if name == "constexpr":
        return describe(getattr(value, "value", None))
    return ("object", name)


def _jit_function(module: str, qualname: str):
    from triton.runtime.jit import JITFunction

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction):  # (autotune / heuristics wrappers keep the function as .fn)
        obj = obj.fn
    return obj


def _constexpr(value):
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "tl":
        import triton.language as tl

        return tl.dtype(value[1])  # (str(tl.float32) == "fp32")
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_BLOCK and value & (value - 1) == 0:
        return MAX_BLOCK
    return value


def signature(fn, args: tuple, kwargs: tuple) -> tuple[dict, dict, dict]:
    """(signature, constexprs, options) of a launch of the JITFunction ``fn`` as Triton's launcher builds them from
    its arguments (descriptions, :func:`describe`); raises TypeError for an argument it cannot type."""
    values = {p.name: a for p, a in zip(fn.params, args)}
    options = {}
    for k, v in kwargs:
        (options if k in LAUNCH_OPTIONS else values)[k] = v
    sig, consts = {}, {}
    for p in fn.params:
        v = values[p.name] if p.name in values else p.default
        if p.is_constexpr or v is None:
            sig[p.name], consts[p.name] = "constexpr", _constexpr(v)
        elif isinstance(v, tuple) and v[:1] == ("tensor",):
            if v[1] not in PTR:
                raise TypeError(f"{p.name}: a tensor of dtype {v[1]}")
            sig[p.name] = "*" + PTR[v[1]]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else ("i64" if v < 2**63 else "u64")
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise TypeError(f"{p.name}: {v!r}")
    return sig, consts, options


def cover(variants: list[tuple], cap: int | None = None) -> list[tuple]:
    """Of one kernel's ``variants`` (signature, constexprs, options: each a tuple of (name, value) pairs), a subset in
    which every (name, value) pair that occurs in any of them occurs (each pointer's dtype, each int's width, each
    constexpr's value, each launch option), picked greedily by the most pairs not yet covered (ties: the given
    order), at most ``cap`` of them (default :data:`MAX_VARIANTS`): the compile's time in CI is bounded, and the
    variants left out add only pairs already compiled in some other combination."""
    cap = MAX_VARIANTS if cap is None else cap
    pairs = [set(v[0]) | set(v[1]) | set(v[2]) for v in variants]
    covered, chosen = set(), []
    while len(chosen) < cap:
        gains = [len(p - covered) for p in pairs]
        best = max(range(len(variants)), key=gains.__getitem__, default=None)
        if best is None or gains[best] == 0:
            break
        chosen.append(variants[best])
        covered |= pairs[best]
    return chosen


def _frozen(d: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in d.items()))


def plan(launches: dict) -> tuple[list[tuple], list[str]]:
    """The variants to compile, as (module, qualname, signature, constexprs, options), and the launches that could not
    be typed (a note each)."""
    jobs, notes = [], []
    for (module, qualname), calls in sorted(launches.items()):
        try:
            fn = _jit_function(module, qualname)
        except (ImportError, AttributeError) as e:  # (a test's own kernels in a module of its temporary directory)
            notes.append(f"{module}.{qualname}: not importable here ({type(e).__name__}: {e})")
            continue
        variants = {}
        for args, kwargs in sorted(calls, key=repr):
            try:
                sig, consts, opts = signature(fn, args, kwargs)
            except TypeError as e:
                notes.append(f"{module}.{qualname}: not typed ({e})")
                continue
            variants.setdefault((_frozen(sig), _frozen(consts), _frozen(opts)), (sig, consts, opts))
        for key in cover(list(variants)):
            jobs.append((module, qualname, *variants[key]))
    return jobs, notes


def _compile(job: tuple) -> tuple[str, str | None, float]:
    """Compile one variant: (kernel name, None or the failure's message, seconds)."""
    import triton
    from triton.backends.compiler import GPUTarget

    module, qualname, sig, consts, opts = job
    started = time.perf_counter()
    try:
        src = triton.compiler.ASTSource(fn=_jit_function(module, qualname), signature=sig, constexprs=consts)
        triton.compile(src, target=GPUTarget(*TARGET), options=opts)
        error = None
    except Exception as e:  # noqa: BLE001 - reported per variant
        error = f"{type(e).__name__}: {e}"
    return f"{module}.{qualname}", error, time.perf_counter() - started


def unavailable() -> str | None:
    """Why this Triton cannot compile for CUDA here (None when it can)."""
    try:
        import triton
        import triton.backends.compiler  # (GPUTarget's module)
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(TARGET[1]).path
    except Exception as e:  # noqa: BLE001
        return f"no NVIDIA backend in this Triton ({type(e).__name__}: {e})"
    if not path or not os.path.exists(path):
        return "Triton's ptxas is missing"
    if not hasattr(triton.compiler, "ASTSource"):
        return "this Triton has no triton.compiler.ASTSource"
    return None


def compile_launches(launches: dict, workers: int = 2) -> dict:
    """Compile :func:`plan`'s variants of ``launches`` for :data:`TARGET` (``workers`` processes). Returns
    ``{"skipped": reason or None, "kernels", "variants", "seconds", "failures": [{"kernel", "signature",
    "constexprs", "options", "error"}], "notes"}``; run where ``TRITON_INTERPRET`` is unset."""
    reason = unavailable()
    if reason is not None:
        return {"skipped": reason, "kernels": 0, "variants": 0, "seconds": 0.0, "failures": [], "notes": []}
    started = time.perf_counter()
    jobs, notes = plan(launches)
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_compile, jobs, chunksize=4))
    else:
        results = [_compile(job) for job in jobs]
    failures = [{"kernel": name, "signature": job[2], "constexprs": {k: repr(v) for k, v in job[3].items()},
                 "options": job[4], "error": error[:2000]}
                for job, (name, error, _) in zip(jobs, results) if error is not None]
    if len(jobs) > 5 and len(failures) == len(jobs) and len({f["error"][:60] for f in failures}) == 1:
        # every variant of every kernel failed the same way: this Triton's compile API or toolchain here, not code
        return {"skipped": f"Triton cannot compile for CUDA here ({failures[0]['error'][:300]})", "kernels": 0,
                "variants": 0, "seconds": 0.0, "failures": [], "notes": notes}
    return {"skipped": None, "kernels": len(launches), "variants": len(jobs),
            "seconds": round(time.perf_counter() - started, 1), "failures": failures, "notes": notes}


def run_check(recorder: Recorder, workers: int = 2, timeout: float = 900.0) -> dict:
    """:func:`compile_launches` of ``recorder``'s launches in a fresh interpreter without ``TRITON_INTERPRET`` (this
    one's kernels are the interpreter's). Returns its result (``skipped`` says why where it could not run)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.pkl")
        recorder.save(path)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), path, "--workers", str(workers)],
                                  env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"skipped": None, "kernels": len(recorder.launches), "variants": 0, "seconds": timeout,
                    "failures": [{"kernel": "(all)", "error": f"the compile check ran past {timeout:.0f} s"}],
                    "notes": []}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"skipped": None, "kernels": len(recorder.launches), "variants": 0, "seconds": 0.0,
                "failures": [{"kernel": "(the check)", "error": (proc.stderr or proc.stdout)[-2000:]}], "notes": []}
    return json.loads(lines[-1])


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Compile recorded Triton launches for CUDA sm_90 (see the docstring).")
    p.add_argument("launches", help="a pickle written by Recorder.save")
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("run without TRITON_INTERPRET=1 (the kernels must be JITFunctions)")
    with open(args.launches, "rb") as f:
        launches = pickle.load(f)
    print(json.dumps(compile_launches(launches, args.workers), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
