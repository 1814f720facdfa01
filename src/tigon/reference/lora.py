"""A linear layer with a low-rank adapter (LoRA, Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models"): ``y = x W^T + b + s (x A^T) B^T``.

What PEFT's ``lora.Linear`` computes for one active adapter without dropout and without DoRA:
``base_layer(x) + lora_B(lora_A(x)) * scaling``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _checks


def check_inputs(x, weight, lora_a, lora_b, bias, scaling) -> float:
    """Validate :func:`lora_linear`'s arguments; returns ``scaling`` as a float.

    Raises:
        TypeError: a non-floating tensor, or scaling not a real number.
        ValueError: x is 0-d; weight, lora_a, lora_b, bias of shapes that do not fit (named in the message);
            tensors on different devices; scaling not finite.
    """
    _checks.tensor("x", x, floating=True)
    _checks.tensor("weight", weight, floating=True, ndim=2)
    _checks.tensor("lora_a", lora_a, floating=True, ndim=2)
    _checks.tensor("lora_b", lora_b, floating=True, ndim=2)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., in_features), got a 0-d tensor")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension must be weight's in_features {k}, got x of shape {tuple(x.shape)}")
    r = lora_a.shape[0]
    if lora_a.shape[1] != k:
        raise ValueError(f"lora_a must have shape (rank, {k}), got {tuple(lora_a.shape)}")
    if tuple(lora_b.shape) != (n, r):
        raise ValueError(f"lora_b must have shape ({n}, {r}) (out_features, rank), got {tuple(lora_b.shape)}")
    if bias is not None:
        _checks.tensor("bias", bias, floating=True, ndim=1)
        if bias.shape[0] != n:
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    _checks.same_device(x=x, weight=weight, lora_a=lora_a, lora_b=lora_b, bias=bias)
    return _checks.number("scaling", scaling)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                bias: torch.Tensor | None = None, *, scaling: float = 1.0) -> torch.Tensor:
    """``linear(x, weight, bias) + scaling * linear(linear(x, lora_a), lora_b)``, as PEFT's LoRA layer forms it.

    Args:
        x: (..., K) float tensor.
        weight: (N, K) frozen base weight (``nn.Linear`` layout); bias: (N,) or None.
        lora_a: (r, K) down-projection A; lora_b: (N, r) up-projection B.
        scaling: s = lora_alpha / r (or lora_alpha / sqrt(r) with rsLoRA).

    Returns:
        (..., N) in the dtype torch's linear gives (x's, or the autocast dtype under autocast).

    Raises:
        TypeError, ValueError: see :func:`check_inputs`.
    """
    s = check_inputs(x, weight, lora_a, lora_b, bias, scaling)
    return F.linear(x, weight, bias) + F.linear(F.linear(x, lora_a), lora_b) * s
