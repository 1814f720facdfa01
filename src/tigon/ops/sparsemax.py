"""Sparsemax (Martins & Astudillo 2016; Liger-Kernel's ``liger_sparsemax``): the public op and its record.

Kernels: :mod:`tigon.kernels.sparsemax` (sort-free: Michelot's exact algorithm from max - 1). Specification:
:mod:`tigon.reference.sparsemax` (the paper's sort-based Algorithm 1).
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import sparsemax as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, randn, sizes


def sparsemax(input: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax along ``dim``: the Euclidean projection of each slice onto the probability simplex, ``max(x - tau,
    0)`` with tau such that the slice sums to 1 (Martins & Astudillo 2016, "From Softmax to Sparsemax", ICML).

    Drop-in for Liger-Kernel's ``liger_sparsemax(input, dim=-1)``. Math in fp32, one rounding to the input's dtype;
    tau is found without sorting (see :mod:`tigon.kernels.sparsemax`) and equals the paper's. The output is saved
    for the backward ``dx = s * (dy - mean over the support s of dy)``, ``s = y > 0``. A ``dim`` other than the last
    is moved to the end (a copy of the input, as Liger-Kernel's transpose) and the result moved back (a view).

    Args:
        input: any shape with at least one dimension and a non-empty ``dim``; float32 / bfloat16 / float16 (other
            float dtypes run the reference); any strides.
        dim: the dimension to normalise, in [-input.dim(), input.dim()).

    Returns:
        input's shape and dtype; contiguous for the last dimension, else the moved-back view of a contiguous
        tensor. The gradient in the input's dtype. A slice holding a NaN or +inf, or all -inf, is NaN throughout (as
        ``torch.softmax``); -inf entries beside finite ones are zeros. Shift-invariant: computed on ``x - max``.

    Raises:
        TypeError: input is not a floating-point tensor; dim is not an int.
        ValueError: input is 0-d, dim is out of range, or the dimension ``dim`` is empty.
    """
    _checks.tensor("input", input, floating=True)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int, got {type(dim).__name__} {dim!r}")
    if input.dim() == 0:
        raise ValueError("input must have at least one dimension, got a 0-d tensor")
    if not -input.dim() <= dim < input.dim():
        raise ValueError(f"dim must be in [{-input.dim()}, {input.dim()}) for input of shape {tuple(input.shape)}, "
                         f"got {dim}")
    if input.shape[dim] == 0:
        raise ValueError(f"input's dimension {dim} must be non-empty, got shape {tuple(input.shape)}")
    if select_backend("sparsemax", input) in TORCH_CODE:
        return ref.sparsemax(input, dim)
    from ..kernels import sparsemax as k

    last = dim in (-1, input.dim() - 1)
    x = input if last else input.transpose(dim, -1)
    y = k.compiled_sparsemax(x) if torch.compiler.is_compiling() else k.SparsemaxFunction.apply(x)
    return y if last else y.transpose(dim, -1)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """input (tokens, hidden) with std 1, so that a handful of entries per row are in the support, and every case
    reduces over the last dimension."""
    return dict(input=randn(gen, (s["tokens"], s["hidden"]), dtype, device))


RECORDS = (OpSpec(
    name="sparsemax",
    summary="sparsemax over the last dimension: projection onto the probability simplex (sparse probabilities)",
    fn=sparsemax, reference=ref.sparsemax, original=ref.sparsemax,
    original_name="the sort-based sparsemax of Martins & Astudillo 2016 in fp32 (tigon.reference.sparsemax)",
    # Liger's benchmark (benchmark_sparsemax.py) takes (tokens, hidden) rows; so does this record
    make_inputs=_inputs, shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden},
    **sizes("tokens", "hidden"),
    grad_inputs=("input",), category="activation",
    # read x, write y; backward: read dy, y, write dx
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["tokens"] * s["hidden"] * e,
    peers={"liger": liger("liger_sparsemax", "input")},
    sweeps=("tokens", "hidden"), cases=(Case(),), leading_dims=("input",),
),)
