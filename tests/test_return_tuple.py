"""``return_dict=False`` on a patched model in training with labels: the fused LM-head loss forms no logits, and the
tuple keeps their slot (None), so that every later entry sits where the original puts it (``outputs[1]`` is the
logits, not the KV cache; an MoE's ``aux_loss`` and ``router_logits``, a vision-language model's ``rope_deltas``
stay at their indices), as Liger-Kernel's forwards keep it."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import DEVICE, VISION_LANGUAGE, build, image_inputs, require_family  # noqa: E402

CASES = {  # name: (model_type, config overrides, the class to build or None: AutoModelForCausalLM)
    "llama": ("llama", {}, None),
    "olmoe": ("olmoe", dict(num_experts=4, num_experts_per_tok=2, output_router_logits=True), None),
    "qwen2_vl": VISION_LANGUAGE["qwen2_vl"][:3],
}


def _inputs(case: str) -> dict:
    if case in VISION_LANGUAGE:
        return image_inputs(case)
    ids = torch.randint(8, 250, (1, 8), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    return dict(input_ids=ids, labels=ids)


def _layout(value):
    """The nesting of tuples and the types in ``value`` (a vision-language model's ``image_outputs`` is a tuple in the
    original's tuple)."""
    if isinstance(value, tuple):
        return tuple(_layout(v) for v in value)
    return type(value).__name__


@pytest.mark.parametrize("case", list(CASES))
def test_tuple_keeps_the_logits_slot(case):
    model_type, overrides, cls = CASES[case]
    require_family(model_type)
    original = build(model_type, overrides, cls=cls)
    patched = copy.deepcopy(original)
    tigon.patch(patched)
    inputs = _inputs(case)
    try:
        ref = original(**inputs, return_dict=False)
        out = patched(**inputs, return_dict=False)
        by_name = patched(**inputs, return_dict=True)
    finally:
        tigon.unpatch(patched)
    logits = 2 if case == "olmoe" else 1  # MoeCausalLMOutputWithPast: loss, aux_loss, logits, ...
    assert isinstance(out, tuple) and len(out) == len(ref), ([type(v).__name__ for v in out],
                                                             [type(v).__name__ for v in ref])
    assert out[logits] is None and by_name.logits is None and torch.is_tensor(ref[logits])
    for i, (a, b) in enumerate(zip(out, ref)):
        if i != logits:
            assert _layout(a) == _layout(b), (i, _layout(a), _layout(b))
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=0)
    if case == "olmoe":  # the router loss at its index, as the original's
        torch.testing.assert_close(out[1], ref[1], rtol=1e-5, atol=0)


def test_cross_entropy_path_keeps_the_nesting():
    """``tigon.patch(model, cross_entropy=True)`` in eval (the original forward, then Tigon's cross-entropy on its
    logits): the tuple is the original's, a vision-language model's ``image_outputs`` a tuple too."""
    model_type, overrides, cls = CASES["qwen2_vl"]
    require_family(model_type)
    original = build(model_type, overrides, cls=cls).eval()
    patched = copy.deepcopy(original)
    tigon.patch(patched, cross_entropy=True)
    inputs = _inputs("qwen2_vl")
    try:
        with torch.no_grad():
            ref, out = original(**inputs, return_dict=False), patched(**inputs, return_dict=False)
    finally:
        tigon.unpatch(patched)
    assert _layout(out) == _layout(ref)
    torch.testing.assert_close(out[0], ref[0], rtol=1e-5, atol=0)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-5, atol=1e-5)
