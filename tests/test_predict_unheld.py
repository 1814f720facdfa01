"""The prediction in the host's unheld basis (issue 24): synthetic host-bound, device-bound and mixed steps, the
per-op cost rules, whole parts' device change, and the recomputation of the recorded GPU rows."""

import json
import os
import subprocess
import sys

import pytest

from tigon.workflows import predict as PR

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def change(kind, calls, orig, tigon, **kw):
    return PR.OpChange(kind, kind, kind, calls, PR.OpCost(*orig), PR.OpCost(*tigon), **kw)


def test_held_host_above_the_step_is_scaled_to_the_unheld_basis():
    # host-bound: held H 110 overstates the step (T 94); unheld H_u 90. A held host change of -10 ms counts as
    # -10 x 90/110 in the unheld basis, where T - pipeline (the stall) is small and positive
    step = PR.StepCost(94.0, 110.0, 60.0, 10.0, 12.0, host_unheld_ms=90.0)
    assert step.issue_host_ms == 90.0 and step.host_scale == pytest.approx(90 / 110)
    assert step.pipeline_ms == pytest.approx(90 / 110 * 100 + 12.0) and step.bound == "host"
    assert step.stall_ms == pytest.approx(94.0 - (90 / 110 * 100 + 12.0))
    p = PR.predict(step, [change("norm", 10, (1.5, 0.2), (0.5, 0.02))])
    assert p.host_ms == pytest.approx(100.0)  # the held basis, reported beside
    assert p.host_unheld_ms == pytest.approx(90.0 - 10.0 * 90 / 110)
    assert p.step_ms == pytest.approx(94.0 - 10.0 * 90 / 110)
    held = PR.predict(PR.StepCost(94.0, 110.0, 60.0, 10.0, 12.0), [change("norm", 10, (1.5, 0.2), (0.5, 0.02))])
    assert held.stall_ms < -15 and held.step_ms == pytest.approx(84.0)  # the held model: the full held change


def test_each_calls_own_unheld_time_replaces_the_scale():
    # Tigon's launches inflate more behind the sleep: held +0.3 ms a call, unheld +0.05
    step = PR.StepCost(50.0, 55.0, 30.0, host_unheld_ms=50.0)
    c = PR.OpChange("mlp", "swiglu", "mlp", 20, PR.OpCost(0.5, 0.2, 0.45), PR.OpCost(0.8, 0.1, 0.5))
    p = PR.predict(step, [c])
    assert p.host_unheld_ms == pytest.approx(50.0 + 20 * 0.05)
    assert p.step_ms == pytest.approx(51.0)
    assert PR.predict(step, [c], enabled=[]).step_ms == pytest.approx(50.0)


def test_device_bound_step_ignores_the_host_basis():
    step = PR.StepCost(178.0, 30.0, 171.0, 7.0, 32.0, host_unheld_ms=31.0)  # H_u above H: waits, not host work
    assert step.issue_host_ms == 30.0 and step.host_scale == 1.0 and step.bound == "device"
    p = PR.predict(step, [change("ce", 1, (0.9, 52.0), (1.2, 35.0))])
    assert p.step_ms == pytest.approx(178.0 - 17.0)


def test_mixed_step_turns_host_bound_in_the_unheld_basis():
    # device 60 against unheld host 50 (held 60): device-bound; the kernels save 20 ms, then the host binds
    step = PR.StepCost(62.0, 60.0, 60.0, host_unheld_ms=50.0)
    p = PR.predict(step, [change("norm", 10, (1.0, 2.5), (0.9, 0.5))])
    assert p.device_ms == pytest.approx(40.0)
    assert p.host_unheld_ms == pytest.approx(50.0 - 10 * 0.1 * 50 / 60)
    assert p.step_ms == pytest.approx(62.0 - 60.0 + p.host_unheld_ms) and p.bound == "host"


