"""DeepSpeed ZeRO-2 / ZeRO-3 training of a patched model (issue 22): ranks of tests/deepspeed_worker.py.

Skipped where DeepSpeed is not installed (CI; the GPU image): it is no dependency of Tigon. To run them, install it
beside the venv, e.g. ``DS_BUILD_OPS=0 pip install --target /tmp/dspkgs deepspeed==0.19.8 --no-deps`` and its small
dependencies (``einops hjson msgpack ninja py-cpuinfo``, also ``--target /tmp/dspkgs --no-deps``), then
``PYTHONPATH=src:/tmp/dspkgs python -m pytest tests/test_deepspeed.py``. On a machine without CUDA the ranks use
DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``), gloo and Triton's interpreter; DeepSpeed builds its small
shared-memory communication extension with ninja and the C++ compiler on first use (cached).

Two ranks train a tiny Llama (2 layers, hidden 32, vocabulary 64) for 2 SGD steps in fp32, unpatched and patched
under ``deepspeed.initialize``: ZeRO-3 with every parameter partitioned (no persistent parameters, no prefetch, no
reuse distance: the LM head's weight is an empty placeholder outside its module's forward and backward), untied and
tied embeddings, gradient checkpointing, ``tigon.patch`` after ``deepspeed.initialize``, a PEFT ``modules_to_save``
LM head (skipped without PEFT), DeepSpeed's bf16 engine (within 3e-2 of the original, and no farther than twice the
original's distance from the fp32 run: worker's comment); ZeRO-2 untied and tied.
Each rank compares the losses, the averaged whole gradients and the whole parameters (within 1e-5, relative), and
under ZeRO-3 the count of all-gathers and where the head's weight is gathered (the fused loss gathers nothing of
its own and keeps nothing after use).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.device_count() < 2,
                       reason="with CUDA the two ranks need a GPU each (NCCL)"),
]

WORKER = os.path.join(os.path.dirname(__file__), "deepspeed_worker.py")
WORLD = 2
CHECKS = ["zero3", "zero3_tied", "zero3_checkpointing", "zero3_tied_patched_after_init", "zero3_peft_modules_to_save",
          "zero3_bf16", "zero2", "zero2_tied"]


@pytest.fixture(scope="module")
def results() -> list[dict[str, str]]:
    """Per rank: check name -> "OK <differences>" or "FAIL <reason>" (one process-group startup for the module)."""
    pytest.importorskip("transformers")
    from ranks import check_results

    return check_results(WORKER, WORLD, timeout=300)


@pytest.mark.parametrize("check", CHECKS)
def test_patched_model_trains_like_the_original_under_deepspeed(results, check):
    for rank, got in enumerate(results):
        assert check in got, f"rank {rank} ran no check {check!r} (ran {sorted(got)})"
        if got[check].startswith("SKIP"):
            pytest.skip(got[check][5:])
        assert got[check].startswith("OK"), f"rank {rank}, {check}: {got[check]}"


def test_every_worker_check_is_listed(results):
    assert set(results[0]) == set(CHECKS)
