"""Sparsemax forward (Michelot's steps from max - 1 until the support stops shrinking; tigon.kernels.sparsemax), on the
GPU. The previous kernel (24 bisection halvings + 2 Michelot steps) was timed against it by this script at commit
e9f08f5 (``git show e9f08f5:benchmarks/sparsemax_tune.py``): benchmarks/results/h200/session22/cD/.

    PYTHONPATH=src python3 benchmarks/sparsemax_tune.py --out $OUT/sparsemax-tune_h200_<date>.json

Per shape (bf16, 16384 x 4096, 8192 x 32000, 4096 x 128256; the last two take the chunked one-program-a-row path)
and logit scale (``--scales``, default 1 and 10: Gaussian rows times the scale): the median ``triton.testing.do_bench``
time of the forward and of forward + backward (the backward kernel is the same for both), the GB/s over the minimal
bytes (forward 2 M N e: read x, write y; backward 3 M N e: read dy and y, write dx) and their fraction of the copy
bandwidth, measured the same way on the same x (``torch.empty_like(x).copy_(x)``, 2 M N e bytes). The forward is
checked against float64 sort-based sparsemax on a few rows first. JSON to ``--out``. ``--configs 1x4,2x16``: also
the register path's forward at those (rows a program)x(warps) launches (register-path shapes only).

``--passes`` (any machine, no GPU needed): passes over a row (the max's included, y's write not) of the old
algorithm, of 8 halvings then Michelot, and of Michelot from max - 1, counted by a PyTorch emulation on Gaussian
bf16 rows of 4096 / 32000 / 128256 at scales 0.1, 1 and 10; mean and max per case, and the emulated tau's error
against the sort-based one:

    PYTHONPATH=src python3 benchmarks/sparsemax_tune.py --passes [--out passes.json]
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

SHAPES = ((16384, 4096), (8192, 32000), (4096, 128256))
PASS_ROWS = {4096: 2048, 32000: 512, 128256: 128}


# --- pass counts, emulated -----------------------------------------------------------------------------------------
def _sort_tau(x: torch.Tensor) -> torch.Tensor:
    zs = torch.sort(x.double(), -1, descending=True).values
    cs = zs.cumsum(-1)
    k = torch.arange(1, x.shape[-1] + 1, dtype=torch.float64, device=x.device)
    kz = (1 + k * zs > cs).sum(-1, keepdim=True)
    return ((cs.gather(-1, kz - 1) - 1) / kz).squeeze(-1)


def emulate(x: torch.Tensor, halvings: int, old: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(tau, passes per row) of the forward on rows x (fp32): the max's pass, ``halvings`` bisection passes on
    [max - 1, max], then either the old kernel's 2 Michelot steps or the current loop (Michelot's step from the lower
    bound, stopping once the support's minimum exceeds the new t), as tigon.kernels.sparsemax runs it."""
    t = x.max(-1).values - 1
    half = torch.full_like(t, 0.5)
    for _ in range(halvings):
        mid = t + half
        t = torch.where(torch.where(x > mid[:, None], x - mid[:, None], 0).sum(-1) >= 1, mid, t)
        half = half * 0.5
    passes = torch.full(t.shape, 1 + halvings, dtype=torch.long, device=x.device)
    if old:
        for _ in range(2):
            supp = x > t[:, None]
            t = (torch.where(supp, x, 0).sum(-1) - 1) / supp.sum(-1).clamp_min(1)
        return t, passes + 2
    active = torch.ones_like(t, dtype=torch.bool)
    while active.any():
        supp = x > t[:, None]
        k = supp.sum(-1).float()
        e = torch.where(supp, x - t[:, None], 0).sum(-1)
        mn = torch.where(supp, x, float("inf")).min(-1).values
        tn = torch.maximum(t, t + (e - 1) / k.clamp_min(1))
        t = torch.where(active, tn, t)
        passes += active.long()
        active &= (mn <= tn) & (k > 0)
    return t, passes


