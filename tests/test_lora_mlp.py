"""tigon.functional.lora_glu_mlp (a gated MLP with LoRA on gate / up / down as one node) against its reference, what it
keeps for the backward, bad input; and tigon.patch running a PEFT LoRA Llama's MLPs through it, with checkpointing
on and off, against PEFT's unfused model (tiny fp32 models, no downloads)."""

from __future__ import annotations

import copy

import pytest
import torch

from tigon import functional as TF
from tigon import support
from tigon.numerics import rel_l2
from tigon.reference import lora as ref

GRADS = ("x", "gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")


def inputs(device, m=(2, 3), h=16, i=24, ranks=(4, 2, 3), dtype=torch.float32, bias=False):
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, std=1.0):
        return (torch.randn(shape, generator=g) * std).to(device=device, dtype=dtype)

    out = dict(x=rnd(*m, h))
    for (name, n, k), r in zip((("gate", i, h), ("up", i, h), ("down", h, i)), ranks):
        out.update({f"{name}_weight": rnd(n, k, std=k ** -0.5), f"{name}_a": rnd(r, k, std=k ** -0.5),
                    f"{name}_b": rnd(n, r, std=r ** -0.5), f"{name}_bias": rnd(n) if bias else None})
    return out


def run(fn, args, grads=GRADS, seed=1, **options):
    leaves = {k: (v.detach().clone().requires_grad_(k in grads) if v is not None else None) for k, v in args.items()}
    out = fn(**leaves, gate_scaling=2.0, up_scaling=0.5, down_scaling=1.5, **options)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    out.backward(dy)
    return out.detach(), {k: leaves[k].grad for k in grads}


@pytest.mark.parametrize("activation, bias, train_base", [("silu", False, False), ("gelu_tanh", True, True)])
def test_lora_glu_mlp_matches_reference_fp32(device, activation, bias, train_base):
    args = inputs(device, bias=bias)
    grads = GRADS + (("gate_weight", "up_weight", "down_weight", "gate_bias", "up_bias", "down_bias")
                     if train_base else ())
    support.backend_usage(reset=True)
    out, got = run(TF.lora_glu_mlp, args, grads, activation=activation)
    assert "lora_glu_mlp" in support.backend_usage()
    want_out, want = run(ref.lora_glu_mlp, args, grads, activation=activation)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    for k in grads:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5, msg=k)


def test_frozen_bases_get_no_gradient_and_no_product_is_kept(device):
    args = inputs(device, m=(5,), h=8, i=12, ranks=(2, 2, 2))
    leaves = {k: (v.requires_grad_(k in GRADS) if v is not None else None) for k, v in args.items()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = TF.lora_glu_mlp(**leaves)
    params = {v.data_ptr() for k, v in leaves.items() if v is not None and k != "x"}
    acts = sorted(tuple(t.shape) for t in saved if t.data_ptr() not in params)
    # x, gate, up, x [A_g; A_u]^T, p A_d^T and the stacked (r_g + r_u, H) A's: two (M, I) tensors, not three
    assert acts == [(4, 8), (5, 2), (5, 4), (5, 8), (5, 12), (5, 12)], acts
    out.sum().backward()
    assert all(leaves[f"{n}_weight"].grad is None for n in ("gate", "up", "down"))
    with pytest.raises(RuntimeError, match="second backward"):  # gate and up were overwritten by their gradients
        out2 = TF.lora_glu_mlp(**leaves)
        out2.sum().backward(retain_graph=True)
        out2.sum().backward()


def test_bfloat16_close_to_float32(device):
    args = inputs(device, m=(32,), h=32, i=48, ranks=(8, 8, 8))
    low = {k: (v.bfloat16() if v is not None else None) for k, v in args.items()}
    out, got = run(TF.lora_glu_mlp, low)
    want_out, want = run(ref.lora_glu_mlp, {k: (v.double() if v is not None else None) for k, v in args.items()})
    peft_out, peft = run(ref.lora_glu_mlp, low)  # the unfused bf16 layers: the bound to stay within
    assert rel_l2(out.double(), want_out) <= 2 * rel_l2(peft_out.double(), want_out) + 1e-3
    for k in GRADS:
        assert rel_l2(got[k].double(), want[k]) <= 2 * rel_l2(peft[k].double(), want[k]) + 1e-3, k


def test_lora_glu_mlp_bad_input(device):
    args = inputs(device)
    with pytest.raises(ValueError, match="down_weight must have shape"):
        TF.lora_glu_mlp(**{**args, "down_weight": args["down_weight"].t()})
    with pytest.raises(ValueError, match="up projection: lora_b"):
        TF.lora_glu_mlp(**{**args, "up_b": args["up_b"][:, :1]})
    with pytest.raises(ValueError, match="activation"):
        TF.lora_glu_mlp(**args, activation="relu")
    with pytest.raises(TypeError, match="down_a must have x's dtype"):
        TF.lora_glu_mlp(**{**args, "down_a": args["down_a"].double()})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="a Llama-3-8B MLP in bf16 needs a GPU")
