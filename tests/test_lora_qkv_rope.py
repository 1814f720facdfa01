"""tigon.functional.lora_qkv_rope (an attention's q / k / v LoRA projections and the RoPE of q and k as one node)
against its float64 reference, what it keeps for the backward, bad input; and tigon.patch running a PEFT LoRA Llama's
and Qwen2's attention projections through it, with checkpointing on and off, against PEFT's unfused model (tiny fp32
models, no downloads)."""

from __future__ import annotations

import copy

import pytest
import torch

from tigon import functional as TF
from tigon import support
from tigon.numerics import rel_l2
from tigon.ops.rope import rotary_tables
from tigon.reference import lora_qkv_rope as ref

GRADS = ("x", "q_a", "q_b", "k_a", "k_b", "v_a", "v_b")
BASE = ("q_weight", "k_weight", "v_weight")
BIASES = ("q_bias", "k_bias", "v_bias")


def inputs(device, b=2, t=5, h=24, heads=(3, 1, 1), d=8, ranks=(4, 2, 3), rotary=None, dtype=torch.float32,
           bias=False, batch_tables=False):
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, std=1.0):
        return (torch.randn(shape, generator=g) * std).to(device=device, dtype=dtype)

    cos, sin = rotary_tables(t, rotary or d, 10000.0, dtype, device)
    if batch_tables:  # (B, T, R): each batch row at its own positions (a shifted second row)
        c2, s2 = rotary_tables(t + 3, rotary or d, 10000.0, dtype, device)
        cos, sin = torch.stack((cos, c2[3:])), torch.stack((sin, s2[3:]))
    else:
        cos, sin = cos[None], sin[None]
    out = dict(x=rnd(b, t, h), cos=cos, sin=sin)
    for p, n, r in zip("qkv", heads, ranks):
        out.update({f"{p}_weight": rnd(n * d, h, std=h ** -0.5), f"{p}_a": rnd(r, h, std=h ** -0.5),
                    f"{p}_b": rnd(n * d, r, std=r ** -0.5), f"{p}_bias": rnd(n * d, std=0.1) if bias else None})
    return out


def run(fn, args, grads=GRADS, seed=1, head_dim=8):
    leaves = {k: (v.detach().clone().requires_grad_(k in grads) if isinstance(v, torch.Tensor) else v)
              for k, v in args.items()}
    outs = fn(**leaves, head_dim=head_dim, q_scaling=2.0, k_scaling=0.5, v_scaling=1.5)
    gen = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=gen).to(o)).sum() for o in outs)
    loss.backward()
    return tuple(o.detach() for o in outs), {k: leaves[k].grad for k in grads}


def to64(args):
    return {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}


@pytest.mark.parametrize("bias, train_base, rotary, batch_tables", [
    (False, False, None, False),
    (True, True, None, True),  # Qwen2's biases, trained bases, per-row tables
    (True, False, 6, False),  # partial rotary: the first 6 of 8 dims
])
def test_lora_qkv_rope_matches_float64_reference_fp32(device, bias, train_base, rotary, batch_tables):
    args = inputs(device, bias=bias, rotary=rotary, batch_tables=batch_tables)
    grads = GRADS + (BASE if train_base else ()) + (BIASES if bias else ())
    support.backend_usage(reset=True)
    outs, got = run(TF.lora_qkv_rope, args, grads)
    assert "lora_qkv_rope" in support.backend_usage()
    want_outs, want = run(ref.lora_qkv_rope, to64(args), grads)
    for o, w, shape in zip(outs, want_outs, ((2, 3, 5, 8), (2, 1, 5, 8), (2, 1, 5, 8))):
        assert o.shape == shape and o.dtype == torch.float32
        assert o.transpose(1, 2).is_contiguous()  # HF's layout: the (B, H, T, D) view of a (B, T, H D) buffer
        torch.testing.assert_close(o.double(), w, rtol=1e-5, atol=1e-5)
    for k in grads:
        torch.testing.assert_close(got[k].double(), want[k], rtol=1e-5, atol=1e-5, msg=k)


