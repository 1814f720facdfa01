"""tigon.workflows.compare: original vs Tigon-patched training on a tiny model (interpreted kernels on CPU)."""

import json
import math

import pytest
import torch

from tigon import data
from tigon.workflows.compare import CompareConfig, ConfigError, run_compare

TINY = dict(preset="tiny", steps=3, batch_size=2, seq_len=16, seed=0)


@pytest.fixture(scope="module")
def result():
    return run_compare(CompareConfig(**TINY)).as_dict()


def test_result_has_the_documented_keys(result):
    for key in ("loss_original", "loss_patched", "rel_loss_diff", "max_rel_loss_diff", "agreement", "losses_agree",
                "tokens_per_s",
                "peak_memory_bytes", "device", "backend", "config", "patch", "versions", "model", "data", "notes"):
        assert key in result, key
    assert set(result["tokens_per_s"]) == set(result["peak_memory_bytes"]) == {"original", "patched"}
    assert set(result["versions"]) >= {"torch", "triton", "transformers"}
    json.dumps(result)  # serialisable as is


def test_losses_finite_same_length_and_close(result):
    orig, pat = result["loss_original"], result["loss_patched"]
    assert len(orig) == len(pat) == TINY["steps"]
    assert all(math.isfinite(x) for x in orig + pat)
    assert result["max_rel_loss_diff"] == max(result["rel_loss_diff"])
    assert result["max_rel_loss_diff"] < 1e-3  # fp32


def test_config_resolved_and_data_are_bytes(result):
    cfg = result["config"]
    assert cfg["steps"] == 3 and cfg["batch_size"] == 2 and cfg["seq_len"] == 16 and cfg["lr"] > 0
    assert cfg["layers"] == result["model"]["num_hidden_layers"] == 2  # the preset's count, not None
    assert result["data"]["tokenizer"] == "utf-8 bytes"
    assert result["data"]["tokens_per_step"] == 32


def test_backend_and_device(result, device):
    assert result["device"].startswith(device)
    assert result["backend"] == ("triton" if device == "cuda" else "interpreter")
    assert result["backend_usage"]
    assert all(t > 0 for t in result["tokens_per_s"].values())
    for v in result["peak_memory_bytes"].values():
        assert v is None or v >= 0


def test_patch_report_non_empty(result):
    assert result["patch"]
    assert result["patch"].get("replaced")


def test_batches_depend_only_on_the_seed():
    tokens = data.byte_tokens(data.corpus_text())
    a = data.fixed_batches(tokens, 3, 2, 16, seed=1)
    b = data.fixed_batches(tokens, 3, 2, 16, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert a[0].shape == (2, 16) and int(a[0].max()) < 256


def test_byte_tokenizer_ids_are_the_utf8_bytes():
    pytest.importorskip("tokenizers")
    tok = data.byte_tokenizer()
    text = data.corpus_text()[:300] + " naïve façade \u00ff\n\t end"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == data.byte_tokens(text).tolist() and tok.decode(ids) == text
    assert (tok.pad_token_id, tok.eos_token_id, len(tok)) == (data.BYTE_PAD_ID, data.BYTE_EOS_ID, 256)
    assert tok("ab" + tok.eos_token)["input_ids"] == [97, 98, 255]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(preset="no-such-model"), "unknown preset"),
        (dict(preset="tiny", layers=0), "--layers"),
        (dict(steps=0), "--steps"),
        (dict(model="/no/such/checkpoint"), "neither a preset"),
        (dict(preset="tiny", model="/tmp"), "not both"),
        (dict(dtype="float64"), "dtype"),
        (dict(preset="tiny", seq_len=100_000), "exceeds the model's max_position_embeddings"),
        (dict(nproc=0), "--nproc must be an integer >= 1"),
        (dict(nproc=2, parallel="zero3"), "unknown --parallel 'zero3' \\(choose from ddp, fsdp2, tp, fsdp2_tp\\)"),
        (dict(parallel="fsdp2_tp"), "--parallel fsdp2_tp needs --nproc a multiple of 2 and at least 4"),
        (dict(parallel="tp"), "--parallel tp needs --nproc N > 1"),
    ],
)
def test_bad_config_raises_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        run_compare(CompareConfig(**kwargs))


