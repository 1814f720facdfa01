"""A vision-language model whose own class is of no declared family (LLaVA-NeXT-Video, ...),
with towers of declared ones: ``tigon.patch`` applies the towers' families and reports the conditional-generation
head as skipped, with its class and the reason, where it used to say "lm_head_loss: no matching module in this
model" of a model that has an LM head (which runs as before); the report names the container's own model type
(``"llava_next_video (no family)"``), where it used to name its first tower's family (``clip``)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import HELD_HEADS, IMAGE_TOKEN, TINY, _VIT, require_family  # noqa: E402

CASES = {  # model_type: (config overrides, the head's class)
    "llava_next_video": (dict(text_config=dict(TINY, model_type="llama"), image_token_index=IMAGE_TOKEN,
                              image_grid_pinpoints=[[8, 8]], vision_config=dict(_VIT, model_type="clip_vision_model")),
                         "LlavaNextVideoForConditionalGeneration"),
}


@pytest.mark.parametrize("model_type", list(CASES))
def test_head_of_an_undeclared_container_is_reported_skipped(model_type):
    require_family(model_type)
    overrides, cls = CASES[model_type]
    cfg = transformers.AutoConfig.for_model(model_type, **overrides)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, cls)(cfg)
    report = tigon.patch(model)
    try:
        heads = [e for e in report.skipped if e.kind == "lm_head_loss"]
        assert [e.target for e in heads] == ["lm_head"], str(report)
        assert cls in heads[0].detail and "no family" in heads[0].detail and "as before" in heads[0].detail
        assert not any(n.startswith("lm_head_loss: no matching module") for n in report.notes), report.notes
        assert report.counts["rms_norm"] and report.counts["layer_norm"]  # the towers are patched by their families
        assert report.family == f"{model_type} (no family)"
    finally:
        tigon.unpatch(model)


LABELS = {  # model_type: config overrides of containers of no family (the dry run only)
    **{model_type: overrides for model_type, (overrides, _) in CASES.items()},
    "idefics2": dict(text_config=dict(TINY, model_type="mistral"), image_token_id=IMAGE_TOKEN,
                     perceiver_config=dict(hidden_size=64, rms_norm_eps=1e-6), vision_config=dict(_VIT, patch_size=2)),
    "blip-2": HELD_HEADS["blip-2"][1],
}


@pytest.mark.parametrize("model_type", list(LABELS))
def test_an_undeclared_container_is_labelled_by_its_own_model_type(model_type):
    """``tigon inspect`` (and every tool reading the dry run) names the container, not its first tower's family
    (Idefics2 said ``mistral``, BLIP-2 ``llama``); the families note names the towers'."""
    from tigon.workflows.inspect import inspect_config

    require_family(model_type)
    r = inspect_config(transformers.AutoConfig.for_model(model_type, **LABELS[model_type]))
    assert r.family == f"{model_type} (no family)", r.family
    assert any(n.startswith("families: ") for n in r.patch["notes"]), r.patch["notes"]
