"""tigon profile: the step's time by category, what Tigon replaces, predicted vs measured patched step.

On CPU the profile is self CPU time and Tigon's kernels run interpreted, so only the structure is checked: the
rows add up to the step and none exceeds it, the replaced categories are marked, the per-op costs, the prediction,
the advice and the measurement are there. The arithmetic itself is tests/test_predict.py's.
"""

import json
from types import SimpleNamespace

import pytest
import torch

from tigon.cli import main
from test_profile_layer import few_timing_samples
from tigon.workflows import profile as P
from tigon.workflows.profile_events import categorize

REPLACED = {"norm": "rms_norm", "rotary": "rope", "activation": "swiglu", "lm_head_loss": "fused_linear_cross_entropy"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    trace = tmp_path_factory.mktemp("profile") / "trace.json"
    with pytest.MonkeyPatch.context() as mp:
        few_timing_samples(mp)  # CPU time: the checks below are structural
        r = P.run_profile(P.ProfileConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0,
                                          trace=str(trace)))
    return r.as_dict()


def test_categories_sum_to_the_profiled_step(report):
    cats = {c["name"]: c for c in report["categories"]}
    assert list(cats) == [*P.CATEGORIES, "unlinked", "idle"]
    step = report["profiled_step_ms"]
    assert sum(c["ms"] for c in cats.values()) == pytest.approx(step, rel=1e-9)
    assert sum(c["pct"] for c in cats.values()) == pytest.approx(100.0, rel=1e-9)
    for name in ("matmul", "attention", "norm", "rotary", "activation", "lm_head_loss", "optimizer"):
        assert cats[name]["ms"] > 0, name
    for c in cats.values():
        assert 0 <= c["ms"] <= step and 0 <= c["pct"] <= 100.0 + 1e-9, c
    assert cats["idle"]["basis"] == "wall" and cats["matmul"]["basis"] == "kernel"
    assert cats["idle"]["ms"] > 0  # Python outside any op: its own row, not spread over the ops
    assert 0 < report["attribution_scale"] <= 1


def test_replaced_categories_are_marked(report):
    cats = {c["name"]: c for c in report["categories"]}
    for name, op in REPLACED.items():
        assert cats[name]["replaced"] and op in cats[name]["tigon_op"], name
    assert cats["norm"]["tigon_op"] == "rms_norm, fused_add_rms_norm"
    for name in ("matmul", "attention", "optimizer", "other", "unlinked", "idle"):
        assert not cats[name]["replaced"] and cats[name]["tigon_op"] is None, name
    assert report["patch"] == {"rms_norm": 3, "fused_add_rms_norm": 1, "mlp": 1, "rope": 1, "lm_head_loss": 1}


