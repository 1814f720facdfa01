"""`tigon verify`: Tigon vs the original PyTorch code vs float64, on a model's shapes; the fallback is exact."""

import dataclasses
import json
import math

import pytest
import torch

from tigon import functional as F
from tigon import ops
from tigon.cli import main
from tigon.presets import build_config
from tigon.workflows import verify as V

KERNEL_BACKEND = "triton" if torch.cuda.is_available() else "interpreter"
ROW_KEYS = {"op", "dtype", "shape", "tensor", "tigon_err", "original_err", "tigon_max_abs", "original_max_abs",
            "bound", "passed"}

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def _noisy_swiglu(gate, up):
    """A wrong op: the right values plus 1e-2 noise."""
    out = F.swiglu(gate, up)
    return out + 1e-2 * torch.randn_like(out)


def _bad_grad_swiglu(gate, up):
    """A wrong backward: exact forward values, but the gradient of gate is scaled by 1.01."""
    g = gate + (0.01 * gate - (0.01 * gate).detach())
    return F.swiglu(g, up)


def _crashing(gate, up):
    raise RuntimeError("kernel exploded")


@pytest.fixture
def broken_ops(monkeypatch):
    """The op registry plus three wrong variants of swiglu (the CLI and verify read the registry)."""
    real = ops.registry()
    base = real["swiglu"]
    names = {"noisy_swiglu": _noisy_swiglu, "bad_grad_swiglu": _bad_grad_swiglu, "crashing_swiglu": _crashing}
    extended = {**real, **{name: dataclasses.replace(base, name=name, fn=fn) for name, fn in names.items()}}
    monkeypatch.setattr(ops, "registry", lambda: dict(extended))


