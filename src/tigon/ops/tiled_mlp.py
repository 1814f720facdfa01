"""The gated MLP computed over token tiles (DeepSpeed's TiledMLP, Liger-Kernel's ``apply_tiled_mlp``): the public
op and its record.

The forward runs ``down_proj(act(gate_proj(x)) * up_proj(x))`` one tile of tokens at a time and keeps only x; the
backward recomputes each tile's gate and up and accumulates the weight gradients in place, so the (tokens, I)
activations exist for one tile at a time. Inside a tile the GLU runs on :mod:`tigon.kernels.glu`'s kernels (the
backward's single pass writes d_gate and d_up over gate and up and the product over d_product).

Specification: :func:`tigon.reference.glu.gated_mlp` (tiling changes no value).
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch

from .. import _checks
from ..kernels.first_order import once_differentiable
from ..reference import glu as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn, sizes


def default_shards(x: torch.Tensor) -> int:
    """Liger-Kernel's default tile count: ``ceil(seq / hidden)``, ``seq = x.shape[-2]`` (1 for a 1-D x), at least 1."""
    seq = x.shape[-2] if x.dim() >= 2 else 1
    return max(1, math.ceil(seq / x.shape[-1])) if x.shape[-1] else 1


def tiled_mlp(x: torch.Tensor, gate_weight: torch.Tensor, up_weight: torch.Tensor, down_weight: torch.Tensor,
              activation: str = "silu", num_shards: int | None = None, *,
              accum_dtype: torch.dtype | None = None) -> torch.Tensor:
    """A bias-free gated MLP, ``down_proj(act(gate_proj(x)) * up_proj(x))`` (HF LlamaMLP / GemmaMLP; GLU variants,
    Shazeer 2020), over ``num_shards`` tiles of tokens (DeepSpeed TiledMLP; Liger-Kernel ``apply_tiled_mlp`` /
    ``LigerTiledSwiGLUMLP``), recomputed in the backward.

    Memory: besides x (saved) the forward holds one tile's gate, up and product; the backward one tile's gate, up and
    d_product (d_gate, d_up and the product are written over them), plus the gradients: dx (x's shape) and the three
    weight gradients in the weights' dtype, accumulated tile by tile in place (``addmm_``: one rounding per tile, no
    per-tile weight-gradient buffer). Costs one more forward's gate and up projections (the recompute).

    Liger's ``apply_tiled_mlp(fn, mlp_module, x, num_shards)`` takes the module and its forward; this takes the
    weights (a registry op: the module forms are :class:`tigon.nn.TiledSwiGLUMLP` / :class:`tigon.nn.TiledGEGLUMLP`).
    Tiles are ``ceil(tokens / num_shards)`` rows of the flattened (tokens, H) input (``torch.chunk``: the last one
    shorter, fewer tiles when tokens < num_shards), the same token count per tile as Liger's.

    Under ``torch.compile`` this runs untiled (:func:`tigon.functional.glu_linear` on the projections; the
    compiler's partitioner decides what is saved): the same values, no tiling memory saving.

    Args:
        x: (..., H) float32 / bfloat16 / float16; any strides (copied to contiguous when not). Other float dtypes,
            and the reference backend (``TIGON_DISABLE``, no Triton), run the untiled reference.
        gate_weight, up_weight: (I, H) (``nn.Linear`` layout), x's dtype and device (under autocast, any float dtype:
            all four are cast to the autocast dtype, as ``F.linear`` does).
        down_weight: (H, I).
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh GELU, HF
            ``gelu_pytorch_tanh``).
        num_shards: tile count, an int >= 1; None: Liger's default ``ceil(seq / H)``, seq = ``x.shape[-2]``.
        accum_dtype: the weight gradients' accumulator across tiles. None (default): the weights' dtype, ``addmm_``
            in place (one rounding per tile; Liger rounds twice per tile, its per-tile gradient then ``.grad +=``),
            no extra memory. ``torch.float32``: each tile's product (rounded once, relative to the tile) is added
            into fp32 accumulators, cast once at the end: a bf16 / fp16 MLP's weight gradients as accurate as the
            untiled MLP's, for 2 x the weights' bytes of accumulators (fp32 weights: no difference).

    Returns:
        (..., H) in x's dtype (the autocast dtype under autocast), contiguous; gradients in their inputs' dtypes.

    Raises:
        TypeError: a non-floating tensor, dtypes differ outside autocast, or num_shards not an int.
        ValueError: x is 0-d, shapes disagree, devices differ, unknown activation, num_shards < 1, or accum_dtype
            neither None, float32 nor the weights' dtype.
    """
    _checks.tensor("x", x, floating=True)
    for name, w in (("gate_weight", gate_weight), ("up_weight", up_weight), ("down_weight", down_weight)):
        _checks.tensor(name, w, floating=True, ndim=2)
    _checks.choice("activation", activation, ref.GLU_ACTIVATIONS)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., H), got a 0-d tensor")
    hidden, inter = x.shape[-1], gate_weight.shape[0]
    for name, w, want in (("gate_weight", gate_weight, (inter, hidden)), ("up_weight", up_weight, (inter, hidden)),
                          ("down_weight", down_weight, (hidden, inter))):
        if tuple(w.shape) != want:
            raise ValueError(f"{name} must have shape {want} for x (..., {hidden}), got {tuple(w.shape)}")
    num_shards = default_shards(x) if num_shards is None else _checks.size("num_shards", num_shards)
    _checks.same_device(x=x, gate_weight=gate_weight, up_weight=up_weight, down_weight=down_weight)
    dev = x.device.type
    if dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev):
        cd = torch.get_autocast_dtype(dev)
        x, gate_weight, up_weight, down_weight = (t.to(cd) for t in (x, gate_weight, up_weight, down_weight))
    elif any(w.dtype != x.dtype for w in (gate_weight, up_weight, down_weight)):
        raise TypeError(f"gate_weight, up_weight and down_weight must have x's dtype {x.dtype} outside autocast, "
                        f"got {gate_weight.dtype}, {up_weight.dtype}, {down_weight.dtype}")
    if accum_dtype not in (None, torch.float32) and accum_dtype != gate_weight.dtype:
        raise ValueError(f"accum_dtype must be None, torch.float32 or the weights' dtype, got {accum_dtype!r}")
    if select_backend("tiled_mlp", x) in TORCH_CODE:
        return ref.gated_mlp(x, gate_weight, up_weight, down_weight, activation)
    if torch.compiler.is_compiling():
        from .glu import glu_linear

        lin = torch.nn.functional.linear
        return glu_linear(lin(x, gate_weight), lin(x, up_weight), down_weight, activation=activation)
    x2 = x.reshape(-1, hidden)
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    rows = max(1, math.ceil(x2.shape[0] / num_shards))
    with torch.autocast(dev, enabled=False) if dev in ("cpu", "cuda") else contextlib.nullcontext():
        out = _TiledMLP.apply(x2, gate_weight, up_weight, down_weight, activation, rows,
                               accum_dtype or gate_weight.dtype)
    return out.view(*x.shape[:-1], hidden)


