"""torch.compile of the post-training losses whose LM-head gradients are formed in the forward (GRPO family,
preference losses): the ``tigon::formed_head_grads`` custom op (tigon.ops.formed_grads) keeps them at 3 head matmuls
inside a compiled graph, as eager.

Each loss is compiled with ``fullgraph=True`` (a graph break raises) and ``backend="aot_eager"`` (dynamo +
AOTAutograd, no inductor codegen: fast on CPU, as tests/test_compile.py) and checked against the same call eager:
loss, every metric / aux output and every gradient (fp32, 1e-5), the head matmuls of a forward + backward (read from
the profiler: a dispatch mode stops dynamo from running compiled frames), and a second backward that raises. Every
preference loss is also compiled as ``tigon bench``'s ``tigon_compile`` compiles DPO: the call as it is (no
fullgraph, compile mode "auto"), its output NamedTuple returned, in one graph.
"""

from __future__ import annotations

import pytest
import torch

import tigon.kernels.fused_linear_cross_entropy as flce_ops
import tigon.kernels.loss_rows as loss_rows
from tigon import functional as F
from tigon.numerics import rel_l2
from tigon.ops import preference as P
from tigon.ops.formed_grads import decode, encode
from tigon.ops.fused_linear_grpo import RECORDS as GRPO_RECORDS
from tigon.workflows.matmul_count import head_matmuls

GRPO_SHAPE = {"tokens": 12, "batch": 3, "hidden": 16, "vocab": 37}  # 3 completions of 4 tokens
PAIRS, T, H, V = 3, 5, 16, 40


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    # the kernels as custom ops inside the graph; vocabulary blocks of 16 and chunks of 8 GRPO tokens / one DPO pair,
    # so that the chunk loops run several times
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 16)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 10 * V)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CUDA", 10 * V)
    monkeypatch.setattr(flce_ops, "compiled_cuda", lambda device: False)  # (the CUDA rule never goes under 16 rows)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(fn):
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


def _grpo_inputs(device, **build):
    gen = torch.Generator(device="cpu").manual_seed(1)
    return GRPO_RECORDS[0].make_inputs(GRPO_SHAPE, torch.float32, device, gen, **build)


def _pair_inputs(device, labels=False, **build):
    gen = torch.Generator(device="cpu").manual_seed(2)
    inp = P._inputs({"tokens": 2 * PAIRS * T, "hidden": H, "vocab": V}, torch.float32, device, gen, pairs=PAIRS,
                    ignore_every=4, **build)
    inp["target"][:, :2] = -100  # a prompt
    if labels:  # KTO's (unpaired) labels and KL estimate
        inp["preference_labels"] = torch.tensor([True, False, True, True, False, True], device=device)
        inp["kl"] = torch.tensor(0.3, device=device)
    return inp


GRADS = ("_input", "hidden", "weight", "bias")

GRPO_CASES = {
    # loss type, its options, the inputs' builder options, extra head matmuls (a reference model's own pass)
    "dapo, entropy": (dict(compute_entropy=True), dict(), 0),
    "grpo, clipped": (dict(loss_type="grpo"), dict(old=True), 0),
    "bnpo, ref_input, temperature": (dict(loss_type="bnpo", temperature=0.7), dict(ref="input"), 1),
    "dr_grpo, sequence level, bias": (dict(loss_type="dr_grpo", max_completion_length=4,
                                           importance_sampling_level="sequence"), dict(old=True, bias=True), 0),
}

PAIR_CASES = {
    "dpo sigmoid, reference model in the same pass": (F.fused_linear_dpo_loss, dict(), dict(reference="model"), 1),
    "dpo ipo + sft, nll, averaged, bias": (F.fused_linear_dpo_loss,
                                           dict(loss_type=["ipo", "sft"], compute_nll_loss=True,
                                                average_log_prob=True), dict(reference="logps", bias=True), 0),
    "kto, reference model": (P.fused_linear_kto_loss, dict(), dict(reference="model", labels=True), 1),
}


def _call(kind, case, inputs):
    """(fn(**leaves) -> outputs, the leaves' names) of a case; outputs: a tuple of tensors (loss first)."""
    if kind == "grpo":
        opts = dict(GRPO_CASES[case][0], return_metrics=True)

        def fn(**kw):
            out = F.fused_linear_grpo(**kw, **opts)
            return (out.loss, *out.metrics.values())
    else:
        loss_fn, opts = PAIR_CASES[case][:2]

        def fn(**kw):
            return tuple(loss_fn(**kw, **opts))
    return fn


