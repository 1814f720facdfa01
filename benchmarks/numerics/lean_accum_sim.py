"""Error of accumulating grad_weight in bf16 chunk by chunk (the fused loss's accum_dtype=bf16 mode) against the
unfused bf16 computation, both against float64: a CPU simulation of the worst case, where every token chunk
contributes to every vocabulary row (random labels on a small vocabulary: N = V = 8192, H = 256).

Any machine (CPU, under a minute):
    PYTHONPATH=src python3 benchmarks/numerics/lean_accum_sim.py > benchmarks/results/cpu/lean_accum_sim.txt
    PYTHONPATH=src python3 benchmarks/numerics/lean_accum_sim.py --out lean-accum-sim_synthetic_cpu_<date>.json

Both computations round the logits and the logits gradient to bf16 as the H200 path does; "fp32acc" is the default
mode (fp32 accumulator, one rounding at the end), "bf16acc" rounds the running sum after every chunk.
"""

import sys

import torch
from _runner import rel_l2, run

N, H, V = 8192, 256, 8192
CHUNK_ROWS = (256, 512, 1024, 4096)


def study(args) -> dict:
    torch.manual_seed(0)
    out = {"n": N, "hidden": H, "vocab": V, "by_logit_std": {}}
    for scale in (1.0, 3.0):  # logits' standard deviation
        hid = torch.randn(N, H, dtype=torch.float64).bfloat16().double()
        w = (torch.randn(V, H, dtype=torch.float64) * scale / H ** 0.5).bfloat16().double()
        y = torch.randint(0, V, (N,))
        y[torch.rand(N) < 0.1] = -100
        valid = y != -100
        g = torch.softmax(hid @ w.T, 1)
        g[valid, y[valid]] -= 1
        g[~valid] = 0
        g /= valid.sum()
        gw = g.T @ hid
        zb = (hid.float() @ w.float().T).bfloat16().float()
        gb = torch.softmax(zb, 1)
        gb[valid, y[valid]] -= 1
        gb[~valid] = 0
        gb = (gb / valid.sum().float()).bfloat16().float()
        unfused = rel_l2((gb.T @ hid.float()).bfloat16(), gw)
        print(f"logit std {scale}: unfused bf16 grad_weight rel err {unfused:.3e}")
        rows_out = []
        for rows in CHUNK_ROWS:
            acc, acc32 = torch.zeros(V, H, dtype=torch.bfloat16), torch.zeros(V, H)
            for s in range(0, N, rows):
                part = gb[s:s + rows].T @ hid[s:s + rows].float()
                acc = (acc.float() + part).bfloat16()
                acc32 += part
            bf16acc, fp32acc = rel_l2(acc, gw), rel_l2(acc32.bfloat16(), gw)
            print(f"  {N // rows:3d} chunks of {rows:4d}: bf16acc {bf16acc:.3e} ({bf16acc / unfused:.2f}x)"
                  f"  fp32acc {fp32acc:.3e}")
            rows_out.append({"chunks": N // rows, "rows": rows, "bf16acc": bf16acc, "fp32acc": fp32acc})
        out["by_logit_std"][str(scale)] = {"unfused_bf16": unfused, "chunked": rows_out}
    return out


if __name__ == "__main__":
    sys.exit(run(__doc__, study))
