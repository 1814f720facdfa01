"""``tigon compare --nproc N``: the comparison on N processes, launched through ``torch.distributed.run``.

:func:`tigon.workflows.compare.run_compare` with ``nproc`` > 1 calls :func:`launch` when no process group exists:
it runs ``python -m torch.distributed.run --standalone --nproc-per-node N -m tigon.workflows._nproc_rank ...``
(gloo on CPU, NCCL on CUDA with one GPU per rank, ``LOCAL_RANK``), and each rank (:func:`rank_main`) calls
``run_compare`` again, now inside the group. There every rank builds the same model from the seed, wraps its copy
(:func:`wrap`: ``DistributedDataParallel``, or FSDP2's ``fully_shard`` on each decoder layer and the root), trains
it original and Tigon-patched on its own ``batch_size`` sequences of each step's global batch (N x ``batch_size``
sequences drawn from the seed; rank r takes rows ``r*batch_size .. (r+1)*batch_size``), and the ranks exchange their
measurements (:func:`gather`): the reported losses are the mean of the ranks' losses (the loss of the global batch:
every rank has as many tokens), the step time of a step the slowest rank's, tokens/s the global tokens over those
step times, peak memory the largest rank's, with each rank's own under ``ranks``. Rank 0 writes the report as JSON
to a temporary file, which :func:`launch` reads back into a :class:`~tigon.workflows.compare.CompareResult`; rank 0's
progress reaches the caller's ``progress`` callback through marked lines on stdout.

Inside a process group the caller set up itself (``torch.distributed.is_initialized()``, e.g. a script run by
``torchrun``), ``run_compare(CompareConfig(nproc=WORLD_SIZE, ...))`` runs the rank side directly, on every rank.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ._train import RunStats
from .errors import ConfigError

PROGRESS_MARK = "tigon-compare-progress "
"""Prefix of rank 0's progress lines on stdout: the mark, then the JSON list of the progress call's arguments."""


class DistributedRunError(RuntimeError):
    """The ranks launched by :func:`launch` failed without a report (a crash, a lost rank); their output was shown."""


PARALLEL = ("ddp", "fsdp2", "tp", "fsdp2_tp")
"""How each rank wraps its model when nproc > 1 (:func:`wrap`): data parallel ("ddp", "fsdp2": each rank its own
sequences), tensor parallel ("tp": the ranks share the sequences, each holds its slice of every layer) or both on a
2-D mesh ("fsdp2_tp": :data:`TP_SIZE` ranks per tensor-parallel group, FSDP2 across the groups)."""

TP_SIZE = 2
"""Ranks per tensor-parallel group under "fsdp2_tp" (the mesh is (nproc / TP_SIZE, TP_SIZE), dimensions "dp", "tp":
consecutive ranks share a tensor-parallel group, as on a node's GPUs)."""

DATA_PARALLEL = ("ddp", "fsdp2")
"""The :data:`PARALLEL` modes where every rank trains on its own sequences (``tigon bench --e2e --nproc`` takes only
these)."""


def check_nproc(nproc, parallel, device_type: str, choices: tuple[str, ...] = PARALLEL) -> str | None:
    """Check ``--nproc`` and ``--parallel`` for a run on ``device_type`` ("cpu" or "cuda"); returns the wrapper to use:
    ``parallel``, or "ddp" when it is None and ``nproc`` > 1 (None for one process).

    Raises:
        ConfigError: ``nproc`` is not an integer >= 1, ``parallel`` is not one of ``choices`` (or None), "fsdp2_tp"
            without ``nproc`` a multiple of :data:`TP_SIZE` and at least twice it, ``parallel`` given with ``nproc``
            1 (one process has nothing to wrap for: it would be ignored), or (CUDA) ``nproc`` exceeds the visible
            GPUs (one process per GPU).
    """
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ConfigError(f"--nproc must be an integer >= 1, got {nproc!r}")
    if parallel is not None and parallel not in choices:
        raise ConfigError(f"unknown --parallel {parallel!r} (choose from {', '.join(choices)})")
    if parallel == "fsdp2_tp" and (nproc % TP_SIZE or nproc < 2 * TP_SIZE):
        raise ConfigError(f"--parallel fsdp2_tp needs --nproc a multiple of {TP_SIZE} and at least {2 * TP_SIZE} "
                          f"(a 2-D mesh of data-parallel x {TP_SIZE} tensor-parallel ranks), got {nproc}")
    if parallel is not None and nproc == 1:
        raise ConfigError(f"--parallel {parallel} needs --nproc N > 1 (it wraps the model for N processes; one process "
                          "would ignore it)")
    if device_type == "cuda" and nproc > torch.cuda.device_count():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(f"--nproc {nproc} exceeds the {torch.cuda.device_count()} visible CUDA device(s)"
                          + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else "")
                          + ": one process per GPU")
    return parallel if parallel is not None or nproc == 1 else "ddp"


