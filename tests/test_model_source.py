"""Where MODEL comes from (tigon.workflows.model_source): a preset, a config.json, a checkpoint directory, or a Hub id
already in the local Hugging Face cache; never the network. Also ``tigon compare`` on a cached Hub id in float16."""

import json
import os
import socket

import pytest

transformers = pytest.importorskip("transformers")

from tigon.cli import main  # noqa: E402
from tigon.presets import build_config  # noqa: E402
from tigon.workflows.errors import ConfigError  # noqa: E402
from tigon.workflows.model_source import load_model_config, model_config, resolve_source  # noqa: E402

HUB_ID = "tigon-test/tiny-llama"


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("tried to use the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding one snapshot of HUB_ID with its config.json only (as after a config download)."""
    import huggingface_hub.constants

    cache, commit = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    repo = cache / f"models--{HUB_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    build_config("tiny", num_hidden_layers=1).save_pretrained(repo / "snapshots" / commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return repo / "snapshots" / commit


def test_preset_config_file_and_directories(tmp_path):
    assert str(resolve_source("tiny")) == "preset:tiny"
    build_config("tiny", num_hidden_layers=1).save_pretrained(tmp_path)
    src = resolve_source(str(tmp_path / "config.json"), "--model")
    assert src.kind == "config" and src.directory == str(tmp_path) and not src.has_weights
    src = resolve_source(str(tmp_path))
    assert src.kind == "checkpoint" and src.config_file == str(tmp_path / "config.json") and not src.has_weights
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert resolve_source(str(tmp_path)).has_weights
    config, src = model_config(str(tmp_path), layers=1)
    assert config.num_hidden_layers == 1 and src.kind == "checkpoint"
    with pytest.raises(ConfigError, match="between 1 and the model's 1 layers"):
        model_config(str(tmp_path), layers=2)


def test_hub_id_in_the_local_cache(hub_cache):
    src = resolve_source(HUB_ID, "--model")
    assert (src.kind, src.hub_id, src.path, str(src)) == ("hub", HUB_ID, str(hub_cache), f"hub:{HUB_ID}")
    assert not src.has_weights and not src.has_tokenizer
    config, _ = load_model_config(HUB_ID)
    assert config.model_type == "llama" and config.num_hidden_layers == 1


@pytest.mark.parametrize("model, match", [
    ("tigon-test/not-cached", "nor a Hub id in the local Hugging Face cache"),
    ("/no/such/path", "neither a preset"),
    ("", "expected a preset name, a config.json"),
])
def test_unknown_model_names_the_argument_and_the_cache(hub_cache, model, match):
    with pytest.raises(ConfigError, match=match) as e:
        resolve_source(model, "--model")
    assert str(e.value).startswith(f"--model {model}")
    if model:
        assert str(hub_cache.parents[2]) in str(e.value) and "nothing is downloaded" in str(e.value)


def test_directory_without_config_json(tmp_path):
    with pytest.raises(ConfigError, match="directory has no config.json"):
        resolve_source(str(tmp_path), "--model")


def test_compare_a_cached_hub_id_in_float16(hub_cache, tmp_path, capsys):
    js = tmp_path / "r.json"
    rc = main(["compare", "--model", HUB_ID, "--dtype", "float16", "--steps", "1", "--batch-size", "1",
               "--seq-len", "4", "--json", str(js), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    r = json.loads(js.read_text())
    assert r["model"]["source"] == f"hub:{HUB_ID}" and r["model"]["weights"] == "random (seed 0)"
    assert r["config"]["dtype"] == "float16" and r["config"]["lr"] == 3e-4 and r["ok"]
    assert "GradScaler" in r["model"]["precision"]
    assert set(r["grad_scaler"]) == {"original", "patched"}
    assert all(v["final_scale"] > 0 and isinstance(v["skipped_steps"], list) for v in r["grad_scaler"].values())
    assert r["max_rel_loss_diff"] < 1e-2
    assert os.path.isdir(hub_cache)  # read in place, nothing written next to it
