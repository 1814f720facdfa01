"""tigon bench: op benchmarks (JSON/CSV/PNG, providers, errors) and the end-to-end training-step benchmark.

On CPU the kernels run in Triton's interpreter at tiny sizes: these tests check that every path runs and that the
reports hold what they promise, not the speed.
"""

import contextlib
import csv
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from tigon.cli import main
from tigon import ops
from tigon.workflows import bench as B

LIGER = importlib.util.find_spec("liger_kernel") is not None


def _rows(report, op, provider, mode=None):
    return [r for r in report["rows"] if r["op"] == op and r["provider"] == provider and (mode is None
                                                                                        or r["mode"] == mode)]


def test_bench_json_and_csv_have_rows_for_each_provider(tmp_path, capsys):
    js, cs = tmp_path / "b.json", tmp_path / "b.csv"
    rc = main(["bench", "--op", "rms_norm", "--op", "cross_entropy", "--providers", "eager,tigon,tigon_inplace,liger",
               "--tokens", "32", "--json", str(js), "--csv", str(cs), "--quiet"])
    assert rc == 0
    report = json.loads(js.read_text())
    assert report["config"]["ops"] == ["rms_norm", "cross_entropy"]
    expected = {"rms_norm": ["eager", "tigon"], "cross_entropy": ["eager", "tigon", "tigon_inplace"]}
    for op, providers in expected.items():
        for p in providers:
            rows = _rows(report, op, p)
            assert sorted(r["mode"] for r in rows) == ["bwd", "fwd", "fwd_bwd"], (op, p)
            for r in rows:
                assert r["ms"] > 0 and r["ms_p20"] <= r["ms"] <= r["ms_p80"], r
                if r["mode"] == "bwd" and p in ops.get(op).grads_in_forward:
                    assert r["gbps"] is None, r  # the forward formed the gradient: no bytes of its own
                else:
                    assert r["gbps"] > 0 and r["pct_copy_bw"] > 0, r
                assert r["shape"]["tokens"] == 32
                assert not r["note"].startswith("failed"), r["note"]
    assert not _rows(report, "rms_norm", "tigon_inplace")  # cross_entropy only
    if LIGER:
        assert _rows(report, "rms_norm", "liger", "fwd_bwd")[0]["ms"] > 0
    else:
        assert any(s.startswith("liger: not installed") for s in report["skipped"])
    assert report["ceilings"]["copy_gbps"] > 0 and report["ceilings"]["matmul_tflops"] > 0
    assert any("not meaningful" in n for n in report["notes"]) == (report["device"] == "cpu")
    with open(cs) as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(report["rows"])
    assert {ln["provider"] for ln in lines} == {"eager", "tigon", "tigon_inplace"} | ({"liger"} if LIGER else set())
    assert "rows=" in capsys.readouterr().out


def test_flce_reports_tflops_and_failures_are_recorded():
    def boom(gate, up, **_):
        raise RuntimeError("provider exploded")

    registry = dict(ops.registry(), swiglu=dataclasses.replace(ops.get("swiglu"), fn=boom))
    shapes = B.shapes_from_config({"hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 2,
                                   "vocab_size": 64}, tokens=16)
    seen = []  # on_rows sees the rows so far after each (op, provider, shape), failures included
    res = B.run_bench(["fused_linear_cross_entropy", "swiglu"], {op: [shapes[op]] for op in shapes},
                      ["eager", "tigon"], dtype=B.DTYPES["float32"], device="cpu", registry=registry,
                      on_rows=lambda r: seen.append(len(r.rows)))
    assert len(seen) == 4 and seen == sorted(seen) and seen[-1] == len(res.rows)
    flce = [r for r in res.rows if r.op == "fused_linear_cross_entropy" and r.mode == "fwd_bwd"]
    assert {r.provider for r in flce} == {"eager", "tigon"}
    assert all(r.tflops > 0 and r.pct_matmul > 0 and r.gbps is None for r in flce)
    failed = [r for r in res.rows if r.op == "swiglu" and r.provider == "tigon"]
    assert len(failed) == 1 and failed[0].ms is None and "provider exploded" in failed[0].note
    assert [r.ms > 0 for r in res.rows if r.op == "swiglu" and r.provider == "eager"] == [True] * 3


