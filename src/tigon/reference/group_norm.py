"""GroupNorm reference (Wu & He 2018, "Group Normalization"; ``torch.nn.functional.group_norm`` semantics, in
Liger-Kernel's ``liger_group_norm`` argument order)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def group_norm(
    X: torch.Tensor, affine_scaling_weight: torch.Tensor | None, affine_shifting_bias: torch.Tensor | None,
    num_channels: int, num_groups: int, eps: float = 1e-6,
) -> torch.Tensor:
    """``y = (x - mean_g) / sqrt(var_g + eps) * weight[c] + bias[c]``, where the mean and the biased variance of
    group g are taken over its ``num_channels / num_groups`` channels and all their positions, per batch row.

    Computed in the promotion of X's dtype, the parameters' and float32 (float64 stays float64, the truth of the
    tests), then rounded once to X's dtype.

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
    cast = (lambda t: None if t is None else t.to(ct))
    return group_norm_original(X.to(ct), cast(affine_scaling_weight), cast(affine_shifting_bias), num_channels,
                               num_groups, eps).to(X.dtype)


def group_norm_original(X, affine_scaling_weight, affine_shifting_bias, num_channels, num_groups, eps=1e-6):
    """``torch.nn.functional.group_norm`` at X's dtype (what ``torch.nn.GroupNorm`` runs; verify's error baseline).

    A bias without a weight is given a weight of ones (the same function): torch 2.13's backward of group_norm with
    ``weight=None`` and a bias raises "tensor does not have a device"."""
    if affine_scaling_weight is None and affine_shifting_bias is not None:
        affine_scaling_weight = torch.ones(num_channels, dtype=affine_shifting_bias.dtype, device=X.device)
    return F.group_norm(X, num_groups, affine_scaling_weight, affine_shifting_bias, eps)
