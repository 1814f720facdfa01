"""Issue 21's two ops below 80% of copy bandwidth, group_norm and sparsemax: the default launch and each variant
(module knobs of tigon.kernels.group_norm / tigon.kernels.sparsemax) timed in one run against the copy ceiling.

    PYTHONPATH=src python3 benchmarks/issue21_tune.py --out $OUT/issue21-tune_h200_<date>.json   (one GPU, ~60-90 s)
    PYTHONPATH=src python3 benchmarks/issue21_tune.py --cpu --out /tmp/issue21.json   (interpreter, tiny sizes)

Ceiling: ``copy_gbps``, a 1 GiB bf16 device-to-device copy timed as ``tigon bench`` and benchmarks/tune.py time it
(tigon.workflows.timing._copy_ms: bytes read + written per second); also a copy of one operand's size as CUDA-graph
replays (``copy_graph_gbps``, the same timing as the rows). Rows: bf16, fwd and fwd + bwd through autograd
(tigon.functional), medians of ``triton.testing.do_bench_cudagraph`` replays (kernel time, no host), inputs
rotated between two sets (each operand 128 MiB, over twice the L2); GB/s over the minimal bytes and % of
``copy_gbps``:

- group_norm, (B, C, S) = (128, 128, 4096) in 32 groups (Liger's layout at Llama-3 sizes, groups of 4 x 4096),
  weight and bias: forward 2 M N e (read x, write y), fwd + bwd 5 M N e (+ read x, dy, write dx); the default
  (one-launch ``_group_fwd`` / ``_group_bwd``, 127 registers, one program an SM), the forward's warps, and the
  streamed backward (``GROUP_BWD_CHUNK``) with ``GROUP_BWD_ROW_SUMS`` (chunk row sums at once: 45-108 registers).
  Then torch.profiler's per-kernel CUDA time of the default's fwd + bwd (where the time goes: forward, backward,
  the dw / db sum).
- sparsemax, 16384 x 4096 (Gaussian rows times 1 and 10): forward 2 M N e, fwd + bwd 5 M N e; the default
  (``FWD_CONFIGS`` 1 row x 2 warps, Michelot from max - 1), other (rows, warps) launches, and ``START_TOP2`` (the
  loop started from the top two values' bound: emulated passes 3.5 -> 2.0 at scale 1).

``--cpu``: the same rows at tiny sizes through the Triton interpreter, wall time of one call (checks the script
and the variants run; the numbers mean nothing). JSON to ``--out``, rewritten after every row.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from unittest import mock

import torch

CPU = "--cpu" in sys.argv
if CPU or not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton's kernels are imported

import triton  # noqa: E402
import triton.testing  # noqa: E402

from tigon import functional as F  # noqa: E402
from tigon.kernels import group_norm as gn  # noqa: E402
from tigon.kernels import sparsemax as sm  # noqa: E402
from tigon.kernels._common import next_pow2  # noqa: E402

GN_VARIANTS = [  # knobs of tigon.kernels.group_norm ({}: the default)
    {},
    {"GROUP_FWD_WARPS": 8},
    {"GROUP_BWD_CHUNK": 4096, "GROUP_BWD_CHUNK_WARPS": 8},  # session 22's 205.9 us (accumulators)
    {"GROUP_BWD_CHUNK": 16384, "GROUP_BWD_CHUNK_WARPS": 16, "GROUP_BWD_ROW_SUMS": True},
    {"GROUP_BWD_CHUNK": 8192, "GROUP_BWD_CHUNK_WARPS": 8, "GROUP_BWD_ROW_SUMS": True},
    {"GROUP_BWD_CHUNK": 8192, "GROUP_BWD_CHUNK_WARPS": 4, "GROUP_BWD_ROW_SUMS": True},
    {"GROUP_BWD_CHUNK": 4096, "GROUP_BWD_CHUNK_WARPS": 8, "GROUP_BWD_ROW_SUMS": True},
    {"GROUP_BWD_CHUNK": 4096, "GROUP_BWD_CHUNK_WARPS": 4, "GROUP_BWD_ROW_SUMS": True},
]
SM_LAUNCHES = [(1, 2), (1, 4)]  # (rows a program, warps) of the register path; the first is the default
SM_SCALES = (1.0, 10.0)


def timer(rep_ms: int):
    """(median ms of fn) on CUDA as graph replays; on CPU the wall time of one call after one warm-up call."""
    if not CPU:
        def graph(fn, leaves):  # (a list of the quantiles, or one float: Triton 3.6 returns the median alone)
            r = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, grad_to_none=leaves, quantiles=[0.5])
            return r[0] if isinstance(r, (list, tuple)) else r
        return graph

    def wall(fn, leaves):
        fn()
        for t in leaves:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return wall


def copy_ceilings(numel: int) -> dict:
    """copy_gbps as tune.py's ceiling (1 GiB bf16 on CUDA) and copy_graph_gbps of ``numel`` bf16 as graph replays."""
    from tigon.workflows.timing import _copy_ms

    dev = torch.device("cpu" if CPU else "cuda")
    n = (1 << 16) if CPU else (1 << 29)
    out = {"copy_gbps": 4 * n / _copy_ms(n, torch.bfloat16, dev) / 1e6}
    a = torch.randn(numel, device=dev).bfloat16()
    b = torch.empty_like(a)
    out["copy_graph_gbps"] = 4 * numel / timer(50)(lambda: b.copy_(a), []) / 1e6
    return out


