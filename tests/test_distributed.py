"""Multi-process training of a patched model (issue 22): two gloo ranks on the CPU, DDP and FSDP2.

One launch of tests/distributed_worker.py (2 ranks, Triton's interpreter) trains a tiny Llama for a few steps in every
scenario, unpatched and patched under the same wrapper: DDP (untied and tied embeddings) and FSDP2 with the LM head
in the root unit, as its own unit (resharded after the forward, or kept), grouped with the final norm (torchtitan's
``fully_shard([norm, output])``), with tied embeddings (patched after wrapping), with gradient checkpointing, the
head's unit patched after wrapping, and under a bf16 mixed-precision policy. Each
rank compares its losses, its local gradients (FSDP2: its shards, reduce-scattered by FSDP) and its parameters; the
fused LM-head loss must have run (no logits returned), FSDP2 must have all-gathered as often as for the original
(no gather of Tigon's own), and a head that is its own unit must be sharded after the forward exactly when the
original's is (``reshard_after_forward`` True, or False: kept). Tensor parallelism by vocabulary
(tests/vocab_parallel_checks.py): the vocabulary-parallel losses on each rank's shard equal the plain loss, and a
``ColwiseParallel`` LM head trains patched as unpatched. A DTensor LM-head weight outside FSDP2 sharded otherwise
(row-wise) and a DeepSpeed ZeRO-3 one must be skipped with the reason.

``tigon compare --nproc 2`` (the rank side, tigon.workflows.compare_dist.rank_main, run in the same two processes
under DDP, on the tiny default model for 2 steps): the JSON report has both ranks' peak memory and tokens/s,
the reported losses are the ranks' mean, and the patched losses agree with the original ones as in tests/test_compare.py.
``tigon bench --e2e --nproc 2 --parallel fsdp2`` (original and tigon, 1 step): each row has both ranks' peak memory and tokens/s.

Not covered here: NCCL on several GPUs, DeepSpeed, tensor parallelism of the decoder layers.
"""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from ranks import run_ranks  # noqa: E402

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
WORLD = 2
CHECKS = ["ddp", "ddp_tied", "fsdp", "fsdp_head_unit", "fsdp_head_unit_kept", "fsdp_norm_head_group",
          "fsdp_tied_patched_after_wrap",
          "fsdp_head_unit_checkpointing", "fsdp_head_unit_patched_after_wrap", "fsdp_head_unit_bf16",
          "tensor_parallel_head_skipped", "vocab_parallel_functional", "tensor_parallel_head",
          "compare_ddp", "bench_e2e_fsdp2"]


@pytest.fixture(scope="module")
def compare_dir(tmp_path_factory):
    """Where rank 0 of the worker's compare checks writes their JSON reports."""
    return tmp_path_factory.mktemp("compare")


@pytest.fixture(scope="module")
def results(compare_dir) -> list[dict[str, str]]:
    """Per rank: check name -> "OK <differences>" or "FAIL <reason>" (one process-group startup for the module)."""
    outs = run_ranks(WORKER, WORLD, timeout=240, env={"TIGON_COMPARE_JSON_DIR": str(compare_dir)})
    per_rank = []
    for rank, out in enumerate(outs):
        assert "DONE" in out, f"rank {rank} did not finish:\n{out[-4000:]}"
        lines = [line.split(" ", 2) for line in out.splitlines() if line.startswith("RESULT ")]
        per_rank.append({name: status for _, name, status in lines})
    return per_rank


@pytest.mark.parametrize("check", CHECKS)
def test_patched_model_trains_like_the_original_on_two_ranks(results, check):
    for rank, got in enumerate(results):
        assert check in got, f"rank {rank} ran no check {check!r} (ran {sorted(got)})"
        assert got[check].startswith("OK"), f"rank {rank}, {check}: {got[check]}"


def test_every_worker_check_is_listed(results):
    assert set(results[0]) == set(CHECKS)


def test_deepspeed_zero3_head_is_skipped_and_the_original_runs():
    # A ZeRO-3 parameter is an empty placeholder outside its module's forward; DeepSpeed marks it with ds_id.
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    cfg._attn_implementation = "eager"
    model = transformers.LlamaForCausalLM(cfg).train()
    model.lm_head.weight.ds_id = 0
    report = tigon.patch(model)
    skipped = [e for e in report.skipped if e.kind == "lm_head_loss"]
    assert skipped and "DeepSpeed ZeRO-3" in skipped[0].detail, str(report)
    ids = torch.randint(0, 64, (2, 6))
    out = model(input_ids=ids, labels=ids)
    assert out.logits is not None and torch.isfinite(out.loss)


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
