"""tigon.functional.lora_linear: the LoRA linear node against its reference (values and every gradient), the frozen
base weight, the memory it keeps, and bad input. (Its PEFT integration: tests/test_peft_trainer.py.)"""

from __future__ import annotations

import pytest
import torch

from tigon import functional as TF
from tigon import support
from tigon.numerics import rel_l2
from tigon.reference import lora as ref


def inputs(device, m=(2, 5), k=24, n=20, r=4, dtype=torch.float32, bias=False):
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, std=1.0):
        return (torch.randn(shape, generator=g) * std).to(device=device, dtype=dtype)

    return dict(x=rnd(*m, k), weight=rnd(n, k, std=k ** -0.5), lora_a=rnd(r, k, std=k ** -0.5),
                lora_b=rnd(n, r, std=r ** -0.5), bias=rnd(n) if bias else None)


def run(fn, args, grads, scaling=2.0, seed=1):
    leaves = {k: (v.detach().clone().requires_grad_(k in grads) if v is not None else None) for k, v in args.items()}
    out = fn(**leaves, scaling=scaling)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out)
    out.backward(dy)
    return out.detach(), {k: leaves[k].grad for k in grads}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("train_weight", [False, True])
def test_lora_linear_matches_reference_fp32(device, bias, train_weight):
    args = inputs(device, bias=bias)
    grads = ("x", "lora_a", "lora_b") + (("weight",) if train_weight else ()) + (("bias",) if bias else ())
    support.backend_usage(reset=True)
    out, got = run(TF.lora_linear, args, grads)
    assert "lora_linear" in support.backend_usage()
    want_out, want = run(ref.lora_linear, args, grads)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    for k in grads:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5, msg=k)


def test_frozen_base_weight_gets_no_gradient_and_only_x_and_xa_are_kept(device):
    args = inputs(device, m=(6,), k=32, n=16, r=2)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    x = args["x"].requires_grad_(True)
    a, b = args["lora_a"].requires_grad_(True), args["lora_b"].requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = TF.lora_linear(x, args["weight"], a, b, scaling=0.5)
    out.sum().backward()
    assert args["weight"].grad is None
    activations = [t for t in saved if t.data_ptr() not in {p.data_ptr() for p in (args["weight"], a, b)}]
    assert sorted(tuple(t.shape) for t in activations) == [(6, 2), (6, 32)]  # x A^T and x, nothing (M, N)


def test_no_grad_and_no_input_grad(device):
    args = inputs(device)
    with torch.no_grad():
        out = TF.lora_linear(**args, scaling=3.0)
    torch.testing.assert_close(out, ref.lora_linear(**args, scaling=3.0), rtol=1e-5, atol=1e-5)
    # x without grad (a first layer over frozen embeddings): only the adapters' gradients
    _, got = run(TF.lora_linear, args, ("lora_a", "lora_b"))
    _, want = run(ref.lora_linear, args, ("lora_a", "lora_b"))
    for k in got:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_bfloat16_close_to_float32(device):
    args = inputs(device, m=(64,), k=64, n=48, r=8)
    low = {k: (v.bfloat16() if v is not None else None) for k, v in args.items()}
    out, got = run(TF.lora_linear, low, ("x", "lora_a", "lora_b"))
    want_out, want = run(ref.lora_linear, args, ("x", "lora_a", "lora_b"))
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got.values())
    # as close to the fp32 truth as the unfused bf16 computation (PEFT's), in relative L2
    base_out, base = run(ref.lora_linear, low, ("x", "lora_a", "lora_b"))
    assert rel_l2(out.float(), want_out) <= 1.5 * rel_l2(base_out.float(), want_out) + 1e-3
    for k in got:
        assert rel_l2(got[k].float(), want[k]) <= 1.5 * rel_l2(base[k].float(), want[k]) + 1e-3, k


def test_lora_linear_bad_input(device):
    a = inputs(device)
    with pytest.raises(ValueError, match="lora_a must have shape"):
        TF.lora_linear(a["x"], a["weight"], a["lora_a"][:, :3], a["lora_b"])
    with pytest.raises(ValueError, match="lora_b must have shape"):
        TF.lora_linear(a["x"], a["weight"], a["lora_a"], a["lora_b"][:, :2])
    with pytest.raises(ValueError, match="x's last dimension"):
        TF.lora_linear(a["x"][..., :3], a["weight"], a["lora_a"], a["lora_b"])
    with pytest.raises(ValueError, match="bias must have shape"):
        TF.lora_linear(a["x"], a["weight"], a["lora_a"], a["lora_b"], a["weight"][0, :3])
    with pytest.raises(TypeError, match="lora_b must have x's dtype"):
        TF.lora_linear(a["x"], a["weight"], a["lora_a"], a["lora_b"].double())
    with pytest.raises(TypeError, match="scaling must be a real number"):
        TF.lora_linear(a["x"], a["weight"], a["lora_a"], a["lora_b"], scaling="2")
    with pytest.raises(ValueError, match="scaling must be a finite"):
        TF.lora_linear(a["x"], a["weight"], a["lora_a"], a["lora_b"], scaling=float("inf"))


@pytest.mark.parametrize("op", ["lora_linear", "lora_glu_mlp", "lora_gate_up_mlp"])
def test_output_may_be_modified_in_place(device, op):
    """The LoRA nodes' outputs take in-place ops, as Llama 4's MoE block does to its shared expert's output
    (``out.add_(routed)``): each node returns its (tokens, N) buffer and the (..., N) view is taken outside it (a view
    returned by a custom Function raised 'Output 0 of LoRAGLUMLPFunction is a view and is being modified inplace' on
    ``tigon bench --e2e --lora`` of Llama 4); the gradients are those of the reference with the same in-place add."""
    import test_lora_gate_up
    import test_lora_mlp

    args, grads, scalings = {
        "lora_linear": (inputs(device), ("x", "lora_a", "lora_b"), dict(scaling=2.0)),
        "lora_glu_mlp": (test_lora_mlp.inputs(device), test_lora_mlp.GRADS,
                         dict(gate_scaling=2.0, up_scaling=0.5, down_scaling=1.5)),
        "lora_gate_up_mlp": (test_lora_gate_up.inputs(device), test_lora_gate_up.GRADS,
                             dict(gate_up_scaling=2.0, down_scaling=1.5)),
    }[op]

    def run_in_place(fn):
        leaves = {k: (v.detach().clone().requires_grad_(k in grads) if v is not None else None)
                  for k, v in args.items()}
        out = fn(**leaves, **scalings)
        out.add_(out.detach() ** 2)  # in place, as HF's out.add_(...)
        (out * torch.linspace(-1, 1, out.shape[-1], device=device)).sum().backward()
        return out.detach(), {k: leaves[k].grad for k in grads}

    support.backend_usage(reset=True)
    out, got = run_in_place(getattr(TF, op))
    assert op in support.backend_usage()
    want_out, want = run_in_place(getattr(ref, op))
    assert out.shape == args["x"].shape[:-1] + want_out.shape[-1:]
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    for k in grads:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-5, msg=k)
