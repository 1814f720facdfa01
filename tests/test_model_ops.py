"""One source of "the ops a model runs" (issue 20): ``tigon bench --model``'s default ops are ``tigon verify
--model``'s, both the ops :func:`tigon.patch` runs in the model (:func:`tigon.workflows.dry_run.model_ops`, the dry run
on the weightless model), for every preset and every vision-language and MoE config of the test matrix. Before,
bench read family data (``family_ops``) that differed from what the patch runs (Gemma's ``geglu`` for the
``glu_linear`` its MLP runs, no ``rms_norm_gated`` in Qwen3.5-MoE, ``mrope`` in Qwen-VL, every op for a model of
no family, ...)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import model_matrix as mm  # noqa: E402

from tigon import ops, presets  # noqa: E402
from tigon.workflows import bench, verify  # noqa: E402

EXPERTS = ("num_experts", "num_local_experts", "n_routed_experts")


def _moe(overrides: dict) -> bool:
    text = overrides.get("text_config") or {}
    return any(k in overrides or k in text for k in EXPERTS)


CONFIGS = {  # case -> (model_type, overrides): the matrix's vision-language and MoE models (the same case name can be
    # in both: Llama 4, Gemma 4, Qwen3.5-MoE as text and vision-language models)
    **{f"vl-{case}": e[:2] for table in (mm.VISION_LANGUAGE, mm.HELD_HEADS) for case, e in table.items()},
    **{f"moe-{case}": e[:2] for table in (mm.CASES, mm.MORE_FAMILIES, mm.GENERIC_MOE, mm.TABLE_ONLY)
       for case, e in table.items() if _moe(e[1])},
}


@pytest.mark.parametrize("name", presets.preset_names())
def test_bench_default_ops_are_verify_ops_on_presets(name):
    resolved, *_ = bench.resolve_bench(bench.BenchConfig(model=name, device="cpu"))
    checked = verify.resolve_config(verify.VerifyConfig(model=name, device="cpu"))
    assert resolved.ops == checked.ops and resolved.ops, (resolved.ops, checked.ops)


def test_bench_default_ops_are_verify_ops_on_the_matrix(tmp_path):
    """Each config read from a config.json by both tools (the matrix's ``experts_implementation`` is not saved:
    both see the default, the MoE glue ops)."""
    got, ran = {}, 0
    for case, (model_type, overrides) in CONFIGS.items():
        if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
            continue  # (a family the installed transformers lacks)
        path = str(tmp_path / case)
        mm.config(model_type, overrides).save_pretrained(path)
        got[case] = bench.model_ops(path)
        assert got[case] == verify.model_ops(path), case
        ran += 1
    assert ran >= len(CONFIGS) // 2, f"only {ran} of {len(CONFIGS)} configs could be built"
    # what family data used to get wrong
    expect = {"vl-gemma3": ({"glu_linear"}, {"geglu"}), "vl-paligemma": ({"glu_linear"}, {"geglu"}),
              "vl-qwen3_5_moe": ({"rms_norm_gated", "moe_expert_gate"}, set()), "vl-qwen2_vl": ({"rope"}, {"mrope"}),
              "moe-gpt_oss": ({"moe_expert_gate"}, {"clamped_swiglu"}),
              "vl-llava": ({"act_linear", "layer_norm"}, set())}
    for case, (present, absent) in expect.items():
        if case in got:
            assert present <= set(got[case]) and not absent & set(got[case]), (case, got[case])


def test_bench_default_ops_without_a_dry_run(tmp_path):
    """Where no dry run can be done (a ``model_type`` the installed transformers lacks) bench falls back to every op,
    with a note; a model tigon.patch refuses (GPT-2) is an error that says to name the ops, as verify's."""
    import json

    from tigon.workflows.errors import ConfigError

    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "config.json").write_text(json.dumps(dict(
        model_type="no_such_architecture", vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4)))
    resolved, _, _, notes = bench.resolve_bench(bench.BenchConfig(model=str(tmp_path / "new"), device="cpu"))
    assert resolved.ops == list(ops.registry())
    assert any(n.startswith("ops: every op of the registry (tigon.patch's dry run is not possible") for n in notes)
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, bos_token_id=0,
                            eos_token_id=0).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match="contains no module of a supported model family.*--op"):
        bench.model_ops(str(tmp_path / "gpt2"))
    with pytest.raises(ConfigError, match="nothing to verify"):
        verify.model_ops(str(tmp_path / "gpt2"))


@pytest.mark.parametrize("case, op", [("gemma3", "geglu"), ("llava", "swiglu"), ("llava_next", "swiglu"),
                                      ("pixtral", "swiglu"), ("internvl", "swiglu"), ("smolvlm", "swiglu")])
def test_kind_op_of_a_vision_language_mlp_is_its_text_towers(case, op):
    """``tigon profile``'s op for the ``mlp`` kind (where the replacements declare several: a vision tower's
    act_linear beside the text tower's glu_linear) is the text model's: the activation of the text config (Gemma 3's
    tanh GELU, not SwiGLU for a container config that names none), the gated op of its Llama / Qwen2 / Mistral text
    tower for a container family whose only MLP is the non-gated projector (LLaVA's: not act_linear)."""
    from tigon.integrations.families import kind_op

    cfg = mm.config(*mm.VISION_LANGUAGE[case][:2])
    assert kind_op("mlp", cfg) == kind_op("mlp", cfg.to_dict()) == op


