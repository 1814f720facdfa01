"""Host work per forward + backward, counted rather than timed: ATen ops, Python function calls and (stubbed) Triton
launches, on CPU with Triton's interpreter on and every launch replaced by a no-op. Counts do not move with the
machine's load, so they compare versions of the code where the shared CPU machines' clocks cannot (the GPU
machine's host times also vary 2x between sessions: benchmarks/results/h200/README.md, thirteenth run).

    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/host_count.py [--cases flce,layer] [--top 25] \
        [--out benchmarks/results/cpu/host-count_<note>.json]

Cases:

``flce``: :func:`tigon.functional.fused_linear_cross_entropy` (bf16, mean loss, hidden and weight requiring grad)
at a tiny head in one chunk (as at Qwen2.5-0.5B's head at 4096 tokens on the H200), with the CUDA path's matmul
choices emulated (``torch.mm / addmm(..., out_dtype=torch.float32)``, which CPU torch lacks, computed by the
counting mode and counted as the one op they are on CUDA) and the grad_weight halves' copy of their first elements
sized as at Qwen's head (:class:`tigon.kernels.head_grads.RowHalves`; their cast is one launch on the Triton path,
ranges of torch ops elsewhere); beside it Hugging Face's ``lm_head`` + fp32 cross-entropy (``hf``); and in 4
chunks whose buffer is smaller than grad_weight (the halves and their in-place cast, as at Llama-3-8B's head at
16384 tokens).

``ops``: one forward + backward of rms_norm, fused_add_rms_norm, swiglu, rope and fused_linear_cross_entropy
(:func:`op_cases`), beside the harness's own share (a ``sum`` and its backward); ``tests/test_call_cache.py`` holds
their Python calls to a budget.

``layer``: one decoder layer of a tiny Qwen2 and a tiny Llama (bf16, (2, 16) tokens), Hugging Face's against
``tigon.patch``'s with the kernels at every size (``TIGON_HOST_BOUND_ELEMENTS=0``: the MLP takes the kernels as at
Qwen2.5-0.5B's 4 x 1024 tokens on the GPU), its output summed and back-propagated; the functions whose calls
differ most between the two are listed (``--top``), which is where the patched layer's extra host work sits.

What is not counted: the CUDA launch itself, the caching allocator, and the work inside one ATen op (the counts
weigh a ``view`` like a ``mm``). ``--clock`` also times each case with the thread's CPU time (median of 7 x 200
calls), which on these machines is indicative only. ``--callgrind N`` (under ``valgrind --tool=callgrind``): the
instructions each case executes per call, as ``host_overhead.py --callgrind`` (whose reader takes the dumps):

    TRITON_INTERPRET=1 PYTHONPATH=src valgrind --tool=callgrind --callgrind-out-file=cg.%p \
        python3 benchmarks/host_count.py --callgrind 50
    python3 benchmarks/host_overhead.py --callgrind-read cg.<pid>.* --calls 50

or ``python3 benchmarks/host_count.py --callgrind-read cg.<pid>.* --calls 50``: the same totals and, beside them, the
instructions less the CPU's own matmul and attention arithmetic (:data:`CPU_MATH`, which both layers run alike and
which on a GPU is kernel work), which is what the host path of the layer costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LAUNCHES: Counter = Counter()


class _NoLaunch:
    """A Triton kernel whose launch only counts."""

    def __init__(self, name: str):
        self.name = name

    def __getitem__(self, grid):
        def launch(*a, **k):
            LAUNCHES[self.name] += 1
        return launch


def stub_launches(set_attr=setattr) -> None:
    """Replace every Triton kernel of Tigon's kernel modules with a counting no-op (the CUDA path's launch sites
    look kernels up as module globals at call time), and the CPU-only target-range check (the CUDA path skips it).
    ``set_attr``: how (a test passes ``monkeypatch.setattr``, which puts them back after it)."""
    import importlib
    import pkgutil

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    import tigon.kernels as kernels
    import tigon.reference.cross_entropy as rce

    # every module imported before any is stubbed: one first imported in between would bind another's stub by its
    # `from .x import kernel` and keep it after the test put the stubs back (a leak into later tests)
    mods = [importlib.import_module(f"tigon.kernels.{info.name}") for info in pkgutil.iter_modules(kernels.__path__)]
    for mod in mods:
        for name in dir(mod):
            if isinstance(getattr(mod, name), (JITFunction, InterpretedFunction)):
                set_attr(mod, name, _NoLaunch(name))
    set_attr(rce, "check_target_range", lambda *a, **k: None)


_LIB: list = []


def emulate_fp32_out_matmuls() -> None:
    """CPU kernels for ``aten::mm.dtype_out`` / ``aten::addmm.dtype_out`` (CUDA-only in torch), so that the CUDA
    path's matmul choices run here: computed through fp32 copies, seen by the counters as the one op they are."""
    if _LIB:
        return
    lib = torch.library.Library("aten", "IMPL")

    def mm(a, b, out_dtype, *, out):
        return out.copy_(a.float() @ b.float())

    def addmm(acc, a, b, out_dtype, *, beta=1, alpha=1, out):
        return out.copy_(acc.float() * beta + alpha * (a.float() @ b.float()))

    lib.impl("mm.dtype_out", mm, "CPU")
    lib.impl("addmm.dtype_out", addmm, "CPU")
    _LIB.append(lib)


