"""PolyNorm reference (Zhuo et al. 2024, "Polynomial Composition Activations: Unleashing the Dynamics of Large
Language Models", arXiv:2411.03884, github.com/BryceZhuo/PolyCom; Liger-Kernel's ``liger_poly_norm``)."""

from __future__ import annotations

import torch


def poly_norm(X: torch.Tensor, W: torch.Tensor, B: torch.Tensor, eps: float = 1e-6,
              in_place: bool = True) -> torch.Tensor:
    """``y = W[0] norm(X^3) + W[1] norm(X^2) + W[2] norm(X) + B`` with ``norm(u) = u / sqrt(mean(u^2, -1) + eps)``
    over the last dimension, computed in fp32 (the promotion of X's dtype and float32: float64 stays float64) and
    rounded once to X's dtype, as Liger-Kernel's benchmark module of PolyCom's layer.

    Args:
        X: (..., N), any float dtype.
        W: (3,) the weights of the cubic, square and linear terms (PolyCom initialises 1/3 each).
        B: a one-element tensor (0-d in Liger's module), the bias.
        eps: added to each mean square.
        in_place: the kernel path's memory option (see :func:`tigon.functional.poly_norm`); no effect here.

    Returns:
        X's shape and dtype.
    """
    ct = torch.promote_types(X.dtype, torch.float32)
    x, w, b = X.to(ct), W.to(ct), B.to(ct).reshape(())

    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + eps)

    return (w[0] * norm(x ** 3) + w[1] * norm(x ** 2) + w[2] * norm(x) + b).to(X.dtype)
