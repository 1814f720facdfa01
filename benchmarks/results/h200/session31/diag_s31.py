"""Session 31's diagnosis of the bf16 ``fused_linear_logprobs`` CUDA failure (about 20 s on a GPU; prints only).

Session 31's H100 run of ``diag_s30.py`` found Tigon's bf16 log-probabilities equal to the plain computation's
(2e-8 apart) at the test's sizes (33 x 24 -> 157), while the test, whose fixture cuts chunks to 8 x 101 elements
(the 16-row CUDA floor: 2 chunks), finds Tigon 1.4-1.7x the plain error. Suspect: cuBLAS at 16 rows reducing in
bf16 (``allow_bf16_reduced_precision_reduction``). Prints Tigon's and the plain error against float64 with the test's
chunks and without, the flag on and off, and a plain F.linear of 16-row slices.

    PYTHONPATH=$PWD/src:$PWD/tests python3 benchmarks/results/h200/session31/diag_s31.py
"""

import torch

import tigon.functional as F
import tigon.kernels.fused_linear_cross_entropy as flce_ops
from tigon.numerics import rel_l2
from tigon.ops.fused_linear_logprobs import trl_linear_logprobs
from tigon.reference.fused_linear_logprobs import fused_linear_logprobs as ref_logprobs

CUDA = torch.backends.cuda.matmul


def case(seed, n=33, v=157, h=24, std=2.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    hidden = torch.randn(n, h, device="cuda", generator=g).bfloat16()
    weight = (torch.randn(v, h, device="cuda", generator=g) / h**0.5 * std).bfloat16()
    return hidden, weight, torch.randint(0, v, (n,), device="cuda", generator=g)


def errors(hidden, weight, target):
    truth = ref_logprobs(hidden.double(), weight.double(), target)
    tig = F.fused_linear_logprobs(hidden.clone().requires_grad_(), weight.clone().requires_grad_(), target)
    plain = trl_linear_logprobs(hidden, weight, target)
    lg = torch.cat([torch.nn.functional.linear(hidden[s:s + 16], weight) for s in range(0, hidden.shape[0], 16)])
    sliced = (lg.float().log_softmax(-1).gather(-1, target[:, None])[:, 0])
    return [rel_l2(x.detach().double(), truth) for x in (tig, plain, sliced)]


for chunks in ("full", "test's 8 x 101"):
    saved = flce_ops.MAX_CHUNK_ELEMS_CUDA
    if chunks != "full":
        flce_ops.MAX_CHUNK_ELEMS_CUDA = 8 * 101
    for reduced in (True, False):
        flag = CUDA.allow_bf16_reduced_precision_reduction
        CUDA.allow_bf16_reduced_precision_reduction = reduced
        for seed in range(3):
            e = errors(*case(seed))
            print(f"chunks {chunks:15s} reduced {reduced!s:5s} seed {seed}: tigon {e[0]:.2e} plain {e[1]:.2e} "
                  f"plain in 16-row slices {e[2]:.2e}")
        CUDA.allow_bf16_reduced_precision_reduction = flag
    flce_ops.MAX_CHUNK_ELEMS_CUDA = saved
