"""Multi-process training of a patched model (issue 22): two gloo ranks on the CPU, DDP, FSDP2, FSDP1 and TP.

One launch of tests/distributed_worker.py (2 ranks, Triton's interpreter) trains a tiny Llama for a few steps in every
scenario, unpatched and patched under the same wrapper: DDP (untied and tied embeddings) and FSDP2 with the LM head
in the root unit, as its own unit (resharded after the forward, or kept), grouped with the final norm (torchtitan's
``fully_shard([norm, output])``), with tied embeddings (patched after wrapping), with gradient checkpointing, the
head's unit patched after wrapping, and under a bf16 mixed-precision policy; FSDP1 (``FullyShardedDataParallel``,
``use_orig_params=True``, a unit per decoder layer) with the head in the root or its own unit (patched before or
after wrapping; and with ``use_orig_params=False``, the head its own unit or patched after wrapping; the head its own
unit under a bf16 ``MixedPrecision`` of parameters and gradient reduction). Under the mixed-precision policies the
patched run must also be no less accurate against an fp32 run than the original. Each rank
compares its losses, its local gradients (FSDP: its shards, reduce-scattered by FSDP) and its parameters; the fused
LM-head loss must have run (no logits returned), FSDP2 / FSDP1 must have all-gathered as often as for the original
(no gather of Tigon's own), and a head that is its own unit must be sharded after the forward exactly when the
original's is (``reshard_after_forward`` True, or False: kept). Tensor parallelism by vocabulary
(tests/vocab_parallel_checks.py): the vocabulary-parallel losses on each rank's shard equal the plain loss.
Tensor-parallel plans (tests/tensor_parallel_checks.py): a ``ColwiseParallel`` LM head (logits Replicate, or
``Shard(-1)`` under ``loss_parallel()``, or tied to a ``RowwiseParallel`` embedding) and the whole decoder under
torch's plan (with and without sequence parallelism) and transformers' own ``tp_plan`` train patched as unpatched,
the fused loss vocab-parallel; FSDP2 over that plan with sequence parallelism on a (1, 2) mesh, the head its own
FSDP2 unit; a head split by the hidden dimension (row-wise) is skipped with the reason. A forward hook of the
user's on an FSDP2 head (in the root unit or its own) makes the fused loss run the original forward, with a warning. A
DeepSpeed ZeRO-3 head (a stand-in here: a ``ds_id`` and a lookup recorder in place of DeepSpeed's) is read only
inside the head's call, where DeepSpeed's hooks gather it.

``tigon compare --nproc 2`` (the rank side, tigon.workflows.compare_dist.rank_main, run in the same two processes
under DDP, and under ``--parallel tp``, on the tiny default model for 2 steps): the JSON report has both ranks' peak
memory and tokens/s, the reported losses are the ranks' mean, and the patched losses agree with the original ones as in
tests/test_compare.py; under TP the ranks share one batch (global batch = per-rank batch) and the head's loss is
vocab-parallel.
``tigon bench --e2e --nproc 2 --parallel fsdp2`` (original and tigon, 1 step): each row has both ranks' peak memory and
tokens/s.

Not covered here: NCCL on several GPUs, DeepSpeed itself (tests/test_deepspeed.py, where it is installed). 2-D
meshes (FSDP2 + TP): ``tigon compare --nproc 4 --parallel fsdp2_tp``, its own 4-rank launch (marked slow).
"""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon.integrations import sharded_head  # noqa: E402
from ranks import check_results  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
WORLD = 2
CHECKS = ["ddp", "ddp_tied", "fsdp", "fsdp_head_unit", "fsdp_head_unit_kept", "fsdp_norm_head_group",
          "fsdp_tied_patched_after_wrap", "fsdp_user_head_hook", "fsdp_head_unit_user_head_hook",
          "fsdp_head_unit_checkpointing", "fsdp_head_unit_patched_after_wrap", "fsdp_head_unit_bf16",
          "fsdp1", "fsdp1_head_unit", "fsdp1_head_unit_patched_after_wrap", "fsdp1_head_unit_flat_params",
          "fsdp1_flat_params_patched_after_wrap", "fsdp1_head_unit_bf16",
          "vocab_parallel_functional", "tensor_parallel_head", "tensor_parallel_head_loss_parallel",
          "tensor_parallel_head_tied", "tensor_parallel_rowwise_head_skipped", "tensor_parallel_model",
          "tensor_parallel_model_sequence_parallel", "tensor_parallel_model_transformers_plan",
          "fsdp2_tensor_parallel_sequence_parallel_head_unit",
          "compare_ddp", "compare_tp", "bench_e2e_fsdp2"]
