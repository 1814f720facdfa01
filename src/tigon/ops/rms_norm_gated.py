"""Gated RMSNorm, ``rmsnorm(x) * silu(gate)`` or ``rmsnorm(x * silu(gate))`` (Qwen3-Next / Qwen3.5's Gated DeltaNet
output norm, Falcon-H1's and Mamba-2's Mamba norm), statistics per row or per group: the public op and its record.

Kernels: :mod:`tigon.kernels.rms_norm_gated` (the shared norm kernels' ``HAS_GATE`` switch). Specification:
:func:`tigon.reference.rms_norm.rms_norm_gated`.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..reference import rms_norm as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, rand, randn, sizes

WIDEST_ROW = 32768
"""Rows wider than this run the reference (the norm kernels' chunked backward for wider rows has no gate)."""


def rms_norm_gated(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, offset: float = 0.0,
    casting_mode: str = "llama", group_size: int | None = None, norm_before_gate: bool = True,
) -> torch.Tensor:
    """Gated RMSNorm, ``rmsnorm(x) * silu(gate)`` (norm before gate) or ``rmsnorm(x * silu(gate))``, statistics over
    the last dimension or over each group of ``group_size`` channels (Mamba-2's gated norm, Dao & Gu 2024;
    transformers ``Qwen3NextRMSNormGated`` (``"llama"`` casting), ``FalconH1RMSNormGated`` (``"gemma"``; its
    ``n_groups`` groups: ``group_size = hidden // n_groups``; its ``norm_before_gate``), ``Mamba2RMSNormGated``
    (``"llama"``, ``norm_before_gate=False``, its ``group_size``)).

    One pass normalises x and multiplies by ``silu(gate)`` (gate first: normalises ``x * silu(gate)``); the backward
    forms d_gate in the pass that forms dx (the norm's backward on ``dy * silu(gate)``; gate first: on dy, then the
    chain rule through ``x * silu(gate)``), with dW from the same persistent-grid partials as :func:`rms_norm`.
    Statistics and math in fp32, one rounding at the store. With groups the kernels' rows are the groups (the weight
    read at each group's channels, dW still per channel); a group count that is not a power of two, or groups too wide
    for the grouped backward's row tiles (:func:`tigon.kernels.norm.grouped_backward_fits`), run the reference.

    Args:
        x: (..., hidden) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        gate: x's shape, any float dtype on x's device; any strides.
        weight: (hidden,) float tensor, or None (no weight).
        eps: variance epsilon; offset: added to weight (Gemma-style ``1 + w``); casting_mode: ``"llama"`` |
            ``"gemma"`` | ``"none"``, see :func:`tigon.reference.rms_norm.rms_norm_gated`.
        group_size: channels per group of the statistics (mamba_ssm's ``rmsnorm_fn`` / transformers'
            ``Mamba2RMSNormGated`` argument), a positive divisor of hidden; None (the default) or hidden: the whole
            last dimension.
        norm_before_gate: True (the default): the gate multiplies the normalised row; False: it multiplies x before
            the statistics (mamba_ssm's ``rmsnorm_fn`` argument, Falcon-H1's ``mamba_norm_before_gate``).

    Returns:
        (..., hidden) in x's dtype (contiguous).

    Raises:
        TypeError: x, gate or weight not a floating tensor; eps or offset not a number; group_size not an int;
            norm_before_gate not a bool.
        ValueError: x is 0-d or its last dimension is empty, gate's shape differs from x's, weight is not (hidden,),
            devices differ, casting_mode unknown, eps negative or not finite, offset not finite, group_size not a
            positive divisor of hidden.
    """
    _checks.tensor("x", x, floating=True)
    _checks.tensor("gate", gate, floating=True)
    if weight is not None:
        _checks.tensor("weight", weight, floating=True, ndim=1)
    _checks.same_device(x=x, gate=gate, weight=weight)
    _checks.choice("casting_mode", casting_mode, ref.CASTING_MODES)
    eps, offset = _checks.number("eps", eps, minimum=0.0), _checks.number("offset", offset)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., hidden), got a 0-d tensor")
    if x.shape[-1] == 0:  # (the kernels' rows need one element; the reference path raises as they do)
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if gate.shape != x.shape:
        raise ValueError(f"gate must have x's shape {tuple(x.shape)}, got {tuple(gate.shape)}")
    if weight is not None and weight.shape[0] != x.shape[-1]:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal weight's size ({weight.shape[0]}): "
                         f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    n_groups = _groups(group_size, x.shape[-1])
    _checks.flag("norm_before_gate", norm_before_gate)
    args = (x, gate, weight, eps, offset, casting_mode)
    if select_backend("rms_norm_gated", x) in TORCH_CODE or x.shape[-1] > WIDEST_ROW:
        return ref.rms_norm_gated(*args, group_size, norm_before_gate)
    from ..kernels import rms_norm_gated as k
    from ..kernels.norm import grouped_backward_fits

    if n_groups != 1 and not grouped_backward_fits(x.shape[-1], n_groups):
        return ref.rms_norm_gated(*args, group_size, norm_before_gate)
    run = k.compiled_rms_norm_gated if torch.compiler.is_compiling() else k.RMSNormGatedFunction.apply
    return run(*args, n_groups, norm_before_gate)


