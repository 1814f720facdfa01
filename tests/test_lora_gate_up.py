"""tigon.functional.lora_gate_up_mlp (a gated MLP with one fused gate-up projection, LoRA on gate_up / down, as one
node) against its reference, what it keeps, bad input; tigon.patch running a PEFT LoRA Phi-3's MLPs through it, with
checkpointing on and off, against PEFT's unfused model; and an MLP with multipliers (Falcon-H1) left to its layers
(tiny fp32 models, no downloads)."""

from __future__ import annotations

import copy

import pytest
import torch

from tigon import functional as TF
from tigon import support
from tigon.numerics import rel_l2
from tigon.reference import lora as ref

GRADS = ("x", "gate_up_a", "gate_up_b", "down_a", "down_b")
BASES = ("gate_up_weight", "down_weight", "gate_up_bias", "down_bias")


def inputs(device, m=(2, 3), h=16, i=24, ranks=(4, 3), dtype=torch.float32, bias=False):
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, std=1.0):
        return (torch.randn(shape, generator=g) * std).to(device=device, dtype=dtype)

    out = dict(x=rnd(*m, h))
    for (name, n, k), r in zip((("gate_up", 2 * i, h), ("down", h, i)), ranks):
        out.update({f"{name}_weight": rnd(n, k, std=k ** -0.5), f"{name}_a": rnd(r, k, std=k ** -0.5),
                    f"{name}_b": rnd(n, r, std=r ** -0.5), f"{name}_bias": rnd(n) if bias else None})
    return out


def run(fn, args, grads=GRADS, **options):
    leaves = {k: (v.detach().clone().requires_grad_(k in grads) if v is not None else None) for k, v in args.items()}
    out = fn(**leaves, gate_up_scaling=2.0, down_scaling=1.5, **options)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out))
    return out.detach(), {k: leaves[k].grad for k in grads}


@pytest.mark.parametrize("activation, bias, train_base", [("silu", False, False), ("gelu_tanh", True, True)])
def test_lora_gate_up_mlp_matches_float64_reference_fp32(device, activation, bias, train_base):
    args = inputs(device, bias=bias)
    grads = GRADS + (BASES if train_base else ())
    support.backend_usage(reset=True)
    out, got = run(TF.lora_gate_up_mlp, args, grads, activation=activation)
    assert "lora_gate_up_mlp" in support.backend_usage()
    want_out, want = run(ref.lora_gate_up_mlp, {k: (v.double() if v is not None else None) for k, v in args.items()},
                         grads, activation=activation)
    assert rel_l2(out.double(), want_out) < 1e-5
    for k in grads:
        assert rel_l2(got[k].double(), want[k]) < 1e-5, k


