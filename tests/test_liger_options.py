"""Liger-Kernel's options on ops Tigon already has (issue 21): RMSNorm without a weight (``W=None``,
``LigerRMSNorm(elementwise_affine=False)``) and RoPE with a 2-D (T, R) cos / sin table; an odd rotated width is
refused (rotate-half has no partner for its last dim)."""

import pytest
import torch

from tigon import functional as F
from tigon import nn as tnn
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.rms_norm import rms_norm as ref_rms_norm
from tigon.reference.rope import rope as ref_rope

FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}  # as tests/test_rms_norm.py


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("casting_mode", ["llama", "gemma", "none"])
def test_rms_norm_without_weight_matches_float64(device, dtype, casting_mode):
    x = torch.randn(3, 5, 40, device=device, dtype=dtype) * 3 + 0.5
    inputs = dict(x=x, weight=None, eps=1e-6, offset=1.0, casting_mode=casting_mode)  # offset: unused, as Liger's
    checks = compare(F.rms_norm, ref_rms_norm, inputs, ["x"], factor=FACTOR[dtype])
    assert {c.tensor for c in checks} == {"out", "grad_x"}
    assert_close_to_truth(checks)
    assert F.rms_norm(x, None, casting_mode=casting_mode).dtype == dtype


def test_rms_norm_without_weight_non_contiguous_runs_a_kernel(device):
    x = torch.randn(40, 6, device=device).t()  # (6, 40) with a strided last dimension
    before = x.clone()
    support.backend_usage(reset=True)
    assert_close_to_truth(compare(F.rms_norm, ref_rms_norm, dict(x=x, weight=None), ["x"]))
    assert set(support.backend_usage()["rms_norm"]) == {"triton" if device == "cuda" else "interpreter"}
    assert torch.equal(x, before)