def test_op_costs_prediction_advice_and_measurement(report):
    ops = {o["kind"]: o for o in report["ops"]}
    assert set(ops) == {"rms_norm", "fused_add_rms_norm", "mlp", "rope", "lm_head_loss"}
    # The fused decoder layer computes its post-attention norm itself: 3 patched norms, 2 run as rms_norm.
    assert ops["rms_norm"]["calls"] == 2 and ops["fused_add_rms_norm"]["bypasses"] == {"rms_norm": 1}
    assert ops["lm_head_loss"]["keyword"] == "fused_linear_cross_entropy" and ops["mlp"]["op"] == "swiglu"
    for o in ops.values():
        assert o["original"]["host_ms"] > 0 and o["tigon"]["host_ms"] > 0
        if report["device"] == "cpu":  # everything is host time
            assert o["original"]["device_ms"] == 0 == o["tigon"]["device_ms"]
        else:
            assert o["original"]["device_ms"] > 0 and o["tigon"]["device_ms"] > 0
        # the host change (profile_layer.HOST_BASIS "per_op"): the modules' host time inside the step; the whole
        # parts' marginal (what leaving the kind out of the patched parts gives back) is measured beside it
        assert o["host_basis"] == "in_step", o["kind"]
        assert f"without {o['keyword']}" in report["layers"]["host_delta_ms"]
        # per op (kept beside it): the modules' host time inside the step (original vs patched step)
        assert o["host_basis_per_op"] == "in_step" and o["in_step"]["original"]["calls"] > 0, o["kind"]
        per_call = {side: o["in_step"][side]["per_call_ms"] for side in ("original", "tigon")}
        for side in ("original", "tigon"):
            s = o["in_step"][side]
            assert s["per_call_ms"] == pytest.approx((s["forward_ms"] + s["backward_ms"]) / s["calls"])
        assert o["host_delta_ms_per_op"] == pytest.approx(o["calls"] * (per_call["tigon"] - per_call["original"]))
        assert o["host_delta_ms_isolated"] == pytest.approx(
            o["calls"] * (o["tigon"]["host_ms"] - o["original"]["host_ms"]))
        assert o["patch_call"] == f"tigon.patch(model, {o['keyword']}=False)" and o["step_ms_without"] > 0
    assert set(report["host_in_step"]) == {"original", "patched"}
    assert all(v["steps"] >= 1 and v["overhead"]["own_forward_ms"] >= 0 for v in report["host_in_step"].values())
    lim = report["limits"]
    if report["device"] == "cpu":  # host-bound by construction: H = T, D = 0, the prediction adds the host deltas
        assert lim["original"]["host_ms"] == lim["original"]["step_ms"] == report["step_ms_original"]
        assert lim["original"]["device_ms"] == 0 and lim["original"]["bound"] == "host"
        assert lim["predicted"]["layers"]["step_ms"] == pytest.approx(
            report["step_ms_original"] + report["layers"]["host_delta_ms"]["patched"])
        assert report["predicted_step_ms_patched"] == pytest.approx(lim["predicted"]["step_ms_per_op"])
        assert lim["predicted"]["step_ms_per_op"] == pytest.approx(
            report["step_ms_original"] + sum(o["host_delta_ms_per_op"] for o in ops.values()))
    else:
        assert lim["original"]["host_ms"] > 0 and lim["original"]["device_ms"] > 0
        assert lim["original"]["bound"] in ("host", "device")
    assert lim["predicted"]["step_ms"] == report["predicted_step_ms_patched"]
    assert lim["predicted"]["host_basis"] == "per_op" and lim["predicted"]["host_side"] == "host_ms"
    alt = lim["predicted"]["alternative"]  # the prediction from the parts' host time with the device not held
    assert alt["host_side"] == "unheld_ms" and alt["step_ms"] > 0
    adv = report["advice"]
    assert set(adv) == {"best_call", "best_keywords", "best_step_ms", "replace_nothing", "slower"}
    assert adv["best_step_ms"] <= report["predicted_step_ms_patched"] + 1e-9
    assert adv["best_call"].startswith("tigon.patch(model")
    assert report["step_ms_original"] > 0 and report["step_ms_patched"] > 0 and report["profiled_step_ms_patched"] > 0
    assert lim["patched"]["step_ms"] == report["step_ms_patched"]
    assert report["prediction_error_pct"] == pytest.approx(
        100 * (report["predicted_step_ms_patched"] - report["step_ms_patched"]) / report["step_ms_patched"])
    assert all(c["patched_ms"] is not None and c["patched_ms"] >= 0 for c in report["categories"])
    assert report["backend"] in ("interpreter", "triton")
    assert list(report["stage_s"])[0].startswith("time original step") and all(
        v >= 0 for v in report["stage_s"].values()) and "profile patched step" in report["stage_s"]


def test_traces_are_written(report):
    assert len(report["traces"]) == 2
    for path in report["traces"]:
        with open(path) as f:
            trace = json.load(f)
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "tigon.cat/norm" in names and "tigon.cat/optimizer" in names
    assert report["traces"][1].endswith("trace.patched.json")


def _ev(name, parent=None, seq=-1, t=0, us=10.0):
    return SimpleNamespace(name=name, cpu_parent=parent, sequence_nr=seq, time_range=SimpleNamespace(start=t),
                           self_cpu_time_total=us, device_type="DeviceType.CPU")


