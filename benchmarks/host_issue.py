"""The host's issue time per forward + backward of each op and provider on the GPU machine, measured behind a GPU
sleep so that the host never waits on the device: the Python, autograd, allocation and launch cost a host-bound
training step pays per call, free of the kernels' own time and of plain ``do_bench``'s run-to-run spread.

    PYTHONPATH=src python3 benchmarks/host_issue.py --ops rms_norm,swiglu,fused_add_rms_norm \
        --providers eager,tigon,liger,quack --out $OUT/host-ops_h200_<date>.json [--launch-probe]
    LIGER_KERNEL_IMPL=cutedsl PYTHONPATH=src python3 benchmarks/host_issue.py ... --providers liger --out ...

Method: :func:`tigon.workflows.timing.call_cost` (the one ``tigon profile`` uses): groups of calls, each issued
behind a GPU sleep that outlasts it and timed with ``time.perf_counter`` until the last call returns; a group whose
sleep ended first (the host waited: a synchronising call, a full launch queue) is reported as ``waited``. A call is
the op's forward and ``torch.autograd.grad`` with given output gradients, in us, at two sizes: Qwen2.5-0.5B's at
1024 tokens (launch-bound) and Llama-3-8B's at 16384. For Tigon also the synchronising CUDA calls of one step
(:func:`tigon.workflows.timing.sync_points`): none expected.
``--launch-probe``: the host cost of one Triton launch through ``JITFunction.__getitem__`` against a direct call of
the compiled kernel's launcher and against ``tigon.kernels._common.launch`` with ``TIGON_DIRECT_LAUNCH=1`` (its
cached direct path), an empty ``torch.autograd.Function``'s forward + backward, ``torch.empty`` and one ATen op, as
``launch_probe`` in the JSON.
``--modules``: the patched modules, as ``modules`` rows: a one-layer model of each size, bf16, its MLP, input
RMSNorm and whole decoder layer (``layer``: the patched layer's work outside its replaced modules included) called on
(4, tokens / 4, hidden) forward + backward, Hugging Face's (``hf``) against ``tigon.patch``'s
(``tigon``: the default host-bound threshold, ``TIGON_HOST_BOUND_ELEMENTS`` unset; ``tigon_kernels``: threshold 0,
the kernels at every size); run once with and once without ``TIGON_DIRECT_LAUNCH=1`` to see the launcher's share.

    PYTHONPATH=src python3 benchmarks/host_issue.py --ops rms_norm,swiglu --providers eager,tigon --modules \
        --launch-probe --out $OUT/host-modules_h200_<date>.json

``--sizes MODEL:TOKENS,...`` replaces the two sizes (e.g. ``qwen2.5-0.5b:4096``, the fused linear cross-entropy's
host-bound case of issue 28: one call there is a few ms of kernels, where Llama-3-8B's 16384 tokens are ~80 ms a call
and the module rows of ``--modules`` alone ran past 40 s):

    PYTHONPATH=src python3 benchmarks/host_issue.py --ops fused_linear_cross_entropy --providers eager,tigon \
        --sizes qwen2.5-0.5b:4096 --out $OUT/host-flce_qwen-4k_h200_<date>.json
"""

import argparse
import json

import torch

SIZES = (("qwen2.5-0.5b", 1024), ("llama3-8b", 16384))


def issue_us(fn, calls: int) -> tuple[float, bool]:
    """(host us per call of ``fn``, whether the host waited) by :func:`tigon.workflows.timing.call_cost`."""
    from tigon.workflows.timing import call_cost

    c = call_cost(fn, torch.device("cuda"), calls=calls)
    return round(c["host_ms"] * 1e3, 1), c["waited"]


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
    import os

    from tigon.kernels._common import launch

    os.environ["TIGON_DIRECT_LAUNCH"] = "1"
    try:
        launch_tigon = issue_us(lambda: launch(k, (1,), *args, X=True, Y=False, BLOCK=1024, num_warps=4), 100)[0]
    finally:
        del os.environ["TIGON_DIRECT_LAUNCH"]
    return {
        "launch_tigon_direct_us": launch_tigon,
        "triton": triton.__version__, "torch": torch.__version__,
        "launch_jit_us": issue_us(lambda: k[(1,)](*args, X=True, Y=False, BLOCK=1024, num_warps=4), 100)[0],
        "launch_direct_us": issue_us(lambda: ck.run(1, 1, 1, raw(0), ck.function, ck.packed_metadata, None, None,
                                                    None, *full), 100)[0],
        "torch_empty_us": issue_us(lambda: torch.empty(size=(1024, 896), dtype=torch.bfloat16, device=dev), 100)[0],
        "aten_add_us": issue_us(lambda: x.detach().add(1.0), 100)[0],
        "autograd_empty_function_fwd_bwd_us": issue_us(lambda: torch.autograd.grad(Empty.apply(x), (x,), g0), 20)[0],
    }


