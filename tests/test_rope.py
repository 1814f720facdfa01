import contextlib

import pytest
import torch

from tigon import functional as F
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.rope import rope as ref_rope

B, T = 2, 7


def hf_tables(batch, t, d, dtype, device, base=10000.0):
    """cos/sin as HF's rotary embedding builds them (cat(freqs, freqs)), positions offset per batch row."""
    inv_freq = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    pos = torch.arange(t, dtype=torch.float64)[None, :] + 5.0 * torch.arange(batch, dtype=torch.float64)[:, None]
    emb = torch.cat((pos[..., None] * inv_freq,) * 2, dim=-1)
    return emb.cos().to(device, dtype), emb.sin().to(device, dtype)


def hf_layout(hq, hkv, d, dtype, device):
    """q, k as HF attention makes them: ``proj(x).view(B, T, H, D).transpose(1, 2)`` (non-contiguous)."""
    q = torch.randn(B, T, hq * d, device=device, dtype=dtype).view(B, T, hq, d).transpose(1, 2)
    k = torch.randn(B, T, hkv * d, device=device, dtype=dtype).view(B, T, hkv, d).transpose(1, 2)
    return q, k


def tigon_rope_checked(q, k, cos, sin, unsqueeze_dim=1):
    # compare() clones its inputs; clone keeps the dense transposed layout, so the kernel sees real strides.
    assert not q.is_contiguous() and not k.is_contiguous()
    return F.rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4)], ids=["gqa", "mha"])
@pytest.mark.parametrize("cos_batch", [1, B])
def test_rope_matches_float64(device, dtype, heads, cos_batch):
    q, k = hf_layout(*heads, 48, dtype, device)
    cos, sin = hf_tables(cos_batch, T, 48, dtype, device)
    inputs = dict(q=q, k=k, cos=cos, sin=sin)
    checks = compare(tigon_rope_checked, ref_rope, inputs, ["q", "k"])
    assert {c.tensor for c in checks} == {"out", "out1", "grad_q", "grad_k"}
    assert_close_to_truth(checks)


