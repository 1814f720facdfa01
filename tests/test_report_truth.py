"""The tools tell the truth about tigon.patch, over the test matrix (tests/model_matrix.py: every registered family and
the generic models).

* ``tigon inspect`` (and ``compare`` / ``verify`` / ``profile``, which read the same dry run) reports what tigon.patch
  does to the built model: the dry run on the weightless model is the engine's own decision, entry by entry.
* A report counts only replacements that run: after a forward and backward, the ops its entries declare are exactly
  the ops that ran (the families' training test checks this for ``CASES``; here the generic models).
* What the engine recognises and leaves alone is in ``skipped``, with the reason.
"""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from model_matrix import (CASES, GENERIC, HELD_HEADS, MORE_FAMILIES, VISION_LANGUAGE, assert_report_runs,  # noqa: E402
                          build, config, require_family)
from tigon import support  # noqa: E402
from tigon.integrations import patched_state  # noqa: E402
from tigon.integrations.engine import release_unused  # noqa: E402
from tigon.workflows.inspect import inspect_config  # noqa: E402

MATRIX = {**{k: (*v, None) for k, v in CASES.items()}, **GENERIC}


@pytest.fixture(autouse=True)
def _clean_state():
    yield
    if patched_state()["rope_dispatchers"]:  # a dropped patched model's; collecting costs up to ~1 s (CI time)
        gc.collect()
        release_unused()
    assert patched_state() == {"class_level": {}, "rope_dispatchers": {}}


def _entries(entries) -> list[tuple]:
    """(kind, target, ops) of report entries (PatchEntry or their as_dict() dicts); details differ between a meta
    and a loaded model only in wording (an MLP's down projection "is folded in once its weights are loaded") and in
    the probes' random error figures."""
    rows = [e if isinstance(e, dict) else dataclasses.asdict(e) for e in entries]
    return sorted((e["kind"], e["target"], tuple(e["ops"])) for e in rows)


@pytest.mark.parametrize("case", list(MATRIX))
def test_inspect_reports_what_patch_does(case):
    model_type, overrides, family, counts, skipped, cls = MATRIX[case]
    real = build(model_type, overrides, cls=cls)
    report = tigon.patch(real)
    tigon.unpatch(real)
    assert (report.family, report.counts, report.skipped_counts) == (family, counts, skipped), str(report)
    if cls is None:  # tigon inspect's own path: the config, built on the meta device by AutoModelForCausalLM
        dry = inspect_config(config(model_type, overrides)).patch
    else:  # no AutoModelForCausalLM for it (Qwen2-VL): the engine on the class built on the meta device
        with torch.device("meta"):
            meta = getattr(transformers, cls)(config(model_type, overrides))
        dry = tigon.patch(meta).as_dict()
        tigon.unpatch(meta)
    assert dry["family"] == report.family
    assert _entries(dry["replaced"]) == _entries(report.replaced)
    assert _entries(dry["skipped"]) == _entries(report.skipped)


@pytest.mark.parametrize("case", list(GENERIC))
def test_generic_report_counts_what_runs(case):
    model_type, overrides, family, counts, skipped, cls = GENERIC[case]
    model = build(model_type, overrides, cls=cls)
    report = tigon.patch(model)
    assert (report.family, report.counts, report.skipped_counts) == (family, counts, skipped), str(report)
    assert all(e.detail for e in report.skipped)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(0)).to(next(model.parameters()).device)
    support.backend_usage(reset=True)
    model(input_ids=ids, labels=ids).loss.backward()
    assert_report_runs(report, support.backend_usage())
    tigon.unpatch(model)


@pytest.mark.parametrize("case", [*VISION_LANGUAGE, *(f"held-{c}" for c in HELD_HEADS), "llama-as-generic"])
def test_unpatch_names_the_family_the_patch_named(case):
    """The unpatch report's family is the patch report's: the container's for a vision-language model (LLaVA, not the
    Llama of its text tower, which holds the last patched module; BLIP-2's "(no family)"), "generic" for a patch with
    family="generic" (on the weightless model: the decisions and marks are the loaded one's)."""
    if case == "llama-as-generic":
        model_type, overrides, cls, kwargs = *CASES["llama"][:2], "LlamaForCausalLM", {"family": "generic"}
    else:
        table, key = (HELD_HEADS, case[5:]) if case.startswith("held-") else (VISION_LANGUAGE, case)
        (model_type, overrides, cls), kwargs = table[key][:3], {}
    require_family(model_type)
    with torch.device("meta"):
        model = getattr(transformers, cls)(config(model_type, overrides))
    family = tigon.patch(model, **kwargs).family
    assert tigon.unpatch(model).family == family


def test_interleaved_rotary_is_routed_or_skipped_with_the_reason(monkeypatch):
    """DeepSeek-V3 with rope_interleave: the attention calls apply_rotary_pos_emb_interleave (read from its source),
    which runs rope_interleaved(deinterleave=True); a spec without that alternative skips it, with the reason (the
    attention never calls apply_rotary_pos_emb, so rope is not counted)."""
    from dataclasses import replace

    from tigon.integrations.families import FAMILIES

    model_type, overrides, *_ = MORE_FAMILIES["deepseek_v3-interleave"]
    report = tigon.patch(build(model_type, overrides))
    rope = [e for e in report.replaced if e.kind == "rope"]
    assert rope and all(e.ops == ("rope_interleaved",) and "apply_rotary_pos_emb_interleave" in e.detail
                        for e in rope), str(report)
    spec = FAMILIES["deepseek_v3"]
    monkeypatch.setitem(FAMILIES, "deepseek_v3", replace(spec, rope=replace(spec.rope, alternatives=())))
    report = tigon.patch(build(model_type, overrides))
    reasons = {e.detail for e in report.skipped if e.kind == "rope"}
    assert len(reasons) == 1
    reason = reasons.pop()
    assert "calls apply_rotary_pos_emb_interleave here" in reason and "self.config.rope_interleave is True" in reason


def test_llama4_rope_and_head_are_reported_skipped():
    """Llama-4 under the generic matcher (``family="generic"``; its family spec patches the head): its
    complex-valued rotary function and its LM head are recognised and left alone, with the reason."""
    model_type, overrides, *_ = MORE_FAMILIES["llama4"]
    report = tigon.patch(build(model_type, overrides), family="generic")
    assert (report.family, report.counts, report.skipped_counts) == (
        "generic", {"rms_norm": 5, "mlp": 2}, {"rope": 1, "mlp": 2, "lm_head_loss": 1}), str(report)
    skipped = {e.kind: e for e in report.skipped}
    # its bmm experts (3-D gate_up_proj, a forward of their own): recognised as experts, left alone with the reason
    assert "is not transformers' experts dispatcher" in skipped["mlp"].detail
    assert skipped["rope"].target.endswith("modeling_llama4.apply_rotary_emb")
    assert "Llama4TextAttention" in skipped["rope"].detail
    assert skipped["lm_head_loss"].target == "(Llama4ForCausalLM)"
    assert "base_model_prefix 'language_model'" in skipped["lm_head_loss"].detail
