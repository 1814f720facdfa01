"""Host (Python + dispatcher) time of one call of each Tigon op, with every Triton launch replaced by a no-op.

    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/host_overhead.py [--clock cpu] [--launches] \
        [--out host-overhead_tiny_cpu_<date>.json]
    python3 benchmarks/host_overhead.py --merge run1.json run2.json ... --out medians.json

Also the patched modules (a tiny Llama's MLP and RMSNorm after ``tigon.patch``, against Hugging Face's): the
integration layer's per-call checks on top of the ops' own cost.

What the GPU hides only when its kernels run longer than this: at small batches the ops are host-bound (the
cross-entropy at 1-2k tokens, benchmarks/results/h200/session8/sweep9c_ce_plain_small.json). On the GPU, the host's
share shows as the difference between ``tigon bench`` without and with ``--cuda-graph``. Measured on tiny CPU tensors
under the interpreter backend (the same Python path as the CUDA one except that the CUDA path skips the target-range
check and pays the CUDA launch itself), so figures compare versions of the code on one machine, not machines. Median of
7 repeats of 500 calls.

``--clock cpu`` times with the thread's CPU time (``time.thread_time``) instead of the wall clock: on a shared,
loaded machine the wall clock also counts the time the process waited for a core, the CPU time does not.
``--launches`` also counts, per op, the kernels one forward and one backward (``torch.autograd.grad`` with given
output gradients, so nothing of the harness is counted) would launch on a GPU, in bfloat16: the Triton launches
(by kernel) and the ATen ops that run a kernel (views and allocations aside); for Tigon and for the ops' eager
PyTorch code (what ``tigon bench`` times as eager). ``--merge`` writes the per-op medians
of several ``--out`` files (e.g. runs alternating between two versions of the code).

``--callgrind N`` (under ``valgrind --tool=callgrind``) and ``--callgrind-read``: the instructions each case
executes per call, a count that the machine's load does not move (valgrind makes the run ~50x slower: start-up
takes minutes, 100 calls a case seconds):

    TRITON_INTERPRET=1 PYTHONPATH=src valgrind --tool=callgrind --callgrind-out-file=cg.%p \
        python3 benchmarks/host_overhead.py --callgrind 100
    python3 benchmarks/host_overhead.py --callgrind-read cg.<pid>.* --calls 100 [--out counts.json]
"""

import argparse
import json
import statistics
import time

import torch

CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
# Kernel launches stubbed into counters (the same stub as host_count.py's, which covers every kernel module).
from host_count import LAUNCHES, stub_launches as _mock_launches  # noqa: E402


def _time(fn, clock, reps=500):
    for _ in range(20):
        fn()
    out = []
    for _ in range(7):
        t0 = clock()
        for _ in range(reps):
            fn()
        out.append((clock() - t0) / reps * 1e6)
    return statistics.median(out)


def _inputs(dtype=torch.float32):
    torch.manual_seed(0)
    leaf = lambda *s: torch.randn(*s, dtype=dtype).requires_grad_()  # noqa: E731
    return dict(x=leaf(8, 64), w=torch.ones(64, dtype=dtype, requires_grad=True), t=torch.randint(0, 64, (8,)),
                q=leaf(1, 4, 8, 16), k=leaf(1, 2, 8, 16), cos=torch.randn(1, 8, 16, dtype=dtype),
                sin=torch.randn(1, 8, 16, dtype=dtype), g=leaf(8, 64), u=leaf(8, 64),
                b=torch.zeros(64, dtype=dtype, requires_grad=True), X=leaf(2, 8, 16),
                gw=torch.ones(8, dtype=dtype, requires_grad=True), gb=torch.zeros(8, dtype=dtype, requires_grad=True),
                alpha=torch.full((1,), 0.5, dtype=dtype, requires_grad=True),
                lw=(torch.randn(96, 64, dtype=dtype) / 8).requires_grad_(), lt=torch.randint(0, 96, (8,)))


