"""`tigon inspect MODEL`: a dry run of tigon.patch on a weightless (meta-device) model built from its config."""

import json

import pytest

from tigon.cli import main
from tigon.integrations import patched_state
from tigon.presets import build_config
from tigon.workflows.compare import ConfigError
from tigon.workflows.inspect import run_inspect


def test_inspect_llama3_8b_counts(tmp_path, capsys):
    path = tmp_path / "inspect.json"
    assert main(["inspect", "llama3-8b", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert r["family"] == "llama" and r["architecture"] == "LlamaForCausalLM"
    assert r["source"] == "preset:llama3-8b"
    assert r["counts"] == {"rms_norm": 2 * 32 + 1, "fused_add_rms_norm": 32, "rope": 32, "mlp": 32, "lm_head_loss": 1}
    assert r["categories"] == {"norms": 65, "residual_add_norm": 32, "rotary": 32, "mlp_activation": 32,
                               "lm_head_loss": 1}
    assert 8.0e9 < r["num_parameters"] < 8.1e9  # counted on the meta device, nothing allocated
    assert r["skipped"] == []
    left = {g["module"]: g for g in r["left_alone"]}
    assert "Embedding" in left and "gather" in left["Embedding"]["reason"]
    linear = [g for g in r["left_alone"] if g["module"] == "Linear"]
    assert sum(g["count"] for g in linear) == 7 * 32 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    assert any("LM head" in g["reason"] for g in linear)
    assert r["config"]["vocab_size"] == 128256
    # the meta-device model reports the fold that a loaded one makes (not "called: parameters on meta")
    assert "is folded in once its weights are loaded" in json.dumps(r)
    out = capsys.readouterr().out
    assert "would replace" in out and "norms 65" in out
    # the dry run left nothing behind: no rotary dispatcher installed, no class patched
    assert patched_state() == {"class_level": {}, "rope_dispatchers": {}}


def test_inspect_config_json_and_checkpoint_dir(tmp_path):
    build_config("tiny").to_json_file(str(tmp_path / "config.json"))
    by_file = run_inspect(str(tmp_path / "config.json"))
    by_dir = run_inspect(str(tmp_path))
    assert by_file.source.startswith("config:") and by_dir.source.startswith("checkpoint:")
    for r in (by_file, by_dir):
        assert r.counts == {"rms_norm": 5, "fused_add_rms_norm": 2, "rope": 2, "mlp": 2, "lm_head_loss": 1}
        assert r.family == "llama"


def test_inspect_unsupported_family_is_one_line_exit_2(tmp_path, capsys):
    from transformers import GPT2Config

    cfg = tmp_path / "config.json"
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256).to_json_file(str(cfg))
    assert main(["inspect", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "supported" in lines[0] and "llama" in lines[0]


@pytest.mark.parametrize("arg, match", [("no-such-model", "neither a preset"), ("/", "no config.json")])
def test_inspect_bad_model_is_one_line_exit_2(arg, match, capsys):
    assert main(["inspect", arg]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and match in lines[0]


def test_run_inspect_raises_config_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read a model config"):
        run_inspect(str(tmp_path))


def test_inspect_generic_family_on_meta(tmp_path):
    # A family without a spec goes through the generic matcher, whose probes cannot run on the meta device: modules
    # are probed on CPU stand-ins, the LM head on a stand-in of the causal-LM module (random hidden states).
    cfg = {"architectures": ["SeedOssForCausalLM"], "model_type": "seed_oss", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "vocab_size": 300}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    r = run_inspect(str(tmp_path / "config.json"))
    assert r.family == "generic"
    assert r.counts == {"rms_norm": 5, "rope": 2, "mlp": 2, "lm_head_loss": 1}


def test_inspect_pythia_config_reports_layer_norm_family(tmp_path):
    # a Pythia-style config.json (rotary_pct, GPT-NeoX's own key): LayerNorms and partial rotary replaced, the
    # non-gated MLP as act_linear (its weights on the meta device: folded once loaded), the LM head fused; the same
    # decisions as tigon.patch
    cfg = {"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox", "hidden_size": 64,
           "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 300,
           "rotary_pct": 0.25, "use_parallel_residual": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / "inspect.json"
    assert main(["inspect", str(tmp_path / "config.json"), "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert r["family"] == "gpt_neox" and r["counts"] == {"layer_norm": 5, "mlp": 2, "rope": 2, "lm_head_loss": 1}
    assert r["skipped"] == []
    assert "tigon.functional.act_linear(dense_h_to_4h(x)" in json.dumps(r["replaced"])
    assert "partial_rotary_factor=0.25" in json.dumps(r["replaced"])
    assert patched_state() == {"class_level": {}, "rope_dispatchers": {}}