class _TiledMLP(torch.autograd.Function):
    """``apply(x2, wg, wu, wd, activation, rows)``: x2 (T, H) contiguous; tiles of ``rows`` tokens. Per tile the
    backward forms d_product = dy @ wd, and :func:`tigon.kernels.glu.glu_backward`'s one pass writes d_gate over
    gate, d_up over up and the product over d_product (three (rows, I) buffers at its peak)."""

    @staticmethod
    def forward(ctx, x2, wg, wu, wd, activation, rows, accum):
        from ..kernels import glu as k

        ctx.save_for_backward(x2, wg, wu, wd)
        ctx.activation, ctx.rows, ctx.accum = activation, rows, accum
        out = x2.new_empty(x2.shape[0], wd.shape[0])
        for s in range(0, x2.shape[0], rows):
            xt = x2[s:s + rows]
            h = k.glu_forward(xt @ wg.t(), xt @ wu.t(), activation)
            torch.matmul(h, wd.t(), out=out[s:s + rows])
            del h  # freed before the next tile's gate and up are formed
        return out

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dout):
        from ..kernels import glu as k

        x2, wg, wu, wd = ctx.saved_tensors
        nx, ng, nu, nd = ctx.needs_input_grad[:4]
        dout = dout.contiguous()
        dx = torch.empty_like(x2) if nx else None
        dwg, dwu, dwd = (torch.zeros_like(w, dtype=ctx.accum) if need else None
                         for w, need in ((wg, ng), (wu, nu), (wd, nd)))

        def acc(buf, a, b):  # buf += a @ b: in place in the weights' dtype, else the product added into fp32
            buf.addmm_(a, b) if buf.dtype == a.dtype else buf.add_(a @ b)

        for s in range(0, x2.shape[0], ctx.rows):
            xt, dyt = x2[s:s + ctx.rows], dout[s:s + ctx.rows]
            h = dyt @ wd  # d_product, then (after the pass) the product
            dg, du = k.glu_backward(h, xt @ wg.t(), xt @ wu.t(), ctx.activation, inplace=True, store_product=True)
            if nd:
                acc(dwd, dyt.t(), h)
            del h
            if ng:
                acc(dwg, dg.t(), xt)
            if nu:
                acc(dwu, du.t(), xt)
            if nx:
                torch.mm(dg, wg, out=dx[s:s + ctx.rows]).addmm_(du, wu)
            del dg, du  # freed before the next tile's d_product is formed
        dwg, dwu, dwd = (g if g is None or g.dtype == w.dtype else g.to(w.dtype)
                         for g, w in ((dwg, wg), (dwu, wu), (dwd, wd)))
        return dx, dwg, dwu, dwd, None, None, None


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, hidden); the weights with std 1/sqrt(fan-in) (nn.Linear's scale: unit-scale activations)."""
    h, i = s["hidden"], s["intermediate"]
    return dict(x=randn(gen, (s["tokens"], h), dtype, device),
                gate_weight=randn(gen, (i, h), dtype, device, 1.0 / math.sqrt(h)),
                up_weight=randn(gen, (i, h), dtype, device, 1.0 / math.sqrt(h)),
                down_weight=randn(gen, (h, i), dtype, device, 1.0 / math.sqrt(i)))


_LIGER_ACT = {"silu": "LigerSiLUMulFunction", "gelu_tanh": "LigerGELUMulFunction"}


class _TakeGrads(torch.autograd.Function):
    """Identity on x whose backward (run after Liger's, which fills the weights' ``.grad``) returns those ``.grad`` as
    the weights' gradients: Liger's tiled MLP under ``torch.autograd.grad``, with its own memory behaviour."""

    @staticmethod
    def forward(ctx, x, *weights):
        ctx.weights = weights
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dx):
        grads = []
        for w in ctx.weights:
            grads.append(w.grad)
            w.grad = None
        return (dx, *grads)