def test_sweep_writes_a_png_per_op(tmp_path, monkeypatch):
    js, plots = tmp_path / "s.json", tmp_path / "plots"
    monkeypatch.setitem(B.SIZES["cpu"], "sweep_tokens", [8, 16])  # CPU: two small points (interpreted; CI time)
    rc = main(["bench", "--op", "rms_norm,swiglu", "--providers", "eager,tigon", "--sweep", "tokens",
               "--plot-dir", str(plots), "--json", str(js), "--quiet"])
    assert rc == 0
    report = json.loads(js.read_text())
    sizes = B.SIZES[report["config"]["device"]]["sweep_tokens"]
    for op in ("rms_norm", "swiglu"):
        assert (plots / f"bench_{op}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        for p in ("eager", "tigon"):
            rows = _rows(report, op, p, "fwd_bwd")
            assert sorted(r["shape"]["tokens"] for r in rows) == sizes
            assert all(r["ms"] > 0 for r in rows)
    assert sorted(os.listdir(plots)) == ["bench_rms_norm.png", "bench_swiglu.png"]


@pytest.mark.parametrize(
    "args, match",
    [
        (["bench", "--op", "no_such_op"], "unknown op 'no_such_op'"),
        (["bench", "--providers", "eager,triton"], "unknown provider 'triton'"),
        (["bench", "--sweep", "hidden", "--op", "swiglu"], "row-wise ops only"),
        (["bench", "--model", "no-such-model"], "neither a preset"),
        (["bench", "--tokens", "0"], "--tokens"),
        (["bench", "--layers", "2"], "--layers needs --e2e"),
        (["bench", "--e2e", "--op", "rms_norm"], "does not apply to --e2e"),
        (["bench", "--e2e", "--providers", "original,eager"], "unknown provider 'eager' for --e2e"),
        (["bench", "--attn-implementation", "eager"], "--attn-implementation needs --e2e"),
        (["bench", "--e2e", "--attn-implementation", "fast"], "--attn-implementation 'fast': unknown attention"),
        (["bench", "--lora", "16"], "--lora needs --e2e"),
        (["bench", "--e2e", "--dtype", "float16"],
         "--dtype 'float16' is not available for whole training steps (bench --e2e, profile): choose from float32"),
        (["bench", "--e2e", "--lora", "0"], "--lora must be an integer >= 1"),
        (["bench", "--csv", "/no/such/dir/b.csv"], "does not exist"),
        (["bench", "--sweep", "vocab"], "invalid choice"),
    ],
)
def test_bad_input_is_one_line_exit_2(args, match, capsys):
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert match in err


def test_unknown_op_in_a_subprocess_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "tigon.cli", "bench", "--op", "nope"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "unknown op 'nope'" in proc.stderr and "rms_norm" in proc.stderr


def test_model_ops_and_config_sources(tmp_path):
    cfg, desc = B.config_dict("tiny")
    # what tigon.patch runs (its dry run): the MLP's glu_linear (swiglu only under activation checkpointing), the
    # fused LM-head loss (the plain cross_entropy only with patch(cross_entropy=True))
    assert B.model_ops("tiny") == ["rms_norm", "fused_add_rms_norm", "rope", "glu_linear", "fused_linear_cross_entropy"]
    assert desc["source"] == "preset:tiny"
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "config.json").write_text(json.dumps(dict(cfg, model_type="gemma2",
                                                                    hidden_activation="gelu_pytorch_tanh")))
    assert B.model_ops(str(tmp_path / "gemma")) == ["rms_norm", "rope", "glu_linear", "fused_linear_cross_entropy"]
    (tmp_path / "config.json").write_text(json.dumps(dict(cfg, hidden_size=64)))
    for src in (tmp_path, tmp_path / "config.json"):
        c, _ = B.config_dict(str(src))
        assert c["hidden_size"] == 64
    shapes = B.shapes_from_config(cfg, tokens=64, batch=4)
    assert shapes["rope"]["batch"] * shapes["rope"]["seq"] == shapes["rope"]["tokens"] == 64
    assert all(s["tokens"] == 64 for s in shapes.values())