def test_verify_tiny_passes_fp32_and_bf16(tmp_path, capsys):
    path = tmp_path / "verify.json"
    # no --model: every op, on the default model's shapes (tiny on CPU)
    rc = main(["verify", "--dtype", "float32,bfloat16", "--json", str(path), "--quiet"])
    r = json.loads(path.read_text())
    assert rc == 0, [row for row in r["results"] if not row["passed"]] or r["errors"] or r["fallback"]
    assert r["passed"] is True and r["errors"] == []
    assert r["backend"] == KERNEL_BACKEND
    assert r["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    rows = r["results"]
    assert all(ROW_KEYS <= set(row) for row in rows)
    assert {row["op"] for row in rows} == set(ops.registry())
    assert {row["dtype"] for row in rows} == {"float32", "bfloat16"}
    # every output and every gradient, Tigon and the original, against float64
    tensors = {(row["op"], row["tensor"]) for row in rows}
    assert {("rms_norm", "out"), ("rms_norm", "grad_x"), ("rms_norm", "grad_weight"), ("rope", "out1"),
            ("rope", "grad_k"), ("fused_linear_cross_entropy", "grad_weight")} <= tensors
    # the loss options are separate rows
    cases = {row["case"] for row in rows if row["op"] == "fused_linear_cross_entropy"}
    assert cases == {"default", "ignore_index=-100", "label_smoothing=0.1", "z_loss=1e-4", "softcap=5.0",
                     "reduction=none", "memory=low"}
    # model shapes and odd shapes (hidden not a power of two)
    assert r["shapes"]["model"]["hidden"] == 128 and r["shapes"]["odd"]["hidden"] == 97
    assert {row["variant"] for row in rows} == {"model", "odd"}
    assert all(math.isfinite(row["original_max_abs"]) and math.isfinite(row["tigon_max_abs"]) for row in rows)
    # fp32 holds ~1e-5 relative, or the plain fp32 computation's own error where that is larger: an ill-conditioned
    # output (fused_linear_dpo_loss's "robust + nll" reference-free out4, a difference of nearly equal log-prob sums,
    # measured 1.59e-5 for both Tigon and the original)
    assert all(row["tigon_err"] <= max(1e-5, row["original_err"]) for row in rows if row["dtype"] == "float32")
    assert all(row["bound"] == max(2 * row["original_err"], row["bound"]) for row in rows)
    # the fallback: under force_reference Tigon equals the reference bit for bit
    assert r["fallback"] and all(f["equal"] for f in r["fallback"])
    assert "passed" in capsys.readouterr().out


def test_verify_fails_on_a_wrong_op(broken_ops, tmp_path, capsys):
    path = tmp_path / "verify.json"
    rc = main(["verify", "--op", "noisy_swiglu", "--op", "bad_grad_swiglu", "--dtype", "float32,bfloat16",
               "--json", str(path)])
    assert rc == 1
    r = json.loads(path.read_text())
    assert r["passed"] is False
    failed = {(row["op"], row["tensor"], row["dtype"]) for row in r["results"] if not row["passed"]}
    for dtype in ("float32", "bfloat16"):
        assert ("noisy_swiglu", "out", dtype) in failed
        assert ("bad_grad_swiglu", "grad_gate", dtype) in failed
        assert ("bad_grad_swiglu", "out", dtype) not in failed  # its forward is right
    # a wrong op is also not the reference under force_reference
    bad_fallback = {(f["op"], tuple(f["mismatched"])) for f in r["fallback"] if not f["equal"]}
    assert ("noisy_swiglu", ("out",)) in bad_fallback and ("bad_grad_swiglu", ("grad_gate",)) in bad_fallback
    assert "FAIL" in capsys.readouterr().out


def test_verify_records_a_crashing_op_and_reports_progress(broken_ops):
    calls = []
    result = V.run_verify(V.VerifyConfig(ops=["crashing_swiglu", "swiglu"], dtypes=["float32"]),
                          progress=lambda *a: calls.append(a))
    assert not result.passed
    # one error per shape (the model's and the odd one) and swiglu case but the in-place one (Case(), the
    # Falcon-H1 multipliers, DeepSeek-V4's limit)
    assert [e["op"] for e in result.errors] == ["crashing_swiglu"] * 6
    assert "kernel exploded" in result.errors[0]["error"]
    assert all(row["passed"] for row in result.results) and {r["op"] for r in result.results} == {"swiglu"}
    assert calls[0][:2] == (0, 12) and calls[-1] == (12, 12, "done")  # 2 ops x 3 cases x 2 shapes


def test_verify_caps_the_vocabulary_on_cpu(tmp_path):
    shapes, caps = V.shapes_from_config(build_config("llama3-8b"), tokens=64, max_vocab=2048)
    assert shapes.vocab == 2048 and shapes.hidden == 4096 and shapes.head_dim == 128 and shapes.kv_heads == 8
    assert caps and "128256" in caps[0]
    odd = shapes.odd()
    assert odd.hidden % 2 == 1 and odd.tokens % 2 == 1 and odd.head_dim % 2 == 0
    assert odd.head_dim & (odd.head_dim - 1) != 0
    full, none = V.shapes_from_config(build_config("llama3-8b"), tokens=64, max_vocab=0)
    assert full.vocab == 128256 and none == []
    if not torch.cuda.is_available():
        cfg = V.resolve_config(V.VerifyConfig())
        assert (cfg.model, cfg.tokens, cfg.max_vocab, cfg.device) == ("tiny", V.CPU_TOKENS, V.CPU_MAX_VOCAB, "cpu")
        path = tmp_path / "v.json"
        assert main(["verify", "--model", "llama3-8b", "--op", "rms_norm", "--dtype", "float32", "--tokens", "8",
                     "--json", str(path), "--quiet"]) == 0
        r = json.loads(path.read_text())
        assert r["caps"] and "128256" in r["caps"][0] and r["shapes"]["model"]["vocab"] == V.CPU_MAX_VOCAB
        assert r["results"][0]["shape"] == "x 8x4096, weight 4096"


@pytest.mark.parametrize("args, match", [
    (["--op", "nope"], "unknown op"),
    (["--dtype", "float64"], "--dtype: unknown dtype 'float64' (choose from float32"),
    (["--tokens", "1"], "--tokens"),
    (["--model", "no-such-model"], "neither a preset"),
])
def test_verify_bad_input_is_one_line_exit_2(args, match, capsys):
    assert main(["verify", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and match in lines[0]


def test_verify_model_checks_only_the_ops_patch_runs(tmp_path, capsys):
    # a Llama: its norms, fused residual add + norm, rotary, the MLP (down projection folded in) and the fused LM-head
    # loss; not layer_norm, geglu or the plain cross-entropy, which tigon.patch does not run there
    runs = {"rms_norm", "fused_add_rms_norm", "rope", "glu_linear", "fused_linear_cross_entropy"}
    cfg = V.resolve_config(V.VerifyConfig(model="tiny"))
    assert cfg.model_ops and cfg.ops == [op for op in ops.registry() if op in runs]
    assert V.resolve_config(cfg) == cfg  # resolving again changes nothing
    assert V.resolve_config(V.VerifyConfig()).ops == list(ops.registry())  # no model given: every op
    assert main(["verify", "--model", "tiny", "--op", "layer_norm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tigon.patch runs no layer_norm in tiny" in err[0]
    # GPT-NeoX: LayerNorm, partial rotary, a non-gated MLP (act_linear), the LM head's fused loss
    from transformers import GPT2Config, GPTNeoXConfig

    GPTNeoXConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                  vocab_size=300).to_json_file(str(tmp_path / "neox.json"))
    assert V.resolve_config(V.VerifyConfig(model=str(tmp_path / "neox.json"))).ops == [
        "layer_norm", "rope", "act_linear", "fused_linear_cross_entropy"]
    # GPT-2: tigon.patch replaces nothing: nothing to verify, said on one line, exit status 2
    GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=256).to_json_file(str(tmp_path / "gpt2.json"))
    assert main(["verify", "--model", str(tmp_path / "gpt2.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to verify" in err[0] and "GPT2LMHeadModel" in err[0]


def test_original_max_abs_comes_from_compares_own_evaluations():
    # verify reads the original's max-abs error out of compare()'s own runs; it must equal measuring it directly
    from tigon.numerics import compare

    spec = ops.get("rms_norm")
    shapes = ops.ModelShapes(tokens=8, hidden=40, intermediate=64, heads=2, kv_heads=1, head_dim=8, vocab=50)
    inputs = spec.make_inputs(spec.shape_of(shapes), torch.bfloat16, torch.device("cpu"),
                              torch.Generator().manual_seed(0))
    recorder = V._Recorder(spec.original, spec.grad_inputs)
    compare(spec.fn, recorder, inputs, spec.grad_inputs)
    direct = {c.tensor: c.tigon_max_abs for c in compare(spec.original, spec.original, inputs, spec.grad_inputs)}
    assert recorder.max_abs() == direct and set(direct) == {"out", "grad_x", "grad_weight"}


def test_verify_all_among_op_names():
    cfg = V.resolve_config(V.VerifyConfig(ops=["all,rms_norm"]))
    assert cfg.ops == list(ops.registry())
    assert V.resolve_config(V.VerifyConfig(ops=None)).ops == list(ops.registry())


def test_cross_entropy_flag_cases_are_registered_and_pass_on_cpu():
    # class weights, inplace_backward and grad_in_forward (upstream 1: what it is for) are verify rows
    from tigon.workflows import verify as V

    cases = {c.label: c for c in ops.get("cross_entropy").cases_tagged("verify")}
    assert {"weight", "inplace_backward=True", "grad_in_forward=True (upstream 1)"} <= set(cases)
    assert cases["grad_in_forward=True (upstream 1)"].unit_upstream and not cases["weight"].unit_upstream
    res = V.run_verify(V.VerifyConfig(ops=["cross_entropy"], dtypes=["float32", "bfloat16"]))
    rows = [r for r in res.results if r["case"] in ("weight", "inplace_backward=True",
                                                     "grad_in_forward=True (upstream 1)")]
    assert len(rows) == 3 * 2 * 2 and all(r["passed"] for r in rows)  # 3 cases x 2 dtypes x (out, grad_logits)
    assert not res.errors


def test_summary_prints_the_originals_brackets_literally(capsys, monkeypatch):
    # the originals' names hold indexing ("[inv_perm]", "[perm // top_k]"): printed as text, not read as rich markup
    monkeypatch.setenv("COLUMNS", "240")
    assert main(["verify", "--op", "moe_combine,moe_gather", "--dtype", "float32", "--tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert "moe_combine: (out + bias[ids]) * w, [inv_perm]," in out  # the summary's row (the table titles escape)
    assert "moe_gather: hidden_states[perm // top_k]" in out
