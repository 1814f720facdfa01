"""Bytes the low-rank adds of Tigon's LoRA nodes move today, and what folding them into the base GEMM's K dimension
would save (docs/LORA_FOLDING.md): arithmetic only, no device. ``python3 benchmarks/lora_fold_bytes.py [TOKENS]``.

Shapes: one Llama-3-8B decoder layer (hidden 4096, intermediate 14336, 8 KV heads of 128), LoRA r = 16 on all seven
projections, bf16. Times: bytes at an assumed 4.0 TB/s (the H200's HBM3e peak is 4.8), and the extra K tile of a
folded GEMM at the 693.7 TFLOP/s bf16 matmul rate measured on the H200 (benchmarks/results/h200, session 13).
"""

import argparse

_p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
_p.add_argument("tokens", nargs="?", type=int, default=4096, help="tokens per step (M)")
M = _p.parse_args().tokens
H, I, KV, R, E, LAYERS = 4096, 14336, 1024, 16, 2, 32
BW, RATE, BK, MIB = 4.0e12, 693.7e12, 64, 2**20
PROJ = {"q": (H, H), "k": (KV, H), "v": (KV, H), "o": (H, H), "gate": (I, H), "up": (I, H), "down": (H, I)}  # (N, K)

# today: forward y.addmm_(xa, B^T) reads and writes y (M, N); backward dx.addmm_(dyb, A) reads and writes dx (M, K)
# (in lora_glu_mlp: gate / up's dx is one buffer, so "gate" is dx += d_up W_u and "up" dx += dxb A_gu; "down" is dp)
fwd = {p: 2 * M * n * E for p, (n, k) in PROJ.items()}
bwd = {p: 2 * M * k * E for p, (n, k) in PROJ.items()}
print(f"{M} tokens, per layer: today's addmm_ passes")
for p in PROJ:
    print(f"  {p:5s} forward {fwd[p] / MIB:4.0f} MiB   backward {bwd[p] / MIB:4.0f} MiB")
today = sum(fwd.values()) + sum(bwd.values())
print(f"  total {today / MIB:.0f} MiB/layer, {LAYERS} layers {LAYERS * today / BW * 1e3:.1f} ms")


def tile(n, k):
    """The extra K tile (r < BK) of a folded (M, N, K + r) GEMM, seconds."""
    return 2 * M * n * BK / RATE


saved = {"forward (q, k, v, gate, up, down)": sum(fwd[p] for p in ("q", "k", "v", "gate", "up", "down")),
         "backward dp (dout copied into (M, H + r))": 2 * M * I * E - 2 * M * H * E,
         "backward gate / up dx (re-homed [W_g; W_u; A_gu])": 2 * 2 * M * H * E}
cost = sum(tile(*PROJ[p]) for p in ("q", "k", "v", "gate", "up", "down")) + tile(I, H) + tile(H, 2 * I)
print("folded: saved per layer")
for what, b in saved.items():
    print(f"  {what}: {b / MIB:.0f} MiB")
total = sum(saved.values())
print(f"  total {total / MIB:.0f} MiB/layer; {LAYERS} layers {LAYERS * total / 2**30:.1f} GiB = "
      f"{LAYERS * total / BW * 1e3:.1f} ms, less {LAYERS * cost * 1e3:.1f} ms of extra K tiles")
