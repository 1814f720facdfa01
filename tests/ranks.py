"""Launch a worker script as several torch.distributed ranks (gloo on the CPU, or NCCL) and collect their output.

Used by tests/test_dtensor.py and tests/test_distributed.py: each rank is ``python <worker>`` with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT set (a free port on 127.0.0.1), and TRITON_INTERPRET=1 on a machine without
CUDA (the kernels must be interpreted on every rank, as conftest does for this process), and OMP_NUM_THREADS=1 unless
set (as torchrun does).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import torch


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker: str, world: int, *, args: tuple[str, ...] = (), env: dict | None = None,
              timeout: float = 300) -> list[str]:
    """Run ``worker`` as ``world`` ranks; returns each rank's stdout + stderr.

    Raises:
        AssertionError: a rank exited non-zero (its last 4000 characters of output in the message).
        subprocess.TimeoutExpired: a rank ran longer than ``timeout`` seconds (every rank is killed first).
    """
    port = str(free_port())
    procs = []
    for rank in range(world):
        # one intra-op thread per rank, as torchrun sets: ranks sharing a few cores would otherwise oversubscribe them
        penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=port, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), **(env or {}))
        if not torch.cuda.is_available():
            penv["TRITON_INTERPRET"] = "1"  # the kernels, interpreted, on each rank (as conftest)
        procs.append(subprocess.Popen([sys.executable, worker, *args], env=penv, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{out[-4000:]}"
    return outs


def check_results(worker: str, world: int, *, env: dict | None = None, timeout: float = 300) -> list[dict[str, str]]:
    """Run ``worker`` as ``world`` ranks (:func:`run_ranks`) and read each rank's ``RESULT <check> <status>`` lines:
    per rank, check name -> status ("OK <differences>", "FAIL <reason>" or "SKIP <reason>").

    Raises:
        AssertionError: a rank did not print ``DONE`` (its last 4000 characters of output in the message), or as
            :func:`run_ranks`.
    """
    per_rank = []
    for rank, out in enumerate(run_ranks(worker, world, env=env, timeout=timeout)):
        assert "DONE" in out, f"rank {rank} did not finish:\n{out[-4000:]}"
        lines = [line.split(" ", 2) for line in out.splitlines() if line.startswith("RESULT ")]
        per_rank.append({name: status for _, name, status in lines})
    return per_rank


def finish(line: str) -> None:
    """End a worker rank: destroy its process group, print ``line`` (the marker the test reads) and leave without the
    interpreter's shutdown. Ranks that had passed every check were seen to abort there in CI ("terminate called
    without an active exception": a C++ thread of torch.distributed still joinable at exit), failing the whole
    launch after the results were printed."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    print(line, flush=True)
    sys.stderr.flush()
    os._exit(0)
