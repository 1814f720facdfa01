"""RMSNorm (Zhang & Sennrich 2019; HF LlamaRMSNorm / GemmaRMSNorm): the public op and its record.

Kernels: :mod:`tigon.kernels.rms_norm` (one pass over the rows forward; a persistent-grid backward with fp32 dW
partials, shared with LayerNorm in :mod:`tigon.kernels.norm`). Specification: :mod:`tigon.reference.rms_norm`.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._checks import ALIAS, UNSET, liger_names
from ..reference import rms_norm as ref
from ..support import TORCH_CODE, USAGE, remember_call, select_backend, switches, unwrap_dead
from ._dtensor import DTensorRule, accepts_dtensor, dtensor_call, last_dim
from ._record import Case, OpSpec, liger, rand, randn, sizes


@accepts_dtensor(DTensorRule(rows=("x",), outputs=("x",), params=("weight",), mixed_dims=last_dim), asked_inside=True)
def rms_norm(
    x: torch.Tensor = UNSET, weight: torch.Tensor | None = UNSET, eps: float = 1e-6, offset: float = 0.0,
    casting_mode: str = "llama", in_place: bool = True, *, X: torch.Tensor = ALIAS, W: torch.Tensor | None = ALIAS,
) -> torch.Tensor:
    """Root-mean-square layer norm over the last dimension (Zhang & Sennrich 2019; HF LlamaRMSNorm).

    ``y = x / sqrt(mean(x**2, -1) + eps) * (offset + weight)``, statistics in fp32. Drop-in for Liger-Kernel's
    ``liger_rms_norm(X, W, eps, offset, casting_mode, in_place=True)``, ``W=None`` included, by position or by
    keyword: Liger's names ``X`` and ``W`` are accepted for x and weight.

    Args:
        x: (..., hidden) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        weight: (hidden,) float tensor on x's device, or None: no weight, ``y = x / sqrt(mean(x**2) + eps)`` in x's
            dtype (Liger-Kernel's ``elementwise_affine=False``; ``offset`` is then unused, as there).
        eps: variance epsilon (HF ``rms_norm_eps``).
        offset: added to weight; 1.0 gives Gemma's ``(1 + weight)``.
        casting_mode: ``"llama"`` | ``"gemma"`` | ``"none"``, see :func:`tigon.reference.rms_norm.rms_norm`.
        in_place: Liger-Kernel's option (same default): the backward writes the gradient of x over the incoming
            gradient of y, the tensor autograd hands this op's backward, instead of a new (..., hidden) tensor. That
            saves ``x.numel() * x.element_size()`` bytes at the backward's peak (32 MiB for 4096 x 4096 bf16
            tokens x hidden). Unlike Liger's, it writes only where autograd's own bookkeeping shows that nothing
            else can read that gradient (:func:`tigon.kernels.grad_ownership.owns_grad`: one C++ owner, no Python
            reference beyond autograd's call, its own storage, contiguous, in x's dtype), so values never depend on
            it: where y's gradient is shared (y in ``y + r`` with r's branch still to run: Gemma-2's sandwich norms,
            which Liger patches with ``in_place=False`` for this reason), is a tensor you passed as
            ``grad_outputs`` or kept from a hook, or has another dtype (``"llama"`` casting with an fp32 weight and
            bf16 x), dx goes to a new tensor as with False. x, weight and y are never written. Not taken on the
            reference path nor under ``torch.compile`` (Inductor plans the backward's buffers itself).

    Returns:
        (..., hidden): dtype of x for ``"gemma"`` or without a weight, else the promotion of x's and weight's
        dtypes.

    Raises:
        TypeError: x or weight is missing, or given under both names (x and X, weight and W); x or weight is not a
            floating tensor; eps or offset is not a number; in_place is not a bool.
        ValueError: x is 0-d or its last dimension is empty, weight is not (hidden,), devices differ, casting_mode
            is unknown, eps is negative or not finite, or offset is not finite.
    """
    if x is UNSET or weight is UNSET or X is not ALIAS or W is not ALIAS:  # (Liger's keyword names)
        x, weight = liger_names("rms_norm", ("x", x, "X", X), ("weight", weight, "W", W))
    state = switches()
    try:  # (arguments that are not tensors or not hashable: no key, the checks below say what is wrong)
        key = None if state is None else (
            type(x), x.dtype, x.device, x.shape[-1:], type(weight),
            None if weight is None else (weight.dtype, weight.device, weight.shape), type(eps), eps, type(offset),
            offset, casting_mode, type(in_place), in_place, state)
        hit = None if state is None else _CALLS.get(key)  # (a lookup under torch.compile: a guard on the size)
    except (AttributeError, TypeError):
        key = hit = None
    if hit is not None:  # a call like one validated before: its checks passed and it runs the kernels (_CALLS)
        USAGE[hit[1]] += 1
        eps, offset, run = hit[0]  # (run: cached_apply's C-level apply, its tensors through unwrap_dead)
        return run(unwrap_dead(x), weight if weight is None else unwrap_dead(weight), eps, offset, casting_mode,
                   in_place)
    out = dtensor_call(rms_norm, x, weight, eps, offset, casting_mode, in_place)
    if out is not None:  # DTensor arguments: run on the local shards (tigon.ops._dtensor)
        return out
    eps, offset = _check(x, weight, eps, offset, casting_mode, in_place)
    backend = select_backend("rms_norm", x)
    if backend in TORCH_CODE:
        return ref.rms_norm(x, weight, eps, offset, casting_mode, in_place)
    from ..kernels import rms_norm as k
    from ..kernels._common import cached_apply, fast_apply

    run = k.compiled_rms_norm if torch.compiler.is_compiling() else fast_apply(k.RMSNormFunction)
    if key is not None:  # (not under torch.compile: cached_apply is not traced)
        remember_call(_CALLS, key, "rms_norm", backend, (eps, offset, cached_apply(k.RMSNormFunction)))
    return run(x, weight, eps, offset, casting_mode, in_place)


_CALLS: dict = {}
"""Validated calls (:func:`tigon.support.remember_call`): everything :func:`_check` reads (the tensors' types, dtypes,
devices, x's last dimension, weight's shape; the options with their types: ``True`` is not accepted for ``eps=1.0``)
and the backend's switches -> (eps, offset as floats, the autograd.Function's apply)."""


def _check(x, weight, eps, offset, casting_mode, in_place) -> tuple[float, float]:
    """:func:`rms_norm`'s argument checks (the errors its docstring lists); returns eps and offset as floats."""
    _checks.tensor("x", x, floating=True)
    if weight is not None:
        _checks.tensor("weight", weight, floating=True, ndim=1)
    _checks.same_device(x=x, weight=weight)
    _checks.choice("casting_mode", casting_mode, ref.CASTING_MODES)
    eps, offset = _checks.number("eps", eps, minimum=0.0), _checks.number("offset", offset)
    if not isinstance(in_place, bool):
        raise TypeError(f"in_place must be a bool, got {type(in_place).__name__} {in_place!r}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., hidden), got a 0-d tensor")
    if x.shape[-1] == 0:  # (the kernels' rows need one element; the reference path raises as they do)
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if weight is not None and weight.shape[0] != x.shape[-1]:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal weight's size ({weight.shape[0]}): "
                         f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    return eps, offset