def rotating(make, n: int = 2):
    """A callable running ``make``'s call on input sets in turn, and every set's gradient leaves."""
    sets = [make() for _ in range(n)]
    turn = [0]

    def call():
        fn = sets[turn[0] % n][0]
        turn[0] += 1
        fn()
    return call, [t for s in sets for t in s[1]]


def group_norm_rows(res: dict, save, time_ms, B: int, C: int, S: int, G: int) -> None:
    dev = "cpu" if CPU else "cuda"
    nbytes = B * C * S * 2
    res["group_norm"] = {"shape": dict(B=B, C=C, S=S, G=G), "rows": []}

    def make(bwd: bool):
        def one():
            x = (torch.randn(B, C, S, device=dev) * 2 + 0.5).bfloat16().requires_grad_(bwd)
            w = (torch.rand(C, device=dev) + 0.5).bfloat16().requires_grad_(bwd)
            b = torch.randn(C, device=dev).bfloat16().requires_grad_(bwd)
            dy = torch.randn_like(x)
            if bwd:
                return (lambda: F.group_norm(x, w, b, C, G, 1e-5).backward(dy)), [x, w, b]
            return (lambda: F.group_norm(x, w, b, C, G, 1e-5)), []
        return one

    fwd, _ = rotating(make(False))
    fwd_bwd, leaves = rotating(make(True))
    for knobs in GN_VARIANTS:
        if CPU and knobs.get("GROUP_BWD_CHUNK"):  # the tiny groups (4 x 64): chunks scaled down with them
            knobs = dict(knobs, GROUP_BWD_CHUNK=knobs["GROUP_BWD_CHUNK"] * (C // G) * S // 16384)
        with mock.patch.multiple(gn, **knobs) if knobs else _nothing():
            ms_f, ms_fb = time_ms(fwd, []), time_ms(fwd_bwd, leaves)
        row = {"config": knobs or "default", "fwd_ms": ms_f, "fwd_bwd_ms": ms_fb}
        _rate(row, res["copy_gbps"], 2 * nbytes, 5 * nbytes)
        res["group_norm"]["rows"].append(row)
        _print("group_norm", row)
        save()
    if not CPU:
        res["group_norm"]["default_kernels_us"] = kernel_breakdown(fwd_bwd, leaves)
        print("group_norm default fwd + bwd, CUDA us a call by kernel:",
              json.dumps(res["group_norm"]["default_kernels_us"]), flush=True)
        save()


def kernel_breakdown(fn, leaves, calls: int = 5) -> dict:
    """Mean CUDA time (us) a call of each kernel ``fn`` launches (torch.profiler over ``calls`` calls)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for t in leaves:
                t.grad = None
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
            out[e.name[:80]] = out.get(e.name[:80], 0.0) + e.time_range.elapsed_us() / calls
    return {k: round(v, 2) for k, v in out.items()}


def sparsemax_rows(res: dict, save, time_ms, M: int, N: int) -> None:
    dev = "cpu" if CPU else "cuda"
    nbytes = M * N * 2
    res["sparsemax"] = {"shape": dict(M=M, N=N), "rows": []}
    block_n = next_pow2(N)
    for scale in SM_SCALES:
        def make(bwd: bool):
            def one():
                x = (torch.randn(M, N, device=dev) * scale).bfloat16().requires_grad_(bwd)
                dy = torch.randn_like(x)
                if bwd:
                    return (lambda: F.sparsemax(x).backward(dy)), [x]
                return (lambda: F.sparsemax(x)), []
            return one

        fwd, _ = rotating(make(False))
        fwd_bwd, leaves = rotating(make(True))
        for top2 in (False, True):
            for launch in SM_LAUNCHES if scale == 1.0 else SM_LAUNCHES[:1]:
                knobs = {"FWD_CONFIGS": {block_n: launch}, "START_TOP2": top2}
                with mock.patch.multiple(sm, **knobs):
                    ms_f, ms_fb = time_ms(fwd, []), time_ms(fwd_bwd, leaves)
                row = {"config": {"scale": scale, "rows_warps": list(launch), "START_TOP2": top2},
                       "fwd_ms": ms_f, "fwd_bwd_ms": ms_fb}
                _rate(row, res["copy_gbps"], 2 * nbytes, 5 * nbytes)
                res["sparsemax"]["rows"].append(row)
                _print("sparsemax", row)
                save()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _rate(row: dict, copy_gbps: float, fwd_bytes: int, fwd_bwd_bytes: int) -> None:
    for mode, nbytes in (("fwd", fwd_bytes), ("fwd_bwd", fwd_bwd_bytes)):
        gbps = nbytes / row[f"{mode}_ms"] / 1e6
        row[f"{mode}_gbps"] = gbps
        row[f"{mode}_pct_copy"] = 100 * gbps / copy_gbps


def _print(op: str, row: dict) -> None:
    print(f"{op:10s} {json.dumps(row['config']):100s} fwd {row['fwd_ms'] * 1e3:8.1f} us {row['fwd_pct_copy']:5.1f}%"
          f"  fwd+bwd {row['fwd_bwd_ms'] * 1e3:8.1f} us {row['fwd_bwd_pct_copy']:5.1f}%", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file for the results")
    ap.add_argument("--cpu", action="store_true", help="tiny sizes through the Triton interpreter (a smoke run)")
    ap.add_argument("--rep-ms", type=int, default=50, help="do_bench_cudagraph's rep (ms) a timing")
    ap.add_argument("--ops", default="group_norm,sparsemax", help="which of the two ops, comma-separated")
    args = ap.parse_args(argv)
    t0 = time.time()
    torch.manual_seed(0)
    gn_shape = (2, 8, 64, 2) if CPU else (128, 128, 4096, 32)
    sm_shape = (8, 64) if CPU else (16384, 4096)
    res = {"device": "cpu (interpreter)" if CPU else torch.cuda.get_device_name(), "triton": triton.__version__,
           "torch": torch.__version__, "command": "PYTHONPATH=src python3 benchmarks/issue21_tune.py "
           + " ".join(sys.argv[1:] if argv is None else argv)}
    res.update(copy_ceilings(gn_shape[0] * gn_shape[1] * gn_shape[2]))
    print(f"copy {res['copy_gbps']:.0f} GB/s (1 GiB, tune.py's ceiling); same-size copy as graph replays "
          f"{res['copy_graph_gbps']:.0f} GB/s", flush=True)

    def save():
        res["seconds"] = round(time.time() - t0, 1)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1, default=str)

    time_ms = timer(args.rep_ms)
    ops = args.ops.split(",")
    if "group_norm" in ops:
        group_norm_rows(res, save, time_ms, *gn_shape)
    if "sparsemax" in ops:
        sparsemax_rows(res, save, time_ms, *sm_shape)
    save()
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
