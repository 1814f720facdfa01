"""Liger-Kernel 0.8.5's calls, positional and keyword, on Tigon's drop-ins (issue 21, a first user's table):
``LigerRMSNorm``'s ``init_fn`` / ``row_mode`` and positional order, ``LigerSwiGLUMLP(config)`` /
``LigerGEGLUMLP(config)``, ``LigerLayerNorm``'s constructor, ``liger_rope(..., rotary_dim)`` (values vs a float64
oracle written from Liger's kernel: the pair (i, i + rotary_dim/2) rotated by column i of the table), and the errors
of bad constructor values, naming the argument. The signatures themselves: tests/test_liger_signatures.py."""

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from tigon import functional as F
from tigon import nn as tnn
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.rope import rope as ref_rope


# ---- RMSNorm ---------------------------------------------------------------------------------------------------------
def test_rms_norm_takes_ligers_gemma_call_and_positional_order(device):
    gemma = tnn.RMSNorm(64, offset=1.0, casting_mode="gemma", init_fn="zeros")  # LigerRMSNormForGemma's arguments
    assert torch.equal(gemma.weight, torch.zeros(64)) and (gemma.offset, gemma.casting_mode) == (1.0, "gemma")
    # hidden_size, eps, offset, casting_mode, init_fn, in_place, row_mode, elementwise_affine: Liger's order
    m = tnn.RMSNorm(64, 1e-5, 1.0, "gemma", "ones", False, True, True)
    assert torch.equal(m.weight, torch.ones(64))
    assert (m.variance_epsilon, m.offset, m.casting_mode, m.in_place, m.row_mode) == (1e-5, 1.0, "gemma", False, True)
    assert "row_mode=True" in repr(m)
    plain = tnn.RMSNorm(64, 1e-6, 0.0, "llama", "ones")
    assert torch.equal(plain.weight, torch.ones(64)) and plain.row_mode is None
    assert tnn.RMSNorm(8, 1e-6, 0.0, "llama", "ones", True, None, False).weight is None
    # init_fn None (default): zeros with an offset (Gemma's init), ones without; Liger's "ones" whatever the offset
    assert torch.equal(tnn.RMSNorm(8, offset=1.0).weight, torch.zeros(8))
    assert torch.equal(tnn.RMSNorm(8, offset=1.0, init_fn="ones").weight, torch.ones(8))
    # device / dtype are keyword-only, after Liger's arguments
    assert tnn.RMSNorm(8, dtype=torch.bfloat16, device=device).weight.dtype == torch.bfloat16
    with pytest.raises(TypeError):
        tnn.RMSNorm(8, 1e-6, 0.0, "llama", "ones", True, None, True, device)


def test_rms_norm_row_mode_changes_nothing(device):
    x = torch.randn(5, 48, device=device)
    base = tnn.RMSNorm(48, in_place=False).to(device)
    with torch.no_grad():
        base.weight.normal_()
    for row_mode in (True, False):
        m = tnn.RMSNorm(48, in_place=False, row_mode=row_mode).to(device)
        m.load_state_dict(base.state_dict())
        assert torch.equal(m(x), base(x))


def test_fused_add_rms_norm_takes_ligers_positional_order():
    m = tnn.FusedAddRMSNorm(16, 1e-5, 1.0, "gemma", "zeros", True)
    assert (m.variance_epsilon, m.offset, m.casting_mode, m.in_place) == (1e-5, 1.0, "gemma", True)
    assert torch.equal(m.weight, torch.zeros(16))
    with pytest.raises(TypeError):
        tnn.FusedAddRMSNorm(16, 1e-5, 1.0, "gemma", "zeros", True, "cpu")  # device is keyword-only


@pytest.mark.parametrize("cls", [tnn.RMSNorm, tnn.FusedAddRMSNorm, tnn.LayerNorm])
def test_norm_constructor_errors_name_the_argument(cls):
    for bad, err in [(-5, ValueError), (0, ValueError), (True, TypeError), (8.0, TypeError)]:
        with pytest.raises(err, match="hidden_size must be a positive int"):
            cls(bad)
    with pytest.raises(ValueError, match="init_fn must be 'ones'.*'zeros'.*got 'foo'"):
        cls(8, init_fn="foo")
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        cls(8, eps=-1.0)
    with pytest.raises(TypeError, match="eps must be a real number"):
        cls(8, eps="1e-6")


def test_rms_norm_row_mode_and_flags_are_checked():
    with pytest.raises(TypeError, match="row_mode must be None or a bool"):
        tnn.RMSNorm(8, row_mode=1)
    with pytest.raises(TypeError, match="in_place must be a bool"):
        tnn.RMSNorm(8, 1e-6, 0.0, "llama", "ones", "yes")
    with pytest.raises(ValueError, match="casting_mode"):
        tnn.RMSNorm(8, 1e-6, 0.0, "t5")


