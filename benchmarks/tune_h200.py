"""Launch-heuristic exploration on one GPU (one device call): each variant of a kernel's launch configuration
timed through tigon.workflows.bench (CUDA-graph replays: kernel time), at the sweep points where Tigon missed
its target; JSON to --out. The chosen heuristics cite this file.

    PYTHONPATH=src python3 benchmarks/tune_h200.py --out tune.json [--parts PART,PART,...]   (parts below)

Parts (session 4's "ce" part, the split-row in-place cross-entropy, and its "rope" part, heads per program of the
per-position RoPE kernel, went with those kernels; their results are in results/h200/session4/):
  norm     rms_norm fwd at hidden 1024 (rows per program x warps); layer_norm fwd+bwd at 1k tokens (programs);
           rms/layer_norm fwd+bwd at hidden 16384 (warps of the whole-row register path)
  ce_host  cross-entropy at 1k tokens with plain do_bench and a torch.profiler table of the host-side ops
  rope_rows  RoPE's row-tile kernel (session 6): fwd and fwd+bwd against compile / Liger and against the
           per-position kernel it replaced (--old-rope: that file, git show 7d35902:src/tigon/ops/rope.py with
           absolute imports), tile elements x warps, and the forward in place (Liger's memory traffic) at 1k-8k
  rms16k   rms_norm fwd+bwd at 16384 x 16384: backward warps, with and without the next row prefetched
  ce_fwdgrad  (session 7, commit de4d349, since removed with the grid cap it tuned) cross-entropy with
           grad_in_forward: programs per SM of a capped grid (1, 2, 4, uncapped) x vocabulary block (8192, 16384)
  ce_large cross-entropy at 8k-64k tokens, fwd and fwd+bwd, plain do_bench: tigon (lazy), tigon_inplace,
           tigon_fwdgrad (grad_in_forward) and Liger (which forms the gradient in its forward too)
  ce_fwdgrad_block  grad_in_forward's (vocabulary block, warps) at 8k / 32k / 64k tokens, with tigon and Liger
  rms_hold rms_norm fwd+bwd at hidden 12288 / 16384: how the backward holds the weight row (norm.W_HOLD) x warps
           x prefetch, with the backward kernels' registers and spills (Liger's too)
  ce_onepass  (session 8, commit 8f4fd00, since removed) grad_in_forward's one-pass kernel (a row split into tasks
           that meet at per-row counters): (columns per task, warps, programs per SM)
  ce_order (session 8) grad_in_forward's (vocabulary block, warps, reverse: the gradient's pass last block first)
           at 8k tokens, the best three at 32k / 64k
  ce_reverse_ab  (session 8) grad_in_forward at (8192, 8): first block first against last block first, twice
  rotate   rope and rms_norm at 1k-8k tokens, fwd and fwd+bwd, with the bench's rotated input sets and, as the
           control, one set (the earlier sweeps' method, which left small inputs in the L2 cache)
"""

import argparse
import contextlib
import json
import time

import torch

import tigon.kernels.norm as norm_ops
import tigon.kernels.rope as rope_ops
import tigon.workflows.bench as bench_mod
from tigon.presets import PRESETS
from tigon.workflows.bench import measure_ceilings, run_bench, shapes_from_config

CFG = PRESETS["llama3-8b"]["config"]


@contextlib.contextmanager
def patched(module, **attrs):
    old = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)


def timed(op, shapes, providers, ceilings, modes, cuda_graph=True):
    r = run_bench([op], {op: shapes}, providers, ceilings=ceilings, modes=modes, cuda_graph=cuda_graph)
    return [dict(provider=x.provider, shape=x.shape, mode=x.mode, ms=x.ms, pct_copy_bw=x.pct_copy_bw,
                 peak_extra_bytes=x.peak_extra_bytes, note=x.note) for x in r.rows]