def _ops(i, eager: bool = False):
    """Each op as (forward call, the leaves it differentiates); the first four are timed, all are counted.
    ``eager``: the op's eager PyTorch code (its record's ``eager_fn``: what ``tigon bench`` times as eager)."""
    import tigon.functional as F
    from tigon import ops

    def fn(name):
        return ops.get(name).eager_fn if eager else getattr(F, name)

    ce, rms, rope, swiglu, fadd, ln, gn, dyt, flce = map(fn, ("cross_entropy", "rms_norm", "rope", "swiglu",
                                                              "fused_add_rms_norm", "layer_norm", "group_norm", "dyt",
                                                              "fused_linear_cross_entropy"))
    return {
        "cross_entropy": (lambda: ce(i["x"], i["t"]), [i["x"]]),
        "rms_norm": (lambda: rms(i["x"], i["w"]), [i["x"], i["w"]]),
        "rope": (lambda: rope(i["q"], i["k"], i["cos"], i["sin"]), [i["q"], i["k"]]),
        "swiglu": (lambda: swiglu(i["g"], i["u"]), [i["g"], i["u"]]),
        "fused_add_rms_norm": (lambda: fadd(i["x"], i["g"], i["w"]), [i["x"], i["g"], i["w"]]),
        "layer_norm": (lambda: ln(i["x"], i["w"], i["b"]), [i["x"], i["w"], i["b"]]),
        "group_norm": (lambda: gn(i["X"], i["gw"], i["gb"], 8, 4), [i["X"], i["gw"], i["gb"]]),
        "group_norm_no_affine": (lambda: gn(i["X"], None, None, 8, 4), [i["X"]]),
        "dyt": (lambda: dyt(i["x"], i["alpha"], i["w"], i["b"]), [i["x"], i["alpha"], i["w"], i["b"]]),
        # an (8, 64) -> 96 LM head, mean loss, one chunk (on CPU the bf16 matmuls upcast their operands; the CUDA
        # path's choices are emulated by host_count.py's flce cases)
        "fused_linear_cross_entropy": (lambda: flce(i["x"], i["lw"], i["lt"]), [i["x"], i["lw"]]),
    }


def _patched_modules():
    """(HF LlamaMLP, the same MLP after ``tigon.patch``, HF LlamaRMSNorm, the patched one, an (8, 64) leaf): the
    integration layer's own cost per call (its checks for hooks, the config's activation, checkpointing) on top of
    the ops', from one tiny Llama patched and one not."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import tigon

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128)
    torch.manual_seed(0)
    hf, patched = LlamaForCausalLM(cfg), LlamaForCausalLM(cfg)
    tigon.patch(patched)
    a, b = hf.model.layers[0], patched.model.layers[0]
    return a.mlp, b.mlp, a.input_layernorm, b.input_layernorm, torch.randn(8, 64, requires_grad=True)


def count_launches(eager: bool = False) -> dict:
    """{op: {"fwd": {kernel: launches}, "bwd": {...}, "total": n}}: Triton launches and kernel-running ATen ops.
    ``eager``: of the ops' eager PyTorch code instead (see :func:`_ops`)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    no_kernel = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
                 torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided, torch.ops.aten.detach,
                 torch.ops.aten.alias, torch.ops.aten.lift_fresh}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            tensors = out if isinstance(out, (tuple, list)) else (out,)  # (promote_types & co. return no tensor)
            if func.overloadpacket not in no_kernel and not func.is_view and any(
                    isinstance(t, torch.Tensor) for t in tensors):
                LAUNCHES["aten." + func.overloadpacket.__name__] += 1
            return out

    out = {}
    for name, (fwd, leaves) in _ops(_inputs(torch.bfloat16), eager).items():
        res = fwd()
        res = list(res) if isinstance(res, tuple) else [res]
        grads = [torch.ones_like(r) for r in res]
        LAUNCHES.clear()
        with Count():
            res = fwd()
        f = dict(LAUNCHES)
        res = list(res) if isinstance(res, tuple) else [res]
        LAUNCHES.clear()
        with Count():
            torch.autograd.grad(res, leaves, grads)
        b = dict(LAUNCHES)
        out[name] = {"fwd": f, "bwd": b, "total": sum(f.values()) + sum(b.values())}
    LAUNCHES.clear()
    return out


def merge(paths):
    """The per-op medians of several ``--out`` files, per clock: ``host_us`` for the first file's clock,
    ``host_us_<clock>`` for each clock present, and every run's figures under ``runs``."""
    loaded = [json.load(open(p)) for p in paths]
    runs = [r for r in loaded if "host_us" in r]
    out = dict(runs[0], runs=[{"clock": r.get("clock", "wall"), "host_us": r["host_us"]} for r in runs],
               merged=list(paths))
    for r in loaded:  # a --callgrind-read file: its counts as they are
        if "instructions_per_call" in r:
            out["instructions_per_call"] = r["instructions_per_call"]
    for clock in dict.fromkeys(r.get("clock", "wall") for r in runs):
        same = [r["host_us"] for r in runs if r.get("clock", "wall") == clock]
        out[f"host_us_{clock}"] = {k: round(statistics.median(r[k] for r in same), 1) for k in same[0]}
    out["host_us"] = out[f"host_us_{runs[0].get('clock', 'wall')}"]
    return out


