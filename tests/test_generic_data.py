"""The families the generic matcher had, now data (tigon.integrations.families_generic_data;
``model_matrix.GENERIC_DATA``: ERNIE 4.5, ERNIE-4.5-MoE, GLM, GLM-4-MoE, GLM-4-MoE-Lite, Qwen2-MoE, Cohere, Cohere2,
Cohere2-MoE, EXAONE-MoE, dots1, Helium, Youtu).

tests/test_families.py checks each case's report, ``tigon inspect``'s dry run and one training step (loss, router
loss and every gradient in fp32, 1e-5); tests/test_moe_experts.py the MoE forms' experts. Here: what the generic
matcher does on the same model (the parts the data adds: the interleaved / partial rotary, Cohere's LayerNorms and
scaled head, the fused residual adds), the reasons of what stays skipped, and the class-level patch. Skipped where
this transformers lacks the family (the GPU image's 5.17 may lack the newest).
"""

from __future__ import annotations

import pytest
import torch

import model_matrix as mm
import tigon
from tigon.integrations import FAMILIES

pytest.importorskip("transformers")

WITH_GENERIC = {case: e for case, e in mm.GENERIC_DATA.items() if e[5] is not None}


@pytest.mark.parametrize("case", list(WITH_GENERIC))
def test_the_data_replaces_what_the_generic_matcher_skipped(case):
    """The same model through ``family="generic"`` replaces and skips what the matrix records, and the family's data
    replaces a superset of it (each kind at least as many modules, nothing skipped that the data replaces)."""
    model_type, overrides, family, counts, skipped, (generic_counts, generic_skipped) = WITH_GENERIC[case]
    mm.require_family(model_type)
    model = mm.build(model_type, overrides)
    generic = tigon.patch(model, family="generic")
    assert (generic.family, generic.counts, generic.skipped_counts) == ("generic", generic_counts,
                                                                        generic_skipped), str(generic)
    tigon.unpatch(model)
    report = tigon.patch(model)
    assert (report.family, report.counts, report.skipped_counts) == (family, counts, skipped), str(report)
    assert all(report.counts.get(k, 0) >= n for k, n in generic.counts.items() if k != "rms_norm")
    assert sum(report.counts.values()) > sum(generic.counts.values())
    tigon.unpatch(model)


def test_cohere_per_head_qk_norms_are_left_with_the_reason():
    """Cohere's q / k norms (``use_qk_norm``) weigh each head: a (heads, head_dim) weight, not layer_norm's 1-D one."""
    model_type, overrides, *_ = mm.GENERIC_DATA["cohere-qk_norm"]
    mm.require_family(model_type)
    model = mm.build(model_type, overrides)
    report = tigon.patch(model)
    skipped = {e.target: e.detail for e in report.skipped}
    want = [f"model.layers.{i}.self_attn.{n}" for i in range(mm.L) for n in ("q_norm", "k_norm")]
    assert sorted(skipped) == sorted(want), str(report)
    heads, head_dim = mm.TINY["num_attention_heads"], mm.TINY["head_dim"]
    assert skipped[want[0]] == f"weight has shape {(heads, head_dim)}, expected 1-D", skipped[want[0]]
    tigon.unpatch(model)


@pytest.mark.parametrize("case", ["ernie4_5", "glm", "cohere", "cohere2_moe", "helium"])
def test_rotary_and_head_ops(case):
    """The rotary entries run the interleaved op (ERNIE and GLM: pairs with the tables halved and repeat-interleaved
    in the function; Cohere: the tables already repeat-interleaved), and Cohere's head scales its logits."""
    model_type, overrides, *_ = mm.GENERIC_DATA[case]
    mm.require_family(model_type)
    model = mm.build(model_type, overrides)
    report = tigon.patch(model)
    rope = [e for e in report.replaced if e.kind == "rope"]
    assert rope and all(e.ops == ("rope_interleaved",) for e in rope), str(report)
    if case.startswith("cohere"):  # the fused loss takes logit_scale (0.5 here): the original's loss, not the
        ids = torch.randint(3, mm.V, (1, 8), generator=torch.Generator().manual_seed(0))  # unscaled logits' one
        original = mm.build(model_type, overrides)
        torch.manual_seed(0)
        want = original(input_ids=ids, labels=ids).loss.item()
        original.logit_scale = 1.0
        torch.manual_seed(0)
        unscaled = original(input_ids=ids, labels=ids).loss.item()
        torch.manual_seed(0)
        got = model(input_ids=ids, labels=ids).loss.item()
        assert abs(got - want) <= 1e-5 * abs(want) and abs(unscaled - want) > 1e-3 * abs(want), (got, want, unscaled)
    tigon.unpatch(model)


@pytest.mark.parametrize("name", ["cohere", "ernie4_5_moe", "glm"])
def test_class_level_patch_and_unpatch(name):
    """``tigon.patch("<family>")`` replaces the family's classes (Cohere's LayerNorm class, not torch's) and the
    rotary function; a model built afterwards trains like the original; unpatch restores every class and global."""
    spec = FAMILIES[name]
    mod = pytest.importorskip(spec.module)
    model_type, overrides = mm.GENERIC_DATA[name][:2]
    rope = getattr(mod, spec.rope.function)
    original = mm.build(model_type, overrides)
    # (after the first build: transformers sets some class attributes when a class is first instantiated)
    before = {n: dict(vars(c)) for n, c in vars(mod).items() if isinstance(c, type) and c.__module__ == mod.__name__}
    try:
        report = tigon.patch(name)
        assert report.skipped_counts == {}, str(report)
        assert {"mlp", "rope", "lm_head_loss"} <= set(report.counts), str(report)
        assert getattr(mod, spec.rope.function) is not rope
        patched = mm.build(model_type, overrides)
        ids = torch.randint(3, mm.V, (1, 8), generator=torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        want = original(input_ids=ids, labels=ids).loss
        torch.manual_seed(0)
        got = patched(input_ids=ids, labels=ids).loss
        assert abs(got.item() - want.item()) <= 1e-5 * abs(want.item())
    finally:
        tigon.unpatch(name)
    assert getattr(mod, spec.rope.function) is rope
    after = {n: dict(vars(c)) for n, c in vars(mod).items() if isinstance(c, type) and c.__module__ == mod.__name__}
    assert after == before