def test_rope_fp16_head_dim_64(device):
    q, k = hf_layout(4, 2, 64, torch.float16, device)
    cos, sin = hf_tables(B, T, 64, torch.float16, device)
    assert_close_to_truth(compare(tigon_rope_checked, ref_rope, dict(q=q, k=k, cos=cos, sin=sin), ["q", "k"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_unsqueeze_dim_2(device, dtype):
    # (B, T, H, D) layout: the un-transposed view of the projection, contiguous.
    q = torch.randn(B, T, 4, 48, device=device, dtype=dtype)
    k = torch.randn(B, T, 2, 48, device=device, dtype=dtype)
    cos, sin = hf_tables(1, T, 48, dtype, device)
    inputs = dict(q=q, k=k, cos=cos, sin=sin, unsqueeze_dim=2)
    assert_close_to_truth(compare(F.rope, ref_rope, inputs, ["q", "k"]))


@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_rope_arbitrary_tables_use_the_exact_transpose(device, unsqueeze_dim):
    # HF tables have equal halves (c1 == c2, s1 == s2), which would hide a backward that swapped the halves.
    q, k = hf_layout(4, 2, 48, torch.float32, device)
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = torch.randn(B, T, 48, device=device), torch.randn(B, T, 48, device=device)
    inputs = dict(q=q, k=k, cos=cos, sin=sin, unsqueeze_dim=unsqueeze_dim)
    assert_close_to_truth(compare(F.rope, ref_rope, inputs, ["q", "k"]))


def test_rope_fp32_tables_with_bf16_q(device):
    q, k = hf_layout(4, 2, 48, torch.bfloat16, device)
    cos, sin = hf_tables(B, T, 48, torch.float32, device)
    q_embed, k_embed = F.rope(q, k, cos, sin)
    assert q_embed.dtype == k_embed.dtype == torch.bfloat16
    # The reference computes in fp32 here too and rounds once, exactly like the kernel: the two errors are the
    # same final bf16 rounding, so 1.1 only absorbs ties and the sampling noise of a relative-L2 estimate.
    checks = compare(F.rope, ref_rope, dict(q=q, k=k, cos=cos, sin=sin), ["q", "k"], factor=1.1)
    assert_close_to_truth(checks)


def test_rope_strided_slices_of_fused_qkv(device):
    # Phi-3 style: q, k, v sliced from one fused projection, so q/k are not even dense; gradients flow back.
    hq, hkv, d = 4, 2, 64
    qkv = torch.randn(B, T, (hq + 2 * hkv) * d, device=device, requires_grad=True)
    cos, sin = hf_tables(B, T, d, torch.float32, device)

    def run(fn):
        q = qkv[..., : hq * d].view(B, T, hq, d).transpose(1, 2)
        k = qkv[..., hq * d: (hq + hkv) * d].view(B, T, hkv, d).transpose(1, 2)
        qe, ke = fn(q, k, cos, sin)
        g = torch.autograd.grad((qe * qe.detach().cos()).sum() + (ke * ke.detach().sin()).sum(), qkv)[0]
        return qe, ke, g

    q_t, k_t, g_t = run(F.rope)
    q_r, k_r, g_r = run(ref_rope)
    torch.testing.assert_close(q_t, q_r)
    torch.testing.assert_close(k_t, k_r)
    torch.testing.assert_close(g_t, g_r)
    assert g_t[..., (hq + hkv) * d:].abs().max() == 0  # v's slice gets nothing


def test_rope_row_tiles_with_partial_blocks(device, monkeypatch):
    # Rows go in [BLOCK_R, D/2] tiles; force 4-row tiles over 3 heads: tiles straddle positions, and q's 3 * B * T
    # rows and k's B * T leave a partial last tile each.
    from tigon.kernels import rope as rope_op

    assert (3 * B * T) % 4 and (B * T) % 4
    monkeypatch.setattr(rope_op, "_rows_config", lambda block_half, dev: (4, 1))
    q, k = hf_layout(3, 1, 48, torch.float32, device)
    cos, sin = hf_tables(B, T, 48, torch.float32, device)
    assert_close_to_truth(compare(F.rope, ref_rope, dict(q=q, k=k, cos=cos, sin=sin), ["q", "k"]))


def test_rope_no_gradient_for_tables_and_inputs_not_mutated(device):
    q, k = hf_layout(4, 2, 48, torch.float32, device)
    cos, sin = hf_tables(B, T, 48, torch.float32, device)
    cos.requires_grad_(True)
    sin.requires_grad_(True)
    q.requires_grad_(True)
    before = [t.detach().clone() for t in (q, k, cos, sin)]
    qe, ke = F.rope(q, k, cos, sin)
    assert qe.shape == q.shape and ke.shape == k.shape
    assert qe.stride() == q.stride()  # dense inputs: outputs keep the (B, T, H, D) memory layout
    (qe.sum() + ke.sum()).backward()
    assert cos.grad is None and sin.grad is None and q.grad is not None
    for t, b in zip((q, k, cos, sin), before):
        assert torch.equal(t.detach(), b)
    with support.force_reference():
        qe, ke = F.rope(q, k, cos, sin)
    (qe.sum() + ke.sum()).backward()
    assert cos.grad is None and sin.grad is None  # the reference treats the tables as constants too


def test_rope_runs_a_kernel(device):
    support.backend_usage(reset=True)
    q, k = hf_layout(2, 1, 8, torch.float32, device)
    cos, sin = hf_tables(1, T, 8, torch.float32, device)
    F.rope(q, k, cos, sin)
    assert set(support.backend_usage()["rope"]) == {"triton" if device == "cuda" else "interpreter"}


def test_rope_bad_input():
    q, k = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8)
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="q must have 4 dimensions"):
        F.rope(q[0], k, cos, sin)
    with pytest.raises(ValueError, match="cos must have shape"):
        F.rope(q, k, cos[:, :2], sin)
    with pytest.raises(ValueError, match="sin must have shape"):
        F.rope(q, k, cos, torch.randn(3, 3, 8))
    with pytest.raises(ValueError, match="must be even, positive and at most"):
        F.rope(q[..., :7], k[..., :7], cos[..., :7], sin[..., :7])
    with pytest.raises(ValueError, match="must be even, positive and at most"):
        F.rope(q, k, torch.randn(1, 3, 10), torch.randn(1, 3, 10))  # wider than the head
    with pytest.raises(ValueError, match=r"sin must have shape \(1 or 1, 3, 4\)"):
        F.rope(q, k, cos[..., :4], sin)  # partial cos, full sin
    with pytest.raises(ValueError, match="k must match"):
        F.rope(q, k[:, :, :2], cos, sin)
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        F.rope(q, k, cos, sin, unsqueeze_dim=3)
    for reference in (False, True):  # (True == 1: the kernels ran it as 1, the reference's unsqueeze raised)
        with pytest.raises(TypeError, match="unsqueeze_dim must be the int 1 or 2, got bool"):
            with support.force_reference() if reference else contextlib.nullcontext():
                F.rope(q, k, cos, sin, unsqueeze_dim=True)
    with pytest.raises(TypeError, match="k must have q's dtype"):
        F.rope(q, k.double(), cos, sin)
    with pytest.raises(TypeError, match="cos must be a floating-point"):
        F.rope(q, k, cos.long(), sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim, unsqueeze_dim", [(12, 1), (24, 1), (12, 2)])
def test_partial_rotary(device, dtype, rotary_dim, unsqueeze_dim):
    # GPT-NeoX / Pythia (rotary_pct 0.25), phi-2 (0.4), StableLM: cos / sin of rotary_dim < head_dim columns rotate
    # the first rotary_dim dims; the rest pass through exactly (values and gradients).
    q, k = hf_layout(4, 2, 40, dtype, device)
    if unsqueeze_dim == 2:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = hf_tables(B, T, rotary_dim, dtype, device)
    inputs = dict(q=q, k=k, cos=cos, sin=sin, unsqueeze_dim=unsqueeze_dim)
    assert_close_to_truth(compare(F.rope, ref_rope, inputs, ["q", "k"]))
    qe, ke = F.rope(**inputs)
    assert torch.equal(qe[..., rotary_dim:], q[..., rotary_dim:])
    assert torch.equal(ke[..., rotary_dim:], k[..., rotary_dim:])


@pytest.mark.slow
def test_reference_is_hf_partial_apply_rotary_pos_emb():
    neox = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")
    q, k = hf_layout(4, 2, 48, torch.float32, "cpu")
    cos, sin = hf_tables(B, T, 12, torch.float32, "cpu")
    for ours, theirs in zip(ref_rope(q, k, cos, sin), neox.apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(ours, theirs)


@pytest.mark.slow
def test_reference_is_hf_apply_rotary_pos_emb():
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    q, k = hf_layout(4, 2, 48, torch.float32, "cpu")
    cos, sin = hf_tables(B, T, 48, torch.float32, "cpu")
    for ours, theirs in zip(ref_rope(q, k, cos, sin), llama.apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("need", ["both", "q", "k"])
def test_rope_row_groups(device, monkeypatch, need):
    # Four rows per program: q's 5 * B * T rows and k's 3 * B * T end in partial tiles; the backward with only one
    # of q / k needing a gradient launches only its rows.
    from tigon.kernels import rope as rope_op

    assert (5 * B * T) % 4 and (3 * B * T) % 4
    monkeypatch.setattr(rope_op, "_rows_config", lambda block_half, dev: (4, 1))
    q, k = hf_layout(5, 3, 32, torch.float32, device)
    cos, sin = hf_tables(B, T, 32, torch.float32, device)
    grads = {"both": ["q", "k"], "q": ["q"], "k": ["k"]}[need]
    checks = compare(tigon_rope_checked, ref_rope, dict(q=q, k=k, cos=cos, sin=sin), grads)
    assert {c.tensor for c in checks} == {"out", "out1"} | {f"grad_{g}" for g in grads}
    assert_close_to_truth(checks)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("rotary_dim", [32, 8])
def test_rope_apply_in_place_matches_out_of_place(device, monkeypatch, backward, rotary_dim):
    # rope_apply(inplace=True) (the tuning script's in-place timing) writes the same values over q and k.
    from tigon.kernels import rope as rope_op

    monkeypatch.setattr(rope_op, "_rows_config", lambda block_half, dev: (4, 1))
    q, k = hf_layout(5, 3, 32, torch.float32, device)
    cos, sin = hf_tables(B, T, rotary_dim, torch.float32, device)
    qo, ko = rope_op.rope_apply(q, k, cos, sin, 1, backward)
    qi, ki = q.clone(), k.clone()
    qr, kr = rope_op.rope_apply(qi, ki, cos, sin, 1, backward, inplace=True)
    assert qr is qi and kr is ki
    torch.testing.assert_close(qi, qo, rtol=0, atol=0)
    torch.testing.assert_close(ki, ko, rtol=0, atol=0)


def test_record_inputs_follow_partial_rotary():
    # tigon verify / bench --model of a partial-rotary model (Pythia's config.json: rotary_pct) time and check the
    # rope the model runs: cos / sin of rotary_dim columns, also in verify's odd shapes
    from tigon.ops.rope import RECORDS
    from tigon.workflows.model_shapes import shapes_from_config

    spec = RECORDS[0]
    shapes, _ = shapes_from_config({"model_type": "gpt_neox", "hidden_size": 128, "intermediate_size": 512,
                                    "num_attention_heads": 4, "vocab_size": 300, "rotary_pct": 0.25}, 6, batch=2)
    assert (shapes.head_dim, shapes.rotary_dim) == (32, 8)
    for m in (shapes, shapes.odd()):
        s = spec.shape_of(m)
        inputs = spec.make_inputs(s, torch.float32, "cpu", torch.Generator().manual_seed(0))
        assert inputs["cos"].shape[-1] == m.rotary_dim < inputs["q"].shape[-1] == m.head_dim
        assert m.rotary_dim % 2 == 0 and "rotary" in spec.size_label(s)
        assert_close_to_truth(compare(F.rope, ref_rope, inputs, ["q", "k"]))
