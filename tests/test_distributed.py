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
          "tensor_parallel_head_skipped", "vocab_parallel_functional", "tensor_parallel_head"]


@pytest.fixture(scope="module")
def results() -> list[dict[str, str]]:
    """Per rank: check name -> "OK <differences>" or "FAIL <reason>" (one process-group startup for the module)."""
    outs = run_ranks(WORKER, WORLD, timeout=240)
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