# ---- LayerNorm -------------------------------------------------------------------------------------------------------
def test_layer_norm_takes_ligers_constructor(device):
    m = tnn.LayerNorm(32)  # Liger's defaults: eps 1e-6, zero bias (a learnable parameter), weight ones
    assert isinstance(m, torch.nn.LayerNorm) and set(m.state_dict()) == {"weight", "bias"}
    assert m.eps == m.variance_epsilon == 1e-6 and m.hidden_size == 32 and m.normalized_shape == (32,)
    assert torch.equal(m.weight, torch.ones(32)) and torch.equal(m.bias, torch.zeros(32)) and m.bias.requires_grad
    # hidden_size, eps, bias, init_fn, impl, mode, backend: Liger's order
    torch.manual_seed(0)
    r = tnn.LayerNorm(32, 1e-5, True, "zeros", None, "fast", "triton")
    assert r.eps == 1e-5 and torch.equal(r.weight, torch.zeros(32)) and r.bias.abs().sum() > 0  # randn bias
    assert (r.impl, r.backend, r.mode) == ("triton", "triton", "fast")
    m.reset_parameters()
    assert torch.equal(m.weight, torch.ones(32)) and torch.equal(m.bias, torch.zeros(32))
    x = torch.randn(3, 5, 32, device=device)
    m = m.to(device)
    with torch.no_grad():
        m.weight.normal_(), m.bias.normal_()
    want = torch.nn.functional.layer_norm(x.double(), (32,), m.weight.double(), m.bias.double(), 1e-6)
    torch.testing.assert_close(m(x).double(), want, rtol=1e-5, atol=1e-5)
    # a torch.nn.LayerNorm's state dict loads as is
    t = torch.nn.LayerNorm(32)
    tnn.LayerNorm(32).load_state_dict(t.state_dict())
    assert tnn.LayerNorm(32, dtype=torch.bfloat16).weight.dtype == torch.bfloat16


def test_layer_norm_errors():
    with pytest.raises(ValueError, match="1-element sequence"):
        tnn.LayerNorm((4, 80))
    with pytest.raises(TypeError, match="bias must be a bool"):
        tnn.LayerNorm(8, 1e-6, "yes")
    with pytest.raises(TypeError, match="impl must be None or a string"):
        tnn.LayerNorm(8, impl=3)
    with pytest.raises(TypeError, match="elementwise_affine"):  # torch's keyword: not this signature
        tnn.LayerNorm(8, elementwise_affine=False)


# ---- MLPs ------------------------------------------------------------------------------------------------------------
def _config(act="silu", **kw):
    return SimpleNamespace(hidden_size=24, intermediate_size=40, hidden_act=act, **kw)


def test_swiglu_mlp_takes_a_config_and_keeps_the_sizes_form(device):
    cfg = _config()
    m = tnn.SwiGLUMLP(cfg)
    assert m.config is cfg and (m.hidden_size, m.intermediate_size) == (24, 40) and m.gate_proj.bias is None
    assert tnn.SwiGLUMLP(cfg, 16).intermediate_size == 16  # Liger's intermediate_size override
    assert tnn.SwiGLUMLP(_config("swish")).intermediate_size == 40
    sized = tnn.SwiGLUMLP(24, 40)
    assert sized.config is None and set(sized.state_dict()) == set(m.state_dict())
    assert tnn.SwiGLUMLP(hidden_size=24, intermediate_size=40, bias=True).up_proj.bias is not None
    sized.load_state_dict(m.state_dict())
    x = torch.randn(3, 24, device=device)
    m, sized = m.to(device), sized.to(device)
    want = m.down_proj(torch.nn.functional.silu(m.gate_proj(x)) * m.up_proj(x))
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(sized(x), m(x))


def test_geglu_mlp_takes_a_config(device):
    m = tnn.GeGLUMLP(_config("gelu_pytorch_tanh"))
    assert m.approximate == "tanh" and (m.hidden_size, m.intermediate_size) == (24, 40)
    gemma2 = SimpleNamespace(hidden_size=24, intermediate_size=40, hidden_act=None,
                             hidden_activation="gelu_pytorch_tanh")
    assert tnn.GeGLUMLP(gemma2).approximate == "tanh"
    assert tnn.GeGLUMLP(_config("gelu")).approximate == "none"  # exact GELU, as HF (Liger: tanh)
    assert tnn.GeGLUMLP(SimpleNamespace(hidden_size=24, intermediate_size=40)).approximate == "tanh"
    assert tnn.GeGLUMLP(24, 40, False, "none").approximate == "none" and tnn.GeGLUMLP(24, 40).approximate == "tanh"
    x = torch.randn(3, 24, device=device)
    m = m.to(device)
    want = m.down_proj(torch.nn.functional.gelu(m.gate_proj(x), approximate="tanh") * m.up_proj(x))
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)