def test_bench_reads_the_shapes_as_verify_does(tmp_path):
    """bench read a config.json as a plain dict, verify through transformers' config class, so the same file gave
    different shapes: a DeepSeek-V3 config.json as published (no ``head_dim``; its class sets it to
    ``qk_rope_head_dim``) had its rotary timed at hidden / heads (24) where verify checks 8, and GPT-2's ``n_embd`` /
    ``n_head`` were missing fields. Now bench reads the class's config too (the dict only where transformers cannot
    read it); the error for what still lacks a field names it without calling GPT-2 no decoder."""
    import json

    from tigon.workflows.errors import ConfigError

    cfg = transformers.DeepseekV3Config(hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, vocab_size=300,
                                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, kv_lora_rank=16,
                                        q_lora_rank=16, n_routed_experts=4, moe_intermediate_size=32)
    raw = {k: v for k, v in cfg.to_dict().items() if k not in ("head_dim", "qk_head_dim")}  # as published
    (tmp_path / "dsv3").mkdir()
    (tmp_path / "dsv3" / "config.json").write_text(json.dumps(raw))
    model = str(tmp_path / "dsv3")
    _, shapes, desc, _ = bench.resolve_bench(bench.BenchConfig(model=model, ops=["rope_interleaved"], device="cpu"))
    checked, _ = verify.shapes_from_config(transformers.AutoConfig.from_pretrained(model), 64)
    assert shapes["rope_interleaved"][0]["head_dim"] == checked.head_dim == 8, shapes
    assert desc["hidden_size"] == 96 and desc["vocab_size"] == 300
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300, bos_token_id=0,
                            eos_token_id=0).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(ConfigError, match=r"no intermediate_size \(model_type 'gpt2'\); the op shapes read"):
        bench.resolve_bench(bench.BenchConfig(model=str(tmp_path / "gpt2"), ops=["rms_norm"], device="cpu"))


def test_bench_notes_named_ops_the_model_does_not_run(tmp_path):
    """``--op`` names an op tigon.patch does not run in the model (Gemma 2's sandwich norms: no fused add + norm):
    bench times it at the model's shapes, as asked, and says so (it did silently); nothing is said for the ops it runs
    or for ``--op all``."""
    mm.config("gemma2", {}).save_pretrained(tmp_path / "gemma2")
    model = str(tmp_path / "gemma2")

    def notes(ops):
        return [n for n in bench.resolve_bench(bench.BenchConfig(model=model, ops=ops, device="cpu"))[3]
                if "not run by tigon.patch" in n]

    assert notes(["fused_add_rms_norm,rms_norm"]) == [
        f"fused_add_rms_norm: not run by tigon.patch in {model} (it runs rms_norm, rope, glu_linear, "
        "fused_linear_cross_entropy); timed at the model's shapes as asked"]
    assert notes(["rms_norm"]) == notes(["all"]) == []


def test_bench_times_glu_linear_with_the_models_activation(tmp_path):
    """Gemma's gated MLPs run glu_linear with the tanh GELU (``gelu_pytorch_tanh``): bench's shape carries the model's
    activation into the op's inputs (it timed SiLU, the record's first case, for every model); verify's cases keep
    their own activation (theirs replaces the shape's)."""
    from tigon.integrations.families import glu_activation

    assert glu_activation({"hidden_activation": "gelu_pytorch_tanh"}) == "gelu_tanh"
    assert glu_activation({"hidden_act": "gelu"}) == "gelu" and glu_activation({"hidden_act": "silu"}) == "silu"
    assert glu_activation({"text_config": {"hidden_act": "gelu_pytorch_tanh"}}) == "gelu_tanh"
    assert glu_activation({}) == glu_activation({"hidden_act": "relu"}) == "silu"  # none Tigon's gated ops have
    for name, want in (("gemma2", "gelu_tanh"), ("llama", "silu")):
        mm.config(name, {}).save_pretrained(tmp_path / name)
        shapes = bench.resolve_bench(bench.BenchConfig(model=str(tmp_path / name), ops=["glu_linear"],
                                                       device="cpu"))[1]
        shape = shapes["glu_linear"][0]
        assert shape["activation"] == want, shape
        inputs = ops.get("glu_linear").make_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(0))
        assert inputs["activation"] == want
    assert "activation" not in ops.get("act_linear").shape_of(ops.ModelShapes(8, 16, 32, 2, 2, 8, 100))


def test_bench_idle_providers_note_one_line_by_default():
    """The default provider list's variants that implement none of the ops make one note (they made one each: nine
    lines for ``--op dyt``); providers named with ``--providers`` keep a note each."""
    _, _, _, notes = bench.resolve_bench(bench.BenchConfig(model="tiny", ops=["dyt"], device="cpu"))
    idle = [n for n in notes if "none of the requested ops" in n]
    assert len(idle) == 1 and "tigon_lean" in idle[0] and "tigon_inplace" in idle[0], notes
    _, _, _, notes = bench.resolve_bench(bench.BenchConfig(model="tiny", ops=["dyt"], device="cpu",
                                                           providers=["eager,tigon_lean,tigon_inplace"]))
    assert sorted(n for n in notes if "none of the requested ops" in n) == [
        "tigon_inplace: implements none of the requested ops (dyt)",
        "tigon_lean: implements none of the requested ops (dyt)"], notes
