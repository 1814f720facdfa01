"""jsd and kl_div forward + backward on a GPU: the current kernels (``tigon.kernels.divergence``), optionally against
an earlier version of that module (``--old PATH``: a file holding it, made importable on its own, not kept in the
repository), plus their accuracy on the GPU's fast math.

    PYTHONPATH=src python3 benchmarks/divergence_tune.py --out divergence_tune.json [--old .gpu/divergence_04bb6c3.py]

Options: ``--tokens 16384 --vocab 128256 --dtype bf16`` (defaults: Llama-3-8B's vocabulary, the issue's size),
``--rep 200`` (do_bench's milliseconds per measurement), ``--skip-accuracy``.

Per case (jsd beta 0.5 / 0.1, kl_div with probability targets (KL_PROB, torch's default) and log targets, each
"batchmean", the input's gradient alone, ``loss.backward()``: an upstream of 1): ``triton.testing.do_bench``
medians (L2 flushed before each sample) of the forward alone and of forward + backward (host included: autograd,
the 0-d reduction ops), and the kernels' own time per forward + backward summed from torch.profiler (``kernel_ms``:
the issue's measure, no host gaps). GB/s over the minimal bytes, 3 N V e for both passes together (read input and
target, write the input's gradient; the backward reads and writes nothing for an upstream of 1), against the copy
bandwidth measured here (``dst.copy_(src)`` of 2 GiB: 2 x 2 GiB moved).

Accuracy (fp32 inputs, 32 x 128256, every kernel compiled with the GPU's approximate ex2 / lg2): relative error of
the loss and rel-L2 of the input's gradient against float64 (``tigon.reference.divergence`` on float64 copies, its
autograd for the gradient), old and new, for near-identical distributions (student = teacher + 0.01 noise in the
logits: the divergence second order in the gap) and for unrelated ones. JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tigon.kernels import divergence as new  # noqa: E402
from tigon.reference import divergence as ref  # noqa: E402

VERSIONS = {"new": new}  # "old": --old's module
DEVICE = "cuda"  # (a CPU dry run of the script's logic under Triton's interpreter sets "cpu")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CASES = {  # name: (kind attribute, beta, log-target)
    "jsd_beta0.5": ("JSD", 0.5, True),
    "jsd_beta0.1": ("JSD", 0.1, True),
    "kl_div_prob_target": ("KL_PROB", 0.5, False),
    "kl_div_log_target": ("KL_LOG", 0.5, True),
}


def loss_fn(module, case, reduction="batchmean"):
    kind_name, beta, _log_target = CASES[case]
    opts = module.Divergence(getattr(module, kind_name), beta, 1e-10, -100)
    return lambda x, y: module.DivergenceFunction.apply(x, y, None, opts, reduction, True)


def inputs(case, n, v, dtype, seed=0, near=None):
    """(student log-probs, target): the target log-probs, or probabilities for kl_div's probability target."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    logits = torch.randn(n, v, device=DEVICE, generator=g) * 2.0
    y = torch.log_softmax(logits, -1)
    if near is None:
        x = torch.log_softmax(torch.randn(n, v, device=DEVICE, generator=g) * 2.0, -1)
    else:
        x = torch.log_softmax(logits + near * torch.randn(n, v, device=DEVICE, generator=g), -1)
    del logits
    if not CASES[case][2]:
        y = y.exp_()
    return x.to(dtype), y.to(dtype)


def kernel_ms(step, iters=10):
    """CUDA kernel time per call of ``step`` (torch.profiler: the sum of the device's kernel, memcpy and memset
    durations)."""
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total / iters / 1e3


def copy_gbps(rep):
    src = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), rep=rep, return_mode="median")
    moved = 2 * src.numel() * src.element_size()
    return moved / ms / 1e6, ms