# ----------------------------------------------------------------------------------------------------------------
# the launching side


WORKFLOWS = ("compare", "e2e")
"""What :func:`launch` can run on N ranks: ``tigon compare`` (:func:`tigon.workflows.compare.run_compare`) and
``tigon bench --e2e`` (:func:`tigon.workflows.e2e.run_e2e`)."""


def torchrun_command(cfg, out_path: str, *, progress: bool = False, workflow: str = "compare") -> list[str]:
    """The command line that runs ``cfg`` (a resolved CompareConfig, or E2EConfig for ``workflow="e2e"``, with
    ``nproc`` > 1) on ``cfg.nproc`` ranks and has rank 0 write the JSON report to ``out_path``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.nproc}",
           "-m", "tigon.workflows._nproc_rank", "--config", json.dumps(dataclasses.asdict(cfg)), "--out", out_path]
    return cmd + (["--workflow", workflow] if workflow != "compare" else []) + (["--progress"] if progress else [])


def _result_from_json(report: dict[str, Any], workflow: str):
    if workflow == "e2e":
        from .e2e import E2ERow, E2EResult

        return E2EResult(**dict(report, rows=[E2ERow(**row) for row in report["rows"]]))
    from .compare import CompareResult

    return CompareResult(**report)


def launch(cfg, progress: Callable | None = None, *, workflow: str = "compare"):
    """Run ``cfg`` (resolved, ``nproc`` > 1) on ``cfg.nproc`` processes through torch.distributed.run and return rank
    0's result: a :class:`~tigon.workflows.compare.CompareResult`, or for ``workflow="e2e"`` an
    :class:`~tigon.workflows.e2e.E2EResult`. ``progress`` gets rank 0's progress calls (the workflow's arguments).

    The ranks inherit this process's environment, with this Tigon first on ``PYTHONPATH`` and ``OMP_NUM_THREADS=1``
    unless set (torchrun's default); their stderr is this process's, their stdout comes here (rank 0's progress lines
    go to ``progress``, everything else to stderr).

    Raises:
        ConfigError: a rank rejected the configuration (the message is rank 0's).
        DistributedRunError: the ranks exited without a report.
    """
    import tigon

    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(tigon.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="tigon-compare-") as tmp:
        out_path = os.path.join(tmp, "report.json")
        cmd = torchrun_command(cfg, out_path, progress=progress is not None, workflow=workflow)
        with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, bufsize=1) as proc:
            for line in proc.stdout:
                if line.startswith(PROGRESS_MARK):
                    if progress is not None:
                        progress(*json.loads(line[len(PROGRESS_MARK):]))
                else:
                    sys.stderr.write(line)
            rc = proc.wait()
        report = None
        if os.path.exists(out_path):
            with open(out_path) as f:
                report = json.load(f)
    if report is not None and "error" in report:
        raise ConfigError(report["error"])
    if rc != 0 or report is None:
        raise DistributedRunError(f"torch.distributed.run with --nproc-per-node={cfg.nproc} exited with status {rc} "
                                  "and no report (the ranks' output is above)")
    return _result_from_json(report, workflow)


# ----------------------------------------------------------------------------------------------------------------
# the rank side


def in_process_group() -> bool:
    """Whether a torch.distributed process group exists in this process."""
    return dist.is_available() and dist.is_initialized()


def rank_and_world(nproc: int) -> tuple[int, int]:
    """This process's rank and the group's size, which must be ``nproc``.

    Raises:
        ConfigError: the process group has another number of ranks.
    """
    world = dist.get_world_size()
    if world != nproc:
        raise ConfigError(f"--nproc {nproc} but the process group has {world} ranks")
    return dist.get_rank(), world


def rank_device() -> torch.device:
    """This rank's GPU (``LOCAL_RANK``, else the rank modulo the visible GPUs), made the current device."""
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count()))
    torch.cuda.set_device(local)
    return torch.device("cuda", local)


def data_parallel(parallel: str, rank: int, world: int) -> tuple[int, int]:
    """``(data-parallel ranks, this rank's index among them)``: how many different shares of a step's global batch
    the ranks train on, and which one this rank takes. DDP / FSDP2: every rank its own (world, rank); tensor
    parallel: one share for all (1, 0); both: one share per tensor-parallel group (world / TP_SIZE, rank // TP_SIZE)."""
    if parallel == "fsdp2_tp":
        return world // TP_SIZE, rank // TP_SIZE
    return (world, rank) if parallel in DATA_PARALLEL else (1, 0)


