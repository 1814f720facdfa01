"""A vision-language model whose forward calls a causal LM of its own and computes the loss on its logits
(tests/model_matrix.py ``HELD_HEADS``): that causal LM is never called with labels, so patching its forward alone
would fuse nothing while the report said ``lm_head_loss`` replaced.

* Llama 4 (``Llama4ForConditionalGeneration`` around the llama4 family's ``Llama4ForCausalLM``): the container is a
  declared head (``CausalLMSpec.inner``): its inner LM hands it the hidden states, the fused loss runs on the inner
  LM's head, and the loss and every gradient are the original's; one ``lm_head_loss`` entry, the container's.
* BLIP-2 / InstructBLIP around a Llama causal LM (of no family; they slice the logits before the loss): the head is
  reported skipped with the reason, its forward left alone, and ``tigon inspect`` says the same.
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import DEVICE, HELD_HEADS, IMAGE_TOKEN, assert_report_runs, build, config, require_family  # noqa
from tigon import support  # noqa: E402
from tigon.workflows.inspect import inspect_config  # noqa: E402


def _inputs(case: str) -> dict:
    """input_ids with the image's tokens first, labels (the image tokens ignored), one 8x8 image (and InstructBLIP's
    Q-Former text)."""
    model_type, _, _, image_tokens = HELD_HEADS[case]
    ids = torch.randint(8, 250, (1, 10), generator=torch.Generator().manual_seed(0))
    ids[0, 1:1 + image_tokens] = IMAGE_TOKEN
    labels = ids.masked_fill(ids == IMAGE_TOKEN, -100)
    out = dict(input_ids=ids, labels=labels,
               pixel_values=torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)))
    if model_type == "instructblip":
        out["qformer_input_ids"] = torch.randint(8, 250, (1, 4), generator=torch.Generator().manual_seed(2))
    return {k: v.to(DEVICE) for k, v in out.items()}


def _models(case: str):
    model_type, overrides, cls, _ = HELD_HEADS[case]
    require_family(model_type)
    return build(model_type, overrides, cls=cls), build(model_type, overrides, cls=cls)


def _step(model, inputs: dict):
    torch.manual_seed(0)  # the same dropout draws in both models (BLIP-2's Q-Former)
    out = model(**inputs)
    out.loss.backward()
    return out


def _same_step(original, patched, inputs: dict, **call) -> None:
    """The same loss and every parameter gradient within 1e-5 relative (fp32)."""
    _same_grads(original, patched, _step(original, {**inputs, **call}), _step(patched, {**inputs, **call}))


def _same_grads(original, patched, ref, out) -> None:
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
    grads = dict(patched.named_parameters())
    floor = 1e-3 * max(p.grad.norm().item() for p in original.parameters() if p.grad is not None)
    for n, p in original.named_parameters():
        if p.grad is None:
            assert grads[n].grad is None, n
            continue
        err = (grads[n].grad - p.grad).norm().item()
        assert err <= 1e-5 * max(p.grad.norm().item(), floor), f"{n}: |diff| {err:.2e}, |grad| {p.grad.norm():.2e}"
    original.zero_grad(set_to_none=True)
    patched.zero_grad(set_to_none=True)


def _dry_run_agrees(case: str, report) -> None:
    """``tigon inspect`` of the config decides the same entries as the patch of the built model."""
    model_type, overrides, cls, _ = HELD_HEADS[case]
    dry = inspect_config(config(model_type, overrides))
    assert dry.architecture == cls
    for kind in ("replaced", "skipped"):
        assert sorted((e["kind"], e["target"]) for e in dry.patch[kind]) == \
            sorted((e.kind, e.target) for e in getattr(report, kind))
    return dry


@pytest.mark.skipif(torch.get_default_dtype() != torch.float32, reason="exact-gradient check: fp32 only")
def test_llama4_container_runs_the_fused_loss():
    """Llama 4 as a vision-language model: one ``lm_head_loss`` entry (the container), and in a training step with
    labels the fused loss is what runs (logits None), with the original's loss and every gradient."""
    import tigon.functional as TF

    original, patched = _models("llama4")
    report = tigon.patch(patched)
    try:
        heads = [e for e in report.replaced if e.kind == "lm_head_loss"]
        assert [e.target for e in heads] == ["(Llama4ForConditionalGeneration)"], str(report)
        assert "language_model" in heads[0].detail and "hidden states" in heads[0].detail
        assert not [e for e in report.skipped if e.kind == "lm_head_loss"], str(report)
        dry = _dry_run_agrees("llama4", report)
        assert dry.categories["lm_head_loss"] == 1
        inputs = _inputs("llama4")
        support.backend_usage(reset=True)
        with mock.patch.object(TF, "fused_linear_cross_entropy", wraps=TF.fused_linear_cross_entropy) as flce:
            _same_step(original, patched, inputs)
        assert flce.call_count == 1
        assert_report_runs(report, support.backend_usage())
        with torch.no_grad():  # the output: logits None, everything else as the original's
            out, ref = patched(**inputs), original(**inputs)
        assert out.logits is None and ref.logits is not None
        assert set(out.keys()) == set(ref.keys()) - {"logits"}
        # return_dict=False: the original's tuple, the logits' slot kept as None
        with torch.no_grad():
            out, ref = patched(**inputs, return_dict=False), original(**inputs, return_dict=False)
        assert len(out) == len(ref) and out[1] is None and torch.allclose(out[0], ref[0], rtol=1e-5)
        # gradient accumulation's count and logits_to_keep (the last 6 positions, their labels) reach the loss
        kept = {**inputs, "labels": inputs["labels"][:, -6:]}
        _same_step(original, patched, kept, num_items_in_batch=torch.tensor(5), logits_to_keep=6)
        # eval, or no labels: the original forward (logits materialised)
        patched.eval(), original.eval()
        with torch.no_grad():
            out, ref = patched(**inputs), original(**inputs)
        assert out.logits is not None and torch.allclose(out.loss, ref.loss, rtol=1e-5)
    finally:
        tigon.unpatch(patched)
    assert "forward" not in vars(patched) and "forward" not in vars(patched.language_model)


