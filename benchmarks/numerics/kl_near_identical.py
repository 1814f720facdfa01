"""kl_div's probability-target kernel on a near-identical pair (input = target + small noise: the KL is second order
in the gap while its terms are first order, so the row sums cancel and any bias in log y - x shows), against float64
and next to torch's fp32 ``kl_div``; 12 seeds, 8 x 3001, batchmean. On the CPU the kernel runs in Triton's
interpreter with the GPU's fp32 arithmetic (the mantissa's log is a polynomial in FMAs, no special function).

    TRITON_INTERPRET=1 PYTHONPATH=src python3 benchmarks/numerics/kl_near_identical.py
"""

import argparse

import torch

from tigon import functional as F
from tigon.reference import divergence as R


def main() -> None:
    """Prints the relative error range of Tigon's kl_div and of torch's over the seeds."""
    errs, terrs = [], []
    for seed in range(12):
        torch.manual_seed(seed)
        n, v = 8, 3001
        logits = torch.randn(n, v) * 2.0
        y = torch.log_softmax(logits, -1).exp()
        x = torch.log_softmax(logits + 0.01 * torch.randn(n, v), -1)
        truth = R.kl_div(input=x.double(), target=y.double(), reduction="batchmean")
        got = F.kl_div(input=x, target=y, reduction="batchmean").double()
        plain = torch.nn.functional.kl_div(x, y, reduction="batchmean").double()
        errs.append(abs(got / truth - 1).item())
        terrs.append(abs(plain / truth - 1).item())
    print("near-identical KL (8 x 3001, batchmean, 12 seeds), relative error against float64:")
    print(f"  Tigon (interpreter, the GPU's fp32 arithmetic): {min(errs):.1e} .. {max(errs):.1e}")
    print(f"  torch fp32: {min(terrs):.1e} .. {max(terrs):.1e}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
