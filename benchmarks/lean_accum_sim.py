"""Error of accumulating grad_weight in bf16 chunk by chunk (the fused loss's ``accum_dtype=bf16`` mode) against
the unfused bf16 computation, both against float64: a CPU simulation of the worst case, where every token chunk
contributes to every vocabulary row (random labels on a small vocabulary: N = V = 8192, H = 256).

    python benchmarks/lean_accum_sim.py > benchmarks/results/cpu/lean_accum_sim.txt

Both computations round the logits and the logits gradient to bf16 as the H200 path does; "fp32acc" is the
default mode (fp32 accumulator, one rounding at the end), "bf16acc" rounds the running sum after every chunk.
"""

import torch


def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item()


def main():
    torch.manual_seed(0)
    n, h, v = 8192, 256, 8192
    for scale in (1.0, 3.0):  # logits' standard deviation
        hid = torch.randn(n, h, dtype=torch.float64).bfloat16().double()
        w = (torch.randn(v, h, dtype=torch.float64) * scale / h ** 0.5).bfloat16().double()
        y = torch.randint(0, v, (n,))
        y[torch.rand(n) < 0.1] = -100
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
        eager = (gb.T @ hid.float()).bfloat16()
        print(f"logit std {scale}: unfused bf16 grad_weight rel err {rel(eager, gw):.3e}")
        for rows in (256, 512, 1024, 4096):
            acc, acc32 = torch.zeros(v, h, dtype=torch.bfloat16), torch.zeros(v, h)
            for s in range(0, n, rows):
                part = gb[s:s + rows].T @ hid[s:s + rows].float()
                acc = (acc.float() + part).bfloat16()
                acc32 += part
            print(f"  {n // rows:3d} chunks of {rows:4d}: bf16acc {rel(acc, gw):.3e} ({rel(acc, gw) / rel(eager, gw):.2f}x)"
                  f"  fp32acc {rel(acc32.bfloat16(), gw):.3e}")


if __name__ == "__main__":
    main()
