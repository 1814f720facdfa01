"""tigon.patch's MoE experts forward (tigon.integrations.moe_experts): transformers' grouped_mm experts with Tigon's
glue, on tiny OLMoE, GPT-OSS (biases, interleaved clamped SwiGLU), Mixtral and Qwen3-MoE models: the loss and every
gradient (router and biases included) equal to the unpatched model's in fp32; the report says what was replaced and
why not; per-call fallbacks; unpatch, deepcopy."""

import copy
import pickle

import pytest
import torch

import tigon
from tigon import support
from tigon.integrations.marks import tigon_mark
from tigon.integrations.moe_experts import MOE_OPS

import model_matrix as mm

pytest.importorskip("transformers.integrations.moe")

MODELS = {"olmoe": mm.MORE_FAMILIES["olmoe"], "gpt_oss": mm.MORE_FAMILIES["gpt_oss"], "mixtral": mm.CASES["mixtral"],
          "qwen3_moe": mm.CASES["qwen3_moe"]}
# the other families with grouped_mm experts (their default experts implementation): the same step equality
MORE = {name: mm.MORE_FAMILIES[name] for name in ("hunyuan_v1_moe", "deepseek_v3", "qwen3_next", "qwen3_5_moe",
                                                   "gemma4", "granitemoe", "deepseek_v4", "phimoe", "flex_olmo",
                                                   "minimax_m2", "ernie4_5_moe", "glm4_moe", "glm4_moe_lite",
                                                   "qwen2_moe", "cohere2_moe", "exaone_moe", "dots1")
        if name in mm.MORE_FAMILIES}
MODELS.update(MORE)
ONLY_MLP = dict(rms_norm=False, rope=False, fused_add_rms_norm=False, fused_linear_cross_entropy=False, sinks=False)


def build(name: str, experts: str = "grouped_mm"):
    mm.require_family(MODELS[name][0])
    model_type, overrides = MODELS[name][:2]
    model = mm.build(model_type, {**overrides, "experts_implementation": experts})
    return model.float()


