"""benchmarks/op_table.py (issue 28's op table): one ``tigon bench`` process per provider and basis, merged. The
launcher is stubbed to write fake reports (a second or two); one real tiny run on CPU (a few seconds)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNEL_NOTE = "kernel time: summed durations (torch.profiler)"
# (provider the process ran, basis) -> fwd_bwd ms per op; fwd is a third of it
MS = {("eager", "host"): {"rms_norm": 0.9, "layer_norm": 1.0, "cross_entropy": 3.0},
      ("eager", "kernel"): {"rms_norm": 0.6, "layer_norm": 0.7, "cross_entropy": 2.5},
      ("tigon", "host"): {"rms_norm": 0.5, "layer_norm": 0.55, "cross_entropy": 1.6},
      ("tigon", "kernel"): {"rms_norm": 0.3, "layer_norm": 0.35, "cross_entropy": 1.2},
      ("liger", "host"): {"rms_norm": 0.4, "layer_norm": 0.8, "cross_entropy": 2.0},
      ("liger", "kernel"): {"rms_norm": 0.33, "layer_norm": 0.6, "cross_entropy": 1.4},
      ("liger_cutedsl", "host"): {"rms_norm": 0.45, "layer_norm": 0.7, "cross_entropy": 2.2},
      ("liger_cutedsl", "kernel"): {"rms_norm": 0.32, "layer_norm": 0.5, "cross_entropy": 1.5},
      ("compile", "host"): {"rms_norm": 0.7, "layer_norm": 0.75, "cross_entropy": 2.8}}


def _load():
    spec = importlib.util.spec_from_file_location("op_table", ROOT / "benchmarks" / "op_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def op_table():
    return _load()


def _fake_bench(calls):
    """A stand-in for subprocess.run of ``tigon bench``: writes a report as the real one would, or fails."""

    def run(cmd, timeout, check, env, **kw):
        arg = lambda flag: cmd[cmd.index(flag) + 1]  # noqa: E731
        path, base, ops, tokens = arg("--json"), arg("--providers"), arg("--op").split(","), int(arg("--tokens"))
        basis = "kernel" if "--cuda-graph" in cmd else "host"
        calls.append({"provider": base, "basis": basis, "ops": ops, "tokens": tokens,
                      "impl": env.get("LIGER_KERNEL_IMPL")})
        if base == "quack":
            return subprocess.CompletedProcess(cmd, 2, stderr=(
                f"tigon bench: error: none of the requested providers can run {', '.join(ops)}: quack: not installed "
                "(quack), skipped\n").encode())
        if base == "compile" and basis == "kernel":
            raise subprocess.TimeoutExpired(cmd, timeout, stderr=b"compiling...\n")
        key = ("liger_cutedsl" if env.get("LIGER_KERNEL_IMPL") == "cutedsl" else base, basis)
        rows = []
        for op in ops:
            ms = MS[key][op]
            size = "8192x128256" if op == "cross_entropy" else "16384x4096"
            note = KERNEL_NOTE if (base == "liger" and op == "cross_entropy" and basis == "kernel") else ""
            for mode, t in (("fwd", ms / 3), ("bwd", ms * 2 / 3), ("fwd_bwd", ms)):
                rows.append({"op": op, "provider": base, "shape": {"tokens": tokens}, "dtype": "bfloat16",
                             "mode": mode, "ms": t, "pct_copy_bw": 50.0 / t if op != "cross_entropy" else None,
                             "note": "backward alone" if mode == "bwd" else note, "size": size})
        with open(path, "w") as f:
            json.dump({"device": "NVIDIA H200", "ceilings": {"copy_gbps": 4000.0}, "skipped": [],
                       "model": {"name": "llama3-8b"}, "sweep": None,
                       "config": {"ops": ops, "providers": [base], "tokens": tokens, "cuda_graph": basis == "kernel"},
                       "notes": ["cuda_graph: ..."] if basis == "kernel" else [], "size_formats": {}, "rows": rows}, f)
        return subprocess.CompletedProcess(cmd, 0, stderr=b"")

    return run


def test_table_of_stubbed_processes(op_table, tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.delenv("LIGER_KERNEL_IMPL", raising=False)
    monkeypatch.setattr(subprocess, "run", _fake_bench(calls))  # benchmarks/_tables.py's launcher
    out = tmp_path / "out"
    op_table.main(["--ops", "rms_norm,layer_norm,cross_entropy", "--out-dir", str(out), "--gpu", "h200"])
    text = capsys.readouterr().out

    # one process per (provider, basis, token count), only for the ops the provider implements
    assert {(c["provider"], c["basis"], c["tokens"], tuple(c["ops"])) for c in calls if c["provider"] == "quack"} == \
        {("quack", b, n, ops) for b in ("host", "kernel")
         for n, ops in ((16384, ("rms_norm",)), (8192, ("cross_entropy",)))}
    assert all(c["tokens"] == (8192 if c["ops"] == ["cross_entropy"] else 16384) for c in calls)
    # liger_cutedsl is liger in a process of its own with LIGER_KERNEL_IMPL=cutedsl; plain liger without it
    assert {c["impl"] for c in calls if c["provider"] == "liger"} == {"cutedsl", None}
    assert sum(c["impl"] == "cutedsl" for c in calls) == 4

    (json_path,) = out.glob("op-table_llama3-8b_h200_*.json")
    assert json_path.with_suffix(".png").stat().st_size > 0
    merged = json.loads(json_path.read_text())
    assert merged["providers"] == op_table.DEFAULT_PROVIDERS.split(",")
    assert merged["ops"] == ["rms_norm", "layer_norm", "cross_entropy"]
    by = {e["op"]: e for e in merged["table"]["fwd_bwd"]}
    rms = by["rms_norm"]["cells"]
    assert rms["tigon"]["host"]["ms"] == pytest.approx(0.5) and rms["tigon"]["kernel"]["ms"] == pytest.approx(0.3)
    assert rms["liger_cutedsl"]["kernel"]["ms"] == pytest.approx(0.32)  # its own numbers, not liger's
    assert rms["quack"]["host"]["status"] == rms["quack"]["kernel"]["status"] == "not installed"
    assert by["layer_norm"]["cells"]["quack"]["host"]["status"] == "n/a"  # QuACK has no LayerNorm
    assert rms["compile"]["host"]["status"] == "ok" and rms["compile"]["kernel"]["status"] == "timed out"
    # Tigon vs the fastest other provider in each basis: its ms / Tigon's
    assert by["rms_norm"]["ratio"]["host"] == {"ratio": pytest.approx(0.4 / 0.5), "fastest_other": "liger"}
    assert by["rms_norm"]["ratio"]["kernel"] == {"ratio": pytest.approx(0.32 / 0.3), "fastest_other": "liger_cutedsl"}
    assert by["cross_entropy"]["ratio"]["kernel"]["ratio"] == pytest.approx(1.4 / 1.2)

    # the printed markdown: cells "host / kernel (P%)", the failures said, the profiler note kept
    assert "| rms_norm | 16384x4096 | not installed / not installed | 0.450 / 0.320 (156%) |" in text
    assert "0.700 / timed out (71%)" in text  # compile: % from the host row when there is no kernel time
    assert "0.80x vs Liger Triton / 1.07x vs Liger CuTe DSL" in text
    assert f"2.000 / 1.400{op_table.DAGGER}" in text and f"{op_table.DAGGER} {KERNEL_NOTE}" in text
    assert "QuACK not installed" in text and "quack: not installed (quack), skipped" in text
    assert "torch.compile timed out (rms_norm kernel, layer_norm kernel, cross_entropy kernel)" in text
    # every source row and the exact commands
    assert {r["provider"] for r in merged["rows"]} >= {"liger", "liger_cutedsl", "tigon", "eager", "compile"}
    cmds = {(c["provider"], c["basis"], c["tokens"]): c for c in merged["commands"]}
    cute = cmds["liger_cutedsl", "kernel", 16384]
    assert cute["cmd"].startswith("LIGER_KERNEL_IMPL=cutedsl ") and "--providers liger --cuda-graph" in cute["cmd"]
    assert "--op rms_norm,layer_norm --model llama3-8b --tokens 16384" in cute["cmd"] and cute["status"] == "ok"
    assert cmds["compile", "kernel", 8192]["status"] == "timed out"
    assert cmds["quack", "host", 8192]["status"] == "failed"

    # --from-dir: the same table from the files, without running anything
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("--from-dir ran a process"))
    again = tmp_path / "again.json"
    op_table.main(["--from-dir", str(out), "--json", str(again), "--modes", "all"])
    rebuilt = json.loads(again.read_text())
    assert rebuilt["table"]["fwd_bwd"] == merged["table"]["fwd_bwd"]
    assert rebuilt["commands"] == merged["commands"] and set(rebuilt["table"]) == {"fwd", "bwd", "fwd_bwd"}
    assert again.with_suffix(".png").exists()


def test_tokens_and_timeouts(op_table):
    ops = ["rms_norm", "cross_entropy", "rope"]
    assert op_table.op_tokens(op_table.DEFAULT_TOKENS, ops) == {"rms_norm": 16384, "cross_entropy": 8192,
                                                               "rope": 16384}
    assert op_table.op_tokens("rope=4096", ops) == {"rms_norm": 16384, "cross_entropy": 8192, "rope": 4096}
    assert op_table.op_tokens("64", ops) == dict.fromkeys(ops, 64)
    assert op_table.token_groups(op_table.op_tokens("1024,cross_entropy=512", ops)) == \
        {1024: ["rms_norm", "rope"], 512: ["cross_entropy"]}
    assert op_table.provider_timeout("300,compile=900", "compile") == 900.0
    assert op_table.source_tag("d/ops-liger_cutedsl-kernel-8192_llama3-8b_h200_20261206.json") == \
        "llama3-8b_h200_20261206"


def test_a_process_cut_short_keeps_its_rows(op_table, tmp_path, monkeypatch):
    # tigon bench rewrites its JSON after every measurement: a timeout keeps the ops done, the rest say "timed out"
    def run(cmd, timeout, check, env, **kw):
        path = cmd[cmd.index("--json") + 1]
        with open(path, "w") as f:
            json.dump({"device": "GPU", "config": {"cuda_graph": False}, "skipped": [], "notes": [],
                       "rows": [{"op": "rms_norm", "provider": "tigon", "mode": "fwd_bwd", "ms": 0.5,
                                 "note": "", "size": "16384x4096"}]}, f)
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(subprocess, "run", run)
    op_table.main(["--ops", "rms_norm,layer_norm", "--providers", "tigon", "--bases", "host", "--timeout", "7",
                   "--out-dir", str(tmp_path)])
    (path,) = tmp_path.glob("op-table_*.json")
    cells = {e["op"]: e["cells"]["tigon"]["host"] for e in json.loads(path.read_text())["table"]["fwd_bwd"]}
    assert cells["rms_norm"]["ms"] == 0.5 and cells["layer_norm"]["status"] == "timed out"


@pytest.mark.slow
def test_tiny_run_on_cpu(op_table, tmp_path, monkeypatch, capsys):
    # the real thing: two tigon bench processes at 64 tokens of the tiny preset (a few seconds)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    op_table.main(["--model", "tiny", "--tokens", "64", "--providers", "eager,tigon", "--ops", "rms_norm",
                   "--bases", "host", "--gpu", "cpu", "--out-dir", str(tmp_path)])
    text = capsys.readouterr().out
    (path,) = tmp_path.glob("op-table_tiny_cpu_*.json")
    merged = json.loads(path.read_text())
    cells = merged["table"]["fwd_bwd"][0]["cells"]
    assert cells["eager"]["host"]["ms"] > 0 and cells["tigon"]["host"]["ms"] > 0, text
    assert merged["table"]["fwd_bwd"][0]["size"] == "64x128"
    assert [c["cmd"].split(" -m ")[1] for c in merged["commands"]] == [
        f"tigon.cli bench --op rms_norm --model tiny --tokens 64 --providers {p} --json "
        f"{tmp_path}/ops-{p}-host-64_tiny_cpu_{path.stem.rsplit('_', 1)[1]}.json --quiet" for p in ("eager", "tigon")]
    assert all(c["cmd"].startswith(sys.executable) for c in merged["commands"])
    assert path.with_suffix(".png").exists()
