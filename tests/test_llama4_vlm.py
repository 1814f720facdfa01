"""Llama 4 as a vision-language model (``Llama4ForConditionalGeneration``, tests/model_matrix.py's ``llama4-vlm``):
image batches from its config (one tile, its pixel-shuffled patch tokens), its vision tower patched (LayerNorms, the
encoder layers' GELU MLP, the rotary on its complex table; the pixel-shuffle adapter's MLP reported skipped), one
step with an image equal to the original's (loss and every gradient, fp32 1e-5), ``tigon inspect`` equal to
``tigon.patch``, and ``tigon compare``, ``tigon bench --e2e`` and ``tigon profile`` end to end on the CPU."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import DEVICE, DTYPE, VISION_LANGUAGE, build, config, require_family  # noqa: E402
from tigon import support  # noqa: E402
from tigon.workflows import multimodal  # noqa: E402

MODEL_TYPE, OVERRIDES, CLS = VISION_LANGUAGE["llama4-vlm"][:3]
WIDE = dict(OVERRIDES, vision_config=dict(OVERRIDES["vision_config"], image_size=16))
"""A 16x16 image: 4x4 patches (17 positions with the class token) pixel-shuffled to 4 image tokens."""


@pytest.fixture(autouse=True)
def _llama4():
    require_family(MODEL_TYPE)


def _batch(overrides: dict, seq: int = 12) -> dict:
    ids = torch.randint(8, 250, (2, seq), generator=torch.Generator().manual_seed(0))
    return {k: v.to(DEVICE) for k, v in multimodal.with_images(ids, config(MODEL_TYPE, overrides)).items()}


def test_build_keeps_the_complex_rotary_table():
    """``model_matrix.build`` (through :func:`tigon.workflows.e2e_models.cast_floating`) casts floating tensors only:
    the vision rotary's complex ``freqs_ci`` keeps its values (``Module.to(dtype)`` would drop its imaginary part);
    in bfloat16 too, the integer and complex tensors untouched."""
    from tigon.workflows.e2e_models import cast_floating

    model = build(MODEL_TYPE, OVERRIDES, cls=CLS)
    table = model.vision_model.rotary_embedding.freqs_ci
    want = type(model.vision_model.rotary_embedding)._compute_freqs_ci(model.config.vision_config)
    assert table.is_complex() and torch.equal(table.cpu(), want)
    module = torch.nn.Linear(2, 2)
    module.register_buffer("ids", torch.arange(3))
    module.register_buffer("table", want)
    assert cast_floating(module, torch.bfloat16) is module
    assert (module.weight.dtype, module.ids.dtype, module.table.dtype) == (torch.bfloat16, torch.long, want.dtype)
    assert torch.equal(module.table, want)


@pytest.mark.parametrize("image_size, patch_size, tokens", [(8, 4, 1), (16, 4, 4), (16, 2, 16)])
def test_image_batch_is_one_tile_of_pixel_shuffled_patches(image_size, patch_size, tokens):
    """One ``image_size`` tile per sequence, ``(size / patch)**2 * pixel_shuffle_ratio**2`` placeholder tokens (as
    its processor counts them: patches // round(1 / ratio**2)) between the start / end tokens, and the model takes
    the batch (transformers raises when the features and the placeholders differ)."""
    overrides = dict(OVERRIDES, vision_config=dict(OVERRIDES["vision_config"], image_size=image_size,
                                                  patch_size=patch_size))
    cfg = config(MODEL_TYPE, overrides)
    assert multimodal.image_layout(cfg) == "square" and multimodal.square_image_tokens(cfg) == tokens
    assert tokens == (image_size // patch_size) ** 2 // round(1 / cfg.vision_config.pixel_shuffle_ratio ** 2)
    batch = _batch(overrides, seq=tokens + 8)
    assert batch["pixel_values"].shape == (2, 3, image_size, image_size)
    span = batch["input_ids"][:, 1:tokens + 3].tolist()
    assert span == [[cfg.boi_token_index] + [cfg.image_token_id] * tokens + [cfg.eoi_token_index]] * 2
    assert torch.equal(batch["labels"] == -100, batch["input_ids"] == cfg.image_token_id)
    torch.manual_seed(0)
    model = multimodal.auto_class(cfg).from_config(cfg).to(DEVICE)
    with torch.no_grad():
        assert torch.isfinite(model(**batch, use_cache=False).loss)


def test_vision_tower_report_is_what_runs_and_inspect_agrees():
    """The vision tower's entries: its four LayerNorms (layer_norm), the encoder layer's MLP (act_linear), its
    attention's rotary (vision_apply_rotary_emb -> rope_interleaved); the pixel-shuffle adapter's MLP skipped with
    the reason; ``tigon inspect`` of the config decides the same entries."""
    from tigon.workflows.inspect import inspect_config

    model = build(MODEL_TYPE, OVERRIDES, cls=CLS)
    report = tigon.patch(model)
    try:
        vision = {(e.kind, e.target): e for e in report.replaced if e.target.startswith("vision_model.")}
        assert {k for k, _ in vision} == {"layer_norm", "mlp", "rope"}
        assert sorted(t for k, t in vision if k == "layer_norm") == [
            "vision_model.layernorm_post", "vision_model.layernorm_pre",
            "vision_model.model.layers.0.input_layernorm", "vision_model.model.layers.0.post_attention_layernorm"]
        assert vision["mlp", "vision_model.model.layers.0.mlp"].ops == ("act_linear",)
        rope = vision["rope", "vision_model.model.layers.0.self_attn"]
        assert rope.ops == ("rope_interleaved",) and rope.detail.startswith("vision_apply_rotary_emb ->")
        skipped = {e.target: e.detail for e in report.skipped}
        assert "second GELU after fc2" in skipped["vision_model.vision_adapter.mlp"]
        dry = inspect_config(config(MODEL_TYPE, OVERRIDES))
        for kind in ("replaced", "skipped"):
            assert sorted((e["kind"], e["target"]) for e in dry.patch[kind]) == \
                sorted((e.kind, e.target) for e in getattr(report, kind))
        # the rotary modules left alone name the function each tower's rotation runs (it said apply_rotary_pos_emb)
        why = {r["module"]: r["reason"] for r in dry.left_alone if r["module"].endswith("RotaryEmbedding")}
        assert "the rotation itself (vision_apply_rotary_emb) is what" in why["Llama4VisionRotaryEmbedding"], why
        assert "the rotation itself (apply_rotary_emb) is what" in why["Llama4TextRotaryEmbedding"], why
        support.backend_usage(reset=True)
        with torch.no_grad():
            model(**_batch(OVERRIDES))
        used = support.backend_usage()
        assert sum(used["rope_interleaved"].values()) == 3  # two text layers and the vision layer, one call each
        assert sum(used["layer_norm"].values()) == 4 and sum(used["act_linear"].values()) == 1
    finally:
        tigon.unpatch(model)


@pytest.mark.skipif(DTYPE != torch.float32, reason="exact-gradient check: fp32 only")
def test_step_with_a_wider_image_equals_the_original():
    """A 16x16 image (4 image tokens, 17 rotary positions): the loss and every gradient equal the original's (fp32,
    1e-5), and the ops the report declares ran."""
    from test_families import assert_same_step

    original, patched = build(MODEL_TYPE, WIDE, cls=CLS), build(MODEL_TYPE, WIDE, cls=CLS)
    report = tigon.patch(patched)
    try:
        batch = _batch(WIDE)
        assert (batch["labels"] == -100).sum() == 2 * 4
        assert_same_step(original, patched, report, **batch)
    finally:
        tigon.unpatch(patched)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The matrix config, saved as a directory the tools take as ``--model``."""
    require_family(MODEL_TYPE)
    path = tmp_path_factory.mktemp("llama4") / "model"
    config(MODEL_TYPE, OVERRIDES).save_pretrained(path)
    return str(path)


