"""Session 29's diagnosis of GPT-OSS's bf16 loss difference (run from the repository root on a CPU):

    PYTHONPATH=src:tests python3 benchmarks/results/cpu/session29/gpt_oss_bf16_routing.py

The tests' tiny GPT-OSS (tests/model_matrix.py), one training step's loss in bf16: the original, the original with its
eager attention computed in fp32 (more accurate), and Tigon with only the sink attention patched; against float64.
Each moves the loss by the same amount when the attention's rounding changes: a token's top-k routing flips."""

import torch

import test_moe_experts as t
import tigon
from transformers.models.gpt_oss import modeling_gpt_oss as mg

base = t.build("gpt_oss")
exact = t.build("gpt_oss", experts="batched_mm")
exact.load_state_dict(base.state_dict())
print("float64", float(t.step(exact.double())[0]))
m = t.build("gpt_oss")
m.load_state_dict(base.state_dict())
m = m.bfloat16()
print("original bf16", float(t.step(m)[0]))
sinks = t.build("gpt_oss")
sinks.load_state_dict(base.state_dict())
sinks = sinks.bfloat16()
tigon.patch(sinks, rms_norm=False, rope=False, fused_add_rms_norm=False, fused_linear_cross_entropy=False, mlp=False)
print("Tigon, sink attention only, bf16", float(t.step(sinks)[0]))
eager = mg.eager_attention_forward


def fp32_eager(module, q, k, v, mask, **kw):
    kw["s_aux"] = kw["s_aux"].float() if kw.get("s_aux") is not None else None
    out, _ = eager(module, q.float(), k.float(), v.float(), None if mask is None else mask.float(), **kw)
    return out.to(q.dtype), None


mg.eager_attention_forward = fp32_eager
print("original bf16, its attention in fp32", float(t.step(m)[0]))
