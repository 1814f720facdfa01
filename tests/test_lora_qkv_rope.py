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