def test_odd_sizes_noncontiguous_x_and_2d_tables(device):
    # odd hidden, odd tokens, a head_dim that is not a power of two, GQA 5 / 1 heads, rank 1, x a strided view
    args = inputs(device, b=1, t=7, h=13, heads=(5, 1, 1), d=6, ranks=(1, 3, 2), bias=True)
    wide = torch.randn(1, 7, 26, generator=torch.Generator().manual_seed(3)).to(device)
    args["x"] = wide[..., ::2]
    assert not args["x"].is_contiguous()
    args["cos"], args["sin"] = args["cos"][0], args["sin"][0]  # (T, R)
    outs, got = run(TF.lora_qkv_rope, args, head_dim=6)
    want_outs, want = run(ref.lora_qkv_rope, to64(args), head_dim=6)
    for o, w in zip(outs, want_outs):
        torch.testing.assert_close(o.double(), w, rtol=1e-5, atol=1e-5)
    for k in GRADS:
        torch.testing.assert_close(got[k].double(), want[k], rtol=1e-5, atol=1e-5, msg=k)


def test_gradients_of_strided_upstream_and_unused_outputs(device):
    # dq / dk / dv in another layout than the outputs' (contiguous (B, H, T, D), as an attention kernel may return),
    # and a v that is not used (its gradient zero)
    args = inputs(device)
    leaves = {k: (v.detach().clone().requires_grad_(k in GRADS) if isinstance(v, torch.Tensor) else v)
              for k, v in args.items()}
    wants = {k: (v.detach().double().requires_grad_(k in GRADS) if isinstance(v, torch.Tensor) else v)
             for k, v in args.items()}
    for fn, ls in ((TF.lora_qkv_rope, leaves), (ref.lora_qkv_rope, wants)):
        q, k, _ = fn(**ls, head_dim=8, q_scaling=2.0)
        ((q.contiguous() ** 2).sum() + k.contiguous().sum()).backward()  # dk: expanded ones (stride 0)
    for name in GRADS:
        want = wants[name].grad if wants[name].grad is not None else torch.zeros_like(wants[name])  # v unused
        torch.testing.assert_close(leaves[name].grad.double(), want, rtol=1e-5, atol=1e-5, msg=name)