def _run(fn, inputs, leaves=GRADS, count=False, dims=None):
    """(outputs, grads by name, head matmuls or None) of a forward + backward of ``fn`` on fresh leaf copies."""
    got = {k: (v.detach().clone().requires_grad_(k in leaves) if v.is_floating_point() else v)
           for k, v in inputs.items()}
    out = []

    def step():
        out.append(fn(**got))
        out[0][0].backward()

    matmuls = head_matmuls(step, *dims, compiled=True) if count else step()
    return out[0], {k: got[k].grad for k in leaves if k in got and got[k].grad is not None}, matmuls


def _cases():
    return [("grpo", c) for c in GRPO_CASES] + [("pairs", c) for c in PAIR_CASES]


@pytest.mark.parametrize("kind,case", _cases())
def test_compiled_formed_loss_equals_eager_in_three_head_matmuls(kind, case, device):
    # fullgraph (no graph break), the loss, every metric and every gradient as eager's, and 3 head matmuls (+1 for a
    # reference model), compiled and eager
    if kind == "grpo":
        build, extra = GRPO_CASES[case][1], GRPO_CASES[case][2]
        inputs = _grpo_inputs(device, **build)
        dims = (GRPO_SHAPE["tokens"], GRPO_SHAPE["hidden"], GRPO_SHAPE["vocab"])
    else:
        build, extra = PAIR_CASES[case][2], PAIR_CASES[case][3]
        inputs = _pair_inputs(device, **build)
        dims = (2 * PAIRS * T, H, V)
    fn = _call(kind, case, inputs)
    eager, eager_grads, eager_mm = _run(fn, inputs, count=True, dims=dims)
    compiled = _compiled(fn)
    _run(compiled, inputs)  # (compiles)
    got, grads, mm = _run(compiled, inputs, count=True, dims=dims)
    assert eager_mm == mm == 3 + extra, (eager_mm, mm)
    assert len(got) == len(eager)
    for i, (a, b) in enumerate(zip(got, eager)):
        assert rel_l2(a.double(), b.double()) <= 1e-5, (i, a, b)
    assert set(grads) == set(eager_grads) and len(grads) >= 2
    for k in grads:
        assert rel_l2(grads[k].double(), eager_grads[k].double()) <= 1e-5, k


@pytest.mark.parametrize("kind,case", [("grpo", "dapo, entropy"), ("grpo", "dr_grpo, sequence level, bias"),
                                       ("pairs", "dpo sigmoid, reference model in the same pass")])
def test_compiled_with_dynamic_shapes_in_one_graph(kind, case, device):
    # torch.compile(dynamic=True): the losses' float (and int) options are symbolic there, and the options string of
    # the tigon::formed_head_grads custom op formatted them, a graph break ("BUILD_STRING type error"); now
    # specialised, fullgraph holds and the loss and gradients equal eager's
    torch._dynamo.reset()
    build = GRPO_CASES[case][1] if kind == "grpo" else PAIR_CASES[case][2]
    inputs = (_grpo_inputs if kind == "grpo" else _pair_inputs)(device, **build)
    fn = _call(kind, case, inputs)
    eager, eager_grads, _ = _run(fn, inputs)
    got, grads, _ = _run(torch.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True), inputs)
    torch.testing.assert_close(got[0], eager[0], rtol=1e-5, atol=1e-7)
    for k, g in eager_grads.items():
        assert rel_l2(grads[k], g) <= 1e-5, (k, rel_l2(grads[k], g))
    torch._dynamo.reset()


@pytest.mark.parametrize("kind,case", [("grpo", "dapo, entropy"), ("pairs", "dpo sigmoid, reference model in the "
                                                                            "same pass")])
def test_compiled_second_backward_raises_as_eager(kind, case, device):
    inputs = _grpo_inputs(device) if kind == "grpo" else _pair_inputs(device, reference="model")
    fn = _call(kind, case, inputs)
    for run in (fn, _compiled(fn)):
        leaves = {k: (v.detach().clone().requires_grad_(k in GRADS) if v.is_floating_point() else v)
                  for k, v in inputs.items()}
        loss = run(**leaves)[0]
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="second backward"):
            loss.backward()
        loss = run(**leaves)[0]
        loss.backward()
        with pytest.raises(RuntimeError):  # (torch's own: the graph's saved tensors are freed)
            loss.backward()


def test_compiled_upstream_scales_the_formed_gradients(device):
    inputs = _grpo_inputs(device)
    fn = _call("grpo", "dapo, entropy", inputs)
    compiled = _compiled(fn)
    _, grads, _ = _run(compiled, inputs)
    _, grads3, _ = _run(lambda **kw: (3.0 * compiled(**kw)[0],), inputs)
    for k in grads:
        assert rel_l2(grads3[k].double(), 3 * grads[k].double()) <= 1e-6, k


