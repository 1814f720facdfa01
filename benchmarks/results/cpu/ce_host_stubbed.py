"""Host (Python) cost of tigon's cross-entropy autograd.Function with its Triton kernels stubbed out, on CPU tensors:
what a call costs before any launch (launch paths and device allocations not included). 1024 x 1000 fp32 logits,
mean loss; per call, the minimum over 3 rounds of 3000 calls.

    PYTHONPATH=src python3 benchmarks/results/cpu/ce_host_stubbed.py
"""
import time

import torch

import tigon.ops.cross_entropy as ce


class Stub:
    def __getitem__(self, grid):
        return lambda *a, **k: None


for name in ("_ce_fwd_kernel", "_reduce_kernel", "_ce_bwd_kernel"):
    setattr(ce, name, Stub())
x = torch.randn(1024, 1000, requires_grad=True)
t = torch.randint(0, 1000, (1024,))
opts = ce.LossOptions()


def fwd():
    return ce.CrossEntropyFunction.apply(x, t, None, opts, "mean", None, False, False)


def step():
    x.grad = None
    fwd()[0].backward()


res = {}
for _ in range(3):
    for f, n in ((fwd, "fwd"), (step, "fwd+bwd")):
        for _ in range(200):
            f()
        t0 = time.perf_counter()
        for _ in range(3000):
            f()
        res.setdefault(n, []).append((time.perf_counter() - t0) / 3000 * 1e6)
print({k: round(min(v), 1) for k, v in res.items()}, "us per call (kernels stubbed, CPU)")
