"""The vision towers' packed attention batched by chunk length (tigon.integrations.varlen_attention): the op against
transformers' per-chunk loop (values and gradients, fp32, equal and unequal chunk lengths, empty chunks, strided
inputs, sdpa and eager), its errors; the patch on tiny Qwen2.5-VL / Qwen2-VL towers with several images whose windows
differ in size: outputs and every gradient equal to the unpatched tower, far fewer attention calls, the report, a
model sharing the config left alone, unpatch, the implementations it leaves alone."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import DEVICE  # noqa: E402
from tigon import presets  # noqa: E402
from tigon.integrations import varlen_attention as va  # noqa: E402
from tigon.workflows import multimodal  # noqa: E402

from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25  # noqa: E402


class Attn(torch.nn.Module):
    """What transformers' attention functions read from a vision attention module."""
    num_key_value_groups = 1
    is_causal = False
    training = False


Attn.__module__ = q25.__name__  # its eager attention: the Qwen2.5-VL module's eager_attention_forward


def per_chunk(q, k, v, cu, implementation, scaling):
    """transformers' non-flash path: one call per chunk (modeling_qwen2_5_vl.Qwen2_5_VLVisionAttention.forward)."""
    fn = va._inner(Attn(), implementation)
    lengths = [n for n in (cu[1:] - cu[:-1]).tolist() if n]  # (its reshape fails on an empty chunk: dropped)
    outs = [fn(Attn(), a, b, c, None, scaling=scaling, dropout=0.0, is_causal=False)[0]
            for a, b, c in zip(*(torch.split(t, lengths, dim=2) for t in (q, k, v)))]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("lengths", [[16, 16, 16], [16, 8, 16, 4, 0, 8, 13], [5], [1, 1, 7]])
def test_equals_the_per_chunk_loop(implementation, lengths):
    gen = torch.Generator().manual_seed(len(lengths))
    s, heads, dim = sum(lengths), 3, 8
    cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32).to(DEVICE)
    # (S, heads, dim) transposed as the towers pass them: (1, heads, S, dim), strided
    leaves = [torch.randn(s, heads, dim, generator=gen).to(DEVICE).requires_grad_() for _ in range(3)]
    grad = torch.randn(1, s, heads, dim, generator=gen).to(DEVICE)

    def run(fn):
        for t in leaves:
            t.grad = None
        out = fn(*(t.transpose(0, 1).unsqueeze(0) for t in leaves))
        out.backward(grad)
        return out.detach(), [t.grad.clone() for t in leaves]

    want = run(lambda q, k, v: per_chunk(q, k, v, cu, implementation, 0.3))
    got = run(lambda q, k, v: va.varlen_attention(Attn(), q, k, v, None, scaling=0.3, cu_seq_lens_q=cu,
                                                  cu_seq_lens_k=cu, implementation=implementation)[0])
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=1e-6)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


def test_errors_name_the_argument():
    q = torch.randn(1, 2, 6, 4)
    call = lambda cu, cu_k=None, x=q: va.varlen_attention(Attn(), x, x, x, cu_seq_lens_q=cu,  # noqa: E731
                                                          cu_seq_lens_k=cu if cu_k is None else cu_k)
    for bad in (torch.tensor([1, 6]), torch.tensor([0, 5]), torch.tensor([0, 4, 2, 6]), torch.tensor([[0, 6]])):
        with pytest.raises(ValueError, match="cu_seq_lens_q must be 1-D, non-decreasing, from 0 to S = 6"):
            call(bad)
    with pytest.raises(ValueError, match="cu_seq_lens_k must equal cu_seq_lens_q"):
        call(torch.tensor([0, 3, 6]), torch.tensor([0, 2, 6]))
    with pytest.raises(ValueError, match=r"must be \(1, heads, S, head_dim\)"):
        call(torch.tensor([0, 6]), x=torch.randn(2, 2, 6, 4))
    # no cu_seq_lens_q (not the varlen path): the implementation itself, as transformers would call it
    out, _ = va.varlen_attention(Attn(), q, q, q, None, is_causal=False)
    assert out.shape == (1, 6, 2, 4)


def tower_inputs(cfg, grids=((1, 6, 10), (1, 4, 4), (1, 4, 4))):
    """Pixel patches and grid_thw of three images: 3 x 5 merged units in Qwen2.5-VL's windows of 2 x 2 units
    (windows of 16, 8 and 4 patches) and twice 2 x 2 units (one window each); every block attends within a chunk."""
    v = cfg.vision_config
    width = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    grid = torch.tensor(grids)
    pixels = torch.randn(int(grid.prod(-1).sum()), width, generator=torch.Generator().manual_seed(0))
    return pixels.to(DEVICE).requires_grad_(), grid.to(DEVICE)