def step(model, seed: int = 1, call=None):
    """(loss, {name: gradient}) of one training step of ``model``, run by ``call`` (default the model itself: e.g.
    its torch.compile'd form)."""
    ids = torch.randint(3, mm.V, (2, 12), generator=torch.Generator().manual_seed(seed)).to(mm.DEVICE)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same draws in every run (PhiMoE's router samples its experts in training)
    out = (model if call is None else call)(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def assert_same_step(a, b, rtol=1e-5, noise=None, truth=None):
    """``a``'s loss and gradients equal ``b``'s within ``rtol`` (relative norm), or 10x ``noise`` (b's own
    run-to-run difference per parameter), or, with ``truth`` (the same step in float64), no further from it than 2x
    ``b`` is (the numerics policy's rule; ``truth``: a callable giving that step, called once where needed)."""
    (la, ga), (lb, gb) = a, b
    exact = None
    torch.testing.assert_close(la, lb, rtol=rtol, atol=0)
    assert set(ga) == set(gb)
    for n in ga:
        err = _rel(ga[n], gb[n])
        bound = max(rtol, 10 * (noise or {}).get(n, 0.0))
        if err > bound and truth is not None:
            exact = truth()[1] if exact is None else exact
            mine, theirs = _rel(ga[n], exact[n]), _rel(gb[n], exact[n])
            assert mine <= max(rtol, 2 * theirs), f"{n}: {mine:.2e} off float64 against the original's {theirs:.2e}"
            continue
        assert err <= bound, f"{n}: relative error {err:.2e} > {bound:.2e}"


def is_experts(m) -> bool:
    return isinstance(getattr(m, "gate_up_proj", None), torch.Tensor) and m.gate_up_proj.dim() == 3


def experts_entries(report):
    return [e for e in report.replaced if e.kind == "mlp" and e.target.rsplit(".", 1)[-1] == "experts"]


def own_noise(a, b) -> dict:
    """Per parameter, the relative difference between two runs of the same unpatched step: 0 where the step is
    deterministic (the CPU); on CUDA, transformers' grouped_mm backward and the linear attention of Qwen3-Next /
    Qwen3.5 sum with atomics (index_add_ / scatter), whose order changes between runs."""
    (_, ga), (_, gb) = a, b
    return {n: ((ga[n] - gb[n]).norm() / gb[n].norm().clamp_min(1e-30)).item() for n in ga}


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_equals_grouped_mm_experts(name):
    model = build(name)
    want = step(model)
    noise = own_noise(step(model), want)

    def truth():  # the same step in float64 (grouped_mm has no float64: the batched experts, the same weights)
        exact = build(name, experts="batched_mm")
        exact.load_state_dict(model.state_dict())
        return step(exact.double())
    support.backend_usage(reset=True)
    report = tigon.patch(model, **ONLY_MLP)
    entries = experts_entries(report)
    assert entries and all(e.ops == MOE_OPS for e in entries), report
    assert all("moe_expert_gate" in e.detail for e in entries)
    if name == "gpt_oss":
        assert "clamped_swiglu" in entries[0].detail and "per-expert biases" in entries[0].detail
    experts = [m for m in model.modules() if is_experts(m)]
    assert all("forward" in m.__dict__ and "_apply_gate" in m.__dict__ for m in experts)
    got = step(model)
    # loss, router, experts' weights and biases, everything else: within 1e-5 of the original, or 10x the original's
    # own run-to-run difference where that is larger (CUDA's atomics), or no further from a float64 run than 2x the
    # original is: Qwen3-Next / Qwen3.5-MoE's dt_bias gradient moved 1.2e-4 from the original's on an H100 (also with
    # cuDNN's TF32 convolutions off), an ill-conditioned sum through the gated delta rule's chunks
    assert_same_step(got, want, rtol=1e-5, noise=noise, truth=truth)
    used = support.backend_usage()
    assert all(op in used for op in MOE_OPS), used
    tigon.unpatch(model)
    assert not any("forward" in m.__dict__ or "_apply_gate" in m.__dict__ for m in experts)
    assert_same_step(step(model), want, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name, mode", [("olmoe", "kernels"), ("gpt_oss", "kernels"), ("olmoe", "auto")])
def test_compiled_training_step_equals_eager(name, mode, monkeypatch):
    # the patched model under torch.compile(fullgraph=True) (aot_eager): no graph break, eager's loss and every
    # gradient (fp32); the glue ops are the tigon::moe_* custom ops of the graph where compiled_choice says "kernel",
    # else their references, traced
    monkeypatch.setenv("TIGON_COMPILE_OPS", mode)
    eager, model = build(name), build(name)
    tigon.patch(eager, **ONLY_MLP)
    tigon.patch(model, **ONLY_MLP)
    want = step(eager)
    step(model)  # (an eager call first: transformers installs its output-capturing hooks under a lock, which Dynamo
    # cannot trace: a graph break of the unpatched model too)
    seen = set()
    aot_eager = torch._dynamo.lookup_backend("aot_eager")

    def backend(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if str(n.target).startswith("tigon."))
        return aot_eager(gm, example_inputs)

    original_compiles(name)
    torch._dynamo.reset()
    support.backend_usage(reset=True)
    try:
        assert_same_step(step(model, call=torch.compile(model, backend=backend, fullgraph=True)), want)
    finally:
        torch._dynamo.reset()
    kernel = {op for op in MOE_OPS if support.compiled_choice(op) == "kernel"}
    assert kernel == (set(MOE_OPS) if mode == "kernels" else set()), kernel  # (the records: "inductor" in "auto")
    assert seen == {f"tigon.{op}.default" for op in kernel}
    backends = support.backend_usage()
    kernels = support.decide(torch.device(mm.DEVICE), torch.float32).backend
    assert all(set(backends[op]) == {kernels if op in kernel else "inductor"} for op in MOE_OPS), backends


def original_compiles(name: str) -> None:
    """Skip unless the unpatched model's step compiles whole (aot_eager): transformers 5.17's grouped_mm fallback (fp32
    on CUDA) traced its backward's ``offs.tolist()`` and raised GuardOnDataDependentSymNode, patched or not."""
    model = build(name)
    step(model)
    torch._dynamo.reset()
    try:
        step(model, call=torch.compile(model, backend="aot_eager", fullgraph=True))
    except Exception as e:  # noqa: BLE001 (whatever the installed transformers raises)
        pytest.skip(f"the unpatched {name} step does not compile whole here: {type(e).__name__}: {str(e)[:200]}")
    finally:
        torch._dynamo.reset()


def test_other_experts_implementations_keep_only_the_gate_hook():
    model = build("olmoe", experts="batched_mm")
    report = tigon.patch(model, **ONLY_MLP)
    entries = experts_entries(report)
    assert entries and all(e.ops == ("swiglu",) for e in entries), report
    assert all("forward left as is (config._experts_implementation is 'batched_mm'" in e.detail for e in entries)
    experts = [m for m in model.modules() if type(m).__name__ == "OlmoeExperts"]
    assert all("forward" not in m.__dict__ and "_apply_gate" in m.__dict__ for m in experts)


def test_eager_experts_say_how_to_switch_and_patching_again_takes_them():
    """Built with the eager experts loop, the experts are skipped with the way out for a built model
    (``model.set_experts_implementation``, then ``tigon.patch`` again), which then takes them with the glue."""
    model, reference = build("olmoe", experts="eager"), build("olmoe")
    report = tigon.patch(model, **ONLY_MLP)
    skipped = [e for e in report.skipped if e.kind == "mlp"]
    assert skipped and all("model.set_experts_implementation('grouped_mm')" in e.detail and "tigon.patch" in e.detail
                           for e in skipped), report
    model.set_experts_implementation("grouped_mm")
    again = tigon.patch(model, **ONLY_MLP)
    assert experts_entries(again) and all(e.ops == MOE_OPS for e in experts_entries(again)), again
    assert_same_step(step(model), step(reference))
    tigon.unpatch(model)


def test_per_call_fallbacks_run_the_class_forward():
    # patched for grouped_mm; the eager loop chosen later, or expert parallelism turned on, run transformers' forward
    model = build("olmoe")
    want = step(model)
    tigon.patch(model, **ONLY_MLP)
    model.config._experts_implementation = "eager"
    support.backend_usage(reset=True)
    got = step(model)
    assert "moe_combine" not in support.backend_usage()
    assert_same_step(got, want)
    model.config._experts_implementation = "grouped_mm"
    for m in model.modules():
        if type(m).__name__ == "OlmoeExperts":
            m.has_post_expert_norm = False  # (5.17 has no such flag: False is what transformers' forward reads)
            m._is_expert_parallel = True
    support.backend_usage(reset=True)
    assert_same_step(step(model), want)
    assert "moe_combine" not in support.backend_usage()


def test_modules_it_cannot_take_are_left_with_a_reason(monkeypatch):
    model = build("olmoe")
    experts = next(m for m in model.modules() if type(m).__name__ == "OlmoeExperts")
    experts._is_expert_parallel = True
    report = tigon.patch(model, **ONLY_MLP)
    detail = next(e.detail for e in report.replaced if e.target.endswith("layers.0.mlp.experts"))
    assert "forward left as is (expert / tensor parallel" in detail
    assert "forward" not in experts.__dict__
    tigon.unpatch(model)
    # a custom _apply_gate (an unknown gating function): the experts are left alone, forward included
    monkeypatch.setattr(type(experts), "_apply_gate", lambda self, gate_up: gate_up[:, ::2])
    experts._is_expert_parallel = False
    report = tigon.patch(model, **ONLY_MLP)
    assert not experts_entries(report)
    assert any("defines its own _apply_gate" in e.detail for e in report.skipped), report
    assert "forward" not in experts.__dict__


def test_mlp_off_leaves_the_experts_alone():
    model = build("mixtral")
    report = tigon.patch(model, mlp=False)
    assert "mlp" not in report.counts
    assert not any(k in m.__dict__ for m in model.modules() for k in ("forward", "_apply_gate")
                   if type(m).__name__ == "MixtralExperts")


def test_deepcopy_keeps_the_glue_forward():
    model = build("gpt_oss")
    want = step(model)
    tigon.patch(model, **ONLY_MLP)
    clone = copy.deepcopy(model)
    experts = [m for m in clone.modules() if is_experts(m)]
    assert all(m.__dict__["forward"].__self__ is m and m.__dict__["_apply_gate"].__self__ is m for m in experts)
    support.backend_usage(reset=True)
    assert_same_step(step(clone), want)
    assert "moe_combine" in support.backend_usage()


def test_pickled_experts_keep_the_glue_forward():
    # (the whole tiny model holds transformers' output-capturing hooks, local functions that do not pickle)
    model = build("gpt_oss")
    tigon.patch(model, **ONLY_MLP)
    experts = pickle.loads(pickle.dumps(next(m for m in model.modules() if is_experts(m))))
    assert tigon_mark(experts.__dict__["forward"]).get("experts_forward")
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, experts.gate_up_proj.shape[1], generator=gen).to(mm.DEVICE)
    index = torch.stack([torch.randperm(experts.num_experts, generator=gen)[:2] for _ in range(5)]).to(mm.DEVICE)
    weights = torch.rand(5, 2, generator=gen).to(mm.DEVICE)
    support.backend_usage(reset=True)
    torch.testing.assert_close(experts(hidden, index, weights), type(experts).forward(experts, hidden, index, weights),
                               rtol=1e-5, atol=1e-6)
    assert "moe_combine" in support.backend_usage()


@pytest.mark.parametrize("name", ["olmoe", "gpt_oss"])
def test_class_level_patch_sets_the_glue_forward_on_the_class(name):
    # tigon.patch("olmoe"): the experts class gets the glue forward beside _apply_gate, for models built before and
    # after; each module's conditions are checked per call (an eager-experts model runs the class's dispatcher)
    want = step(build(name))
    family = MODELS[name][0]
    report = tigon.patch(family, **ONLY_MLP)
    try:
        entry = next(e for e in report.replaced if e.kind == "mlp" and e.target.endswith("Experts._apply_gate"))
        assert entry.ops == MOE_OPS and "checked per call" in entry.detail, report
        model = build(name)
        experts = [m for m in model.modules() if is_experts(m)]
        assert tigon_mark(type(experts[0]).forward).get("experts_forward")
        support.backend_usage(reset=True)
        assert_same_step(step(model), want)
        assert all(op in support.backend_usage() for op in MOE_OPS)
        eager = build(name, experts="eager")
        support.backend_usage(reset=True)
        assert_same_step(step(eager), want)
        assert "moe_combine" not in support.backend_usage()
        assert tigon.patch(family, **ONLY_MLP).already_patched
    finally:
        tigon.unpatch(family)
    assert tigon_mark(type(experts[0]).forward) is None and tigon_mark(type(experts[0])._apply_gate) is None
    assert_same_step(step(model), want, rtol=0)


def test_benchmark_script_runs_tiny(tmp_path):
    # benchmarks/moe_glue_bench.py (the GPU session's timing of one layer's experts), on tiny experts (the CPU's
    # interpreter, or CUDA): every provider patched as it says and equal to transformers' grouped_mm experts
    import importlib.util
    import json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "moe_glue_bench.py"
    spec = importlib.util.spec_from_file_location("moe_glue_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "moe.json"
    bench.main(["--tiny", "--device", str(mm.DEVICE), "--dtype", "float32", "--tokens", "12", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [m["model"] for m in result["models"]] == list(bench.MODELS)
    for row in result["models"]:
        p = row["providers"]
        assert set(p) == set(bench.PROVIDERS) and row["glue_min_bytes"] > 0
        assert p["tigon_glue"]["detail"].startswith("forward: transformers' grouped_mm experts with Tigon's glue")
        assert p["tigon_gate"]["detail"].startswith("the class's forward")
        assert all(r["max_abs_diff_vs_hf"] < 1e-5 and r["fwd_bwd_ms"] > 0 for r in p.values())
