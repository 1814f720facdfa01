"""Softmax over the last dimension (``torch.softmax(x, dim=-1)``; Liger-Kernel's ``liger_softmax``): the public op
and its record.

Kernels: :mod:`tigon.kernels.softmax`. Specification: :mod:`tigon.reference.softmax`.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import softmax as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, randn, sizes


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, ``exp(x - max) / sum(exp(x - max))`` per row, as
    ``torch.softmax(x, dim=-1)``.

    Drop-in for Liger-Kernel's ``liger_softmax(x)`` (no ``dim``: always the last one). Math in fp32, one rounding to
    x's dtype; the output is saved for the backward ``dx = y * (dy - sum(dy * y))``, as torch does. Any row width
    (rows wider than 32768 elements are walked in chunks).

    Args:
        x: (..., N) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides; N >= 1.

    Returns:
        x's shape and dtype (contiguous); the gradient in x's dtype. A row of all ``-inf`` gives NaN, as torch's.

    Raises:
        TypeError: x is not a floating-point tensor.
        ValueError: x is 0-d or its last dimension is empty.
    """
    _checks.tensor("x", x, floating=True)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension (..., N), got shape {tuple(x.shape)}")
    if select_backend("softmax", x) in TORCH_CODE:
        return ref.softmax(x)
    from ..kernels import softmax as k

    if torch.compiler.is_compiling():
        return k.compiled_softmax(x)
    return k.SoftmaxFunction.apply(x)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, hidden) with std 3 (rows whose largest probabilities are well apart from the rest)."""
    return dict(x=randn(gen, (s["tokens"], s["hidden"]), dtype, device, 3.0))


RECORDS = (OpSpec(
    name="softmax",
    summary="softmax over the last dimension",
    fn=softmax, reference=ref.softmax, original=ref.softmax,
    original_name="torch.softmax(x, dim=-1)",
    # Liger's benchmark (benchmark_softmax.py) takes (tokens, hidden_size) rows; so does this record
    make_inputs=_inputs, shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden},
    **sizes("tokens", "hidden"),
    grad_inputs=("x",), category="activation",
    # read x, write y; backward: read dy, y, write dx
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["tokens"] * s["hidden"] * e,
    under_compile="inductor",  # row-wise: Inductor fuses it with its neighbours (a scale, a mask)
    peers={"liger": liger("liger_softmax", "x")},
    sweeps=("tokens", "hidden"), cases=(Case(),), leading_dims=("x",),
),)
