"""Session 30's open CUDA test failures, diagnosed in one run (about 60 s on a GPU; prints only):

1. ``test_fused_linear_logprobs.py::test_bf16_no_worse_than_the_plain_computation``: bf16 log-probs 1.4-1.7x the
   plain computation's error on an H100. Prints each one's error against float64 with the plain logits made three
   ways (F.linear in bf16 as TRL, with cuBLAS's reduced-precision bf16 reductions off, and fp32 logits), and Tigon's
   distance to each: which rounding Tigon's chunk matmul matches.
2. ``test_preference.py::test_dpo_at_model_size_on_gpu``: 2.58 head matmuls counted where 4 are expected. Prints
   every 2-D matmul the call runs (shape, FLOPs in head-matmul units) and the kept-rows decision.

    PYTHONPATH=$PWD/src:$PWD/tests python3 benchmarks/results/h200/session30/diag_s30.py
"""

import functools

import torch

import tigon.functional as F
import tigon.ops.preference as P
from tigon.numerics import rel_l2
from tigon.ops.fused_linear_logprobs import trl_linear_logprobs
from tigon.reference.fused_linear_logprobs import fused_linear_logprobs as ref_logprobs


def logprobs_case(seed: int, n=33, v=157, h=24, std=2.0, softcap=None, temperature=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(n, h, device="cuda", generator=g).bfloat16()
    weight = (torch.randn(v, h, device="cuda", generator=g) / h**0.5 * std).bfloat16()
    target = torch.randint(0, v, (n,), device="cuda", generator=g)
    kw = dict(softcap=softcap, temperature=temperature)
    truth = ref_logprobs(hidden.double(), weight.double(), target, **kw)
    tig = F.fused_linear_logprobs(hidden, weight, target, **kw)
    plain = trl_linear_logprobs(hidden, weight, target, **kw)
    flag = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    plain_exact = trl_linear_logprobs(hidden, weight, target, **kw)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flag
    plain32 = trl_linear_logprobs(hidden.float(), weight.float(), target, **kw)
    t = lambda a: rel_l2(a.double(), truth.double())  # noqa: E731
    print(f"seed {seed} cap {softcap} T {temperature}: err tigon {t(tig):.2e} plain {t(plain):.2e} "
          f"plain(no reduced) {t(plain_exact):.2e} fp32-logits {t(plain32):.2e} | tigon-plain "
          f"{rel_l2(tig.double(), plain.double()):.2e} tigon-plain32 {rel_l2(tig.double(), plain32.double()):.2e}")


def dpo_matmuls():
    from torch.utils._python_dispatch import TorchDispatchMode

    import tigon.kernels.ignored_rows as ir

    aten = torch.ops.aten
    unit = 2 * 4096 * 2048 * 32000
    seen = []

    class Show(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if any(k in name for k in ("mm", "matmul", "linear", "bmm")):
                shapes = [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]
                fl = 0.0
                if func in (aten.mm.default, aten.mm.out, aten.addmm.default, aten.addmm.out, aten.addmm_.default):
                    a, b = args[-2], args[-1]
                    fl = 2 * a.shape[0] * a.shape[1] * b.shape[1] / unit
                seen.append((name, shapes, fl))
            return func(*args, **(kwargs or {}))

    real = ir.kept_rows

    def kept(*a, **k):
        out = real(*a, **k)
        print("kept_rows", "None" if out is None else out.numel(), "of", a[0].numel(), "min_macs", a[-1] if a else "")
        return out

    ir.kept_rows = kept
    gen = torch.Generator(device="cuda").manual_seed(0)
    inp = P._inputs({"tokens": 4096, "hidden": 2048, "vocab": 32000}, torch.bfloat16, "cuda", gen, pairs=4,
                    ignore_every=7, reference="model")
    one_pair = functools.partial(P.RECORDS[0].fn, memory=4 * 32000 * 2048 + 2 * 1024 * 32000 + (1 << 20))
    leaves = {k: (v.detach().clone().requires_grad_() if k in ("hidden", "weight") else v) for k, v in inp.items()}
    print("kept fraction", (inp["target"] != -100).double().mean().item())
    with Show():
        one_pair(**leaves).loss.backward()
    total = 0.0
    for name, shapes, fl in seen:
        total += fl
        print(f"  {name:40s} {shapes} {fl:.3f}")
    print("head matmuls counted", round(total, 3))


if __name__ == "__main__":
    for seed in range(4):
        logprobs_case(seed)
    logprobs_case(0, softcap=3.0, temperature=0.7)
    dpo_matmuls()
