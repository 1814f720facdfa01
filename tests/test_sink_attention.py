"""GPT-OSS attention with sinks on torch SDPA (tigon.integrations.sink_attention) against transformers' eager
attention: the op (output and gradients of q, k, v, sinks under each mask transformers passes, GQA, odd lengths),
the whole tiny model patched (loss, every gradient, each attention module's output), the report and unpatch."""

import copy
import types

import pytest
import torch

pytest.importorskip("transformers")
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers.models.gpt_oss import modeling_gpt_oss  # noqa: E402

import tigon  # noqa: E402
from tigon.integrations import sink_attention as SA  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
B, H, HKV, T, D = 2, 4, 2, 11, 16


def _rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _bool_mask(kind, tq=T, tk=T):
    q = torch.arange(tq)[:, None] + (tk - tq)
    k = torch.arange(tk)[None, :]
    keep = (k <= q).expand(B, 1, tq, tk)
    if kind == "window":
        keep = keep & (q - k < 4)
    if kind == "padded":  # row 1 left-padded by 3: its first 3 queries see no key at all
        pad = torch.ones(B, tk, dtype=torch.bool)
        pad[1, :3] = False
        keep = keep & pad[:, None, None, :]
    return keep


def _additive(keep, dtype):
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, torch.finfo(dtype).min)


CASES = {  # name -> (what SA.attention_forward gets, the mask eager gets, tq, extra kwargs)
    "none": (lambda dt: None, lambda dt: _additive(_bool_mask("causal"), dt), T, {}),
    "bool": (lambda dt: _bool_mask("causal"), lambda dt: _additive(_bool_mask("causal"), dt), T, {}),
    "padded": (lambda dt: _bool_mask("padded"), lambda dt: _additive(_bool_mask("padded"), dt), T, {}),
    "window": (lambda dt: _bool_mask("window"), lambda dt: _additive(_bool_mask("window"), dt), T, {}),
    "float": (lambda dt: _additive(_bool_mask("padded"), dt), lambda dt: _additive(_bool_mask("padded"), dt), T, {}),
    "none_window": (lambda dt: None, lambda dt: _additive(_bool_mask("window"), dt), T, {"sliding_window": 4}),
    "cache": (lambda dt: None, lambda dt: _additive(_bool_mask("causal", 3, T), dt), 3, {}),
    "decode": (lambda dt: None, lambda dt: None, 1, {}),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_eager(case, dtype):
    ours_mask, eager_mask, tq, extra = CASES[case]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, tq, D, generator=g, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(B, HKV, T, D, generator=g, dtype=dtype, requires_grad=True) for _ in range(2))
    sinks = torch.randn(H, generator=g, dtype=dtype, requires_grad=True)
    module = types.SimpleNamespace(num_key_value_groups=H // HKV, training=False, sinks=sinks, is_causal=True)
    ref, _ = modeling_gpt_oss.eager_attention_forward(module, q, k, v, eager_mask(dtype), scaling=D ** -0.5)
    out, weights = SA.attention_forward(module, q, k, v, ours_mask(dtype), scaling=D ** -0.5, s_aux=sinks, **extra)
    assert weights is None and out.shape == ref.shape == (B, tq, H, D) and out.dtype == dtype
    assert _rel(out, ref) < TOL[dtype]
    grad = torch.randn(ref.shape, generator=g, dtype=dtype)
    want = torch.autograd.grad(ref, (q, k, v, sinks), grad)
    got = torch.autograd.grad(out, (q, k, v, sinks), grad)
    for name, a, b in zip("q k v sinks".split(), got, want):
        assert _rel(a, b) < TOL[dtype], name
    if case == "padded":  # queries that see no key: all weight on the sink, output 0 (eager gives the same)
        assert out[1, :3].abs().max().item() < 1e-30


def test_op_errors():
    q = torch.randn(1, 4, 5, 8)
    kv = torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match="sinks must be"):
        SA.sink_attention(q, kv, kv, torch.zeros(3), scale=1.0)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        SA.sink_attention(q, torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8), torch.zeros(4), scale=1.0)
    with pytest.raises(ValueError, match="4-D"):
        SA.sink_attention(q[0], kv, kv, torch.zeros(4), scale=1.0)


def _model(dtype):
    cfg = GptOssConfig(vocab_size=61, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=H,
                       num_key_value_heads=HKV, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                       sliding_window=4, max_position_embeddings=64,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg).to(dtype)
    if hasattr(model.config, "_experts_implementation"):  # grouped_mm takes no float64 (the experts' loop does)
        model.config._experts_implementation = "eager"
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)  # sinks that matter
    assert model.config._attn_implementation == "eager"
    return model