def test_e2e_reports_tokens_per_s_for_original_and_tigon(tmp_path, capsys):
    js = tmp_path / "e.json"
    rc = main(["bench", "--e2e", "--model", "tiny", "--layers", "1", "--batch-size", "1", "--seq-len", "16",
               "--steps", "1", "--warmup", "1", "--providers", "original,tigon,liger", "--json", str(js), "--quiet"])
    assert rc == 0
    report = json.loads(js.read_text())
    rows = {r["provider"]: r for r in report["rows"]}
    for p in ("original", "tigon"):
        assert rows[p]["status"] == "ok", rows[p]["note"]
        assert rows[p]["tokens_per_s"] > 0 and rows[p]["step_ms"] > 0
        assert len(rows[p]["losses"]) == 2 and len(rows[p]["step_times_ms"]) == 2
        assert rows[p]["tokens_per_s"] == pytest.approx(16 / (rows[p]["step_ms"] * 1e-3))
    assert rows["tigon"]["losses"][0] == pytest.approx(rows["original"]["losses"][0], rel=1e-4)  # fp32
    assert rows["tigon"]["patch"]["rms_norm"] == 3 and rows["tigon"]["backend"] in ("interpreter", "triton")
    assert rows["original"]["backend"] == "none"
    assert report["speedup"]["original"] == 1.0 and report["speedup"]["tigon"] > 0
    assert report["model"]["num_hidden_layers"] == 1 and report["config"]["dtype"] in ("float32", "bfloat16")
    captured = capsys.readouterr()
    if not LIGER:
        assert rows["liger"]["status"] == "skipped"
        assert "liger skipped: liger_kernel is not installed" in captured.err  # --quiet still says why
    assert "original=" in captured.out and "tigon=" in captured.out


@contextlib.contextmanager
def fake_liger(tmp_path, monkeypatch, files: dict):
    """A stand-in ``liger_kernel`` package importable while the block runs: ``files`` maps paths under
    ``liger_kernel/transformers`` (``"__init__.py"``, ...) to their source; every ``liger_kernel`` module is dropped
    from ``sys.modules`` before and after, so that the real one (if installed) or none is seen again."""
    pkg = tmp_path / "liger_kernel" / "transformers"
    pkg.mkdir(parents=True)
    (tmp_path / "liger_kernel" / "__init__.py").write_text("")
    for name, source in files.items():
        (pkg / name).write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("liger_kernel")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n.startswith("liger_kernel")]:
            sys.modules.pop(name)


def test_e2e_liger_provider_runs_and_its_global_patches_are_undone(tmp_path, monkeypatch):
    """A stand-in liger_kernel that rebinds module globals and a class forward, as Liger does."""
    from transformers.models.llama import modeling_llama as M

    from tigon.workflows.e2e import E2EConfig, run_e2e

    source = (
        "import types\n"
        "from transformers.models.llama import modeling_llama as M\n"
        "def _apply_liger_kernel_to_instance(model=None, **kw):\n"
        "    rope, fwd = M.apply_rotary_pos_emb, M.LlamaForCausalLM.forward\n"
        "    M.apply_rotary_pos_emb = lambda *a, **k: rope(*a, **k)\n"
        "    M.LlamaForCausalLM.forward = lambda self, *a, **k: fwd(self, *a, **k)\n"
        "    M.LlamaRMSNorm.__name__ = 'LigerRMSNorm'\n"
        "    for m in model.modules():\n"
        "        if type(m).__name__ == 'LigerRMSNorm':\n"
        "            m.forward = types.MethodType(type(m).forward, m)\n")
    rope, fwd = M.apply_rotary_pos_emb, M.LlamaForCausalLM.forward
    with fake_liger(tmp_path, monkeypatch, {"__init__.py": source}):
        r = run_e2e(E2EConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0,
                              providers=["original", "liger"], dtype="float32"))
    rows = {x.provider: x for x in r.rows}
    assert rows["liger"].status == "ok", rows["liger"].note
    assert rows["liger"].tokens_per_s > 0 and rows["liger"].patch == {"modules with a Liger forward": 3}
    assert M.apply_rotary_pos_emb is rope and M.LlamaForCausalLM.forward is fwd
    assert M.LlamaRMSNorm.__name__ == "LlamaRMSNorm"
    assert any("restored" in n for n in r.notes)


