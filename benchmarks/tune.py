"""Launch tuning on one GPU: each op's Tigon kernel timed under every configuration of its search space (SPACE),
at the shapes its launch heuristic is tuned for, next to the peers; JSON to --out, rewritten after every timing so
that a run cut short keeps what it measured. The heuristics in src/tigon/kernels cite the JSON that chose them.

    PYTHONPATH=src python3 benchmarks/tune.py --out $OUT/tune_<ops>_llama3-8b_h200_<date>.json --ops rms_norm
    PYTHONPATH=src python3 benchmarks/tune.py --out ... --ops cross_entropy --repeat 2    (A B A B: drift shows)
    PYTHONPATH=src python3 benchmarks/tune.py --out ... --ops cross_entropy:2    (its study 2 alone)
    PYTHONPATH=src python3 benchmarks/tune.py --list       (the search space, checked against the kernels; any machine)

A configuration sets attributes of the op's kernel module (``tigon.kernels.<module>``) while it runs: upper-case
knobs are the module's constants, set as they are; lower-case knobs replace one field of what a launch heuristic
returns (FIELDS: e.g. ``bwd_warps`` is the warps of ``norm.bwd_config``'s answer). Each study's grid is the
product of its knobs' values, with the default (no knob set) first. Timing is ``tigon bench``'s
(tigon.workflows.bench.run_op_bench: fwd, bwd and fwd+bwd medians; CUDA-graph replays unless --plain), so a
tuning row and a ``tigon bench`` row of the same shape are the same measurement. Shapes are model presets with
config overrides (e.g. ``hidden_size``), passed to the bench as a config.json.

Earlier tuning (benchmarks/tune_h200.py, named parts, last at commit e3ac8bd:
``git show e3ac8bd:benchmarks/tune_h200.py``) also timed kernels since removed (the split-row and one-pass
cross-entropy, the per-position RoPE, a capped grad_in_forward grid); their results are in
benchmarks/results/h200/session4..session8.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from unittest import mock

# Lower-case knobs: (launch heuristic of the module, index of the field of its answer that the knob replaces).
FIELDS = {
    "fwd_rows": ("fwd_config", 0), "fwd_warps": ("fwd_config", 1),
    "bwd_rows": ("bwd_config", 0), "bwd_progs": ("bwd_config", 1), "bwd_warps": ("bwd_config", 2),
    "bwd_db_by_columns": ("bwd_config", 3), "bwd_block_n": ("bwd_config", 3),  # (norm's; dyt's)
}


def llama(tokens: int, **overrides) -> dict:
    return dict(model="llama3-8b", tokens=tokens, **overrides)


def gemma(tokens: int, **overrides) -> dict:
    return dict(model="gemma2-9b", tokens=tokens, **overrides)


@dataclass(frozen=True)
class Study:
    """A grid of launch configurations of one kernel module, timed at ``shapes`` with ``provider``.

    module: ``tigon.kernels.<module>``. grid: knob -> values (the configs are their product). kernel: a Triton
    kernel of the module whose registers and spills are recorded per config (None: not recorded).
    """

    why: str
    module: str
    shapes: tuple[dict, ...]
    grid: dict[str, tuple] = field(default_factory=dict)
    provider: str = "tigon"
    kernel: str | None = None

    def configs(self) -> list[dict]:
        """The default ({}) then every point of the grid."""
        return [{}] + [dict(zip(self.grid, v)) for v in itertools.product(*self.grid.values())]


# op -> its studies; each study's configs() is the op's search space at those shapes.
SPACE: dict[str, list[Study]] = {
    "rms_norm": [
        Study("forward of rows of 1024 (several rows a program): rows per program x warps", "norm",
              (llama(16384, hidden_size=1024),), {"fwd_rows": (2, 4, 8, 16), "fwd_warps": (2, 4, 8)}),
        Study("backward of whole rows in registers: warps x the weight row held in fp32 (0) or re-read (2) x the "
              "next row prefetched (WIDE_ROW 16384)", "norm",
              (llama(16384, hidden_size=12288), llama(16384, hidden_size=16384)),
              {"bwd_warps": (16, 32), "W_HOLD": (0, 2), "WIDE_ROW": (8192, 16384)}, kernel="_norm_bwd"),
    ],
    "fused_add_rms_norm": [
        Study("backward with the residual's gradient (4 row streams) at Llama-3 rows of 4096: persistent programs x "
              "rows per tile x warps x the next tile's ds prefetched", "norm", (llama(16384),),
              {"bwd_progs": (132, 264), "bwd_rows": (1, 2, 4), "bwd_warps": (8, 16), "DS_PREFETCH": (True, False)},
              kernel="_norm_bwd"),
    ],
    "layer_norm": [
        Study("backward at 1k tokens: programs of the persistent grid (each adds a dW/dB partial row)", "norm",
              (llama(1024),), {"bwd_progs": (32, 64, 128, 264)}),
        Study("backward of rows of 16384: warps x dB by a separate column sum", "norm",
              (llama(16384, hidden_size=16384),), {"bwd_warps": (8, 16, 32), "bwd_db_by_columns": (False, True)},
              kernel="_norm_bwd"),
    ],
    "dyt": [
        Study("backward at Llama-3 rows of 4096 (one pass over x and dy, the next tile prefetched, 2-D grid: column "
              "chunks x row ranges, a partial row per row range): programs x columns a chunk x warps x eviction hints "
              "of the streams", "dyt", (llama(16384),),
              {"bwd_progs": (264, 528), "bwd_block_n": (1024, 2048), "bwd_warps": (8, 16),
               "BWD_EVICT": ("", "evict_first")},
              kernel="_dyt_bwd"),
    ],
    "poly_norm": [
        Study("backward at Llama-3 rows of 4096 (a row a tile, the four row sums in one reduction): the next tile "
              "prefetched or not x persistent programs x warps", "poly_norm", (llama(16384),),
              {"BWD_PREFETCH": (True, False), "bwd_progs": (264, 528), "bwd_warps": (8, 16)},
              kernel="_poly_norm_bwd"),
    ],
    "group_norm": [
        Study("groups of 4 x 4096 (Liger's layout at Llama-3 sizes), one-launch backward: the group in registers "
              "(GROUP_BWD_CHUNK 0) or streamed twice in chunks of 2048 / 4096 / 8192 elements (the second read from "
              "L2) x the chunk's warps", "group_norm", (llama(16384),),
              {"GROUP_BWD_CHUNK": (0, 4096, 8192), "GROUP_BWD_CHUNK_WARPS": (4, 8)}, kernel="_group_bwd_stream"),
    ],
    "rope": [
        Study("row tiles at Llama-3 heads (32 q / 8 kv, D=128): elements per half-tile x warps", "rope",
              tuple(llama(n) for n in (1024, 8192, 65536)),
              {"HALF_TILE": (1024, 2048, 4096, 8192), "TILE_WARPS": (2, 4, 8)}),
        Study("row tiles at Gemma-2 heads (16 q / 8 kv, D=256)", "rope",
              tuple(gemma(n) for n in (4096, 16384, 65536)), {"HALF_TILE": (512, 1024, 2048), "TILE_WARPS": (1, 2, 4)}),
    ],
    "cross_entropy": [
        Study("lazy path: vocabulary block of the forward and gradient passes", "loss_rows",
              (llama(8192),), {"MAX_BLOCK_V": (4096, 8192, 16384)}),
        Study("grad_in_forward: (vocabulary block, warps, second pass last block first)", "loss_rows",
              (llama(8192), llama(65536)),
              {"GRAD_IN_FORWARD_BLOCK": ((8192, 8, False), (8192, 8, True), (16384, 16, True), (32768, 16, True),
                                         (32768, 32, False), (32768, 32, True))},
              provider="tigon_fwdgrad", kernel="_ce_fwd_kernel"),
        Study("grad_in_forward, L2: (block, warps, reverse, eviction hints: 1 keep the first read / drop the re-read "
              "/ stream the stores, 2 stream the stores, 3 drop the re-read and stream the stores; programs per SM, "
              "0: a program per row)", "loss_rows", (llama(8192),),
              {"GRAD_IN_FORWARD_BLOCK": ((8192, 8, True, 1), (8192, 8, True, 2), (8192, 8, True, 3),
                                         (8192, 8, True, 2, 2), (8192, 8, True, 2, 4), (16384, 16, True, 2, 1),
                                         (16384, 16, True, 2, 2), (32768, 32, True, 2, 1), (32768, 32, True, 1, 1),
                                         (16384, 16, True, 1, 2))},
              provider="tigon_fwdgrad", kernel="_ce_fwd_kernel"),
        Study("grad_in_forward, Liger 0.8.5's launch on Hopper (blocks of 32768, 32 warps, first block first) with and "
              "without the L2 hints, against the default's", "loss_rows", (llama(8192),),
              {"GRAD_IN_FORWARD_BLOCK": ((32768, 32, False, 0), (32768, 32, False, 1), (32768, 32, True, 1),
                                         (16384, 16, True, 1), (16384, 32, True, 1), (8192, 16, True, 1))},
              provider="tigon_fwdgrad", kernel="_ce_fwd_kernel"),
    ],
    "fused_linear_cross_entropy": [
        Study("chunk rows at a small hidden size (rows = max(hidden, MIN_CHUNK_ROWS_CUDA)): Qwen2.5-0.5B's head "
              "(896 -> 151936), where the compiled step trails HF + compile (issue 28)", "fused_linear_cross_entropy",
              (dict(model="qwen2.5-0.5b", tokens=4096), dict(model="qwen2.5-0.5b", tokens=16384)),
              {"MIN_CHUNK_ROWS_CUDA": (1024, 2048, 4096, 8192)}),
    ],
}


def _override(fn, fields: dict[int, object]):
    def heuristic(*args, **kwargs):
        out = list(fn(*args, **kwargs))
        for i, v in fields.items():
            out[i] = v
        return tuple(out)

    return heuristic


def patches(module, config: dict) -> dict:
    """The module attributes ``config`` sets (lower-case knobs wrap the heuristic they override).

    Raises:
        AttributeError: a knob names an attribute the module does not have (a kernel or constant since removed).
    """
    attrs, fields = {}, {}
    for knob, value in config.items():
        if knob in FIELDS:
            fn, i = FIELDS[knob]
            fields.setdefault(fn, {})[i] = value
        else:
            attrs[knob] = value
    for fn, f in fields.items():
        attrs[fn] = _override(getattr(module, fn), f)
    missing = [a for a in attrs if not hasattr(module, a)]
    if missing:
        raise AttributeError(f"{module.__name__} has no {', '.join(missing)}")
    return attrs


class KernelSpy:
    """Stands in for a Triton kernel so that the compiled kernel of its last launch (n_regs, n_spills) can be read."""

    def __init__(self, kernel):
        self.kernel, self.last = kernel, None

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.last = launch(*args, **kwargs)
            return self.last

        return run

    def regs(self) -> dict | None:
        k = self.last
        return None if k is None else {"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None)}


def kernel_module(study: Study):
    return importlib.import_module(f"tigon.kernels.{study.module}")


def check(ops) -> list[str]:
    """Every knob and spied kernel of ``ops``' studies against the kernel modules: the problems found."""
    problems = []
    for op in ops:
        for study in SPACE[op]:
            mod = kernel_module(study)
            for config in study.configs():
                try:
                    patches(mod, config)
                except AttributeError as e:
                    problems.append(f"{op}: {e}")
            if study.kernel and not hasattr(mod, study.kernel):
                problems.append(f"{op}: {mod.__name__} has no kernel {study.kernel}")
    return sorted(set(problems))