def test_rms_norm_module_without_weight(device):
    m = tnn.RMSNorm(24, eps=1e-5, elementwise_affine=False).to(device)
    assert m.weight is None and list(m.state_dict()) == [] and "elementwise_affine=False" in repr(m)
    x = torch.randn(2, 3, 24, device=device)
    torch.testing.assert_close(m(x), ref_rms_norm(x.double(), None, 1e-5).float(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="hidden_size 24"):
        m(torch.randn(2, 25, device=device))
    with pytest.raises(TypeError, match="elementwise_affine must be a bool"):
        tnn.RMSNorm(24, elementwise_affine=0)


def _tables(batch, t, r, dtype, device):
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    pos = torch.arange(t, dtype=torch.float64)[None, :] + 3.0 * torch.arange(batch, dtype=torch.float64)[:, None]
    emb = torch.cat((pos[..., None] * inv_freq,) * 2, dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,r", [(16, 16), (13, 8)], ids=["full", "odd_head_dim_partial"])
def test_rope_two_dim_tables(device, dtype, d, r):
    # (T, R) cos / sin (Liger's liger_rope takes them) mean the (1, T, R) table: every batch row the same positions
    q = torch.randn(2, 5, 3 * d, device=device, dtype=dtype).view(2, 5, 3, d).transpose(1, 2)
    k = torch.randn(2, 5, 1 * d, device=device, dtype=dtype).view(2, 5, 1, d).transpose(1, 2)
    cos, sin = _tables(1, 5, r, dtype, device)
    checks = compare(F.rope, ref_rope, dict(q=q, k=k, cos=cos[0], sin=sin[0]), ["q", "k"])
    assert_close_to_truth(checks)
    for got, want in zip(F.rope(q, k, cos[0], sin[0]), F.rope(q, k, cos, sin)):
        assert torch.equal(got, want)


def test_rope_refuses_odd_rotated_width_and_bad_tables(device):
    q = torch.randn(1, 2, 4, 7, device=device)
    k = torch.randn(1, 1, 4, 7, device=device)
    cos, sin = _tables(1, 4, 6, torch.float32, device)
    with pytest.raises(ValueError, match="must be even.*odd head dim can only be rotated partially"):
        F.rope(q, k, torch.ones(4, 7, device=device), torch.zeros(4, 7, device=device))
    with pytest.raises(ValueError, match=r"sin must have shape \(1 or 1, 4, 6\) or \(4, 6\)"):
        F.rope(q, k, cos[0], sin[0, :3])
    with pytest.raises(ValueError, match="cos must have 2 or 3 dimensions"):
        F.rope(q, k, cos[0, 0], sin[0, 0])


@pytest.mark.parametrize("kw", [dict(), dict(reduction="none", softcap=4.0), dict(logit_scale=-0.5, bias=True)],
                         ids=["mean", "none_softcap", "negative_scale_bias"])
def test_flce_return_predicted_tokens(device, kw):
    # Liger's return_predicted_tokens: each token's argmax class without the logits, -1 where ignored; the loss and
    # the gradients are those of the call without it
    from tigon.reference.fused_linear_cross_entropy import fused_linear_cross_entropy as ref_flce

    kw = dict(kw)
    h = torch.randn(9, 16, device=device)
    w = torch.randn(40, 16, device=device) / 2
    b = torch.randn(40, device=device) if kw.pop("bias", False) else None
    t = torch.randint(0, 40, (9,), device=device)
    t[[2, 5]] = -100
    out = F.fused_linear_cross_entropy(h, w, t, b, return_predicted_tokens=True, **kw)
    want = ref_flce(h.double(), w.double(), t, None if b is None else b.double(), return_predicted_tokens=True, **kw)
    assert out.predicted_tokens.dtype == torch.int64 and out.z_loss is None and out.accuracy is None
    assert torch.equal(out.predicted_tokens, want.predicted_tokens)
    assert out.predicted_tokens[2] == out.predicted_tokens[5] == -1
    assert torch.equal(out.loss, F.fused_linear_cross_entropy(h, w, t, b, **kw))
    with pytest.raises(TypeError, match="return_predicted_tokens must be a bool"):
        F.fused_linear_cross_entropy(h, w, t, return_predicted_tokens=1)


def test_loss_modules_predicted_tokens_in_target_shape(device):
    h, w = torch.randn(2, 3, 8, device=device), torch.randn(20, 8, device=device)
    t = torch.randint(0, 20, (2, 3), device=device)
    t[1, 2] = -100
    for out in (tnn.FusedLinearCrossEntropyLoss(reduction="none", return_predicted_tokens=True)(h, w, t),
                tnn.CrossEntropyLoss(reduction="none", return_predicted_tokens=True)(h @ w.T, t)):
        assert out.loss.shape == out.predicted_tokens.shape == (2, 3) and out.predicted_tokens[1, 2] == -1
        assert torch.equal(out.predicted_tokens[0], (h[0] @ w.T).argmax(-1))


@pytest.mark.parametrize("kw", [dict(), dict(reduction="none", softcap=3.0, lse_square_scale=1e-2),
                                dict(label_smoothing=0.1, class_weight=True)], ids=["mean", "none_z", "smoothing"])
def test_flce_use_token_scaling(device, kw):
    # Liger's use_token_scaling: each token's loss times its target's detached probability, then the reduction
    from tigon.reference.fused_linear_cross_entropy import fused_linear_cross_entropy as ref_flce

    kw = dict(kw, class_weight=torch.rand(40, device=device) + 0.5 if kw.get("class_weight") else None)
    t = torch.randint(0, 40, (9,), device=device)
    t[3] = -100
    inputs = dict(hidden=torch.randn(9, 16, device=device), weight=torch.randn(40, 16, device=device) / 2, target=t)
    checks = compare(lambda **a: F.fused_linear_cross_entropy(**a, use_token_scaling=True, **kw),
                     lambda **a: ref_flce(**a, use_token_scaling=True, **kw), inputs, ["hidden", "weight"])
    assert_close_to_truth(checks)
    # the reference is Liger's definition: the per-token losses times the target's probability
    h, w = inputs["hidden"].double(), inputs["weight"].double()
    p = torch.softmax(h @ w.T, -1).gather(1, t.clamp_min(0)[:, None]).squeeze(1) * (t != -100)
    torch.testing.assert_close(ref_flce(h, w, t, reduction="none", use_token_scaling=True),
                               ref_flce(h, w, t, reduction="none") * p)
    with pytest.raises(TypeError, match="use_token_scaling must be a bool"):
        F.fused_linear_cross_entropy(inputs["hidden"], inputs["weight"], t, use_token_scaling="yes")


@pytest.mark.parametrize("kw", [dict(reduction="none", softcap=2.0), dict(grad_in_forward=True)],
                         ids=["none_softcap", "grad_in_forward"])
def test_cross_entropy_return_predicted_tokens(device, kw):
    from tigon.reference.cross_entropy import cross_entropy as ref_ce

    x = torch.randn(7, 30, device=device)
    t = torch.randint(0, 30, (7,), device=device)
    t[1] = -100
    logits = (x * 1.0).requires_grad_() if kw.get("grad_in_forward") else x  # grad_in_forward: a non-leaf
    out = F.cross_entropy(logits * 1.0 if logits.requires_grad else logits, t, return_predicted_tokens=True, **kw)
    want = ref_ce(x.double(), t, return_predicted_tokens=True,
                  **{k: v for k, v in kw.items() if k != "grad_in_forward"})
    assert torch.equal(out.predicted_tokens, want.predicted_tokens) and out.predicted_tokens[1] == -1


def _norm_grads(x, w, in_place, tail):
    """x's and w's gradients of ``tail(rms_norm(x, w))``, and whether x's gradient is y's incoming one."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    seen = []
    y = F.rms_norm(x, w, in_place=in_place)
    y.register_hook(lambda g: seen.append(g.data_ptr()))  # keeps no reference to g
    tail(y).backward()
    return x.grad, w.grad, x.grad.data_ptr() == seen[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_in_place_backward(device, dtype):
    # Liger's in_place: dx written over dy, only where nothing else reads dy; values never depend on it
    x = torch.randn(5, 3, 24, device=device, dtype=dtype)
    w = torch.rand(24, device=device, dtype=dtype) + 0.5
    c = torch.randn(5, 3, 24, device=device, dtype=dtype)
    want = _norm_grads(x, w, False, lambda y: (y * c).sum())
    got = _norm_grads(x, w, True, lambda y: (y * c).sum())  # dy: MulBackward's fresh tensor, owned
    assert got[2] and not want[2]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert_close_to_truth(compare(lambda **a: F.rms_norm(**a, in_place=True), ref_rms_norm, dict(x=x, weight=w),
                                  ["x", "weight"], factor=FACTOR[dtype]))
    # y's gradient shared with r's branch, which runs after the norm's backward (Gemma-2's sandwich norms)
    r = torch.randn_like(x, requires_grad=True)
    r2 = r * 1.0
    shared = _norm_grads(x, w, True, lambda y: ((y + r2) * c).sum())
    assert not shared[2] and torch.equal(shared[0], want[0]) and torch.equal(r.grad, c)
    # a gradient the caller passed, or kept from a hook, is never written
    g = torch.randn_like(x)
    g0 = g.clone()
    xg = x.detach().requires_grad_()
    torch.autograd.grad(F.rms_norm(xg, w), xg, g)
    kept = []
    y = F.rms_norm(xg, w)
    y.register_hook(kept.append)
    (y * c).sum().backward()
    assert torch.equal(g, g0) and torch.equal(kept[0], c)


def test_rms_norm_in_place_argument(device):
    m = tnn.RMSNorm(8, in_place=False).to(device)
    assert "in_place=False" in repr(m) and tnn.RMSNorm(8).in_place is True
    x = torch.randn(3, 8, device=device)
    torch.testing.assert_close(m(x), F.rms_norm(x, m.weight, 1e-6, 0.0, "llama", True))
    with pytest.raises(TypeError, match="in_place must be a bool"):
        F.rms_norm(x, m.weight, in_place=1)
    with pytest.raises(TypeError, match="in_place must be a bool"):
        tnn.RMSNorm(8, in_place="no")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["swiglu", "geglu", "glu_linear"])
def test_glu_gate_and_down_multipliers(device, dtype, op):
    # HF FalconH1MLP's muP multipliers: act(gate * gm) * up * dm, the multipliers as kernel scalars; odd sizes, gate
    # and up read in place from one fused (tokens, 2 I) projection (a strided, non-contiguous view)
    from tigon.reference import glu as ref_glu

    # (on CUDA, more rows: a tolerance relative to the original's own error needs enough elements for both errors
    # to be stable statistics; at 7 x 9 outputs one rounding moves glu_linear's bf16 d_up error by 1.4x on an H100)
    rows, inter, hidden = (7, 13, 9) if device == "cpu" else (263, 77, 45)
    gate_up = torch.randn(rows, 2 * inter, device=device, dtype=dtype) * 2
    inputs = dict(gate=gate_up[:, :inter], up=gate_up[:, inter:])
    if op == "glu_linear":
        inputs.update(weight=torch.randn(hidden, inter, device=device, dtype=dtype) / 4)
    mult = dict(gate_multiplier=1.5, down_multiplier=0.25)
    fn = getattr(F, op)
    checks = compare(lambda **a: fn(**a, **mult), lambda **a: getattr(ref_glu, op)(**a, **mult), inputs,
                     [k for k in inputs if k != "up"] + ["up"], factor=FACTOR[dtype])
    assert_close_to_truth(checks)
    # the multipliers are what FalconH1MLP computes (down_proj without bias: dm moves into the product)
    g, u = inputs["gate"].double(), inputs["up"].double()
    want = u * torch.nn.functional.silu(g * 1.5) * 0.25
    if op == "swiglu":
        torch.testing.assert_close(ref_glu.swiglu(g, u, **mult), want)
    with pytest.raises(TypeError, match="gate_multiplier must be a real number"):
        fn(**inputs, gate_multiplier="2")
    with pytest.raises(ValueError, match="down_multiplier must be a finite number"):
        fn(**inputs, down_multiplier=float("inf"))


def test_gemma4_double_wide_mlp_is_patched(device):
    # Gemma 4's use_double_wide_mlp: KV-sharing layers have MLPs of twice config.intermediate_size; the patched
    # forward runs on the module's own projections, so the wide MLP is replaced and exact like the others
    transformers = pytest.importorskip("transformers")
    if "gemma4_text" not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} has no Gemma 4")
    import tigon

    cfg = transformers.AutoConfig.for_model(
        "gemma4_text", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_kv_shared_layers=1, use_double_wide_mlp=True,
        layer_types=["full_attention"] * 2, hidden_size_per_layer_input=8, vocab_size_per_layer_input=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(device)
    wide = model.model.layers[1].mlp
    assert wide.up_proj.out_features == 2 * cfg.intermediate_size
    x = torch.randn(2, 3, 32, device=device)
    truth = [t.double() for t in (x, wide.gate_proj.weight, wide.up_proj.weight, wide.down_proj.weight)]

    def run(mlp, xx):
        xx = xx.detach().requires_grad_()
        out = mlp(xx)
        out.pow(2).sum().backward()
        return out.detach(), xx.grad

    want = run(_with_weights(type(wide)(cfg, 1).to(device, torch.float64), truth[1:]), truth[0])  # float64 truth
    report = tigon.patch(model)
    assert report.counts["mlp"] == 2, str(report)
    got = run(wide, x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-6)
    tigon.unpatch(model)


def _with_weights(mlp, weights):
    with torch.no_grad():
        for lin, w in zip((mlp.gate_proj, mlp.up_proj, mlp.down_proj), weights):
            lin.weight.copy_(w)
    return mlp


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,r,ids_shape", [(16, 16, (2, 6)), (13, 8, (6,))], ids=["full", "odd_head_dim_1d_ids"])
def test_rope_position_ids(device, dtype, d, r, ids_shape):
    # Liger's liger_rope(q, k, cos, sin, position_ids=None, unsqueeze_dim=1): with a 2-D table of every position
    # (P, R) the ids pick its rows (HF's cos[position_ids] before 4.38): packed sequences restart their positions
    q = torch.randn(2, 6, 3 * d, device=device, dtype=dtype).view(2, 6, 3, d).transpose(1, 2)
    k = torch.randn(2, 6, 1 * d, device=device, dtype=dtype).view(2, 6, 1, d).transpose(1, 2)
    table_cos, table_sin = (t[0] for t in _tables(1, 9, r, dtype, device))  # (P=9, R): positions 0..8
    pos = torch.tensor([[0, 1, 2, 0, 1, 2], [4, 5, 6, 7, 8, 0]], device=device)[: 2 if len(ids_shape) == 2 else 1]
    pos = pos.reshape(ids_shape)
    inputs = dict(q=q, k=k, cos=table_cos, sin=table_sin, position_ids=pos)
    assert_close_to_truth(compare(F.rope, ref_rope, inputs, ["q", "k"], factor=FACTOR[dtype]))
    rows = pos if pos.dim() == 2 else pos[None]
    for got, want in zip(F.rope(**inputs), F.rope(q, k, table_cos[rows], table_sin[rows])):
        assert torch.equal(got, want)
    # per-position (3-D) tables: position_ids is not read (as Liger); Liger's positional order
    cos3, sin3 = table_cos[rows], table_sin[rows]
    for got, want in zip(F.rope(q, k, cos3, sin3, pos, 1), F.rope(q, k, cos3, sin3)):
        assert torch.equal(got, want)


def test_rope_position_ids_errors(device):
    q, k = torch.randn(1, 2, 4, 8, device=device), torch.randn(1, 1, 4, 8, device=device)
    cos, sin = _tables(1, 4, 8, torch.float32, device)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor or None.*unsqueeze_dim by keyword"):
        F.rope(q, k, cos, sin, 2)
    with pytest.raises(TypeError, match="position_ids must be an integer tensor"):
        F.rope(q, k, cos, sin, torch.zeros(1, 4, device=device))
    with pytest.raises(ValueError, match=r"position_ids must have shape \(1 or 1, 4\) or \(4,\)"):
        F.rope(q, k, cos[0], sin[0], torch.zeros(1, 5, dtype=torch.long, device=device))


@pytest.mark.parametrize("shift", [4, -1])
def test_rope_position_ids_beyond_the_table_name_it_on_the_cpu(shift):
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 1, 4, 8)
    cos, sin = (t[0] for t in _tables(1, 4, 8, torch.float32, "cpu"))  # (P=4, R=8)
    bad = torch.arange(4)[None] + shift
    with pytest.raises(ValueError,
                       match=rf"position_ids must be in \[0, 4\) .* found {bad.max() if shift > 0 else -1}"):
        F.rope(q, k, cos, sin, position_ids=bad)
    with pytest.raises(ValueError, match=r"position_ids must be in \[0, 4\)"):  # the reference, the same check
        ref_rope(q, k, cos, sin, position_ids=bad)


@pytest.mark.parametrize("kw", [dict(), dict(class_weight=True), dict(use_token_scaling=True, softcap=3.0)],
                         ids=["plain", "class_weight", "token_scaling"])
def test_flce_per_token_losses_and_z_loss(device, kw):
    # Liger's reduction="none" with return_z_loss: per-token losses (z part included) and each token's z-loss
    # lse_square_scale * lse**2 as a separate, detached output, 0 where ignored; "mean" averages z over the
    # non-ignored tokens, unweighted
    from tigon.reference.fused_linear_cross_entropy import fused_linear_cross_entropy as ref_flce

    kw = dict(kw, class_weight=torch.rand(40, device=device) + 0.5 if kw.get("class_weight") else None)
    h, w = torch.randn(11, 16, device=device), torch.randn(40, 16, device=device) / 2
    t = torch.randint(0, 40, (11,), device=device)
    t[[0, 7]] = -100
    z = dict(lse_square_scale=1e-2, return_z_loss=True)
    checks = compare(lambda **a: F.fused_linear_cross_entropy(**a, reduction="none", **z, **kw).loss,
                     lambda **a: ref_flce(**a, reduction="none", **z, **kw).loss,
                     dict(hidden=h, weight=w, target=t), ["hidden", "weight"])
    assert_close_to_truth(checks)
    out = F.fused_linear_cross_entropy(h, w, t, reduction="none", **z, **kw)
    hd, wd = h.double(), w.double()
    x = hd @ wd.T
    if kw.get("softcap"):
        x = kw["softcap"] * torch.tanh(x / kw["softcap"])
    zt = 1e-2 * torch.logsumexp(x, -1) ** 2 * (t != -100)
    if kw.get("use_token_scaling"):
        zt = zt * torch.softmax(x, -1).gather(1, t.clamp_min(0)[:, None]).squeeze(1)
    assert out.z_loss.shape == out.loss.shape == (11,) and not out.z_loss.requires_grad
    torch.testing.assert_close(out.z_loss.double(), zt, rtol=1e-5, atol=1e-7)
    assert out.z_loss[0] == out.loss[0] == 0
    mean = F.fused_linear_cross_entropy(h, w, t, **z, **kw)
    torch.testing.assert_close(mean.z_loss.double(), zt.sum() / (t != -100).sum(), rtol=1e-5, atol=1e-7)


def test_flce_liger_names(device):
    # ce_weight / return_token_accuracy (Liger's names), LossOutput.token_accuracy, Liger's forward order refused
    h, w = torch.randn(2, 3, 8, device=device), torch.randn(20, 8, device=device)
    t = torch.randint(0, 20, (2, 3), device=device)
    cw = torch.rand(20, device=device) + 0.5
    got = tnn.FusedLinearCrossEntropyLoss(reduction="none", ce_weight=cw, return_token_accuracy=True,
                                          lse_square_scale=1e-3, return_z_loss=True)(h, w, t)
    want = tnn.FusedLinearCrossEntropyLoss(reduction="none", class_weight=cw, return_accuracy=True,
                                           lse_square_scale=1e-3, return_z_loss=True)(h, w, t)
    assert got.loss.shape == got.z_loss.shape == (2, 3) and torch.equal(got.loss, want.loss)
    assert got.token_accuracy is got.accuracy and torch.equal(got.accuracy, want.accuracy)
    flat = F.fused_linear_cross_entropy(h[0], w, t[0], ce_weight=cw, return_token_accuracy=True)
    assert torch.equal(flat.loss,
                       F.fused_linear_cross_entropy(h[0], w, t[0], class_weight=cw, return_accuracy=True).loss)
    logits = h[0] @ w.T
    ce = tnn.CrossEntropyLoss(return_token_accuracy=True)(logits, t[0])
    assert torch.equal(ce.token_accuracy, F.cross_entropy(logits, t[0], return_accuracy=True).accuracy)
    assert torch.equal(F.cross_entropy(logits, t[0], return_token_accuracy=True).accuracy, ce.accuracy)
    with pytest.raises(TypeError, match="return_accuracy or return_token_accuracy"):
        F.cross_entropy(logits, t[0], return_accuracy=True, return_token_accuracy=True)
    with pytest.raises(TypeError, match="class_weight or ce_weight"):
        F.fused_linear_cross_entropy(h[0], w, t[0], class_weight=cw, ce_weight=cw)
    with pytest.raises(ValueError, match="Liger-Kernel's LigerFusedLinearCrossEntropyLoss takes"):
        F.fused_linear_cross_entropy(w, h[0], torch.zeros(3, dtype=torch.long, device=device))
    # Liger's module attributes: ce_weight (the class_weight buffer) and return_token_accuracy, read and set
    m = tnn.FusedLinearCrossEntropyLoss(ce_weight=cw, return_token_accuracy=True)
    assert m.ce_weight is m.class_weight and m.return_token_accuracy and "class_weight" in dict(m.named_buffers())
    m.ce_weight, m.return_token_accuracy = None, False
    assert m.class_weight is None and not m.return_accuracy and not isinstance(m(h, w, t), tuple)
    m.ce_weight = cw
    assert torch.equal(m(h, w, t), F.fused_linear_cross_entropy(h.reshape(-1, 8), w,
                                                                t.reshape(-1), class_weight=cw))
    c = tnn.CrossEntropyLoss(return_token_accuracy=True)
    assert c.return_token_accuracy and c.return_accuracy
    c.return_token_accuracy = False
    assert not c.return_accuracy
    # N == V: the shapes agree in either order; the head's nn.Parameter tells Liger's order apart
    square, head = torch.randn(20, 8, device=device), torch.nn.Parameter(w.clone())
    with pytest.raises(TypeError, match="Liger-Kernel's order"):
        tnn.FusedLinearCrossEntropyLoss()(head, square, torch.zeros(20, dtype=torch.long, device=device))
    tnn.FusedLinearCrossEntropyLoss()(square, head, torch.zeros(20, dtype=torch.long, device=device)).backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("upstream", [1.0, 0.37], ids=["unit", "scaled"])
def test_tvd_gradient_formed_in_forward_is_rounded_once(device, dtype, upstream):
    # tvd forms sign(p - q) * round(scale / 2) in the forward (Liger's scheme); an upstream other than 1 rescales it
    # by g * c / round(c), so each element is one rounding of g * c, as the recomputing backward's
    from tigon.reference.divergence import tvd as ref_tvd

    p = torch.softmax(torch.randn(7, 33, device=device), -1).to(dtype)
    q = torch.softmax(torch.randn(7, 33, device=device), -1).to(dtype)
    labels = torch.tensor([0, -100, 2, 3, -100, 5, 6], device=device)
    for reduction in ("mean", "batchmean"):
        x = p.clone().requires_grad_()
        (F.tvd(x, q, labels, reduction) * upstream).backward()
        xr = p.double().requires_grad_()
        (ref_tvd(xr, q.double(), labels, reduction) * upstream).backward()
        assert torch.equal(x.grad, xr.grad.to(dtype)), reduction  # one rounding of the exact gradient


def test_rms_norm_in_place_in_a_patched_model(device, monkeypatch):
    # Gemma 2's sandwich norms: the post-attention / post-MLP norms' output gradient is shared with the residual
    # branch (left as it is), the others' is their own (written over); the step's gradients are the original's
    import tigon
    from model_matrix import build, require_family
    from tigon.kernels import rms_norm as krms

    require_family("gemma2")
    over_dy = []
    backward = krms.norm_backward  # (RMSNormFunction.backward's launcher: dx=dy where it writes over dy)

    def spy(dy, *args, **kwargs):
        over_dy.append(kwargs.get("dx") is dy)
        return backward(dy, *args, **kwargs)

    monkeypatch.setattr(krms, "norm_backward", spy)
    original, patched = build("gemma2", {}), build("gemma2", {})
    tigon.patch(patched)
    ids = torch.randint(0, 100, (1, 8), device=device)
    for m in (original, patched):
        m(input_ids=ids, labels=ids).loss.backward()
    assert 0 < sum(over_dy) < len(over_dy), over_dy
    for (name, p), q in zip(patched.named_parameters(), original.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    tigon.unpatch(patched)


def test_tvd_target_gradient_in_its_own_dtype(device):
    # the forward-formed gradients of a bf16 input and an fp32 target are each rescaled for their own rounding
    from tigon.reference.divergence import tvd as ref_tvd

    p = torch.softmax(torch.randn(5, 21, device=device), -1).to(torch.bfloat16).requires_grad_()
    q = torch.softmax(torch.randn(5, 21, device=device), -1).requires_grad_()
    (F.tvd(p, q) * 0.3).backward()
    pr, qr = p.detach().double().requires_grad_(), q.detach().double().requires_grad_()
    (ref_tvd(pr, qr) * 0.3).backward()
    assert torch.equal(p.grad, pr.grad.to(torch.bfloat16))
    torch.testing.assert_close(q.grad, qr.grad.float(), rtol=1e-6, atol=0)  # (fp32: its scale is an fp32 number)


def test_token_accuracy_is_per_token_with_reduction_none(device):
    # Liger-Kernel 0.8.5 (src/liger_kernel/ops/cross_entropy.py, cross_entropy_forward, lines 463-471; the same in
    # ops/fused_linear_cross_entropy.py lines 401-407): reduction="none" returns token_accuracy as the (N,) float32
    # per-token hits (1.0 where the argmax is the target, 0.0 otherwise and where ignored); "mean" / "sum" the
    # fraction of non-ignored tokens. Tigon returned the fraction for "none" too.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from tigon.reference.cross_entropy import cross_entropy as ref_ce

    v, h = 7, 5
    hidden = torch.randn(9, h, device=device)
    weight = torch.randn(v, h, device=device)
    logits = hidden @ weight.T
    target = logits.argmax(-1)
    target[[1, 4]] = (target[[1, 4]] + 1) % v  # two misses
    target[[2, 6]] = -100  # two ignored: argmax hits by the logits, still 0
    want = torch.tensor([1.0, 0, 0, 1, 0, 1, 0, 1, 1], device=device)
    for kw in (dict(return_token_accuracy=True), dict(return_accuracy=True)):
        outs = [F.cross_entropy(logits, target, reduction="none", **kw),
                F.fused_linear_cross_entropy(hidden, weight, target, reduction="none", **kw),
                ref_ce(logits, target, reduction="none", return_accuracy=True)]
        for out in outs:
            assert out.token_accuracy.dtype == torch.float32 and torch.equal(out.token_accuracy, want)
        for red in ("mean", "sum"):
            assert F.cross_entropy(logits, target, reduction=red, **kw).accuracy.item() == pytest.approx(5 / 7)
            fused = F.fused_linear_cross_entropy(hidden, weight, target, reduction=red, **kw)
            assert fused.accuracy.shape == () and fused.accuracy.item() == pytest.approx(5 / 7)
    # the modules: in target's shape, like the per-token losses
    kw = dict(reduction="none", return_token_accuracy=True, return_z_loss=True, lse_square_scale=1e-3)
    ce = tnn.CrossEntropyLoss(**kw)(logits.reshape(3, 3, v), target.reshape(3, 3))
    flce = tnn.FusedLinearCrossEntropyLoss(**kw)(hidden.reshape(3, 3, h), weight, target.reshape(3, 3))
    for out in (ce, flce):
        assert out.token_accuracy.shape == out.loss.shape == (3, 3)
        assert torch.equal(out.token_accuracy.flatten(), want)
    # the custom ops' fake shapes (torch.compile) agree
    with FakeTensorMode() as mode:
        fl, ft = mode.from_tensor(logits.cpu()), mode.from_tensor(target.cpu())
        acc = torch.ops.tigon.cross_entropy(fl, ft, None, None, -100, 0.0, 0.0, None, "none", True)[2]
        assert acc.shape == (9,)
        assert torch.ops.tigon.cross_entropy(fl, ft, None, None, -100, 0.0, 0.0, None, "mean", True)[2].shape == ()