def test_keeps_no_product_and_frozen_bases_get_no_gradient(device):
    args = inputs(device, m=(5,), h=8, i=12, ranks=(2, 3))
    leaves = {k: (v.requires_grad_(k in GRADS) if v is not None else None) for k, v in args.items()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = TF.lora_gate_up_mlp(**leaves)
    params = {v.data_ptr() for k, v in leaves.items() if v is not None and k != "x"}
    acts = sorted(tuple(t.shape) for t in saved if t.data_ptr() not in params)
    # x, the (M, 2I) gate-up output, x A^T and p A_d^T: no (M, I) product
    assert acts == [(5, 2), (5, 3), (5, 8), (5, 24)], acts
    out.sum().backward()
    assert leaves["gate_up_weight"].grad is None and leaves["down_weight"].grad is None
    with pytest.raises(RuntimeError, match="second backward"):  # the gate-up output was overwritten by its gradient
        out2 = TF.lora_gate_up_mlp(**leaves)
        out2.sum().backward(retain_graph=True)
        out2.sum().backward()


def test_bfloat16_within_the_unfused_layers_bound(device):
    args = inputs(device, m=(32,), h=32, i=48, ranks=(8, 8))
    low = {k: (v.bfloat16() if v is not None else None) for k, v in args.items()}
    out, got = run(TF.lora_gate_up_mlp, low)
    want_out, want = run(ref.lora_gate_up_mlp, {k: (v.double() if v is not None else None) for k, v in args.items()})
    peft_out, peft = run(ref.lora_gate_up_mlp, low)  # the unfused bf16 layers: the bound to stay within
    assert rel_l2(out.double(), want_out) <= 2 * rel_l2(peft_out.double(), want_out) + 1e-3
    for k in GRADS:
        assert rel_l2(got[k].double(), want[k]) <= 2 * rel_l2(peft[k].double(), want[k]) + 1e-3, k


def test_lora_gate_up_mlp_bad_input(device):
    args = inputs(device)
    with pytest.raises(ValueError, match="even number of rows"):
        TF.lora_gate_up_mlp(**{**args, "gate_up_weight": args["gate_up_weight"][1:],
                               "gate_up_b": args["gate_up_b"][1:]})
    with pytest.raises(ValueError, match="gate-up projection: lora_b"):
        TF.lora_gate_up_mlp(**{**args, "gate_up_b": args["gate_up_b"][:, :1]})
    with pytest.raises(ValueError, match="down_a must have shape"):
        TF.lora_gate_up_mlp(**{**args, "down_a": args["down_a"][:, 1:]})
    with pytest.raises(TypeError, match="gate_up_a must have x's dtype"):
        TF.lora_gate_up_mlp(**{**args, "gate_up_a": args["gate_up_a"].double()})


# ---- tigon.patch on a PEFT LoRA Phi-3 ------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import tigon  # noqa: E402

ONLY_MLP_AND_LORA = dict(rms_norm=False, rope=False, layer_norm=False, fused_add_rms_norm=False,
                        fused_linear_cross_entropy=False)
"""tigon.patch options that leave the MLPs and the LoRA layers (fewer interpreted kernels: a faster test)."""


def peft_phi3(targets=("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
    cfg = transformers.Phi3Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, vocab_size=64, max_position_embeddings=32, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM(cfg).float()
    torch.manual_seed(1)  # random B (init_lora_weights=False): with PEFT's B = 0 every gradient of A would be zero
    lora = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(targets), init_lora_weights=False)
    return peft.get_peft_model(model, lora)


def step(model, ids, checkpointing=False):
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_patched_phi3_lora_mlp_loss_and_every_adapter_gradient_match_peft(checkpointing):
    ref_model = peft_phi3()
    model = copy.deepcopy(ref_model)
    report = tigon.patch(model, **ONLY_MLP_AND_LORA)
    mlp = [e for e in report.replaced if e.kind == "mlp"]
    assert len(mlp) == 2 and all(e.ops == ("lora_gate_up_mlp",) and "lora_gate_up_mlp node" in e.detail
                                 for e in mlp), mlp
    assert mlp[0].checkpoint_ops == ("lora_linear", "swiglu")
    assert sum(e.kind == "lora" for e in report.replaced) == 8
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(2))
    want_loss, want = step(ref_model, ids, checkpointing)
    support.backend_usage(reset=True)
    loss, got = step(model, ids, checkpointing)
    assert abs(loss - want_loss) <= 1e-5 * abs(want_loss)
    assert len(want) == 16 and set(got) == set(want)
    for name in want:
        assert rel_l2(got[name], want[name]) < 1e-5, name
    usage = support.backend_usage()
    assert ("lora_gate_up_mlp" in usage) != checkpointing, usage  # inside the checkpoint: lora_linear + swiglu


def test_phi3_without_lora_on_down_proj_says_why_it_is_not_one_node():
    report = tigon.patch(peft_phi3(targets=("gate_up_proj",)), **ONLY_MLP_AND_LORA)
    mlp = [e for e in report.replaced if e.kind == "mlp"]
    assert mlp and all(e.ops == ("glu_linear",) and "down_proj carries no Linear adapter layer" in e.detail
                       for e in mlp), mlp


def test_mlp_with_multipliers_is_not_one_node():
    # Falcon-H1's MLP scales gate and the product by muP multipliers that the fused ops do not take: its LoRA layers
    # run one by one and the MLP's forward keeps the multipliers (one node dropped them: logits off by ~0.1)
    cfg = transformers.FalconH1Config(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=16, vocab_size=64, mlp_multipliers=[0.5, 2.0],
                                      mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
                                      mamba_chunk_size=4)
    torch.manual_seed(0)
    ref_model = peft.get_peft_model(transformers.FalconH1ForCausalLM(cfg).float(), peft.LoraConfig(
        r=4, target_modules=["gate_proj", "up_proj", "down_proj"], init_lora_weights=False)).eval()
    model = copy.deepcopy(ref_model)
    report = tigon.patch(model, **ONLY_MLP_AND_LORA)
    (mlp,) = [e for e in report.replaced if e.kind == "mlp"]
    assert mlp.ops == ("swiglu",) and "multipliers (gate_multiplier, down_multiplier)" in mlp.detail, mlp
    ids = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, ref_model(input_ids=ids).logits, rtol=1e-5,
                                   atol=1e-5)
