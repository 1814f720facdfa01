"""LayerNorm (Ba, Kiros & Hinton 2016; torch.nn.functional.layer_norm semantics): the public op and its record.

Kernels: :mod:`tigon.kernels.layer_norm` (shared with RMSNorm in :mod:`tigon.kernels.norm`). Specification:
:mod:`tigon.reference.layer_norm`.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._checks import ALIAS, UNSET, liger_names
from ..reference import layer_norm as ref
from ..support import TORCH_CODE, select_backend
from ._dtensor import DTensorRule, accepts_dtensor, dtensor_call, last_dim
from ._record import Case, OpSpec, liger, rand, randn, sizes


@accepts_dtensor(DTensorRule(rows=("x",), outputs=("x",), params=("weight", "bias"), mixed_dims=last_dim),
                 asked_inside=True)
def layer_norm(
    x: torch.Tensor = UNSET, weight: torch.Tensor | None = UNSET, bias: torch.Tensor | None = UNSET,
    eps: float = 1e-5, *, X: torch.Tensor = ALIAS, W: torch.Tensor | None = ALIAS, B: torch.Tensor | None = ALIAS,
) -> torch.Tensor:
    """LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), torch.nn.functional.layer_norm semantics.

    ``y = (x - mean(x, -1)) / sqrt(var(x, -1) + eps) * weight + bias`` with the biased variance; statistics
    in fp32. The weight and bias gradients are reduced deterministically (no atomics). Drop-in for Liger-Kernel's
    ``liger_layer_norm(X, W, B, eps)``, by position or by keyword (Liger's names ``X``, ``W``, ``B`` are accepted).

    Args:
        x: (..., hidden) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        weight: (hidden,) float tensor on x's device, or None (no scale).
        bias: (hidden,) float tensor on x's device, or None (no shift).
        eps: variance epsilon.

    Returns:
        (..., hidden) in x's dtype (parameters of another dtype, e.g. fp32 with bf16 x, are fine).

    Raises:
        TypeError: x, weight or bias is missing or given under both names (x and X, weight and W, bias and B); x,
            weight or bias is not a floating tensor; eps is not a number.
        ValueError: weight or bias is not (hidden,), devices differ, hidden exceeds the fused-row limit, or eps is
            negative or not finite.
    """
    if (x is UNSET or weight is UNSET or bias is UNSET or X is not ALIAS or W is not ALIAS
            or B is not ALIAS):  # (Liger's keyword names)
        x, weight, bias = liger_names("layer_norm", ("x", x, "X", X), ("weight", weight, "W", W),
                                      ("bias", bias, "B", B))
    out = dtensor_call(layer_norm, x, weight, bias, eps)
    if out is not None:  # DTensor arguments: run on the local shards (tigon.ops._dtensor)
        return out
    _checks.tensor("x", x, floating=True)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            _checks.tensor(name, p, floating=True, ndim=1)
            if p.shape[0] != x.shape[-1]:
                raise ValueError(f"{name} must have shape ({x.shape[-1]},), got {tuple(p.shape)}")
    _checks.same_device(x=x, weight=weight, bias=bias)
    eps = _checks.number("eps", eps, minimum=0.0)
    if select_backend("layer_norm", x) in TORCH_CODE:
        return ref.layer_norm(x, weight, bias, eps)
    from ..kernels import layer_norm as k

    run = k.compiled_layer_norm if torch.compiler.is_compiling() else k.LayerNormFunction.apply
    return run(x, weight, bias, eps)


# ---- the record ----------------------------------------------------------------------------------------------------
def torch_layer_norm(x, weight, bias, eps=1e-5):
    """``torch.nn.functional.layer_norm`` over the last dimension (what ``nn.LayerNorm`` calls)."""
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, hidden) with std 3 and mean 1.5, weight in [0.5, 1.5) and bias (hidden,) normal, eps 1e-5."""
    return dict(x=randn(gen, (s["tokens"], s["hidden"]), dtype, device, 3.0, 1.5),
                weight=rand(gen, (s["hidden"],), dtype, device), bias=randn(gen, (s["hidden"],), dtype, device),
                eps=1e-5)


RECORDS = (OpSpec(
    name="layer_norm",
    summary="LayerNorm over the last dimension (torch.nn.functional.layer_norm)",
    fn=layer_norm,
    reference=ref.layer_norm,
    original=torch_layer_norm,
    original_name="torch.nn.functional.layer_norm",
    make_inputs=_inputs,
    shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden},
    **sizes("tokens", "hidden"),
    grad_inputs=("x", "weight", "bias"),
    category="norm",
    under_compile="inductor",  # under torch.compile Inductor fuses it with its neighbours (the residual add)
    # read x, write y; backward: read x, dy, write dx
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["tokens"] * s["hidden"] * e,
    peers={"liger": liger("liger_layer_norm", "x", "weight", "bias", "eps")},
    sweeps=("tokens", "hidden"),
    leading_dims=("x",),
    cases=(Case(),),
),)
