"""The tools on LoRA fine-tuning (``--lora R``: the model wrapped by PEFT as ``tigon bench --e2e --lora`` does):
``tigon inspect`` lists the LoRA layers and MLPs fused and why others are not, ``tigon verify --lora`` adds the LoRA
ops tigon.patch runs, ``tigon profile --lora`` gives the LoRA layers their own row and measures the MLP as its LoRA
node; ``--lora`` adapts Phi-3's fused projections too. Tiny configs on the meta device, no downloads."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import tigon  # noqa: E402
from tigon.cli import main  # noqa: E402
from tigon.workflows import profile as P  # noqa: E402
from tigon.workflows import profile_events as PE  # noqa: E402
from tigon.workflows import verify as V  # noqa: E402
from tigon.workflows.lora import with_lora  # noqa: E402
from tigon.workflows.e2e_models import hf_config  # noqa: E402
from tigon.workflows.inspect import inspect_config  # noqa: E402


def phi3_config():
    return transformers.Phi3Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=64, max_position_embeddings=32, pad_token_id=0,
                                   bos_token_id=1, eos_token_id=2)


def test_inspect_lora_lists_the_fused_layers_and_mlps(tmp_path, capsys):
    path = tmp_path / "inspect.json"
    assert main(["inspect", "tiny", "--lora", "4", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    layers = r["config"]["num_hidden_layers"]
    assert r["counts"]["lora"] == 7 * layers and r["categories"]["lora"] == 7 * layers
    groups = {g["kind"]: g for g in r["replaced"]}
    assert "lora_glu_mlp node" in groups["mlp"]["detail"] and "lora_linear" in groups["lora"]["detail"]
    adapters = [g for g in r["left_alone"] if g["module"] == "Linear" and "lora_A" in " ".join(g["examples"])]
    assert adapters and "part of a fused PEFT LoRA layer" in adapters[0]["reason"]
    assert any("LoRA r=4" in n for n in r["notes"]) and any(n.startswith("lora:") for n in r["notes"])
    capsys.readouterr()
    assert main(["inspect", "tiny", "--lora", "0"]) == 2
    assert "--lora must be an integer >= 1" in capsys.readouterr().err


def test_inspect_lora_on_phi3_fuses_gate_up_proj():
    r = inspect_config(phi3_config(), lora_rank=4)
    groups = {g["kind"]: g for g in r.replaced}
    assert r.counts["lora"] == 8  # qkv_proj, o_proj, gate_up_proj, down_proj per layer (bench's --lora targets)
    assert "lora_gate_up_mlp node" in groups["mlp"]["detail"]


def test_with_lora_adapts_phi3s_fused_projections():
    with torch.device("meta"):
        model = transformers.Phi3ForCausalLM(phi3_config())
    wrapped = with_lora(model, 2)
    adapted = {n.rsplit(".", 1)[-1] for n, m in wrapped.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}


def test_verify_lora_adds_the_lora_ops_the_model_runs():
    cfg = V.resolve_config(V.VerifyConfig(lora_rank=4, dtypes=["float32"], device="cpu"))
    assert cfg.model == "tiny" and cfg.model_ops
    assert {"lora_linear", "lora_glu_mlp", "lora_qkv_rope"} <= set(cfg.ops) and "swiglu" not in cfg.ops
    assert "rope" not in cfg.ops  # every attention runs its rotary inside lora_qkv_rope
    assert "lora_linear" not in V.resolve_config(V.VerifyConfig(model="tiny", device="cpu")).ops
    # an op the default model does not run: the error says that --lora (not a --model never given) picked the ops
    with pytest.raises(V.ConfigError, match=r"runs no lora_gate_up_mlp in tiny wrapped with PEFT LoRA r=2 .*--lora "
                       r"without --model checks the default model \(tiny\): verify it without --lora"):
        V.resolve_config(V.VerifyConfig(lora_rank=2, ops=["lora_gate_up_mlp"], device="cpu"))
    with pytest.raises(V.ConfigError, match="verify it without --model and --lora"):
        V.resolve_config(V.VerifyConfig(model="tiny", lora_rank=2, ops=["lora_gate_up_mlp"], device="cpu"))


def test_verify_cli_lora_rows(tmp_path):
    path = tmp_path / "verify.json"
    assert main(["verify", "--model", "tiny", "--lora", "4", "--op", "lora_glu_mlp", "--dtype", "float32",
                 "--json", str(path), "--quiet"]) == 0
    r = json.loads(path.read_text())
    assert r["passed"] and {row["op"] for row in r["results"]} == {"lora_glu_mlp"}
    assert any("wrapped with PEFT LoRA r=4" in n for n in r["notes"]) and any("rank 4," in n for n in r["notes"])
    assert all("gate_a 4x" in row["shape"] for row in r["results"])  # the model's rank, not the records' default 16


def _ev(name, parent=None, seq=-1, t=0, us=10.0):
    return SimpleNamespace(name=name, cpu_parent=parent, sequence_nr=seq, time_range=SimpleNamespace(start=t),
                           self_cpu_time_total=us, device_type="DeviceType.CPU")


def test_profile_attributes_peft_and_tigon_lora_layers_to_their_row():
    lora, att = _ev("tigon.cat/lora", t=0, us=0.0), _ev("tigon.cat/attention", t=10, us=0.0)
    fused = _ev("LoRALinearFunction", att, seq=2, t=11, us=1.0)
    fwd = [_ev("aten::mm", lora, seq=1, t=1), _ev("aten::mm", fused, t=12)]  # PEFT's layer; Tigon's node
    nodes = [_ev(f"autograd::engine::evaluate_function: {n}", None, seq=s, t=20 + s, us=1.0)
             for n, s in (("MmBackward0", 1), ("LoRALinearFunctionBackward", 2))]
    totals = PE.categorize([lora, att, fused, *fwd, *nodes], cuda=False)
    assert totals["lora"] == 10 + 1 + 10 + 1 + 1 and totals["matmul"] == 0


def test_profile_ranges_only_around_unfused_lora_layers():
    model = peft.get_peft_model(transformers.LlamaForCausalLM(hf_config("tiny", 1)[0]),
                                peft.LoraConfig(r=2, target_modules=["q_proj", "o_proj"]))
    layers = [m for m in model.modules() if hasattr(m, "lora_A")]
    assert [PE._module_category(m) for m in layers] == ["lora", "lora"]
    tigon.patch(model)
    assert [PE._module_category(m) for m in layers] == [None, None]  # fused: named by its node's ops instead


def test_profile_replacements_measure_the_lora_mlp_as_one_node():
    hfc, _ = hf_config("tiny", 1)
    kinds, cats, counts, _, paths = P._replacements(hfc, lora_rank=4)
    ops = {k["kind"]: k for k in kinds}
    assert ops["mlp"]["op"] == "lora_glu_mlp" and ops["mlp"]["bypasses"] == {"lora": 3}
    assert ops["rope"]["op"] == "lora_qkv_rope" and ops["rope"]["bypasses"] == {"lora": 3}  # q / k / v + rotary
    assert ops["lora"]["op"] == "lora_linear" and counts["lora"] == 7
    assert set(cats["lora"]) == {"lora_glu_mlp", "lora_qkv_rope", "lora_linear"}
    assert sum(k == "mlp" for k in paths["bypassed"].values()) == 3
    assert sum(k == "rope" for k in paths["bypassed"].values()) == 3
    assert P._replacements(hfc)[0][3]["op"] == "swiglu"  # without LoRA: the MLP's activation, as before
