"""The model configs of the end-to-end speed rows (benchmarks/configs/*/config.json and the qwen2.5-vl-7b preset; issue
20 item 5): they load with the published shapes, their 1-layer model at full width is what ``tigon.patch`` patches
(the dry run on the meta device: experts, fused loss with the router loss, norms, rotary), and each MoE row runs end
to end through ``tigon bench --e2e`` at a test-local small width with the router loss in both providers' losses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from model_matrix import require_family  # noqa: E402
from tigon.workflows.e2e_models import hf_config, model_info  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"
MOE_ROWS = {
    # row: (model_type, total parameters, active parameters with the input embedding, published)
    "gpt-oss-20b": ("gpt_oss", 20.9e9, 4.2e9),  # openai/gpt-oss-20b: 21B total, 3.6B active without the embedding
    "olmoe-1b-7b": ("olmoe", 6.92e9, 1.28e9),  # allenai/OLMoE-1B-7B-0924: 6.9B total, 1.3B active
}


@pytest.mark.parametrize("row", list(MOE_ROWS))
def test_moe_configs_have_the_published_shapes(row):
    model_type, total, active = MOE_ROWS[row]
    require_family(model_type)
    cfg, source = hf_config(str(CONFIGS / row))
    assert cfg.model_type == model_type and source.endswith(row)
    assert cfg.output_router_logits  # the rows train with the load-balancing loss
    info = model_info(cfg, source)
    emb = cfg.vocab_size * cfg.hidden_size
    assert info["num_parameters"] == pytest.approx(total, rel=0.01)
    assert info["matmul_parameters"] + emb == pytest.approx(active, rel=0.02)  # experts count top_k / num_experts
    if row == "gpt-oss-20b":
        assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_local_experts, cfg.num_experts_per_tok) == \
            (2880, 24, 32, 4)
        assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (64, 8, 64, 201088)
        assert cfg.layer_types == ["sliding_attention", "full_attention"] * 12 and cfg.sliding_window == 128
        assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 32.0
    else:
        assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok,
                cfg.intermediate_size, cfg.vocab_size) == (2048, 16, 64, 8, 1024, 50304)


@pytest.mark.parametrize("row, counts", [
    ("gpt-oss-20b", {"rms_norm": 3, "mlp": 1, "rope": 1, "sinks": 1, "lm_head_loss": 1}),
    ("olmoe-1b-7b", {"rms_norm": 5, "mlp": 1, "rope": 1, "lm_head_loss": 1}),
    ("qwen2.5-vl-7b", None),
])
def test_one_layer_at_full_width_is_patched(row, counts):
    """tigon.patch's decisions on the row's 1-layer model at its real sizes (meta device: no memory)."""
    from tigon.workflows.inspect import inspect_config

    model = row if row == "qwen2.5-vl-7b" else str(CONFIGS / row)
    cfg, _ = hf_config(model, 1)
    require_family(cfg.model_type)
    got = inspect_config(cfg, model=model)
    assert got.family == cfg.model_type
    experts = [e for e in got.patch["replaced"] if e["kind"] == "mlp" and "experts" in e["target"]]
    if counts is not None:
        assert got.counts == counts and experts, got.patch  # the experts' hook: clamped SwiGLU / SwiGLU
        assert not got.patch["skipped_counts"]
    else:  # Qwen2.5-VL-7B: 1 text layer, the whole 32-block ViT (its RMSNorms and gated MLPs), the fused loss
        assert got.counts["rms_norm"] == 2 * 1 + 1 + 2 * 32 + 1 and got.counts["mlp"] == 1 + 32
        assert got.counts["lm_head_loss"] == 1 and got.counts["rope"] == 1


def _small(row: str, tmp_path: Path) -> str:
    """The row's config.json at a test-local small width (2 layers kept, every other value the row's)."""
    cfg = json.loads((CONFIGS / row / "config.json").read_text())
    cfg.update(hidden_size=64, num_attention_heads=4, head_dim=16, vocab_size=320, pad_token_id=0, eos_token_id=1,
               num_hidden_layers=2)
    if row == "gpt-oss-20b":
        cfg.update(intermediate_size=64, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                   experts_per_token=2, sliding_window=8, layer_types=cfg["layer_types"][:2])
    else:
        cfg.update(intermediate_size=32, num_key_value_heads=4, num_experts=8, num_experts_per_tok=2)
    path = tmp_path / row / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    return str(path.parent)


@pytest.mark.parametrize("row", list(MOE_ROWS))
def test_moe_row_runs_end_to_end(row, tmp_path):
    """``tigon bench --e2e`` on the row's config (small width): HF and Tigon both train, the loss holds the router
    loss in both (the same value), the experts ran Tigon's kernels."""
    from tigon.workflows.e2e import E2EConfig, run_e2e

    require_family(MOE_ROWS[row][0])
    model = _small(row, tmp_path)
    r = run_e2e(E2EConfig(model=model, layers=1, providers=["original", "tigon"], steps=1, warmup=0,
                          batch_size=1, seq_len=16, device="cpu", dtype="float32"))
    original, patched = r.rows
    assert (original.status, patched.status) == ("ok", "ok"), [original.note, patched.note]
    assert patched.losses[0] == pytest.approx(original.losses[0], rel=1e-5)
    assert patched.patch["mlp"] == 1 and patched.patch["lm_head_loss"] == 1
    # the grouped_mm experts (the default) run Tigon's glue around their grouped matmuls: the gate in moe_expert_gate
    assert {"moe_gather", "moe_expert_gate", "moe_combine"} <= set(patched.backends), patched.backends

    # the loss is cross-entropy plus router_aux_loss_coef x the load-balancing loss
    cfg, _ = hf_config(model, 1)
    from tigon.workflows.e2e_models import build_model, step_batches

    ids = step_batches(cfg, 1, 1, 16, 0)[0]
    out = build_model(cfg, torch.float32, torch.device("cpu"), 0)(input_ids=ids, labels=ids)
    assert out.aux_loss is not None and out.aux_loss > 0
    assert original.losses[0] == pytest.approx(out.loss.item(), rel=1e-6)


