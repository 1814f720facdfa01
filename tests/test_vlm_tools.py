"""Vision-language models in the tools (:mod:`tigon.workflows.multimodal`): ``tigon inspect`` equals ``tigon.patch``
on the real model, one training step with an image equals the unpatched model's (loss and every gradient, fp32 1e-5),
and ``tigon compare``, ``tigon verify --model`` and ``tigon bench --e2e`` run end to end, on the tiny Qwen2-VL and
Qwen2.5-VL presets; the image batches fit every vision-language family of the test matrix."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import DEVICE, VISION_LANGUAGE, config, require_family  # noqa: E402
from test_families import assert_same_step  # noqa: E402
from tigon import presets  # noqa: E402
from tigon.workflows import multimodal  # noqa: E402

TINY = ["qwen2-vl-tiny", "qwen2.5-vl-tiny"]


def tiny_model(name: str, seed: int = 0):
    cfg = presets.build_config(name)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return cfg, multimodal.auto_class(cfg).from_config(cfg).to(DEVICE).train()


def tiny_batch(cfg, seq: int = 12) -> dict:
    ids = torch.randint(0, 250, (1, seq), generator=torch.Generator().manual_seed(0))
    return {k: v.to(DEVICE) for k, v in multimodal.with_images(ids, cfg, image_tokens=1).items()}


@pytest.mark.parametrize("name", TINY)
def test_inspect_equals_patch(name):
    """The dry run of ``tigon inspect`` (meta device, from the config) decides what tigon.patch does to the model."""
    from tigon.workflows.inspect import run_inspect

    cfg, model = tiny_model(name)
    report = tigon.patch(model)
    tigon.unpatch(model)
    got = run_inspect(name)
    assert got.architecture == type(model).__name__ and got.family == report.family == cfg.model_type
    assert got.counts == report.counts and got.patch["skipped_counts"] == report.skipped_counts
    for kind in ("replaced", "skipped"):
        assert sorted((e["kind"], e["target"]) for e in got.patch[kind]) == \
            sorted((e.kind, e.target) for e in getattr(report, kind))
    assert {"rms_norm", "mlp", "rope", "lm_head_loss"} <= set(report.counts)
    assert any(e.target.startswith("model.visual.") for e in report.replaced)  # the vision tower's norms
    assert got.config["vision_num_hidden_layers"] == 2 and got.config["hidden_size"] == 128
    # the vision tower's rotary module: its rotation is skipped (another interface), not "what Tigon replaces"
    why = {r["module"]: r["reason"] for r in got.left_alone if r["module"].endswith("RotaryEmbedding")}
    assert sorted(("Vision" in m, w.endswith("not replaced either (see skipped)")) for m, w in why.items()) == \
        [(False, False), (True, True)], why


@pytest.mark.parametrize("name", TINY)
def test_one_step_with_an_image_equals_the_original(name):
    """Loss and every gradient of one step on text + image (the image tokens ignored by the loss), fp32 1e-5; the
    report's ops are those that ran."""
    cfg, original = tiny_model(name)
    _, patched = tiny_model(name)
    report = tigon.patch(patched)
    try:
        batch = tiny_batch(cfg)
        assert (batch["labels"] == -100).sum() == 1
        assert_same_step(original, patched, report, **batch)
    finally:
        tigon.unpatch(patched)


def test_compare_runs_end_to_end():
    from tigon.workflows.compare import CompareConfig, run_compare

    r = run_compare(CompareConfig(preset="qwen2.5-vl-tiny", steps=1, batch_size=1, seq_len=16, device=DEVICE))
    assert r.ok and r.max_rel_loss_diff < 1e-5 and r.model["architecture"] == "Qwen2_5_VLForConditionalGeneration"
    assert r.data["image_tokens_per_sequence"] == 4 and r.model["hidden_size"] == 128
    assert {"rms_norm", "rope", "glu_linear", "fused_linear_cross_entropy"} <= set(r.backend_usage)


def test_verify_model_picks_the_vision_language_ops():
    from tigon.workflows.verify import VerifyConfig, model_ops, run_verify

    assert "layer_norm" in model_ops("qwen2-vl-tiny")  # the Qwen2-VL vision tower's LayerNorms
    r = run_verify(VerifyConfig(model="qwen2-vl-tiny", ops=["layer_norm"], dtypes=["float32"], tokens=8,
                                device=DEVICE))
    assert r.passed and r.config["ops"] == ["layer_norm"] and r.model["vision_model_type"] == "qwen2_vl_vision"


def test_e2e_bench_row():
    from tigon.workflows.e2e import E2EConfig, run_e2e

    r = run_e2e(E2EConfig(model="qwen2-vl-tiny", providers=["original", "tigon"], steps=1, warmup=0, batch_size=1,
                          seq_len=16, image_tokens=2, device=DEVICE, dtype="float32"))
    assert [row.status for row in r.rows] == ["ok", "ok"], [row.note for row in r.rows]
    assert abs(r.rows[0].losses[0] - r.rows[1].losses[0]) <= 1e-5 * r.rows[0].losses[0]
    assert r.model["image_tokens_per_sequence"] == 2 and r.model["vision_positions_per_sequence"] == 8  # 2x4 patches
    assert 0 < r.model["vision_parameters"] < r.model["num_parameters"]


