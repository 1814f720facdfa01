"""The maintained benchmark scripts (benchmarks/**/*.py, helpers starting with _ aside) import and print --help on
any machine, tune.py's search space names only knobs the kernel modules have, and the Makefile's GPU targets parse:
so that none of them rots silently while src/ changes under them. The scripts run in two subprocesses, half each (a few
seconds)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "benchmarks").rglob("*.py")
                 if not p.name.startswith("_") and "results" not in p.parts)
CHECKS = {**{s: [s, "--help"] for s in SCRIPTS}, "tune --list": ["benchmarks/tune.py", "--list"]}


@pytest.fixture(scope="module")
def finished():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    # Two interpreters (CI's two cores), each running half the scripts one after another (tests/_run_scripts.py):
    # one torch import each instead of one per script.
    names = list(CHECKS)
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "_run_scripts.py"),
                               json.dumps({n: CHECKS[n] for n in names[i::2]})], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    finished = {}
    for p in procs:
        out = p.communicate(timeout=240)[0]
        assert p.returncode == 0, out
        finished.update({n: tuple(v) for n, v in json.loads(out.splitlines()[-1]).items()})
    return finished


def test_every_kind_has_its_script():
    assert {"benchmarks/tune.py", "benchmarks/flce_h200.py", "benchmarks/compile_check.py",
            "benchmarks/host_overhead.py", "benchmarks/numerics/bf16_drift.py",
            "benchmarks/numerics/lean_accum_sim.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_script_runs(finished, name):
    out, rc = finished[name]
    assert rc == 0, out
    assert ("usage:" in out) if name in SCRIPTS else ("every knob exists" in out), out


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_gpu_targets_parse():
    proc = subprocess.run(["make", "-n", "bench-h200", "bench-sweep-h200", "OUT=out", "DATE=20260101",
                           "MODEL=llama3-8b", "GPU=h200"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert "tigon.cli bench --op all --model llama3-8b --json out/bench_llama3-8b_h200_20260101.json" in proc.stdout
    assert "--sweep tokens --cuda-graph" in proc.stdout and "--sweep hidden --cuda-graph" in proc.stdout


def test_e2e_table_keeps_a_row_for_a_provider_that_timed_out_or_failed(tmp_path, monkeypatch):
    # a provider whose process runs past --timeout or dies without a report is a row that says so (a call on the
    # H100 lost HF + compile's line that way), and the default providers are issue 28's table
    import argparse
    import importlib.util

    spec = importlib.util.spec_from_file_location("e2e_table", ROOT / "benchmarks" / "e2e_table.py")
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    assert e2e.DEFAULT_PROVIDERS.split(",") == ["original", "original_compile", "liger", "liger_cutedsl", "tigon",
                                                "tigon_compile"]

    def fake_run(cmd, timeout, check, env, **kw):
        if "original_compile" in cmd[cmd.index("--json") + 1]:
            raise subprocess.TimeoutExpired(cmd, timeout)
        return subprocess.CompletedProcess(cmd, 1, stderr=b"")

    monkeypatch.setattr(subprocess, "run", fake_run)  # benchmarks/_tables.py's launcher
    args = argparse.Namespace(out_dir=str(tmp_path), providers="original_compile,liger_cutedsl", tag="t",
                              model="tiny", batch_size=1, seq_len=8, steps=1, warmup=0, layers=None,
                              image_tokens=None, lora=None, gradient_checkpointing=None, checkpoint_budget_gb=None,
                              kernel_summary=False, timeout=5)
    rows = e2e.merge(e2e.run_providers(args))
    assert [(r["provider"], r["status"]) for r in rows] == [("original_compile", "failed"), ("liger_cutedsl", "failed")]
    assert "timed out after 5 s" in rows[0]["note"] and "status 1" in rows[1]["note"]
    text = e2e.table(rows)
    assert "original_compile" in text and "timed out" in text


def test_e2e_table_names_a_merged_plot_after_its_rows_and_the_device(tmp_path):
    # --from-dir's plot takes the merged files' tag (not --model's default); --gpu defaults to the device found
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("e2e_table", ROOT / "benchmarks" / "e2e_table.py")
    e2e = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e)
    path = tmp_path / "e2e-original_compile_gpt-oss-20b-4l-4x2048_h100_20261206.json"
    path.write_text(json.dumps({"rows": [{"provider": "original_compile"}]}))
    assert e2e.merged_tag([str(path)]) == "gpt-oss-20b-4l-4x2048_h100_20261206"
    assert e2e.merged_tag([]) is None
    if not torch.cuda.is_available():
        assert e2e.gpu_tag() == "cpu"