def test_e2e_tigon_lean_and_attn_implementation(monkeypatch):
    """tigon_lean = tigon.patch with {"accum_dtype": model dtype}, tigon_low with {"memory": "low"};
    attn_implementation reaches from_config."""
    import torch

    import tigon.functional as TF
    from tigon.workflows.compare import ConfigError
    from tigon.workflows.e2e import E2E_PROVIDERS, E2EConfig, resolve_e2e, run_e2e

    assert E2E_PROVIDERS.index("tigon_lean") < E2E_PROVIDERS.index("liger")  # liger rebinds globals: last
    seen, real = [], TF.fused_linear_cross_entropy

    def spy(*args, **kwargs):
        seen.append((kwargs.get("accum_dtype"), kwargs.get("memory", "auto")))
        return real(*args, **kwargs)

    monkeypatch.setattr(TF, "fused_linear_cross_entropy", spy)
    r = run_e2e(E2EConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0, dtype="bfloat16",
                          providers=["tigon_low,tigon_lean,original,tigon"], attn_implementation="eager"))
    rows = {x.provider: x for x in r.rows}
    assert [x.provider for x in r.rows] == ["original", "tigon", "tigon_lean", "tigon_low"]
    for p in ("original", "tigon", "tigon_lean", "tigon_low"):
        assert rows[p].status == "ok", rows[p].note
    for p in ("tigon_lean", "tigon_low"):
        assert rows[p].patch == rows["tigon"].patch and rows[p].patch["lm_head_loss"] == 1
        assert rows[p].losses[0] == pytest.approx(rows["tigon"].losses[0], rel=1e-3)
    # one training step each of tigon, tigon_lean and tigon_low
    assert seen == [(None, "auto"), (torch.bfloat16, "auto"), (None, "low")]
    report = r.as_dict()
    assert report["config"]["attn_implementation"] == "eager" and report["model"]["attn_implementation"] == "eager"
    with pytest.raises(ConfigError, match="--attn-implementation 'fast'"):
        resolve_e2e(E2EConfig(attn_implementation="fast"))
    for name in (None, "eager", "sdpa", "kernels-community/flash-attn"):
        assert resolve_e2e(E2EConfig(attn_implementation=name)).attn_implementation == name


def test_e2e_lora_wraps_every_provider_and_tigon_fuses_the_lora_layers():
    """--lora R: PEFT LoRA on q/k/v/o/gate/up/down for every provider, head frozen; tigon also fuses the LoRA layers."""
    pytest.importorskip("peft")
    from tigon.workflows.e2e import E2EConfig, run_e2e

    r = run_e2e(E2EConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0, dtype="float32",
                          providers=["original,tigon"], lora_rank=4))
    rows = {x.provider: x for x in r.rows}
    for p in ("original", "tigon"):
        assert rows[p].status == "ok", rows[p].note
    assert rows["tigon"].patch["lora"] == 7 and rows["tigon"].backends["lora_linear"]
    assert rows["tigon"].backends["lora_glu_mlp"]  # the MLP with its three LoRA projections as one node
    assert rows["tigon"].losses[0] == pytest.approx(rows["original"].losses[0], rel=1e-4)
    assert r.as_dict()["config"]["lora_rank"] == 4 and any("LoRA r=4" in n for n in r.notes)