def pass_counts(rows_scale: float = 1.0) -> list[dict]:
    torch.manual_seed(0)
    out = []
    for n, m in PASS_ROWS.items():
        for scale in (0.1, 1.0, 10.0):
            x = (torch.randn(max(1, int(m * rows_scale)), n) * scale).bfloat16().float()
            tau = _sort_tau(x)
            row = {"N": n, "rows": x.shape[0], "scale": scale}
            for name, halvings, old in (("old_bisect24_michelot2", 24, True), ("bisect8_michelot", 8, False),
                                        ("michelot", 0, False)):
                t, p = emulate(x, halvings, old)
                err = ((t.double() - tau).abs() / tau.abs().clamp_min(1)).max().item()
                row[name] = {"mean": round(p.float().mean().item(), 2), "max": int(p.max()), "tau_rel_err": err}
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def _launch_with(k, block_m: int, warps: int):
    """The register path's forward launched with ``block_m`` rows a program and ``warps`` warps (not the default
    :func:`tigon.kernels.norm.fwd_config`)."""
    from tigon.kernels._common import next_pow2

    def fwd(x):
        M, N = x.shape
        y = torch.empty_like(x)
        k._sparsemax_fwd[(triton.cdiv(M, block_m),)](x, y, M, N, x.stride(0), BLOCK_M=block_m, BLOCK_N=next_pow2(N),
                                                     TOP2=k.START_TOP2, num_warps=warps)
        return y
    return fwd


# --- GPU timing ----------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", help="JSON file for the results")
    ap.add_argument("--scales", default="1,10", help="logit scales (Gaussian rows times each), comma-separated")
    ap.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SHAPES), help="MxN,... (bf16)")
    ap.add_argument("--passes", action="store_true", help="emulated pass counts on CPU instead of GPU timings")
    ap.add_argument("--passes-rows", type=float, default=1.0, help="scale the emulation's row counts")
    ap.add_argument("--configs", default="", help="register path only: ROWSxWARPS,... launch configs of the forward "
                    "to time beside the default (e.g. 1x4,1x8,1x16,2x16)")
    args = ap.parse_args()
    if args.passes:
        res = {"passes": pass_counts(args.passes_rows)}
    else:
        res = time_gpu(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


def time_gpu(args) -> dict:
    from tigon.kernels import sparsemax as k
    from tigon.reference.sparsemax import sparsemax as ref

    dev = "cuda"
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__,
           "rows": []}
    for shape in args.shapes.split(","):
        M, N = (int(v) for v in shape.split("x"))
        for scale in (float(s) for s in args.scales.split(",")):
            torch.manual_seed(0)
            x = (torch.randn(M, N, device=dev) * scale).bfloat16()
            dy = torch.randn(M, N, device=dev).bfloat16()
            truth = ref(x[:64].double())
            err = {"new": (k.sparsemax_forward(x)[:64].double() - truth).abs().max().item()}
            e = x.element_size()
            ms_copy = triton.testing.do_bench(lambda: torch.empty_like(x).copy_(x))
            copy_gbps = 2 * M * N * e / ms_copy / 1e6
            row = {"M": M, "N": N, "scale": scale, "copy_ms": ms_copy, "copy_gbps": copy_gbps,
                   "max_abs_err_vs_float64": err}
            y = k.sparsemax_forward(x)
            row["bwd_ms"] = triton.testing.do_bench(lambda: k.sparsemax_backward(dy, y))
            variants = [("new", k.sparsemax_forward)]
            for cfg in filter(None, args.configs.split(",")):
                variants.append((f"cfg_{cfg}", _launch_with(k, *(int(v) for v in cfg.split("x")))))
                err[f"cfg_{cfg}"] = (variants[-1][1](x)[:64].double() - truth).abs().max().item()
            for name, fwd in variants:
                ms_f = triton.testing.do_bench(lambda: fwd(x))
                ms_fb = triton.testing.do_bench(lambda: k.sparsemax_backward(dy, fwd(x)))
                gb_f, gb_fb = 2 * M * N * e / ms_f / 1e6, 5 * M * N * e / ms_fb / 1e6
                row[name] = {"fwd_ms": ms_f, "fwd_gbps": gb_f, "fwd_of_copy": gb_f / copy_gbps,
                             "fwd_bwd_ms": ms_fb, "fwd_bwd_gbps": gb_fb, "fwd_bwd_of_copy": gb_fb / copy_gbps}
            print(json.dumps(row), flush=True)
            res["rows"].append(row)
            torch.cuda.empty_cache()
    return res


if __name__ == "__main__":
    main()
