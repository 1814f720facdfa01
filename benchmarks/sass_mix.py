"""Instruction mix of a kernel's vocabulary loops, compiled for a GPU on a machine without one.

    PYTHONPATH=src python3 benchmarks/sass_mix.py [--arch 90] [--case jsd|fused_linear_jsd|all] [--kind 2]

Triton compiles a kernel to a cubin without a device (``triton.compile`` with a ``GPUTarget``; ptxas and nvdisasm
ship with Triton's NVIDIA backend); this script compiles the kernels the way ``tigon bench`` launches them at
Llama-3-8B's vocabulary (bf16, one row per program, 4096-column blocks, 8 warps, strides and vocabulary divisible by
16 as Triton's launcher specialises them), disassembles them and prints, for each loop (a backward branch), its
SASS instructions per element of a block: the special-function ops (``MUFU.EX2`` / ``MUFU.LG2``) and the total the
schedulers issue. A compute-bound kernel's time follows that total (an H200 issues about 132 x 4 warp-instructions
a clock, 16 special-function results a clock per SM); a memory-bound one's does not. Counts, not timings: the
numbers a change should move before a GPU confirms it.

Kernels: ``jsd`` (tigon.kernels.divergence, generalised JSD, forward with the gradient formed; ``--kind`` picks
another divergence: 0 KL_LOG, 1 KL_LOG_REVERSE, 3 KL_PROB, 4 TVD) and ``fused_linear_jsd`` (the row kernel of
tigon.kernels.fused_linear_jsd: its three passes; ``--kind`` 0 / 1 for jsd_beta 0 / 1); ``--sparsemax 1x2,1x8``: the
loop of sparsemax's forward per launch config (rows a program x warps), instructions and barriers.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BLOCK_V = 4096
ELEMS_PER_THREAD = BLOCK_V // (8 * 32)  # 8 warps


def compile_kernel(fn, types: dict, constexprs: dict, arch: int, warps: int = 8):
    """``fn`` (a ``triton.jit`` function) compiled for sm_``arch``; ``types``: its runtime arguments' Triton types,
    ``constexprs``: the others' values. Pointers, strides and ``V`` marked divisible by 16 (what Triton's launcher
    specialises for Llama-3-8B's 128256 and 16-byte aligned tensors)."""
    names = list(inspect.signature(fn.fn).parameters)
    signature = {n: ("constexpr" if n in constexprs else types[n]) for n in names}
    aligned = [n for n, t in types.items() if t.startswith("*") or n.startswith("stride") or n == "V"]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps})


def _sass(cubin: bytes) -> list[str]:
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
        fh.write(cubin)
        fh.flush()
        return subprocess.run([nvdisasm, "-c", fh.name], capture_output=True, text=True, check=True).stdout.splitlines()


def loop_mixes(cubin: bytes) -> list[collections.Counter]:
    """One Counter of opcodes (MUFU with its function) per loop of the kernel that loads: from a label to a branch
    back to it."""
    lines = _sass(cubin)
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    mixes = []
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+[^`]*`\((\.L_x_\d+)\)", line)
        if not m or labels.get(m.group(1), i) >= i:
            continue
        mix = collections.Counter()
        for body in lines[labels[m.group(1)]:i + 1]:
            op = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]*)?", body)
            if op:
                mix[op.group(1) + ((op.group(2) or "") if op.group(1) == "MUFU" else "")] += 1
        if mix["LDG"]:  # a loop that reads (not the skipped rows' zero stores)
            mixes.append(mix)
    return mixes


def _jsd(arch: int, kind: int):
    from tigon.kernels import divergence as d

    types = dict(X="*bf16", stride_x="i64", Y="*bf16", stride_y="i64", LABELS="*i64", SCALE="*fp32", G="*fp32",
                 stride_gm="i32", stride_gv="i32", LOSS="*fp32", stride_loss="i32", DX="*bf16", stride_dx="i64",
                 DY="*bf16", stride_dy="i32", n_rows="i32", V="i32", ignore_index="i32", beta="fp32", eps="fp32")
    consts = dict(KIND=kind, HAS_LABELS=True, WRITE_LOSS=True, ELEMENTWISE=False, WRITE_DX=True, WRITE_DY=False,
                  HAS_G=False, LOAD_X=True, SKIP_UNIT_G=False, FAST=True, BLOCK_M=1, BLOCK_V=BLOCK_V)
    return compile_kernel(d._divergence_kernel, types, consts, arch)


