"""DeepSpeed ZeRO-2 / ZeRO-3 training of a patched model (issue 22): ranks of tests/deepspeed_worker.py.

Skipped where DeepSpeed is not installed (CI): it is no dependency of Tigon. To run them, install it beside the venv,
e.g. ``DS_BUILD_OPS=0 pip install --target /tmp/dspkgs deepspeed==0.19.8 --no-deps`` and its small dependencies
(``einops hjson msgpack ninja py-cpuinfo``, and ``pydantic`` where missing, also ``--target /tmp/dspkgs --no-deps``),
then ``PYTHONPATH=src:/tmp/dspkgs python -m pytest tests/test_deepspeed.py``. On a machine without CUDA the ranks use
DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``), gloo and Triton's interpreter; DeepSpeed builds its small
shared-memory communication extension with ninja and the C++ compiler on first use (cached). The GPU image has no
DeepSpeed and no registry: ``python3 benchmarks/deepspeed_wheels.py download`` here fills ``.wheels/deepspeed/``
(carried there), then ``eval "$(sh .wheels/deepspeed/install.sh)"; python3 -m pytest tests/test_deepspeed.py -s``.

Ranks (:data:`WORLD`): two on the CPU and on a machine with two or more GPUs (NCCL, a GPU each); one on a machine
with exactly one GPU (DeepSpeed's single-process ZeRO-3). ``TIGON_DEEPSPEED_WORLD=1`` (or 2) forces the count, e.g.
to run the one-GPU path on the CPU. At world size 1 every check keeps its meaning: ZeRO-3 still partitions each
parameter (a one-rank partition) and leaves an empty placeholder in the module outside its calls, so where the
head's weight is gathered is compared as at 2 ranks; but it gathers a parameter by a local copy, not an all-gather,
so the worker counts those copies apart and compares them too (the all-gather count alone would miss an extra
gather there; worker's docstring). The gradients are those of the rank's own batch (averaged over one rank).

Each rank trains a tiny Llama (2 layers, hidden 32, vocabulary 64) for 2 SGD steps in fp32, unpatched and patched
under ``deepspeed.initialize``: ZeRO-3 with every parameter partitioned (no persistent parameters, no prefetch, no
reuse distance: the LM head's weight is an empty placeholder outside its module's forward and backward), untied and
tied embeddings, gradient checkpointing, ``tigon.patch`` after ``deepspeed.initialize``, a PEFT ``modules_to_save``
LM head (skipped without PEFT), DeepSpeed's bf16 engine (within 3e-2 of the original, and no farther than twice the
original's distance from the fp32 run: worker's comment); ZeRO-2 untied and tied.
Each rank compares the losses, the averaged whole gradients and the whole parameters (within 1e-5, relative), and
under ZeRO-3 the count of parameter gathers (all-gathers, and local copies at one rank; the original's non-zero)
and where the head's weight is gathered (the fused loss gathers nothing of its own and keeps nothing after use).
``-s`` shows each rank's measured differences and counts.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch


def ranks_to_run() -> int:
    """$TIGON_DEEPSPEED_WORLD if set; else 1 on a machine with exactly one CUDA GPU, 2 on the CPU or on several."""
    forced = os.environ.get("TIGON_DEEPSPEED_WORLD", "").strip()
    if forced:
        return int(forced)
    return 1 if torch.cuda.is_available() and torch.cuda.device_count() == 1 else 2


WORLD = ranks_to_run()
pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < WORLD,
                       reason=f"with CUDA the {WORLD} ranks need a GPU each (NCCL)"),
]

WORKER = os.path.join(os.path.dirname(__file__), "deepspeed_worker.py")
CHECKS = ["zero3", "zero3_tied", "zero3_checkpointing", "zero3_tied_patched_after_init", "zero3_peft_modules_to_save",
          "zero3_bf16", "zero2", "zero2_tied"]


@pytest.fixture(scope="module")
def results() -> list[dict[str, str]]:
    """Per rank: check name -> "OK <differences>" or "FAIL <reason>" (one process-group startup for the module)."""
    pytest.importorskip("transformers")
    from ranks import check_results

    per_rank = check_results(WORKER, WORLD, timeout=300)
    for rank, got in enumerate(per_rank):  # the measured differences and counts (shown with -s)
        for name, status in got.items():
            print(f"rank {rank}/{WORLD} {name}: {status}")
    return per_rank


@pytest.mark.parametrize("check", CHECKS)
def test_patched_model_trains_like_the_original_under_deepspeed(results, check):
    for rank, got in enumerate(results):
        assert check in got, f"rank {rank} ran no check {check!r} (ran {sorted(got)})"
        if got[check].startswith("SKIP"):
            pytest.skip(got[check][5:])
        assert got[check].startswith("OK"), f"rank {rank}, {check}: {got[check]}"


def test_every_worker_check_is_listed(results):
    assert len(results) == WORLD
    assert set(results[0]) == set(CHECKS)
