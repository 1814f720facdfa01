"""tigon.nn drop-ins: same parameters / state dicts as the modules they replace, same outputs and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tigon
from tigon import nn as tnn
from tigon import support
from tigon.numerics import rel_l2

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # as in conftest: kernels compiled or interpreted


def _grads(module, x, upstream):
    module.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    y.backward(upstream)
    return y.detach(), x.grad, {n: p.grad for n, p in module.named_parameters()}


def assert_module_matches(ours, theirs, x, tol=1e-5):
    """Forward and every gradient of ``ours`` match ``theirs`` (same state dict) within rel L2 ``tol``."""
    ours, theirs, x = ours.to(DEVICE), theirs.to(DEVICE), x.to(DEVICE)
    ours.load_state_dict(theirs.state_dict())
    up = torch.randn_like(theirs(x))
    y1, gx1, gp1 = _grads(ours, x, up)
    y2, gx2, gp2 = _grads(theirs, x, up)
    assert y1.dtype == y2.dtype and y1.shape == y2.shape
    assert rel_l2(y1, y2) < tol and rel_l2(gx1, gx2) < tol
    assert gp1.keys() == gp2.keys()
    for n in gp2:
        assert rel_l2(gp1[n], gp2[n]) < tol, n


def test_rms_norm_matches_hf_llama_and_gemma():
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    x = torch.randn(2, 7, 96)
    hf = LlamaRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        hf.weight.normal_()
    ours = tnn.RMSNorm(96, eps=1e-5)
    assert set(ours.state_dict()) == {"weight"} and ours.variance_epsilon == 1e-5 == ours.eps
    assert_module_matches(ours, hf, x)
    g = GemmaRMSNorm(96, eps=1e-6)
    with torch.no_grad():
        g.weight.normal_()
    gemma = tnn.RMSNorm(96, eps=1e-6, offset=1.0, casting_mode="gemma")
    assert torch.equal(gemma.weight, torch.zeros(96))  # Gemma's init, so (1 + w) starts at identity
    assert_module_matches(gemma, g, x)


def test_rms_norm_errors():
    with pytest.raises(ValueError, match="casting_mode"):
        tnn.RMSNorm(8, casting_mode="bf16")
    with pytest.raises(ValueError, match=r"x.s last dimension \(9\) must equal weight.s size \(8\)"):
        tnn.RMSNorm(8).to(DEVICE)(torch.randn(2, 9, device=DEVICE))


def test_fused_add_rms_norm_matches_hf_decoder_lines():
    pytest.importorskip("transformers")
    from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def decoder_lines(norm):  # HF: hidden_states = residual + hidden_states; residual = hidden_states; norm
        def run(hidden_states, residual):
            hidden_states = residual + hidden_states
            return norm(hidden_states), hidden_states
        return run

    for hf, ours in ((LlamaRMSNorm(96, eps=1e-5), tnn.FusedAddRMSNorm(96, eps=1e-5)),
                     (GemmaRMSNorm(96, eps=1e-6), tnn.FusedAddRMSNorm(96, offset=1.0, casting_mode="gemma"))):
        assert set(ours.state_dict()) == {"weight"} and torch.equal(ours.weight, hf.weight)  # same init
        with torch.no_grad():
            hf.weight.normal_()
        ours.load_state_dict(hf.state_dict())
        ours, hf = ours.to(DEVICE), hf.to(DEVICE)
        h0, r0 = torch.randn(2, 7, 96, device=DEVICE), torch.randn(2, 7, 96, device=DEVICE) * 3
        dy, ds = torch.randn_like(h0), torch.randn_like(h0)
        got = []
        for run in (ours, decoder_lines(hf)):
            h, r = h0.clone().requires_grad_(True), r0.clone().requires_grad_(True)
            y, s = run(h, r)
            torch.autograd.backward([y, s], [dy, ds])
            got.append((y, s, h.grad, r.grad))
        (y1, s1, gh1, gr1), (y2, s2, gh2, gr2) = got
        assert rel_l2(y1, y2) < 1e-5 and torch.equal(s1, s2)
        assert rel_l2(gh1, gh2) < 1e-5 and rel_l2(gr1, gr2) < 1e-5
        assert rel_l2(ours.weight.grad, hf.weight.grad) < 1e-5
    assert "in_place=True" in repr(tnn.FusedAddRMSNorm(8, in_place=True))
    assert torch.equal(tnn.FusedAddRMSNorm(8, offset=1.0, init_fn="ones").weight, torch.ones(8))
    with pytest.raises(ValueError, match="init_fn"):
        tnn.FusedAddRMSNorm(8, init_fn="normal")
    with pytest.raises(ValueError, match="casting_mode"):
        tnn.FusedAddRMSNorm(8, casting_mode="t5")
    with pytest.raises(ValueError, match="residual must have x's shape"):
        tnn.FusedAddRMSNorm(8).to(DEVICE)(torch.randn(2, 8, device=DEVICE), torch.randn(3, 8, device=DEVICE))


def test_layer_norm_is_a_torch_layer_norm():
    # Liger's constructor (tests/test_liger_dropin.py), still a torch.nn.LayerNorm: a torch LayerNorm's state dict
    # loads and the forward and gradients match at the same eps
    ref = torch.nn.LayerNorm(80, eps=1e-5)
    with torch.no_grad():
        ref.weight.normal_()
        ref.bias.normal_()
    ours = tnn.LayerNorm(80, eps=1e-5)
    assert isinstance(ours, torch.nn.LayerNorm) and set(ours.state_dict()) == {"weight", "bias"}
    assert_module_matches(ours, ref, torch.randn(3, 5, 80) * 2 + 0.5)
    with pytest.raises(ValueError, match="last dimension only"):
        tnn.LayerNorm((4, 80))
    assert torch.nn.LayerNorm.forward is not tnn.LayerNorm.forward  # torch.nn itself is never modified


def test_swiglu_mlp_matches_hf_llama_mlp():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaMLP

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, mlp_bias=True)
    hf = LlamaMLP(cfg)
    ours = tnn.SwiGLUMLP(64, 160, bias=True)
    assert set(ours.state_dict()) == set(hf.state_dict())
    support.backend_usage(reset=True)
    assert_module_matches(ours, hf, torch.randn(2, 5, 64))
    assert "swiglu" in support.backend_usage()


def test_geglu_mlp_matches_gelu_gated_mlp():
    for approximate in ("tanh", "none"):
        ours = tnn.GeGLUMLP(48, 80, approximate=approximate)

        class Ref(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.gate_proj = torch.nn.Linear(48, 80, bias=False)
                self.up_proj = torch.nn.Linear(48, 80, bias=False)
                self.down_proj = torch.nn.Linear(80, 48, bias=False)

            def forward(self, x):
                return self.down_proj(F.gelu(self.gate_proj(x), approximate=approximate) * self.up_proj(x))

        assert_module_matches(ours, Ref(), torch.randn(6, 48))
    with pytest.raises(ValueError, match="approximate"):
        tnn.GeGLUMLP(8, 16, approximate="erf")


def test_cross_entropy_loss_module():
    logits = torch.randn(2, 6, 50, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 50, (2, 6), device=DEVICE)
    target[0, 0] = -100
    for reduction in ("mean", "sum", "none"):
        ours = tnn.CrossEntropyLoss(reduction=reduction)(logits, target)
        ref = F.cross_entropy(logits.reshape(-1, 50), target.reshape(-1), reduction=reduction)
        if reduction == "none":
            assert ours.shape == target.shape
            ref = ref.reshape(target.shape)
        assert rel_l2(ours, ref) < 1e-5
    g1, = torch.autograd.grad(tnn.CrossEntropyLoss()(logits, target), logits)
    g2, = torch.autograd.grad(F.cross_entropy(logits.reshape(-1, 50), target.reshape(-1)), logits)
    assert rel_l2(g1, g2) < 1e-5
    n = 7
    ours = tnn.CrossEntropyLoss()(logits, target, num_items_in_batch=n)
    ref = F.cross_entropy(logits.reshape(-1, 50), target.reshape(-1), reduction="sum") / n
    assert rel_l2(ours, ref) < 1e-5
    with pytest.raises(ValueError, match="leading shape"):
        tnn.CrossEntropyLoss()(logits, target[:, :3])
    assert "ignore_index=-100" in repr(tnn.CrossEntropyLoss())


def test_fused_linear_cross_entropy_loss_module():
    hidden = torch.randn(2, 5, 32, device=DEVICE, requires_grad=True)
    weight = torch.randn(70, 32, device=DEVICE, requires_grad=True)
    bias = torch.randn(70, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 70, (2, 5), device=DEVICE)
    target[1, -1] = -100
    mod = tnn.FusedLinearCrossEntropyLoss(logit_scale=0.5)
    loss = mod(hidden, weight, target, bias)
    ref = F.cross_entropy(0.5 * (hidden @ weight.T + bias).reshape(-1, 70), target.reshape(-1))
    assert rel_l2(loss, ref) < 1e-5
    g1 = torch.autograd.grad(loss, (hidden, weight, bias))
    g2 = torch.autograd.grad(ref, (hidden, weight, bias))
    for a, b in zip(g1, g2):
        assert rel_l2(a, b) < 1e-4
    per_token = tnn.FusedLinearCrossEntropyLoss(reduction="none")(hidden, weight, target)
    assert per_token.shape == target.shape
    with pytest.raises(ValueError, match="leading shape"):
        mod(hidden, weight, target.reshape(-1)[:4])
    lean = tnn.FusedLinearCrossEntropyLoss(logit_scale=0.5, accum_dtype=torch.float32)  # fp32 weight: exact
    assert "accum_dtype=torch.float32" in repr(lean)
    assert rel_l2(lean(hidden, weight, target, bias), ref) < 1e-5
    with pytest.raises(ValueError, match="accum_dtype"):
        tnn.FusedLinearCrossEntropyLoss(accum_dtype=torch.float16)(hidden, weight, target)


def test_lazy_exports():
    assert tigon.nn is tnn
    assert callable(tigon.patch) and callable(tigon.unpatch) and tigon.PatchReport.__name__ == "PatchReport"

