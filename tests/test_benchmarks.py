"""The maintained benchmark scripts (benchmarks/**/*.py, helpers starting with _ aside) import and print --help on
any machine, tune.py's search space names only knobs the kernel modules have, and the Makefile's GPU targets parse:
so that none of them rots silently while src/ changes under them. The scripts run in two subprocesses, half each (a few seconds)."""

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