def test_liger_without_a_patch_for_the_family_is_a_skipped_row(tmp_path, monkeypatch):
    """Liger's instance function only logs for a model type missing from its table: the row says so instead of
    timing Hugging Face's code under Liger's name."""
    from test_bench import fake_liger  # noqa: E402  (a stand-in liger_kernel package)
    from tigon.workflows.e2e import E2EConfig, run_e2e

    files = {"__init__.py": "from .monkey_patch import _apply_liger_kernel_to_instance\n",
             "monkey_patch.py": ("MODEL_TYPE_TO_APPLY_LIGER_FN = {'llama': None}\n"
                                 "def _apply_liger_kernel_to_instance(model=None, **kw):\n"
                                 "    raise AssertionError('must not be called')\n")}
    with fake_liger(tmp_path, monkeypatch, files):
        r = run_e2e(E2EConfig(model=_small("olmoe-1b-7b", tmp_path), layers=1, providers=["liger"], steps=1,
                              warmup=0, batch_size=1, seq_len=8, device="cpu", dtype="float32"))
    (row,) = r.rows
    assert row.status == "skipped" and "Liger has no patch for 'olmoe'" in row.note, row.note


def test_e2e_table_names_config_rows_and_takes_per_provider_timeouts():
    import importlib.util

    spec = importlib.util.spec_from_file_location("e2e_table", CONFIGS.parent / "e2e_table.py")
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    assert e2e.model_name(str(CONFIGS / "gpt-oss-20b")) == "gpt-oss-20b"
    assert e2e.model_name(str(CONFIGS / "olmoe-1b-7b" / "config.json")) == "olmoe-1b-7b"
    assert e2e.model_name("qwen2.5-vl-7b") == "qwen2.5-vl-7b" and e2e.model_name("org/name") == "org--name"
    spec_ = "60,original_compile=110,tigon_compile=120"
    assert [e2e.provider_timeout(spec_, p) for p in ("original", "tigon_compile", "original_compile")] == \
        [60.0, 120.0, 110.0]
    assert e2e.provider_timeout(5, "tigon") == 5.0
    with pytest.raises(ValueError, match="no default"):
        e2e.provider_timeout("tigon=3", "original")