def test_backward_ops_follow_their_forward_range_by_sequence_number():
    mlp, norm, att = _ev("tigon.cat/mlp", t=0), _ev("tigon.cat/norm", t=10), _ev("tigon.cat/attention", t=20)
    fwd = [_ev("aten::mm", mlp, seq=1, t=1), _ev("aten::silu", mlp, seq=2, t=2), _ev("aten::mul", norm, seq=3, t=11),
           _ev("aten::_scaled_dot_product_flash_attention", att, seq=4, t=21), _ev("aten::add", None, seq=5, t=30)]
    nodes = [_ev(f"autograd::engine::evaluate_function: {n}", None, seq=s, t=40 + s, us=1.0)
             for n, s in (("MmBackward0", 1), ("SiluBackward0", 2), ("MulBackward0", 3),
                          ("ScaledDotProductFlashAttentionBackward0", 4), ("AddBackward0", 5))]
    inner = [_ev("aten::mm", nodes[0], t=41.5, us=100.0)]
    for e in (mlp, norm, att):
        e.self_cpu_time_total = 0.0
    totals = categorize(fwd + nodes + inner, cuda=False)
    assert totals["matmul"] == 10 + 1 + 100
    assert totals["activation"] == 10 + 1
    assert totals["norm"] == 10 + 1
    assert totals["attention"] == 10 + 1
    assert totals["other"] == 10 + 1


