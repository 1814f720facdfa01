"""Squared ReLU reference (So et al. 2021, "Primer: Searching for Efficient Transformers for Language Modeling";
HF ``transformers.activations.ReLUSquaredActivation``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """``relu(x) ** 2 = max(x, 0) ** 2``, elementwise, computed in x's dtype as HF's ``ReLUSquaredActivation``.

    Gradient: ``2 * relu(x) * dy`` (0 for x <= 0).

    Args:
        x: any shape, any float dtype.

    Returns:
        x's shape and dtype.
    """
    return torch.square(F.relu(x))
