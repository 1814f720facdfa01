"""The generic matcher: probes that accept exactly the modules Tigon reproduces, and report the rest.

Most cases use a toy decoder defined here (no transformers): its norms / MLPs take their variant per instance, so one
model holds modules that must be accepted next to modules that must be rejected. Its rotary function is a module
global of a generated module, once rotate-half and once interleaved.
"""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch
import torch.nn.functional as F

import tigon
from tigon import support
from tigon.integrations import generic
from tigon.integrations.engine import patched_state, release_unused
from tigon.integrations.marks import tigon_mark
from tigon.numerics import rel_l2

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

TOY_SOURCE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rotate_pairs(x):
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    if INTERLEAVED:  # GLM-style: pairs of neighbours, cos/sin repeated per pair
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
        return q * cos + rotate_pairs(q) * sin, k * cos + rotate_pairs(k) * sin
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class ToyNorm(nn.Module):
    def __init__(self, dim, kind="llama", eps=1e-6):
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.zeros(dim) if kind == "gemma" else torch.ones(dim))
        self.variance_epsilon = eps

    def forward(self, x):
        xf = x.float()
        if self.kind == "centered":  # a LayerNorm without bias (Cohere-like): not an RMSNorm
            xf = xf - xf.mean(-1, keepdim=True)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        if self.kind == "gemma":
            return (y * (1.0 + self.weight.float())).type_as(x)
        if self.kind == "olmo":
            return (self.weight * y).to(x.dtype)
        return self.weight * y.to(x.dtype)


class ToyMLP(nn.Module):
    def __init__(self, dim, inner, act="silu", fused=False, scale=1.0, limit=None):
        super().__init__()
        self.fused, self.scale, self.limit = fused, scale, limit
        if fused:
            self.gate_up_proj = nn.Linear(dim, 2 * inner, bias=False)
        else:
            self.gate_proj = nn.Linear(dim, inner, bias=False)
            self.up_proj = nn.Linear(dim, inner, bias=False)
        self.down_proj = nn.Linear(inner, dim, bias=False)
        self.act_fn = {"silu": nn.SiLU(), "gelu_tanh": nn.GELU(approximate="tanh"), "gelu": nn.GELU(),
                       "relu": nn.ReLU()}[act]

    def forward(self, x):
        if self.fused:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        if self.limit is not None:  # DeepSeek-V4's swiglu_limit: gate clamped from above, up both ways
            gate, up = gate.clamp(max=self.limit), up.clamp(-self.limit, self.limit)
        return self.down_proj(self.act_fn(gate) * up) * self.scale


class ToyAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.v_proj, self.o_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        shape = (B, T, self.heads, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class ToyBlock(nn.Module):
    def __init__(self, dim, heads, norm, mlp):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = ToyNorm(dim, norm), ToyNorm(dim, norm)
        self.self_attn = ToyAttention(dim, heads)
        self.mlp = ToyMLP(dim, 2 * dim, **mlp)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class ToyLM(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=2, norms=("llama", "llama"), mlps=({}, {})):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(ToyBlock(dim, heads, n, m) for n, m in zip(norms, mlps))
        self.norm = ToyNorm(dim, norms[-1])
        self.head = nn.Linear(dim, vocab, bias=False)
        d = dim // heads
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))

    def forward(self, ids):
        x = self.embed(ids)
        freqs = torch.arange(ids.shape[1], device=ids.device).float()[:, None] * self.inv_freq.to(ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)[None]
        for layer in self.layers:
            x = layer(x, emb.cos(), emb.sin())
        return self.head(self.norm(x))
