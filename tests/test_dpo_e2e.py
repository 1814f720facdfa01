"""benchmarks/dpo_e2e.py on CPU: TRL's DPOTrainer, two steps on a one-layer tiny preset with the hf and tigon
providers (Tigon's kernels interpreted), the JSON record, the table, and the same losses from both (fp32: the switch
computes TRL's loss, ``tests/test_trl_switch.py``). Skipped without TRL (the GPU image: there the script itself runs).
The liger provider is not run here: Liger's kernels do not run under Triton's interpreter."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("trl")
pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "tiny", "--layers", "1", "--pairs", "1", "--prompt-len", "6", "--completion-len", "5",
         "--steps", "2", "--warmup", "1", "--device", "cpu"]


def _script():
    spec = importlib.util.spec_from_file_location("dpo_e2e", ROOT / "benchmarks" / "dpo_e2e.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_hf_and_tigon_providers_write_records_and_agree(tmp_path, capsys):
    dpo = _script()
    for provider in ("hf", "tigon"):
        assert dpo.main(["--provider", provider, *SMALL, "--out", str(tmp_path / f"dpo-e2e-{provider}.json")]) == 0
    hf, tg = (json.loads((tmp_path / f"dpo-e2e-{p}.json").read_text()) for p in ("hf", "tigon"))
    for rec in (hf, tg):
        assert rec["kind"] == "dpo_e2e" and rec["timed_steps"] == 1 and len(rec["step_ms_all"]) == 2
        assert rec["shape"]["tokens_per_step"] == 1 * (2 * 6 + 2 * (5 + 1))  # prompt twice, each completion + EOS
        assert rec["tokens_per_s"] > 0 and rec["peak_memory_bytes"] is None  # CPU: no CUDA peak
        assert rec["versions"]["trl"] and "dpo_e2e.py --provider" in rec["command"]
    assert any("2 switched, 0 on TRL's own path" in p for p in tg["patches"]), tg["patches"]
    assert any("backends used" in p and "interpreter" in p for p in tg["patches"]), tg["patches"]
    assert hf["losses"] == pytest.approx(tg["losses"], rel=1e-5) and len(hf["losses"]) == 2
    capsys.readouterr()
    assert dpo.main(["--table", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "hf " in out and "tigon " in out and "speed/hf" in out


def test_arguments_are_checked():
    dpo = _script()
    with pytest.raises(SystemExit):
        dpo.parse_args(["--model", "tiny"])  # neither --provider nor --table
    with pytest.raises(SystemExit):
        dpo.parse_args(["--provider", "hf", "--steps", "2", "--warmup", "2"])
    with pytest.raises(SystemExit):
        dpo.parse_args(["--provider", "hf", "--model", "no-such-preset"])  # a usage error, not a KeyError later
    with pytest.raises(SystemExit):
        dpo.parse_args(["--provider", "hf", "--model", "tiny", "--layers", "100"])
