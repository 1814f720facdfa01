"""LayerNorm reference (Ba, Kiros & Hinton 2016, "Layer Normalization"), torch.nn.functional.layer_norm semantics."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5
) -> torch.Tensor:
    """``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` over the last dimension (biased variance).

    Args:
        x: (..., hidden), any float dtype.
        weight: (hidden,) or None (no scale).
        bias: (hidden,) or None (no shift).
        eps: added to the variance before the reciprocal square root.

    Returns:
        (..., hidden) in x's dtype. When weight/bias have another dtype than x (e.g. fp32 parameters with bf16
        activations), the computation runs in the promotion of all dtypes and float32 and the result is cast to
        x's dtype (torch itself accepts only some mixes, and differently on CPU and CUDA).
    """
    shape = (x.shape[-1],)
    params = [p for p in (weight, bias) if p is not None]
    if all(p.dtype == x.dtype for p in params):
        return F.layer_norm(x, shape, weight, bias, eps)
    ct = torch.promote_types(x.dtype, torch.float32)
    for p in params:
        ct = torch.promote_types(ct, p.dtype)
    cast = (lambda t: None if t is None else t.to(ct))
    return F.layer_norm(x.to(ct), shape, cast(weight), cast(bias), eps).to(x.dtype)
