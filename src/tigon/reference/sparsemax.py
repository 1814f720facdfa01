"""Sparsemax reference (Martins & Astudillo 2016, "From Softmax to Sparsemax: A Sparse Model of Attention and
Multi-Label Classification", ICML, Algorithm 1; Liger-Kernel's ``liger_sparsemax``)."""

from __future__ import annotations

import torch


def sparsemax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The Euclidean projection of each slice along ``dim`` onto the probability simplex: ``y = max(x - tau, 0)``
    with ``tau`` such that ``sum(y) = 1``.

    By the paper's Algorithm 1: sort z descending, ``k(z) = max{k : 1 + k z_(k) > sum_{j<=k} z_(j)}``, ``tau =
    (sum_{j<=k(z)} z_(j) - 1) / k(z)``, on ``z - max(z)`` (sparsemax is shift-invariant; without the shift a row far
    from 0 loses its digits, and at 1e30 ``1 + z_(1) > z_(1)`` fails even in float64, an empty support). A row
    holding a NaN or +inf, or all -inf, is NaN throughout (as ``torch.softmax``). Computed in the promotion of the
    input's dtype and float32 (float64 stays float64, the truth of the tests), rounded once to the input's dtype.
    Its gradient (autograd through the sort) is
    ``dx = s * (dy - sum(s * dy) / sum(s))`` with ``s`` the support ``y > 0``.

    Args:
        input: any shape with a non-empty dimension ``dim``, any float dtype.
        dim: the dimension to normalise (default the last).

    Returns:
        input's shape and dtype; each slice along ``dim`` is non-negative and sums to 1.
    """
    ct = torch.promote_types(input.dtype, torch.float32)
    z = input.to(ct).transpose(dim, -1)
    top = z.amax(-1, keepdim=True)  # (NaN where the row holds one)
    bad = ~torch.isfinite(top) | z.isnan().any(-1, keepdim=True)
    z = z - torch.where(bad, torch.zeros((), dtype=ct, device=z.device), top).detach()  # (no gradient: y(z - c) = y(z))
    zs = torch.sort(z, dim=-1, descending=True).values
    cs = zs.cumsum(-1)
    k = torch.arange(1, z.shape[-1] + 1, dtype=ct, device=z.device)
    kz = (1 + k * zs > cs).sum(-1, keepdim=True).clamp(min=1)  # >= 1: z_(1) = 0 (0 on the bad rows' gather)
    tau = (cs.gather(-1, kz - 1) - 1) / kz.to(ct)
    y = torch.where(z > tau, z - tau, torch.zeros((), dtype=ct, device=z.device))
    y = torch.where(bad, torch.full((), float("nan"), dtype=ct, device=z.device), y)
    return y.transpose(dim, -1).to(input.dtype)
