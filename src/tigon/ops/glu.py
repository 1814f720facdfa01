"""The gated MLP's elementwise product (GLU variants, Shazeer 2020): swiglu, geglu, and glu_linear (the product
folded into the down projection). The public ops and their records.

Kernels: :mod:`tigon.kernels.glu`. Specification: :mod:`tigon.reference.glu`.
"""

from __future__ import annotations

import math

import torch

from .. import _checks
from .._checks import ALIAS, UNSET, liger_names
from ..reference import glu as ref
from ..support import TORCH_CODE, USAGE, remember_call, select_backend, switches, unwrap_dead
from ._dtensor import DTensorRule, accepts_dtensor, dtensor_call, no_dims
from ._record import Case, OpSpec, liger, randn, sizes


def _glu(gate: torch.Tensor, up: torch.Tensor, activation: str, inplace_backward: bool, gm: float,
         dm: float, limit: float | None = None) -> torch.Tensor:
    """``act(gm * gate) * up * dm`` on the kernels (eager: the autograd.Function; compiled: the custom op); gate and
    up clamped at ``limit`` (already rounded by :func:`_limit`) first unless it is None."""
    from ..kernels import glu as k

    if torch.compiler.is_compiling():
        return k.compiled_glu(gate, up, activation, gm, dm, limit)
    return _glu_apply()(gate, up, activation, _writable_fast(inplace_backward, gate, up), gm, dm, limit)


def _glu_apply(cached: bool = False):
    """:class:`tigon.kernels.glu.GLUFunction`'s apply (:func:`tigon.kernels._common.fast_apply`); ``cached``: the
    one a cache hit calls (:func:`tigon.kernels._common.cached_apply`)."""
    from ..kernels import glu as k
    from ..kernels._common import cached_apply, fast_apply

    return cached_apply(k.GLUFunction) if cached else fast_apply(k.GLUFunction)


def _writable_fast(inplace_backward, gate: torch.Tensor, up: torch.Tensor) -> bool:
    """:func:`_writable` of gate and up, without its call for contiguous ones."""
    return bool(inplace_backward) and (gate.is_contiguous() and up.is_contiguous() or _writable(True, gate, up))


def _writable(inplace_backward: bool, *tensors: torch.Tensor) -> bool:
    """``inplace_backward``, unless an element of one of ``tensors`` shares its memory with another (an expanded
    tensor, stride 0): the gradients written there would overwrite each other (each row of an expanded gate got
    the last row's, summed). Sorted by stride, each dimension of a tensor that owns its elements steps past the
    extent of the smaller ones."""
    if not inplace_backward:
        return False
    for t in tensors:
        if t.is_contiguous():  # owns each of its elements (and skips the sort: ~2 us of host time a tensor)
            continue
        extent = 1
        for size, stride in sorted(((n, s) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1]):
            if stride < extent:
                return False
            extent += stride * (size - 1)
    return True


def _multipliers(gate_multiplier, down_multiplier) -> tuple[float, float]:
    """The two multipliers as finite floats (TypeError / ValueError naming the argument otherwise)."""
    return _checks.number("gate_multiplier", gate_multiplier), _checks.number("down_multiplier", down_multiplier)


def _limit(limit, dtype: torch.dtype) -> float | None:
    """``limit`` (:func:`swiglu`'s clamp) checked, as the float the kernels compare with: rounded to ``dtype``, as
    torch.clamp rounds its scalar bound to the tensor's dtype (a bf16 gate is clamped at bf16(limit), and gets
    gradient 1 at exactly that value); None stays None.

    Raises:
        TypeError: not a real number (a bool or a tensor is not one). ValueError: not finite, or not positive.
    """
    if limit is None:
        return None
    if type(limit) is not float and (isinstance(limit, bool) or not isinstance(limit, (int, float))):
        raise TypeError(f"limit must be a real number or None, got {type(limit).__name__} {limit!r}")
    if not (_checks.finite(limit) and limit > 0):
        raise ValueError(f"limit must be a positive finite number or None, got {limit!r}")
    return float(torch.tensor(float(limit), dtype=dtype)) if dtype.is_floating_point else float(limit)


