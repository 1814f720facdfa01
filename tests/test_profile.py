"""tigon profile: the step's time by category, what Tigon replaces, predicted vs measured patched step.

On CPU the profile is self CPU time and Tigon's kernels run interpreted, so only the structure is checked: the
categories add up to the step, the replaced ones are marked, the prediction and the measurement are there.
"""

import json
from types import SimpleNamespace

import pytest

from tigon.cli import main
from tigon.workflows import profile as P

REPLACED = {"norm": "rms_norm", "rotary": "rope", "activation": "swiglu", "lm_head_loss": "fused_linear_cross_entropy"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    trace = tmp_path_factory.mktemp("profile") / "trace.json"
    r = P.run_profile(P.ProfileConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0,
                                      trace=str(trace)))
    return r.as_dict()


def test_categories_sum_to_the_profiled_step(report):
    cats = {c["name"]: c for c in report["categories"]}
    assert list(cats) == [*P.CATEGORIES, "unattributed"]
    total = sum(c["ms"] for c in cats.values())
    assert total == pytest.approx(report["profiled_step_ms"], rel=0.1)
    assert sum(c["pct"] for c in cats.values()) == pytest.approx(100.0, rel=0.1)
    for name in ("matmul", "attention", "norm", "rotary", "activation", "lm_head_loss", "optimizer"):
        assert cats[name]["ms"] > 0, name
    assert all(c["ms"] >= 0 for c in cats.values())


def test_replaced_categories_are_marked(report):
    cats = {c["name"]: c for c in report["categories"]}
    for name, op in REPLACED.items():
        assert cats[name]["replaced"] and cats[name]["tigon_op"] == op, name
    for name in ("matmul", "attention", "optimizer", "other", "unattributed"):
        assert not cats[name]["replaced"] and cats[name]["tigon_op"] is None, name
    assert report["patch"] == {"rms_norm": 3, "fused_add_rms_norm": 1, "mlp": 1, "rope": 1, "lm_head_loss": 1}


def test_prediction_and_measurement(report):
    cats = {c["name"]: c for c in report["categories"]}
    assert set(report["bench"]) == set(REPLACED.values())
    for name, op in REPLACED.items():
        b = report["bench"][op]
        assert b["eager_ms"] > 0 and b["tigon_ms"] > 0 and b["ratio"] == pytest.approx(b["tigon_ms"] / b["eager_ms"])
        assert cats[name]["bench_ratio"] == b["ratio"]
        assert cats[name]["predicted_ms"] == pytest.approx(cats[name]["ms"] * b["ratio"])
        assert cats[name]["patched_ms"] >= 0
    assert report["step_ms_original"] > 0 and report["step_ms_patched"] > 0
    assert report["predicted_step_ms_patched"] > 0 and report["profiled_step_ms_patched"] > 0
    assert report["prediction_error_pct"] == pytest.approx(
        100 * (report["predicted_step_ms_patched"] - report["step_ms_patched"]) / report["step_ms_patched"])
    assert report["backend"] in ("interpreter", "triton")


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
    totals = P.categorize(fwd + nodes + inner, cuda=False)
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
    assert r["step_ms_patched"] is None and r["predicted_step_ms_patched"] is None
    assert sum(c["ms"] for c in r["categories"]) == pytest.approx(r["profiled_step_ms"], rel=0.1)
    assert "step_ms original=" in capsys.readouterr().out
    rc = main(["profile", "no-such-model"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "neither a preset" in err
    rc = main(["profile", "tiny", "--attn-implementation", "fast"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--attn-implementation 'fast'" in err