def test_cli_inspect_json(tmp_path):
    import json

    from tigon.cli import main

    assert main(["inspect", "qwen2.5-vl-tiny", "--json", str(tmp_path / "r.json")]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["architecture"] == "Qwen2_5_VLForConditionalGeneration" and r["counts"]["lm_head_loss"] == 1


@pytest.mark.parametrize("case", list(VISION_LANGUAGE))
def test_image_batch_fits_every_family(case):
    """:func:`with_images` builds inputs each vision-language family's model takes, from its config alone: one image
    per sequence, its placeholder tokens (and only those) ignored by the loss; :func:`take` slices per sequence; the
    vision encoder's positions (:func:`vision_positions`) at least the image's tokens (anyres: its newlines aside)."""
    model_type, overrides, cls, *_ = VISION_LANGUAGE[case]
    require_family(model_type)
    cfg = config(model_type, overrides)
    assert multimodal.model_class(cfg).__name__ == cls
    ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = multimodal.with_images(ids, cfg, image_tokens=1)
    image = batch["input_ids"] == multimodal.image_token_id(cfg)
    assert torch.equal(batch["labels"] == -100, image) and len(set(image.sum(1).tolist())) == 1
    torch.manual_seed(0)
    model = multimodal.auto_class(cfg).from_config(cfg)
    with torch.no_grad():
        assert torch.isfinite(model(**batch, use_cache=False).loss)
    halves = [multimodal.take(batch, 0, 1), multimodal.take(batch, 1, 2)]
    assert all(torch.equal(torch.cat([h[k] for h in halves]), v) for k, v in batch.items())
    positions = multimodal.vision_positions(batch, cfg)  # (the e2e bench's count; raised for square layouts once)
    newlines = multimodal.image_layout(cfg) == "anyres"  # (an anyres image's tokens add a newline token per row)
    assert isinstance(positions, int) and positions > 0 and (newlines or positions >= image.sum(1)[0])



@pytest.mark.parametrize("case", ["llava_next", "llava_onevision"])
@pytest.mark.parametrize("pinpoints", [[[8, 16]], [[24, 8]], [[16, 24]], [[24, 40]], [[32, 32]], [[48, 16]]])
def test_anyres_tokens_match_the_model_for_any_pinpoints(case, pinpoints):
    """Non-square and large ``image_grid_pinpoints``: the anyres image-token count equals the features the model
    packs (LLaVA-OneVision scales a grid of more than ``anyres_max_9`` tiles' patches down: 4 x 4 tiles -> 3 x 3)."""
    model_type, overrides, *_ = VISION_LANGUAGE[case]
    require_family(model_type)
    cfg = config(model_type, dict(overrides, image_grid_pinpoints=pinpoints))
    batch = multimodal.with_images(torch.randint(8, 250, (1, 40), generator=torch.Generator().manual_seed(0)), cfg)
    torch.manual_seed(0)
    model = multimodal.auto_class(cfg).from_config(cfg)
    with torch.no_grad():  # (transformers raises "Image features and image tokens do not match" otherwise)
        assert torch.isfinite(model(**batch, use_cache=False).loss)


@pytest.mark.parametrize("case", list(VISION_LANGUAGE))
def test_image_layout_is_the_family_data(case):
    """Each vision-language family of the matrix declares its image layout on its spec, and image_layout reads it."""
    from tigon.integrations import FAMILIES

    model_type, overrides, _, family, *_ = VISION_LANGUAGE[case]
    require_family(model_type)
    assert FAMILIES[family].image_layout in multimodal.LAYOUTS
    assert multimodal.image_layout(config(model_type, overrides)) == FAMILIES[family].image_layout


def test_image_tokens_are_family_data():
    """Each image-token rule is one of IMAGE_TOKEN_RULES, of a config attribute, on a square / anyres family;
    images_axis only on a square one; multimodal.py names no registered family (the family facts are the specs')."""
    import inspect

    from tigon.integrations import FAMILIES
    from tigon.integrations.family_spec import IMAGE_TOKEN_RULES

    for spec in FAMILIES.values():
        if spec.image_tokens is not None:
            rule, attr = spec.image_tokens
            assert rule in IMAGE_TOKEN_RULES and isinstance(attr, str), spec.name
            assert spec.image_layout in ("square", "anyres"), spec.name
        assert not spec.images_axis or spec.image_layout == "square", spec.name
    source = inspect.getsource(multimodal)
    assert not [n for s in FAMILIES.values() for n in (s.name, *s.aliases) if f'"{n}"' in source]


def test_errors_name_the_problem():
    from tigon.workflows.errors import ConfigError

    with pytest.raises(ConfigError, match="not a vision-language model"):
        multimodal.image_layout(presets.build_config("tiny"))
    with pytest.raises(ConfigError, match=r"model_type 'blip-2' yet \(supported: aya_vision, .*llama4, .*qwen2_vl"):
        multimodal.image_layout(transformers.Blip2Config())  # a vision-language model of no family's image layout
    with pytest.raises(ValueError, match="input_ids must be a"):
        multimodal.with_images(torch.zeros(4), presets.build_config("qwen2-vl-tiny"))
    with pytest.raises(ValueError, match="image_tokens must be"):
        multimodal.with_images(torch.zeros(1, 8, dtype=torch.long), presets.build_config("qwen2-vl-tiny"),
                               image_tokens=0)
    with pytest.raises(ConfigError, match="--seq-len 3 is too short"):
        multimodal.with_images(torch.zeros(1, 3, dtype=torch.long), presets.build_config("qwen2-vl-tiny"))


def test_verify_model_with_a_per_layer_head_dim(tmp_path):
    """Gemma 4's head_dim varies per layer (its config raises on the global read): ``tigon verify --model`` takes
    the shapes from the config's global value, as ``bench`` and ``profile`` do."""
    from tigon.workflows.verify import VerifyConfig, run_verify

    model_type, overrides = VISION_LANGUAGE["gemma4"][:2]
    require_family(model_type)
    config(model_type, overrides).save_pretrained(tmp_path)
    r = run_verify(VerifyConfig(model=str(tmp_path), ops=["rms_norm"], dtypes=["float32"], tokens=8, device=DEVICE))
    assert r.passed and r.config["ops"] == ["rms_norm"] and r.shapes["model"]["head_dim"] == 16


def test_op_bench_default_ops_are_every_towers(tmp_path):
    """``tigon bench --model`` (op benchmark) of a vision-language config: the default ops are those of every tower's
    family (Llava's CLIP LayerNorms and MLPs too), not those of the text config's model type alone (Qwen2-VL's
    ``qwen2_vl_text``, of no family, gave every op of the registry); the shapes and sizes are the text decoder's,
    also where the outer config has a ``hidden_size`` of its own (PaliGemma's: "the model config has no
    intermediate_size" in ``bench`` and ``profile``)."""
    from tigon.workflows.bench import BenchConfig, resolve_bench

    for case, want, hidden in (("llava", {"layer_norm", "act_linear"}, 64), ("qwen2_vl", {"layer_norm"}, 64),
                               ("paligemma", {"layer_norm", "act_linear"}, 64)):
        model_type, overrides = VISION_LANGUAGE[case][:2]
        require_family(model_type)
        config(model_type, overrides).save_pretrained(tmp_path / case)
        resolved, _, desc, _ = resolve_bench(BenchConfig(model=str(tmp_path / case), device="cpu"))
        assert want <= set(resolved.ops) and "fused_linear_dpo_loss" not in resolved.ops, resolved.ops
        assert desc["model_type"] == model_type and desc["hidden_size"] == hidden
    resolved, _, desc, _ = resolve_bench(BenchConfig(model="qwen2-vl-tiny", device="cpu"))
    assert "layer_norm" in resolved.ops and desc["model_type"] == "qwen2_vl" and desc["hidden_size"] == 128


def test_image_tokens_refused_where_the_model_would_not_use_them(tmp_path, capsys):
    """``tigon bench --e2e --image-tokens N`` sets the image's size of the grid / patches layouts only; a model whose
    count its config fixes (Llama 4's one pixel-shuffled tile) or a text-only model ran with N silently ignored. Now a
    one-line error naming --image-tokens (and the fixed count), exit status 2, before any model is built."""
    from tigon.cli import main
    from tigon.workflows.e2e_models import step_batches
    from tigon.workflows.errors import ConfigError

    model_type, overrides = VISION_LANGUAGE["llama4-vlm"][:2]
    llama4 = config(model_type, overrides)
    with pytest.raises(ConfigError, match=r"--image-tokens 4: model_type 'llama4' \('square' image layout\) takes 1 "):
        step_batches(llama4, 1, 1, 12, 0, image_tokens=4)
    assert step_batches(llama4, 1, 1, 12, 0)[0]["input_ids"].shape == (1, 12)  # (without it: its one token)
    qwen = presets.build_config("qwen2-vl-tiny")
    assert int((step_batches(qwen, 1, 1, 16, 0, image_tokens=2)[0]["labels"] == -100).sum()) == 2
    path = tmp_path / "config.json"
    llama4.to_json_file(path)
    for model, message in ((str(path), "takes 1 image token(s) per image, fixed by its config"),
                           ("tiny", "--image-tokens applies to vision-language models; model_type 'llama' is not one")):
        assert main(["bench", "--e2e", "--model", model, "--image-tokens", "4", "--providers", "original"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err