def test_compiled_fallback_where_gradients_cannot_be_formed(device):
    # given log-probabilities that require a gradient: the log-probabilities' custom ops (the backward recomputes the
    # logits: 4 head matmuls), compiled as eager, and the given log-probabilities get their gradient
    inputs = _grpo_inputs(device)
    fn = _call("grpo", "dapo, entropy", inputs)
    leaves = GRADS + ("ref_per_token_logps",)
    dims = (GRPO_SHAPE["tokens"], GRPO_SHAPE["hidden"], GRPO_SHAPE["vocab"])
    eager, eager_grads, eager_mm = _run(fn, inputs, leaves, count=True, dims=dims)
    compiled = _compiled(fn)
    got, grads, mm = _run(compiled, inputs, leaves, count=True, dims=dims)
    assert eager_mm == mm == 4
    assert "ref_per_token_logps" in grads and set(grads) == set(eager_grads)
    for k in grads:
        assert rel_l2(grads[k].double(), eager_grads[k].double()) <= 1e-5, k


RETURNED = {
    # the loss, its options, the inputs' builder options
    "dpo, reference model": (F.fused_linear_dpo_loss, dict(), dict(reference="model")),
    "dpo, given reference log-probs": (F.fused_linear_dpo_loss, dict(loss_type="ipo"), dict()),
    "orpo": (P.fused_linear_orpo_loss, dict(), dict(reference="none")),
    "cpo": (P.fused_linear_cpo_loss, dict(), dict(reference="none")),
    "simpo": (P.fused_linear_simpo_loss, dict(), dict(reference="none")),
    "kto, reference model": (P.fused_linear_kto_loss, dict(), dict(reference="model", labels=True)),
}


@pytest.mark.parametrize("case", RETURNED)
def test_compiled_call_returns_its_output_as_eager(case, device, monkeypatch):
    # tigon bench's tigon_compile: torch.compile of the call itself (no fullgraph, dynamic=False, compile mode
    # "auto"), its output NamedTuple returned by the compiled frame. Torch 2.11's Dynamo (the GPU image's) failed an
    # assertion where that tuple came from ``_replace`` (now support.replaced); in mode "auto" the losses without a
    # record of their own raised a KeyError choosing their path (support.compiled_choice); KTO's metric sums broke
    # the graph inside a no_grad block (now reference.kto._group_sums), which torch 2.11 then failed to compile
    monkeypatch.delenv("TIGON_COMPILE_OPS")
    loss_fn, opts, build = RETURNED[case]
    inputs = _pair_inputs(device, **build)

    def fn(**kw):
        return loss_fn(**kw, **opts)

    from torch._dynamo.testing import CompileCounterWithBackend

    eager, eager_grads, _ = _run(fn, inputs)
    backend = CompileCounterWithBackend("aot_eager")
    got, grads, _ = _run(torch.compile(fn, backend=backend, dynamic=False), inputs)
    assert backend.frame_count == 1  # one graph: no graph break
    assert type(got) is type(eager) and len(got) == len(eager)
    for name, a, b in zip(eager._fields, got, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert set(grads) == set(eager_grads) >= {"hidden", "weight"}
    for k in grads:
        torch.testing.assert_close(grads[k], eager_grads[k], rtol=1e-5, atol=1e-6, msg=k)


def test_options_string_round_trips():
    options = dict(beta=0.04, loss_type="dapo", max_completion_length=None, entropy=True, k=3, neg=-1e-7,
                   loss_types=["ipo", "sft"], weights=(0.5, 1.5), empty=[])
    assert decode(encode(options)) == {**options, "weights": [0.5, 1.5]}
    with pytest.raises(ValueError, match="may not contain"):
        encode(dict(loss_type="a;b"))
    with pytest.raises(TypeError, match="must be None, a bool"):
        encode(dict(x=torch.zeros(1)))


def test_opcheck_formed_head_grads(device):
    # schema, fake implementation against the real one, autograd registration (the outputs' values are not compared
    # across runs by these checks: each call's token is new)
    from tigon.kernels.formed_grads import _formed_op
    from tigon.ops.fused_linear_logprobs import logprob_plan

    inputs = _grpo_inputs(device)
    h = inputs["_input"].reshape(12, 16).requires_grad_()
    w = inputs["weight"].clone().requires_grad_()
    ids = torch.where(inputs["attention_mask"] != 0, inputs["selected_token_ids"], -100).reshape(-1)
    plan = logprob_plan(h, w, ids)
    spec = encode(dict(beta=0.04, epsilon_low=0.2, epsilon_high=0.2, loss_type="dapo", max_completion_length=None,
                       importance_sampling_level="token", sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                       delta=None, use_bias_correction_kl=False, vespo_k_pos=2.0, vespo_lambda_pos=3.0,
                       vespo_k_neg=3.0, vespo_lambda_neg=2.0, entropy_coef=0.0, want_entropy=True, num_items=None))
    tensors = [ids, inputs["attention_mask"], inputs["advantages"], inputs["ref_per_token_logps"], None, None, None]
    o = plan.opts
    torch.library.opcheck(_formed_op, ("grpo", spec, h, w, None, tensors, o.ignore_index, o.softcap, o.logit_scale,
                                       plan.cd, True, True, False, plan.lean, plan.budget, True, False),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


def test_bench_times_tigon_compiled_next_to_compiled_eager(monkeypatch):
    # tigon bench's tigon_compile provider: the records of the post-training losses with a formed-gradient path have
    # it, the others not; it compiles Tigon's call (aot_eager here: no codegen on CPU) and times it like the others
    from tigon import ops
    from tigon.workflows import bench as B

    assert ops.TIGON_COMPILE in B.PROVIDERS
    have = {name for name, spec in ops.registry().items() if ops.TIGON_COMPILE in B.op_providers(spec)}
    assert have == {"fused_linear_grpo", "fused_linear_dpo_loss"}
    for name in have:
        assert ops.TIGON_COMPILE in ops.get(name).grads_in_forward
    real = torch.compile
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(fn) or real(fn, backend="aot_eager"))
    shapes = B.shapes_from_config({"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2,
                                   "vocab_size": 40}, tokens=16)
    res = B.run_bench(["fused_linear_grpo"], {"fused_linear_grpo": [shapes["fused_linear_grpo"]]},
                      ["tigon", ops.TIGON_COMPILE], dtype=B.DTYPES["float32"], device="cpu", modes=("fwd_bwd",))
    assert {r.provider for r in res.rows} == {"tigon", ops.TIGON_COMPILE}
    assert all(r.ms is not None and r.ms > 0 for r in res.rows), [r.note for r in res.rows]
    assert len(seen) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="LM-head sizes need a GPU (compiled kernels)")