def test_whole_parts_device_change_and_its_marginals():
    step = PR.StepCost(170.0, 40.0, 165.0, host_unheld_ms=38.0)
    changes = [change("a", 4, (0.5, 2.0), (0.4, 1.0)), change("b", 4, (0.5, 2.0), (0.4, 1.5))]
    dev = PR.HostModel(-9.0, {"a": -2.5})  # the parts: -9 in all, -2.5 without a; b has no variant of its own
    assert PR.predict(step, changes, device=dev).device_ms == pytest.approx(156.0)
    assert PR.predict(step, changes, ["b"], device=dev).device_ms == pytest.approx(165.0 - 2.5)
    assert PR.predict(step, changes, ["a"], device=dev).device_ms == pytest.approx(165.0 - 9.0 + 2.0)
    adv = PR.advise(step, changes, device=dev)
    assert [k.device_delta_ms for k in adv.kinds] == pytest.approx([-6.5, -2.0])
    assert all(k.host_delta_unheld_ms is not None for k in adv.kinds)


def test_call_costs_bases():
    o = {"host_ms": 0.8, "device_ms": 0.2, "natural_ms": 0.6, "waited": False}
    t = {"host_ms": 0.5, "device_ms": 0.05, "natural_ms": 0.5, "waited": False}
    a, b, basis = PR.call_costs(o, t)
    assert basis == "isolated" and (a.host_ms, a.host_unheld_ms, b.host_unheld_ms) == pytest.approx((0.8, 0.6, 0.5))
    a, b, basis = PR.call_costs(o, t, in_step=(1.6, 1.0))  # in-step held, converted by each call's own ratio
    assert basis == "in_step" and (a.host_unheld_ms, b.host_unheld_ms) == pytest.approx((1.2, 1.0))
    a, b, basis = PR.call_costs(o, t, (1.6, 1.0), (1.3, 1.1))
    assert basis == "in_step_unheld" and (a.host_unheld_ms, b.host_unheld_ms) == (1.3, 1.1)
    heavy = {"host_ms": 0.9, "device_ms": 50.0, "natural_ms": 0.8}  # kernels longer than the host: no ratio
    assert PR.call_costs(heavy, heavy)[0].host_unheld_ms is None
    waited = dict(t, host_ms=28.0, device_ms=35.0, waited=True)  # its host time holds a device wait
    a, b, basis = PR.call_costs(o, waited, in_step=(0.8, 296.0))
    assert basis == "waited" and a.host_ms == b.host_ms == 0.8 and b.device_ms == 35.0


def test_recorded_rows_recompute_within_the_target_where_their_own_oracle_does():
    """The committed GPU rows: every row whose measurements agree with each other (the patched step's own host
    and device time predict it within the target) is predicted within +-7%; the others are named."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import predict_recompute as RC
    finally:
        sys.path.pop(0)
    rows = []
    for name, rel in RC.ROWS.items():
        with open(os.path.join(RC.R, rel)) as f:
            rows.append(RC.recompute(name, json.load(f)))
    # the host change of a row recorded before the in-step host measurement comes from isolated calls only, which
    # miss the integration layer's Python in the step (the -21.5% of the twelfth H200 run): named apart
    isolated = [r["row"] for r in rows if set(r["host_basis"].values()) == {"isolated"}]
    assert isolated == ["h200 s12 qwen2.5-0.5b 24L 4x1024"]
    for r in rows:
        if abs(r["oracle_unheld_error_pct"]) <= RC.TARGET_PCT and r["row"] not in isolated:
            assert abs(r["error_pct"]) <= RC.TARGET_PCT, r["row"]
    inconsistent = [r["row"] for r in rows if abs(r["oracle_unheld_error_pct"]) > RC.TARGET_PCT]
    assert inconsistent == ["h200 s13 qwen2.5-0.5b 24L 4x1024"]
    assert abs(next(r for r in rows if "s18" in r["row"])["error_pct"]) <= RC.TARGET_PCT  # was +13.9% per op


def test_recompute_script_runs(tmp_path):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "predict_recompute.py"), "--out-dir",
                          str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "recomputed" in out and (tmp_path / "predict_recompute.json").exists()