# may report SKIP (with the reason) where the installed transformers lacks the API they use
MAY_SKIP = {"tensor_parallel_model_transformers_plan"}


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory):
    """Where rank 0 of the worker's compare checks writes their JSON reports."""
    return tmp_path_factory.mktemp("compare")


@pytest.fixture(scope="module")
def results(compare_dir) -> list[dict[str, str]]:
    """Per rank: check name -> "OK <differences>" or "FAIL <reason>" (one process-group startup for the module)."""
    return check_results(WORKER, WORLD, timeout=240, env={"TIGON_COMPARE_JSON_DIR": str(compare_dir)})


@pytest.mark.parametrize("check", CHECKS)
def test_patched_model_trains_like_the_original_on_two_ranks(results, check):
    for rank, got in enumerate(results):
        assert check in got, f"rank {rank} ran no check {check!r} (ran {sorted(got)})"
        ok = got[check].startswith("OK") or (check in MAY_SKIP and got[check].startswith("SKIP"))
        assert ok, f"rank {rank}, {check}: {got[check]}"


def test_every_worker_check_is_listed(results):
    assert set(results[0]) == set(CHECKS)


def _observer(hook):
    """``hook`` marked as one that only observes a module's call (:data:`tigon.integrations.sharded_head.OBSERVER`):
    the fused loss may skip the head's call under it."""
    setattr(hook, sharded_head.OBSERVER, True)
    return hook


class _InCallLookups(dict):
    """A stand-in for DeepSpeed ZeRO-3's ``ZeROOrderedDict`` (a module's ``_parameters``): DeepSpeed gathers a
    partitioned parameter when it is looked up outside the call of the module that owns it, and keeps it gathered
    for the rest of the model's forward and backward. Records whether each lookup came inside the module's call."""

    def __init__(self, module, params):
        super().__init__(params)
        self.inside, self.lookups = False, []
        # in place of DeepSpeed's own hooks (engine hooks: sharded_head._engine_hook), marked as only observing
        module.register_forward_pre_hook(_observer(lambda m, args: setattr(self, "inside", True)))
        module.register_forward_hook(_observer(lambda m, args, out: setattr(self, "inside", False)))

    def __getitem__(self, key):
        self.lookups.append((key, self.inside))
        return super().__getitem__(key)


@pytest.mark.parametrize("tied", [False, True])
def test_deepspeed_zero3_head_loss_runs_inside_the_head_call(tied):
    # A ZeRO-3 parameter (DeepSpeed marks it with ds_id) is an empty placeholder outside its module's call; DeepSpeed's
    # hooks on the module gather it. The fused loss runs as lm_head's forward, so those hooks run around it and it
    # reads the weight only inside the call. (tests/test_deepspeed.py trains under DeepSpeed itself where installed.)
    import copy

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).train()
    ref = copy.deepcopy(model)
    head = model.lm_head
    head.weight.ds_id = 0
    report = tigon.patch(model)
    entry = next(e for e in report.replaced if e.kind == "lm_head_loss")
    assert "ZeRO-3" in entry.detail and not [e for e in report.skipped if e.kind == "lm_head_loss"], str(report)
    outputs = []

    # an observing hook (one of the user's would make the fused loss leave the head to the original forward)
    head.register_forward_hook(_observer(lambda m, args, out: outputs.append(out)))
    head._parameters = lookups = _InCallLookups(head, head._parameters)
    ids = torch.randint(0, 64, (2, 7))
    labels = ids.clone()
    labels[0, :3] = -100
    out = model(input_ids=ids, labels=labels)
    assert out.logits is None and len(outputs) == 1 and outputs[0].dim() == 0  # the head's call returned the loss
    assert lookups.lookups and all(inside for _, inside in lookups.lookups), lookups.lookups
    assert "forward" not in vars(head)  # the head's own forward is back
    expected = ref(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=0)
    out.loss.backward()
    expected.loss.backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_run_as_forward_restores_the_module_forward():
    from tigon.integrations.sharded_head import run_as_forward

    lin = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    assert run_as_forward(lin, lambda h: h.sum() * 2, x) == x.sum() * 2
    assert "forward" not in vars(lin)
    own = vars(lin)["forward"] = lambda h: h  # an instance-level forward set by someone else (e.g. accelerate)

    def fails(h):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_as_forward(lin, fails, x)
    assert vars(lin)["forward"] is own


