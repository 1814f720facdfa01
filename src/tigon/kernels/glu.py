"""SwiGLU and GeGLU: Triton forward and backward (GLU variants, Shazeer 2020).

``out = act(gm * gate) * up * dm`` elementwise, with ``act`` chosen by the constexpr ``ACTIVATION``: SiLU, exact
GELU (erf) or tanh-GELU, and the scalars gm, dm (the gate and down multipliers of HF FalconH1MLP; 1.0 elsewhere,
where the multiplications are exact). The backward recomputes ``act(gm * gate)`` and its derivative from gate
instead of storing an activation, and writes both input gradients in one pass:

    d_gate = dy * up * dm * act'(gm * gate) * gm        d_up = dy * act(gm * gate) * dm

The tanh-GELU is written through the logistic function, ``0.5 * (1 + tanh(u)) = sigmoid(2u)`` and
``1 - tanh(u)^2 = 4 sigmoid(2u) (1 - sigmoid(2u))``, so no tanh (libdevice) is needed.

Inputs are viewed as rows (M, N) with unit column stride and any row stride (:mod:`tigon.kernels.elementwise`), so
a gate/up pair sliced out of one fused projection (``gate_up[..., :I]``, ``gate_up[..., I:]``) is read in place.

GPT-OSS's clamped SwiGLU (``ACTIVATION`` 3; transformers ``modeling_gpt_oss.py`` ``GptOssExperts._apply_gate``) on
its fused projection's interleaved columns (gate ``gate_up[..., 0::2]``, up ``gate_up[..., 1::2]``: ``COL`` = 2, the
column stride of gate, up and their gradients):

    g = min(gate, limit)    u = clamp(up, -limit, limit)    out = (u + 1) * g * sigmoid(alpha * g)
    d_gate = dy * (u + 1) * (s + alpha * g * s * (1 - s)) * [gate <= limit]    (s = sigmoid(alpha * g))
    d_up = dy * g * s * [-limit <= up <= limit]

(the clamps' gradients as torch's: 1 inside the closed interval, 0 outside).

DeepSeek-V4's clamped SwiGLU (``CLAMP``; transformers ``modeling_deepseek_v4.py``, ``DeepseekV4MLP.forward`` and
``DeepseekV4Experts._apply_gate``) clamps gate and up the same way, with no alpha and no ``+ 1`` on up, on any
activation code (only SiLU is exposed, by :func:`tigon.functional.swiglu`'s ``limit``):

    g = min(gate, limit)    u = clamp(up, -limit, limit)    out = act(gm * g) * u * dm
    d_gate = dy * u * dm * act'(gm * g) * gm * [gate <= limit]    d_up = dy * act(gm * g) * dm * [-limit <= up <= limit]

Both clamps are :func:`_clamp_gate_up`'s (NaN passes through, as in torch.clamp, and gets gradient 0); ``limit`` is
the launcher's fp32 scalar, which the op rounds to the input dtype first, as torch.clamp rounds its scalar bound.

``GATED=False`` drops up (u = 1): the kernels then compute a lone activation ``act(gm * gate) * dm`` and its gradient,
for the non-gated MLP's :mod:`tigon.kernels.act_linear` (activations relu2, relu and quick_gelu serve it).

Minimal bytes (bf16, n elements): forward 3*n*2 (read gate, up; write out); backward 5*n*2 (read dy, gate,
up; write d_gate, d_up).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
import triton
import triton.language as tl

from ._common import CUSTOM_OP_TAGS, launch_mode, launcher
from .first_order import first_order, once_differentiable
from .elementwise import TILE_ELEMS, _launch_shape, as_2d, launch_shape, tile

ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "clamped_silu": 3, "relu2": 4, "relu": 5, "quick_gelu": 6}
"""Activation name -> the kernels' ``ACTIVATION`` code. 4-6 serve the non-gated MLP (``GATED=False``,
:mod:`tigon.kernels.act_linear`): relu2 (``relu(g)^2``, Primer), relu, and quick_gelu (CLIP's ``g * sigmoid(1.702 g)``:
the clamped SiLU's alpha form, alpha = 1.702 passed by the launcher, without its clamps)."""

# Constants are written as literals inside the kernels (globals would have to be constexpr, whose arithmetic
# with tensors the interpreter mishandles): 0.7071067811865476 = 1/sqrt(2), 0.3989422804014327 = 1/sqrt(2 pi);
# for tanh-GELU, 2u = g * (1.5957691216057308 + 0.07135481627260025 g^2) with 1.5957691216057308 = 2 sqrt(2/pi)
# and 0.07135481627260025 = 2 sqrt(2/pi) * 0.044715, and d(2u)/dg = 1.5957691216057308 + 0.21406444881780076 g^2.


@triton.jit
def _act(g, alpha, ACTIVATION: tl.constexpr):
    """act(g) in fp32 (``alpha``: the clamped SiLU's slope, read only by it)."""
    if ACTIVATION == 0:
        a = g * tl.sigmoid(g)
    elif ACTIVATION == 3 or ACTIVATION == 6:
        a = g * tl.sigmoid(alpha * g)
    elif ACTIVATION == 1:
        a = g * (0.5 + 0.5 * tl.erf(g * 0.7071067811865476))
    elif ACTIVATION == 4:
        r = tl.maximum(g, 0.0)
        a = r * r
    elif ACTIVATION == 5:
        a = tl.maximum(g, 0.0)
    else:  # 0.5 * (1 + tanh(u)) == sigmoid(2u), u = sqrt(2/pi) * (g + 0.044715 g^3)
        a = g * tl.sigmoid(g * (1.5957691216057308 + 0.07135481627260025 * g * g))
    return a


@triton.jit
def _act_and_grad(g, alpha, ACTIVATION: tl.constexpr):
    """(act(g), act'(g)) in fp32."""
    if ACTIVATION == 0:
        s = tl.sigmoid(g)
        a = g * s
        da = s * (1.0 + g * (1.0 - s))
    elif ACTIVATION == 3 or ACTIVATION == 6:
        s = tl.sigmoid(alpha * g)
        a = g * s
        da = s * (1.0 + alpha * g * (1.0 - s))
    elif ACTIVATION == 1:
        cdf = 0.5 + 0.5 * tl.erf(g * 0.7071067811865476)
        a = g * cdf
        da = cdf + g * 0.3989422804014327 * tl.exp(-0.5 * g * g)
    elif ACTIVATION == 4:  # relu(g)^2: 2 relu(g) (torch's square(relu(g)) backward, 0 at g = 0)
        r = tl.maximum(g, 0.0)
        a = r * r
        da = 2.0 * r
    elif ACTIVATION == 5:  # relu: 1 where g > 0 (torch's threshold backward, 0 at g = 0)
        a = tl.maximum(g, 0.0)
        da = tl.where(g > 0.0, 1.0, 0.0)
    else:  # d/dg [g * sigmoid(2u)] = s + g * 2 s (1 - s) * du/dg, du/dg = sqrt(2/pi) (1 + 3 * 0.044715 g^2)
        s = tl.sigmoid(g * (1.5957691216057308 + 0.07135481627260025 * g * g))
        a = g * s
        da = s + g * s * (1.0 - s) * (1.5957691216057308 + 0.21406444881780076 * g * g)
    return a, da


@triton.jit
def _clamp_gate_up(g, u, limit):
    """``(min(g, limit), clamp(u, -limit, limit))`` in fp32 as torch.clamp computes them (a NaN stays NaN: the
    comparisons are false for it), shared by GPT-OSS's clamped SwiGLU (ACTIVATION 3) and DeepSeek-V4's (CLAMP)."""
    g = tl.where(g > limit, limit, g)
    u = tl.where(u > limit, limit, tl.where(u < -limit, -limit, u))
    return g, u


@triton.jit
def _pair_cols(rows, M, N, BLOCK_N: tl.constexpr):
    """Columns (int64) and mask of this program's [BLOCK_M, 2 BLOCK_N] tile of interleaved (gate, up) pairs: the pairs
    of :func:`tigon.kernels.elementwise.tile`'s [BLOCK_M, BLOCK_N] tile of (M, N) outputs."""
    block = (tl.program_id(0) % tl.cdiv(N, BLOCK_N)).to(tl.int64)
    cols2 = block * (2 * BLOCK_N) + tl.arange(0, 2 * BLOCK_N)
    return cols2, (rows < M)[:, None] & (cols2 < 2 * N)[None, :]


@triton.jit
def _load_pairs(GU, rows, stride, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(gate, up) in fp32, each [BLOCK_M, BLOCK_N], from interleaved rows of ``GU`` (gate the even columns): one
    contiguous load split in registers (two stride-2 loads would each fetch every sector for half its bytes)."""
    cols2, mask2 = _pair_cols(rows, M, N, BLOCK_N)
    gu = tl.load(GU + rows[:, None] * stride + cols2[None, :], mask=mask2, other=0.0).to(tl.float32)
    return tl.split(tl.reshape(gu, [BLOCK_M, BLOCK_N, 2]))


@triton.jit
def _glu_fwd(
    GATE, UP, OUT, M, N, stride_g, stride_u, stride_o, gm, dm, alpha, limit,
    ACTIVATION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COL: tl.constexpr = 1,
    GATED: tl.constexpr = True, CLAMP: tl.constexpr = False,
):
    # alpha, limit: the clamped SiLU's (ACTIVATION 3) slope and clamp (alpha: quick_gelu's too); COL 2: gate and up
    # interleaved in GATE's rows (UP unused), else separate tensors with unit column stride. GATED False: no up
    # (u = 1, UP unused): ``act(gm * gate) * dm``, the non-gated MLP's activation. CLAMP: DeepSeek-V4's clamps of
    # gate and up at limit, before the activation (no + 1 on up).
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    # gm, dm: fp32 gate and down multipliers (Falcon-H1's; 1 otherwise)
    if COL == 2:
        g, u = _load_pairs(GATE, rows, stride_g, M, N, BLOCK_M, BLOCK_N)
    else:
        g = tl.load(GATE + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if GATED:
            u = tl.load(UP + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        else:
            u = 1.0
    if ACTIVATION == 3 or CLAMP:
        g, u = _clamp_gate_up(g, u, limit)
        if ACTIVATION == 3:
            u = u + 1.0
    out = _act(g * gm, alpha, ACTIVATION) * u * dm
    tl.store(OUT + rows[:, None] * stride_o + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _glu_bwd(
    DY, GATE, UP, DGATE, DUP, M, N, stride_dy, stride_g, stride_u, stride_dg, stride_du, gm, dm, alpha, limit,
    ACTIVATION: tl.constexpr, STORE_PRODUCT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    COL: tl.constexpr = 1, GATED: tl.constexpr = True, CLAMP: tl.constexpr = False,
):
    """d_gate, d_up; with STORE_PRODUCT also the forward's output ``act(gm * gate) * up * dm`` written over dy (each
    element read first, by the same thread), for the down projection's weight gradient (:class:`GLULinearFunction`).
    gm, dm, alpha, limit, COL: as :func:`_glu_fwd` (COL 2: the gradients interleaved in DGATE, DUP unused; the
    clamped activation runs with gm = dm = 1). GATED False: u = 1 and no d_up (UP, DUP unused): d_gate is the
    non-gated activation's gradient ``dy * act'(gm * gate) * gm * dm``, the product ``act(gm * gate) * dm``. CLAMP: as
    :func:`_glu_fwd`'s (the clamps' gradients torch's: 1 inside the closed interval, else 0)."""
    rows, cols, mask = tile(M, N, BLOCK_M, BLOCK_N)
    dy_ptrs = DY + rows[:, None] * stride_dy + cols[None, :]
    dy = tl.load(dy_ptrs, mask=mask, other=0.0).to(tl.float32)
    if COL == 2:
        g, u = _load_pairs(GATE, rows, stride_g, M, N, BLOCK_M, BLOCK_N)
    else:
        g = tl.load(GATE + rows[:, None] * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if GATED:
            u = tl.load(UP + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        else:
            u = 1.0
    if ACTIVATION == 3 or CLAMP:  # the clamps pass gradient inside their closed intervals (torch.clamp's backward)
        in_g = g <= limit
        in_u = (u >= -limit) & (u <= limit)
        g, u = _clamp_gate_up(g, u, limit)
        if ACTIVATION == 3:
            u = u + 1.0
        a, da = _act_and_grad(g * gm, alpha, ACTIVATION)
        da = tl.where(in_g, da, 0.0)
        a_up = tl.where(in_u, a, 0.0)
    else:
        a, da = _act_and_grad(g * gm, alpha, ACTIVATION)
        a_up = a
    dy = dy * dm
    if COL == 2:  # the pair joined back: one contiguous [BLOCK_M, 2 BLOCK_N] store, interleaved as gate_up is
        cols2, mask2 = _pair_cols(rows, M, N, BLOCK_N)
        d = tl.reshape(tl.join(dy * u * da * gm, dy * a_up), [BLOCK_M, 2 * BLOCK_N])
        tl.store(DGATE + rows[:, None] * stride_dg + cols2[None, :], d.to(DGATE.dtype.element_ty), mask=mask2)
    else:
        tl.store(DGATE + rows[:, None] * stride_dg + cols[None, :], (dy * u * da * gm).to(DGATE.dtype.element_ty),
                 mask=mask)
        if GATED:
            tl.store(DUP + rows[:, None] * stride_du + cols[None, :], (dy * a_up).to(DUP.dtype.element_ty),
                     mask=mask)
    if STORE_PRODUCT:
        tl.store(dy_ptrs, (a * u * dm).to(DY.dtype.element_ty), mask=mask)


def glu_forward(gate: torch.Tensor, up: torch.Tensor, activation: str, gm: float = 1.0,
                dm: float = 1.0, mode=None, limit: float | None = None) -> torch.Tensor:
    """``act(gm * gate) * up * dm`` for same-shape, same-dtype gate and up. Returns a contiguous tensor of that
    shape. ``mode``: :func:`~tigon.kernels._common.launch_mode` of gate's device where the caller asked it (None:
    asked here). ``limit``: DeepSeek-V4's clamps (``CLAMP``: gate at most limit, up within +-limit, before the
    activation), or None."""
    out = torch.empty(size=gate.shape, dtype=gate.dtype, device=gate.device)
    if out.numel() == 0:
        return out
    if gate.is_contiguous() and up.is_contiguous():  # (as_2d's all-contiguous case, inline: out is; one frame less)
        n = gate.numel()
        M, N, g2, u2, o2, sg, su, so = 1, n, gate, up, out, n, n, n
    else:
        M, N, (g2, u2, o2), (sg, su, so) = as_2d(gate=gate, up=up, out=out)
    if mode is None:
        mode = launch_mode(gate.device)  # (tile_elems' compiled_cuda and launcher(_glu_fwd), in one call)
    block_m, block_n, warps, grid = _launch_shape(M, N, TILE_ELEMS[mode.compiled])  # (launch_shape, inline)
    mode[_glu_fwd][grid](
        g2, u2, o2, M, N, sg, su, so, float(gm), float(dm), 0.0, 0.0 if limit is None else float(limit),
        ACTIVATION=ACTIVATIONS[activation], BLOCK_M=block_m, BLOCK_N=block_n, CLAMP=limit is not None,
        num_warps=warps,
    )
    return out


def glu_backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, activation: str, inplace: bool = False,
                 store_product: bool = False, gm: float = 1.0, dm: float = 1.0, mode=None,
                 limit: float | None = None):
    """Returns (d_gate, d_up) of ``act(gm * gate) * up * dm``, shaped like gate and in gate's (= up's) dtype: new
    contiguous tensors, or with ``inplace`` gate and up themselves (each element is read before it is overwritten,
    by the same program). ``store_product``: also overwrite ``dy`` (which must then be a contiguous tensor of gate's
    shape and dtype) with the forward's output, recomputed. ``mode``, ``limit``: as :func:`glu_forward`'s (an
    autograd.Function passes its forward's)."""
    if store_product and not (dy.is_contiguous() and dy.shape == gate.shape and dy.dtype == gate.dtype):
        raise ValueError("store_product needs dy contiguous with gate's shape and dtype (the product is written there)")
    if gate.numel() == 0:
        if inplace and gate.data_ptr() != up.data_ptr():
            return gate, up
        return (torch.empty(size=gate.shape, dtype=gate.dtype, device=gate.device),
                torch.empty(size=gate.shape, dtype=up.dtype, device=gate.device))
    if dy.is_contiguous() and gate.is_contiguous() and up.is_contiguous():  # (as_2d's case, inline: one frame less)
        n = dy.numel()
        M, N, dy2, g2, u2, strides = 1, n, dy, gate, up, [n, n, n]
    else:
        M, N, (dy2, g2, u2), strides = as_2d(grad_output=dy, gate=gate, up=up)
    # In place only where the 2-D views are gate's and up's own memory (not copies) and the two do not alias.
    inplace = (inplace and gate.data_ptr() != up.data_ptr()
               and g2.untyped_storage().data_ptr() == gate.untyped_storage().data_ptr()
               and u2.untyped_storage().data_ptr() == up.untyped_storage().data_ptr())
    if inplace:
        dgate, dup = gate, up
        dg2, du2, sdg, sdu = g2, u2, strides[1], strides[2]
    else:
        dgate = dg2 = torch.empty(size=gate.shape, dtype=gate.dtype, device=gate.device)
        dup = du2 = torch.empty(size=gate.shape, dtype=up.dtype, device=gate.device)
        sdg = sdu = N  # contiguous: (M, N) rows of gate's shape, read as rows of N elements (M * N = numel)
    if mode is None:
        mode = launch_mode(gate.device)  # (tile_elems' compiled_cuda and launcher(_glu_bwd), in one call)
    block_m, block_n, warps, grid = _launch_shape(M, N, TILE_ELEMS[mode.compiled])  # (launch_shape, inline)
    mode[_glu_bwd][grid](
        dy2, g2, u2, dg2, du2, M, N, *strides, sdg, sdu, float(gm), float(dm), 0.0,
        0.0 if limit is None else float(limit), ACTIVATION=ACTIVATIONS[activation], STORE_PRODUCT=store_product,
        BLOCK_M=block_m, BLOCK_N=block_n, CLAMP=limit is not None, num_warps=warps,
    )
    return dgate, dup


def _pairs_2d(gate_up: torch.Tensor) -> torch.Tensor:
    """``gate_up`` (..., 2I) as (M, 2I) rows with unit column stride (a copy only when it has none)."""
    gu = gate_up if gate_up.stride(-1) == 1 else gate_up.contiguous()
    return gu.reshape(-1, gu.shape[-1])


def clamped_swiglu_forward(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU of interleaved (..., 2I) ``gate_up``: a new contiguous (..., I) tensor in its dtype."""
    out = gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))
    if out.numel() == 0:
        return out
    gu = _pairs_2d(gate_up)
    M, N = gu.shape[0], out.shape[-1]
    block_m, block_n, warps, grid = launch_shape(M, N, gate_up.device)
    launcher(_glu_fwd)[grid](gu, gu, out, M, N, gu.stride(0), gu.stride(0), N, 1.0, 1.0, float(alpha), float(limit),
                   ACTIVATION=3, BLOCK_M=block_m, BLOCK_N=block_n, COL=2, num_warps=warps)
    return out


def clamped_swiglu_backward(dy: torch.Tensor, gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """d_gate_up: a new contiguous tensor shaped like ``gate_up``, interleaved as it is, in its dtype."""
    dgu = torch.empty(gate_up.shape, dtype=gate_up.dtype, device=gate_up.device)
    if dgu.numel() == 0:
        return dgu
    gu, d2 = _pairs_2d(gate_up), dgu.view(-1, dgu.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1]) if dy.stride(-1) == 1 else dy.contiguous().view(-1, dy.shape[-1])
    M, N = gu.shape[0], dy.shape[-1]
    block_m, block_n, warps, grid = launch_shape(M, N, gate_up.device)
    launcher(_glu_bwd)[grid](dy2, gu, gu, d2, d2, M, N, dy2.stride(0), gu.stride(0), gu.stride(0), 2 * N, 2 * N,
                   1.0, 1.0, float(alpha), float(limit), ACTIVATION=3, STORE_PRODUCT=False, BLOCK_M=block_m,
                   BLOCK_N=block_n, COL=2, num_warps=warps)
    return dgu


class ClampedSwiGLUFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(gate_up, alpha, limit)``: saves gate_up, recomputes the activation backward."""

    @staticmethod
    def forward(ctx, gate_up, alpha, limit):
        ctx.save_for_backward(gate_up)
        ctx.alpha, ctx.limit = alpha, limit
        return clamped_swiglu_forward(gate_up, alpha, limit)

    @staticmethod
    @once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dy):
        (gate_up,) = ctx.saved_tensors
        return clamped_swiglu_backward(dy, gate_up, ctx.alpha, ctx.limit), None, None


class GLUFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(gate, up, activation, inplace, gm=1.0, dm=1.0, limit=None)`` with activation in
    :data:`ACTIVATIONS`: ``act(gm * gate) * up * dm``, gate and up clamped at ``limit`` first when it is a number
    (DeepSeek-V4's, :func:`glu_forward`).

    Saves only gate and up (as given); the activation is recomputed in the backward. With ``inplace`` the
    gradients are written into gate's and up's storage (see :func:`tigon.functional.swiglu`).
    """

    @staticmethod
    def forward(ctx, gate, up, activation, inplace=False, gm=1.0, dm=1.0, limit=None):
        # gate and up saved (ctx.save_for_backward, inline); in place as detached aliases, so the gradients returned
        # (gate's and up's memory) are the only references to their tensor objects and autograd passes them on (or
        # keeps them as leaves' .grad) without copies. The launch mode is kept for the backward's launch.
        ctx.to_save = (gate.detach(), up.detach()) if inplace else (gate, up)
        ctx.activation, ctx.inplace, ctx.consumed = activation, inplace, False
        ctx.gm, ctx.dm, ctx.limit = gm, dm, limit
        ctx.mode = mode = launch_mode(gate.device)
        return glu_forward(gate, up, activation, gm, dm, mode, limit)

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(GLUFunction.backward, ctx, dy)
        if ctx.consumed:  # (_saved_gate_up, inline but for its error: one Python frame less)
            _saved_gate_up(ctx, "swiglu/geglu", True)
        ctx.consumed = ctx.inplace
        gate, up = ctx.saved_tensors
        dgate, dup = glu_backward(dy, gate, up, ctx.activation, ctx.inplace, gm=ctx.gm, dm=ctx.dm, mode=ctx.mode,
                                  limit=ctx.limit)
        return dgate, dup, None, None, None, None, None


def _saved_gate_up(ctx, name: str, writes: bool):
    """The saved tensors; raises on a second backward after an in-place one (``writes``: this backward writes)."""
    if ctx.consumed:
        raise RuntimeError(f"tigon {name}(inplace_backward=True) wrote its gradients into gate and up during the "
                           "first backward; a second backward through it is not possible (a model patched by "
                           "tigon.patch does this in its MLPs: retain_graph=True is not supported there)")
    ctx.consumed = ctx.inplace and writes
    return ctx.saved_tensors


def _in(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``t.to(dtype)``, without the call when it already has that dtype (``Tensor.to`` costs ~0.5 us of host time
    even when it returns ``t`` itself)."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def _any_autocast() -> bool:
    return True  # (a torch without torch._C._is_any_autocast_enabled: ask _autocast_on)


_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", _any_autocast)
"""Whether autocast is on for any device type (one C call; only then is :func:`_autocast_on` asked)."""


def _autocast_on(device: torch.device) -> bool:
    """Whether autocast is enabled for ``device``'s type: only then do the matmuls below need an
    ``autocast(enabled=False)`` region (entering and leaving one costs ~5 us of host time)."""
    dev = device.type
    return dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev)


class GLULinearFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(gate, up, weight, bias, activation, cd, inplace, gm=1.0, dm=1.0, limit=None)``: a
    gated MLP's ``down_proj(act(gm * gate) * up * dm)`` (gate and up clamped at ``limit`` first, as
    :class:`GLUFunction`'s) that saves gate, up and the weight but not the (tokens, I) product,
    recomputed in the backward by the pass that forms d_gate and d_up.

    Forward: ``linear(act(gm * gate) * up * dm, weight, bias)`` with the matmul in ``cd`` (gate's dtype or the
    autocast dtype). Backward: ``dy = dout @ weight`` (cuBLAS), then one elementwise pass reads dy, gate and up,
    writes d_gate and d_up (into gate's and up's memory with ``inplace``) and overwrites dy with the recomputed
    product ``act(gate) * up``, from which ``d_weight = dout.T @ product``: the product is never stored between
    forward and backward, and the backward allocates no more than the unfused one (dy). The backward's launches take
    the forward's launch mode (:func:`~tigon.kernels._common.launch_mode`, kept on the ctx); the save and the
    matmuls around the kernels are written inline here (each a Python frame less on small models' hot path).
    """

    @staticmethod
    def forward(ctx, gate, up, weight, bias, activation, cd, inplace=False, gm=1.0, dm=1.0, limit=None):
        # (saved as GLUFunction saves them, with the weight)
        ctx.to_save = (gate.detach(), up.detach(), weight) if inplace else (gate, up, weight)
        ctx.activation, ctx.inplace, ctx.consumed = activation, inplace, False
        ctx.cd, ctx.bias_dtype, ctx.gm, ctx.dm = cd, (bias.dtype if bias is not None else None), gm, dm
        ctx.limit = limit
        ctx.mode = mode = launch_mode(gate.device)
        y = glu_forward(gate, up, activation, gm, dm, mode, limit)
        if not _ANY_AUTOCAST() or not _autocast_on(gate.device):
            if y.dtype == cd and weight.dtype == cd and (bias is None or bias.dtype == cd):  # (_in's, inline)
                return torch.nn.functional.linear(y, weight, bias)
            return torch.nn.functional.linear(_in(y, cd), _in(weight, cd), _in(bias, cd))
        with torch.autocast(gate.device.type, enabled=False):
            return torch.nn.functional.linear(_in(y, cd), _in(weight, cd), _in(bias, cd))

    @staticmethod
    def backward(ctx, dout):
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(GLULinearFunction.backward, ctx, dout)
        need_g, need_u, need_w, need_b = ctx.needs_input_grad[:4]
        if ctx.consumed:  # (_saved_gate_up, inline but for its error)
            _saved_gate_up(ctx, "glu_linear", True)
        ctx.consumed = ctx.inplace and (need_g or need_u)
        gate, up, weight = ctx.saved_tensors
        d2 = dout.reshape(-1, dout.shape[-1])  # dout as (tokens, H) rows in cd
        cd = ctx.cd
        if d2.dtype != cd:
            d2 = d2.to(cd)
        # (a backward run on the caller's thread, as on CPU, sees its autocast state: the matmuls run outside it, in a
        # region entered here by hand so that the code below is one path, in this frame)
        region = torch.autocast(gate.device.type, enabled=False) if _ANY_AUTOCAST() and _autocast_on(gate.device) \
            else None
        if region is not None:
            region.__enter__()
        try:
            same = weight.dtype == cd == gate.dtype  # (no cast anywhere: _in's tests, once)
            dgate = dup = dw = None
            if need_g or need_u:
                dy = (torch.mm(d2, weight) if same else _in(torch.mm(d2, _in(weight, cd)), gate.dtype)).view(gate.shape)
                dgate, dup = glu_backward(dy, gate, up, ctx.activation, ctx.inplace, store_product=need_w, gm=ctx.gm,
                                          dm=ctx.dm, mode=ctx.mode, limit=ctx.limit)
                product = dy
            else:
                product = (glu_forward(gate, up, ctx.activation, ctx.gm, ctx.dm, ctx.mode, ctx.limit) if need_w
                           else None)
            if need_w:
                product = product.reshape(d2.shape[0], gate.shape[-1])
                dw = torch.mm(d2.t(), product) if same else _in(torch.mm(d2.t(), _in(product, cd)), weight.dtype)
        finally:
            if region is not None:
                region.__exit__(None, None, None)
        db = d2.sum(0).to(ctx.bias_dtype) if need_b else None
        return (dgate if need_g else None), (dup if need_u else None), dw, db, None, None, None, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::glu", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _glu(gate: Tensor, up: Tensor, activation: str, gm: float = 1.0, dm: float = 1.0,
         limit: Optional[float] = None) -> Tensor:
    """``act(gm * gate) * up * dm`` (gate and up clamped at ``limit`` first unless None): gate's shape and dtype,
    contiguous (activation in ``tigon.kernels.glu.ACTIVATIONS``)."""
    return glu_forward(gate, up, activation, gm, dm, limit=limit)


@_glu.register_fake
def _(gate, up, activation, gm=1.0, dm=1.0, limit=None):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("tigon::glu_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _glu_backward(dy: Tensor, gate: Tensor, up: Tensor, activation: str, gm: float = 1.0,
                  dm: float = 1.0, limit: Optional[float] = None) -> tuple[Tensor, Tensor]:
    """(d_gate, d_up): new contiguous tensors shaped like gate, in its dtype."""
    return glu_backward(dy, gate, up, activation, False, gm=gm, dm=dm, limit=limit)


@_glu_backward.register_fake
def _(dy, gate, up, activation, gm=1.0, dm=1.0, limit=None):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _glu_setup(ctx, inputs, output):
    gate, up, activation, gm, dm, limit = inputs
    ctx.save_for_backward(gate, up)
    ctx.activation, ctx.gm, ctx.dm, ctx.limit = activation, gm, dm, limit


def _glu_grad(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = _glu_backward(dy, gate, up, ctx.activation, ctx.gm, ctx.dm, ctx.limit)
    return dgate, dup, None, None, None, None


_glu.register_autograd(_glu_grad, setup_context=_glu_setup)


@torch.library.custom_op("tigon::clamped_swiglu", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _clamped_swiglu(gate_up: Tensor, alpha: float, limit: float) -> Tensor:
    """GPT-OSS's clamped SwiGLU: (..., I) contiguous, gate_up's dtype."""
    return clamped_swiglu_forward(gate_up, alpha, limit)


@_clamped_swiglu.register_fake
def _(gate_up, alpha, limit):
    return gate_up.new_empty((*gate_up.shape[:-1], gate_up.shape[-1] // 2))


@torch.library.custom_op("tigon::clamped_swiglu_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _clamped_swiglu_backward(dy: Tensor, gate_up: Tensor, alpha: float, limit: float) -> Tensor:
    """d_gate_up: contiguous, gate_up's shape and dtype."""
    return clamped_swiglu_backward(dy, gate_up, alpha, limit)


@_clamped_swiglu_backward.register_fake
def _(dy, gate_up, alpha, limit):
    return torch.empty(gate_up.shape, dtype=gate_up.dtype, device=gate_up.device)


def _clamped_setup(ctx, inputs, output):
    gate_up, alpha, limit = inputs
    ctx.save_for_backward(gate_up)
    ctx.alpha, ctx.limit = alpha, limit


def _clamped_grad(ctx, dy):
    (gate_up,) = ctx.saved_tensors
    return _clamped_swiglu_backward(dy, gate_up, ctx.alpha, ctx.limit), None, None


_clamped_swiglu.register_autograd(_clamped_grad, setup_context=_clamped_setup)


def compiled_clamped_swiglu(gate_up, alpha, limit):
    """``ClampedSwiGLUFunction.apply`` as the ``tigon::clamped_swiglu`` custom op."""
    return _clamped_swiglu(gate_up, alpha, limit)


def compiled_glu(gate, up, activation, gm=1.0, dm=1.0, limit=None):
    """``GLUFunction.apply`` as the ``tigon::glu`` custom op (no ``inplace``: a custom op does not write its inputs)."""
    return _glu(gate, up, activation, float(gm), float(dm), None if limit is None else float(limit))