@pytest.mark.parametrize("kind", ["grpo", "dpo"])
def test_gpu_compiled_formed_loss_at_head_size(kind, monkeypatch):
    # bf16 at an LM head's size (vocabulary 128256, several chunks), the real chunk rules: compiled (aot_eager) takes
    # 3 head matmuls (+1 for DPO's reference model) as eager, with eager's loss and gradients (eager casts an fp32
    # grad_weight in place, the compiled op out of place: the same rounding, so only the chunks' fp32 sums' order
    # could differ; 1e-3 relative is bf16's half ulp)
    monkeypatch.undo()
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    if kind == "grpo":
        shape = {"tokens": 4096, "batch": 8, "hidden": 1024, "vocab": 128256}
        gen = torch.Generator(device="cpu").manual_seed(3)
        inputs = GRPO_RECORDS[0].make_inputs(shape, torch.bfloat16, "cuda", gen)

        def fn(**kw):
            out = F.fused_linear_grpo(**kw, return_metrics=True)
            return (out.loss, *out.metrics.values())
        dims, extra, kept = (4096, 1024, 128256), 0, 1.0
    else:
        gen = torch.Generator(device="cpu").manual_seed(3)
        inputs = P._inputs({"tokens": 4096, "hidden": 1024, "vocab": 128256}, torch.bfloat16, "cuda", gen, pairs=4,
                           ignore_every=10, reference="model")

        def fn(**kw):
            return tuple(F.fused_linear_dpo_loss(**kw))
        # the ignored tokens (every 10th) are left out of all four matmuls (tigon.kernels.ignored_rows: a head this
        # large pays for the sync), so each counts the kept rows' share (3.6 measured on an H100, session 30)
        dims, extra = (4096, 1024, 128256), 1
        kept = (inputs["target"] != -100).double().mean().item()
    eager, eager_grads, eager_mm = _run(fn, inputs, count=True, dims=dims)
    compiled = _compiled(fn)
    _run(compiled, inputs)
    got, grads, mm = _run(compiled, inputs, count=True, dims=dims)
    want = (3 + extra) * kept
    assert eager_mm == pytest.approx(want, rel=1e-3) and mm == pytest.approx(want, rel=1e-3), (eager_mm, mm, want)
    for i, (a, b) in enumerate(zip(got, eager)):
        assert rel_l2(a.double(), b.double()) <= 1e-3, i
    for k in eager_grads:
        assert rel_l2(grads[k].double(), eager_grads[k].double()) <= 1e-3, k