'''


def toy_module(name: str, interleaved: bool) -> types.ModuleType:
    if name not in sys.modules:
        mod = types.ModuleType(name)
        mod.INTERLEAVED = interleaved
        exec(compile(TOY_SOURCE, f"<{name}>", "exec"), mod.__dict__)
        sys.modules[name] = mod
    return sys.modules[name]


TOY = toy_module("tigon_toy_rotate_half", interleaved=False)
TOY_INTERLEAVED = toy_module("tigon_toy_interleaved", interleaved=True)


def toy(mod=TOY, seed=0, **kwargs):
    torch.manual_seed(seed)
    model = mod.ToyLM(**kwargs).to(DEVICE)
    with torch.no_grad():  # non-trivial norm weights, so offsets and casting differ visibly
        for m in model.modules():
            if isinstance(m, mod.ToyNorm):
                m.weight.add_(0.1 * torch.randn_like(m.weight))
    return model


def loss_and_grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(ids)
    loss = F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def assert_same_step(model, **patch_kwargs):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(7)).to(DEVICE)
    ref, ref_grads = loss_and_grads(model, ids)
    report = tigon.patch(model, **patch_kwargs)
    try:
        support.backend_usage(reset=True)
        loss, grads = loss_and_grads(model, ids)
        used = support.backend_usage()
    finally:
        tigon.unpatch(model)
    assert abs(loss.item() - ref.item()) <= 1e-5 * abs(ref.item())
    assert max(rel_l2(grads[n], ref_grads[n]) for n in ref_grads) < 1e-4
    return report, used


@pytest.fixture(autouse=True)
def _release():
    yield
    if patched_state()["rope_dispatchers"]:  # a dropped patched model's; collecting costs up to ~1 s (CI time)
        gc.collect()
        release_unused()
    for mod in (TOY, TOY_INTERLEAVED):
        assert tigon_mark(mod.apply_rotary_pos_emb) is None, "the rotary global must be put back"


def test_toy_decoder_patched_generically():
    model = toy()
    report, used = assert_same_step(model)
    assert report.family == "generic" and report.level == "instance" and not report.skipped
    assert report.counts == {"rms_norm": 5, "mlp": 2, "rope": 2}
    assert {"rms_norm", "glu_linear", "rope"} <= set(used)
    details = {e.target: e.detail for e in report.replaced}
    assert "casting_mode='llama', offset=0" in details["norm"]
    assert "tigon.functional.swiglu" in details["layers.0.mlp"]


@pytest.mark.parametrize("kind,mode,offset", [("llama", "llama", 0), ("gemma", "gemma", 1), ("olmo", "gemma", 0)])
def test_norm_offset_and_casting_are_probed(kind, mode, offset):
    model = toy(norms=(kind, kind))
    report, _ = assert_same_step(model)
    detail = next(e.detail for e in report.replaced if e.target == "norm")
    assert f"casting_mode={mode!r}, offset={offset}" in detail
    # the casting mode decides the bf16 behaviour: the patched norm reproduces it exactly in bf16 too
    spec = generic.probe_norm(model.norm.to(torch.bfloat16), "variance_epsilon")
    assert (spec.casting_mode, spec.offset) == (mode, offset)


def test_rejected_norms_and_mlps_are_reported_and_left_alone():
    model = toy(norms=("centered", "llama"),
                mlps=({"act": "relu"}, {"act": "silu", "scale": 2.0}))
    report, _ = assert_same_step(model)
    skipped = {e.target: e.detail for e in report.skipped}
    assert "output differs from rms_norm" in skipped["layers.0.input_layernorm"]
    assert "not down(act(gate(x)) * up(x))" in skipped["layers.0.mlp"]  # relu: no kernel
    assert "not down(act(gate(x)) * up(x))" in skipped["layers.1.mlp"]  # extra scale after down_proj
    assert report.counts == {"rms_norm": 3, "rope": 2}
    with pytest.raises(ValueError, match="strict=True"):
        tigon.patch(model, strict=True)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_clamped_mlp_is_refused_though_unit_inputs_never_reach_the_clamp():
    # DeepSeek-V4's MLP clamps gate and up at swiglu_limit (10): on unit-variance probe inputs it equals plain SwiGLU,
    # so a probe there alone would patch it and change its output wherever training drives a projection past 10
    model = toy(mlps=({"act": "silu", "limit": 10.0}, {"act": "silu"}))
    report, _ = assert_same_step(model)
    skipped = {e.target: e.detail for e in report.skipped}
    assert "not down(act(gate(x)) * up(x))" in skipped["layers.0.mlp"], skipped
    assert "layers.1.mlp" in {e.target for e in report.replaced}


@pytest.mark.parametrize("act,op", [("gelu_tanh", "geglu(approximate='tanh')"), ("gelu", "geglu(approximate='none')")])
def test_gelu_variants_and_fused_gate_up(act, op):
    model = toy(mlps=({"act": act}, {"act": act, "fused": True}))
    report, used = assert_same_step(model)
    details = {e.target: e.detail for e in report.replaced}
    assert op in details["layers.0.mlp"]
    assert op in details["layers.1.mlp"] and "gate_up_proj(x).chunk(2, -1)" in details["layers.1.mlp"]
    assert "glu_linear" in used


def test_interleaved_rotary_is_rejected_by_the_probe():
    model = toy(TOY_INTERLEAVED)
    report, used = assert_same_step(model)
    assert report.skipped_counts == {"rope": 1}
    assert report.skipped[0].target == "tigon_toy_interleaved.apply_rotary_pos_emb"
    assert "not rotate-half" in report.skipped[0].detail
    assert "rope" not in used and report.counts == {"rms_norm": 5, "mlp": 2}


def test_probes_leave_rng_and_training_flags_alone():
    model = toy()
    model.train()
    model.layers[1].eval()
    flags = [m.training for m in model.modules()]
    state = torch.get_rng_state()
    report = tigon.patch(model)
    tigon.unpatch(model)
    assert report.counts
    assert torch.equal(torch.get_rng_state(), state)
    assert [m.training for m in model.modules()] == flags


def test_nothing_recognised_raises_with_the_rejections():
    model = toy(norms=("centered", "centered"), mlps=({"act": "relu"}, {"act": "relu"}))
    with pytest.raises(TypeError, match=r"ToyLM.*generic matcher.*rejected: rms_norm"):
        tigon.patch(model, rope=False)
    assert all("forward" not in m.__dict__ for m in model.modules())


# ---- transformers models through the generic matcher ----------------------------------------------------------
transformers = pytest.importorskip("transformers")


def hf(model_type, dtype=torch.float32, seed=0, **overrides):
    cfg = transformers.AutoConfig.for_model(model_type, **{
        **dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=300, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(cfg).to(DEVICE, dtype).train()


def test_generic_on_llama_equals_the_family_spec():
    model = hf("llama")
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ref = model(input_ids=ids, labels=ids)
    spec_counts = tigon.patch(model).counts
    # the decoder layers' fused residual add needs the family's layer form (a DecoderLayerSpec); the generic matcher
    # probes modules one by one and leaves the layers alone
    assert spec_counts.pop("fused_add_rms_norm") == 2
    tigon.unpatch(model)
    report = tigon.patch(model, family="generic")
    assert report.family == "generic" and report.counts == spec_counts and not report.skipped
    out = model(input_ids=ids, labels=ids)
    assert out.logits is None and abs(out.loss.item() - ref.loss.item()) <= 1e-5 * ref.loss.item()
    assert tigon.unpatch(model).family == "generic"


@pytest.mark.parametrize("model_type,overrides,why", [
    ("gemma2", dict(final_logit_softcapping=30.0), "post-processed"),      # softcap
    ("granite", dict(logits_scaling=4.0), "post-processed"),               # logits / 4
])  # (an MoE head's router loss: kept where the probe reproduces it, tests/test_moe_generic.py)
def test_generic_head_probe_refuses_what_it_cannot_reproduce(model_type, overrides, why):
    model = hf(model_type, **overrides)
    report = tigon.patch(model, family="generic")
    assert report.skipped_counts.get("lm_head_loss") == 1
    assert why in next(e.detail for e in report.skipped if e.kind == "lm_head_loss")
    tigon.unpatch(model)


def test_generic_in_bf16_identifies_activation_and_casting():
    model = hf("gemma", dtype=torch.bfloat16)  # (1 + w) fp32 norm, gelu-tanh MLP
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        ref = model(input_ids=ids).logits.float()
    report = tigon.patch(model, family="generic")
    assert report.counts == {"rms_norm": 5, "mlp": 2, "rope": 2, "lm_head_loss": 1}
    details = {e.target: e.detail for e in report.replaced}
    assert "casting_mode='gemma', offset=1" in details["model.norm"]
    assert "approximate='tanh'" in details["model.layers.0.mlp"]
    with torch.no_grad():
        out = model(input_ids=ids).logits.float()
    tigon.unpatch(model)
    assert rel_l2(out, ref) < 2e-2


def test_deepseek_v4_clamped_shared_experts_left_alone():
    # DeepSeek-V4 (transformers >= 5.2x) through the generic matcher (only its family spec knows the MLP's clamp):
    # it patches the RMSNorms and must refuse the shared experts' MLP, whose gate / up are clamped at swiglu_limit
    if "deepseek_v4" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V4")
    cfg = transformers.AutoConfig.for_model(
        "deepseek_v4", vocab_size=96, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=32, o_lora_rank=32, n_routed_experts=4,
        num_experts_per_tok=2, index_n_heads=2, index_head_dim=16, index_topk=4, o_groups=2, qk_rope_head_dim=8,
        sliding_window=8, num_nextn_predict_layers=0, swiglu_limit=0.5)  # (a limit the training inputs reach)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(DEVICE).train()
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ref = model(input_ids=ids, labels=ids).loss
    report = tigon.patch(model, family="generic")
    mlps = {e.target: e.detail for e in report.skipped if e.kind == "mlp"}
    shared = [f"model.layers.{i}.mlp.shared_experts" for i in range(2)]
    experts = [f"model.layers.{i}.mlp.experts" for i in range(2)]  # its own (clamped) _apply_gate: left alone too
    assert sorted(mlps) == sorted(shared + experts), report
    assert all("not down(act(gate(x)) * up(x))" in mlps[t] for t in shared)
    assert all("defines its own _apply_gate" in mlps[t] for t in experts)
    assert report.counts.get("rms_norm", 0) > 0 and "mlp" not in report.counts
    out = model(input_ids=ids, labels=ids).loss
    assert abs(out.item() - ref.item()) <= 1e-5 * abs(ref.item())
    tigon.unpatch(model)