def run_for_callgrind(cases, n: int) -> None:
    """Run under ``valgrind --tool=callgrind``: ``n`` calls of each case after a warm-up, with a dump named after the
    case after each (``callgrind_control -d``), so that each dump holds one case's instructions: a count that, unlike
    a time, does not move with the machine's load."""
    import os
    import subprocess

    def dump(tag):
        subprocess.run(["callgrind_control", "-d", tag, str(os.getpid())], capture_output=True, check=False)

    for fn in cases.values():
        for _ in range(20):
            fn()
    dump("start")
    for name, fn in cases.items():
        for _ in range(n):
            fn()
        dump(name.split(" (")[0])  # (callgrind_control drops a dump whose name has a colon)


def read_callgrind(paths, n: int) -> dict:
    """{case (its name up to a parenthesis): instructions per call} from the dumps of a ``--callgrind n`` run."""
    out = {}
    for path in paths:
        desc = summary = None
        with open(path) as f:
            for line in f:
                if line.startswith("desc: Trigger: "):
                    desc = line.split("dump ", 1)[-1].strip() if "dump " in line else None
                elif line.startswith("summary: "):
                    summary = int(line.split()[1])
        if desc and desc != "start" and summary is not None:
            out[desc] = summary // n
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the per-call host times as JSON")
    ap.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                    help="wall: time.perf_counter; cpu: the thread's CPU time (steadier on a loaded machine)")
    ap.add_argument("--launches", action="store_true", help="also count the kernel launches of each op")
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="write the medians of these --out files to --out")
    ap.add_argument("--note", help="stored in the JSON (e.g. which tree / commit was on PYTHONPATH)")
    ap.add_argument("--callgrind", type=int, metavar="N",
                    help="under valgrind --tool=callgrind: N calls of each case, a callgrind dump after each")
    ap.add_argument("--callgrind-read", nargs="+", metavar="DUMP",
                    help="the instructions per call in these dumps of a --callgrind N run (N from --calls)")
    ap.add_argument("--calls", type=int, default=100, help="the N of the --callgrind run read (default 100)")
    args = ap.parse_args()
    if args.callgrind_read:
        res = read_callgrind(args.callgrind_read, args.calls)
        for name, n in res.items():
            print(f"{name:46s} {n:10d} instructions")
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"note": args.note, "instructions_per_call": res}, f, indent=1)
        return
    if args.merge:
        res = merge(args.merge)
        for name, us in res["host_us"].items():
            print(f"{name:46s} {us:8.1f} us")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
        return
    _mock_launches()
    i = _inputs()
    ops = _ops(i)
    x, t = i["x"], i["t"]
    cases = {
        "cross_entropy fwd": ops["cross_entropy"][0],
        "cross_entropy fwd+bwd": lambda: ops["cross_entropy"][0]().backward(),
        "rms_norm fwd+bwd": lambda: ops["rms_norm"][0]().sum().backward(),
        "rope fwd+bwd": lambda: sum(o.sum() for o in ops["rope"][0]()).backward(),
        "swiglu fwd+bwd": lambda: ops["swiglu"][0]().sum().backward(),
        "fused_linear_cross_entropy fwd+bwd": lambda: ops["fused_linear_cross_entropy"][0]().backward(),
        "torch.sum fwd+bwd (floor: autograd + one op)": lambda: x.sum().backward(),
    }
    hf_mlp, mlp, hf_norm, norm, h = _patched_modules()
    cases.update({
        "HF LlamaMLP fwd+bwd": lambda: hf_mlp(h).sum().backward(),
        "patched LlamaMLP fwd+bwd (tigon.patch)": lambda: mlp(h).sum().backward(),
        "HF LlamaRMSNorm fwd+bwd": lambda: hf_norm(h).sum().backward(),
        "patched LlamaRMSNorm fwd+bwd (tigon.patch)": lambda: norm(h).sum().backward(),
    })
    del t
    if args.callgrind:
        run_for_callgrind(cases, args.callgrind)
        return
    res = {name: round(_time(fn, CLOCKS[args.clock]), 1) for name, fn in cases.items()}
    for name, us in res.items():
        print(f"{name:46s} {us:8.1f} us")
    launches = {"tigon": count_launches(), "eager": count_launches(eager=True)} if args.launches else None
    if launches:
        for who, counts in launches.items():
            for name, c in counts.items():
                print(f"{who:5s} {name:18s} launches fwd+bwd {c['total']:2d}: fwd {c['fwd']} bwd {c['bwd']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "clock": args.clock, "note": args.note, "host_us": res,
                       **({"launches": launches} if launches else {}),
                       "command": "TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/host_overhead.py"
                                  f" --clock {args.clock}" + (" --launches" if args.launches else "")}, f, indent=1)


if __name__ == "__main__":
    main()
