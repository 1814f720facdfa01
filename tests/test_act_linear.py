"""tigon.functional.act_linear: a non-gated MLP's ``down(act(h))`` that saves h but not act(h) (recomputed in the
backward by the pass that forms d_h), and its patching into the non-gated MLPs of GPT-NeoX, phi, Falcon, Nemotron and
the vision towers."""

import functools

import pytest
import torch

from tigon import functional as F
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference import act_linear as ref

# the interpreter's sigmoid overflows exp(-x) to inf for very negative x (the limit, 0, is right; see test_glu.py)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

ACTS = list(ref.ACTIVATIONS)
# bf16 / fp16: the kernel rounds act(h) once from fp32, as torch's GELU / SiLU / relu2 do (HF's quick_gelu in torch ops
# rounds three times), so the two usually tie; where the kernel's fp32 activation (tanh-GELU through the logistic
# function) lands on the other side of a rounding boundary than torch's, one tensor's error can come out a hair above
# the original's. 1.1 absorbs that noise, as tests/test_glu.py's FACTOR does.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}


def make(shape, hidden, dtype, device, bias=True):
    """h with std 3 (the activations' tails, relu's zeros), the down projection's weight (hidden, I) and bias."""
    inputs = dict(h=torch.randn(shape, device=device, dtype=dtype) * 3,
                  weight=torch.randn(hidden, shape[-1], device=device, dtype=dtype) / shape[-1] ** 0.5)
    if bias:
        inputs["bias"] = torch.randn(hidden, device=device, dtype=dtype)
    return inputs


def _pair(activation):
    return (functools.partial(F.act_linear, activation=activation),
            functools.partial(ref.act_linear, activation=activation))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ACTS)
@pytest.mark.parametrize("bias", [True, False])
def test_act_linear_matches_float64(device, dtype, activation, bias):
    # Odd sizes (I = 301, H = 77), 3-D h. fp32: output and every gradient within ~1e-5 of float64. bf16: no worse than
    # the plain PyTorch composition F.linear(act(h), weight, bias) at bf16 (both measured against float64; no floor):
    # the kernel rounds act(h) once from fp32, as torch's own GELU / SiLU do, and the matmuls are the same.
    inputs = make((3, 11, 301), 77, dtype, device, bias)
    fp32 = dtype == torch.float32
    checks = compare(*_pair(activation), inputs, list(inputs), factor=FACTOR[dtype], floor=2e-5 if fp32 else 0.0)
    assert {c.tensor for c in checks} == {"out"} | {f"grad_{k}" for k in inputs}
    assert_close_to_truth(checks)
    if fp32:
        assert max(c.tigon_err for c in checks) <= 2e-5, [c.as_dict() for c in checks]


@pytest.mark.parametrize("activation", ["gelu", "relu2"])
def test_act_linear_fp16(device, activation):
    inputs = make((5, 200), 24, torch.float16, device)
    assert_close_to_truth(compare(*_pair(activation), inputs, list(inputs), factor=FACTOR[torch.float16], floor=0.0))


@pytest.mark.parametrize("layout", ["transposed", "rows_of_wider", "expanded"])
def test_act_linear_non_contiguous_h(device, layout):
    # h as a transposed view, as every other column of a wider buffer (copied to rows), and expanded (rows sharing
    # memory): the same values and gradients as the contiguous h.
    base = torch.randn(9, 70, device=device) * 3
    weight = torch.randn(13, 70, device=device) / 8
    bias = torch.randn(13, device=device)

    def view(h):
        if layout == "transposed":
            return h.t().contiguous().t()
        if layout == "rows_of_wider":
            return torch.stack((h, h), -1).flatten(-2)[..., ::2]
        return h[:1].expand(9, 70)

    for inplace in (False, True):
        got, want = (torch.empty(0),) * 2
        for strided in (True, False):
            h = base.clone().requires_grad_(True)
            w, b = weight.clone().requires_grad_(True), bias.clone().requires_grad_(True)
            hv = view(h) if strided else (h[:1].expand(9, 70).contiguous() if layout == "expanded" else h)
            out = F.act_linear(hv, w, b, activation="gelu_tanh", inplace_backward=inplace)
            out.backward(torch.linspace(-1, 1, out.numel(), device=device).view_as(out))
            if strided:
                got = (out, h.grad, w.grad, b.grad)
            else:
                want = (out, h.grad, w.grad, b.grad)
        for a, b_ in zip(got, want):
            torch.testing.assert_close(a, b_, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ["gelu", "relu2", "quick_gelu"])
