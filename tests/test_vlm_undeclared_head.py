"""A vision-language model whose own class is of no declared family (LLaVA-NeXT-Video, ...),
with towers of declared ones: ``tigon.patch`` applies the towers' families and reports the conditional-generation
head as skipped, with its class and the reason, where it used to say "lm_head_loss: no matching module in this
model" of a model that has an LM head (which runs as before)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import IMAGE_TOKEN, TINY, _VIT, require_family  # noqa: E402

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
    finally:
        tigon.unpatch(model)