def test_unsupported_family_fails_before_training():
    def reject(model):
        raise ValueError(f"{type(model).__name__} is not supported")

    calls = []
    with pytest.raises(ConfigError, match="does not support"):
        run_compare(CompareConfig(**TINY), progress=lambda *a: calls.append(a), patch_fn=reject,
                    unpatch_fn=lambda m: None)
    assert calls == []  # rejected by the probe, before the original run trained


def test_local_checkpoint_without_tokenizer_uses_bytes(tmp_path):
    from transformers import AutoModelForCausalLM

    from tigon.presets import build_config

    AutoModelForCausalLM.from_config(build_config("tiny", num_hidden_layers=1)).save_pretrained(tmp_path)
    r = run_compare(CompareConfig(model=str(tmp_path), steps=1, batch_size=1, seq_len=16))
    assert r.model["source"] == f"checkpoint:{tmp_path}" and r.model["num_hidden_layers"] == 1
    assert r.data["tokenizer"] == "utf-8 bytes"
    assert r.config["lr"] == 1e-5  # fine-tuning default for checkpoints
    assert r.max_rel_loss_diff < 1e-3


@pytest.mark.parametrize("model_type", ["gpt_neox", "phi"])
def test_precheck_accepts_what_patch_accepts(model_type):
    # GPT-NeoX / phi-2 (LayerNorm families, partial rotary, non-gated MLPs skipped): the pre-check on the weightless
    # model (the engine's own dry run) used to reject them ("nothing matched") while tigon.patch on the loaded model
    # worked
    import tigon
    from transformers import AutoConfig

    from tigon.workflows.compare import _probe_patch

    config = AutoConfig.for_model(model_type, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                  num_attention_heads=4, vocab_size=300)
    _probe_patch(config, tigon.patch, tigon.unpatch)  # no ConfigError
def test_result_reports_healthy_runs(result):
    assert result["ok"] is True
    assert result["status"] == {"original": "ok", "patched": "ok"}
    assert result["status_detail"] == {"original": "", "patched": ""}


def test_the_verdict_passes_a_correct_patch(result):
    a = result["agreement"]
    assert result["losses_agree"] is True and a["verdict"] == "agree"
    assert a["dtype"] == "float32" and a["bound"] == 1e-3 and a["bound_reason"]
    assert a["steps_judged"] == a["last_step"] == TINY["steps"] and a["detail"] == ""
    assert a["max_rel_loss_diff"] == result["max_rel_loss_diff"] < 1e-5  # ~2e-7 measured: far below the bound
    assert a["max_rel_loss_diff_step"] == result["max_rel_loss_diff_step"]
    assert a["last_rel_loss_diff"] == result["rel_loss_diff"][-1]
    assert a["summary"] == f"losses agree (max rel diff {a['max_rel_loss_diff']:.2e} <= bound 1e-03 for float32)"


def _scaled_swiglu(monkeypatch, factor=1.01):
    """A deliberately wrong op: the patched MLP's output (swiglu folded into the down projection) x ``factor``."""
    from tigon import functional as TF

    right = TF.glu_linear
    monkeypatch.setattr(TF, "glu_linear", lambda *a, **k: right(*a, **k) * factor)


def test_the_verdict_fails_a_one_percent_error_in_one_op(monkeypatch):
    # The CPU default (20 steps of 2 x 32): a correct patch differs by 2e-7, swiglu x 1.01 by 4.6e-3 at step 20. The
    # ops run as their PyTorch reference (the verdict is what is tested, not the kernels): 1-3 s instead of 10.
    import tigon

    _scaled_swiglu(monkeypatch)
    with tigon.force_reference():
        r = run_compare(CompareConfig(preset="tiny", steps=20, batch_size=2, seq_len=32, seed=0))
    a = r.agreement
    assert r.ok and r.losses_agree is False and a["verdict"] == "differ"
    assert 1e-3 < a["max_rel_loss_diff"] < 2e-2 and a["max_rel_loss_diff_step"] > 10
    assert a["summary"].startswith("losses differ beyond the expected bound (max rel diff ")
    assert "> bound 1e-03 for float32, step" in a["summary"]
    assert any("tigon verify" in n for n in r.notes)