def test_act_linear_inplace_backward_and_no_mutation(device, activation):
    # inplace_backward writes d_h into h's memory and gives the out-of-place gradients exactly; without it the
    # caller's h is never written.
    x = torch.randn(6, 40, device=device)
    w1, w2, b2 = torch.randn(97, 40, device=device) / 6, torch.randn(21, 97, device=device) / 10, torch.randn(21)

    def run(inplace):
        xx, ww1, ww2, bb2 = (t.clone().to(device).requires_grad_(True) for t in (x, w1, w2, b2))
        h = torch.nn.functional.linear(xx, ww1)
        kept = h.detach().clone()
        out = F.act_linear(h, ww2, bb2, activation=activation, inplace_backward=inplace)
        out.backward(torch.linspace(-1, 1, out.numel(), device=device).view_as(out))
        assert torch.equal(h.detach(), kept) != inplace  # written only with inplace_backward
        return xx.grad, ww1.grad, ww2.grad, bb2.grad

    for a, b in zip(run(True), run(False)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_act_linear_inplace_gradient_becomes_grad_without_copy(device):
    h = torch.randn(6, 40, device=device, requires_grad=True)
    F.act_linear(h, torch.randn(8, 40, device=device), activation="silu", inplace_backward=True).sum().backward()
    assert h.grad.data_ptr() == h.data_ptr()


def test_act_linear_inplace_second_backward_raises(device):
    h = torch.randn(4, 8, device=device, requires_grad=True) * 1.0
    out = F.act_linear(h, torch.randn(3, 8, device=device), inplace_backward=True).sum()
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        out.backward()


def test_act_linear_saves_one_intermediate_tensor_fewer(device):
    # The point of the op: the unfused composition saves h (for the activation's backward) and act(h) (the linear's
    # input); act_linear saves h and the weight only: one (tokens, I) tensor fewer per MLP.
    def saved_by(fn):
        h = torch.randn(4, 100, device=device, requires_grad=True)
        w = torch.randn(8, 100, device=device, requires_grad=True)
        b = torch.randn(8, device=device, requires_grad=True)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            fn(h, w, b).sum().backward()
        return sum(t.shape == (4, 100) for t in saved)

    for activation in ACTS:
        fused = saved_by(functools.partial(F.act_linear, activation=activation))
        unfused = saved_by(functools.partial(ref.act_linear, activation=activation))
        assert fused == 1 and unfused >= 2, (activation, fused, unfused)


@pytest.mark.parametrize("need", ["weight_only", "h_only", "bias_only"])
def test_act_linear_partial_grads(device, need):
    inputs = make((6, 70), 5, torch.float32, device)
    names = {"weight_only": ["weight"], "h_only": ["h"], "bias_only": ["bias"]}[need]
    assert_close_to_truth(compare(*_pair("gelu"), inputs, names))


def test_act_linear_autocast_fp32_weight(device):
    # Under autocast (bf16 with fp32 master weights) the weight and bias are cast as F.linear casts them, their
    # gradients come back in fp32, and everything equals the plain composition under the same autocast (gelu: torch's
    # bf16 GELU rounds once from fp32, as the kernel does).
    dev = torch.device(device).type
    h0 = torch.randn(7, 96, device=device, dtype=torch.bfloat16) * 3

    def run(fused):
        h = h0.clone().requires_grad_(True)
        w = torch.linspace(-0.1, 0.1, 40 * 96, device=device).view(40, 96).requires_grad_(True)
        b = torch.linspace(-1, 1, 40, device=device).requires_grad_(True)
        with torch.autocast(dev, dtype=torch.bfloat16):
            out = (F.act_linear if fused else ref.act_linear)(h, w, b)
        out.float().sum().backward()
        return out, h.grad, w.grad, b.grad

    got, want = run(True), run(False)
    assert got[0].dtype == torch.bfloat16 and got[2].dtype == torch.float32 and got[3].dtype == torch.float32
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def test_act_linear_empty_batch_and_small_tiles(device, monkeypatch):
    # No tokens: zero weight / bias gradients, an empty d_h. Small tiles: several programs per row and stacked rows.
    from tigon.kernels import elementwise

    w = torch.randn(5, 9, device=device, requires_grad=True)
    b = torch.randn(5, device=device, requires_grad=True)
    h = torch.randn(0, 9, device=device, requires_grad=True)
    F.act_linear(h, w, b).sum().backward()
    assert w.grad.abs().sum() == 0 and b.grad.abs().sum() == 0 and h.grad.shape == (0, 9)
    monkeypatch.setattr(elementwise, "tile_elems", lambda dev: 64)
    for shape in [(9, 300), (2, 5, 40)]:
        inputs = make(shape, 7, torch.float32, device)
        assert_close_to_truth(compare(*_pair("relu2"), inputs, list(inputs)))


def test_act_linear_double_backward_raises(device):
    h = torch.randn(4, 8, device=device, requires_grad=True)
    w = torch.randn(3, 8, device=device, requires_grad=True)
    (dw,) = torch.autograd.grad(F.act_linear(h, w).pow(2).sum(), w, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dw.sum(), h)


def test_act_linear_bad_input(device):
    inputs = make((4, 16), 8, torch.float32, device)
    h, w, b = inputs["h"], inputs["weight"], inputs["bias"]
    with pytest.raises(ValueError, match="activation must be one of"):
        F.act_linear(h, w, b, activation="tanh")
    with pytest.raises(ValueError, match=r"weight must have shape \(H, 16\)"):
        F.act_linear(h, torch.randn(8, 15, device=device))
    with pytest.raises(ValueError, match="weight must have 2 dimensions"):
        F.act_linear(h, torch.randn(16, device=device))
    with pytest.raises(ValueError, match="bias must have shape"):
        F.act_linear(h, w, torch.randn(7, device=device))
    with pytest.raises(TypeError, match="h's dtype"):
        F.act_linear(h, w.double())
    with pytest.raises(TypeError, match="h's dtype"):
        F.act_linear(h, w, b.double())
    with pytest.raises(TypeError, match="h must be a floating-point"):
        F.act_linear(h.long(), w)
    with pytest.raises(ValueError, match="h must have at least one dimension"):
        F.act_linear(torch.tensor(1.0, device=device), w)


def test_act_linear_reference_bad_activation():
    with pytest.raises(ValueError, match="activation must be one of"):
        ref.act_linear(torch.randn(2, 3), torch.randn(4, 3), activation="gelu_10")


# ---- the patch ---------------------------------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")


def _tiny(model_type: str, **overrides):
    import model_matrix as mm

    cases = {**mm.CASES, **mm.MORE_FAMILIES}
    base = dict(cases[model_type][1]) if model_type in cases else {}
    return mm.build(model_type, {**base, **overrides})


@pytest.mark.parametrize("model_type, activation", [("gpt_neox", "gelu"), ("phi", "gelu_tanh"), ("falcon", "gelu"),
                                                    ("nemotron", "relu2")])
def test_patched_non_gated_mlps_run_act_linear(model_type, activation):
    # The report lists every non-gated MLP as act_linear with the activation its module's class names (Falcon's down
    # projection is its FalconLinear); the patched MLP equals the original, outputs and gradients (fp32).
    import tigon

    model = _tiny(model_type)
    report = tigon.patch(model)
    try:
        mlps = [e for e in report.replaced if e.kind == "mlp"]
        assert len(mlps) == 2 and all(e.ops == ("act_linear",) for e in mlps), str(report)
        assert all(f"activation={activation!r}" in e.detail for e in mlps)
        mlp = model.get_submodule(mlps[0].target)
        x = torch.randn(2, 5, model.config.hidden_size, device=model.device, requires_grad=True)
        out = mlp(x)
        out.backward(torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out))
        got = (out.detach(), x.grad, *(p.grad for p in mlp.parameters()))
        x.grad = None
        for p in mlp.parameters():
            p.grad = None
        want_out = type(mlp).forward(mlp, x)  # the class's original forward (the instance's is Tigon's)
        want_out.backward(torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out))
        want = (want_out.detach(), x.grad, *(p.grad for p in mlp.parameters()))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    finally:
        tigon.unpatch(model)


