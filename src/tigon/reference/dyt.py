"""Dynamic Tanh reference (Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization"): the element-wise
replacement of a transformer's normalisation layers, ``DyT(x) = gamma * tanh(alpha * x) + beta``."""

from __future__ import annotations

import torch


def dyt(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """``gamma * tanh(alpha * x) + beta`` over the last dimension, in fp32 (the promotion of x's dtype and float32:
    float64 stays float64), rounded once to x's dtype (Liger-Kernel's ``liger_dyt`` semantics: the output has x's
    dtype whatever the parameters' dtypes).

    Args:
        x: (..., N), any float dtype.
        alpha: a one-element tensor (the paper's scalar, a (1,) parameter initialised to 0.5).
        gamma: (N,), the per-channel scale (the paper's ``weight``).
        beta: (N,), the per-channel shift (the paper's ``bias``), or None (no shift).

    Returns:
        x's shape and dtype.
    """
    ct = torch.promote_types(x.dtype, torch.float32)
    y = gamma.to(ct) * torch.tanh(alpha.to(ct).reshape(()) * x.to(ct))
    if beta is not None:
        y = y + beta.to(ct)
    return y.to(x.dtype)


def dyt_original(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """The paper's ``DyT.forward`` in plain PyTorch at the tensors' own dtypes: ``tanh(alpha * x) * gamma + beta``
    (each operation rounded to its result dtype; the error baseline of the tests and ``tigon verify``)."""
    y = torch.tanh(alpha * x) * gamma
    return y + beta if beta is not None else y