ONLY_SINKS = dict(rms_norm=False, mlp=False, rope=False, fused_linear_cross_entropy=False)


def _run(model, ids, mask):
    seen = []
    hooks = [layer.self_attn.register_forward_hook(lambda m, a, out: seen.append(out[0]))
             for layer in model.model.layers]
    out = model(input_ids=ids, attention_mask=mask, labels=ids)
    for h in hooks:
        h.remove()
    out.loss.backward()
    return out.loss, seen


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_model_matches_eager(dtype, padded):
    ref_model = _model(dtype)
    model = copy.deepcopy(ref_model)
    report = tigon.patch(model, **ONLY_SINKS)
    assert model.config._attn_implementation == SA.NAME
    ids = torch.randint(0, 61, (2, T), generator=torch.Generator().manual_seed(1))
    mask = None
    if padded:
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, :4] = 0
    ref_loss, ref_attn = _run(ref_model, ids, mask)
    loss, attn = _run(model, ids, mask)
    assert _rel(loss, ref_loss) < TOL[dtype]
    for i, (a, b) in enumerate(zip(attn, ref_attn)):
        keep = slice(None) if mask is None else mask.bool()  # padded positions: any value (never read by the loss)
        assert _rel(a[keep], b[keep]) < TOL[dtype], f"layer {i}"
    for (name, p), p_ref in zip(model.named_parameters(), ref_model.parameters()):
        assert (p.grad is None) == (p_ref.grad is None), name
        if p.grad is not None:
            assert _rel(p.grad, p_ref.grad) < 10 * TOL[dtype], name
    assert report.counts.get("sinks") == 3


def test_report_unpatch_and_keyword():
    model = _model(torch.float32)
    report = tigon.patch(model, **ONLY_SINKS)
    sinks = [e for e in report.replaced if e.kind == "sinks"]
    assert [e.target for e in sinks] == [f"model.layers.{i}.self_attn" for i in range(3)]
    assert "sink_attention" in str(report) and SA.NAME in sinks[0].detail
    again = tigon.patch(model, **ONLY_SINKS)
    assert {e.kind for e in again.already_patched} == {"sinks"} and not again.replaced
    clone = copy.deepcopy(model)  # the config carries the name; the registration is process-wide
    assert clone.config._attn_implementation == SA.NAME
    clone(input_ids=torch.randint(0, 61, (1, 5))).logits.sum().backward()
    undone = tigon.unpatch(model)
    assert model.config._attn_implementation == "eager"
    assert sum(e.kind == "sinks" for e in undone.replaced) == 3

    off = _model(torch.float32)
    report = tigon.patch(off, sinks=False, **ONLY_SINKS)
    assert off.config._attn_implementation == "eager" and "sinks" not in report.counts
    assert any("turned off" in n and "sinks" in n for n in report.notes)
    with pytest.raises(TypeError, match="sinks must be True or False"):
        tigon.patch(off, sinks="yes")


def test_models_sharing_a_config_are_patched_apart():
    # a policy and its reference model built from one config object: patching one must not switch the other, nor
    # make its report say it was patched; unpatching one leaves the other patched
    a = _model(torch.float32)
    b = type(a)(a.config)
    assert b.config is a.config
    tigon.patch(a, **ONLY_SINKS)
    assert a.config._attn_implementation == SA.NAME and b.config._attn_implementation == "eager"
    assert all(layer.self_attn.config is a.config for layer in a.model.layers)
    report = tigon.patch(b, **ONLY_SINKS)
    assert report.counts.get("sinks") == 3 and not report.already_patched
    tigon.unpatch(a)
    assert a.config._attn_implementation == "eager" and b.config._attn_implementation == SA.NAME


def test_other_implementation_left_alone():
    model = _model(torch.float32)
    model.config._attn_implementation = "flex_attention"
    report = tigon.patch(model, **ONLY_SINKS)
    assert model.config._attn_implementation == "flex_attention"
    assert report.skipped_counts.get("sinks") == 3 and "not eager" in report.skipped[0].detail


def test_verify_names_the_sink_attention_it_does_not_check():
    # tigon verify --model checks ops of the registry; the sink attention is none, so its notes must say so (from the
    # family data's sinks field), and only for a family that has it
    from transformers import LlamaConfig

    from tigon.workflows.verify import _has_sinks

    assert _has_sinks(_model(torch.float32).config) and not _has_sinks(LlamaConfig())


def test_inspect_counts_the_sinks_as_a_category():
    from tigon.workflows.inspect import inspect_config

    got = inspect_config(_model(torch.float32).config)
    assert got.categories["attention_sinks"] == 3 and got.counts["sinks"] == 3