@pytest.mark.parametrize("dtype, bound", [("float32", 1e-3), ("bfloat16", 5e-2), ("float16", 5e-2)])
def test_judge_agreement_bounds(dtype, bound):
    from tigon.workflows.compare_verdict import LOSS_RTOL, judge_agreement

    ok = {"original": "ok", "patched": "ok"}
    assert LOSS_RTOL[dtype] == bound
    a = judge_agreement([0.0, bound / 2, bound], dtype, ok)
    assert a["verdict"] == "agree" and a["max_rel_loss_diff"] == bound and a["max_rel_loss_diff_step"] == 3
    a = judge_agreement([0.0, bound * 1.5, bound / 10], dtype, ok)
    assert a["verdict"] == "differ" and a["max_rel_loss_diff_step"] == 2 and a["last_rel_loss_diff"] == bound / 10
    assert f"> bound {bound:.0e} for {dtype}, step 2)" in a["summary"]


def test_judge_agreement_leaves_a_failed_run_unjudged():
    from tigon.workflows.compare_verdict import judge_agreement

    a = judge_agreement([float("nan")] * 2, "float32", {"original": "ok", "patched": "non-finite"})
    assert a["verdict"] == "not judged" and a["max_rel_loss_diff"] is None
    assert a["summary"] == "losses not judged: the patched run is non-finite"


def test_judge_agreement_stops_where_the_grad_scaler_skipped_one_run_only():
    # float16: an overflow skips the step in one run only (measured: seed 1 of the CPU default, step 9), and the runs
    # then take different optimizer steps: only the steps up to that one are judged
    from tigon.workflows.compare_verdict import judge_agreement

    scaler = {"original": {"final_scale": 1.0, "skipped_steps": [2, 3]}, "patched": {"final_scale": 2.0,
                                                                                      "skipped_steps": [2]}}
    a = judge_agreement([1e-5, 2e-5, 3e-4, 0.2], "float16", {"original": "ok", "patched": "ok"}, scaler)
    assert a["verdict"] == "agree" and a["steps_judged"] == a["last_step"] == 3
    assert a["max_rel_loss_diff"] == a["last_rel_loss_diff"] == 3e-4
    assert "skipped step 3 in the original run only" in a["detail"]


@pytest.mark.parametrize(
    "losses, status, detail",
    [
        ([5.5, 5.0, 4.2], "ok", ""),
        ([5.5, 5.6, 5.7], "ok", ""),  # noise around a uniform guess is not divergence
        ([5.5, float("nan"), float("nan")], "non-finite", "loss nan at step 2, 2 of 3 losses not finite"),
        ([5.5, 4.0, float("inf")], "non-finite", "loss inf at step 3"),
        ([5.5, 20.0, 12.4], "diverged", "final loss 12.4 > 1.5 x max(first loss 5.5, ln(vocab 256) 5.545)"),
        ([1.0, 30.0], "diverged", "ln(vocab 256)"),  # a fine-tune that ends worse than guessing
    ],
)
def test_loss_status(losses, status, detail):
    from tigon.workflows._train import loss_status

    got, text = loss_status(losses, 256)
    assert got == status and detail in text and (text == "") == (status == "ok")


def test_loss_status_rejects_a_bad_vocab():
    from tigon.workflows._train import loss_status

    with pytest.raises(ValueError, match="vocab must be an integer >= 2"):
        loss_status([1.0], 1)


def test_nproc_beyond_the_visible_gpus_is_a_config_error(monkeypatch):
    from tigon.workflows.compare import resolve_config

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="--nproc 2 exceeds the 1 visible CUDA device"):
        resolve_config(CompareConfig(device="cuda", nproc=2))
    assert resolve_config(CompareConfig(device="cuda", nproc=1)).nproc == 1


def test_parallel_defaults_to_ddp_for_several_processes_only():
    from tigon.workflows.compare import resolve_config

    assert resolve_config(CompareConfig(device="cpu", nproc=2)).parallel == "ddp"
    assert resolve_config(CompareConfig(device="cpu")).parallel is None  # one process: nothing to wrap


def test_nproc_launches_through_torchrun():
    from tigon.workflows.compare import resolve_config
    from tigon.workflows.compare_dist import torchrun_command

    cfg = resolve_config(CompareConfig(preset="tiny", steps=2, nproc=3, parallel="fsdp2", device="cpu"))
    cmd = torchrun_command(cfg, "/tmp/r.json", progress=True)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3"]
    assert cmd[5:7] == ["-m", "tigon.workflows._nproc_rank"] and cmd[-3:] == ["--out", "/tmp/r.json", "--progress"]
    sent = json.loads(cmd[cmd.index("--config") + 1])
    assert CompareConfig(**sent) == cfg  # the ranks get the resolved configuration


