"""Tigon's public functional API.

Every function validates its arguments, asks :func:`tigon.support.select_backend` which path to take (compiled
Triton, the Triton interpreter, or the PyTorch reference in :mod:`tigon.reference`), and runs it. Both paths
share one signature and one set of semantics; the reference is the specification.

Under ``torch.compile`` every function here traces without a graph break: the backend is chosen once per trace
(:func:`tigon.support.select_backend`), and the kernels run as ``torch.library`` custom ops
(:mod:`tigon.ops._library`, see :func:`_kernel`), each one opaque node of the graph.
"""

from __future__ import annotations

import importlib
import sys
from typing import NamedTuple

import torch

from . import _checks
from .support import select_backend

# The references are plain PyTorch (cheap to import, no TRITON_INTERPRET concern), so they are imported here:
# under torch.compile _ref is then a dict lookup, which dynamo traces, where importlib.import_module is a graph break.
_REFERENCE = {name: importlib.import_module(f"tigon.reference.{name}")
              for name in ("cross_entropy", "fused_linear_cross_entropy", "glu", "layer_norm", "rms_norm", "rope")}


def _op(name: str):
    """The Triton op module ``tigon.ops.<name>``, imported on first use (so TRITON_INTERPRET can be set first).

    Trace-safe: dynamo cannot trace importlib.import_module (a graph break) but can trace an import statement and a
    dict lookup, so under torch.compile the op modules are imported by the statement below and read from sys.modules.
    """
    if torch.compiler.is_compiling():
        from .ops import _library  # noqa: F401 (imports every op module)
    mod = sys.modules.get(f"tigon.ops.{name}")
    return mod if mod is not None else importlib.import_module(f"tigon.ops.{name}")


def _ref(name: str):
    return _REFERENCE[name]


def _kernel(name: str, function: str):
    """What runs op ``name``'s Triton kernels with autograd: ``tigon.ops.<name>.<function>.apply`` (a
    torch.autograd.Function) eagerly; while torch.compile traces, ``tigon.ops._library.<name>``, which takes the same
    arguments and runs the same launchers as torch.library custom ops, so that each kernel is one opaque node of the
    graph instead of Python dynamo would trace into and break the graph on (see :mod:`tigon.ops._library`). Eager
    calls skip the custom-op dispatcher: it measured ~35 us per call forward and ~75 us forward + backward on a
    2-core CPU host (the autograd.Function: 9 / 78 us), which outside a compiled graph buys nothing.
    """
    if torch.compiler.is_compiling():
        from .ops import _library
        return getattr(_library, name)
    return getattr(_op(name), function).apply


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, offset: float = 0.0, casting_mode: str = "llama"
) -> torch.Tensor:
    """Root-mean-square layer norm over the last dimension (Zhang & Sennrich 2019; HF LlamaRMSNorm).

    ``y = x / sqrt(mean(x**2, -1) + eps) * (offset + weight)``, statistics in fp32.

    Args:
        x: (..., hidden) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        weight: (hidden,) float tensor on x's device.
        eps: variance epsilon (HF ``rms_norm_eps``).
        offset: added to weight; 1.0 gives Gemma's ``(1 + weight)``.
        casting_mode: ``"llama"`` | ``"gemma"`` | ``"none"``, see :func:`tigon.reference.rms_norm.rms_norm`.

    Returns:
        (..., hidden): dtype of x for ``"gemma"``, else the promotion of x's and weight's dtypes.

    Raises:
        TypeError: x or weight is not a floating tensor; eps or offset is not a number.
        ValueError: weight is not (hidden,), devices differ, casting_mode is unknown, eps is negative or not
            finite, or offset is not finite.
    """
    _checks.tensor("x", x, floating=True)
    _checks.tensor("weight", weight, floating=True, ndim=1)
    _checks.same_device(x=x, weight=weight)
    _checks.choice("casting_mode", casting_mode, ("llama", "gemma", "none"))
    eps, offset = _checks.number("eps", eps, minimum=0.0), _checks.number("offset", offset)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., hidden), got a 0-d tensor")
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal weight's size ({weight.shape[0]}): "
                         f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if select_backend("rms_norm", x) == "reference":
        return _ref("rms_norm").rms_norm(x, weight, eps, offset, casting_mode)
    return _kernel("rms_norm", "RMSNormFunction")(x, weight, eps, offset, casting_mode)


