"""The rotary layout variants: interleaved pairs (GLM, DeepSeek-V3's deinterleaving form) and multimodal sections
(Qwen2-VL's mRoPE), each against the Hugging Face function it replaces (fp32 and bf16, error no worse than HF's own
against float64), odd head sizes, non-contiguous q / k, both head layouts, and bad input."""

import pytest
import torch

from tigon import functional as F
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference import rope as R

B, T = 2, 5


def tables(lead, t, r, dtype, device, base=10000.0):
    """HF cos / sin ``cat(freqs, freqs)`` of r columns, positions offset per leading index."""
    inv = 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    pos = torch.arange(t, dtype=torch.float64) + 3.0 * torch.arange(lead, dtype=torch.float64)[:, None]
    emb = torch.cat((pos[..., None] * inv,) * 2, dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def qk(hq, hkv, d, dtype, device):
    """q, k as HF attention makes them (transposed views of the projections: non-contiguous)."""
    q = torch.randn(B, T, hq * d, device=device, dtype=dtype).view(B, T, hq, d).transpose(1, 2)
    k = torch.randn(B, T, hkv * d, device=device, dtype=dtype).view(B, T, hkv, d).transpose(1, 2)
    return q, k


def hf(module: str, name: str):
    mod = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    return getattr(mod, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d, r", [(20, 10), (18, 18)], ids=["partial", "full"])
def test_glm_interleaved_matches_hf(device, dtype, d, r):
    """GLM-4's apply_rotary_pos_emb: interleaved pairs over the first r dims (odd pair count 5 / 9), rest passed."""
    original = hf("glm4", "apply_rotary_pos_emb")
    q, k = qk(3, 2, d, dtype, device)
    cos, sin = tables(1, T, r, dtype, device)
    inputs = dict(q=q, k=k, cos=cos, sin=sin)
    # the reference is HF's function to the bit (fp32)
    assert all(torch.equal(a, b) for a, b in zip(R.rope_interleaved(q, k, cos, sin), original(q, k, cos, sin)))
    assert_close_to_truth(compare(lambda **a: F.rope_interleaved(**a), original, inputs, ["q", "k"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_v3_interleave_matches_hf(device, dtype):
    """DeepSeek-V3's apply_rotary_pos_emb_interleave: interleaved pairs in, halves out (its rope slice: R = D)."""
    original = hf("deepseek_v3", "apply_rotary_pos_emb_interleave")
    q, k = qk(2, 1, 14, dtype, device)
    cos, sin = tables(B, T, 14, dtype, device)
    inputs = dict(q=q, k=k, cos=cos, sin=sin)
    assert_close_to_truth(compare(lambda **a: F.rope_interleaved(**a, deinterleave=True), original, inputs,
                                  ["q", "k"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mrope_matches_reference_and_assembled_tables(device, dtype):
    """mRoPE (sections 1, 2, 3 of a 12-dim head; 3 position axes that differ) against the reference, and the
    reference against rotate-half rope on the tables assembled as HF's apply_multimodal_rotary_pos_emb does."""
    q, k = qk(3, 1, 12, dtype, device)
    cos, sin = tables(3, T, 12, dtype, device)
    cos, sin = cos[:, None], sin[:, None]  # (3, 1, T, 12)
    inputs = dict(q=q, k=k, cos=cos, sin=sin, mrope_section=[1, 2, 3])
    assert_close_to_truth(compare(F.mrope, R.mrope, inputs, ["q", "k"]))
    pick = torch.tensor([0, 1, 1, 2, 2, 2] * 2, device=device)
    c = cos.gather(0, pick.view(1, 1, 1, 12).expand(1, *cos.shape[1:]))[0]
    s = sin.gather(0, pick.view(1, 1, 1, 12).expand(1, *sin.shape[1:]))[0]
    assert all(torch.equal(a, b) for a, b in zip(R.mrope(q, k, cos, sin, [1, 2, 3]), R.rope(q, k, c, s)))


def test_variants_head_axis_2_and_batch_tables(device):
    """(B, T, H, D) layout (unsqueeze_dim=2), per-batch tables, contiguous inputs: interleaved and mRoPE."""
    q = torch.randn(B, T, 2, 8, device=device)
    k = torch.randn(B, T, 1, 8, device=device)
    cos, sin = tables(B, T, 8, torch.float32, device)
    for deinterleave in (False, True):
        inputs = dict(q=q, k=k, cos=cos, sin=sin, unsqueeze_dim=2, deinterleave=deinterleave)
        assert_close_to_truth(compare(F.rope_interleaved, R.rope_interleaved, inputs, ["q", "k"]))
    c3, s3 = tables(3 * B, T, 8, torch.float32, device)
    inputs = dict(q=q, k=k, cos=c3.view(3, B, T, 8), sin=s3.view(3, B, T, 8), mrope_section=(2, 1, 1),
                  unsqueeze_dim=2)
    assert_close_to_truth(compare(F.mrope, R.mrope, inputs, ["q", "k"]))


def test_variants_bad_input(device):
    q, k = qk(2, 1, 8, torch.float32, device)
    cos, sin = tables(1, T, 8, torch.float32, device)
    with pytest.raises(TypeError, match="deinterleave must be a bool"):
        F.rope_interleaved(q, k, cos, sin, 1, "yes")
    with pytest.raises(ValueError, match="cos's last dimension"):
        F.rope_interleaved(q, k, cos[..., :3], sin[..., :3])
    with pytest.raises(ValueError, match=r"cos must have shape \(3, 1 or 2"):
        F.mrope(q, k, cos[None].expand(2, -1, -1, -1), sin[None].expand(2, -1, -1, -1), [1, 1, 2])
    c3, s3 = cos[None].expand(3, -1, -1, -1), sin[None].expand(3, -1, -1, -1)
    with pytest.raises(ValueError, match="mrope_section must be three non-negative ints summing to"):
        F.mrope(q, k, c3, s3, [1, 1, 1])
    with pytest.raises(ValueError, match="mrope_section"):
        F.mrope(q, k, c3, s3, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_glm4v_expanded_tables_match_hf(device, dtype):
    """GLM-4V's apply_rotary_pos_emb (transformers 5.2x): interleaved pairs on repeat-interleaved tables (one column
    per rotated dim; arbitrary values, so c[2i] != c[2i+1] is rotated as HF does), partial."""
    original = hf("glm4v", "apply_rotary_pos_emb")
    if "repeat_interleave" in __import__("inspect").getsource(original):
        pytest.skip("this transformers' GLM-4V function expands the tables itself (the 'interleaved' layout)")
    q, k = qk(2, 2, 14, dtype, device)
    cos, sin = (torch.randn(1, T, 10, device=device, dtype=dtype) for _ in range(2))
    inputs = dict(q=q, k=k, cos=cos, sin=sin)
    assert_close_to_truth(compare(lambda **a: F.rope_interleaved(**a, expanded_tables=True), original, inputs,
                                  ["q", "k"]))


def test_dispatch_layouts_match_hf(device):
    """The engine's adapters (tigon.integrations.rotary_layouts): GPT-OSS's half-width tables and the complex form
    of Llama 4 (heads at axis 2) and DeepSeek-V2 (axis 1) against their HF functions; calls of another form -> None."""
    from tigon.integrations.rotary_layouts import tigon_call

    q, k = qk(2, 1, 8, torch.float32, device)
    cos, sin = tables(1, T, 8, torch.float32, device)
    gpt_oss = hf("gpt_oss", "apply_rotary_pos_emb")
    half = (cos[..., :4], sin[..., :4])
    for a, b in zip(tigon_call("half_width", False, 1, (q, k, *half), {}), gpt_oss(q, k, *half)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert tigon_call("half_width", False, 1, (q, k, cos, sin), {}) is None  # full-width tables: not its form
    freqs = torch.polar(torch.ones(B, T, 4, device=device), torch.randn(B, T, 4, device=device))
    for axis, module in ((2, "llama4"), (1, "deepseek_v2")):
        x = (q.transpose(1, 2), k.transpose(1, 2)) if axis == 2 else (q, k)
        for a, b in zip(tigon_call("complex", False, axis, (*x, freqs), {}), hf(module, "apply_rotary_emb")(*x, freqs)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert tigon_call("rotate_half", False, 1, (q, k, cos, sin, None), {}) is None  # an old position_ids argument
    # the binding is decided once per call form (cached): every form gives the positional call's result
    want = tigon_call("rotate_half", False, 1, (q, k, cos, sin), {})
    for args, kwargs in (((q, k, cos, sin), {"unsqueeze_dim": 1}), ((q,), dict(k=k, cos=cos, sin=sin)),
                         ((), dict(q=q, k=k, cos=cos, sin=sin))):
        for _ in range(2):
            for a, b in zip(tigon_call("rotate_half", False, 1, args, kwargs), want):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    for _ in range(2):  # arguments its function does not take
        assert tigon_call("rotate_half", False, 1, (q, k, cos, sin), {"partial": True}) is None
        assert tigon_call("rotate_half", False, 1, (q, k, cos), {}) is None


def test_llama4_vision_rotary_matches_hf(device):
    """Llama 4's ``vision_apply_rotary_emb(query, key, freqs_ci=...)`` (the ``complex_vision`` layout): its own table
    (the class token's row of angle 0 included) for a batch of images, in fp32 and bf16, as HF computes it; a table of
    another size or of real values -> None (HF's own code then runs, or raises)."""
    from tigon.integrations.rotary_layouts import tigon_call

    hf_fn = hf("llama4", "vision_apply_rotary_emb")
    from transformers import Llama4VisionConfig
    from transformers.models.llama4.modeling_llama4 import Llama4VisionRotaryEmbedding
    vision = Llama4VisionConfig(hidden_size=32, num_attention_heads=2, image_size=8, patch_size=2)
    freqs_ci = Llama4VisionRotaryEmbedding._compute_freqs_ci(vision).to(device)  # (16 patches + class, 1, 8) complex
    tokens, d = freqs_ci.shape[0], 2 * freqs_ci.shape[-1]
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        q = torch.randn(3, tokens, 2 * d, device=device, dtype=dtype).view(3, tokens, 2, d)  # (B, T, H, D)
        k = torch.randn(3, tokens, 2, d, device=device, dtype=dtype)
        got = tigon_call("complex_vision", False, 1, (q, k), {"freqs_ci": freqs_ci})
        for a, b in zip(got, hf_fn(q, k, freqs_ci=freqs_ci)):
            assert a.dtype == b.dtype == dtype
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert tigon_call("complex_vision", False, 1, (q, k), {"freqs_ci": freqs_ci[1:]}) is None
    assert tigon_call("complex_vision", False, 1, (q, k), {"freqs_ci": freqs_ci.real}) is None
    assert tigon_call("complex_vision", False, 1, (q, k), {"freqs_cis": freqs_ci}) is None  # not its argument


def test_mrope_empty_first_section(device):
    """A zero-width temporal section (found by the property tests: the kernel once read such tables as plain rope)."""
    q, k = qk(1, 1, 4, torch.float32, device)
    cos, sin = tables(3, T, 4, torch.float32, device)
    inputs = dict(q=q, k=k, cos=cos[:, None], sin=sin[:, None], mrope_section=[0, 1, 1])
    assert_close_to_truth(compare(F.mrope, R.mrope, inputs, ["q", "k"]))