def module_rows(model: str, tokens: int) -> list[dict]:
    """Host us per forward + backward of a one-layer ``model``'s MLP, input RMSNorm and whole decoder layer (its
    rotary tables given, no mask) at ``tokens`` (batch 4): Hugging Face's, patched (default host-bound threshold) and
    patched with the kernels at every size."""
    import copy
    import os

    import tigon
    from tigon.presets import build_config
    from transformers import AutoModelForCausalLM

    cfg = build_config(model, num_hidden_layers=1)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).to(device="cuda", dtype=torch.bfloat16)
    patched = copy.deepcopy(hf)
    tigon.patch(patched)
    layer_hf, layer_tg = hf.model.layers[0], patched.model.layers[0]
    x = torch.randn(4, tokens // 4, cfg.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    pos = torch.arange(tokens // 4, device="cuda")[None].expand(4, -1)
    emb = hf.model.rotary_emb(x, pos)
    rows = []
    for part in ("mlp", "input_layernorm", "layer"):
        for provider, layer, limit in (("hf", layer_hf, None), ("tigon", layer_tg, None),
                                       ("tigon_kernels", layer_tg, "0")):
            mod = layer if part == "layer" else getattr(layer, part)
            params = [p for p in mod.parameters()]

            def call(mod=mod, part=part):
                out = mod(x, position_embeddings=emb, attention_mask=None) if part == "layer" else mod(x)
                return out[0] if isinstance(out, tuple) else out

            dout = torch.randn_like(call())

            def step():
                torch.autograd.grad(call(), [x, *params], dout)

            if limit is not None:
                os.environ["TIGON_HOST_BOUND_ELEMENTS"] = limit
            try:
                us, waited = issue_us(step, 10 if tokens <= 1024 else 4)
            finally:
                os.environ.pop("TIGON_HOST_BOUND_ELEMENTS", None)
            row = dict(module=part, size=f"{model}:{tokens}", provider=provider, host_fwd_bwd_us=us, waited=waited,
                       direct_launch=os.environ.get("TIGON_DIRECT_LAUNCH", "0"))
            print(row, flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="rms_norm,swiglu,fused_add_rms_norm")
    ap.add_argument("--providers", default="eager,tigon,liger")
    ap.add_argument("--out", required=True)
    ap.add_argument("--launch-probe", action="store_true")
    ap.add_argument("--modules", action="store_true", help="also the patched MLP and RMSNorm against HF's")
    ap.add_argument("--sizes", help="MODEL:TOKENS[,MODEL:TOKENS...] instead of " +
                    ",".join(f"{m}:{t}" for m, t in SIZES))
    args = ap.parse_args(argv)
    sizes = SIZES if not args.sizes else tuple(
        (part.rsplit(":", 1)[0], int(part.rsplit(":", 1)[1])) for part in args.sizes.split(","))
    from tigon import ops
    from tigon.presets import build_config
    from tigon.workflows.bench import op_providers
    from tigon.workflows.model_shapes import shapes_from_config
    from tigon.workflows.timing import sync_points

    dev = torch.device("cuda")
    res = {"device": torch.cuda.get_device_name(), "rows": [], "syncs": {}}
    if args.launch_probe:
        res["launch_probe"] = launch_probe()
        print(res["launch_probe"], flush=True)
    if args.modules:
        res["modules"] = [r for model, tokens in sizes for r in module_rows(model, tokens)]
    for model, tokens in sizes:
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

                    calls = 10 if tokens <= 1024 else 4
                    row["host_fwd_bwd_us"], row["waited"] = issue_us(step, calls)
                    row["host_fwd_us"] = issue_us(lambda: fn(**inputs), calls)[0]
                    if p == "tigon":
                        res["syncs"][f"{op}:{tokens}"] = sync_points(step, dev)
                except Exception as e:  # a peer failing on a shape is recorded, not fatal
                    row["error"] = repr(e)[:200]
                print(row, flush=True)
                res["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