def test_llama3_8b_mlp_bf16_error_and_memory_on_cuda():
    # one Llama-3-8B MLP (4096 -> 14336, r = 16) over 4096 tokens in bf16: errors against float64 no worse than the
    # unfused bf16 layers' (PEFT's arithmetic), and one (tokens, intermediate) tensor less kept for the backward
    args = inputs("cuda", m=(4096,), h=4096, i=14336, ranks=(16, 16, 16), dtype=torch.bfloat16)
    out, got = run(TF.lora_glu_mlp, args)
    want_out, want = run(ref.lora_glu_mlp, {k: (v.double() if v is not None else None) for k, v in args.items()})
    peft_out, peft = run(ref.lora_glu_mlp, args)
    assert rel_l2(out.double(), want_out) <= 1.5 * rel_l2(peft_out.double(), want_out)
    for k in GRADS:
        assert rel_l2(got[k].double(), want[k]) <= 1.5 * rel_l2(peft[k].double(), want[k]), k

    def kept(fn):
        leaves = {k: (v.detach().requires_grad_(k in GRADS) if v is not None else None) for k, v in args.items()}
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        y = fn(**leaves, gate_scaling=2.0, up_scaling=2.0, down_scaling=2.0)
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated() - before - y.numel() * y.element_size()

    def per_layer(x, gate_weight, gate_a, gate_b, up_weight, up_a, up_b, down_weight, down_a, down_b, gate_scaling,
                  up_scaling, down_scaling, **_):  # Tigon's per-layer fusion: lora_linear, swiglu, lora_linear
        gate = TF.lora_linear(x, gate_weight, gate_a, gate_b, scaling=gate_scaling)
        up = TF.lora_linear(x, up_weight, up_a, up_b, scaling=up_scaling)
        return TF.lora_linear(TF.swiglu(gate, up), down_weight, down_a, down_b, scaling=down_scaling)

    assert kept(per_layer) - kept(TF.lora_glu_mlp) >= 0.99 * 4096 * 14336 * 2  # less the (32, 4096) stacked A


# ---- tigon.patch on a PEFT LoRA Llama ------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import tigon  # noqa: E402

ONLY_MLP_AND_LORA = dict(rms_norm=False, rope=False, layer_norm=False, fused_add_rms_norm=False,
                        fused_linear_cross_entropy=False)
"""tigon.patch options that leave the MLPs and the LoRA layers (fewer interpreted kernels: a faster test)."""
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_llama(act="silu", **lora_options):
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, vocab_size=64, max_position_embeddings=32,
                                   hidden_act=act)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).float()
    torch.manual_seed(1)  # random B (init_lora_weights=False): with PEFT's B = 0 every gradient of A would be zero
    lora = peft.LoraConfig(**{**dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS,
                                     init_lora_weights=False), **lora_options})
    return peft.get_peft_model(model, lora)


def step(model, ids, checkpointing=False):
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