def part_norm(ceilings, out):
    h1k = [dict(shapes_from_config(CFG, tokens=16384)["rms_norm"], hidden=1024)]
    out["rms_h1k_peers"] = timed("rms_norm", h1k, ["compile", "tigon", "liger"], ceilings, ("fwd",))
    report(out, "rms_h1k_peers")
    for target in (2048, 4096, 8192, 16384):
        for warps in (2, 4, 8):
            cfg = (lambda block_n, device, t=target, w=warps: (max(1, min(64, t // block_n)), w))
            with patched(norm_ops, fwd_config=cfg):
                out[f"rms_h1k_fwd_t{target}_w{warps}"] = timed("rms_norm", h1k, ["tigon"], ceilings, ("fwd",))
            report(out, f"rms_h1k_fwd_t{target}_w{warps}")
    t1k = [shapes_from_config(CFG, tokens=1024)["layer_norm"]]
    out["ln_t1k_peers"] = timed("layer_norm", t1k, ["eager", "compile", "tigon"], ceilings, ("fwd_bwd",))
    report(out, "ln_t1k_peers")
    base = norm_ops.bwd_config
    for progs in (32, 64, 128, 264):
        cfg = (lambda M, block_n, device, is_rms, p=progs:
               (base(M, block_n, device, is_rms)[0], p) + base(M, block_n, device, is_rms)[2:])
        with patched(norm_ops, bwd_config=cfg):
            out[f"ln_t1k_progs{progs}"] = timed("layer_norm", t1k, ["tigon"], ceilings, ("fwd_bwd",))
        report(out, f"ln_t1k_progs{progs}")
    for op in ("rms_norm", "layer_norm"):
        h16k = [dict(shapes_from_config(CFG, tokens=16384)[op], hidden=16384)]
        out[f"{op}_h16k_peers"] = timed(op, h16k, ["compile", "tigon", "liger"], ceilings, ("fwd_bwd",))
        report(out, f"{op}_h16k_peers")
        for warps in (8, 16, 32):
            for cols in ((False, True) if op == "layer_norm" else (False,)):
                cfg = (lambda M, block_n, device, is_rms, w=warps, c=cols:
                       base(M, block_n, device, is_rms)[:2] + (w, c))
                key = f"{op}_h16k_w{warps}" + ("_dbcols" if cols else "")
                with patched(norm_ops, bwd_config=cfg):
                    out[key] = timed(op, h16k, ["tigon"], ceilings, ("fwd_bwd",))
                report(out, key)


def part_ce_host(ceilings, out):
    import tigon.functional as F
    shapes = [shapes_from_config(CFG, tokens=n)["cross_entropy"] for n in (1024, 2048)]
    out["ce_host_plain"] = timed("cross_entropy", shapes, ["compile", "tigon", "tigon_inplace"], ceilings,
                                 ("fwd", "fwd_bwd"), cuda_graph=False)
    report(out, "ce_host_plain")
    x = torch.randn(1024, 128256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = torch.randint(0, 128256, (1024,), device="cuda")
    for _ in range(5):
        F.cross_entropy(x, t).backward()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            F.cross_entropy(x, t).backward()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cpu_time_total", row_limit=25)
    print(table, flush=True)
    out["ce_host_profile_table"] = table


ROPE_TOKENS = (1024, 2048, 4096, 8192, 32768, 65536)


def part_rope_rows(ceilings, out, old_rope=None):
    import importlib.util

    import triton.testing
    shapes = [shapes_from_config(CFG, tokens=n)["rope"] for n in ROPE_TOKENS]
    out["rope_rows_peers"] = timed("rope", shapes, ["compile", "tigon", "liger"], ceilings, ("fwd", "fwd_bwd"))
    report(out, "rope_rows_peers")
    if old_rope:
        spec = importlib.util.spec_from_file_location("rope_heads_old", old_rope)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        with patched(rope_ops, rope_apply=old.rope_apply):
            out["rope_heads_old"] = timed("rope", shapes, ["tigon"], ceilings, ("fwd", "fwd_bwd"))
        report(out, "rope_heads_old")
    for tile in (1024, 2048, 4096, 8192):
        for warps in (2, 4, 8):
            with patched(rope_ops, HALF_TILE=tile, TILE_WARPS=warps):
                out[f"rope_rows_t{tile}_w{warps}"] = timed("rope", shapes, ["tigon"], ceilings, ("fwd",))
            report(out, f"rope_rows_t{tile}_w{warps}")
    from tigon.workflows.bench import CASES
    rows = []
    for s in shapes[:4]:
        inp = CASES["rope"].make(s, torch.bfloat16, torch.device("cuda"))
        q, k = inp["q"].detach(), inp["k"].detach()
        ms = triton.testing.do_bench_cudagraph(
            lambda: rope_ops.rope_apply(q, k, inp["cos"], inp["sin"], 1, False, inplace=True), rep=100)
        rows.append(dict(provider="tigon_rows_inplace", shape=s, mode="fwd", ms=ms))
        print(f"rope inplace fwd {s['tokens']:6d} {ms * 1e3:8.1f} us", flush=True)
    out["rope_rows_inplace_fwd"] = rows


def part_rms16k(ceilings, out):
    h16k = [dict(shapes_from_config(CFG, tokens=16384)["rms_norm"], hidden=16384)]
    out["rms16k_peers"] = timed("rms_norm", h16k, ["compile", "tigon", "liger"], ceilings, ("fwd_bwd",))
    report(out, "rms16k_peers")
    base = norm_ops.bwd_config
    for prefetch in (False, True):
        for warps in (8, 16, 32):
            for mult in ((1, 2) if warps == 8 else (1,)):
                cfg = (lambda M, block_n, device, is_rms, w=warps, m=mult:
                       (1, min(M, m * base(M, block_n, device, is_rms)[1]), w, False))
                key = f"rms16k_w{warps}_p{mult}" + ("_prefetch" if prefetch else "")
                with patched(norm_ops, bwd_config=cfg, WIDE_ROW=16384 if prefetch else norm_ops.WIDE_ROW):
                    out[key] = timed("rms_norm", h16k, ["tigon"], ceilings, ("fwd_bwd",))
                report(out, key)


def part_ce_large(ceilings, out):
    shapes = [shapes_from_config(CFG, tokens=n)["cross_entropy"] for n in (8192, 16384, 32768, 65536)]
    out["ce_large"] = timed("cross_entropy", shapes, ["tigon", "tigon_inplace", "tigon_fwdgrad", "liger"], ceilings,
                            ("fwd", "fwd_bwd"), cuda_graph=False)
    report(out, "ce_large")


def part_ce_fwdgrad_block(ceilings, out):
    import tigon.kernels.cross_entropy as ce_ops
    shapes = [shapes_from_config(CFG, tokens=n)["cross_entropy"] for n in (8192, 32768, 65536)]
    out["ce_fwdgrad_block_liger"] = timed("cross_entropy", shapes, ["tigon", "liger"], ceilings, ("fwd", "fwd_bwd"),
                                          cuda_graph=False)
    report(out, "ce_fwdgrad_block_liger")
    for block in ((8192, 8, False), (16384, 16, False), (16384, 32, False), (32768, 16, False), (32768, 32, False)):
        key = f"ce_fwdgrad_v{block[0]}_w{block[1]}"
        with patched(ce_ops, GRAD_IN_FORWARD_BLOCK=block):
            out[key] = timed("cross_entropy", shapes, ["tigon_fwdgrad"], ceilings, ("fwd", "fwd_bwd"),
                             cuda_graph=False)
        report(out, key)


# (session 8 ran these with a third choice, the last block held in registers, at commit a53ab97; it was slower and
# was removed: tune11_ce_order.json)
GRAD_ORDER_BLOCKS = ((32768, 32, False), (32768, 32, True), (32768, 16, True), (16384, 16, True), (8192, 8, True))


def part_ce_reverse_ab(ceilings, out):
    """(8192, 8) first block first against last block first, alternating twice, at 8k and 64k tokens."""
    import tigon.kernels.cross_entropy as ce_ops
    shapes = [shapes_from_config(CFG, tokens=n)["cross_entropy"] for n in (8192, 65536)]
    for rnd in range(2):
        for reverse in (False, True):
            key = f"ce_reverse_ab_r{rnd}_{'reverse' if reverse else 'forward'}"
            with patched(ce_ops, GRAD_IN_FORWARD_BLOCK=(8192, 8, reverse)):
                out[key] = timed("cross_entropy", shapes, ["tigon_fwdgrad"], ceilings, ("fwd_bwd",), cuda_graph=False)
            report(out, key)


def part_ce_order(ceilings, out):
    import tigon.kernels.cross_entropy as ce_ops
    shapes = [shapes_from_config(CFG, tokens=n)["cross_entropy"] for n in (8192, 32768, 65536)]
    out["ce_order_base"] = timed("cross_entropy", shapes, ["tigon", "liger"], ceilings, ("fwd", "fwd_bwd"),
                                 cuda_graph=False)
    report(out, "ce_order_base")
    for block in GRAD_ORDER_BLOCKS:
        key = "ce_order_v{}_w{}_o{:d}".format(*block)
        spy = KernelSpy(ce_ops._ce_fwd_kernel)
        with patched(ce_ops, GRAD_IN_FORWARD_BLOCK=block, _ce_fwd_kernel=spy):
            out[key] = timed("cross_entropy", shapes[:1], ["tigon_fwdgrad"], ceilings, ("fwd_bwd",), cuda_graph=False)
        out[key + "_regs"] = spy.regs()
        report(out, key)
        print(key, spy.regs(), flush=True)

    def ms(block):
        return min([r["ms"] for r in out["ce_order_v{}_w{}_o{:d}".format(*block)] if r["ms"]] or [1e9])

    for block in sorted(GRAD_ORDER_BLOCKS, key=ms)[:3]:
        key = "ce_order_large_v{}_w{}_o{:d}".format(*block)
        with patched(ce_ops, GRAD_IN_FORWARD_BLOCK=block):
            out[key] = timed("cross_entropy", shapes[1:], ["tigon_fwdgrad"], ceilings, ("fwd_bwd",), cuda_graph=False)
        report(out, key)


class KernelSpy:
    """Wraps a Triton kernel so that the compiled kernel of its last launch (n_regs, n_spills) can be read."""

    def __init__(self, kernel):
        self.kernel, self.last = kernel, None

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            self.last = launch(*args, **kwargs)
            return self.last

        return run

    def regs(self):
        k = self.last
        return None if k is None else {"n_regs": getattr(k, "n_regs", None), "n_spills": getattr(k, "n_spills", None)}


def part_rms_hold(ceilings, out):
    shapes = [dict(shapes_from_config(CFG, tokens=16384)["rms_norm"], hidden=h) for h in (12288, 16384)]
    out["rms_hold_peers"] = timed("rms_norm", shapes, ["compile", "tigon", "liger"], ceilings, ("fwd", "fwd_bwd"))
    report(out, "rms_hold_peers")
    try:
        import liger_kernel.ops.rms_norm as lrms

        spy = KernelSpy(lrms._rms_norm_backward_kernel)
        with patched(lrms, _rms_norm_backward_kernel=spy):
            timed("rms_norm", shapes[1:], ["liger"], ceilings, ("fwd_bwd",))
        out["rms_hold_liger_regs"] = spy.regs()
        print("liger bwd kernel", spy.regs(), flush=True)
    except Exception as e:  # noqa: BLE001 - diagnostics only
        out["rms_hold_liger_regs"] = f"failed: {e!r}"
    base = norm_ops.bwd_config
    for hold in (0, 2):  # (1, the row in its storage dtype, ran in session7/tune7_rms.json and was removed)
        for warps in (16, 32):
            for prefetch in (False, True):
                cfg = (lambda M, block_n, device, is_rms, w=warps: (1, base(M, block_n, device, is_rms)[1], w, False))
                key = f"rms_hold{hold}_w{warps}" + ("_prefetch" if prefetch else "")
                spy = KernelSpy(norm_ops._norm_bwd)
                with patched(norm_ops, bwd_config=cfg, W_HOLD=hold, _norm_bwd=spy,
                             WIDE_ROW=16384 if prefetch else norm_ops.WIDE_ROW):
                    out[key] = timed("rms_norm", shapes, ["tigon"], ceilings, ("fwd_bwd",))
                out[key + "_regs"] = spy.regs()
                report(out, key)
                print(key, spy.regs(), flush=True)


def part_rotate(ceilings, out):
    for op in ("rope", "rms_norm"):
        shapes = [shapes_from_config(CFG, tokens=n)[op] for n in (1024, 2048, 4096, 8192)]
        out[f"rotate_{op}"] = timed(op, shapes, ["compile", "tigon", "liger"], ceilings, ("fwd", "fwd_bwd"))
        report(out, f"rotate_{op}")
        with patched(bench_mod, rotation_sets=lambda nbytes, device: 1):
            out[f"rotate_{op}_one_set"] = timed(op, shapes, ["tigon", "liger"], ceilings, ("fwd", "fwd_bwd"))
        report(out, f"rotate_{op}_one_set")


def report(out, key):
    for r in out[key]:
        if r["ms"] is None:
            print(f"{key:28s} {r['provider']:14s} {r['note']}", flush=True)
        else:
            print(f"{key:28s} {r['provider']:14s} {r['mode']:7s} {json.dumps(r['shape'])} {r['ms'] * 1e3:9.1f} us "
                  f"{(r['pct_copy_bw'] or 0):5.1f}% {r['note']}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="norm,ce_host,rope_rows,rms16k,rms_hold,rotate,ce_large")
    ap.add_argument("--old-rope", help="rope_rows: the per-position kernel's file, timed in the same run")
    args = ap.parse_args()
    t0 = time.time()
    ceilings = measure_ceilings(torch.device("cuda"))
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ceilings": ceilings,
           "command": f"PYTHONPATH=src python3 benchmarks/tune_h200.py --out {args.out} --parts {args.parts}"
                      + (f" --old-rope {args.old_rope}" if args.old_rope else "")}
    for part in args.parts.split(","):
        fn = globals()[f"part_{part}"]
        fn(ceilings, out, args.old_rope) if part == "rope_rows" else fn(ceilings, out)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
        print(f"[{part} done at {time.time() - t0:.0f}s]", flush=True)


if __name__ == "__main__":
    main()