@pytest.mark.parametrize("script, error", [
    ("json.dump({'error': 'bad --seq-len'}, open(out, 'w'))", "bad --seq-len"),  # every rank rejected the config
    ("sys.exit(3)", "exited with status 3 and no report"),  # a rank crashed
])
def test_nproc_launch_relays_progress_and_errors(monkeypatch, script, error):
    # launch() with the ranks replaced by a small script: rank 0's marked progress lines reach the callback, a
    # rejected configuration is a ConfigError, ranks that end without a report a DistributedRunError
    import sys

    from tigon.workflows import compare_dist
    from tigon.workflows.compare import resolve_config

    def command(cfg, out, progress=False, workflow="compare"):
        code = (f"import json, sys; out = {out!r}; "
                f"print({compare_dist.PROGRESS_MARK!r} + json.dumps(['original', 1, 2, 5.5]), flush=True); {script}")
        return [sys.executable, "-c", code]

    monkeypatch.setattr(compare_dist, "torchrun_command", command)
    calls = []
    cfg = resolve_config(CompareConfig(preset="tiny", nproc=2, device="cpu"))
    kind = ConfigError if "error" in script else compare_dist.DistributedRunError
    with pytest.raises(kind, match=error):
        compare_dist.launch(cfg, lambda *a: calls.append(a))
    assert calls == [("original", 1, 2, 5.5)]


def test_a_cpu_run_too_large_for_the_host_memory_is_refused_before_building(monkeypatch):
    from tigon.workflows import host_memory

    host_memory.check_fits(10**6, 4, "x", available=20 * 10**6)  # 1e6 parameters x 4 bytes x 5 fit in 20 MB
    with pytest.raises(ConfigError, match=r"x needs at least .* x 2 processes\), .* or --dtype bfloat16$"):
        host_memory.check_fits(10**6, 4, "x", processes=2, available=20 * 10**6)
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**20)  # 1 MiB: not even the tiny model
    with pytest.raises(ConfigError, match=r"^--preset tiny --layers 1 needs at least .* choose a smaller preset"):
        run_compare(CompareConfig(preset="tiny", layers=1, steps=1, device="cpu"),
                    patch_fn=lambda m: pytest.fail("built"), unpatch_fn=lambda m: None)


def _crash_at(monkeypatch, run: str, step: int, error: BaseException):
    """The ``run`` training run's model raises ``error`` in the forward of its measured ``step`` (1-based)."""
    from tigon.workflows import compare

    real = compare.train

    def train(make_model, batches, *, name, **kwargs):
        if name != run:
            return real(make_model, batches, name=name, **kwargs)

        def make():
            model, calls = make_model(), []

            def hook(module, args, kw):
                calls.append(1)
                if len(calls) == step:
                    raise error
            model.register_forward_pre_hook(hook, with_kwargs=True)
            return model
        return real(make, batches, name=name, **kwargs)

    monkeypatch.setattr(compare, "train", train)


def test_a_run_that_raises_is_reported_crashed(monkeypatch):
    """An exception in a run (transformers' own router loss raised IndexError in Qwen3-VL-MoE's warm-up under
    --layers 1) is RunCrashed: which run, where, the exception's type and message, the other run's status."""
    import tigon
    from tigon.workflows.compare import RunCrashed

    _crash_at(monkeypatch, "patched", 2, IndexError("tuple index out of range"))
    with tigon.force_reference(), pytest.raises(RunCrashed) as info:
        run_compare(CompareConfig(preset="tiny", layers=1, steps=3, batch_size=1, seq_len=8, seed=0))
    e = info.value
    assert isinstance(e.__cause__, IndexError) and e.run == "patched" and not e.warm_up and e.steps_done == 1
    assert str(e) == "the patched run crashed: IndexError: tuple index out of range (in step 2)"
    report = e.as_dict()
    assert report["ok"] is False and report["status"] == {"original": "ok", "patched": "crashed"}
    assert report["config"]["steps"] == 3
    json.dumps(report)


def test_an_interrupt_in_a_run_is_not_a_crash(monkeypatch):
    import tigon

    _crash_at(monkeypatch, "original", 1, KeyboardInterrupt())
    with tigon.force_reference(), pytest.raises(KeyboardInterrupt):
        run_compare(CompareConfig(preset="tiny", layers=1, steps=2, batch_size=1, seq_len=8, seed=0))
