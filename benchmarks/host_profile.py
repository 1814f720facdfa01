"""Where the host's time goes in one forward + backward of an op, on the GPU machine: cProfile over repeated calls
of Tigon's op and of a peer's, with the device synchronised once at the end (so the host, not the GPU, is timed).

    PYTHONPATH=src python3 benchmarks/host_profile.py --op fused_add_rms_norm --tokens 16384 [--peer liger] \
        [--out $OUT/host-profile-<op>_llama3-8b_h200_<date>.txt]

The complement of ``host_overhead.py`` (which stubs the launches on any machine): this one keeps the real launches,
so Triton's launcher and the CUDA driver are in the profile. Prints the wall time per call and the top functions
by own time.
"""

import argparse
import cProfile
import io
import pstats
import time

import torch

from tigon import ops
from tigon.workflows.bench import op_providers
from tigon.workflows.model_shapes import shapes_from_config
from tigon.presets import build_config


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="fused_add_rms_norm")
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--peer", default="liger", help="a provider of tigon bench to profile beside tigon")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", help="write the report there too")
    args = ap.parse_args(argv)
    spec = ops.get(args.op)
    shape = spec.shape_of(shapes_from_config(build_config(args.model), args.tokens, batch=4)[0])
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = spec.make_inputs(shape, torch.bfloat16, torch.device("cuda"), gen, **spec.bench_inputs)
    leaves = [inputs[k].requires_grad_(True) for k in spec.grad_inputs]
    report = io.StringIO()
    for name in ("tigon", args.peer):
        fn = op_providers(spec).get(name)
        if fn is None:
            continue
        out = fn(**inputs)
        douts = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]

        def step():
            out = fn(**inputs)
            out = list(out) if isinstance(out, tuple) else [out]
            torch.autograd.grad(out, leaves, douts, allow_unused=True)

        for _ in range(20):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            step()
        torch.cuda.synchronize()
        plain = (time.perf_counter() - t0) / args.calls * 1e6
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for _ in range(args.calls):
            step()
        prof.disable()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / args.calls * 1e6
        report.write(f"== {name}: {plain:.1f} us per forward + backward ({wall:.1f} profiled), wall clock over "
                     f"{args.calls} calls, synchronised at the end\n")
        pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(14)
    text = report.getvalue()
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