def test_llama4_container_patched_twice_and_at_class_level():
    """A second ``tigon.patch`` finds the one head already patched; ``tigon.patch("llama4")`` patches both classes and
    the container's step runs the fused loss."""
    original, patched = _models("llama4")
    first = tigon.patch(patched)
    try:
        again = tigon.patch(patched)
        assert [(e.kind, e.target) for e in again.already_patched if e.kind == "lm_head_loss"] == \
            [(e.kind, e.target) for e in first.replaced if e.kind == "lm_head_loss"]
    finally:
        tigon.unpatch(patched)
    inputs = _inputs("llama4")
    ref = _step(original, inputs)  # before the class-level patch, which both models' classes take
    try:
        report = tigon.patch("llama4")
        heads = {e.target.rsplit(".", 2)[-2] for e in report.replaced if e.kind == "lm_head_loss"}
        assert heads == {"Llama4ForCausalLM", "Llama4ForConditionalGeneration"}, str(report)
        support.backend_usage(reset=True)
        out = _step(patched, inputs)
        assert out.logits is None and "fused_linear_cross_entropy" in support.backend_usage()
        _same_grads(original, patched, ref, out)
    finally:
        tigon.unpatch("llama4")


@pytest.mark.parametrize("case", ["blip-2", "instructblip"])
def test_head_held_by_a_model_of_no_family_is_reported_skipped(case):
    """BLIP-2 / InstructBLIP call their Llama causal LM without labels: its head is reported skipped (the Llama text
    tower is patched), its forward stays the class's, and the step is the original's (logits materialised)."""
    original, patched = _models(case)
    report = tigon.patch(patched)
    try:
        assert not [e for e in report.replaced if e.kind == "lm_head_loss"], str(report)
        heads = [e for e in report.skipped if e.kind == "lm_head_loss"]
        assert [e.target for e in heads] == ["language_model"], str(report)
        assert HELD_HEADS[case][2] in heads[0].detail and "as before" in heads[0].detail
        assert report.counts["rms_norm"] and report.counts["mlp"]
        assert "forward" not in vars(patched.language_model)
        _dry_run_agrees(case, report)
        inputs = _inputs(case)
        support.backend_usage(reset=True)
        _same_step(original, patched, inputs)
        assert_report_runs(report, support.backend_usage())
    finally:
        tigon.unpatch(patched)
