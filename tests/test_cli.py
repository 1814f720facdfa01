"""The tigon CLI: `tigon compare` end to end, and one-line errors with exit status 2 on bad input."""

import json
import math
import os
import subprocess
import sys

import pytest

from tigon.cli import main


def _run(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "tigon.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_compare_writes_json_and_png(tmp_path, capsys):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["compare", "--preset", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
               "--json", str(js), "--plot", str(png), "--quiet"])
    assert rc == 0
    report = json.loads(js.read_text())
    assert len(report["loss_original"]) == len(report["loss_patched"]) == 2
    assert all(math.isfinite(x) for x in report["loss_original"] + report["loss_patched"])
    assert report["max_rel_loss_diff"] < 1e-3
    assert report["config"]["seq_len"] == 16
    assert report["config"]["nproc"] == 1 and report["distributed"] is None and report["ranks"] is None  # one process
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert f"backend={report['backend']}" in out
    assert report["losses_agree"] is True and report["agreement"]["verdict"] == "agree"
    assert "status=ok verdict=agree max_rel_loss_diff=" in out and "bound=1e-03 tokens_per_s" in out


def test_bad_preset_is_one_line_exit_2():
    proc = _run("compare", "--preset", "no-such-model")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "unknown preset" in lines[0] and "tiny" in lines[0]


@pytest.mark.parametrize(
    "args, match",
    [
        (["compare", "--layers", "0"], "--layers"),
        (["compare", "--model", "/no/such/checkpoint"], "neither a preset"),
        (["compare", "--steps", "many"], "invalid int"),
        (["compare", "--dtype", "float64"], "invalid choice"),
        (["compare", "--json", "/no/such/dir/r.json"], "does not exist"),
        (["compare", "--preset", "tiny", "--model", "/tmp"], "not allowed with"),
        (["compare", "--preset", "tiny", "--layers", "3"], "between 1 and the model's 2 layers"),
        (["compare", "--plot", "/tmp/curves.txt"], "unsupported image format 'txt'"),
        (["bench", "--e2e", "--model", "tiny", "--layers", "9"], "between 1 and the model's 2 layers"),
        (["compare", "--nproc", "0"], "--nproc must be an integer >= 1, got 0"),
        (["compare", "--nproc", "2", "--parallel", "zero3"], "argument --parallel: invalid choice: 'zero3'"),
        (["bench", "--e2e", "--nproc", "0"], "--nproc must be an integer >= 1, got 0"),
        (["bench", "--nproc", "2"], "--nproc needs --e2e"),
        (["compare", "--parallel", "fsdp2_tp"], "--parallel fsdp2_tp needs --nproc a multiple of 2 and at least 4"),
        (["compare", "--parallel", "fsdp2_tp", "--nproc", "1"], "needs --nproc a multiple of 2 and at least 4"),
        (["compare", "--parallel", "tp"], "--parallel tp needs --nproc N > 1"),
        (["compare", "--parallel", "ddp", "--nproc", "1"], "--parallel ddp needs --nproc N > 1"),
        (["bench", "--e2e", "--parallel", "fsdp2"], "--parallel fsdp2 needs --nproc N > 1"),
        (["compare", "--bogus"], "tigon compare: error: unrecognized arguments: --bogus (see 'tigon compare --help')"),
        (["--bogus"], "tigon: error: unrecognized arguments: --bogus"),
        (["profile", "nosuch"], "tigon profile: error: MODEL nosuch is neither a preset"),
    ],
)
def test_bad_input_is_one_line_exit_2_in_process(args, match, capsys):
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert match in err


def test_help_lists_compare():
    proc = _run("--help")
    assert proc.returncode == 0 and "compare" in proc.stdout