def test_cli_profile_json_and_bad_model(tmp_path, capsys):
    js = tmp_path / "p.json"
    rc = main(["profile", "tiny", "--layers", "1", "--batch-size", "1", "--seq-len", "8", "--steps", "1",
               "--warmup", "0", "--no-predict", "--no-patched", "--attn-implementation", "eager", "--json", str(js),
               "--quiet"])
    assert rc == 0
    r = json.loads(js.read_text())
    assert r["config"]["attn_implementation"] == "eager"
    assert r["step_ms_patched"] is None and r["predicted_step_ms_patched"] is None and r["ops"] == []
    assert r["peak_memory_bytes_patched"] is None and "peak_memory_bytes_original" in r
    assert sum(c["ms"] for c in r["categories"]) == pytest.approx(r["profiled_step_ms"], rel=1e-9)
    assert "step_ms original=" in capsys.readouterr().out
    rc = main(["profile", "no-such-model"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "neither a preset" in err
    rc = main(["profile", "tiny", "--attn-implementation", "fast"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--attn-implementation 'fast'" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="kernel time and host time need CUDA")
def test_cuda_rows_are_kernel_time_and_fit_the_step(tmp_path):
    """On CUDA: no time counted twice (the ranges' device-side copies were: the optimizer at 365% of the step), the
    host's and the device's time measured, each op's host and kernel time > 0, and the prediction made."""
    r = P.run_profile(P.ProfileConfig(model="tiny", layers=2, batch_size=2, seq_len=64, steps=2, warmup=1,
                                      device="cuda", dtype="bfloat16")).as_dict()
    step = r["profiled_step_ms"]
    assert sum(c["ms"] for c in r["categories"]) == pytest.approx(step, rel=1e-9)
    assert all(0 <= c["ms"] <= step and c["pct"] <= 100 + 1e-9 for c in r["categories"])
    assert r["attribution_scale"] > 0.99, "kernel time attributed twice"
    lim = r["limits"]["original"]
    assert 0 < lim["host_ms"] and 0 < lim["device_ms"] <= step
    # The host's issue time at full size, in parts (embedding, 2 layers x forward and backward, optimizer), bounds
    # the step it issues; the step measured by profile is the e2e bench's.
    assert lim["host_parts"] == 6 and lim["host_ms"] <= 1.05 * lim["step_ms"], lim
    assert 0 <= lim["optimizer_device_ms"] <= lim["device_ms"] and 0 <= lim["optimizer_host_ms"] <= lim["host_ms"]
    for o in r["ops"]:
        for side in ("original", "tigon"):
            assert o[side]["host_ms"] > 0 and o[side]["device_ms"] > 0, (o["kind"], side)
    assert r["predicted_step_ms_patched"] > 0 and r["step_ms_patched"] > 0
    assert r["limits"]["patched"]["host_ms"] > 0


def test_the_step_is_timed_in_parts_per_layer():
    """The host's issue time of a step is measured in parts that each launch fewer kernels than the launch queue
    holds: the embedding, each decoder layer's forward and backward (in the autograd thread's order), the
    optimizer. On CPU nothing is held: wall time, no device time."""
    from tigon.workflows.e2e_models import build_model, hf_config, random_batches
    from tigon.workflows.profile_events import step_issue

    hfc, _ = hf_config("tiny", 2)
    model = build_model(hfc, torch.float32, torch.device("cpu"), 0)
    batches = random_batches(int(hfc.vocab_size), 1, 1, 8, 0)
    t, syncs = step_issue(model, batches, device=torch.device("cpu"), lr=1e-3, warmup=0, rounds=2)
    assert [s.label for s in t.segments] == ["forward: embedding", "forward: layer 0", "forward: layer 1",
                                             "backward: layer 1", "backward: layer 0", "optimizer"]
    assert syncs == [] and not t.held and t.waited == [] and t.device_ms == 0 and t.host_ms > 0
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())  # hooks removed


def test_advice_names_the_memory_a_left_out_kind_gives_back():
    # The memory side of the advice (issue 24): leaving a kind out for speed costs its memory saving.
    from tigon.cli.profile import _peak_pair
    from tigon.workflows.profile_notes import _memory_cost

    op = {"original": {"peak_extra_bytes": 96 * 2**20}, "tigon": {"peak_extra_bytes": 32 * 2**20}}
    assert _memory_cost(op) == ", at 64 MiB more per call at its peak (96 against 32)"
    assert _peak_pair(op) == "96 / 32"
    cpu = {"original": {"host_ms": 1.0}, "tigon": {"host_ms": 0.5}}
    assert _memory_cost(cpu) == "" and _peak_pair(cpu) == ""
    assert _memory_cost({"original": {"peak_extra_bytes": 1}, "tigon": {"peak_extra_bytes": 2}}) == ""


def test_profile_times_the_op_a_replacement_runs_and_names_what_it_cannot_time():
    # GPT-OSS (issue 20): the MLP kind runs the MoE glue, whose gate op is timed (a bandwidth op, not swiglu); the
    # sinks kind runs no op of the registry (torch SDPA): not timed, and a note says so
    from transformers import GptOssConfig

    hfc = GptOssConfig(vocab_size=61, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                       sliding_window=4, max_position_embeddings=64,
                       layer_types=["sliding_attention", "full_attention"])
    kinds, _, counts, notes, _ = P._replacements(hfc)
    ops = {k["kind"]: k["op"] for k in kinds}
    # (the experts run Tigon's glue forward: its gate, bias + clamped SwiGLU, is the activation op timed)
    assert ops["mlp"] == "moe_expert_gate" and "sinks" not in ops and counts["sinks"] == 2
    assert any(n.startswith("sinks (2 modules) is replaced but not timed") for n in notes)


def test_untimed_vision_attention_note_names_what_it_runs():
    # a Qwen2-VL tower's vision_attention kind runs no op of the registry: the note says what it runs (it said
    # "sinks: torch SDPA for eager attention", and "1 modules", for a one-block tower)
    pytest.importorskip("transformers")
    from model_matrix import VISION_LANGUAGE, config, require_family

    model_type, overrides = VISION_LANGUAGE["qwen2_vl"][:2]
    require_family(model_type)
    _, _, counts, notes, _ = P._replacements(config(model_type, overrides))
    note = next(n for n in notes if n.startswith("vision_attention"))
    assert counts["vision_attention"] == 1 and note.startswith("vision_attention (1 module) is replaced but not timed")
    assert "sinks" not in note and "batched by chunk length" in note


def test_cpu_profile_too_large_for_the_host_memory_is_refused_before_building(monkeypatch):
    """The check tigon compare and bench --e2e run (host_memory.check_config_fits): `tigon profile llama3-8b
    --layers 1` went on to build a 1.27e9-parameter model on a 23 GiB CPU machine where bench --e2e refused it."""
    from tigon.workflows import host_memory

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**20)  # 1 MiB: not even the tiny model
    monkeypatch.setattr(P, "build_model", lambda *a, **k: pytest.fail("built"))
    monkeypatch.setattr(P, "run_provider", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(P.ConfigError, match=r"^MODEL tiny --layers 1 needs at least .* choose a smaller preset"):
        P.run_profile(P.ProfileConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0,
                                      device="cpu"))
