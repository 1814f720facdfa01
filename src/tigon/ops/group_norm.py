"""GroupNorm (Wu & He 2018; ``torch.nn.functional.group_norm`` semantics in Liger-Kernel's ``liger_group_norm``
argument order): the public op and its record.

Kernels: :mod:`tigon.kernels.group_norm`. Specification: :mod:`tigon.reference.group_norm`.
"""

from __future__ import annotations

import os

import torch

from .. import _checks
from ..reference import group_norm as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, rand, randn


def group_norm(
    X: torch.Tensor, affine_scaling_weight: torch.Tensor | None, affine_shifting_bias: torch.Tensor | None,
    num_channels: int, num_groups: int, eps: float = 1e-6,
) -> torch.Tensor:
    """Group normalisation (Wu & He 2018, "Group Normalization", arXiv:1803.08494): the channels of X split into
    ``num_groups`` groups, each normalised over its channels and positions per batch row, then a per-channel affine.

    ``y = (x - mean_g) / sqrt(var_g + eps) * weight[c] + bias[c]`` with the biased variance; statistics in fp32, one
    rounding to X's dtype. ``torch.nn.functional.group_norm(X, num_groups, weight, bias, eps)`` computes the same.
    Drop-in for Liger-Kernel's ``liger_group_norm(X, affine_scaling_weight, affine_shifting_bias, num_channels,
    num_groups, eps)``: the same arguments in the same order; here ``eps`` defaults to 1e-6 (LigerGroupNorm's) and
    the weight and bias may be None (no scale / no shift), as torch's.

    Args:
        X: (B, num_channels, *) float32 / bfloat16 / float16 (other float dtypes run the reference), any strides (a
            layout whose channel rows are not a view, e.g. channels-last, is copied once); the trailing dimensions,
            possibly none, are the positions.
        affine_scaling_weight: (num_channels,) float tensor on X's device, or None.
        affine_shifting_bias: (num_channels,) float tensor on X's device, or None.
        num_channels: C, X's dimension 1.
        num_groups: G >= 1, dividing C.
        eps: added to the variance (>= 0).

    Returns:
        X's shape and dtype (contiguous); the gradients of X, the weight and the bias in their dtypes (the weight's
        and bias's summed in fp32 over the batch, deterministically).

    Raises:
        TypeError: X, the weight or the bias is not a floating-point tensor; num_channels or num_groups is not an
            int; eps is not a number.
        ValueError: X has fewer than 2 dimensions, X's dimension 1 is not num_channels, num_groups is not a
            positive divisor of num_channels, the weight or bias is not (num_channels,), eps is negative or not
            finite, or the tensors are on different devices.
    """
    _checks.tensor("X", X, floating=True)
    for name, p in (("affine_scaling_weight", affine_scaling_weight), ("affine_shifting_bias", affine_shifting_bias)):
        if p is not None:
            _checks.tensor(name, p, floating=True, ndim=1)
            if p.shape[0] != num_channels:
                raise ValueError(f"{name} must have shape ({num_channels},) (num_channels), got {tuple(p.shape)}")
    _checks.same_device(X=X, affine_scaling_weight=affine_scaling_weight, affine_shifting_bias=affine_shifting_bias)
    for name, v in (("num_channels", num_channels), ("num_groups", num_groups)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    eps = _checks.number("eps", eps, minimum=0.0)
    if X.dim() < 2:
        raise ValueError(f"X must be (B, num_channels, *) with at least 2 dimensions, got shape {tuple(X.shape)}")
    if X.shape[1] != num_channels:
        raise ValueError(f"X's dimension 1 ({X.shape[1]}) must equal num_channels ({num_channels}): X "
                         f"{tuple(X.shape)}")
    if num_groups < 1 or num_channels % num_groups:
        raise ValueError(f"num_groups must be a positive divisor of num_channels ({num_channels}), got {num_groups}")
    if X.numel() == 0 or select_backend("group_norm", X) in TORCH_CODE:
        return ref.group_norm(X, affine_scaling_weight, affine_shifting_bias, num_channels, num_groups, eps)
    from ..kernels import group_norm as k

    run = k.compiled_group_norm if torch.compiler.is_compiling() else k.GroupNormFunction.apply
    return run(X, affine_scaling_weight, affine_shifting_bias, num_channels, num_groups, eps)


# ---- the record ----------------------------------------------------------------------------------------------------
GROUPS_ENV = "TIGON_BENCH_GROUP_NORM_GROUPS"
"""Environment variable: the number of groups of the record's shapes (``tigon bench`` / ``verify``), instead of 32
(3 on small models). 1 makes each batch row one group of 128 x hidden elements (2^19 at hidden 4096): the split path
of :mod:`tigon.kernels.group_norm` (groups larger than a tile) at the default shape's bytes, every provider on the
same inputs."""


def _groups(default: int, channels: int) -> int:
    """``default``, or :data:`GROUPS_ENV` when set.

    Raises:
        ValueError: the variable is not a positive divisor of ``channels``.
    """
    value = os.environ.get(GROUPS_ENV, "").strip()
    if not value:
        return default
    groups = int(value) if value.isdigit() else 0
    if groups < 1 or channels % groups:
        raise ValueError(f"{GROUPS_ENV} must be a positive divisor of the bench's {channels} channels, got {value!r}")
    return groups


def _shape(m) -> dict:
    """Liger's benchmark layout (benchmark_group_norm.py: batch x channels x hidden, 4 channels a group) with a norm's
    element count: ``tokens / channels`` batch rows of 128 channels of ``hidden`` positions (tokens x hidden elements,
    as rms_norm at the same sizes); small models (the tests' shapes) take 6 channels in 3 groups. :data:`GROUPS_ENV`
    sets the number of groups (e.g. 1: groups of 2^19 elements at hidden 4096, the large-group path)."""
    channels, groups = (128, 32) if m.hidden >= 512 else (6, 3)
    return {"tokens": m.tokens, "batch": max(1, m.tokens // channels), "channels": channels,
            "groups": _groups(groups, channels), "hidden": m.hidden}


def _inputs(s: dict, dtype, device, gen) -> dict:
    """X (batch, channels, hidden) with std 3 and mean 0.5, weight in [0.5, 1.5), bias with std 0.5, eps 1e-6."""
    c = s["channels"]
    return dict(X=randn(gen, (s["batch"], c, s["hidden"]), dtype, device, 3.0, 0.5),
                affine_scaling_weight=rand(gen, (c,), dtype, device),
                affine_shifting_bias=randn(gen, (c,), dtype, device, 0.5), num_channels=c, num_groups=s["groups"],
                eps=1e-6)


RECORDS = (OpSpec(
    name="group_norm",
    summary="GroupNorm over (B, C, *): channel groups normalised per batch row, per-channel affine",
    fn=group_norm, reference=ref.group_norm, original=ref.group_norm,
    original_name="torch.nn.GroupNorm's math in fp32, rounded to the input dtype (tigon.reference.group_norm)",
    make_inputs=_inputs, shape_of=_shape,
    size_format="batch x channels x hidden",
    size_label=lambda s: f"{s['batch']}x{s['channels']}x{s['hidden']} ({s['groups']} groups)",
    grad_inputs=("X", "affine_scaling_weight", "affine_shifting_bias"), category="norm",
    # read X, write y; backward: read dy, X, write dx (the (C,) parameters and their gradients are not counted)
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["batch"] * s["channels"] * s["hidden"] * e,
    peers={"liger": liger("liger_group_norm", "X", "affine_scaling_weight", "affine_shifting_bias", "num_channels",
                          "num_groups", "eps")},
    sweeps=("tokens", "hidden"), cases=(Case(),),
),)