def test_e2e_gradient_checkpointing_is_enabled_before_the_patch():
    """--gradient-checkpointing: checkpointing on every provider's model (here the original: the patched model under
    checkpointing is tests/test_checkpointing.py's), recorded in the config, the row and the notes; the selective
    policy within --checkpoint-budget-gb; bad values raise."""
    from tigon.workflows.compare import ConfigError
    from tigon.workflows.e2e import E2EConfig, resolve_e2e, run_e2e

    import tigon.workflows.e2e as e2e

    seen, real = [], e2e.enable_checkpointing

    def spy(model, mode, batch, budget_gb=None):
        seen.append((mode, batch, budget_gb))
        plan = real(model, mode, batch, budget_gb)
        assert model.is_gradient_checkpointing
        return plan

    e2e.enable_checkpointing = spy
    try:
        r = run_e2e(E2EConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0, dtype="float32",
                              providers=["original"], gradient_checkpointing="reentrant"))
        s = run_e2e(E2EConfig(model="tiny", layers=2, batch_size=1, seq_len=8, steps=1, warmup=0, dtype="float32",
                              providers=["original"], gradient_checkpointing="selective", checkpoint_budget_gb=1.0))
    finally:
        e2e.enable_checkpointing = real
    row = r.rows[0]
    assert row.status == "ok", row.note
    assert seen == [("reentrant", (1, 8), None), ("selective", (1, 8), 1.0)]
    assert row.mfu is None and row.kernel_summary is None  # CPU: no matmul ceiling, no profile
    assert r.as_dict()["config"]["gradient_checkpointing"] == "reentrant"
    assert row.checkpointing["policy"] == "full" and row.checkpointing["reentrant"] is True
    assert any("gradient checkpointing (reentrant)" in n for n in r.notes)
    sel = s.rows[0]
    assert sel.status == "ok", sel.note
    # 1 GiB is plenty: both layers keep every projection but the down projection, and the attention (sdpa)
    assert [len(lp["kept"]) for lp in sel.checkpointing["layers"]] == [7, 7] and sel.checkpointing["kept_bytes"] > 0
    assert any("gradient checkpointing (selective)" in n and "keep self_attn.q_proj" in n for n in s.notes)
    with pytest.raises(ConfigError, match="--gradient-checkpointing must be one of"):
        resolve_e2e(E2EConfig(gradient_checkpointing="yes"))
    with pytest.raises(ConfigError, match="--checkpoint-budget-gb"):
        resolve_e2e(E2EConfig(gradient_checkpointing="non_reentrant", checkpoint_budget_gb=1.0))
    with pytest.raises(ConfigError, match="--checkpoint-budget-gb"):
        resolve_e2e(E2EConfig(gradient_checkpointing="selective", checkpoint_budget_gb=-1))
    with pytest.raises(ConfigError,
                       match="--checkpoint-budget-gb applies to .* got --gradient-checkpointing not given"):
        resolve_e2e(E2EConfig(checkpoint_budget_gb=1.0))
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="--checkpoint-budget-gb must be a finite number"):
            resolve_e2e(E2EConfig(gradient_checkpointing="selective", checkpoint_budget_gb=bad))
    with pytest.raises(ConfigError, match="--kernel-summary needs a CUDA device"):
        resolve_e2e(E2EConfig(device="cpu", kernel_summary=True))


