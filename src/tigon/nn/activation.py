"""Parameter-free activation modules with Liger-Kernel's constructors: ``LigerReLUSquared`` is
:class:`ReLUSquared`, ``LigerSoftmax`` is :class:`Softmax`, ``LigerSparsemax`` is :class:`Sparsemax`."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as TF


class ReLUSquared(nn.Module):
    """``relu(x) ** 2`` (So et al. 2021, "Primer"), via :func:`tigon.functional.relu_squared`.

    Drop-in for Liger-Kernel's ``LigerReLUSquared()`` and HF's ``ReLUSquaredActivation`` (no arguments, no
    parameters).

    Shapes and dtypes:
        input any shape, float32 / bfloat16 / float16 on the kernel path; output: same shape and dtype.

    Raises:
        As :func:`tigon.functional.relu_squared`, at the forward, for bad inputs.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TF.relu_squared(x)


class Softmax(nn.Module):
    """Softmax over the last dimension, via :func:`tigon.functional.softmax`.

    Drop-in for Liger-Kernel's ``LigerSoftmax()`` (no arguments: always the last dimension, as
    ``torch.nn.Softmax(dim=-1)``; no parameters).

    Shapes and dtypes:
        input (..., N), float32 / bfloat16 / float16 on the kernel path; output: same shape and dtype.

    Raises:
        As :func:`tigon.functional.softmax`, at the forward, for bad inputs.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TF.softmax(x)


class Sparsemax(nn.Module):
    """Sparsemax along ``dim`` (Martins & Astudillo 2016, "From Softmax to Sparsemax"), via
    :func:`tigon.functional.sparsemax`: the Euclidean projection onto the probability simplex (sparse probabilities).

    Drop-in for Liger-Kernel's ``LigerSparsemax(dim=-1)`` (same constructor, no parameters).

    Args:
        dim: the dimension to normalise (the last by default).

    Shapes and dtypes:
        input any shape with a non-empty ``dim``, float32 / bfloat16 / float16 on the kernel path; output: same
        shape and dtype.

    Raises:
        As :func:`tigon.functional.sparsemax`, at the forward, for bad inputs.
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TF.sparsemax(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