class CountOps(TorchDispatchMode):
    """Counts every ATen op dispatched (views and allocations included), by name."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def count_python(fn) -> tuple[int, int, Counter]:
    """(Python function calls, C function calls, calls by ``file:function``) of one ``fn()``."""
    by_fn: Counter = Counter()
    c_calls = [0]

    def prof(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if code.co_filename == __file__:  # this harness (the steps, the emulated matmuls)
                return
            by_fn[f"{os.path.basename(code.co_filename)}:{code.co_name}"] += 1
        elif event == "c_call":
            c_calls[0] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return sum(by_fn.values()), c_calls[0], by_fn


def count(fn, warm: int = 3) -> dict:
    """The counts of one call of ``fn`` (after ``warm`` calls): ATen ops, Python calls, Triton launches."""
    for _ in range(warm):
        fn()
    mode = CountOps()
    LAUNCHES.clear()
    with mode:
        fn()
    launches = sum(LAUNCHES.values())
    py, c, by_fn = count_python(fn)
    return {"aten_ops": sum(mode.ops.values()), "aten_by_op": dict(mode.ops.most_common()), "python_calls": py,
            "c_calls": c, "triton_launches": launches, "_by_fn": by_fn}


def cpu_us(fn, reps: int = 200) -> float:
    for _ in range(20):
        fn()
    out = []
    for _ in range(7):
        t0 = time.thread_time()
        for _ in range(reps):
            fn()
        out.append((time.thread_time() - t0) / reps * 1e6)
    return round(statistics.median(out), 1)


# ---- cases ---------------------------------------------------------------------------------------------------------
QWEN_HEAD_CAST_RANGES = 7
"""RowHalves' doubling ranges at Qwen2.5-0.5B's head: Va x H = 75968 x 896 elements from FIRST = 2**20 (7 ranges,
plus the first range's copy and block b: 9 casts on torch's path; one copy and one launch on the Triton path)."""


def flce_cases() -> dict:
    import tigon.functional as F
    from tigon.kernels import fused_linear_cross_entropy as k, head_grads

    n, hdim, vocab = 64, 32, 512
    emulate_fp32_out_matmuls()
    cpu = torch.device("cpu")
    for key in ((cpu, torch.bfloat16), f"{cpu}/{torch.bfloat16}"):  # (the key before and after 2026-12-04)
        head_grads._FP32_OUT[key] = True  # the CUDA path's out_dtype matmuls
    split = min(vocab, ((vocab + 1) // 2 + 7) // 8 * 8)
    head_grads.RowHalves.FIRST = split * hdim // (2 ** QWEN_HEAD_CAST_RANGES) + 1
    torch.manual_seed(0)
    h = torch.randn(n, hdim, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(vocab, hdim, dtype=torch.bfloat16) * 0.1).requires_grad_()
    t = torch.randint(0, vocab, (n,))

    def tigon_step():
        F.fused_linear_cross_entropy(h, w, t).backward()
        h.grad = w.grad = None

    def hf_step():
        logits = (h @ w.t()).float()
        torch.nn.functional.cross_entropy(logits, t).backward()
        h.grad = w.grad = None

    def tigon_chunks():  # 4 chunks of 16 rows: the grad_weight halves kept (as at Llama-3-8B's head at 16k tokens)
        cap, k.MAX_CHUNK_ELEMS_CPU = k.MAX_CHUNK_ELEMS_CPU, 16 * vocab
        try:
            tigon_step()
        finally:
            k.MAX_CHUNK_ELEMS_CPU = cap

    return {"flce tigon fwd+bwd": tigon_step, "flce hf fwd+bwd": hf_step,
            "flce tigon fwd": lambda: F.fused_linear_cross_entropy(h, w, t),
            "flce tigon 4 chunks fwd+bwd": tigon_chunks}


def op_cases() -> dict:
    """One forward + backward of each hot op of a decoder layer through :mod:`tigon.functional` (bf16, small shapes:
    the host path does not depend on them), every input that can take a gradient taking one."""
    import tigon.functional as F

    torch.manual_seed(0)
    bf = dict(dtype=torch.bfloat16, requires_grad=True)
    x, w, r = torch.randn(64, 128, **bf), torch.randn(128, **bf), torch.randn(64, 128, **bf)
    gate, up = torch.randn(64, 256, **bf), torch.randn(64, 256, **bf)
    q, k = torch.randn(2, 4, 16, 32, **bf), torch.randn(2, 2, 16, 32, **bf)
    cos, sin = torch.randn(2, 16, 32, dtype=torch.bfloat16), torch.randn(2, 16, 32, dtype=torch.bfloat16)
    leaves = (x, w, r, gate, up, q, k)

    def step(fn):
        def run():
            out = fn()
            out = sum(o.float().sum() for o in out) if isinstance(out, tuple) else out.float().sum()
            out.backward()
            for t in leaves:
                t.grad = None
        return run

    cases = {"op rms_norm fwd+bwd": step(lambda: F.rms_norm(x, w)),
             "op fused_add_rms_norm fwd+bwd": step(lambda: F.fused_add_rms_norm(x, r, w)),
             "op swiglu fwd+bwd": step(lambda: F.swiglu(gate, up)),
             "op rope fwd+bwd": step(lambda: F.rope(q, k, cos, sin)),
             "op torch (the harness: a sum and its backward) fwd+bwd": step(lambda: x * 1)}
    flce = flce_cases()["flce tigon fwd+bwd"]
    cases["op fused_linear_cross_entropy fwd+bwd"] = flce
    return cases


def _layer(family: str, patched: bool):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    import tigon

    cfg_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[family]
    cfg = cfg_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.bfloat16)
    if patched:
        tigon.patch(model)
        PATCHED.append(model)
    return model


PATCHED: list = []
"""The models :func:`layer_cases` patched (a caller that goes on running, such as a test, unpatches them)."""


def layer_cases() -> dict:
    os.environ["TIGON_HOST_BOUND_ELEMENTS"] = "0"
    out = {}
    for family in ("qwen2", "llama"):
        for patched in (False, True):
            model = _layer(family, patched)
            x = torch.randn(2, 16, 64, dtype=torch.bfloat16, requires_grad=True)
            pos = torch.arange(16)[None].expand(2, -1)
            emb = model.model.rotary_emb(x, pos)
            layer = model.model.layers[0]
            mask = None

            def step(layer=layer, x=x, emb=emb, mask=mask):
                out = layer(x, attention_mask=mask, position_embeddings=emb, position_ids=None)
                out = out[0] if isinstance(out, tuple) else out
                out.float().sum().backward()
                for p in layer.parameters():
                    p.grad = None
                x.grad = None

            out[f"layer {family} {'tigon' if patched else 'hf'} fwd+bwd"] = step
    return out


CPU_MATH = ("at::native::addmm_impl_cpu_(", "void at::native::(anonymous namespace)::cpu_flash_attention<",
            "void at::native::(anonymous namespace)::cpu_flash_attention_backward<")
"""The CPU's own arithmetic of the layer cases (inclusive instructions): every mm / addmm of the projections (both
reach ``addmm_impl_cpu_``) and the scaled-dot-product attention's forward and backward kernels. Hugging Face's
layer and the patched one run the same matmuls and attention; on a GPU that work is the kernels', not the host's."""


def read_callgrind(paths, n: int) -> dict:
    """{case: {"instructions": per call, "host_instructions": per call less :data:`CPU_MATH`}} from the dumps of a
    ``--callgrind n`` run (``callgrind_annotate --inclusive=yes`` reads the functions' inclusive counts)."""
    import subprocess

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from host_overhead import read_callgrind as totals

    out = {}
    for path in paths:
        total = totals([path], n)
        if not total:
            continue
        (name, per_call), = total.items()
        text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                              capture_output=True, text=True, check=True).stdout
        math = 0
        for prefix in CPU_MATH:  # the largest inclusive count of each (the outermost frame of that function)
            counts = [int(line.split()[0].replace(",", "")) for line in text.splitlines()
                      if f"???:{prefix}" in line and line.strip()[:1].isdigit()]
            math += max(counts, default=0)
        out[name] = {"instructions": per_call, "host_instructions": per_call - math // n}
    return out


def diff_functions(a: Counter, b: Counter, top: int) -> list[tuple[str, int, int]]:
    """The functions whose call counts differ most between ``a`` (HF) and ``b`` (Tigon): (name, a, b)."""
    keys = set(a) | set(b)
    rows = sorted(keys, key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))[:top]
    return [(k, a.get(k, 0), b.get(k, 0)) for k in rows]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="flce,layer")
    ap.add_argument("--top", type=int, default=25, help="functions listed per HF / Tigon pair")
    ap.add_argument("--clock", action="store_true", help="also the thread's CPU time per call (indicative)")
    ap.add_argument("--note", help="stored in the JSON (e.g. the commit)")
    ap.add_argument("--out", help="write the counts as JSON")
    ap.add_argument("--callgrind", type=int, metavar="N",
                    help="under valgrind --tool=callgrind: N calls of each case, a dump after each (then read the "
                         "instructions per call with host_overhead.py --callgrind-read DUMPS --calls N)")
    ap.add_argument("--callgrind-read", nargs="+", metavar="DUMP",
                    help="the instructions per call in these dumps of a --callgrind N run (N from --calls), in all "
                         "and less the CPU's matmul / attention arithmetic (CPU_MATH)")
    ap.add_argument("--calls", type=int, default=20, help="the N of the --callgrind run read (default 20)")
    args = ap.parse_args(argv)
    if args.callgrind_read:
        res = read_callgrind(args.callgrind_read, args.calls)
        for name, c in res.items():
            print(f"{name:32s} {c['instructions']:10d} instructions, {c['host_instructions']:10d} less CPU_MATH")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"note": args.note, "calls": args.calls, "cpu_math": CPU_MATH, "per_call": res}, f, indent=1)
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1 (the CPU machines' backend; launches are stubbed anyway)")
    stub_launches()
    cases = {}
    wanted = args.cases.split(",")
    if "ops" in wanted:
        cases.update(op_cases())
    if "flce" in wanted:
        cases.update(flce_cases())
    if "layer" in wanted:
        cases.update(layer_cases())
    if args.callgrind:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from host_overhead import run_for_callgrind

        run_for_callgrind({k.replace("+", "-"): v for k, v in cases.items()}, args.callgrind)
        return
    res = {}
    for name, fn in cases.items():
        c = count(fn)
        if args.clock:
            c["cpu_us"] = cpu_us(fn)
        res[name] = c
        extra = f", {c['cpu_us']:8.1f} us CPU" if args.clock else ""
        print(f"{name:32s} aten ops {c['aten_ops']:4d}, python calls {c['python_calls']:5d}, "
              f"C calls {c['c_calls']:5d}, triton launches {c['triton_launches']:2d}{extra}")
    for name, c in res.items():
        print(f"\n{name}: ATen ops {c['aten_by_op']}")
    pairs = [(k, k.replace(" tigon ", " hf ")) for k in res if " tigon " in k and k.replace(" tigon ", " hf ") in res]
    for tk, hk in pairs:
        print(f"\n{tk} against {hk}: functions by difference in calls (hf, tigon)")
        for fn_name, a, b in diff_functions(res[hk]["_by_fn"], res[tk]["_by_fn"], args.top):
            print(f"  {fn_name:60s} {a:5d} {b:5d}")
    if args.out:
        for c in res.values():
            c["python_by_function"] = dict(c.pop("_by_fn").most_common())
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "note": args.note, "cases": res,
                       "command": "TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/host_count.py "
                                  f"--cases {args.cases}"}, f, indent=1)


if __name__ == "__main__":
    main()
