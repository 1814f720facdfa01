"""Residual add + RMSNorm (HF decoder layers: ``residual + hidden_states``, then the next RMSNorm): the public op
and its record.

Kernels: :mod:`tigon.kernels.fused_add_rms_norm` (RMSNorm's kernels in :mod:`tigon.kernels.norm` with the add
folded in: one pass forward, a persistent-grid backward with fp32 dW partials). Specification:
:mod:`tigon.reference.fused_add_rms_norm`.
"""

from __future__ import annotations

import torch

from .. import _checks
from .._checks import ALIAS, UNSET, liger_names
from ..reference import fused_add_rms_norm as ref
from ..reference import rms_norm as ref_rms
from ..support import TORCH_CODE, USAGE, remember_call, select_backend, switches, unwrap_dead
from ._dtensor import DTensorRule, accepts_dtensor, dtensor_call, last_dim
from ._record import Case, OpSpec, liger, rand, randn, sizes
from .rms_norm import quack_rms_norm


@accepts_dtensor(DTensorRule(rows=("x", "residual"), outputs=("x", "x"), params=("weight",),
                             mixed_dims=last_dim), asked_inside=True)
def fused_add_rms_norm(
    x: torch.Tensor = UNSET, residual: torch.Tensor = UNSET, weight: torch.Tensor = UNSET, eps: float = 1e-6,
    offset: float = 0.0, casting_mode: str = "llama", in_place: bool = False, *, X: torch.Tensor = ALIAS,
    R: torch.Tensor = ALIAS, W: torch.Tensor = ALIAS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual``, then RMSNorm of s: returns ``(rms_norm(s, weight, eps, offset, casting_mode), s)``.

    The step between a decoder layer's blocks (HF LlamaDecoderLayer: ``hidden_states = residual + hidden_states;
    residual = hidden_states; hidden_states = norm(hidden_states)``) in one pass over the rows; Liger-Kernel's
    ``liger_fused_add_rms_norm(X, R, W, eps, offset=0.0, casting_mode="llama", in_place=True)`` (the same order
    and defaults; eps defaults to 1e-6 here; Liger's keyword names ``X``, ``R``, ``W`` are accepted). s is added in
    x's dtype (one rounding, as torch adds), and y is exactly :func:`tigon.functional.rms_norm` of s (statistics in
    fp32). The gradient of x and of residual is one tensor, ``rstd * (g - shat * mean(g * shat)) + ds`` with
    ``g = dy * (offset + weight)``, ``shat = s * rstd`` and ds the gradient reaching s (zero when s is not used).

    Args:
        x: (..., hidden) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides. The
            layer's new hidden states (the attention or MLP output).
        residual: the residual stream: x's shape and dtype, any strides.
        weight: (hidden,) float tensor on x's device.
        eps: variance epsilon (HF ``rms_norm_eps``).
        offset: added to weight; 1.0 gives Gemma's ``(1 + weight)``.
        casting_mode: ``"llama"`` | ``"gemma"`` | ``"none"``, see :func:`tigon.reference.rms_norm.rms_norm`.
        in_place: Liger-Kernel's option (default False here, True in Liger: the in-place backward's CUDA tests did
            not pass on the H200 on 2026-12-04 (their report was lost; benchmarks/results/h200/README.md, fourteenth
            run), so it is opt-in until they do): the backward writes the gradient of x and residual over y's
            incoming gradient (the tensor autograd hands this op's backward for y) instead of a new
            (..., hidden) tensor, saving ``x.numel() * x.element_size()`` bytes at the backward's peak. Unlike
            Liger's, it writes only where autograd's own bookkeeping shows that nothing else can read that gradient
            (:func:`tigon.kernels.grad_ownership.owns_grad`, as :func:`tigon.functional.rms_norm`'s ``in_place``),
            so values never depend on it: where y's gradient is also s's (``y + s``), is shared with another branch
            (y in ``y + t``), is a tensor you passed to ``backward`` / ``grad_outputs`` or kept from a hook, or is
            not contiguous or not in x's dtype (``"llama"`` casting with an fp32 weight and bf16 x), the gradient
            goes to a new tensor as with False. x, residual, weight and the outputs are never written. Not taken on
            the reference path nor under ``torch.compile`` (Inductor plans the backward's buffers itself).
            (:class:`tigon.nn.FusedAddRMSNorm` defaults to False, as Liger's module.)

    Returns:
        (y, s): y (..., hidden), dtype of x for ``"gemma"``, else the promotion of x's and weight's dtypes; s
        (..., hidden) in x's dtype, the new residual stream. Both contiguous on the kernel path.

    Raises:
        TypeError: x, residual or weight is missing or given under both names (x and X, residual and R, weight and
            W); x, residual or weight is not a floating tensor; residual's dtype is not x's; eps or offset is
            not a number; in_place is not a bool.
        ValueError: weight is not (hidden,), residual's shape is not x's, x is 0-d or its last dimension is empty,
            devices differ, casting_mode is unknown, eps is negative or not finite, or offset is not finite.
    """
    if (x is UNSET or residual is UNSET or weight is UNSET or X is not ALIAS or R is not ALIAS
            or W is not ALIAS):  # (Liger's keyword names)
        x, residual, weight = liger_names("fused_add_rms_norm", ("x", x, "X", X), ("residual", residual, "R", R),
                                          ("weight", weight, "W", W))
    state = switches()
    try:  # (arguments that are not tensors or not hashable: no key, the checks below say what is wrong)
        key = None if state is None else (
            type(x), x.dtype, x.device, x.shape, type(residual), residual.dtype, residual.device, residual.shape,
            type(weight), weight.dtype, weight.device, weight.shape, type(eps), eps, type(offset), offset,
            casting_mode, type(in_place), in_place, state)
        hit = None if state is None else _CALLS.get(key)  # (a lookup under torch.compile: a guard on the size)
    except (AttributeError, TypeError):
        key = hit = None
    if hit is not None:  # a call like one validated before: its checks passed and it runs the kernels (_CALLS)
        USAGE[hit[1]] += 1
        eps, offset, run = hit[0]  # (run: cached_apply's C-level apply, its tensors through unwrap_dead)
        return run(unwrap_dead(x), unwrap_dead(residual), unwrap_dead(weight), eps, offset, casting_mode, in_place)
    out = dtensor_call(fused_add_rms_norm, x, residual, weight, eps, offset, casting_mode, in_place)
    if out is not None:  # DTensor arguments: run on the local shards (tigon.ops._dtensor)
        return out
    eps, offset = _check(x, residual, weight, eps, offset, casting_mode, in_place)
    backend = select_backend("fused_add_rms_norm", x)
    if backend in TORCH_CODE:
        return ref.fused_add_rms_norm(x, residual, weight, eps, offset, casting_mode, in_place)
    from ..kernels import fused_add_rms_norm as k
    from ..kernels._common import cached_apply, fast_apply

    run = k.compiled_fused_add_rms_norm if torch.compiler.is_compiling() else fast_apply(k.FusedAddRMSNormFunction)
    if key is not None:  # (not under torch.compile: cached_apply is not traced)
        hit_run = cached_apply(k.FusedAddRMSNormFunction)
        remember_call(_CALLS, key, "fused_add_rms_norm", backend, (eps, offset, hit_run))
    return run(x, residual, weight, eps, offset, casting_mode, in_place)


_CALLS: dict = {}
"""Validated calls (:func:`tigon.support.remember_call`): everything :func:`_check` reads (the tensors' types, dtypes,
devices and shapes; the options with their types) and the backend's switches -> (eps, offset as floats, the
autograd.Function's apply)."""


def _check(x, residual, weight, eps, offset, casting_mode, in_place) -> tuple[float, float]:
    """:func:`fused_add_rms_norm`'s argument checks (the errors its docstring lists); returns eps and offset as
    floats."""
    _checks.tensor("x", x, floating=True)
    _checks.tensor("residual", residual, floating=True)
    _checks.tensor("weight", weight, floating=True, ndim=1)
    _checks.same_device(x=x, residual=residual, weight=weight)
    _checks.choice("casting_mode", casting_mode, ref.CASTING_MODES)
    eps, offset = _checks.number("eps", eps, minimum=0.0), _checks.number("offset", offset)
    _checks.flag("in_place", in_place)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., hidden), got a 0-d tensor")
    if x.shape[-1] == 0:  # (the kernels' rows need one element; the reference path raises as they do)
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    if residual.shape != x.shape:
        raise ValueError(f"residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    if residual.dtype != x.dtype:
        raise TypeError(f"residual must have x's dtype {x.dtype}, got {residual.dtype}")
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal weight's size ({weight.shape[0]}): "
                         f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    return eps, offset


# ---- the record ----------------------------------------------------------------------------------------------------
def hf_fused_add_rms_norm(x, residual, weight, eps=1e-6, offset=0.0, casting_mode="llama", in_place=False):
    """What HF decoder layers run: ``hidden_states = residual + hidden_states; residual = hidden_states``, then the
    RMSNorm (:func:`tigon.reference.rms_norm.rms_norm`). Returns (normed, residual)."""
    s = residual + x
    return ref_rms.rms_norm(s, weight, eps, offset, casting_mode), s


def _shape(m) -> dict:
    return {"tokens": m.tokens, "hidden": m.hidden, "eps": m.rms_eps, "offset": m.rms_offset,
            "casting_mode": m.rms_casting_mode}


def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, hidden) standard normal (a block's output), residual (tokens, hidden) with std 3 and mean 0.5,
    weight (hidden,) in [0.5, 1.5), the family's eps / offset / casting mode."""
    shape = (s["tokens"], s["hidden"])
    return dict(x=randn(gen, shape, dtype, device), residual=randn(gen, shape, dtype, device, 3.0, 0.5),
                weight=rand(gen, (s["hidden"],), dtype, device), eps=s.get("eps", 1e-6),
                offset=s.get("offset", 0.0), casting_mode=s.get("casting_mode", "llama"))


RECORDS = (OpSpec(
    name="fused_add_rms_norm",
    summary="residual add then RMSNorm, returning (normed, new residual) (HF decoder layers)",
    fn=fused_add_rms_norm,
    reference=ref.fused_add_rms_norm,
    original=hf_fused_add_rms_norm,
    original_name="HF decoder layer: residual + hidden_states, then LlamaRMSNorm / GemmaRMSNorm math",
    make_inputs=_inputs,
    shape_of=_shape,
    **sizes("tokens", "hidden"),
    grad_inputs=("x", "residual", "weight"),
    category="norm",
    under_compile="inductor",  # under torch.compile Inductor fuses it with its neighbours (the residual add)
    # read x, residual, write y, s; backward: read dy, ds, s, write ds_total once (the gradient of x and residual)
    min_bytes=lambda s, e, mode: (4 if mode == "fwd" else 8) * s["tokens"] * s["hidden"] * e,
    peers={"liger": liger("liger_fused_add_rms_norm", "x", "residual", "weight", "eps", "offset", "casting_mode"),
           "quack": quack_rms_norm},
    sweeps=("tokens", "hidden"),
    leading_dims=("x", "residual"),
    # (no in_place bench case: the bench hands the backward its own upstream gradient, which in_place never writes)
    cases=(Case(),),
),)