# ---- the record ----------------------------------------------------------------------------------------------------
def quack_rms_norm(x, weight, eps, residual=None, **_):
    """QuACK's CuTe DSL RMSNorm (``quack.rmsnorm.rmsnorm``, fp32 math cast at the end), with ``residual`` its
    fused residual add (``prenorm=True``: returns (normed, new residual)). A bench peer; needs the CuTe DSL."""
    from quack.rmsnorm import rmsnorm

    if residual is None:
        return rmsnorm(x, weight, eps=eps)
    return rmsnorm(x, weight, residual=residual, eps=eps, prenorm=True)


def _shape(m) -> dict:
    return {"tokens": m.tokens, "hidden": m.hidden, "eps": m.rms_eps, "offset": m.rms_offset,
            "casting_mode": m.rms_casting_mode}


def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, hidden) with std 3 and mean 0.5, weight (hidden,) in [0.5, 1.5), the family's eps / offset /
    casting mode."""
    return dict(x=randn(gen, (s["tokens"], s["hidden"]), dtype, device, 3.0, 0.5),
                weight=rand(gen, (s["hidden"],), dtype, device), eps=s.get("eps", 1e-6),
                offset=s.get("offset", 0.0), casting_mode=s.get("casting_mode", "llama"))


RECORDS = (OpSpec(
    name="rms_norm",
    summary="RMSNorm over the last dimension (Llama / Gemma casting)",
    fn=rms_norm,
    reference=ref.rms_norm,
    original=ref.rms_norm,
    original_name="HF LlamaRMSNorm / GemmaRMSNorm math (tigon.reference.rms_norm)",
    make_inputs=_inputs,
    shape_of=_shape,
    **sizes("tokens", "hidden"),
    grad_inputs=("x", "weight"),
    category="norm",
    under_compile="inductor",  # under torch.compile Inductor fuses it with its neighbours (the residual add)
    # read x, write y; backward: read x, dy, write dx
    min_bytes=lambda s, e, mode: (2 if mode == "fwd" else 5) * s["tokens"] * s["hidden"] * e,
    peers={"liger": liger("liger_rms_norm", "x", "weight", "eps", "offset", "casting_mode"), "quack": quack_rms_norm},
    sweeps=("tokens", "hidden"),
    leading_dims=("x",),
    cases=(Case(),),
),)