def _groups(group_size, hidden: int) -> int:
    """The number of groups of ``group_size`` channels in rows of ``hidden`` (1 for None); TypeError / ValueError
    naming group_size."""
    if group_size is None:
        return 1
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int or None, got {type(group_size).__name__}")
    if group_size < 1 or hidden % group_size:
        raise ValueError(f"group_size must be a positive divisor of x's last dimension ({hidden}), got {group_size}")
    return hidden // group_size


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen, n_groups: int = 1) -> dict:
    """x (tokens, hidden) with std 3 and mean 0.5, gate (tokens, hidden) with std 2, weight in [0.5, 1.5), the
    family's eps / offset / casting mode (the shapes of the model's hidden size: a Gated DeltaNet normalises
    heads of head_v_dim, Falcon-H1 its Mamba width). ``n_groups`` > 1: statistics per group (``group_size``), hidden
    made a multiple of n_groups (rounded down, groups of 3 channels at least: verify's odd hidden sizes and the
    property tests' small ones keep their group sizes odd or small)."""
    n = s["hidden"] if n_groups == 1 else max(s["hidden"] // n_groups, 3) * n_groups
    return dict(x=randn(gen, (s["tokens"], n), dtype, device, 3.0, 0.5),
                gate=randn(gen, (s["tokens"], n), dtype, device, 2.0),
                weight=rand(gen, (n,), dtype, device), eps=s.get("eps", 1e-6),
                offset=s.get("offset", 0.0), casting_mode=s.get("casting_mode", "llama"),
                group_size=None if n_groups == 1 else n // n_groups)


RECORDS = (OpSpec(
    name="rms_norm_gated",
    summary="gated RMSNorm, rmsnorm(x) * silu(gate) or rmsnorm(x * silu(gate)), per row or group (Falcon-H1)",
    fn=rms_norm_gated,
    reference=ref.rms_norm_gated,
    original=ref.rms_norm_gated,
    original_name="HF Qwen3NextRMSNormGated / FalconH1RMSNormGated math (tigon.reference.rms_norm.rms_norm_gated)",
    make_inputs=_inputs,
    shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden, "eps": m.rms_eps, "offset": 0.0,
                        "casting_mode": "llama"},
    **sizes("tokens", "hidden"),
    grad_inputs=("x", "gate", "weight"),
    category="norm",
    # read x, gate, write y; backward: read x, gate, dy, write dx, d_gate
    min_bytes=lambda s, e, mode: (3 if mode == "fwd" else 8) * s["tokens"] * s["hidden"] * e,
    sweeps=("tokens", "hidden"),
    leading_dims=("x", "gate"),
    cases=(Case(), Case("casting_mode=gemma", options={"casting_mode": "gemma"}),
           Case("n_groups=4", inputs={"n_groups": 4}),  # Falcon-H1's / Mamba-2's grouped statistics
           Case("norm_before_gate=False", options={"norm_before_gate": False})),  # Mamba-2's gate first
),)
