"""The host's issue time per forward + backward of each op and provider on the GPU machine, measured behind a GPU
sleep so that the host never waits on the device: the Python, autograd, allocation and launch cost a host-bound
training step pays per call, free of the kernels' own time and of plain ``do_bench``'s run-to-run spread.

    PYTHONPATH=src python3 benchmarks/host_issue.py --ops rms_norm,swiglu,fused_add_rms_norm \
        --providers eager,tigon,liger,quack --out $OUT/host-ops_h200_<date>.json [--launch-probe]
    LIGER_KERNEL_IMPL=cutedsl PYTHONPATH=src python3 benchmarks/host_issue.py ... --providers liger --out ...

Method: ``torch.cuda._sleep`` (about 0.1 s of GPU cycles) is queued first, then ``--calls`` steps (the op's forward
and ``torch.autograd.grad`` with given output gradients) are issued and timed with ``time.perf_counter``; a round
whose sleep had already ended when the host finished (an event recorded after the sleep has completed: the host
waited, e.g. on a synchronising call) is void and counted in ``void_rounds``. Median of 9 rounds, in us per call,
at two sizes: Qwen2.5-0.5B's at 1024 tokens (launch-bound) and Llama-3-8B's at 16384. Also, for Tigon, the
synchronising CUDA calls of one step (``torch.cuda.set_sync_debug_mode("warn")``): none expected.
``--launch-probe``: the host cost of one Triton launch through ``JITFunction.__getitem__`` against a direct call of
the compiled kernel's launcher, an empty ``torch.autograd.Function``'s forward + backward, ``torch.empty`` and
one ATen op, as ``launch_probe`` in the JSON.
"""

import argparse
import json
import statistics
import time
import warnings

import torch

SIZES = (("qwen2.5-0.5b", 1024), ("llama3-8b", 16384))


def issue_us(fn, calls: int, rounds: int = 9, sleep_cycles: int = 200_000_000) -> tuple[float | None, int]:
    """(median host time per call in us over the valid rounds, void rounds) of ``calls`` calls of ``fn`` issued
    behind a GPU sleep."""
    samples = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        torch.cuda._sleep(sleep_cycles)
        done = torch.cuda.Event()
        done.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = (time.perf_counter() - t0) / calls * 1e6
        samples.append(None if done.query() else dt)  # the sleep ended first: the host waited, the round is void
        torch.cuda.synchronize()
    ok = [s for s in samples if s is not None]
    return (round(statistics.median(ok), 1) if ok else None), len(samples) - len(ok)


def launch_probe() -> dict:
    """Host cost (us) of one Triton launch two ways, and of the pieces every op's call pays."""
    import triton
    import triton.language as tl

    @triton.jit
    def k(a, b, c, d, e, f, M, N, s1, s2, s3, s4, eps, off, X: tl.constexpr, Y: tl.constexpr, BLOCK: tl.constexpr):
        if tl.program_id(0) < 0:
            tl.store(a + M, tl.load(b + N) + eps)

    dev = torch.device("cuda")
    ts = [torch.empty(4096, device=dev) for _ in range(6)]
    args = (*ts, 4096, 896, 896, 896, 896, 896, 1e-6, 0.0)
    ck = k[(1,)](*args, X=True, Y=False, BLOCK=1024, num_warps=4)
    raw = torch._C._cuda_getCurrentRawStream
    full = (*args, True, False, 1024)  # the launcher takes every parameter, constexprs included (triton 3.6)

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.empty(size=x.shape, dtype=x.dtype, device=x.device)

        @staticmethod
        def backward(ctx, g):
            return torch.empty(size=g.shape, dtype=g.dtype, device=g.device)

    x = torch.randn(1024, 896, device=dev, requires_grad=True)
    g0 = torch.randn(1024, 896, device=dev)
    return {
        "triton": triton.__version__, "torch": torch.__version__,
        "launch_jit_us": issue_us(lambda: k[(1,)](*args, X=True, Y=False, BLOCK=1024, num_warps=4), 400)[0],
        "launch_direct_us": issue_us(lambda: ck.run(1, 1, 1, raw(0), ck.function, ck.packed_metadata, None, None,
                                                    None, *full), 400)[0],
        "torch_empty_us": issue_us(lambda: torch.empty(size=(1024, 896), dtype=torch.bfloat16, device=dev), 400)[0],
        "aten_add_us": issue_us(lambda: x.detach().add(1.0), 400)[0],
        "autograd_empty_function_fwd_bwd_us": issue_us(lambda: torch.autograd.grad(Empty.apply(x), (x,), g0), 100)[0],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="rms_norm,swiglu,fused_add_rms_norm")
    ap.add_argument("--providers", default="eager,tigon,liger")
    ap.add_argument("--out", required=True)
    ap.add_argument("--launch-probe", action="store_true")
    args = ap.parse_args(argv)
    from tigon import ops
    from tigon.presets import build_config
    from tigon.workflows.bench import op_providers
    from tigon.workflows.model_shapes import shapes_from_config

    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "rows": [], "syncs": {}}
    if args.launch_probe:
        res["launch_probe"] = launch_probe()
        print(res["launch_probe"], flush=True)
    for model, tokens in SIZES:
        shapes = shapes_from_config(build_config(model), tokens, batch=4)[0]
        for op in args.ops.split(","):
            spec = ops.get(op)
            gen = torch.Generator(device="cuda").manual_seed(0)
            inputs = spec.make_inputs(spec.shape_of(shapes), torch.bfloat16, dev, gen, **spec.bench_inputs)
            leaves = [inputs[k].requires_grad_(True) for k in spec.grad_inputs]
            providers = op_providers(spec)
            for p in args.providers.split(","):
                fn = providers.get(p)
                if fn is None:
                    continue

                def diff(o):
                    return [t for t in (o if isinstance(o, tuple) else (o,)) if isinstance(t, torch.Tensor)
                            and t.requires_grad]

                row = dict(op=op, size=f"{model}:{tokens}", provider=p)
                try:
                    douts = [torch.randn_like(o) for o in diff(fn(**inputs))]

                    def step():
                        torch.autograd.grad(diff(fn(**inputs)), leaves, douts, allow_unused=True)

                    for _ in range(10):
                        step()
                    calls = 40 if tokens <= 1024 else 20
                    row["host_fwd_bwd_us"], row["void_rounds"] = issue_us(step, calls)
                    row["host_fwd_us"] = issue_us(lambda: fn(**inputs), calls)[0]
                    if p == "tigon":
                        torch.cuda.synchronize()
                        torch.cuda.set_sync_debug_mode("warn")
                        with warnings.catch_warnings(record=True) as w:
                            warnings.simplefilter("always")
                            step()
                        torch.cuda.set_sync_debug_mode(0)
                        res["syncs"][f"{op}:{tokens}"] = [str(x.message)[:200] for x in w
                                                          if "synchroniz" in str(x.message)]
                except Exception as e:  # a peer failing on a shape is recorded, not fatal
                    row["error"] = repr(e)[:200]
                print(row, flush=True)
                res["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
