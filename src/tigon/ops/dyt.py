"""Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"): the public op and its record.

Kernels: :mod:`tigon.kernels.dyt`. Specification: :mod:`tigon.reference.dyt`.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import dyt as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, rand, randn, sizes


def dyt(x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor | None) -> torch.Tensor:
    """Dynamic Tanh, ``gamma * tanh(alpha * x) + beta`` over the last dimension (Zhu et al. 2025, "Transformers
    without Normalization": the element-wise replacement of LayerNorm / RMSNorm).

    Drop-in for Liger-Kernel's ``liger_dyt(x, alpha, gamma, beta)`` (the same arguments, in that order, none
    optional; beta may be None). Math in fp32, one rounding to x's dtype; the backward recomputes tanh from x and
    returns the gradients of x, alpha, gamma and beta.

    Args:
        x: (..., N) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        alpha: a one-element float tensor ((1,) as Liger's and the paper's parameter, or 0-d) on x's device.
        gamma: (N,) float tensor, the per-channel scale.
        beta: (N,) float tensor, the per-channel shift, or None.

    Returns:
        (..., N) in x's dtype (whatever the parameters' dtypes), contiguous; each gradient in its input's dtype and
        shape.

    Raises:
        TypeError: x, alpha, gamma or beta is not a floating-point tensor (beta: or None).
        ValueError: x is 0-d or its last dimension is empty, alpha has not exactly one element, gamma or beta is not
            (N,), or the tensors are on different devices.
    """
    _checks.tensor("x", x, floating=True)
    _checks.tensor("alpha", alpha, floating=True)
    _checks.tensor("gamma", gamma, floating=True, ndim=1)
    if beta is not None:
        _checks.tensor("beta", beta, floating=True, ndim=1)
    _checks.same_device(x=x, alpha=alpha, gamma=gamma, beta=beta)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., N), got a 0-d tensor")
    if x.shape[-1] == 0:  # (the kernels' rows need one element; the reference path raises as they do)
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if alpha.numel() != 1:
        raise ValueError(f"alpha must have exactly one element (a (1,) parameter), got shape {tuple(alpha.shape)}")
    n = x.shape[-1]
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p is not None and p.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},) (x's last dimension), got {tuple(p.shape)}")
    if select_backend("dyt", x) in TORCH_CODE:
        return ref.dyt(x, alpha, gamma, beta)
    from ..kernels import dyt as k

    if torch.compiler.is_compiling():
        return k.compiled_dyt(x, alpha, gamma, beta)
    return k.DyTFunction.apply(x, alpha, gamma, beta)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, hidden) with std 3 and mean 0.5 (alpha x reaches tanh's saturated tails), alpha (1,) in [0.3, 0.8)
    (the paper initialises 0.5), gamma (hidden,) in [0.5, 1.5), beta (hidden,) with std 0.5."""
    return dict(x=randn(gen, (s["tokens"], s["hidden"]), dtype, device, 3.0, 0.5),
                alpha=rand(gen, (1,), dtype, device, 0.3, 0.8), gamma=rand(gen, (s["hidden"],), dtype, device),
                beta=randn(gen, (s["hidden"],), dtype, device, 0.5))


RECORDS = (OpSpec(
    name="dyt",
    summary="gamma * tanh(alpha * x) + beta, Dynamic Tanh (a norm layer's replacement)",
    fn=dyt, reference=ref.dyt, original=ref.dyt_original,
    original_name="tanh(alpha * x) * gamma + beta at the input dtype (the DyT paper's module)",
    make_inputs=_inputs, shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden},
    **sizes("tokens", "hidden"),
    grad_inputs=("x", "alpha", "gamma", "beta"), category="norm",
    # read x, write y; backward: read dy, x, write dx (the (N,) parameters and their gradients are not counted)
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["tokens"] * s["hidden"] * e,
    under_compile="inductor",  # element-wise with per-column parameters: Inductor fuses it with its neighbours
    peers={"liger": liger("liger_dyt", "x", "alpha", "gamma", "beta")},
    sweeps=("tokens", "hidden"), cases=(Case(),), leading_dims=("x",),
),)