def test_patched_mlp_runs_the_original_when_it_cannot_fold(monkeypatch):
    # Per call: a hook on the down projection or on the activation module, or a non-reentrant activation checkpoint,
    # makes the patched MLP run its original forward (no act_linear call); without them it runs act_linear.
    import tigon
    from tigon import support

    model = _tiny("gpt_neox")
    report = tigon.patch(model)
    try:
        # the report says so: under a non-reentrant checkpoint none of Tigon's ops (the original forward)
        assert {e.checkpoint_ops for e in report.replaced if e.kind == "mlp"} == {()}
        assert all(e.checkpoint_ops is None for e in report.replaced if e.kind != "mlp")
        mlp = model.gpt_neox.layers[0].mlp
        x = torch.randn(1, 3, model.config.hidden_size, device=model.device)

        def calls(fn):
            support.backend_usage(reset=True)
            fn()
            return support.backend_usage().get("act_linear", {})

        assert calls(lambda: mlp(x))
        for part in (mlp.dense_4h_to_h, mlp.act):
            handle = part.register_forward_hook(lambda m, i, o: None)
            assert not calls(lambda: mlp(x))
            handle.remove()
        xx = x.clone().requires_grad_(True)
        assert not calls(lambda: torch.utils.checkpoint.checkpoint(mlp, xx, use_reentrant=False).sum().backward())
    finally:
        tigon.unpatch(model)