def test_unsupported_model_family_is_one_line_exit_2(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, GPT2Config

    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256, bos_token_id=None, eos_token_id=None)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path)
    capsys.readouterr()
    rc = main(["compare", "--model", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "GPT2LMHeadModel" in err and "supported" in err


def test_compare_non_finite_run_is_reported_and_exits_1(tmp_path, capsys):
    import tigon

    js = tmp_path / "r.json"
    with tigon.force_reference():  # what is tested is the report and the exit status, not the kernels: keep it fast
        rc = main(["compare", "--preset", "tiny", "--layers", "1", "--steps", "2", "--batch-size", "1", "--seq-len",
                   "8", "--lr", "1e9", "--json", str(js)])
    assert rc == 1
    report = json.loads(js.read_text())
    assert report["ok"] is False
    assert report["status"] == {"original": "non-finite", "patched": "non-finite"}
    assert report["losses_agree"] is None and report["agreement"]["verdict"] == "not judged"  # exit 1, not 3
    assert "at step 2" in report["status_detail"]["patched"]
    out, err = capsys.readouterr()
    assert "FAILED" in out and "NON-FINITE" in out
    assert len(err.strip().splitlines()) == 1 and "non-finite" in err and "--lr" in err, err


def test_compare_losses_beyond_the_bound_exit_3(tmp_path, capsys, monkeypatch):
    # a deliberately wrong op (swiglu's output x 1.01) on the CPU default: both runs ok, the losses 4.6e-3 apart
    import tigon
    from tigon import functional as TF

    right = TF.glu_linear
    monkeypatch.setattr(TF, "glu_linear", lambda *a, **k: right(*a, **k) * 1.01)
    js = tmp_path / "r.json"
    with tigon.force_reference():  # the verdict and the exit status are tested, not the kernels: keep it fast
        rc = main(["compare", "--preset", "tiny", "--json", str(js)])
    assert rc == 3
    report = json.loads(js.read_text())
    assert report["ok"] is True and report["losses_agree"] is False
    a = report["agreement"]
    assert a["verdict"] == "differ" and a["bound"] == 1e-3 and a["max_rel_loss_diff"] > 1e-3
    out, err = capsys.readouterr()
    assert "FAILED" in out and "losses differ beyond the expected bound" in out
    assert "last rel. loss diff" in out and "1e-03 for float32" in out
    assert len(err.strip().splitlines()) == 1, err
    assert err.strip().startswith("tigon compare: error: losses differ beyond the expected bound (max rel diff ")
    assert "tigon verify" in err


def test_compare_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for part in ("exit status: 0 both runs ok and their losses agree", "1 a run crashed", "2 bad input",
                 "3 both runs ok but the losses differ beyond the bound"):
        assert part in text, part


@pytest.mark.parametrize("case", ["qwen3_vl_moe", "glm4v_moe"])
def test_compare_crashed_run_is_a_status_not_a_traceback(case, tmp_path, capsys):
    """``--layers 1`` of an MoE vision-language config with the router loss on keeps only its dense layer 0:
    transformers' own router loss then raises IndexError in the original model's warm-up step (an upstream bug). The
    run's status is ``crashed`` with the exception's type and message, one line on stderr, exit status 1."""
    import tigon
    from model_matrix import VISION_LANGUAGE, config, require_family

    model_type, overrides = VISION_LANGUAGE[case][:2]
    require_family(model_type)
    cfg = config(model_type, overrides)
    cfg.text_config.output_router_logits = True
    cfg.save_pretrained(tmp_path / "model")
    js = tmp_path / "r.json"
    capsys.readouterr()
    with tigon.force_reference():
        rc = main(["compare", "--model", str(tmp_path / "model"), "--layers", "1", "--steps", "2", "--batch-size",
                   "1", "--seq-len", "16", "--json", str(js), "--quiet"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if rc == 0:  # a transformers whose router loss takes no router logits
        return
    assert rc == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("tigon compare: error: the original run crashed: IndexError: ") and "warm-up" in err
    assert out.strip() == "status=original:crashed"
    report = json.loads(js.read_text())
    assert report["ok"] is False and report["status"] == {"original": "crashed", "patched": "not run"}
    assert report["status_detail"]["original"].startswith("IndexError: ")


def test_compare_help_states_the_default_learning_rates(capsys, tmp_path):
    """--lr's help gives the defaults the code takes: a --model with weights fine-tunes at PRETRAINED_LR, a config
    without weights trains its random weights at RANDOM_INIT_LR (the help said 1e-5 for any --model)."""
    from transformers import LlamaConfig

    from tigon.workflows.compare import PRETRAINED_LR, RANDOM_INIT_LR, CompareConfig, resolve_config

    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "for --model 1e-5 with weights, 3e-4 for a config without" in text
    assert (PRETRAINED_LR, RANDOM_INIT_LR) == (1e-5, 3e-4)
    LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                vocab_size=256).save_pretrained(tmp_path)
    assert resolve_config(CompareConfig(model=str(tmp_path), device="cpu")).lr == RANDOM_INIT_LR == 3e-4