def test_step_trace_sums_kernels_by_name_and_kind():
    """The kernel summary of a profiled step: CUDA kernels summed by name, sorted, grouped by kind; CPU events and
    user annotations left out."""
    from types import SimpleNamespace

    from tigon.workflows.step_trace import kind_of, summarize

    def ev(name, us, device="DeviceType.CUDA", annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation,
                               time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [ev("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 900.0), ev("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT",
              100.0), ev("_norm_fwd", 50.0), ev("flash_fwd_kernel", 300.0),
              ev("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", 10.0),
              ev("void at::native::reduce_kernel<512, 1>", 20.0), ev("aten::mm", 5000.0, device="DeviceType.CPU"),
              ev("step", 9999.0, annotation=True)]
    s = summarize(events, top=3)
    assert s["device_ms"] == pytest.approx(1.38)
    assert s["by_kind"] == pytest.approx({"matmul": 1.0, "triton": 0.05, "attention": 0.3, "copy_fill": 0.01,
                                          "other": 0.02})
    assert [r["name"][:5] for r in s["top"]] == ["nvjet", "flash", "_norm"] and s["top"][0]["calls"] == 2
    assert kind_of("_rms_norm_forward_kernel") == "triton" and kind_of("triton_poi_fused_add_0") == "triton"
    k = SimpleNamespace(name="nvjet_tst", duration=400.0)
    mm = SimpleNamespace(name="aten::mm", input_shapes=[[8, 4], [4, 3]], kernels=[k], device_type="DeviceType.CPU",
                         is_user_annotation=False, time_range=SimpleNamespace(elapsed_us=lambda: 1.0))
    ops = summarize([mm, mm])["matmul_ops"]
    assert ops == [{"op": "aten::mm", "shapes": "[[8, 4], [4, 3]]", "calls": 2, "ms": 0.8, "kernels": ["nvjet_tst"]}]


def test_cuda_graph_timing_needs_cuda():
    import torch

    from tigon.cli import main

    if torch.cuda.is_available():
        pytest.skip("checks the CPU refusal")
    assert main(["bench", "--cuda-graph", "--quiet"]) == 2


def test_glu_linear_case():
    # eager and tigon agree; the op is FLOP-rated (matmul-bound), and model shapes include it
    shape = {"tokens": 8, "intermediate": 24, "hidden": 16}
    spec = ops.get("glu_linear")
    inp = spec.make_inputs(shape, torch.float32, torch.device("cpu"), torch.Generator().manual_seed(0))
    prov = B.op_providers(spec)
    torch.testing.assert_close(prov["tigon"](**inp), prov["eager"](**inp), rtol=1e-5, atol=1e-6)
    assert spec.flops_of(shape, "fwd_bwd") == 6 * 8 * 24 * 16 and spec.bytes_moved(shape, 2, "fwd") is None
    assert "glu_linear" in B.shapes_from_config({"hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 2,
                                                 "vocab_size": 50})


def test_rotation_sets_cover_several_l2_caches(monkeypatch):
    class Props:
        L2_cache_size = 50 * 2**20

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    cuda = torch.device("cuda")
    assert B.rotation_sets(10 * 2**20, cuda) == 20  # 20 x 10 MiB = 4 x 50 MiB
    assert B.rotation_sets(2**30, cuda) == 1
    assert B.rotation_sets(1024, cuda) == 64  # capped
    assert B.rotation_sets(10 * 2**20, torch.device("cpu")) == 1


def test_bench_one_rotates_input_sets(monkeypatch):
    # each timed call gets the next set; every set's leaves are reset; the rows still hold one value per mode
    monkeypatch.setattr(B, "rotation_sets", lambda nbytes, device: 3)
    seen = []
    spec = ops.get("rms_norm")
    orig = spec.eager_fn

    def spy(**kw):
        seen.append(id(kw["x"]))
        return orig(**kw)

    shape = {"tokens": 4, "hidden": 8}
    rows = B.bench_one(dataclasses.replace(spec, eager=spy), "eager", shape, torch.float32, torch.device("cpu"), {},
                       {}, modes=("fwd", "fwd_bwd"))
    assert [r.mode for r in rows] == ["fwd", "fwd_bwd"] and all(r.ms > 0 for r in rows)
    assert len(set(seen)) == 3


def test_bwd_of_providers_forming_the_gradient_in_the_forward_is_not_rated():
    shape = {"tokens": 4, "vocab": 64}
    rows = B.bench_one(ops.get("cross_entropy"), "tigon_fwdgrad", shape, torch.float32, torch.device("cpu"),
                       {"copy_gbps": 100.0}, {}, modes=("fwd", "bwd", "fwd_bwd"))
    by = {r.mode: r for r in rows}
    assert by["bwd"].gbps is None and by["bwd"].pct_copy_bw is None
    assert by["fwd"].gbps and by["fwd_bwd"].gbps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the profiler's kernel times need CUDA")
def test_cuda_graph_times_host_syncing_providers_by_their_kernels():
    # a provider that reads a value back on the host cannot be captured: its rows are the kernels' summed durations
    def syncing(x):
        scale = float(x.detach().abs().max().item())  # a host sync, as Liger's cross-entropy has
        return x * scale

    spec = dataclasses.replace(
        ops.get("rms_norm"), name="synced", make_inputs=lambda s, dtype, device, gen: {
            "x": torch.randn((s["tokens"], 4096), dtype=dtype, device=device, generator=gen)},
        grad_inputs=("x",), fn=lambda x: x * 2.0, cases=(ops.Case(),), peers={"synced": syncing},
        host_syncs=("synced",), size_label=lambda s: f"{s['tokens']}x4096",
        min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 4) * s["tokens"] * 4096 * e)
    rows = {p: B.bench_one(spec, p, {"tokens": 2048}, torch.bfloat16, torch.device("cuda"), {}, {},
                           ("fwd", "fwd_bwd"), cuda_graph=True) for p in ("tigon", "synced")}
    rows["captured"] = rows.pop("tigon")
    assert all(r.ms and r.ms > 0 for rs in rows.values() for r in rs)
    assert {r.note for r in rows["synced"]} == {B.KERNEL_TIME_NOTE}
    assert {r.note for r in rows["captured"]} == {""}
    # the same bytes plus two small reductions: the summed kernel durations land near the captured op's replay time,
    # not at a host-bound figure or a placeholder (loose bounds: the reductions add kernels, the sum drops gaps)
    for mode in ("fwd", "fwd_bwd"):
        synced, captured = (next(r.ms for r in rows[p] if r.mode == mode) for p in ("synced", "captured"))
        assert 0.3 < synced / captured < 10, (mode, synced, captured)