class _DownMatmuls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the matmuls by the down projections' base weights, transposed (``p W_d^T``: the forward's)."""

    def __init__(self, weights):
        super().__init__()
        self.ptrs, self.count = {w.untyped_storage().data_ptr() for w in weights}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            w = args[-1]
            self.count += w.untyped_storage().data_ptr() in self.ptrs and w.stride(0) == 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("checkpointing", [False, True])
def test_patched_lora_mlp_loss_and_every_adapter_gradient_match_peft(checkpointing):
    ref_model = peft_llama()
    model = copy.deepcopy(ref_model)
    report = tigon.patch(model, **ONLY_MLP_AND_LORA)
    mlp = [e for e in report.replaced if e.kind == "mlp"]
    assert len(mlp) == 2 and all(e.ops == ("lora_glu_mlp",) and "lora_glu_mlp node" in e.detail for e in mlp)
    assert mlp[0].checkpoint_ops == ("lora_linear", "swiglu")
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(2))
    want_loss, want = step(ref_model, ids, checkpointing)
    support.backend_usage(reset=True)
    downs = [model.get_submodule(f"base_model.model.model.layers.{i}.mlp.down_proj").base_layer.weight
             for i in range(2)]
    with _DownMatmuls(downs) as counter:
        loss, got = step(model, ids, checkpointing)
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
    assert len(want) == 28 and set(got) == set(want)
    for name in want:
        assert rel_l2(got[name], want[name]) < 1e-5, name
    usage = support.backend_usage()
    if checkpointing:  # gate / up as lora_linear; the recomputation stopped before each down base matmul
        assert "lora_glu_mlp" not in usage and counter.count == 2
    else:
        assert sum(usage["lora_glu_mlp"].values()) == 2 and counter.count == 2


def test_lora_mlp_with_dropout_is_not_fused_and_says_why():
    model = peft_llama(lora_dropout=0.1)
    report = tigon.patch(model, **ONLY_MLP_AND_LORA)
    mlp = [e for e in report.replaced if e.kind == "mlp"]
    assert mlp and all("not fused as one node" in e.detail and "lora_dropout=0.1" in e.detail for e in mlp)
    assert all(e.ops == ("swiglu",) for e in mlp)
    assert report.skipped_counts == {"lora": 14}


def test_lora_mlp_falls_back_when_the_adapters_are_disabled_or_lora_is_off():
    ids = torch.randint(3, 64, (1, 5), generator=torch.Generator().manual_seed(4))
    ref_model = peft_llama().eval()
    model = copy.deepcopy(ref_model)
    tigon.patch(model, **ONLY_MLP_AND_LORA)
    with torch.no_grad(), model.disable_adapter(), ref_model.disable_adapter():
        support.backend_usage(reset=True)
        torch.testing.assert_close(model(input_ids=ids).logits, ref_model(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        assert "lora_glu_mlp" not in support.backend_usage()
    other = copy.deepcopy(ref_model)
    mlp = [e for e in tigon.patch(other, lora=False, **ONLY_MLP_AND_LORA).replaced if e.kind == "mlp"]
    assert all("lora=False" in e.detail and e.ops == ("swiglu",) for e in mlp)


@pytest.mark.parametrize("part", ["base_layer", "lora_A", "lora_B"])
def test_hooks_added_after_patching_run_as_with_peft(part):
    # a forward hook on a LoRA layer's base layer, A or B added after tigon.patch (activation capture, steering):
    # the fused call would skip it, so the layer runs PEFT's forward; before, o_proj's lora_linear, q_proj's
    # lora_qkv_rope and down_proj's lora_glu_mlp dropped the hook's change silently
    ids = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(4))
    ref_model = peft_llama().eval()
    model = copy.deepcopy(ref_model)
    tigon.patch(model)
    calls = []
    for m in (ref_model, model):
        for path in ("self_attn.o_proj", "self_attn.q_proj", "mlp.down_proj"):
            layer = m.base_model.model.model.layers[0].get_submodule(path)
            sub = layer.base_layer if part == "base_layer" else getattr(layer, part)["default"]
            sub.register_forward_hook(lambda mod, args, out: calls.append(1) or out * 2)
    with torch.no_grad():
        want = ref_model(input_ids=ids).logits
        support.backend_usage(reset=True)
        got = model(input_ids=ids).logits
    assert len(calls) == 6
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    usage = support.backend_usage()
    assert sum(usage["lora_glu_mlp"].values()) == 1 and sum(usage["lora_qkv_rope"].values()) == 1  # layer 1's


def test_deepspeed_zero3_gather_hooks_keep_the_lora_layers_fused():
    # DeepSpeed ZeRO-3 hooks every module (a stand-in here: parameters marked ds_id, a pre-hook on each module);
    # its partitioned weights are gathered when read inside the LoRA layer's call, so those hooks do not send the
    # layers to PEFT's forward as a user's hook does
    ref_model = peft_llama().eval()
    model = copy.deepcopy(ref_model)
    tigon.patch(model, **ONLY_MLP_AND_LORA)
    for m in model.modules():
        for p in m.parameters(recurse=False):
            p.ds_id = 0
        m.register_forward_pre_hook(lambda mod, args: None)
    ids = torch.randint(3, 64, (2, 5), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = ref_model(input_ids=ids).logits
        support.backend_usage(reset=True)
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    # every projection fused on its own (the one-node MLP needs projections without hooks of their own)
    assert sum(support.backend_usage()["lora_linear"].values()) == 14