def _liger(x, gate_weight, up_weight, down_weight, activation="silu", num_shards=None):
    """Liger-Kernel's ``apply_tiled_mlp`` with its SwiGLU / GeGLU product (the body of LigerTiledSwiGLUMLP)."""
    import liger_kernel.ops as LO

    act = getattr(LO, _LIGER_ACT[activation])
    lin = torch.nn.functional.linear
    ws = [w if w.requires_grad else w.detach() for w in (gate_weight, up_weight, down_weight)]

    def fn(_, xt):
        return lin(act.apply(lin(xt, ws[0]), lin(xt, ws[1])), ws[2])

    xin = _TakeGrads.apply(x, *ws) if torch.is_grad_enabled() and any(w.requires_grad for w in ws) else x
    return LO.apply_tiled_mlp(fn, None, xin, num_shards)


_SHARDS = Case("num_shards=4", options={"num_shards": 4})

RECORDS = (OpSpec(
    name="tiled_mlp",
    summary="the gated MLP over token tiles, recomputed in the backward (caps activation memory)",
    fn=tiled_mlp, reference=ref.gated_mlp, original=ref.gated_mlp,
    original_name="down_proj(silu(gate_proj(x)) * up_proj(x)) (HF LlamaMLP, untiled)",
    make_inputs=_inputs,
    shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden, "intermediate": m.intermediate},
    **sizes("tokens", "hidden", "intermediate"),
    grad_inputs=("x", "gate_weight", "up_weight", "down_weight"), category="activation",
    # the MLP's three matmuls; the backward's recompute of gate and up is not counted (useful work only)
    flops=lambda s, mode: (6 if mode == "fwd" else 18) * s["tokens"] * s["intermediate"] * s["hidden"],
    under_compile="inductor",
    peers={"liger": functools.partial(_liger, **_SHARDS.options)},  # bench calls peers without the case options
    cases=(_SHARDS, Case("num_shards=3, gelu_tanh", options={"num_shards": 3, "activation": "gelu_tanh"})),
    leading_dims=("x",),
),)