def _mesh(device_type: str, parallel: str):
    """The device mesh of ``parallel`` over the whole group: 1-D, or (world / TP_SIZE, TP_SIZE) named ("dp", "tp")."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if parallel == "fsdp2_tp":
        return init_device_mesh(device_type, (world // TP_SIZE, TP_SIZE), mesh_dim_names=("dp", "tp"))
    return init_device_mesh(device_type, (world,))


def wrap(model: torch.nn.Module, *, parallel: str, device: torch.device, stage: str = "all") -> torch.nn.Module:
    """``model`` (on ``device``) wrapped for data-parallel or tensor-parallel training.

    parallel: "ddp": ``DistributedDataParallel`` (``device_ids=[device]`` on CUDA); "fsdp2": ``fully_shard`` on each
        module whose class the model names in ``_no_split_modules`` (Hugging Face's decoder layers), then on the root
        (so the embeddings, the final norm and the LM head form the root unit), on a 1-D mesh of every rank; "tp":
        torch's tensor-parallel plan of the whole decoder and the LM head over every rank
        (:func:`tigon.integrations.tp_plan.apply_decoder_tp`; Llama's module names), applied before ``tigon.patch``
        (:func:`tigon.workflows.compare.run_compare` patches the parallelized model); "fsdp2_tp": that plan over each
        tensor-parallel group (the mesh's "tp" dimension), then FSDP2 as for "fsdp2" over the "dp" dimension.
    stage: "all"; or for "tp" / "fsdp2_tp" "tp" (the tensor-parallel plan only) then "rest" (the data-parallel
        wrapping that follows it), so that the model can be patched in between.

    Raises:
        ConfigError: "tp" on a model the plan does not fit (other module names, heads not divisible by the ranks).
    """
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if parallel not in PARALLEL:
        raise ConfigError(f"unknown --parallel {parallel!r} (choose from {', '.join(PARALLEL)})")
    mesh = _mesh(device.type, parallel)
    if parallel in ("tp", "fsdp2_tp") and stage in ("all", "tp"):
        from ..integrations.tp_plan import apply_decoder_tp

        try:
            model = apply_decoder_tp(model, mesh["tp"] if parallel == "fsdp2_tp" else mesh)
        except ValueError as e:
            raise ConfigError(f"--parallel {parallel}: {e}") from None
    if parallel in ("fsdp2", "fsdp2_tp") and stage in ("all", "rest"):
        from torch.distributed.fsdp import fully_shard

        dp = mesh["dp"] if parallel == "fsdp2_tp" else mesh
        names = set(getattr(model, "_no_split_modules", None) or ())
        for module in [m for m in model.modules() if type(m).__name__ in names]:
            fully_shard(module, mesh=dp)
        model = fully_shard(model, mesh=dp)
    return model


def gather(device: torch.device, original: RunStats, patched: RunStats) -> list[dict[str, Any]]:
    """Every rank's ``{"rank", "device", "stats": (original, patched)}``, in rank order, on every rank."""
    from .devices import device_str

    mine = {"rank": dist.get_rank(), "device": device_str(device), "stats": (original, patched)}
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, mine)
    return out


def aggregate(runs: list[RunStats], replicas: int = 1) -> RunStats:
    """One run's measurements over all ranks: the mean loss of each step, the slowest rank's step times, the global
    tokens per step (each rank's tokens, counted once for the ``replicas`` ranks that share them: tensor parallel)
    and their tokens/s over those step times (first step left out, as for one process), the longest wall time, the
    largest peak memory (None if a rank has none), the op calls of all ranks."""
    first, n = runs[0], len(runs[0].losses)
    usage: dict[str, dict[str, int]] = {}
    for r in runs:
        for op, per in r.backend_usage.items():
            for backend, calls in per.items():
                usage.setdefault(op, {})[backend] = usage.get(op, {}).get(backend, 0) + calls
    peaks = [r.peak_memory_bytes for r in runs]
    requested = [r.peak_requested_bytes for r in runs]
    out = RunStats(
        losses=[sum(r.losses[i] for r in runs) / len(runs) for i in range(n)],
        step_times_s=[max(r.step_times_s[i] for r in runs) for i in range(n)],
        tokens_per_step=sum(r.tokens_per_step for r in runs) // replicas,
        wall_time_s=max(r.wall_time_s for r in runs),
        peak_memory_bytes=None if None in peaks else max(peaks),
        peak_memory_method=first.peak_memory_method,
        peak_requested_bytes=None if None in requested else max(requested),
        backend_usage=usage,
        grad_scale=first.grad_scale,
        skipped_steps=list(first.skipped_steps),
    )
    timed = out.step_times_s[1:] if n > 1 else out.step_times_s
    out.tokens_per_s = out.tokens_per_step * len(timed) / sum(timed) if timed and sum(timed) > 0 else 0.0
    return out


def annotate(result, per_rank: list[dict[str, Any]], cfg) -> None:
    """Add the ranks' own measurements and the launch to ``result`` (a CompareResult built from :func:`aggregate`)."""
    world = len(per_rank)
    dp = data_parallel(cfg.parallel, 0, world)[0]
    result.distributed = {
        "nproc": world,
        "parallel": cfg.parallel,
        "backend": dist.get_backend(),
        "launcher": "torch.distributed.run" if "TORCHELASTIC_RUN_ID" in os.environ else "the caller's process group",
        "per_rank_batch_size": cfg.batch_size,
        "global_batch_size": cfg.batch_size * dp,
        "data_parallel": dp,
        "tensor_parallel": world // dp,
    }
    result.ranks = [{
        "rank": r["rank"],
        "device": r["device"],
        "peak_memory_bytes": {"original": o.peak_memory_bytes, "patched": p.peak_memory_bytes},
        "tokens_per_s": {"original": o.tokens_per_s, "patched": p.tokens_per_s},
        "wall_time_s": {"original": o.wall_time_s, "patched": p.wall_time_s},
        "loss_original": o.losses,
        "loss_patched": p.losses,
    } for r in per_rank for o, p in [r["stats"]]]
    result.peak_memory_method += "; the largest rank's (each rank's under ranks)"
    if dp == world:
        share = (f"each on its own {cfg.batch_size} sequences of a global batch of {cfg.batch_size * world}: "
                 "the losses are the mean of the ranks' losses")
    else:
        share = (f"tensor parallel in groups of {world // dp}: each group on its own {cfg.batch_size} sequences of a "
                 f"global batch of {cfg.batch_size * dp}, each rank holding its slice of every layer and of the LM "
                 "head (the loss vocabulary-parallel): the losses are the ranks' mean (equal within a group)")
    result.notes.append(
        f"{world} processes ({cfg.parallel}, {result.distributed['backend']}), {share}, tokens/s the global tokens "
        "per second of the slowest rank's step times, peak memory the largest rank's.")


def _print_progress(*args) -> None:
    """Rank 0's progress call, as a line on stdout for :func:`launch`."""
    print(PROGRESS_MARK + json.dumps(list(args)), flush=True)


def rank_main(argv: list[str] | None = None) -> int:
    """One rank of :func:`launch` (``python -m tigon.workflows._nproc_rank --config JSON --out PATH [--workflow e2e]
    [--progress]``
    under torch.distributed.run): run the comparison in the process group (set up here, gloo or NCCL, unless one
    exists) and have rank 0 write the report, or ``{"error": message}`` for a rejected configuration, to PATH.
    Returns the exit status: 0, also for a rejected configuration (the report says so; a non-zero status would have
    torchrun end the other ranks, rank 0 perhaps before it wrote the report)."""
    from ..support import UnsupportedError

    parser = argparse.ArgumentParser(prog="python -m tigon.workflows._nproc_rank")
    parser.add_argument("--config", required=True, help="the resolved CompareConfig (E2EConfig) as JSON")
    parser.add_argument("--out", required=True, help="where rank 0 writes the JSON report")
    parser.add_argument("--workflow", default="compare", choices=WORKFLOWS, help="default: compare")
    parser.add_argument("--progress", action="store_true", help="rank 0 prints progress lines on stdout")
    args = parser.parse_args(argv)
    if args.workflow == "e2e":
        from .e2e import E2EConfig as Config
        from .e2e import run_e2e as run_workflow
    else:
        from .compare import CompareConfig as Config
        from .compare import run_compare as run_workflow
    cfg = Config(**json.loads(args.config))
    own_group = not in_process_group()
    if own_group:
        if cfg.device == "cuda":
            dist.init_process_group("nccl", device_id=rank_device())  # bound to this rank's GPU
        else:
            dist.init_process_group("gloo")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    progress = _print_progress if args.progress else None
    report = None
    try:
        with warnings.catch_warnings():
            # as the CLI: the interpreter's numpy warnings on overflow; such a run is reported non-finite or diverged
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"(numpy|triton)\.")
            report = run_workflow(cfg, progress).as_dict()
    except (ConfigError, UnsupportedError) as e:
        # every rank rejects the same configuration; exiting 0 keeps torchrun from killing rank 0 before it writes
        report = {"error": str(e)}
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    if own_group:
        dist.destroy_process_group()
    return 0

