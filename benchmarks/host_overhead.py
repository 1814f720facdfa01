"""Host (Python + dispatcher) time of one call of each Tigon op, with every Triton launch replaced by a no-op.

    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/host_overhead.py [--out host-overhead_tiny_cpu_<date>.json]

What the GPU hides only when its kernels run longer than this: at small batches the ops are host-bound (the
cross-entropy at 1-2k tokens, benchmarks/results/h200/session8/sweep9c_ce_plain_small.json). On the GPU, the host's
share shows as the difference between ``tigon bench`` without and with ``--cuda-graph``. Measured on tiny CPU tensors under the interpreter backend (the
same Python path as the CUDA one except that the CUDA path skips the target-range check and pays the CUDA launch
itself), so figures compare versions of the code on one machine, not machines. Median of 7 repeats of 500 calls.
"""

import argparse
import json
import statistics
import time

import torch

import tigon.functional as F
from tigon.kernels import glu, loss_rows, norm, rope  # the modules whose kernels are launched


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **k: None


def _mock_launches():
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    for mod in (loss_rows, glu, norm, rope):
        for name in dir(mod):
            if isinstance(getattr(mod, name), (JITFunction, InterpretedFunction)):
                setattr(mod, name, _NoLaunch())  # only launched ones matter; helpers are never called from Python
    import tigon.reference.cross_entropy as rce
    rce.check_target_range = lambda *a, **k: None  # skipped on the CUDA path (it would sync)


def _time(fn, reps=500):
    for _ in range(20):
        fn()
    out = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the per-call host times as JSON")
    args = ap.parse_args()
    _mock_launches()
    x = torch.randn(8, 64, requires_grad=True)
    w = torch.ones(64, requires_grad=True)
    t = torch.randint(0, 64, (8,))
    q = torch.randn(1, 4, 8, 16, requires_grad=True)
    k = torch.randn(1, 2, 8, 16, requires_grad=True)
    cos, sin = torch.randn(1, 8, 16), torch.randn(1, 8, 16)
    g, u = torch.randn(8, 64, requires_grad=True), torch.randn(8, 64, requires_grad=True)
    cases = {
        "cross_entropy fwd": lambda: F.cross_entropy(x, t),
        "cross_entropy fwd+bwd": lambda: F.cross_entropy(x, t).backward(),
        "rms_norm fwd+bwd": lambda: F.rms_norm(x, w).sum().backward(),
        "rope fwd+bwd": lambda: sum(o.sum() for o in F.rope(q, k, cos, sin)).backward(),
        "swiglu fwd+bwd": lambda: F.swiglu(g, u).sum().backward(),
        "torch.sum fwd+bwd (floor: autograd + one op)": lambda: x.sum().backward(),
    }
    res = {name: round(_time(fn), 1) for name, fn in cases.items()}
    for name, us in res.items():
        print(f"{name:46s} {us:8.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "host_us": res,
                       "command": "TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/host_overhead.py"}, f, indent=1)


if __name__ == "__main__":
    main()
