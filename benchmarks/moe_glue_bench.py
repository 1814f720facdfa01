"""One MoE layer's routed experts, forward + backward: transformers' grouped_mm experts against Tigon's glue around
the same grouped matmuls (tigon.integrations.moe_experts), at OLMoE-1B-7B's and GPT-OSS-20B's shapes, on the GPU.

    PYTHONPATH=src python3 benchmarks/moe_glue_bench.py --out $OUT/moe-glue_h100_<date>.json

One experts module of each model (its class from transformers, built from ``benchmarks/configs/<model>``, random
weights, ``config._experts_implementation = "grouped_mm"``), 8192 tokens routed to the config's top-k experts by random
router logits (softmax weights of the top k), bf16. Providers: ``hf`` (transformers' ``grouped_mm_experts_forward``,
unpatched), ``tigon_gate`` (today's patch: only the ``_apply_gate`` hook is Tigon's) and ``tigon_glue`` (the whole
experts forward: moe_gather, moe_expert_gate, moe_combine around transformers' ``_grouped_linear``). Per provider: the
median ``triton.testing.do_bench`` time of the forward and of forward + backward (gradients of the hidden states, the
routing weights and every expert parameter), the peak memory allocated above the inputs by forward + backward, and
the largest difference of the output and of each gradient against ``hf``. ``glue_min_bytes``: the glue ops' minimal
traffic per forward + backward from their records (the floor the three kernels approach). JSON to ``--out``.

``--tiny --device cpu`` runs the same on a tiny shape on the CPU (Triton's interpreter; the tests run it), timed
with ``time.perf_counter``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

CONFIGS = Path(__file__).resolve().parent / "configs"
MODELS = ("olmoe-1b-7b", "gpt-oss-20b")
PROVIDERS = ("hf", "tigon_gate", "tigon_glue")
TINY = {"hidden_size": 48, "intermediate_size": 24, "moe_intermediate_size": 24, "num_experts": 6,
        "num_local_experts": 6, "num_experts_per_tok": 2}


def experts_module(name: str, dtype, device, tiny: bool):
    """The model's experts module (one layer), its family spec and config."""
    import transformers

    from tigon.integrations.families import family_by_name

    raw = json.loads((CONFIGS / name / "config.json").read_text())
    if tiny:
        raw.update({k: v for k, v in TINY.items() if k in raw or k == "num_experts_per_tok"})
    config = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    config._experts_implementation = "grouped_mm"
    spec = family_by_name(config.model_type)
    mlp = next(m for m in spec.mlps if m.experts)
    cls = getattr(__import__(spec.module, fromlist=[mlp.cls]), mlp.cls)
    torch.manual_seed(0)
    module = cls(config).to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.02)
    return module, config


def inputs(config, tokens: int, dtype, device, experts: int):
    gen = torch.Generator(device=device).manual_seed(1)
    k = config.num_experts_per_tok
    hidden = torch.randn(tokens, config.hidden_size, generator=gen, device=device, dtype=dtype)
    logits = torch.randn(tokens, experts, generator=gen, device=device)
    weights, index = torch.topk(logits.softmax(-1), k, dim=-1)
    grad = torch.randn(tokens, config.hidden_size, generator=gen, device=device, dtype=dtype)
    return hidden.requires_grad_(), index, weights.to(dtype).requires_grad_(), grad


def provider(module, name: str):
    """Patch ``module`` as provider ``name`` wants it (tigon.patch of a container; ``tigon_gate`` keeps only the
    _apply_gate hook), returning the patch report's detail of the experts entry."""
    import tigon

    tigon.unpatch(torch.nn.ModuleList([module]))
    if name == "hf":
        return "unpatched"
    report = tigon.patch(torch.nn.ModuleList([module]), rms_norm=False, rope=False, fused_add_rms_norm=False,
                         fused_linear_cross_entropy=False, sinks=False, lora=False)
    entry = next((e for e in report.replaced if e.kind == "mlp"), None)
    if entry is None:
        return f"not patched: {report}"
    if name == "tigon_gate":
        module.__dict__.pop("forward", None)
        return "the class's forward (transformers' grouped_mm experts); " + entry.detail.rpartition("; ")[2]
    return entry.detail


def fwd_bwd(module, hidden, index, weights, grad):
    out = module(hidden, index, weights)
    return out, torch.autograd.grad(out, [hidden, weights, *module.parameters()], grad)


def timed(fn, device) -> float:
    """Median milliseconds: triton.testing.do_bench on CUDA, else perf_counter over a few calls."""
    if device.type == "cuda":
        import triton

        return triton.testing.do_bench(fn, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak(fn, device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def glue_bytes(config, tokens: int, element: int) -> float:
    """The three glue ops' minimal bytes of one forward + backward (their records' min_bytes)."""
    from tigon import ops

    shape = {"tokens": tokens, "hidden": config.hidden_size, "top_k": config.num_experts_per_tok,
             "intermediate": getattr(config, "moe_intermediate_size", None) or config.intermediate_size,
             "experts": 0}
    return sum(ops.get(n).bytes_moved(shape, element, "fwd_bwd") for n in ("moe_gather", "moe_expert_gate",
                                                                          "moe_combine"))


def run_model(name: str, tokens: int, dtype, device, tiny: bool) -> dict:
    module, config = experts_module(name, dtype, device, tiny)
    args = inputs(config, tokens, dtype, device, module.num_experts)
    row = {"model": name, "tokens": tokens, "hidden": config.hidden_size, "experts": module.num_experts,
           "top_k": config.num_experts_per_tok, "glue_min_bytes": glue_bytes(config, tokens, args[0].element_size()),
           "providers": {}}
    ref = None
    for p in PROVIDERS:
        detail = provider(module, p)
        out, grads = fwd_bwd(module, *args)
        got = [out.detach(), *grads]
        if ref is None:
            ref = got
        res = {"detail": detail,
               "fwd_ms": timed(lambda: module(*args[:3]), device),
               "fwd_bwd_ms": timed(lambda: fwd_bwd(module, *args), device),
               "peak_bytes": peak(lambda: fwd_bwd(module, *args), device),
               "max_abs_diff_vs_hf": max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref))}
        row["providers"][p] = res
    base = row["providers"]["hf"]["fwd_bwd_ms"]
    row["speedup_fwd_bwd"] = {p: base / r["fwd_bwd_ms"] for p, r in row["providers"].items()}
    provider(module, "hf")
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated configs ({', '.join(MODELS)})")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny experts (a CPU check of the script)")
    ap.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")
    dtype = getattr(torch, a.dtype)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
              "dtype": a.dtype, "models": [run_model(m, a.tokens, dtype, device, a.tiny) for m in a.models.split(",")]}
    import transformers

    result["transformers"] = transformers.__version__
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
