"""GroupNorm reference (Wu & He 2018, "Group Normalization"; ``torch.nn.functional.group_norm`` semantics, in
Liger-Kernel's ``liger_group_norm`` argument order)."""

from __future__ import annotations

import math

import torch


def group_norm(
    X: torch.Tensor, affine_scaling_weight: torch.Tensor | None, affine_shifting_bias: torch.Tensor | None,
    num_channels: int, num_groups: int, eps: float = 1e-6,
) -> torch.Tensor:
    """``y = (x - mean_g) / sqrt(var_g + eps) * weight[c] + bias[c]``, where the mean and the biased variance of
    group g are taken over its ``num_channels / num_groups`` channels and all their positions, per batch row.

    Computed in the promotion of X's dtype, the parameters' and float32 (float64 stays float64, the truth of the
    tests), then rounded once to X's dtype, as torch's group_norm kernels accumulate in fp32 for bfloat16 / float16.

    Args:
        X: (B, num_channels, *) any float dtype (the trailing dimensions, possibly none, are the positions).
        affine_scaling_weight: (num_channels,) or None (no scale).
        affine_shifting_bias: (num_channels,) or None (no shift).
        num_channels: C, X's dimension 1.
        num_groups: G, dividing C.
        eps: added to the variance before the reciprocal square root.

    Returns:
        X's shape and dtype.
    """
    ct = torch.promote_types(X.dtype, torch.float32)
    for p in (affine_scaling_weight, affine_shifting_bias):
        if p is not None:
            ct = torch.promote_types(ct, p.dtype)
    # torch.nn.functional.group_norm's math in plain tensor operations (it equals F.group_norm; its own CPU kernel
    # threads even tiny inputs, and its backward fails for a bias without a weight in torch 2.13)
    xs = X.to(ct).reshape(X.shape[0], num_groups, math.prod(X.shape[1:]) // num_groups)  # (sizes given: B may be 0)
    mean = xs.mean(-1, keepdim=True)
    xc = xs - mean
    y = (xc * torch.rsqrt(xc.square().mean(-1, keepdim=True) + eps)).reshape(X.shape)
    per_channel = (num_channels,) + (1,) * (X.dim() - 2)
    if affine_scaling_weight is not None:
        y = y * affine_scaling_weight.to(ct).reshape(per_channel)
    if affine_shifting_bias is not None:
        y = y + affine_shifting_bias.to(ct).reshape(per_channel)
    return y.to(X.dtype)
