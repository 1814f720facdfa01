"""Parameter-free activation modules with Liger-Kernel's constructors: ``LigerReLUSquared`` is
:class:`ReLUSquared`, ``LigerSoftmax`` is :class:`Softmax`."""

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
