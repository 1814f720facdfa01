"""Session 20 diagnostic (issue 28): does a patched, compiled Llama-3.2-1B (2 layers, 4 x 2048, bf16) get sdpa's
is_causal path? Prints the patch report's causal-mask note, whether transformers' check is wrapped, and the GPU time
of the attention kernels in one compiled forward + backward (torch.profiler), by kernel name.

    PYTHONPATH=src python3 benchmarks/results/h100/session20/causal_diag.py [--original]
"""
import sys

import torch
import transformers
from torch.profiler import ProfilerActivity, profile

import tigon
from tigon import presets

original = "--original" in sys.argv
torch.manual_seed(0)
config = presets.build_config("llama3.2-1b", 2)
config._attn_implementation = "sdpa"
model = transformers.AutoModelForCausalLM.from_config(config).to("cuda", torch.bfloat16)
if not original:
    report = tigon.patch(model)
    print("note:", [n for n in report.notes if "causal" in n])
from transformers import masking_utils

fn = masking_utils._ignore_causal_mask_sdpa
print("wrapped:", hasattr(fn, "__wrapped__"), fn.__qualname__)
compiled = torch.compile(model)
ids = torch.randint(0, config.vocab_size, (4, 2048), device="cuda")
for _ in range(3):
    compiled(input_ids=ids, labels=ids).loss.backward()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    compiled(input_ids=ids, labels=ids).loss.backward()
    torch.cuda.synchronize()
rows = {}
for e in prof.key_averages():
    if e.device_type.name == "CUDA" and any(
            k in e.key.lower() for k in ("attn", "attention", "fmha", "flash", "sdpa", "cudnn")):
        rows[e.key[:110]] = (e.count, e.self_device_time_total / 1e3)
for k, (n, ms) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
    print(f"{ms:8.3f} ms  x{n:3d}  {k}")
print("total attention ms:", round(sum(ms for _, ms in rows.values()), 3), "(original)" if original else "(patched)")
