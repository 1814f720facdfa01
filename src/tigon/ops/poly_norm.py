"""PolyNorm (Zhuo et al. 2024, "Polynomial Composition Activations"; Liger-Kernel's ``liger_poly_norm``): the public
op and its record.

Kernels: :mod:`tigon.kernels.poly_norm`. Specification: :mod:`tigon.reference.poly_norm`.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import poly_norm as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, rand, randn, sizes


def poly_norm(X: torch.Tensor, W: torch.Tensor, B: torch.Tensor, eps: float = 1e-6,
              in_place: bool = False) -> torch.Tensor:
    """PolyNorm, ``W[0] norm(X^3) + W[1] norm(X^2) + W[2] norm(X) + B`` with ``norm(u) = u / sqrt(mean(u^2) + eps)``
    over the last dimension (Zhuo et al. 2024, arXiv:2411.03884, github.com/BryceZhuo/PolyCom).

    Drop-in for Liger-Kernel's ``liger_poly_norm(X, W, B, eps=1e-6, in_place=True)``: the same arguments in the same
    order, with the same defaults but ``in_place``'s. Math in fp32, one rounding to X's dtype; the three mean squares
    are kept per row (M x 3 fp32) for the backward, which returns the gradients of X, W and B.

    Args:
        X: (..., N) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides; N <= 65536
            on the kernel path (the norms' one-pass row limit; the reference has none).
        W: (3,) float tensor on X's device, the weights of the cubic, square and linear terms.
        B: a one-element float tensor (0-d as Liger's module's, or (1,)), the bias.
        eps: added to each mean square (>= 0).
        in_place: Liger-Kernel's option (default False here, True in Liger: the in-place backward's CUDA tests did not
            pass on the H200 on 2026-12-04 (their report was lost; benchmarks/results/h200/README.md, fourteenth run),
            so it is opt-in until they do): the backward writes X's gradient over the output's incoming gradient instead
            of a new (..., N) tensor, saving ``X.numel() * X.element_size()`` bytes at the backward's peak. Unlike
            Liger's, only where autograd's own bookkeeping shows that nothing else can read that gradient
            (:func:`tigon.kernels.grad_ownership.owns_grad`, as :func:`tigon.functional.rms_norm`'s ``in_place``), so
            values never depend on it: a gradient shared with another branch, passed by you to ``backward`` /
            ``grad_outputs``, kept from a hook, not contiguous or not in X's dtype goes untouched (dX in a new tensor,
            as with False). X, W and B are never written. Not taken on the reference path nor under ``torch.compile``.

    Returns:
        (..., N) in X's dtype (contiguous); gradients in their inputs' dtypes and shapes.

    Raises:
        TypeError: X, W or B is not a floating-point tensor; eps is not a number; in_place is not a bool.
        ValueError: X is 0-d, its last dimension is empty or (on the kernel path) wider than 65536, W is not (3,),
            B has not exactly one element, eps is negative or not finite, or the tensors are on different devices.
    """
    _checks.tensor("X", X, floating=True)
    _checks.tensor("W", W, floating=True, ndim=1)
    _checks.tensor("B", B, floating=True)
    _checks.same_device(X=X, W=W, B=B)
    eps = _checks.number("eps", eps, minimum=0.0)
    _checks.flag("in_place", in_place)
    if X.dim() == 0:
        raise ValueError("X must have at least one dimension (..., N), got a 0-d tensor")
    if X.shape[-1] == 0:  # (the kernels' rows need one element; the reference path raises as they do)
        raise ValueError(f"X must have a non-empty last dimension, got shape {tuple(X.shape)}")
    if W.shape[0] != 3:
        raise ValueError(f"W must have shape (3,) (the weights of X^3, X^2, X), got {tuple(W.shape)}")
    if B.numel() != 1:
        raise ValueError(f"B must have exactly one element (a scalar bias), got shape {tuple(B.shape)}")
    if select_backend("poly_norm", X) in TORCH_CODE:
        return ref.poly_norm(X, W, B, eps, in_place)
    from ..kernels import poly_norm as k

    if torch.compiler.is_compiling():
        return k.compiled_poly_norm(X, W, B, eps, in_place)
    return k.PolyNormFunction.apply(X, W, B, eps, in_place)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """X (tokens, hidden) standard normal (X^6 stays finite in float16), W (3,) in [0.2, 0.5) (PolyCom initialises
    1/3), B 0-d with std 1 (as Liger's module's scalar bias), eps 1e-6."""
    return dict(X=randn(gen, (s["tokens"], s["hidden"]), dtype, device), W=rand(gen, (3,), dtype, device, 0.2, 0.5),
                B=randn(gen, (), dtype, device), eps=1e-6)


RECORDS = (OpSpec(
    name="poly_norm",
    summary="W0 norm(x^3) + W1 norm(x^2) + W2 norm(x) + B, PolyNorm (PolyCom)",
    fn=poly_norm, reference=ref.poly_norm, original=ref.poly_norm,
    original_name="PolyCom's PolyNorm in fp32, cast to the input dtype (Liger-Kernel's benchmark module)",
    make_inputs=_inputs, shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden},
    **sizes("tokens", "hidden"),
    grad_inputs=("X", "W", "B"), category="activation",
    # read X, write y; backward: read dy, X, write dx (the (M, 3) fp32 statistics are not counted)
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["tokens"] * s["hidden"] * e,
    under_compile="inductor",  # row-wise: Inductor fuses it with its neighbours, as the norms
    peers={"liger": liger("liger_poly_norm", "X", "W", "B", "eps")},
    # (no in_place bench case: the bench hands the backward its own upstream gradient, which in_place never writes)
    sweeps=("tokens", "hidden"), cases=(Case(),), leading_dims=("X",),
),)