def test_mlp_errors_name_the_argument():
    with pytest.raises(ValueError, match="config.hidden_act 'silu' or 'swish'"):
        tnn.SwiGLUMLP(_config("gelu"))
    with pytest.raises(ValueError, match="activation in"):
        tnn.GeGLUMLP(_config("relu"))
    with pytest.raises(ValueError, match="contradicts the config's activation"):
        tnn.GeGLUMLP(_config("gelu"), approximate="tanh")
    with pytest.raises(TypeError, match="needs intermediate_size"):
        tnn.SwiGLUMLP(24)
    with pytest.raises(TypeError, match="needs a model config"):
        tnn.GeGLUMLP()
    with pytest.raises(TypeError, match="not both"):
        tnn.SwiGLUMLP(_config(), hidden_size=8)
    for cls in (tnn.SwiGLUMLP, tnn.GeGLUMLP):
        with pytest.raises(ValueError, match="hidden_size must be a positive int"):
            cls(-5, 40)
        with pytest.raises(ValueError, match="intermediate_size must be a positive int"):
            cls(24, 0)
        with pytest.raises(ValueError, match="config.hidden_size must be a positive int"):
            cls(SimpleNamespace(hidden_size=0, intermediate_size=4, hidden_act="silu"))
        with pytest.raises(TypeError, match="config.intermediate_size must be a positive int"):
            cls(SimpleNamespace(hidden_size=8, hidden_act=None))
        with pytest.raises(TypeError, match="bias must be a bool"):
            cls(24, 40, "yes")


# ---- rope's rotary_dim -----------------------------------------------------------------------------------------------
def _liger_rotary_dim_oracle(x, cos, sin, rotary_dim, unsqueeze_dim=1):
    """Liger 0.8.5's kernel in float64: pairs (i, i + rd/2), i < rd/2, rotated by column i of cos / sin ((1 or B, T,
    W)); dims rd.. untouched."""
    h = rotary_dim // 2
    c = cos[..., :h].double().unsqueeze(unsqueeze_dim)
    s = sin[..., :h].double().unsqueeze(unsqueeze_dim)
    x64 = x.double()
    x1, x2 = x64[..., :h], x64[..., h:rotary_dim]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, x64[..., rotary_dim:]), dim=-1)


def _freqs(t, angles, device, dtype=torch.float32, duplicated=True):
    """cos / sin (1, t, W) of ``angles`` frequencies: HF's ``cat(freqs, freqs)`` (W = 2 angles) or GPT-OSS's ``freqs``
    (W = angles)."""
    inv = 1.0 / 10000.0 ** (torch.arange(angles, dtype=torch.float64) / angles)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv
    emb = torch.cat((ang, ang), dim=-1) if duplicated else ang
    return emb.cos()[None].to(device, dtype), emb.sin()[None].to(device, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,angles,duplicated,rotary_dim,unsqueeze_dim", [
    (16, 8, True, 4, 1),    # a full HF table (16 wide), only the first 4 dims rotated (by its first 2 columns)
    (16, 8, False, 16, 1),  # GPT-OSS: non-duplicated freqs of width D/2, the whole head rotated
    (13, 4, True, 8, 1),    # odd head dim, rotary_dim = the table's width (the same as without rotary_dim)
    (16, 6, True, 6, 2),    # a wider table (12) than needed, (B, T, H, D) layout
], ids=["hf_table_rd4", "gpt_oss", "odd_head", "wide_table_unsqueeze2"])
def test_rope_rotary_dim_matches_ligers_semantics(device, dtype, d, angles, duplicated, rotary_dim, unsqueeze_dim):
    q = torch.randn(2, 5, 3 * d, device=device, dtype=dtype).view(2, 5, 3, d)
    k = torch.randn(2, 5, 1 * d, device=device, dtype=dtype).view(2, 5, 1, d)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = _freqs(5, angles, device, dtype, duplicated)
    inputs = dict(q=q, k=k, cos=cos, sin=sin, unsqueeze_dim=unsqueeze_dim, rotary_dim=rotary_dim)
    assert_close_to_truth(compare(F.rope, ref_rope, inputs, ["q", "k"]))
    got_q, got_k = F.rope(q, k, cos, sin, None, unsqueeze_dim, rotary_dim)  # Liger's positional order
    for got, x in ((got_q, q), (got_k, k)):
        want = _liger_rotary_dim_oracle(x, cos, sin, rotary_dim, unsqueeze_dim)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
        assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])
    if cos.shape[-1] == rotary_dim and duplicated:  # the table's own width: what rope does without rotary_dim
        for a, b in zip((got_q, got_k), F.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)):
            assert torch.equal(a, b)