def test_unsupported_activation_and_lora_down_are_skipped_with_the_reason():
    import tigon

    model = _tiny("gpt_neox", hidden_act="gelu_10")  # ClippedGELUActivation: its class does not tell the clip
    report = tigon.patch(model)
    tigon.unpatch(model)
    skipped = [e for e in report.skipped if e.kind == "mlp"]
    assert len(skipped) == 2 and "ClippedGELUActivation" in skipped[0].detail and "no Tigon kernel" in skipped[0].detail

    model = _tiny("phi")
    for layer in model.model.layers:  # a down projection that is no plain nn.Linear
        layer.mlp.fc2 = type("MyLinear", (torch.nn.Linear,), {})(layer.mlp.fc2.in_features, layer.mlp.fc2.out_features)
    report = tigon.patch(model)
    tigon.unpatch(model)
    skipped = [e for e in report.skipped if e.kind == "mlp"]
    assert len(skipped) == 2 and "cannot be folded into tigon.functional.act_linear" in skipped[0].detail


def test_nn_gelu_activation_module_is_recognised():
    from tigon.integrations.families import FAMILIES
    from tigon.integrations.mlp_activations import nongated_activation

    spec = FAMILIES["phi"].mlps[0]
    mlp = torch.nn.Module()
    for module, want in ((torch.nn.GELU(), "gelu"), (torch.nn.GELU(approximate="tanh"), "gelu_tanh"),
                         (torch.nn.ReLU(), "relu"), (torch.nn.SiLU(), "silu"), (torch.nn.Tanh(), None)):
        mlp.activation_fn = module
        assert nongated_activation(mlp, spec)[0] == want


def test_model_ops_name_act_linear():
    """The ops a model runs (the dry run's, what ``tigon bench`` / ``verify --model`` take by default) hold
    act_linear for the non-gated MLPs of an activation Tigon has, and not for one it lacks (GPT-NeoX's gelu_10:
    the MLP is skipped) or for a gated MLP."""
    from model_matrix import DROP, config

    from tigon.integrations.families import kind_op
    from tigon.workflows.dry_run import model_ops

    def ops(model_type, **overrides):
        return model_ops(config(model_type, overrides))

    assert "act_linear" in ops("gpt_neox", hidden_act="gelu")
    assert "act_linear" in ops("nemotron", hidden_act="relu2")
    assert "act_linear" in ops("falcon", activation="gelu", head_dim=DROP, num_kv_heads=2)
    assert "act_linear" not in ops("gpt_neox", hidden_act="gelu_10")
    assert "act_linear" not in ops("llama", hidden_act="silu")
    assert kind_op("mlp", {"model_type": "nemotron", "hidden_act": "relu2"}) == "act_linear"  # tigon profile's op
    assert kind_op("mlp", {"model_type": "llama", "hidden_act": "silu"}) == "swiglu"

def test_act_linear_inplace_backward_must_be_a_bool(device):
    # bool(inplace_backward) took 1 and the string "False" for True: the backward then wrote d_h over the caller's h
    h = torch.randn(3, 8, device=device, requires_grad=True)
    w = torch.randn(4, 8, device=device)
    for bad in (1, "False", None):
        with pytest.raises(TypeError, match="inplace_backward must be a bool"):
            F.act_linear(h, w, inplace_backward=bad)
