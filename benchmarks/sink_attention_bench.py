"""GPT-OSS attention with sinks: transformers' eager attention against Tigon's SDPA with the sink folded into an extra
key (tigon.integrations.sink_attention), forward + backward of one layer at GPT-OSS-20B's shape, on the GPU (issue 20).

    PYTHONPATH=src python3 benchmarks/sink_attention_bench.py --out $OUT/sink-attention_h100_<date>.json

64 query heads, 8 kv heads, head dim 64, 4 x 2048 tokens, bf16; a full-attention layer and a sliding-window one
(128, GPT-OSS-20B's alternate layers). Each side gets the mask transformers builds for it: eager an additive
(B, 1, T, T) mask; the SDPA side what the sdpa mask builder hands over without padding (None for the full layer,
a boolean (B, 1, T, T) window mask for the sliding one). Per layer type: the median ``triton.testing.do_bench`` time
of forward + backward (gradients of q, k, v and the sinks), the peak memory it allocates above its inputs, the
largest output / gradient difference against the eager side, and the SDPA side again with each backend alone
(``torch.nn.attention.sdpa_kernel``: flash, memory-efficient, cuDNN, math; "not eligible" where SDPA refuses), which
says which backend the default call takes. JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import types

import torch
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

from tigon.integrations.sink_attention import attention_forward

B, H, HKV, T, D, WINDOW = 4, 64, 8, 2048, 64, 128


def _inputs(dtype=torch.bfloat16):
    g = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(B, H, T, D, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k, v = (torch.randn(B, HKV, T, D, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(2))
    sinks = torch.randn(H, device="cuda", dtype=dtype, generator=g).requires_grad_()
    grad = torch.randn(B, T, H, D, device="cuda", dtype=dtype, generator=g)
    return q, k, v, sinks, grad


def _keep(window):
    i = torch.arange(T, device="cuda")
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep &= i[:, None] - i[None, :] < window
    return keep.expand(B, 1, T, T)


def _step(fn, q, k, v, sinks, grad):
    out = fn(q, k, v, sinks)
    return out, torch.autograd.grad(out, (q, k, v, sinks), grad)


def _peak(fn, *args) -> int:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _step(fn, *args)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def run_layer(window) -> dict:
    q, k, v, sinks, grad = args = _inputs()
    module = types.SimpleNamespace(num_key_value_groups=H // HKV, training=True, sinks=sinks, is_causal=True)
    keep = _keep(window)
    additive = torch.zeros(keep.shape, device="cuda", dtype=q.dtype).masked_fill(~keep, torch.finfo(q.dtype).min)
    ours_mask = keep if window is not None else None

    def eager(q, k, v, s):
        return eager_attention_forward(module, q, k, v, additive, scaling=D ** -0.5)[0]

    def ours(q, k, v, s):
        return attention_forward(module, q, k, v, ours_mask, scaling=D ** -0.5, sliding_window=window, s_aux=s)[0]

    row = {"layer": "full" if window is None else f"sliding {window}"}
    ref_out, ref_grads = _step(eager, *args)
    out, grads = _step(ours, *args)
    names = ("out", "dq", "dk", "dv", "dsinks")
    row["max_abs_diff"] = {n: (a.float() - b.float()).abs().max().item()
                           for n, a, b in zip(names, (out, *grads), (ref_out, *ref_grads))}
    del ref_out, ref_grads, out, grads
    for name, fn in (("eager", eager), ("sdpa_folded", ours)):
        row[name] = {"fwd_bwd_ms": triton.testing.do_bench(lambda: _step(fn, *args)), "peak_bytes": _peak(fn, *args)}
    row["sdpa_backends"] = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                ms = triton.testing.do_bench(lambda: _step(ours, *args))
            row["sdpa_backends"][backend.name] = {"fwd_bwd_ms": ms}
        except RuntimeError as e:
            row["sdpa_backends"][backend.name] = {"not_eligible": str(e).splitlines()[0][:200]}
    row["speedup"] = row["eager"]["fwd_bwd_ms"] / row["sdpa_folded"]["fwd_bwd_ms"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    a = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "shape": dict(batch=B, heads=H, kv_heads=HKV, tokens=T, head_dim=D, dtype="bfloat16"),
              "layers": [run_layer(None), run_layer(WINDOW)]}
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
