"""The gated RMSNorm with groups of statistics and either gate order (``tigon.functional.rms_norm_gated``'s
``group_size`` and ``norm_before_gate``: Falcon-H1's and Mamba-2's Mamba norm), which ``tigon bench`` does not
reach (its rms_norm_gated shape is the model's hidden size, one group): fwd+bwd time per group count and gate order
for tigon, the reference in eager PyTorch and under torch.compile, on one (tokens, width) shape.

    PYTHONPATH=src python3 benchmarks/gated_norm_groups.py --out $OUT/gated-norm-groups_8192x8192_h200_<date>.json

CUDA-graph replays (``tigon.workflows.timing.time_call``, as ``tigon bench --cuda-graph``); GB/s from the minimal
bytes, 8 * tokens * width * element size (forward: read x and gate, write y; backward: read x, gate and dy, write dx
and d_gate). On the CPU (Triton's interpreter, no compile) it runs a tiny shape, to check the script.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192, help="rows (default 8192; 64 on CPU)")
    ap.add_argument("--width", type=int, default=8192, help="the norm's width (default 8192: Mamba-2's d_inner at "
                                                            "hidden 4096; 64 on CPU)")
    ap.add_argument("--groups", default="1,2,8", help="group counts, comma-separated (each divides --width)")
    ap.add_argument("--casting-mode", default="gemma", choices=("llama", "gemma"),
                    help="gemma: Falcon-H1's (default); llama: Mamba-2's")
    ap.add_argument("--out", help="JSON to write (rows: groups, norm_before_gate, provider, ms, gbps)")
    args = ap.parse_args(argv)

    import torch

    from tigon import functional as F
    from tigon.reference.rms_norm import rms_norm_gated as ref
    from tigon.workflows.timing import time_call

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    tokens, width = (args.tokens, args.width) if cuda else (64, 64)
    providers = {"tigon": F.rms_norm_gated, "eager": ref}
    if cuda:
        providers["compile"] = torch.compile(ref, dynamic=False)
    rows = []
    for groups in (int(g) for g in args.groups.split(",")):
        for before in (True, False):
            x, gate = (torch.randn(tokens, width, device=dev, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(2))
            weight = torch.rand(width, device=dev, dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn_like(x)
            for name, fn in providers.items():
                def step(fn=fn):
                    fn(x, gate, weight, 1e-6, 0.0, args.casting_mode, width // groups, before).backward(dy)

                ms = time_call(step, dev, grad_to_none=[x, gate, weight], cuda_graph=cuda)[0]
                gbps = 8 * tokens * width * 2 / ms / 1e6
                rows.append(dict(groups=groups, norm_before_gate=before, provider=name, ms=ms, gbps=gbps))
                print(f"groups={groups} norm_before_gate={before} {name:8s} {ms:8.3f} ms fwd+bwd {gbps:7.0f} GB/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(tokens=tokens, width=width, dtype="bfloat16", casting_mode=args.casting_mode,
                           device=torch.cuda.get_device_name() if cuda else "cpu", rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