def test_compare_runs_end_to_end(saved):
    from tigon.workflows.compare import CompareConfig, run_compare

    r = run_compare(CompareConfig(model=saved, steps=1, batch_size=1, seq_len=16, device=DEVICE))
    assert r.ok and r.max_rel_loss_diff < 1e-5 and r.model["architecture"] == CLS
    assert r.data["image_tokens_per_sequence"] == 1
    assert {"rms_norm", "layer_norm", "act_linear", "rope_interleaved", "fused_linear_cross_entropy"} <= \
        set(r.backend_usage)


def test_e2e_bench_row(saved):
    from tigon.workflows.e2e import E2EConfig, run_e2e

    r = run_e2e(E2EConfig(model=saved, providers=["original", "tigon"], steps=1, warmup=0, batch_size=1, seq_len=16,
                          device=DEVICE, dtype="float32"))
    assert [row.status for row in r.rows] == ["ok", "ok"], [row.note for row in r.rows]
    assert abs(r.rows[0].losses[0] - r.rows[1].losses[0]) <= 1e-5 * r.rows[0].losses[0]
    assert r.model["image_tokens_per_sequence"] == 1 and r.model["vision_positions_per_sequence"] == 4
    assert 0 < r.model["vision_parameters"] < r.model["num_parameters"]


def test_profile_runs_and_finds_the_decoder_layers(saved):
    """``tigon profile`` of the config (the patched step too); its per-layer timing finds the text decoder's layers
    inside the ``Llama4ForCausalLM`` that ``get_decoder()`` gives (it said "the model's backbone has no `layers`
    ModuleList")."""
    from test_profile_layer import few_timing_samples

    from tigon.workflows import profile as P
    from tigon.workflows.profile_events import decoder_layers, layers_holder
    from tigon.workflows.profile_layer import without_layers

    model = build(MODEL_TYPE, OVERRIDES, cls=CLS)
    assert layers_holder(model) is model.language_model.model
    assert decoder_layers(model) == list(model.language_model.model.layers)
    with without_layers(model):
        assert len(model.language_model.model.layers) == 0
    assert len(model.language_model.model.layers) == 2
    with pytest.MonkeyPatch.context() as mp:
        few_timing_samples(mp)
        r = P.run_profile(P.ProfileConfig(model=saved, layers=1, batch_size=1, seq_len=16, steps=1, warmup=0,
                                          predict=False)).as_dict()
    assert r["model"]["architecture"] == CLS and r["model"]["vision_positions_per_sequence"] == 4
    assert r["patch"] == {"rms_norm": 4, "layer_norm": 4, "mlp": 2, "rope": 2, "lm_head_loss": 1}
    assert r["step_ms_original"] > 0 and r["step_ms_patched"] > 0
