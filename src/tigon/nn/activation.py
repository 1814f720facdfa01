"""Parameter-free activation modules with Liger-Kernel's constructors: ``LigerReLUSquared`` is
:class:`ReLUSquared`."""

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
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TF.relu_squared(x)
