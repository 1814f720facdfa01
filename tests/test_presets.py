"""Model presets: every preset builds a transformers config; the Qwen2 / Gemma 2 shapes build and patch on CPU."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon import presets  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_preset_names():
    assert presets.preset_names() == ["tiny", "small", "llama3-8b", "llama3.2-1b", "qwen2-7b", "qwen2.5-7b",
                                      "qwen2.5-0.5b", "smollm2-360m", "gemma2-9b", "qwen2-vl-7b", "qwen2.5-vl-7b",
                                      "qwen2-vl-tiny", "qwen2.5-vl-tiny"]
    for name in presets.preset_names():
        p = presets.get_preset(name)
        text = p["config"].get("text_config", p["config"])  # a vision-language preset's text decoder
        assert set(p) == {"model_type", "description", "lr", "config"} and text["vocab_size"] >= 256


def test_readme_preset_row_names_every_preset():
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `--preset NAME` |"))
    assert [n for n in presets.preset_names() if f"`{n}`" not in row] == []


@pytest.mark.parametrize("name", presets.preset_names())
def test_every_preset_builds_a_config_with_2_layers(name):
    cfg = presets.build_config(name, 2)
    assert cfg.model_type == presets.PRESETS[name]["model_type"]
    cfg = cfg.get_text_config()  # a vision-language preset keeps 2 layers of its text decoder
    assert cfg.num_hidden_layers == 2
    for value in vars(cfg).values():  # per-layer lists cut to the kept layers
        if isinstance(value, list) and value and isinstance(value[0], str) and "attention" in value[0]:
            assert len(value) == 2


def test_qwen2_and_gemma2_shapes():
    q = presets.build_config("qwen2-7b")
    assert (q.vocab_size, q.hidden_size, q.intermediate_size, q.num_hidden_layers, q.num_attention_heads,
            q.num_key_value_heads) == (152064, 3584, 18944, 28, 28, 4)
    assert q.rope_parameters["rope_theta"] == 1e6 and q.rms_norm_eps == 1e-6 and not q.tie_word_embeddings
    g = presets.build_config("gemma2-9b", 2)
    assert (g.vocab_size, g.hidden_size, g.intermediate_size, g.num_attention_heads, g.num_key_value_heads,
            g.head_dim) == (256000, 3584, 14336, 16, 8, 256)
    assert (g.final_logit_softcapping, g.attn_logit_softcapping, g.query_pre_attn_scalar, g.sliding_window) == \
        (30.0, 50.0, 256, 4096)
    assert g.hidden_activation == "gelu_pytorch_tanh" and g.tie_word_embeddings
    assert g.layer_types == ["sliding_attention", "full_attention"]
    assert presets.PRESETS["gemma2-9b"]["config"]["num_hidden_layers"] == 42


@pytest.mark.parametrize("name", ["qwen2-7b", "gemma2-9b"])
def test_small_model_of_the_preset_builds_patches_and_trains(name):
    cfg = presets.build_config(name, 1)
    for key, value in dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, vocab_size=256).items():
        setattr(cfg, key, value)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(DEVICE).train()
    ids = torch.randint(0, 256, (2, 16), device=DEVICE)
    ref = model(input_ids=ids, labels=ids).loss
    report = tigon.patch(model)
    try:
        assert report.family == cfg.model_type and not report.skipped
        assert report.counts["lm_head_loss"] == 1 and report.counts["mlp"] == 1 and report.counts["rope"] == 1
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    finally:
        tigon.unpatch(model)
    assert out.logits is None and out.loss.item() == pytest.approx(ref.item(), rel=1e-4)
    if name == "qwen2-7b":
        assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's q/k/v bias
    else:
        assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
