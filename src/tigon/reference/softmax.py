"""Softmax over the last dimension (Bridle 1990; ``torch.softmax(x, dim=-1)``, Liger-Kernel's ``liger_softmax``)."""

from __future__ import annotations

import torch


def softmax(x: torch.Tensor) -> torch.Tensor:
    """``exp(x - max(x)) / sum(exp(x - max(x)))`` over the last dimension, as ``torch.softmax(x, dim=-1)`` (which
    computes in fp32 for bfloat16 / float16 and rounds once to x's dtype; float64 stays float64).

    A row of all ``-inf`` gives NaN (0/0), as torch's.

    Args:
        x: (..., N), any float dtype.

    Returns:
        x's shape and dtype.
    """
    return torch.softmax(x, dim=-1)
