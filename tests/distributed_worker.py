"""One rank of tests/test_distributed.py: a tiny Llama trained a few steps under DDP, FSDP2, FSDP1 and tensor
parallelism (tests/tensor_parallel_checks.py), patched and not.

Run by the test as 2 processes with the gloo backend on the CPU (``python distributed_worker.py [SCENARIO ...]`` with
RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set). For every scenario of :data:`SCENARIOS` (or those named) it
trains the unpatched model and the patched one under the same wrapper from the same weights on the same batches
(each rank its own), and compares this rank's losses, local gradients (FSDP2: the rank's shards) and parameters.
Under FSDP2 and FSDP1 the patched run must also issue exactly as many all-gathers as the original (the fused loss
adds no gather of its own). It prints one line per scenario, ``RESULT <name> OK <measured differences>`` or
``RESULT <name> FAIL <reason>`` (or ``SKIP <reason>`` where a check cannot run here), then ``DONE``.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
import warnings
from dataclasses import dataclass

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"  # before tigon defines its kernels (as conftest)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import tigon  # noqa: E402
import ranks  # noqa: E402
import tensor_parallel_checks as tp  # noqa: E402
import vocab_parallel_checks  # noqa: E402
from tigon.integrations import causal_lm  # noqa: E402
from tigon.numerics import rel_l2  # noqa: E402

V, B, T, STEPS = 128, 2, 8, 2
TINY = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=32)


@dataclass(frozen=True)
class Scenario:
    """How the model is wrapped and trained.

    wrapper: "ddp", "fsdp" (``fully_shard`` on each decoder layer, then as ``head`` says, then the root) or "fsdp1"
        (``FullyShardedDataParallel``: :func:`wrap_fsdp1`).
    head: (fsdp, fsdp1) "root": the LM head in the root unit; "unit": its own unit; (fsdp) "group":
        ``fully_shard([norm, head])`` (torchtitan's wrapping). tied: tied input and output embeddings.
        checkpointing: HF gradient checkpointing (non-reentrant). param_dtype, reduce_dtype: the mixed-precision
        policy's (FSDP2 ``MixedPrecisionPolicy``, FSDP1 ``MixedPrecision``); with param_dtype set, the patched run's
        errors against an fp32 run of the original (same wrapper, no policy) must also be no worse than the original
        run's under the policy (:data:`NO_WORSE`). head_reshard: the head's unit's ``reshard_after_forward`` (False:
        kept unsharded until the backward, torchtitan's default there).
        patch_after_wrap: call ``tigon.patch`` on the wrapped model instead of before wrapping. orig_params: (fsdp1)
        ``use_orig_params``. head_hook: a forward hook of the user's halving the logits, put on the LM head after
        wrapping and patching (the fused loss, which never calls the head, must leave it to the original forward,
        with a warning). rtol: the bound on
        the losses' relative difference and on the rel. L2 difference of each gradient and parameter.
    """

    wrapper: str
    head: str = "root"
    tied: bool = False
    checkpointing: bool = False
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    head_reshard: bool = True
    patch_after_wrap: bool = False
    orig_params: bool = True
    head_hook: bool = False
    rtol: float = 1e-5


SCENARIOS = {
    "ddp": Scenario("ddp"),
    "ddp_tied": Scenario("ddp", tied=True),
    "fsdp": Scenario("fsdp"),
    "fsdp_head_unit": Scenario("fsdp", head="unit"),
    "fsdp_head_unit_kept": Scenario("fsdp", head="unit", head_reshard=False),
    "fsdp_norm_head_group": Scenario("fsdp", head="group"),
    "fsdp_tied_patched_after_wrap": Scenario("fsdp", tied=True, patch_after_wrap=True),
    "fsdp_head_unit_checkpointing": Scenario("fsdp", head="unit", checkpointing=True),
    "fsdp_head_unit_patched_after_wrap": Scenario("fsdp", head="unit", patch_after_wrap=True),
    # bf16 parameters and activations (mixed-precision scenarios): the patched kernels compute in fp32 where torch
    # rounds to bf16 in between (norms, SwiGLU, the logits before the loss), so the two runs differ by bf16 rounding
    # (eps 7.8e-3), not by 1e-5: measured 1.3e-2 on the gradients, 4e-3 on the parameters, 7e-5 on the losses (FSDP2;
    # FSDP1 with bf16 gradient reduction too: the same). That the patched run is not the less accurate one is checked
    # against an fp32 run (NO_WORSE).
    "fsdp_head_unit_bf16": Scenario("fsdp", head="unit", param_dtype=torch.bfloat16, rtol=3e-2),
    "fsdp_user_head_hook": Scenario("fsdp", head_hook=True),
    "fsdp_head_unit_user_head_hook": Scenario("fsdp", head="unit", head_hook=True),
    "fsdp1": Scenario("fsdp1"),
    "fsdp1_head_unit": Scenario("fsdp1", head="unit"),
    "fsdp1_head_unit_patched_after_wrap": Scenario("fsdp1", head="unit", patch_after_wrap=True),
    "fsdp1_head_unit_flat_params": Scenario("fsdp1", head="unit", orig_params=False),
    "fsdp1_flat_params_patched_after_wrap": Scenario("fsdp1", orig_params=False, patch_after_wrap=True),
    # FSDP1's MixedPrecision, bf16 parameters and gradient reduction (accelerate's FSDP mixed_precision="bf16"); the
    # head its own unit, which casts the hidden states for the fused loss as for the head (rtol: as above)
    "fsdp1_head_unit_bf16": Scenario("fsdp1", head="unit", param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,
                                     rtol=3e-2),
}


NO_WORSE = 1.5
"""Mixed-precision scenarios: each gradient's and parameter's rel. L2 error against the fp32 run may be at most this
times the original's (+ 1e-6). Measured at most 1.30 (FSDP2) and 1.20 (FSDP1), over both ranks: the two runs round
differently per tensor and neither is uniformly closer (the smallest ratios are 0.6); 1.5 leaves that spread some room
and still fails a patched run that is clearly less accurate than the original."""


TENSOR_PARALLEL = {  # check name -> function of tests/tensor_parallel_checks.py, called with the model builder
    "tensor_parallel_head": "head",
    "tensor_parallel_head_loss_parallel": "head_loss_parallel",
    "tensor_parallel_head_tied": "head_tied",
    "tensor_parallel_rowwise_head_skipped": "rowwise_head_skipped",
    "tensor_parallel_model": "model",
    "tensor_parallel_model_sequence_parallel": "model_sequence_parallel",
    "tensor_parallel_model_transformers_plan": "model_transformers_plan",
    "fsdp2_tensor_parallel_sequence_parallel_head_unit": "fsdp2_model_sequence_parallel_head_unit",
}


def build(sc: Scenario) -> torch.nn.Module:
    """The tiny fp32 Llama, the same weights on every rank."""
    cfg = transformers.LlamaConfig(**TINY, tie_word_embeddings=sc.tied)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).float().train()
    if sc.checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def wrap(model: torch.nn.Module, sc: Scenario) -> torch.nn.Module:
    if sc.wrapper == "ddp":
        return DistributedDataParallel(model)
    if sc.wrapper == "fsdp1":
        return wrap_fsdp1(model, sc)
    kw = {} if sc.param_dtype is None else {"mp_policy": MixedPrecisionPolicy(param_dtype=sc.param_dtype)}
    for layer in model.model.layers:
        fully_shard(layer, **kw)
    if sc.head == "unit":
        fully_shard(model.lm_head, reshard_after_forward=sc.head_reshard, **kw)
    elif sc.head == "group":
        fully_shard([model.model.norm, model.lm_head], reshard_after_forward=sc.head_reshard, **kw)
    return fully_shard(model, **kw)


def wrap_fsdp1(model: torch.nn.Module, sc: Scenario) -> torch.nn.Module:
    """FSDP1 (``FullyShardedDataParallel``, ``use_orig_params`` as ``sc.orig_params`` says, full sharding): one unit
    per decoder layer (``ModuleWrapPolicy``, as accelerate's transformer-layer policy), the head its own unit with
    ``head="unit"``, the rest in the root."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    layer, head = type(model.model.layers[0]), model.lm_head
    if sc.head == "unit":  # the head too, not the other Linears (inside a layer's unit already)
        def policy(module, recurse, nonwrapped_numel):
            return recurse or module is head or isinstance(module, layer)
    else:
        policy = ModuleWrapPolicy({layer})
    mp = None if sc.param_dtype is None else MixedPrecision(param_dtype=sc.param_dtype, reduce_dtype=sc.reduce_dtype)
    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=policy, use_orig_params=sc.orig_params,
                                       mixed_precision=mp, device_id=torch.device("cpu"))
    units = [type(m._fsdp_wrapped_module) for m in FullyShardedDataParallel.fsdp_modules(wrapped)]
    assert units.count(layer) == len(model.model.layers), units
    assert isinstance(model.lm_head, FullyShardedDataParallel) == (sc.head == "unit"), model.lm_head
    return wrapped


def _count_calls(owner, attr: str) -> list[int]:
    """A one-element counter of calls to ``owner.attr`` (wrapped in place; empty when owner is None or has no such
    attribute: a private function that moved)."""
    original = getattr(owner, attr, None)
    if original is None:
        return []
    count = [0]

    def counting(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)

    setattr(owner, attr, counting)
    return count


def _private(module: str, name: str | None = None):
    """``module`` (or its attribute ``name``) when importable, else None."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return mod if name is None else getattr(mod, name, None)


ALL_GATHERS = _count_calls(_private("torch.distributed.fsdp._fully_shard._fsdp_param_group"), "foreach_all_gather")
"""FSDP2's all-gathers (its private ``foreach_all_gather``)."""
FSDP1_ALL_GATHERS = _count_calls(_private("torch.distributed.fsdp._flat_param", "FlatParamHandle"),
                                 "_all_gather_flat_param")
"""FSDP1's all-gathers of flat parameters (``FlatParamHandle._all_gather_flat_param``)."""


def _sharded(head: torch.nn.Module) -> bool:
    """Whether the head's weight is sharded now: an FSDP2 DTensor, or for an FSDP1 unit its flat parameter holding
    this rank's shard (FSDP1's private FlatParamHandle; with use_orig_params=False ``head.weight`` is a stale view)."""
    handle = getattr(head, "_handle", None)
    if handle is not None:
        flat = handle.flat_param
        return flat.data_ptr() == flat._local_shard.data_ptr()
    return isinstance(head.weight, DTensor)


def batch(step: int):
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())  # each rank its own data
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :2] = -100
    return ids, labels


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def train(sc: Scenario, patched: bool) -> dict:
    """Losses, per-step local gradients and final local parameters of one run (and what the patched run showed)."""
    model = build(sc)
    report = tigon.patch(model) if patched and not sc.patch_after_wrap else None
    wrapped = wrap(model, sc)
    if patched and sc.patch_after_wrap:
        report = tigon.patch(wrapped)
    if report is not None:
        assert report.counts.get("lm_head_loss") == 1, f"LM head not patched: {report}"
        detail = next(e.detail for e in report.replaced if e.kind == "lm_head_loss")
        if sc.wrapper == "fsdp" and sc.patch_after_wrap:  # FSDP2's Shard(0) weight is not a tensor-parallel head
            assert "FSDP2 gathers" in detail and "ColwiseParallel" not in detail, detail
            # FSDP2's FSDP<Layer> class (its forward wrapped again by transformers) is the layer's own
            assert report.counts.get("fused_add_rms_norm") == len(model.model.layers), str(report)
    if sc.head_hook:
        model.lm_head.register_forward_hook(_halve_logits)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    run = {"losses": [], "grads": [], "fused": [], "head_resharded": []}
    counter = FSDP1_ALL_GATHERS if sc.wrapper == "fsdp1" else ALL_GATHERS
    gathers = counter[0] if counter else 0
    for step in range(STEPS):
        ids, labels = batch(step)
        out = wrapped(input_ids=ids, labels=labels)
        run["fused"].append(out.logits is None)
        # nothing kept after the loss: a head that is its own unit is sharded again right after the forward
        run["head_resharded"].append(_sharded(model.lm_head))
        out.loss.backward()
        run["losses"].append(out.loss.item())
        run["grads"].append({n: _local(p.grad) for n, p in wrapped.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
    run["params"] = {n: _local(p) for n, p in wrapped.named_parameters()}
    run["all_gathers"] = (counter[0] - gathers) if counter else None
    return run


def _halve_logits(module, args, output):
    return output * 0.5


def check(name: str, sc: Scenario) -> str:
    ref = train(sc, patched=False)
    if sc.head_hook:  # the user's hook on the head: the original forward runs it, with a warning
        causal_lm._WARNED.clear()  # warned once per reason and process: this scenario's own
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train(sc, patched=True)
        assert not any(got["fused"]), f"the fused LM-head loss skipped the head's hook: {got['fused']}"
        assert any("has hooks" in str(w.message) for w in caught), [str(w.message) for w in caught]
    else:
        got = train(sc, patched=True)
        assert all(got["fused"]), f"the fused LM-head loss did not run (logits returned): {got['fused']}"
    assert not any(ref["fused"])
    if sc.wrapper in ("fsdp", "fsdp1") and sc.head in ("unit", "group"):
        # nothing kept: resharded after the forward unless the unit says otherwise, as the original
        assert got["head_resharded"] == ref["head_resharded"] == [sc.head_reshard] * STEPS, \
            f"head sharded after the forward: patched {got['head_resharded']}, original {ref['head_resharded']}"
    if sc.wrapper in ("fsdp", "fsdp1"):
        assert got["all_gathers"] == ref["all_gathers"], \
            f"{got['all_gathers']} FSDP all-gathers, the original {ref['all_gathers']}"
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0}
    if sc.param_dtype is not None:
        worst["vs_fp32"] = _no_worse_than_the_original(sc, got, ref)
    for step, (a, b) in enumerate(zip(got["losses"], ref["losses"])):
        worst["loss"] = max(worst["loss"], abs(a - b) / abs(b))
        assert abs(a - b) <= sc.rtol * abs(b), f"step {step} loss {a} vs {b}"
    for step, (g, r) in enumerate(zip(got["grads"], ref["grads"])):
        assert g.keys() == r.keys(), f"step {step}: parameters with a gradient differ: {sorted(g.keys() ^ r.keys())}"
        for n in r:
            d = rel_l2(g[n], r[n])
            worst["grad"] = max(worst["grad"], d)
            assert d <= sc.rtol, f"step {step} grad {n}: rel L2 {d:.2e}"
    for n, r in ref["params"].items():
        d = rel_l2(got["params"][n], r)
        worst["param"] = max(worst["param"], d)
        assert d <= sc.rtol, f"param {n} after {STEPS} steps: rel L2 {d:.2e}"
    return " ".join(f"{k}={v:.1e}" for k, v in worst.items()) + f" all_gathers={got['all_gathers']}"


def _no_worse_than_the_original(sc: Scenario, got: dict, ref: dict) -> float:
    """Under a mixed-precision policy: train the original in fp32 under the same wrapper (no policy) and assert that
    every gradient and parameter of the patched run is within :data:`NO_WORSE` times the original's error against
    it. Returns the largest ratio seen."""
    import dataclasses

    f32 = train(dataclasses.replace(sc, param_dtype=None, reduce_dtype=None), patched=False)
    pairs = [(f"step {step} grad {n}", g[n], r[n], e[n])
             for step, (g, r, e) in enumerate(zip(got["grads"], ref["grads"], f32["grads"])) for n in e]
    pairs += [(f"param {n}", got["params"][n], ref["params"][n], e) for n, e in f32["params"].items()]
    worst = 0.0
    for what, g, r, e in pairs:
        mine, theirs = rel_l2(g.double(), e.double()), rel_l2(r.double(), e.double())
        assert mine <= NO_WORSE * theirs + 1e-6, \
            f"{what}: rel. L2 error against fp32 {mine:.2e}, the original's under the same policy {theirs:.2e}"
        worst = max(worst, mine / theirs if theirs else 0.0)
    return worst


def check_compare(parallel: str) -> str:
    """``tigon compare --nproc 2 --parallel PARALLEL`` on the tiny default model, 2 steps: the rank side
    (tigon.workflows.compare_dist.rank_main, as torch.distributed.run starts it) in this process group; rank 0
    writes the report to $TIGON_COMPARE_JSON_DIR/compare_<parallel>.json, which the test reads."""
    import json

    from tigon.workflows import compare_dist

    out = os.path.join(os.environ["TIGON_COMPARE_JSON_DIR"], f"compare_{parallel}.json")
    # on the CPU also on a machine with GPUs (this group is gloo, and one GPU cannot hold two ranks)
    config = json.dumps({"preset": "tiny", "steps": 2, "nproc": dist.get_world_size(), "parallel": parallel,
                         "device": "cpu"})
    status = compare_dist.rank_main(["--config", config, "--out", out])
    assert status == 0, f"rank_main exited with {status}"
    # a configuration every rank rejects: exit 0 on every rank (torchrun would end rank 0 before it writes otherwise),
    # rank 0 writes the error for the launcher to raise
    bad = os.path.join(os.environ["TIGON_COMPARE_JSON_DIR"], f"compare_{parallel}_error.json")
    config = json.dumps({"preset": "tiny", "steps": 2, "seq_len": 100_000, "nproc": dist.get_world_size(),
                         "device": "cpu"})
    assert compare_dist.rank_main(["--config", config, "--out", bad]) == 0
    dist.barrier()
    if dist.get_rank() == 0:
        with open(bad) as f:
            error = json.load(f)["error"]
        assert "--seq-len 100000 exceeds the model's max_position_embeddings" in error, error
    return "report written by rank 0"


def check_bench_e2e() -> str:
    """``tigon bench --e2e --nproc 2 --parallel fsdp2 --providers original,tigon --steps 1`` on the tiny default model
    (FSDP2 here, DDP in the compare check, one launch each would cost more than CI has to spare): the rank
    side in this process group; rank 0 writes $TIGON_COMPARE_JSON_DIR/bench_e2e.json, which the test reads."""
    import json

    from tigon.workflows import compare_dist

    out = os.path.join(os.environ["TIGON_COMPARE_JSON_DIR"], "bench_e2e.json")
    config = json.dumps({"providers": ["original", "tigon"], "steps": 1, "nproc": dist.get_world_size(),
                         "parallel": "fsdp2", "device": "cpu"})
    status = compare_dist.rank_main(["--workflow", "e2e", "--config", config, "--out", out])
    assert status == 0, f"rank_main exited with {status}"
    return "report written by rank 0"


def main(names: list[str]) -> None:
    dist.init_process_group("gloo")
    checks = {name: (lambda sc=sc, name=name: check(name, sc)) for name, sc in SCENARIOS.items()}
    checks["vocab_parallel_functional"] = vocab_parallel_checks.functional
    tp_build = lambda tied=False: build(Scenario("none", tied=tied))  # noqa: E731
    for name in TENSOR_PARALLEL:
        checks[name] = lambda fn=getattr(tp, TENSOR_PARALLEL[name]): fn(tp_build)
    checks["compare_ddp"] = lambda: check_compare("ddp")
    checks["compare_tp"] = lambda: check_compare("tp")
    checks["bench_e2e_fsdp2"] = check_bench_e2e
    for name in names or list(checks):
        start = time.perf_counter()
        try:
            detail = checks[name]()
            status = "SKIP" if detail.startswith("SKIP ") else "OK"
            detail = detail.removeprefix("SKIP ")
            print(f"RESULT {name} {status} {detail} ({time.perf_counter() - start:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails with it
            tb = traceback.format_exc(limit=-3).replace("\n", " | ")
            print(f"RESULT {name} FAIL {type(e).__name__}: {e} | {tb}", flush=True)
    ranks.finish("DONE")

if __name__ == "__main__":
    main(sys.argv[1:])