class LossOutput(NamedTuple):
    """Returned by the cross-entropy ops when an extra output is requested.

    loss: scalar (or (N,) for reduction="none"), float32, includes the z-loss term.
    z_loss: the z-loss part alone (``lse_square_scale * lse**2``, reduced like loss), or None.
    accuracy: fraction of non-ignored tokens whose argmax equals the target (scalar float32), or None.
    """

    loss: torch.Tensor
    z_loss: torch.Tensor | None = None
    accuracy: torch.Tensor | None = None


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding, HF rotate-half convention (RoFormer, Su et al. 2021; HF ``apply_rotary_pos_emb``).

    ``q_embed = q * cos + rotate_half(q) * sin`` (and the same for k), where ``rotate_half(x) = cat(-x2, x1)``
    of the two halves of the head dimension and cos/sin get a head axis inserted at ``unsqueeze_dim``. Math in
    fp32; one launch rotates the rows (batch, position, head) of q and k in tiles, each row gathering its
    position's cos/sin (read from memory once, then from cache by the position's other heads).

    Args:
        q: (B, Hq, T, D) for ``unsqueeze_dim=1`` (HF's layout after ``.transpose(1, 2)``) or (B, T, Hq, D) for
            ``unsqueeze_dim=2``; float32 / bfloat16 / float16 (other float dtypes run the reference); any
            strides (the transposed view of a projection is read in place); D even.
        k: the same layout and dtype as q with Hkv heads (any Hkv, e.g. GQA with Hq a multiple of Hkv).
        cos, sin: (1 or B, T, D), any float dtype; the usual HF tables ``cat(freqs, freqs)``, but any values
            are rotated exactly. Treated as constants: they receive no gradient (HF builds them under
            ``torch.no_grad``).
        unsqueeze_dim: 1 or 2, where the head axis of q and k is.

    Returns:
        (q_embed, k_embed): shapes and dtypes of q and k; strides of q and k when those are dense, else
        contiguous.

    Raises:
        TypeError: a non-floating tensor, or q and k of different dtypes.
        ValueError: wrong ranks, mismatched B / T / D between q, k, cos and sin, odd D, devices differ, or
            unsqueeze_dim not in (1, 2).
    """
    _checks.tensor("q", q, floating=True, ndim=4)
    _checks.tensor("k", k, floating=True, ndim=4)
    _checks.tensor("cos", cos, floating=True, ndim=3)
    _checks.tensor("sin", sin, floating=True, ndim=3)
    _checks.same_device(q=q, k=k, cos=cos, sin=sin)
    _checks.choice("unsqueeze_dim", unsqueeze_dim, (1, 2))
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype {q.dtype}, got {k.dtype}")
    t_axis = 2 if unsqueeze_dim == 1 else 1
    B, T, D = q.shape[0], q.shape[t_axis], q.shape[-1]
    if D == 0 or D % 2:
        raise ValueError(f"q's head dimension must be even and positive, got shape {tuple(q.shape)}")
    if k.shape[0] != B or k.shape[t_axis] != T or k.shape[-1] != D:
        raise ValueError(f"k must match q's batch, positions and head dim (unsqueeze_dim={unsqueeze_dim}), "
                         f"got q {tuple(q.shape)} and k {tuple(k.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[0] not in (1, B) or t.shape[1] != T or t.shape[2] != D:
            raise ValueError(f"{name} must have shape (1 or {B}, {T}, {D}), got {tuple(t.shape)}")
    if select_backend("rope", q) == "reference":
        return _ref("rope").rope(q, k, cos, sin, unsqueeze_dim)
    return _kernel("rope", "RoPEFunction")(q, k, cos, sin, unsqueeze_dim)


def _check_glu(gate, up) -> None:
    _checks.tensor("gate", gate, floating=True)
    _checks.tensor("up", up, floating=True)
    _checks.same_device(gate=gate, up=up)
    if up.dtype != gate.dtype:
        raise TypeError(f"up must have gate's dtype {gate.dtype}, got {up.dtype}")
    if up.shape != gate.shape:
        raise ValueError(f"up must have gate's shape {tuple(gate.shape)}, got {tuple(up.shape)}")


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, inplace_backward: bool = False) -> torch.Tensor:
    """SwiGLU: ``silu(gate) * up`` elementwise, ``silu(x) = x * sigmoid(x)`` (GLU variants, Shazeer 2020).

    The product HF LlamaMLP forms, ``act_fn(gate_proj(x)) * up_proj(x)``. Math in fp32; the backward recomputes
    ``silu(gate)`` from gate (nothing but gate and up is saved).

    Args:
        gate: (..., I) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides (a
            slice of a fused gate-up projection is read in place when its rows have unit stride).
        up: the same shape and dtype as gate.
        inplace_backward: if True the backward writes d_gate into gate's storage and d_up into up's (no new
            (..., I) buffers: saves 2 x gate's bytes at the peak of the backward). Only for gate/up that nothing
            else reads after the backward (the outputs of the MLP's projections are such); a second backward
            through the same graph then raises; ignored by the reference path. Default False: the inputs are
            never written.

    Returns:
        (..., I) tensor in gate's dtype (contiguous); gradients in the same dtype.

    Raises:
        TypeError: a non-floating tensor, or gate and up of different dtypes.
        ValueError: shapes differ, or devices differ.
    """
    _check_glu(gate, up)
    if select_backend("swiglu", gate) == "reference":
        return _ref("glu").swiglu(gate, up)
    return _kernel("glu", "GLUFunction")(gate, up, "silu", bool(inplace_backward))


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh", *,
          inplace_backward: bool = False) -> torch.Tensor:
    """GeGLU: ``gelu(gate, approximate) * up`` elementwise (GLU variants, Shazeer 2020).

    :func:`torch.nn.functional.gelu` semantics: ``approximate="tanh"`` is
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (HF ``gelu_pytorch_tanh``, Gemma), ``"none"`` is the
    exact ``x * Phi(x)``. Math in fp32; the backward recomputes the activation from gate.

    Args:
        gate: (..., I) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        up: the same shape and dtype as gate.
        inplace_backward: if True the backward writes d_gate into gate's storage and d_up into up's (no new
            (..., I) buffers: saves 2 x gate's bytes at the peak of the backward). Only for gate/up that nothing
            else reads after the backward (the outputs of the MLP's projections are such); a second backward
            through the same graph then raises; ignored by the reference path. Default False: the inputs are
            never written.
        approximate: ``"tanh"`` or ``"none"``.

    Returns:
        (..., I) tensor in gate's dtype (contiguous); gradients in the same dtype.

    Raises:
        TypeError: a non-floating tensor, or gate and up of different dtypes.
        ValueError: shapes differ, devices differ, or approximate is unknown.
    """
    _check_glu(gate, up)
    _checks.choice("approximate", approximate, ("tanh", "none"))
    if select_backend("geglu", gate) == "reference":
        return _ref("glu").geglu(gate, up, approximate)
    return _kernel("glu", "GLUFunction")(gate, up, "gelu_tanh" if approximate == "tanh" else "gelu",
                                         bool(inplace_backward))


def glu_linear(gate: torch.Tensor, up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               activation: str = "silu", inplace_backward: bool = False) -> torch.Tensor:
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
        inplace_backward: as :func:`swiglu`: d_gate and d_up are written into gate's and up's memory.

    Returns:
        (..., H) in gate's dtype, or the autocast dtype under autocast.

    Raises:
        TypeError: a non-floating tensor, gate and up of different dtypes, or (outside autocast) weight / bias of
            another dtype than gate's.
        ValueError: gate is 0-d, shapes differ (weight must be (H, I), bias (H,)), devices differ, or activation
            is unknown.

    The memory saving is eager mode's: under ``torch.compile`` this runs as ``F.linear(swiglu/geglu(gate, up),
    weight, bias)`` with the GLU as an opaque custom op, and the compiler's partitioner decides what is saved (it
    then keeps the product, as for the unfused MLP).
    """
    _check_glu(gate, up)
    _checks.choice("activation", activation, _ref("glu").GLU_ACTIVATIONS)
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
    if backend == "reference":
        return _ref("glu").glu_linear(gate, up, weight, bias, activation)
    if torch.compiler.is_compiling():
        return torch.nn.functional.linear(_kernel("glu", "GLUFunction")(gate, up, activation), weight, bias)
    return _kernel("glu", "GLULinearFunction")(gate, up, weight, bias, activation, cd, bool(inplace_backward))


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float = 1e-5
) -> torch.Tensor:
    """LayerNorm over the last dimension (Ba, Kiros & Hinton 2016), torch.nn.functional.layer_norm semantics.

    ``y = (x - mean(x, -1)) / sqrt(var(x, -1) + eps) * weight + bias`` with the biased variance; statistics
    in fp32. The weight and bias gradients are reduced deterministically (no atomics).

    Args:
        x: (..., hidden) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        weight: (hidden,) float tensor on x's device, or None (no scale).
        bias: (hidden,) float tensor on x's device, or None (no shift).
        eps: variance epsilon.

    Returns:
        (..., hidden) in x's dtype (parameters of another dtype, e.g. fp32 with bf16 x, are fine).

    Raises:
        TypeError: x, weight or bias is not a floating tensor; eps is not a number.
        ValueError: weight or bias is not (hidden,), devices differ, hidden exceeds the fused-row limit, or eps is
            negative or not finite.
    """
    _checks.tensor("x", x, floating=True)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {tuple(x.shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None:
            _checks.tensor(name, p, floating=True, ndim=1)
            if p.shape[0] != x.shape[-1]:
                raise ValueError(f"{name} must have shape ({x.shape[-1]},), got {tuple(p.shape)}")
    _checks.same_device(x=x, weight=weight, bias=bias)
    eps = _checks.number("eps", eps, minimum=0.0)
    if select_backend("layer_norm", x) == "reference":
        return _ref("layer_norm").layer_norm(x, weight, bias, eps)
    return _kernel("layer_norm", "LayerNormFunction")(x, weight, bias, eps)


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_z_loss: bool = False,
    return_accuracy: bool = False,
    inplace_backward: bool = False,
    grad_in_forward: bool = False,
):
    """Cross-entropy on (N, V) logits: torch.nn.functional.cross_entropy semantics plus LLM-training extras.

    Per non-ignored token: ``loss_i = (1-eps) * w_t * (lse - x_t) + eps/V * sum_c w_c * (lse - x_c) + z_i`` with
    ``x = softcap * tanh(logits / softcap)`` (Gemma 2) or the logits, ``lse = logsumexp(x)`` and the PaLM z-loss
    ``z_i = lse_square_scale * lse**2``; full definition in :mod:`tigon.reference.cross_entropy`. Math in fp32;
    the vocabulary is walked in blocks (online log-sum-exp), so any V works (tested to 262,144).

    Args:
        logits: (N, V) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides.
        target: (N,) integer class indices in [0, V), or ``ignore_index``.
        weight: optional (V,) class weights, torch's ``weight`` (treated as constants: no gradient).
        ignore_index: target value of tokens that are skipped (loss 0, gradient 0). The kernels never read an
            ignored token's row of logits, so NaN / inf there gives gradient 0 (torch's gives NaN for NaN rows).
        reduction: ``"mean"`` (divides by the sum of the target weights of the non-ignored tokens, as torch;
            0 for an all-ignored batch, not NaN), ``"sum"`` or ``"none"`` ((N,), 0 at ignored tokens; its
            backward applies the per-token upstream gradient).
        label_smoothing: eps in [0, 1], torch's definition (class weights applied as torch does).
        lse_square_scale: z-loss coefficient (PaLM: 1e-4); the z term is included in the returned loss.
        softcap: final-logit soft-cap (Gemma 2: 30.0), or None.
        num_items_in_batch: int or 0-d tensor; loss = summed loss / num_items_in_batch (Hugging Face
            gradient-accumulation convention; overrides "mean"/"sum", not allowed with "none").
        return_z_loss: also return the z part alone, reduced like the loss (detached, for logging).
        return_accuracy: also return the fraction of non-ignored tokens whose argmax equals the target.
        inplace_backward: if True the backward writes the gradient into the logits buffer instead of a new
            (N, V) tensor (saves that memory), as Liger-Kernel does. Only safe when nothing else needs those
            logits afterwards (no other op saved them for its backward, the caller does not read them); a second
            backward through the same graph then raises. Default False: the caller's logits are never written.
        grad_in_forward: if True and the logits need a gradient, the forward writes ``d loss / d logits`` over
            the logits right after computing each row's loss (Liger-Kernel's scheme: the logits are read once
            plus a re-read from cache, instead of once in the forward and again in the backward), and the
            backward only multiplies it by the upstream gradient (for ``loss.backward()``, where that is 1, a
            kernel reads it and writes nothing). The logits hold the gradient from the moment the forward
            returns: only for logits that nothing reads afterwards (an op that saved them for its backward raises
            there; logits without unit column stride or whose rows share memory are copied first and left as
            they were). With an upstream other than 1 the gradient is rounded to the logits' dtype twice (in the
            forward, then after the scaling): in bf16 up to about twice the error of the unfused computation;
            float16 is refused (its gradient would underflow before a loss scale is applied), as is
            reduction="none", whatever the grad mode. Needs a scalar reduction ("mean", "sum", or
            num_items_in_batch); a second backward raises; one call per logits tensor (a second call on another
            slice of the same logits bumps their shared version, and the first call's backward then raises).
            Ignored (the lazy path runs) under torch.compile (as inplace_backward), on the reference backend and
            while saved-tensor hooks are set, e.g. inside non-reentrant activation checkpointing, whose
            recomputation would otherwise overwrite logits another op of the region saved.

    Returns:
        The loss, float32 (float64 for float64 logits): 0-d, or (N,) for ``reduction="none"``. With
        ``return_z_loss`` or ``return_accuracy``: ``LossOutput(loss, z_loss, accuracy)`` (unrequested fields
        None).

    Raises:
        TypeError: logits / weight not floating, target not an integer tensor, num_items_in_batch of a wrong type.
        ValueError: shapes (logits (N, V), target (N,), weight (V,)), devices, reduction, label_smoothing not in
            [0, 1], lse_square_scale < 0, softcap <= 0, num_items_in_batch <= 0 or with reduction="none",
            grad_in_forward with reduction="none", float16 logits or (with grad enabled) leaf logits that require
            grad, and targets outside [0, V) other than ignore_index. That last check reads the targets and is
            skipped on the CUDA kernel path (it would cost a device sync); there such tokens get a NaN loss
            instead, and nothing is read out of bounds.
    """
    ref = _ref("cross_entropy")
    ref.check_inputs(logits, target, weight, reduction=reduction, label_smoothing=label_smoothing,
                     lse_square_scale=lse_square_scale, softcap=softcap, num_items_in_batch=num_items_in_batch)
    if grad_in_forward and reduction == "none":
        raise ValueError('grad_in_forward=True needs a scalar loss: reduction "mean" or "sum" (or '
                         'num_items_in_batch), got reduction="none"')
    if grad_in_forward and logits.is_leaf and logits.requires_grad and torch.is_grad_enabled():
        raise ValueError("grad_in_forward=True writes the gradient over the logits during the forward, but logits "
                         "is a leaf tensor that requires grad (a Parameter, or made with requires_grad=True), whose "
                         "values must be kept; pass logits computed by an op (e.g. the LM head's output), or use "
                         "grad_in_forward=False")
    if grad_in_forward and logits.dtype == torch.float16:
        raise ValueError("grad_in_forward=True does not take float16 logits: the gradient, rounded to float16 "
                         "before a loss scale multiplies it, would underflow; use bfloat16 / float32 logits or "
                         "inplace_backward=True")
    if select_backend("cross_entropy", logits) == "reference":
        return ref.cross_entropy(
            logits, target, weight, ignore_index, reduction, label_smoothing, lse_square_scale=lse_square_scale,
            softcap=softcap, num_items_in_batch=num_items_in_batch, return_z_loss=return_z_loss,
            return_accuracy=return_accuracy, inplace_backward=inplace_backward, grad_in_forward=grad_in_forward)
    if target.device.type == "cpu":
        ref.check_target_range(target, logits.shape[1], ignore_index)
    ops = _op("cross_entropy")
    opts = ops.LossOptions(int(ignore_index), float(label_smoothing), float(lse_square_scale),
                           None if softcap is None else float(softcap), 1.0)
    loss, z_loss, accuracy = _kernel("cross_entropy", "CrossEntropyFunction")(
        logits, target, weight, opts, reduction, num_items_in_batch, bool(return_accuracy),
        "forward" if grad_in_forward and logits.requires_grad and torch.is_grad_enabled()
        else bool(inplace_backward))
    if not (return_z_loss or return_accuracy):
        return loss
    return LossOutput(loss, z_loss if return_z_loss else None, accuracy if return_accuracy else None)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    class_weight: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_z_loss: bool = False,
    return_accuracy: bool = False,
    accum_dtype: torch.dtype | None = None,
):
    """cross_entropy(logit_scale * (hidden @ weight.T + bias), target) without materialising the logits.

    The LM-head loss of a language model, computed chunk by chunk over the tokens so that only a bounded
    (rows, V) block of logits exists at a time (Liger-Kernel's fused linear cross-entropy, Hsu et al. 2024;
    Apple's Cut Cross-Entropy, Wijmans et al. 2024). Matmuls run through torch (cuBLAS), the softmax / loss /
    gradient of each chunk in one Triton kernel with fp32 math; see :mod:`tigon.ops.fused_linear_cross_entropy`.
    For a scalar loss the gradients are computed during the forward and scaled in the backward (3 matmuls in
    all); for ``reduction="none"`` the backward recomputes the logits (4 matmuls). Under ``torch.no_grad`` or
    when nothing requires grad, only the loss is computed. Under ``torch.autocast`` the matmuls run in the
    autocast dtype and the gradients come back in the parameters' dtypes. The caller's tensors are never
    written. For mean/sum the gradients are formed once, so a second backward through the same graph raises.
    Note: for mean/sum the upstream scalar is applied after the logits gradient was rounded to the compute dtype
    (identical to the unfused computation for an upstream of 1 or a power of two, e.g. a GradScaler scale).

    Args:
        hidden: (N, H) float32 / bfloat16 / float16 final hidden states (flatten batch and sequence first).
        weight: (V, H) LM-head weight, same dtype as hidden (or any float dtype under autocast).
        target: (N,) integer class indices in [0, V), or ``ignore_index``.
        bias: optional (V,) LM-head bias.
        logit_scale: multiplies the logits before the soft-cap (Cohere's ``logit_scale``; Granite's
            ``1 / logits_scaling``).
        class_weight: optional (V,) class weights (``weight`` of :func:`cross_entropy`), no gradient.
        ignore_index, reduction, label_smoothing, lse_square_scale, softcap, num_items_in_batch,
        return_z_loss, return_accuracy: as :func:`cross_entropy`.
        accum_dtype: dtype in which grad_weight is accumulated over the token chunks. ``None`` or
            ``torch.float32`` (default): an fp32 (V, H) buffer, rounded once to the weight's dtype, so the
            gradients are as accurate as the unfused computation's (peak extra memory about 3 GiB at
            Llama-3-8B shapes: the fp32 buffer, a (H, V) logits chunk and the bf16 gradient). The weight's own
            dtype (e.g. ``torch.bfloat16``; Liger-Kernel's default): no fp32 buffer, and logits chunks of
            max(64 MiB, the hidden states' size), so the peak extra memory is about the gradients themselves
            (1.10 GiB there at 8192 tokens), but grad_weight is rounded once per chunk: an approximation, off by
            default. Its error grows with the number of chunks and with how many chunks touch the same vocabulary
            rows: measured 1.08x the unfused bf16 computation's error on uniformly random labels at Llama-3-8B
            shapes (32 chunks, H200; benchmarks/results/h200/flce_h200.json), 4.2x in a CPU simulation where every
            chunk hits every row (benchmarks/results/cpu/lean_accum_sim.txt).

    Returns:
        As :func:`cross_entropy`: the float32 loss (0-d, or (N,) for "none"), or ``LossOutput``. Gradients for
        hidden / weight / bias have their dtypes and shapes.

    Raises:
        TypeError, ValueError: as :func:`cross_entropy`, for hidden (N, H), weight (V, H), target (N,), bias and
            class_weight (V,), and logit_scale (finite, non-zero); ValueError for an ``accum_dtype`` other than
            None, torch.float32 or the weight's dtype.
    """
    ref = _ref("fused_linear_cross_entropy")
    ref.check_inputs(hidden, weight, target, bias, class_weight, logit_scale=logit_scale, reduction=reduction,
                     label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap,
                     num_items_in_batch=num_items_in_batch)
    if accum_dtype not in (None, torch.float32, weight.dtype):
        raise ValueError(f"accum_dtype must be None, torch.float32 or the weight's dtype ({weight.dtype}), "
                         f"got {accum_dtype!r}")
    dev_type = hidden.device.type
    if torch.is_autocast_enabled(dev_type):
        cd = torch.get_autocast_dtype(dev_type)
    else:
        cd = torch.promote_types(hidden.dtype, weight.dtype)
    backend = select_backend("fused_linear_cross_entropy", hidden)
    if backend == "reference" or cd not in (torch.float32, torch.bfloat16, torch.float16):
        return ref.fused_linear_cross_entropy(
            hidden, weight, target, bias, ignore_index=ignore_index, reduction=reduction,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap,
            logit_scale=logit_scale, class_weight=class_weight, num_items_in_batch=num_items_in_batch,
            return_z_loss=return_z_loss, return_accuracy=return_accuracy)
    if target.device.type == "cpu":
        _ref("cross_entropy").check_target_range(target, weight.shape[0], ignore_index)
    opts = _op("cross_entropy").LossOptions(int(ignore_index), float(label_smoothing), float(lse_square_scale),
                                            None if softcap is None else float(softcap), float(logit_scale))
    grad_on = torch.is_grad_enabled()
    need = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
            grad_on and bias is not None and bias.requires_grad)
    loss, z_loss, accuracy = _kernel("fused_linear_cross_entropy", "FusedLinearCrossEntropyFunction")(
        hidden, weight, target, bias, class_weight, opts, reduction, num_items_in_batch, cd, need,
        bool(return_accuracy), accum_dtype not in (None, torch.float32))
    if not (return_z_loss or return_accuracy):
        return loss
    return LossOutput(loss, z_loss if return_z_loss else None, accuracy if return_accuracy else None)