def time_case(case, n, v, dtype, rep, copy):
    x, y = inputs(case, n, v, dtype)
    x.requires_grad_(True)
    minimal = 3 * n * v * x.element_size()
    rows, loss, grad = {}, {}, {}
    for name, module in VERSIONS.items():
        f = loss_fn(module, case)

        def fwd():
            return f(x, y)

        def fwd_bwd():
            x.grad = None
            f(x, y).backward()

        loss[name] = fwd().item()
        fwd_bwd()
        grad[name] = x.grad.float()
        x.grad = None
        ms_f = do_bench(fwd, rep=rep, return_mode="median")
        ms_fb = do_bench(fwd_bwd, rep=rep, return_mode="median")
        k_ms = kernel_ms(fwd_bwd)
        x.grad = None
        rows[name] = dict(
            fwd_ms=ms_f, fwd_bwd_ms=ms_fb, kernel_ms=k_ms,
            fwd_bwd_gbps=minimal / ms_fb / 1e6, fwd_bwd_pct_copy=100 * minimal / ms_fb / 1e6 / copy,
            kernel_gbps=minimal / k_ms / 1e6, kernel_pct_copy=100 * minimal / k_ms / 1e6 / copy,
        )
    if "old" in rows:
        rows["speedup_kernel"] = rows["old"]["kernel_ms"] / rows["new"]["kernel_ms"]
        rows["check"] = dict(loss_old=loss["old"], loss_new=loss["new"],
                             loss_rel_diff=abs(loss["new"] - loss["old"]) / abs(loss["old"]),
                             grad_rel_l2_new_vs_old=((grad["new"] - grad["old"]).norm() / grad["old"].norm()).item())
    rows["minimal_bytes"] = minimal
    return rows


def accuracy(case, module, near, n=32, v=128256):
    x, y = inputs(case, n, v, torch.float32, seed=1, near=near)
    kind_name, beta, log_target = CASES[case]
    x64, y64 = x.double().requires_grad_(True), y.double()
    if kind_name == "JSD":
        want = ref.jsd(x64, y64, None, beta)
    else:
        want = ref.kl_div(x64, y64, reduction="batchmean", log_target=log_target)
    want.backward()
    xg = x.clone().requires_grad_(True)
    got = loss_fn(module, case)(xg, y)
    got.backward()
    return dict(loss_rel_err=abs(got.item() - want.item()) / abs(want.item()),
                grad_rel_l2=((xg.grad.double() - x64.grad).norm() / x64.grad.norm()).item(), loss=want.item())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--rep", type=int, default=200)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--old", help="a file with an earlier tigon.kernels.divergence, importable on its own")
    args = parser.parse_args(argv)
    if args.old:
        spec = importlib.util.spec_from_file_location("divergence_old", args.old)
        VERSIONS["old"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(VERSIONS["old"])
    assert torch.cuda.is_available(), "needs a GPU"
    cases = args.cases.split(",")
    copy, copy_ms = copy_gbps(args.rep)
    out = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
               shape=[args.tokens, args.vocab], dtype=args.dtype, copy_gbps=copy, copy_ms_2GiB=copy_ms,
               method="do_bench median (L2 flushed), forward alone and forward + loss.backward(); kernel_ms: "
                      "torch.profiler device time per forward + backward; GB/s over 3 N V e",
               timings={}, accuracy={})
    print(f"{out['device']}: copy {copy:.0f} GB/s")
    for case in cases:
        r = time_case(case, args.tokens, args.vocab, DTYPES[args.dtype], args.rep, copy)
        torch.cuda.empty_cache()  # (the case's tensors are gone with time_case's frame)
        out["timings"][case] = r
        for name in VERSIONS:
            t = r[name]
            print(f"{case:20s} {name}: fwd {t['fwd_ms']:.3f} ms, fwd+bwd {t['fwd_bwd_ms']:.3f} ms "
                  f"({t['fwd_bwd_pct_copy']:.0f}% copy), kernels {t['kernel_ms']:.3f} ms ({t['kernel_pct_copy']:.0f}%)")
        if "old" in r:
            print(f"{case:20s} kernel speedup {r['speedup_kernel']:.2f}x, check {r['check']}")
    if not args.skip_accuracy:
        for case in cases:
            for label, near in (("near_identical", 0.01), ("unrelated", None)):
                for name, module in VERSIONS.items():
                    a = accuracy(case, module, near)
                    out["accuracy"].setdefault(case, {}).setdefault(label, {})[name] = a
                    print(f"accuracy {case:20s} {label:15s} {name}: loss {a['loss_rel_err']:.2e}, "
                          f"grad {a['grad_rel_l2']:.2e} (loss {a['loss']:.3e})")
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