def test_frozen_bases_get_no_gradient_and_only_x_and_xa_are_kept(device):
    args = inputs(device, b=1, t=6, h=16, heads=(2, 1, 1), d=4, ranks=(2, 2, 1))
    leaves = {k: (v.requires_grad_(k in GRADS) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        q, k, v = TF.lora_qkv_rope(**leaves, head_dim=4)
    params = {t.data_ptr() for n, t in leaves.items() if isinstance(t, torch.Tensor) and n != "x"}
    acts = sorted(tuple(t.shape) for t in saved if t.data_ptr() not in params)
    # x (M, K), x [A_q; A_k; A_v]^T (M, 5) and the stacked A (5, K): nothing (M, N) of q, k or v
    assert acts == [(5, 16), (6, 5), (6, 16)], acts
    (q.sum() + k.sum() + v.sum()).backward()
    assert all(leaves[n].grad is None for n in BASE + ("cos", "sin"))


def test_bfloat16_no_worse_than_the_unfused_bf16_composition(device):
    args = inputs(device, b=2, t=16, h=64, heads=(4, 2, 2), d=16, ranks=(8, 8, 8), bias=True)
    low = {k: (v.bfloat16() if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    outs, got = run(TF.lora_qkv_rope, low, head_dim=16)
    want_outs, want = run(ref.lora_qkv_rope, to64(args), head_dim=16)
    peft_outs, peft = run(ref.lora_qkv_rope, low, head_dim=16)  # PEFT's layers and HF's rope in bf16
    assert all(o.dtype == torch.bfloat16 for o in outs) and all(g.dtype == torch.bfloat16 for g in got.values())
    for o, w, p in zip(outs, want_outs, peft_outs):
        assert rel_l2(o.double(), w) <= 1.5 * rel_l2(p.double(), w) + 1e-3
    for k in GRADS:
        assert rel_l2(got[k].double(), want[k]) <= 1.5 * rel_l2(peft[k].double(), want[k]) + 1e-3, k


def test_no_grad(device):
    args = inputs(device, bias=True)
    with torch.no_grad():
        outs = TF.lora_qkv_rope(**args, head_dim=8, v_scaling=3.0)
    for o, w in zip(outs, ref.lora_qkv_rope(**args, head_dim=8, v_scaling=3.0)):
        torch.testing.assert_close(o, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b, t", [(2, 0), (0, 5)])
def test_empty_batch_or_sequence(device, b, t):
    # no tokens: (B, H_p, 0 or T, D) outputs and zero adapter gradients (the head counts come from the weights; a
    # view with -1 heads of 0 elements, or a division by B = 0, raised before)
    args = inputs(device, b=b, t=t, bias=True)
    outs, got = run(TF.lora_qkv_rope, args)
    assert [o.shape for o in outs] == [(b, 3, t, 8), (b, 1, t, 8), (b, 1, t, 8)]
    assert got["x"].shape == (b, t, 24) and not got["q_a"].any()
    want_outs, _ = run(ref.lora_qkv_rope, to64(args))
    assert [o.shape for o in want_outs] == [o.shape for o in outs]


def test_lora_qkv_rope_bad_input(device):
    a = inputs(device)
    with pytest.raises(ValueError, match="x must have 3 dimensions"):
        TF.lora_qkv_rope(**{**a, "x": a["x"][0]})
    with pytest.raises(ValueError, match="k projection: lora_b must have shape .*k_b"):
        TF.lora_qkv_rope(**{**a, "k_b": a["k_b"][:, :1]})
    with pytest.raises(ValueError, match="v projection: x's last dimension"):
        TF.lora_qkv_rope(**{**a, "v_weight": a["v_weight"][:, :5]})
    with pytest.raises(ValueError, match="q_weight's out_features 24 must be a multiple of head_dim 5"):
        TF.lora_qkv_rope(**a, head_dim=5)
    with pytest.raises(ValueError, match="cos's last dimension"):
        TF.lora_qkv_rope(**a, head_dim=4)
    with pytest.raises(ValueError, match="sin must have shape"):
        TF.lora_qkv_rope(**{**a, "sin": a["sin"][:, :3]})
    with pytest.raises(TypeError, match="q_b must have x's dtype"):
        TF.lora_qkv_rope(**{**a, "q_b": a["q_b"].double()})
    with pytest.raises(TypeError, match="head_dim must be a positive int"):
        TF.lora_qkv_rope(**a, head_dim=8.0)
    with pytest.raises(TypeError, match="k projection: scaling must be a real number"):
        TF.lora_qkv_rope(**a, k_scaling="2")


# ---- tigon.patch on PEFT LoRA Llama / Qwen2 ------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import tigon  # noqa: E402
from test_lora_mlp import TARGETS, step  # noqa: E402  (a training step: loss and every trainable gradient)


def peft_model(family="llama", layers=2, **lora_options):
    config, model = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                     "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
                     "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
                     "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM)}[family]
    cfg = config(hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, vocab_size=64, max_position_embeddings=32)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    base = model(cfg).float()
    if family == "qwen2":
        assert base.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q / k / v biases
    torch.manual_seed(1)  # random B (init_lora_weights=False): with PEFT's B = 0 every gradient of A would be zero
    options = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, init_lora_weights=False)
    return peft.get_peft_model(base, peft.LoraConfig(**{**options, **lora_options}))


@pytest.mark.parametrize("family, checkpointing", [("llama", False), ("llama", True), ("qwen2", False),
                                                   ("qwen2", True), ("mistral", False)])
def test_patched_attention_loss_and_every_adapter_gradient_match_peft(family, checkpointing):
    ref_model = peft_model(family)
    model = copy.deepcopy(ref_model)
    report = tigon.patch(model)
    rope = [e for e in report.replaced if e.kind == "rope"]
    assert len(rope) == 2 and all(e.ops == ("lora_qkv_rope",) and "lora_qkv_rope node" in e.detail for e in rope)
    assert "lora_qkv_rope" in str(report)
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(2))
    want_loss, want = step(ref_model, ids, checkpointing)
    support.backend_usage(reset=True)
    loss, got = step(model, ids, checkpointing)
    usage = support.backend_usage()
    assert sum(usage["lora_qkv_rope"].values()) == 2 * (2 if checkpointing else 1)  # recomputed under checkpointing
    assert "rope" not in usage  # every rotary call of the model ran inside the fused node
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
    assert len(want) == 28 and set(got) == set(want)
    for name in want:
        assert rel_l2(got[name], want[name]) < 1e-5, name


def test_unfusable_calls_and_forms_fall_back_and_say_why():
    # Qwen3's q_norm / k_norm between the projections and the rotary: left apart, with the reason
    report = tigon.patch(peft_model("qwen3", layers=1))
    (rope,) = [e for e in report.replaced if e.kind == "rope"]
    assert rope.ops == ("rope",) and "q_norm" in rope.detail
    assert any("q_norm" in n and "lora_linear, then rope" in n for n in report.notes)
    # dropout on the adapters: lora_linear refuses those layers, so the node does too
    report = tigon.patch(peft_model(layers=1, lora_dropout=0.1))
    (rope,) = [e for e in report.replaced if e.kind == "rope"]
    assert rope.ops == ("rope",) and "lora_dropout=0.1" in rope.detail
    # a disabled adapter at call time: the class's forward with its own layers, same loss as the unpatched model's
    ref_model = peft_model(layers=1)
    model = copy.deepcopy(ref_model)
    tigon.patch(model)
    ids = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(4))
    support.backend_usage(reset=True)
    with model.disable_adapter(), ref_model.disable_adapter(), torch.no_grad():
        got, want = model(input_ids=ids).logits, ref_model(input_ids=ids).logits
    assert "lora_qkv_rope" not in support.backend_usage() and "rope" in support.backend_usage()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_report_says_what_an_attention_patched_earlier_runs_with_its_adapters():
    # patched before get_peft_model, then again after: the attention already patched runs q / k / v with the rotary
    # as one node, and the second report says so (it said "instance level" alone)
    base = peft_model(layers=1).base_model.model
    tigon.patch(base)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    (rope,) = [e for e in tigon.patch(model).already_patched if e.kind == "rope"]
    assert rope.ops == ("lora_qkv_rope",) and rope.detail.startswith("instance level; ") and "node" in rope.detail
    # a class-level patch replaces the rotary function alone: the report says the node does not run, and why
    model = peft_model("mistral", layers=1)
    tigon.patch("mistral")
    try:
        report = tigon.patch(model)
    finally:
        tigon.unpatch("mistral")
    (rope,) = [e for e in report.already_patched if e.kind == "rope"]
    assert rope.ops == ("rope",) and "not fused with the rotary" in rope.detail and "class-level" in rope.detail
    (mlp,) = [e for e in report.already_patched if e.kind == "mlp"]
    assert mlp.ops == ("lora_glu_mlp",) and mlp.detail.startswith("class level; ")


def test_report_says_why_a_fused_qkv_projection_is_not_fused_with_the_rotary():
    from test_lora_gate_up import peft_phi3

    report = tigon.patch(peft_phi3(), rms_norm=False, mlp=False, fused_linear_cross_entropy=False)
    rope = [e for e in report.replaced if e.kind == "rope"]
    assert len(rope) == 2 and all(e.ops == ("rope",) and "qkv_proj" in e.detail and "fused qkv projection" in e.detail
                                  for e in rope), rope
    assert any("qkv_proj" in n and "lora_linear, then rope" in n for n in report.notes)


def _compile_note_ops(report) -> dict[str, set[str]]:
    """The ops the patch report's torch.compile note names, by what they run: ``{"inductor": ..., "kernel": ...}``."""
    (note,) = [n for n in report.notes if n.startswith("under torch.compile")]
    found = {}
    for part in note.split(": ", 1)[1].split("; "):
        names, _, rest = part.partition(" lea") if " lea" in part else part.partition(" run")
        found["inductor" if "Inductor" in rest else "kernel"] = set(names.split(", "))
    return found


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["auto", "kernels"])
def test_compile_note_names_what_the_compiled_attention_runs(mode, monkeypatch):
    # Under torch.compile the attention runs its projections one by one (lora_linear) and the rotary as rope, not as
    # the lora_qkv_rope node: the note named lora_qkv_rope and, in "kernels" mode, left out the rope kernel that ran.
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    torch._dynamo.reset()
    model = peft_model(layers=1)
    found = _compile_note_ops(tigon.patch(model))
    named = set().union(*found.values())
    assert "lora_qkv_rope" not in named and "rope" in named
    assert "rope" in found["kernel" if mode == "kernels" else "inductor"]
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(2))
    support.backend_usage(reset=True)
    compiled(input_ids=ids, labels=ids).loss.backward()
    assert set(support.backend_usage()) == named
    torch._dynamo.reset()