def build(name, implementation, seed=0):
    cfg = presets.build_config(name)
    cfg._attn_implementation = implementation
    torch.manual_seed(seed)
    return cfg, multimodal.auto_class(cfg).from_config(cfg).to(DEVICE).train()


def tower_step(model, pixels, grid):
    pixels.grad = None
    model.zero_grad(set_to_none=True)
    out = model.model.visual(pixels, grid_thw=grid)
    out = getattr(out, "pooler_output", out)
    (out.float() * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.model.visual.named_parameters() if p.grad is not None}, \
        pixels.grad.clone()


def calls_of_sdpa(monkeypatch):
    """Count torch's scaled_dot_product_attention calls (transformers' SDPA function calls it by attribute)."""
    count = [0]
    real = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    return count


@pytest.mark.parametrize("name", ["qwen2.5-vl-tiny", "qwen2-vl-tiny"])
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_tower_equals_the_original_with_fewer_calls(name, implementation, monkeypatch):
    cfg, model = build(name, implementation)
    pixels, grid = tower_inputs(cfg)
    count = calls_of_sdpa(monkeypatch)
    want = tower_step(model, pixels, grid)
    loop_calls = count[0]
    report = tigon.patch(model)
    entries = [e for e in report.replaced if e.kind == "vision_attention"]
    assert len(entries) == cfg.vision_config.depth and f"packed {implementation} attention" in entries[0].detail
    assert model.model.visual.config._attn_implementation == va.NAMES[implementation]
    assert cfg.vision_config._attn_implementation == implementation  # the config object the caller holds
    count[0] = 0
    got = tower_step(model, pixels, grid)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    for n in want[1]:
        torch.testing.assert_close(got[1][n], want[1][n], rtol=1e-5, atol=1e-6, msg=n)
    torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-6)
    if implementation == "sdpa":
        # Qwen2.5-VL: windows of 16, 8, 8, 8, 4, 16 and 16 patches in window blocks (3 lengths), images of 60, 16 and
        # 16 patches in its full block (2 lengths); Qwen2-VL: full attention, one chunk per image (2 lengths)
        assert count[0] < loop_calls, (count[0], loop_calls)
    assert tigon.patch(model).already_patched
    undone = tigon.unpatch(model)
    assert sum(e.kind == "vision_attention" for e in undone.replaced) == cfg.vision_config.depth
    assert model.model.visual.config._attn_implementation == implementation


def test_a_model_sharing_the_config_is_left_alone():
    cfg, model = build("qwen2.5-vl-tiny", "sdpa")
    other = multimodal.auto_class(cfg).from_config(cfg).to(DEVICE)
    tigon.patch(model)
    try:
        assert other.model.visual.config._attn_implementation == "sdpa"
        assert model.model.visual.config._attn_implementation == va.NAMES["sdpa"]
    finally:
        tigon.unpatch(model)


def test_other_implementations_and_the_switch_off():
    cfg, model = build("qwen2.5-vl-tiny", "sdpa")
    report = tigon.patch(model, vision_attention=False)
    assert "vision_attention" not in report.counts and "turned off: " in " ".join(report.notes)
    tigon.unpatch(model)
    model.model.visual.config._attn_implementation = "flex_attention"
    report = tigon.patch(model)
    assert report.skipped_counts.get("vision_attention") == cfg.vision_config.depth
    assert "not sdpa or eager" in next(e.detail for e in report.skipped if e.kind == "vision_attention")
    tigon.unpatch(model)
    with pytest.raises(TypeError, match="vision_attention must be True or False"):
        tigon.patch(model, vision_attention="yes")
    note = " ".join(tigon.patch("qwen2_5_vl").notes)
    tigon.unpatch("qwen2_5_vl")
    assert "vision_attention: the vision tower's packed attention is batched by chunk length per model only" in note


@pytest.mark.parametrize("request_", [{"vision_config": "sdpa"}, {"vision_config": "eager"}, "eager"])
def test_set_attn_implementation_after_the_patch_is_honoured(request_):
    """The model's own vision config stays its config's ``vision_config``: transformers' set_attn_implementation finds
    the tower by that sub-config (a dict request names it), so the user's request reaches the tower, and the caller's
    config object is left as it was."""
    cfg, model = build("qwen2.5-vl-tiny", "sdpa")
    tigon.patch(model)
    assert model.config.vision_config is model.model.visual.config
    assert cfg.vision_config._attn_implementation == "sdpa"
    model.set_attn_implementation(request_)
    want = request_ if isinstance(request_, str) else request_["vision_config"]
    assert [b.attn.config._attn_implementation for b in model.model.visual.blocks] == [want] * 2
    assert model.config.vision_config._attn_implementation == want
    assert not [e for e in tigon.unpatch(model).replaced if e.kind == "vision_attention"]  # nothing left to undo
