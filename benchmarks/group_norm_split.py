"""group_norm's split path (groups larger than a tile) on CUDA: fwd + bwd time against torch eager and the copy
floor, and each kernel's device time, at large-group shapes.

    PYTHONPATH=src python3 benchmarks/group_norm_split.py [--out PATH]

Per shape (bf16, weight and bias): Tigon's fwd + bwd (``triton.testing.do_bench``, ms), the same with the group
split forced where it would fit one launch (FUSED_GROUP 0), torch eager, and the split path's minimum (8 passes of
the tensor's bytes: forward 3, backward 5) at the measured device-to-device copy bandwidth; then torch.profiler's
per-kernel CUDA time of three Tigon calls (split path). ``--out`` also writes the times as JSON.
"""

import argparse
import json

import torch
import triton
from torch.profiler import ProfilerActivity, profile

from tigon import functional as F
from tigon.kernels import group_norm as k

SHAPES = [  # (B, C, S, G): the group's elements
    (1, 4, 1 << 20, 1),  # 1 group of 2^22
    (1, 128, 1 << 17, 32),  # 32 groups of 2^19
    (128, 128, 4096, 1),  # 128 groups of 2^19 (TIGON_BENCH_GROUP_NORM_GROUPS=1's bench shape)
    (128, 128, 4096, 32),  # 4096 groups of 4 x 4096: one launch a direction, and forced split
]


def copy_gbps() -> float:
    a = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a))
    return 2 * a.numel() / ms / 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON file for the times (ms) per shape")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    bw = copy_gbps()
    print(f"copy bandwidth {bw:.0f} GB/s")
    rows = []
    for B, C, S, G in SHAPES:
        x = torch.randn(B, C, S, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.rand(C, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_()
        b = torch.randn(C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x)

        def tigon():
            F.group_norm(x, w, b, C, G, 1e-5).backward(dy)

        def eager():
            torch.nn.functional.group_norm(x, G, w, b, 1e-5).backward(dy)

        times = {}
        for name, fn in (("tigon", tigon), ("eager", eager)):
            times[name] = triton.testing.do_bench(fn, grad_to_none=[x, w, b])
        saved = k.FUSED_GROUP
        k.FUSED_GROUP = 0
        times["tigon_split"] = triton.testing.do_bench(tigon, grad_to_none=[x, w, b])
        k.FUSED_GROUP = saved
        floor = 8 * x.numel() * x.element_size() / bw / 1e6
        rows.append(dict(B=B, C=C, S=S, G=G, **{f"{n}_ms": t for n, t in times.items()}, split_floor_ms=floor))
        print(f"B{B} C{C} S{S} G{G} (groups of {C // G * S}): " + ", ".join(f"{n} {t:.3f} ms" for n, t in
                                                                             times.items())
              + f"; split floor {floor:.3f} ms")
        k.FUSED_GROUP = 0
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                tigon()
            torch.cuda.synchronize()
        k.FUSED_GROUP = saved
        print(p.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=50))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"copy_gbps": bw, "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