def label(shape: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


class Bench:
    """``tigon bench`` (run_op_bench) of one op and provider at a shape; shapes with overrides go as a config.json."""

    def __init__(self, tmp: str, plain: bool):
        from tigon.presets import get_preset

        self.tmp, self.plain, self.get_preset, self.ceilings = tmp, plain, get_preset, None

    def model(self, shape: dict) -> str:
        overrides = {k: v for k, v in shape.items() if k not in ("model", "tokens")}
        if not overrides:
            return shape["model"]
        preset = self.get_preset(shape["model"])
        path = os.path.join(self.tmp, label(shape).replace(" ", "_") + ".json")
        with open(path, "w") as f:
            json.dump(dict(preset["config"], model_type=preset["model_type"], **overrides), f)
        return path

    def __call__(self, op: str, providers: list[str], shape: dict) -> list[dict]:
        from tigon.workflows.bench import BenchConfig, run_op_bench

        result = run_op_bench(BenchConfig(ops=[op], model=self.model(shape), providers=providers,
                                          tokens=shape["tokens"], cuda_graph=not self.plain))
        self.ceilings = self.ceilings or result.ceilings
        return result.as_dict()["rows"]


def report(op: str, name: str, rows: list[dict]) -> None:
    for r in rows:
        if r["ms"] is None:
            print(f"{op:14s} {name:44s} {r['provider']:14s} {r['note'][:100]}", flush=True)
        elif r["mode"] == "fwd_bwd" or r["mode"] == "fwd":
            pct = f"{r['pct_copy_bw']:5.1f}%" if r.get("pct_copy_bw") else ""
            print(f"{op:14s} {name:44s} {r['provider']:14s} {r['mode']:7s} {label(r['shape'])[:40]:40s} "
                  f"{r['ms'] * 1e3:9.1f} us {pct}", flush=True)


def ranking(out: dict) -> None:
    """Per op, study and shape: the configs by fwd+bwd time, failed ones last."""
    groups: dict = {}
    for rec in out["results"]:
        if rec.get("config") is None:
            continue
        ms = [r["ms"] for r in rec["rows"] if r["mode"] == "fwd_bwd" and r["provider"] == rec["provider"]]
        key = (rec["op"], rec["study"], label(rec["shape"]))
        groups.setdefault(key, []).append((ms[0] if ms and ms[0] else float("inf"), json.dumps(rec["config"])))
    for (op, study, shape), got in groups.items():
        got.sort()
        print(f"{op} study {study} {shape}: " + ", ".join(f"{c} {ms * 1e3:.1f} us" for ms, c in got[:5]), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON to write (required unless --list)")
    ap.add_argument("--ops", default=",".join(SPACE),
                    help=f"ops to tune, each optionally with the studies to run, op:i:j (default: {','.join(SPACE)})")
    ap.add_argument("--peers", default="compile,liger", help="providers timed once per shape, for reference")
    ap.add_argument("--repeat", type=int, default=1, help="rounds over the configs (alternating, to see drift)")
    ap.add_argument("--plain", action="store_true", help="plain do_bench (host time included), not CUDA graphs")
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting timings after this many seconds")
    ap.add_argument("--list", action="store_true", help="print the search space, check it against the kernels, exit")
    args = ap.parse_args(argv)
    picked = {}  # op -> its studies to run (``op:i:j``), all by default
    for entry in (e for e in args.ops.split(",") if e):
        op, *idx = entry.split(":")
        picked[op] = [int(i) for i in idx] or None
    ops = list(picked)
    unknown = [op for op in ops if op not in SPACE]
    if unknown:
        ap.error(f"no search space for {', '.join(unknown)} (have {', '.join(SPACE)})")
    problems = check(ops)
    if args.list:
        for op in ops:
            for i, s in enumerate(SPACE[op]):
                print(f"{op} study {i} ({s.provider}, tigon.kernels.{s.module}): {s.why}\n"
                      f"    {len(s.configs())} configs x {len(s.shapes)} shapes: {s.grid}\n"
                      f"    shapes: {'; '.join(label(x) for x in s.shapes)}")
        print("\n".join(problems) or "every knob exists in its kernel module")
        return 1 if problems else 0
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if not args.out:
        ap.error("--out is required")
    import torch

    t0 = time.time()
    command = "PYTHONPATH=src python3 benchmarks/tune.py " + " ".join(sys.argv[1:] if argv is None else argv)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    out = {"device": device, "torch": torch.__version__, "ceilings": None, "command": command, "results": []}

    peers = [p for p in args.peers.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(tmp, args.plain)

        def save(rec):
            out["results"].append(rec)
            out["ceilings"] = bench.ceilings
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1, default=str)

        for op in ops:
            seen = []
            for i, study in enumerate(SPACE[op]):
                if picked[op] is not None and i not in picked[op]:
                    continue
                for shape in study.shapes:
                    if peers and shape not in seen:
                        seen.append(shape)
                        rows = bench(op, peers, shape)
                        save({"op": op, "study": i, "config": None, "shape": shape, "provider": "peers", "rows": rows})
                        report(op, "peers", rows)
                mod = kernel_module(study)
                for rnd, config, shape in itertools.product(range(args.repeat), study.configs(), study.shapes):
                    if time.time() - t0 > args.budget_s:
                        print(f"budget spent: {op} study {i} {config} not run", flush=True)
                        continue
                    attrs = patches(mod, config)
                    spy = KernelSpy(getattr(mod, study.kernel)) if study.kernel else None
                    if spy:
                        attrs[study.kernel] = spy
                    with mock.patch.multiple(mod, **attrs) if attrs else contextlib.nullcontext():
                        rows = bench(op, [study.provider], shape)
                    save({"op": op, "study": i, "round": rnd, "config": config, "shape": shape,
                          "provider": study.provider, "rows": rows, "kernel_regs": spy.regs() if spy else None})
                    report(op, json.dumps(config) if config else "default", rows)
                print(f"[{op} study {i} done at {time.time() - t0:.0f}s]", flush=True)
    ranking(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