def test_e2e_compiled_providers(monkeypatch):
    """original_compile / tigon_compile / tigon_compile_kernels: torch.compile of the (patched) model, Tigon's compile
    mode set for the run and put back; on the CPU they are not in the default provider list (no Inductor runs)."""
    import torch

    from tigon import support
    from tigon.workflows.e2e import E2EConfig, resolve_e2e, run_e2e

    assert not any("compile" in p for p in resolve_e2e(E2EConfig(device="cpu")).providers)
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: real(m, backend="aot_eager"))  # no codegen on CPU
    monkeypatch.setenv("TIGON_COMPILE_OPS", "auto")
    r = run_e2e(E2EConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0, dtype="float32",
                          providers=["tigon_compile_kernels,original_compile,tigon_compile"]))
    rows = {x.provider: x for x in r.rows}
    assert list(rows) == ["original_compile", "tigon_compile", "tigon_compile_kernels"]
    for row in rows.values():
        assert row.status == "ok", row.note
    assert list(rows["tigon_compile"].backends["rms_norm"]) == ["inductor"]
    assert list(rows["tigon_compile"].backends["fused_linear_cross_entropy"]) != ["inductor"]  # the loss's kernel
    assert "inductor" not in rows["tigon_compile_kernels"].backends["rms_norm"]
    assert rows["tigon_compile"].losses[0] == pytest.approx(rows["original_compile"].losses[0], rel=1e-4)
    assert support.compile_mode() == "auto"


def test_mfu_counts_matmul_parameters():
    # the input embedding is a lookup: left out of the MFU numerator unless tied to the head (Qwen2.5-0.5B)
    from tigon.presets import build_config
    from tigon.workflows.e2e_models import model_info

    llama, qwen = model_info(build_config("llama3-8b"), "preset"), model_info(build_config("qwen2.5-0.5b"), "preset")
    assert llama["num_parameters"] - llama["matmul_parameters"] == 128256 * 4096
    assert qwen["matmul_parameters"] == qwen["num_parameters"]


def test_view_inputs_become_leaves_of_their_own():
    # q / k are drawn as views of a projection's layout; CUDA-graph timing detaches its leaves in place, which a view
    # refuses ("Can't detach views in-place"): the bench gives them storage of their own, strides kept.
    spec = ops.get("rope_interleaved")
    shape = B.shapes_from_config({"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
                                  "vocab_size": 64}, tokens=16)["rope_interleaved"]
    gen = torch.Generator()
    gen.manual_seed(0)
    drawn = spec.make_inputs(shape, torch.float32, torch.device("cpu"), gen, **spec.bench_inputs)
    made = B._make(spec, shape, torch.float32, torch.device("cpu"))
    for k in spec.grad_inputs:
        assert drawn[k]._is_view() and not made[k]._is_view() and made[k].is_leaf and made[k].requires_grad
        assert made[k].stride() == drawn[k].stride()
        made[k].detach_()


def test_e2e_cpu_run_too_large_for_the_host_memory_is_refused_before_building(monkeypatch):
    # the check tigon compare runs (host_memory.check_config_fits), before any model is built: a GPT-OSS config on a
    # CPU was killed silently at 24 GB without it
    from tigon.workflows import e2e as E
    from tigon.workflows import host_memory
    from tigon.workflows.compare import ConfigError

    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**20)  # 1 MiB: not even the tiny model
    monkeypatch.setattr(E, "build_model", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(ConfigError, match=r"^--model tiny --layers 1 needs at least .* choose a smaller preset"):
        E.run_e2e(E.E2EConfig(model="tiny", layers=1, batch_size=1, seq_len=8, steps=1, warmup=0, device="cpu",
                              providers=["original"]))
