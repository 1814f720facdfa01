"""A vision tower's training step (fwd + bwd) with transformers' per-chunk attention and with Tigon's length-batched
varlen attention (:mod:`tigon.integrations.varlen_attention`): attention calls, PyTorch operator calls and time.

    PYTHONPATH=src python3 benchmarks/varlen_attention_bench.py --out vl.json                  # the GPU: real shapes
    PYTHONPATH=src python3 benchmarks/varlen_attention_bench.py --hidden 64 --heads 2 --out vl.json   # CPU proxy

The tower is the preset's (default Qwen2.5-VL-7B: 32 blocks, windows of 8 x 8 patches, full attention in 4 blocks)
fed the images of ``tigon.workflows.multimodal.with_images`` (``--batch`` samples of ``--image-tokens`` tokens: 4 x
512 gives 44 x 46-patch images, 36 windows of four sizes each). ``--hidden`` / ``--heads`` shrink the tower's width
(the chunk structure, hence the calls, stays): on the CPU that makes the step's time mostly host time, the part the
patch changes. Times are medians of ``--reps`` steps (``triton.testing.do_bench`` on CUDA). Rows: ``calls_sdpa``
(``scaled_dot_product_attention`` calls a step), ``aten_ops`` (operators dispatched a step, forward and backward),
``step_ms``, and the largest difference of the tower's output from transformers'.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tigon
from tigon import presets
from tigon.workflows import multimodal


class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def tower(preset: str, hidden: int | None, heads: int | None, dtype, device):
    cfg = presets.build_config(preset)
    v = cfg.vision_config
    if hidden:
        v.hidden_size, v.intermediate_size = hidden, 2 * hidden
        v.num_heads = heads or max(1, hidden // 64)
        if hasattr(v, "out_hidden_size"):
            v.out_hidden_size = hidden
    text = getattr(cfg, "text_config", cfg)  # the text tower is not run: built one tiny layer deep
    text.num_hidden_layers, text.hidden_size, text.intermediate_size, text.vocab_size = 1, 64, 128, 1024
    text.num_attention_heads, text.num_key_value_heads = 2, 1
    if hasattr(text, "head_dim"):
        text.head_dim = 32
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = multimodal.auto_class(cfg).from_config(cfg)
    visual = model.model.visual.to(device=device, dtype=dtype).train()
    return cfg, model, visual


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen2.5-vl-7b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--image-tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=None, help="shrink the tower's width (CPU proxy)")
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    cfg, model, visual = tower(a.preset, a.hidden, a.heads, dtype, device)
    ids = torch.randint(0, 1000, (a.batch, 4 * a.image_tokens))
    batch = multimodal.with_images(ids, cfg, image_tokens=a.image_tokens)
    pixels = batch["pixel_values"].to(device=device, dtype=dtype)
    grid = batch["image_grid_thw"].to(device)

    def step():
        out = visual(pixels, grid_thw=grid)
        out = getattr(out, "pooler_output", out)
        out.float().square().mean().backward()
        return out.detach()

    def measure(name):
        calls = [0]
        real = torch.nn.functional.scaled_dot_product_attention

        def counted(*args, **kwargs):
            calls[0] += 1
            return real(*args, **kwargs)
        torch.nn.functional.scaled_dot_product_attention = counted
        try:
            out = step()
        finally:
            torch.nn.functional.scaled_dot_product_attention = real
        with _Count() as count:
            step()
        if device.type == "cuda":
            import triton.testing
            ms = triton.testing.do_bench(step, warmup=2, rep=max(50, 20 * a.reps))
        else:
            times = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(times)
        row = {"calls_sdpa": calls[0], "aten_ops": count.ops, "step_ms": ms}
        print(f"{name:10s} sdpa calls {calls[0]:6d}  aten ops {count.ops:7d}  step {ms:9.2f} ms", flush=True)
        return row, out

    rows = {}
    rows["hf"], want = measure("hf")
    report = tigon.patch(model, rms_norm=False, layer_norm=False, mlp=False, rope=False, fused_add_rms_norm=False,
                         fused_linear_cross_entropy=False)
    assert report.counts.get("vision_attention"), str(report)
    rows["tigon"], got = measure("tigon")
    rows["tigon"]["max_abs_diff_vs_hf"] = (got.float() - want.float()).abs().max().item()
    rows["tigon"]["speedup"] = rows["hf"]["step_ms"] / rows["tigon"]["step_ms"]
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "preset": a.preset,
              "dtype": str(dtype).replace("torch.", ""), "batch": a.batch, "image_tokens": a.image_tokens,
              "grid_thw": grid.tolist(), "hidden": cfg.vision_config.hidden_size,
              "heads": cfg.vision_config.num_heads, "depth": cfg.vision_config.depth, "rows": rows,
              "torch": torch.__version__}
    print(f"speedup {rows['tigon']['speedup']:.2f}x, max |diff| {rows['tigon']['max_abs_diff_vs_hf']:.3g}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