@pytest.mark.parametrize("parallel", ["ddp"])
def test_compare_nproc_2_reports_each_rank(results, compare_dir, parallel):
    import json
    import math

    report = json.loads((compare_dir / f"compare_{parallel}.json").read_text())
    assert report["ok"] and report["config"]["nproc"] == WORLD and report["config"]["parallel"] == parallel
    dist = report["distributed"]
    assert dist["nproc"] == WORLD and dist["parallel"] == parallel and dist["backend"] == "gloo"
    assert dist["global_batch_size"] == WORLD * dist["per_rank_batch_size"] == WORLD * report["config"]["batch_size"]
    assert report["data"]["tokens_per_step"] == dist["global_batch_size"] * report["config"]["seq_len"]
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    for r in ranks:  # each rank's own peak memory (resident-set growth on Linux) and tokens/s, for both runs
        assert set(r["peak_memory_bytes"]) == set(r["tokens_per_s"]) == {"original", "patched"}
        assert all(isinstance(v, int) and v >= 0 for v in r["peak_memory_bytes"].values()), r
        assert all(v > 0 for v in r["tokens_per_s"].values())
    assert report["peak_memory_bytes"]["patched"] == max(r["peak_memory_bytes"]["patched"] for r in ranks)
    # each rank trains on its own sequences; the reported loss is their mean
    assert ranks[0]["loss_original"][0] != ranks[1]["loss_original"][0]
    for key in ("loss_original", "loss_patched"):
        assert len(report[key]) == 2
        for step, value in enumerate(report[key]):
            assert math.isclose(value, sum(r[key][step] for r in ranks) / WORLD, rel_tol=1e-12)
    assert report["max_rel_loss_diff"] < 1e-3  # fp32, as the single-process compare test
    # the ranks run on the CPU; their kernels are interpreted where no GPU makes run_ranks leave TRITON_INTERPRET unset
    assert report["backend"] == "interpreter" or (torch.cuda.is_available() and report["backend"] == "reference")



def test_compare_nproc_2_tensor_parallel(results, compare_dir):
    # --parallel tp: the ranks share each step's sequences (one data-parallel share), each holds its slice of the layers
    import json

    report = json.loads((compare_dir / "compare_tp.json").read_text())
    assert report["ok"], report.get("status_detail")
    dist = report["distributed"]
    assert (dist["parallel"], dist["data_parallel"], dist["tensor_parallel"]) == ("tp", 1, WORLD)
    assert dist["global_batch_size"] == dist["per_rank_batch_size"] == report["config"]["batch_size"]
    assert report["data"]["tokens_per_step"] == report["config"]["batch_size"] * report["config"]["seq_len"]
    ranks = report["ranks"]
    assert [r["rank"] for r in ranks] == list(range(WORLD))
    for r in ranks:
        assert all(isinstance(v, int) and v >= 0 for v in r["peak_memory_bytes"].values()), r
        assert all(v > 0 for v in r["tokens_per_s"].values())
        assert r["loss_original"] == ranks[0]["loss_original"]  # one batch, one loss on every rank
    assert report["max_rel_loss_diff"] < 1e-5
    head = next(e for e in report["patch"]["replaced"] if e["kind"] == "lm_head_loss")
    assert f"vocab-parallel over {WORLD} ranks" in head["detail"], head
    assert report["backend_usage"]["fused_add_rms_norm"]  # the decoder's patched ops ran under the plan


def test_compare_nproc_renders_the_ranks_table(results, compare_dir, capsys):
    import json

    from tigon.cli.compare import _render_compare, _summary_line

    report = json.loads((compare_dir / "compare_ddp.json").read_text())
    _render_compare(report, written=[])
    out = capsys.readouterr().out
    assert "Ranks" in out and "peak memory patched" in out and "global batch 4" in out
    assert _summary_line(report).endswith("nproc=2 parallel=ddp")