def test_rope_rotary_dim_with_position_ids_and_two_dim_tables(device):
    q = torch.randn(2, 3, 6, 16, device=device)
    k = torch.randn(2, 1, 6, 16, device=device)
    cos, sin = _freqs(9, 8, device)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2], [4, 5, 6, 7, 8, 0]], device=device)
    got = F.rope(q, k, cos[0], sin[0], pos, 1, 8)
    want = F.rope(q, k, cos[0][pos], sin[0][pos], rotary_dim=8)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(torch.equal(a, b) for a, b in zip(F.rope(q, k, cos[0, :6], sin[0, :6], rotary_dim=8),
                                                 F.rope(q, k, cos[:, :6], sin[:, :6], rotary_dim=8)))


def test_rope_rotary_dim_errors(device):
    q, k = torch.randn(1, 2, 4, 8, device=device), torch.randn(1, 1, 4, 8, device=device)
    cos, sin = _freqs(4, 4, device)
    for bad in (3, 0, -2, 10):
        with pytest.raises(ValueError, match=r"rotary_dim must be even and in \(0, head_dim=8\]"):
            F.rope(q, k, cos, sin, rotary_dim=bad)
    for bad in (True, 4.0, "4"):
        with pytest.raises(TypeError, match="rotary_dim must be None or an int"):
            F.rope(q, k, cos, sin, rotary_dim=bad)
    with pytest.raises(ValueError, match="at least rotary_dim / 2 = 4 columns"):
        F.rope(q, k, cos[..., :3], sin[..., :3], rotary_dim=8)


# ---- against the installed Liger-Kernel ------------------------------------------------------------------------------
LIGER = importlib.util.find_spec("liger_kernel") is not None


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
def test_the_first_users_calls_build_ligers_modules():
    import liger_kernel.transformers as lt

    def same(ours, theirs):
        a, b = ours.state_dict(), theirs.state_dict()
        assert a.keys() == b.keys() and all(a[n].shape == b[n].shape for n in a)
        return all(torch.equal(a[n], b[n]) for n in a)

    for args, kw in [((64,), dict(offset=1.0, casting_mode="gemma", init_fn="zeros")),
                     ((64, 1e-6, 0.0, "llama", "ones"), {}), ((64, 1e-5, 1.0, "gemma", "ones", False, True), {})]:
        ours, theirs = tnn.RMSNorm(*args, **kw), lt.LigerRMSNorm(*args, **kw)
        assert same(ours, theirs)
        for attr in ("variance_epsilon", "offset", "casting_mode", "in_place", "row_mode"):
            assert getattr(ours, attr) == getattr(theirs, attr), attr
    for args in [(32,), (32, 1e-5, True, "zeros")]:
        torch.manual_seed(0)
        theirs = lt.LigerLayerNorm(*args)
        torch.manual_seed(0)
        ours = tnn.LayerNorm(*args)
        assert same(ours, theirs) and ours.eps == theirs.eps == theirs.variance_epsilon
    for ours_cls, theirs_cls, act in [(tnn.SwiGLUMLP, lt.LigerSwiGLUMLP, "silu"),
                                      (tnn.GeGLUMLP, lt.LigerGEGLUMLP, "gelu_pytorch_tanh")]:
        ours, theirs = ours_cls(_config(act)), theirs_cls(_config(act))
        same(ours, theirs)  # names and shapes (the projections start random)
        assert (ours.hidden_size, ours.intermediate_size) == (theirs.hidden_size, theirs.intermediate_size)


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
@pytest.mark.parametrize("width,rotary_dim", [(16, 4), (8, 16), (12, 6), (16, None)])
def test_rope_rotary_dim_equals_ligers_kernel(device, width, rotary_dim):
    from liger_kernel.transformers.functional import liger_rope

    q = torch.randn(2, 5, 3, 16, device=device).transpose(1, 2)
    k = torch.randn(2, 5, 1, 16, device=device).transpose(1, 2)
    half = torch.randn(1, 5, width // 2, device=device)  # any values; duplicated when Liger infers the width
    cos, sin = (torch.cat((half, half), -1), torch.cat((half.flip(-1), half.flip(-1)), -1)) if rotary_dim is None \
        else (torch.randn(1, 5, width, device=device), torch.randn(1, 5, width, device=device))
    theirs = liger_rope(q.clone(), k.clone(), cos, sin, None, 1, rotary_dim)
    ours = F.rope(q, k, cos, sin, None, 1, rotary_dim)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