def _fused_linear_jsd(arch: int, kind: int):
    from tigon.kernels import fused_linear_jsd as f

    types = dict(ZS="*bf16", stride_s="i64", ZT="*bf16", stride_t="i64", LABELS="*i64", SCALE="*fp32", LOSS="*fp32",
                 n_rows="i32", V="i32", ignore_index="i32", inv_t="fp32", beta="fp32", cap_s="fp32", cap_t="fp32")
    consts = dict(KIND=kind, HAS_LABELS=True, WRITE_GRAD=True, FAST=True, BLOCK_M=1, BLOCK_V=BLOCK_V,
                  LANES=BLOCK_V // 8, HAS_CAP_S=False, HAS_CAP_T=False)
    return compile_kernel(f._jsd_logits_kernel, types, consts, arch)


def sparsemax_loop(arch: int, block_m: int, warps: int, block_n: int = 4096) -> tuple[int, int]:
    """(SASS instructions a thread, barriers) of the largest loop of sparsemax's register-path forward
    (tigon.kernels.sparsemax._sparsemax_fwd: Michelot's pass, three reductions over the row) at ``block_m`` rows of
    ``block_n`` bf16 columns a program and ``warps`` warps; warp-instructions a row a pass are the first times
    ``warps / block_m``."""
    from tigon.kernels import sparsemax as k

    types = dict(X="*bf16", Y="*bf16", M="i32", N="i32", stride_x="i64")
    kernel = compile_kernel(k._sparsemax_fwd, types, dict(BLOCK_M=block_m, BLOCK_N=block_n, TOP2=False), arch,
                            warps=warps)
    lines = _sass(kernel.asm["cubin"])
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r"\s*(\.L_x_\d+):", line))}
    best = (0, 0)
    for i, line in enumerate(lines):
        m = re.search(r"BRA\s+[^`]*`\((\.L_x_\d+)\)", line)
        if m and labels.get(m.group(1), i) < i:
            body = lines[labels[m.group(1)]:i + 1]
            ops = sum(1 for b in body if re.search(r"\*/\s+(?:@!?U?P\w+\s+)?[A-Z][A-Z0-9_]*", b))
            best = max(best, (ops, sum("BAR" in b for b in body)))
    return best


CASES = {"jsd": _jsd, "fused_linear_jsd": _fused_linear_jsd}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability x 10 (default 90: H100 / H200)")
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--kind", type=int, default=2, help="divergence kind (default 2: the generalised JSD)")
    parser.add_argument("--sparsemax", default="", help="instead: sparsemax's forward loop at ROWSxWARPS,... launches "
                        "of 4096 columns (e.g. 1x2,1x4,1x8)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default, stated (3.9 warns otherwise)
    if args.sparsemax:
        for cfg in args.sparsemax.split(","):
            bm, w = (int(x) for x in cfg.split("x"))
            ops, bars = sparsemax_loop(args.arch, bm, w)
            print(f"sparsemax 4096 columns, {bm} row(s) x {w} warp(s): loop {ops} instructions a thread, {bars} "
                  f"barriers, {ops * w / bm:.0f} warp-instructions a row a pass (triton {triton.__version__})")
        return
    for name in CASES if args.case == "all" else [args.case]:
        kernel = CASES[name](args.arch, args.kind)
        for i, mix in enumerate(loop_mixes(kernel.asm["cubin"])):
            per = {op: n / ELEMS_PER_THREAD for op, n in mix.most_common()}
            mufu = sum(v for op, v in per.items() if op.startswith("MUFU"))
            head = ", ".join(f"{op} {v:.2f}" for op, v in list(per.items())[:8])
            print(f"{name} kind {args.kind} loop {i}: {sum(per.values()):.1f} instructions / element, "
                  f"{mufu:.2f} special-function ({head})")


if __name__ == "__main__":
    main()