def _check_glu(gate, up) -> None:
    _checks.tensor("gate", gate, floating=True)
    _checks.tensor("up", up, floating=True)
    _checks.same_device(gate=gate, up=up)
    if up.dtype != gate.dtype:
        raise TypeError(f"up must have gate's dtype {gate.dtype}, got {up.dtype}")
    if up.shape != gate.shape:
        raise ValueError(f"up must have gate's shape {tuple(gate.shape)}, got {tuple(up.shape)}")


GLU_DTENSOR = DTensorRule(rows=("gate", "up"), outputs=("gate",), mixed_dims=no_dims)
"""DTensor gate / up run on their local shards, whatever the sharding (element-wise; see tigon.ops._dtensor)."""


@accepts_dtensor(GLU_DTENSOR, asked_inside=True)
def swiglu(gate: torch.Tensor = UNSET, up: torch.Tensor = UNSET, *, gate_multiplier: float = 1.0,
           down_multiplier: float = 1.0, inplace_backward: bool = False, limit: float | None = None,
           a: torch.Tensor = ALIAS, b: torch.Tensor = ALIAS) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up`` elementwise, ``silu(x) = x * sigmoid(x)`` (GLU variants, Shazeer 2020).

    The product HF LlamaMLP forms, ``act_fn(gate_proj(x)) * up_proj(x)``; with multipliers
    ``silu(gate_multiplier * gate) * up * down_multiplier``, HF FalconH1MLP's (see below); with ``limit``,
    DeepSeek-V4's clamped SwiGLU ``silu(gate.clamp(max=limit)) * up.clamp(-limit, limit)`` (see below). Drop-in for
    Liger-Kernel's ``liger_swiglu(a, b)`` (gate, up; Liger's keyword names ``a``, ``b`` are accepted). Math in
    fp32, one rounding; the backward recomputes the activation from gate (nothing but gate and up is saved).

    Args:
        gate: (..., I) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides (a
            slice of a fused gate-up projection is read in place when its rows have unit stride).
        up: the same shape and dtype as gate.
        gate_multiplier: scales gate before the activation (HF FalconH1MLP's ``gate_multiplier``,
            ``config.mlp_multipliers[0]``); a kernel scalar in fp32, so no (..., I) tensor is formed for it.
        down_multiplier: scales the product (FalconH1MLP's ``down_multiplier``, ``config.mlp_multipliers[1]``, which
            HF applies to the down projection's output: the same when that projection has no bias, as in Falcon-H1's
            ``mlp_bias=False``, since a linear map commutes with the scalar; one rounding fewer than HF's).
        inplace_backward: if True the backward writes d_gate into gate's storage and d_up into up's (no new
            (..., I) buffers: saves 2 x gate's bytes at the peak of the backward). Only for gate/up that nothing
            else reads after the backward (the outputs of the MLP's projections are such); a second backward
            through the same graph then raises; ignored by the reference path, and where gate or up has elements
            that share memory (an expanded tensor: new buffers then). Default False: the inputs are never written.
        limit: DeepSeek-V4's ``config.swiglu_limit`` (transformers ``modeling_deepseek_v4.py``,
            ``DeepseekV4MLP.forward`` and ``DeepseekV4Experts._apply_gate``: ``act_fn(gate.clamp(max=limit)) *
            up.clamp(min=-limit, max=limit)``): gate is clamped above at ``limit`` and up to ``[-limit, limit]``
            before the activation (and before the multipliers: ``silu(gm * min(gate, limit)) * clamp(up) * dm``).
            torch.clamp's semantics throughout: the bound rounded to gate's dtype, NaN kept, and the gradient
            passed inside the closed interval (at exactly the bound too) and 0 beyond it. A positive finite number,
            or None (default: no clamp). Not GPT-OSS's clamp (:func:`clamped_swiglu`: alpha, ``+ 1`` on up).

    Returns:
        (..., I) tensor in gate's dtype (contiguous); gradients in the same dtype.

    Raises:
        TypeError: gate or up missing or given under both names (gate and a, up and b), a non-floating tensor, gate
            and up of different dtypes, or a multiplier or limit that is not a number.
        ValueError: shapes differ, devices differ, a multiplier is not finite, or limit is not positive and finite.
    """
    if gate is UNSET or up is UNSET or a is not ALIAS or b is not ALIAS:  # (Liger's keyword names)
        gate, up = liger_names("swiglu", ("gate", gate, "a", a), ("up", up, "b", b))
    state = switches()
    try:  # (arguments that are not tensors or not hashable: no key, the checks below say what is wrong)
        key = None if state is None else (
            "silu", type(gate), gate.dtype, gate.device, gate.shape, type(up), up.dtype, up.device, up.shape,
            type(gate_multiplier), gate_multiplier, type(down_multiplier), down_multiplier, type(limit), limit, state)
        hit = None if state is None else _CALLS.get(key)  # (a lookup under torch.compile: a guard on the size)
    except (AttributeError, TypeError):
        key = hit = None
    if hit is not None:  # a call like one validated before: its checks passed and it runs the kernels (_CALLS)
        USAGE[hit[1]] += 1
        gm, dm, lim, run = hit[0]
        writable = bool(inplace_backward) and (gate.is_contiguous() and up.is_contiguous()
                                               or _writable(True, gate, up))
        return run(unwrap_dead(gate), unwrap_dead(up), "silu", writable, gm, dm, lim)  # (run: cached_apply's)
    out = dtensor_call(swiglu, gate, up, gate_multiplier=gate_multiplier, down_multiplier=down_multiplier,
                       inplace_backward=inplace_backward, limit=limit)
    if out is not None:  # DTensor arguments: run on the local shards (tigon.ops._dtensor)
        return out
    _check_glu(gate, up)
    gm, dm = _multipliers(gate_multiplier, down_multiplier)
    lim = _limit(limit, gate.dtype)
    backend = select_backend("swiglu", gate)
    if backend in TORCH_CODE:
        return ref.swiglu(gate, up, gm, dm, limit)
    if not torch.compiler.is_compiling():
        remember_call(_CALLS, key, "swiglu", backend, (gm, dm, lim, _glu_apply(cached=True)))
    return _glu(gate, up, "silu", inplace_backward, gm, dm, lim)


@accepts_dtensor(GLU_DTENSOR, asked_inside=True)
def geglu(gate: torch.Tensor = UNSET, up: torch.Tensor = UNSET, approximate: str = "tanh", *,
          gate_multiplier: float = 1.0, down_multiplier: float = 1.0, inplace_backward: bool = False,
          a: torch.Tensor = ALIAS, b: torch.Tensor = ALIAS) -> torch.Tensor:
    """GeGLU: ``gelu(gate, approximate) * up`` elementwise (GLU variants, Shazeer 2020).

    :func:`torch.nn.functional.gelu` semantics: ``approximate="tanh"`` is
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (HF ``gelu_pytorch_tanh``, Gemma), ``"none"`` is the
    exact ``x * Phi(x)``. Math in fp32; the backward recomputes the activation from gate. Drop-in for Liger-Kernel's
    ``liger_geglu(a, b)`` (gate, up, tanh approximation; Liger's keyword names ``a``, ``b`` are accepted).

    Args:
        gate: (..., I) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        up: the same shape and dtype as gate.
        inplace_backward: if True the backward writes d_gate into gate's storage and d_up into up's (no new
            (..., I) buffers: saves 2 x gate's bytes at the peak of the backward). Only for gate/up that nothing
            else reads after the backward (the outputs of the MLP's projections are such); a second backward
            through the same graph then raises; ignored by the reference path, and where gate or up has elements
            that share memory (an expanded tensor: new buffers then). Default False: the inputs are never written.
        approximate: ``"tanh"`` or ``"none"``.
        gate_multiplier, down_multiplier: as :func:`swiglu`'s: ``gelu(gate_multiplier * gate) * up *
            down_multiplier``.

    Returns:
        (..., I) tensor in gate's dtype (contiguous); gradients in the same dtype.

    Raises:
        TypeError: gate or up missing or given under both names (gate and a, up and b), a non-floating tensor, gate
            and up of different dtypes, or a multiplier that is not a number.
        ValueError: shapes differ, devices differ, approximate is unknown, or a multiplier is not finite.
    """
    if gate is UNSET or up is UNSET or a is not ALIAS or b is not ALIAS:  # (Liger's keyword names)
        gate, up = liger_names("geglu", ("gate", gate, "a", a), ("up", up, "b", b))
    state = switches()
    try:  # (arguments that are not tensors or not hashable: no key, the checks below say what is wrong)
        key = None if state is None else (
            "gelu", approximate, type(gate), gate.dtype, gate.device, gate.shape, type(up), up.dtype, up.device,
            up.shape, type(gate_multiplier), gate_multiplier, type(down_multiplier), down_multiplier, state)
        hit = None if state is None else _CALLS.get(key)  # (a lookup under torch.compile: a guard on the size)
    except (AttributeError, TypeError):
        key = hit = None
    if hit is not None:
        USAGE[hit[1]] += 1
        gm, dm, run = hit[0]
        return run(unwrap_dead(gate), unwrap_dead(up), "gelu_tanh" if approximate == "tanh" else "gelu",
                   _writable_fast(inplace_backward, gate, up), gm, dm, None)
    out = dtensor_call(geglu, gate, up, approximate, gate_multiplier=gate_multiplier,
                       down_multiplier=down_multiplier, inplace_backward=inplace_backward)
    if out is not None:  # DTensor arguments: run on the local shards (tigon.ops._dtensor)
        return out
    _check_glu(gate, up)
    _checks.choice("approximate", approximate, ("tanh", "none"))
    gm, dm = _multipliers(gate_multiplier, down_multiplier)
    backend = select_backend("geglu", gate)
    if backend in TORCH_CODE:
        return ref.geglu(gate, up, approximate, gm, dm)
    if not torch.compiler.is_compiling():
        remember_call(_CALLS, key, "geglu", backend, (gm, dm, _glu_apply(cached=True)))
    return _glu(gate, up, "gelu_tanh" if approximate == "tanh" else "gelu", inplace_backward, gm, dm)


def glu_linear(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               activation: str = "silu", gate_multiplier: float = 1.0, down_multiplier: float = 1.0,
               inplace_backward: bool = False, limit: float | None = None) -> torch.Tensor:
    """A gated MLP's down projection of its gated product, ``linear(act(gate) * up, weight, bias)``, without
    keeping the (..., I) product for the backward.

    HF LlamaMLP computes ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` (GLU variants, Shazeer 2020); autograd
    then saves gate, up (for the activation's backward) *and* the product (the down projection's input, for its
    weight gradient): three (tokens, I) tensors per layer. This saves gate and up only. The backward forms ``dy =
    dout @ weight`` and one elementwise pass reads dy, gate and up and writes d_gate, d_up and, over dy, the
    recomputed product, from which ``d_weight = dout.T @ product``: tokens x I x (element size) bytes less
    activation memory per MLP (224 MiB per Llama-3-8B layer at 8192 tokens in bf16) for one extra (tokens, I) write
    in the backward. Forward output and gradients equal ``down_proj(swiglu(gate, up))`` (the same kernels and
    matmuls).

    Args:
        gate: (..., I) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        up: gate's shape and dtype.
        weight: (H, I) float tensor (``nn.Linear`` layout), on gate's device; under autocast it may be fp32 (cast
            to the autocast dtype as ``F.linear`` does).
        bias: (H,) or None.
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh-approximate GELU, HF
            ``gelu_pytorch_tanh``).
        gate_multiplier, down_multiplier: as :func:`swiglu`'s, in the product: ``linear(act(gate_multiplier * gate) *
            up * down_multiplier, weight, bias)`` (HF FalconH1MLP's forward when bias is None).
        inplace_backward: as :func:`swiglu`: d_gate and d_up are written into gate's and up's memory.
        limit: as :func:`swiglu`'s (DeepSeek-V4's clamps of gate and up before the activation,
            ``DeepseekV4MLP.forward``: ``down_proj(act_fn(gate.clamp(max=limit)) * up.clamp(-limit, limit))``); with
            ``activation="silu"`` only; None: no clamp.

    Returns:
        (..., H) in gate's dtype, or the autocast dtype under autocast.

    Raises:
        TypeError: a non-floating tensor, gate and up of different dtypes, a multiplier or limit that is not a number,
            or (outside autocast) weight / bias of another dtype than gate's.
        ValueError: gate is 0-d, shapes differ (weight must be (H, I), bias (H,)), devices differ, activation
            is unknown, a multiplier is not finite, limit is not positive and finite, or limit is given with another
            activation than ``"silu"``.

    The memory saving is eager mode's: under ``torch.compile`` this runs as ``F.linear(swiglu/geglu(gate, up),
    weight, bias)`` with the GLU as an opaque custom op, and the compiler's partitioner decides what is saved (it
    then keeps the product, as for the unfused MLP).
    """
    state = switches()
    try:  # (not tensors or not hashable: no key, the checks below say what is wrong; autocast on: the full path)
        key = None if state is None or _ANY_AUTOCAST is None or _ANY_AUTOCAST() else (
            activation, type(gate), gate.dtype, gate.device, gate.shape, type(up), up.dtype, up.device, up.shape,
            type(gate_multiplier), gate_multiplier, type(down_multiplier), down_multiplier, type(weight), weight.dtype,
            weight.device, weight.shape, type(bias), None if bias is None else (bias.dtype, bias.device, bias.shape),
            type(limit), limit, state)
        hit = None if state is None else _CALLS.get(key)  # (a lookup under torch.compile: a guard on the size)
    except (AttributeError, TypeError):
        key = hit = None
    if hit is not None:  # a call like one validated before: its checks passed and it runs the kernels (_CALLS)
        USAGE[hit[1]] += 1
        gm, dm, cd, lim, run = hit[0]
        writable = bool(inplace_backward) and (gate.is_contiguous() and up.is_contiguous()
                                               or _writable(True, gate, up))  # (_writable_fast, inline)
        # (run: cached_apply's C-level apply, its tensors through unwrap_dead)
        return run(unwrap_dead(gate), unwrap_dead(up), unwrap_dead(weight), bias if bias is None else unwrap_dead(bias),
                   activation, cd, writable, gm, dm, lim)
    _check_glu(gate, up)
    _checks.choice("activation", activation, ref.GLU_ACTIVATIONS)
    gm, dm = _multipliers(gate_multiplier, down_multiplier)
    lim = _limit(limit, gate.dtype)
    if lim is not None and activation != "silu":
        raise ValueError(f"limit (DeepSeek-V4's clamped SwiGLU) needs activation='silu', got {activation!r}")
    _checks.tensor("weight", weight, floating=True, ndim=2)
    if gate.dim() == 0:
        raise ValueError("gate must have at least one dimension (..., I), got a 0-d tensor")
    if weight.shape[1] != gate.shape[-1]:
        raise ValueError(f"weight must have shape (H, {gate.shape[-1]}), got {tuple(weight.shape)}")
    if bias is not None:
        _checks.tensor("bias", bias, floating=True, ndim=1)
        if bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    _checks.same_device(gate=gate, weight=weight, bias=bias)
    dev = gate.device.type
    autocast = dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev)  # (meta, ...: no autocast to ask about)
    cd = torch.get_autocast_dtype(dev) if autocast else gate.dtype
    if not autocast and (weight.dtype != gate.dtype or (bias is not None and bias.dtype != gate.dtype)):
        raise TypeError(f"weight and bias must have gate's dtype {gate.dtype} outside autocast, got "
                        f"{weight.dtype} and {bias.dtype if bias is not None else None}")
    backend = select_backend("glu_linear", gate)
    if backend in TORCH_CODE:
        return ref.glu_linear(gate, up, weight, bias, activation, gm, dm, limit)
    from ..kernels import glu as k
    from ..kernels._common import cached_apply, fast_apply

    if torch.compiler.is_compiling():
        return torch.nn.functional.linear(k.compiled_glu(gate, up, activation, gm, dm, lim), weight, bias)
    run = fast_apply(k.GLULinearFunction)
    remember_call(_CALLS, key, "glu_linear", backend, (gm, dm, cd, lim, cached_apply(k.GLULinearFunction)))
    return run(gate, up, weight, bias, activation, cd, _writable_fast(inplace_backward, gate, up), gm, dm, lim)


_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)
_CALLS: dict = {}
"""Validated calls of swiglu, geglu and glu_linear (:func:`tigon.support.remember_call`): everything their checks read
(the tensors' types, dtypes, devices and shapes; the options, the multipliers and limit with their types; glu_linear
outside autocast only) and the backend's switches -> (gm, dm as floats[, glu_linear's matmul dtype][, the rounded
limit], the apply)."""


# ---- the records ---------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """gate and up (tokens, intermediate); gate with std 3 so the activation's tails are reached."""
    return dict(gate=randn(gen, (s["tokens"], s["intermediate"]), dtype, device, 3.0),
                up=randn(gen, (s["tokens"], s["intermediate"]), dtype, device))


def _linear_inputs(s: dict, dtype, device, gen) -> dict:
    """gate and up as for swiglu, the down projection's weight (hidden, intermediate) with std 1/sqrt(intermediate);
    the model's activation (:attr:`ModelShapes.activation`, Gemma's ``gelu_tanh``) where the shape names one (a case's
    own ``activation`` replaces it in verify)."""
    extra = {"activation": s["activation"]} if s.get("activation") else {}
    return dict(_inputs(s, dtype, device, gen), **extra,
                weight=randn(gen, (s["hidden"], s["intermediate"]), dtype, device, 1.0 / math.sqrt(s["intermediate"])))


def _liger_linear(gate, up, weight, activation: str = "silu", **_):
    """Liger's MLP: its swiglu (geglu, the tanh GELU, for ``gelu_tanh``), then the down projection (which keeps the
    product for the backward).

    Raises:
        ValueError: ``activation="gelu"`` (exact GELU: Liger has no such GLU)."""
    from liger_kernel.transformers import functional as LF

    glu = {"silu": LF.liger_swiglu, "gelu_tanh": LF.liger_geglu}.get(activation)
    if glu is None:
        raise ValueError(f"activation={activation!r}: Liger-Kernel has no gated MLP with it (silu, gelu_tanh)")
    return torch.nn.functional.linear(glu(gate, up), weight)


def _glu_bytes(s, e, mode):  # read gate, up, write out; backward: read dout, gate, up, write both gradients
    return (3 if mode == "fwd" else 8) * s["tokens"] * s["intermediate"] * e


def _gate_shape(m) -> dict:
    return {"tokens": m.tokens, "intermediate": m.intermediate}


_FALCON_H1 = Case("multipliers=1.5,0.5", options={"gate_multiplier": 1.5, "down_multiplier": 0.5})
"""HF FalconH1MLP's gate and down multipliers (config.mlp_multipliers), as kernel scalars."""
_DEEPSEEK_V4 = Case("limit=2.0", options={"limit": 2.0})
"""DeepSeek-V4's clamps of gate and up (config.swiglu_limit, 10 in its checkpoints; 2 here, so that a share of the
builder's gate (std 3) and up (std 1) lies on each side of them)."""
_INPLACE = Case("inplace_backward=True", options={"inplace_backward": True}, tags=frozenset({"bench"}),
                provider="tigon_inplace")
_NOTES = {"tigon_inplace": ("inplace_backward=True: the backward writes the gradients of gate and up into their memory "
                            "(as in a model, where they replace the projections' outputs); repeated calls run on "
                            "overwritten inputs (same work, other values)")}

HOST_BOUND_GLU = 1 << 23
"""The GLU records' :attr:`~tigon.ops.OpSpec.host_bound_elements`: a patched MLP whose product has at most 2^23
elements (tokens x intermediate: 1024 tokens of Llama-3.2-1B's 8192, 1724 of Qwen2.5-0.5B's 4864) runs the
original MLP on a CUDA GPU. H200, host issue time per forward + backward at 1024 x 4864 (benchmarks/host_issue.py):
eager silu * up 110 us, Tigon's swiglu 202 us (an autograd.Function, 88.5 us empty, and two Triton launches); the
kernel saves 6 of eager's 14 passes over (tokens, intermediate) bf16 tensors, 6 x 2 x 2^23 B / 4.3 TB/s = 23 us
of GPU time at this size, a quarter of the host time it costs: below it a step that waits on the host gains,
and one that waits on the GPU loses little. (The break-even of the op alone is near 2^25.) To be tuned on the GPU
with ``TIGON_HOST_BOUND_ELEMENTS`` (e2e rows of small models)."""

RECORDS = (
    OpSpec(
        name="swiglu",
        summary="silu(gate) * up, the gated MLP's product (Llama)",
        fn=swiglu, reference=ref.swiglu, original=ref.swiglu, original_name="silu(gate) * up (HF LlamaMLP)",
        make_inputs=_inputs, shape_of=_gate_shape, **sizes("tokens", "intermediate"),
        grad_inputs=("gate", "up"), category="activation", min_bytes=_glu_bytes, under_compile="inductor",
        peers={"liger": liger("liger_swiglu", "gate", "up")},
        cases=(Case(), _FALCON_H1, _DEEPSEEK_V4, _INPLACE), bench_notes=_NOTES, leading_dims=("gate", "up"),
        host_bound_elements=HOST_BOUND_GLU,
    ),
    OpSpec(
        name="geglu",
        summary="gelu(gate) * up, the gated MLP's product (Gemma)",
        fn=geglu, reference=ref.geglu, original=ref.geglu,
        original_name="gelu(gate, approximate='tanh') * up (HF GemmaMLP)",
        make_inputs=_inputs, shape_of=_gate_shape, **sizes("tokens", "intermediate"),
        grad_inputs=("gate", "up"), category="activation", min_bytes=_glu_bytes, under_compile="inductor",
        peers={"liger": liger("liger_geglu", "gate", "up")},  # Liger's geglu is the tanh GELU
        cases=(Case("approximate=tanh", options={"approximate": "tanh"}), _INPLACE), bench_notes=_NOTES,
        leading_dims=("gate", "up"), host_bound_elements=HOST_BOUND_GLU,
    ),
    # The patched MLP's down projection of the product: matmul-bound; eager / Liger keep the (tokens, intermediate)
    # product for the backward, Tigon recomputes it (the peak memory shows it).
    OpSpec(
        name="glu_linear",
        summary="down_proj(act(gate) * up) without keeping the product for the backward",
        fn=glu_linear, reference=ref.glu_linear, original=ref.glu_linear,
        original_name="down_proj(act(gate) * up) (HF LlamaMLP / GemmaMLP)",
        make_inputs=_linear_inputs,
        shape_of=lambda m: {"tokens": m.tokens, "intermediate": m.intermediate, "hidden": m.hidden,
                            "activation": m.activation},
        **sizes("tokens", "intermediate", "hidden"),
        grad_inputs=("gate", "up", "weight"), category="activation",
        # under torch.compile Inductor's partitioner already recomputes the product for the backward
        under_compile="inductor",
        flops=lambda s, mode: (2 if mode == "fwd" else 6) * s["tokens"] * s["intermediate"] * s["hidden"],
        peers={"liger": _liger_linear},
        cases=(Case("activation=silu", options={"activation": "silu"}),
               Case("activation=gelu_tanh", options={"activation": "gelu_tanh"}),
               Case("silu, multipliers=1.5,0.5", options={"activation": "silu", "gate_multiplier": 1.5,
                                                          "down_multiplier": 0.5}),
               Case("silu, limit=2.0", options={"activation": "silu", "limit": 2.0}),  # DeepSeek-V4's shared expert
               _INPLACE),
        bench_notes=_NOTES, leading_dims=("gate", "up"),
    ),
)
