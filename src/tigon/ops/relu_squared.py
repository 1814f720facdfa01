"""Squared ReLU (So et al. 2021, "Primer"): the public op and its record.

Kernels: :mod:`tigon.kernels.relu_squared`. Specification: :mod:`tigon.reference.relu_squared`.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import relu_squared as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, randn, sizes


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """Squared ReLU, ``relu(x) ** 2`` elementwise (So et al. 2021, "Primer"; HF ``ReLUSquaredActivation``, the
    ``relu2`` activation of non-gated MLPs such as Nemotron's ``down_proj(relu2(up_proj(x)))``).

    Drop-in for Liger-Kernel's ``liger_relu_squared(x)``. Math in fp32, one rounding to x's dtype (as torch's
    ``square(relu(x))``, whose relu is exact); the backward ``2 relu(x) dy`` recomputes relu from x (only x is
    saved).

    Args:
        x: any shape, float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.

    Returns:
        x's shape and dtype (contiguous); the gradient in x's dtype.

    Raises:
        TypeError: x is not a floating-point tensor.
    """
    _checks.tensor("x", x, floating=True)
    if select_backend("relu_squared", x) in TORCH_CODE:
        return ref.relu_squared(x)
    from ..kernels import relu_squared as k

    if torch.compiler.is_compiling():
        return k.compiled_relu_squared(x)
    return k.ReLUSquaredFunction.apply(x)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, intermediate) with std 3: half the values negative (relu's zeros), the rest spread."""
    return dict(x=randn(gen, (s["tokens"], s["intermediate"]), dtype, device, 3.0))


RECORDS = (OpSpec(
    name="relu_squared",
    summary="relu(x)^2, the Primer MLP activation",
    fn=relu_squared, reference=ref.relu_squared, original=ref.relu_squared,
    original_name="torch.square(relu(x)) (HF ReLUSquaredActivation)",
    make_inputs=_inputs, shape_of=lambda m: {"tokens": m.tokens, "intermediate": m.intermediate},
    **sizes("tokens", "intermediate"),
    grad_inputs=("x",), category="activation",
    # read x, write y; backward: read dy, x, write dx
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["tokens"] * s["intermediate"] * e,
    under_compile="inductor",  # elementwise: Inductor fuses it into the projection's epilogue / neighbours
    peers={"liger": liger("liger_relu_squared", "x")},
    cases=(Case(),), leading_dims=("x",),
),)