def test_bench_e2e_nproc_2_reports_each_rank(results, compare_dir, capsys):
    import json

    from tigon.cli.bench import _render_e2e

    report = json.loads((compare_dir / "bench_e2e.json").read_text())
    assert report["config"]["nproc"] == WORLD and report["distributed"]["parallel"] == "fsdp2"
    assert report["distributed"]["global_batch_size"] == WORLD * report["config"]["batch_size"]
    assert [row["provider"] for row in report["rows"]] == ["original", "tigon"]
    for row in report["rows"]:
        assert row["status"] == "ok", row
        assert [r["rank"] for r in row["ranks"]] == list(range(WORLD))
        assert all(isinstance(r["peak_memory_bytes"], int) and r["tokens_per_s"] > 0 for r in row["ranks"]), row
        assert row["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in row["ranks"])
        assert row["step_ms"] == max(r["step_ms"] for r in row["ranks"])  # one timed step: the slowest rank's
    original, tigon_row = report["rows"]
    assert abs(original["losses"][0] - tigon_row["losses"][0]) <= 1e-5 * abs(original["losses"][0])
    _render_e2e(report, None)
    assert "Ranks: peak memory" in capsys.readouterr().out


def test_run_tensor_parallel_applies_the_head_input_hooks():
    # A tensor-parallel head's input is laid out by its forward pre-hooks (torch's ColwiseParallel registers one);
    # the loss sees the hidden states as the head's forward would, its forward hooks (the logits' layout) do not run.
    from tigon.integrations.sharded_head import run_tensor_parallel

    lin = torch.nn.Linear(4, 3)
    lin.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    lin.register_forward_pre_hook(lambda m, args, kwargs: ((args[0] + 1,), kwargs), with_kwargs=True)
    lin.register_forward_hook(lambda m, args, out: pytest.fail("the forward hook ran"))
    x = torch.randn(2, 4)
    torch.testing.assert_close(run_tensor_parallel(lin, lambda h: h, x), x * 2 + 1)
    assert run_tensor_parallel(torch.nn.Linear(4, 3), lambda h: h, x) is x  # no hook: as it is


def test_bench_e2e_takes_only_data_parallel_modes():
    from tigon.workflows import compare_dist
    from tigon.workflows.errors import ConfigError

    compare_dist.check_nproc(2, "tp", "cpu")
    with pytest.raises(ConfigError, match=r"unknown --parallel 'tp' \(choose from ddp, fsdp2\)"):
        compare_dist.check_nproc(2, "tp", "cpu", compare_dist.DATA_PARALLEL)


@pytest.mark.slow
def test_compare_fsdp2_tp_on_a_2d_mesh_of_four_ranks():
    # --parallel fsdp2_tp: 4 ranks through torch.distributed.run, a (2 data-parallel x 2 tensor-parallel) mesh; about
    # 20 s on two cores (its own launch of 4 ranks, so marked slow)
    from tigon.workflows.compare import CompareConfig, run_compare

    result = run_compare(CompareConfig(nproc=4, parallel="fsdp2_tp", steps=2, device="cpu"))
    assert result.ok and result.max_rel_loss_diff < 1e-5, result.status_detail
    dist = result.distributed
    assert (dist["data_parallel"], dist["tensor_parallel"], dist["global_batch_size"]) == (2, 2, 2 * dist[
        "per_rank_batch_size"])
    losses = [r["loss_patched"] for r in result.ranks]
    assert losses[0] == losses[1] and losses[2] == losses[3] and losses[0] != losses[2]  # one batch per TP group
    assert all(v > 0 for r in result.ranks for v in r["tokens_per_s"].values())
    head = next(e for e in result.patch["replaced"] if e["kind"] == "lm_head_loss")
    assert "vocab-parallel over 2 ranks" in head["detail"], head
    assert result.data["tokens_per_step"] == dist["global_batch_size"] * result.config["seq_len"]


def test_fsdp2_tp_needs_a_2d_mesh():
    from tigon.workflows import compare_dist
    from tigon.workflows.errors import ConfigError

    with pytest.raises(ConfigError, match="fsdp2_tp needs --nproc a multiple of 2 and at least 4"):
        compare_dist.check_nproc(2, "fsdp2_tp", "cpu")
    with pytest.raises(ConfigError, match="fsdp2_tp needs --nproc a multiple of 2 and at least 4 .*got 1"):
        compare_dist.check_nproc(1, "fsdp2_tp", "cpu")  # (no --nproc: one process, the mesh would be empty)
    assert compare_dist.check_nproc(4, "fsdp2_tp", "cpu") == "fsdp2_tp"
    assert (compare_dist.check_nproc(2, None, "cpu"), compare_dist.check_nproc(1, None, "cpu")) == ("ddp", None)
    with pytest.raises(ConfigError, match="--parallel tp needs --nproc N > 1"):
        compare_dist.check_nproc(1, "tp", "cpu")
