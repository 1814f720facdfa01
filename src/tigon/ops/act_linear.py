"""The non-gated MLP's down projection of its activation, ``linear(act(h), weight, bias)``, without keeping ``act(h)``
for the backward: the public op and its record.

Kernels: :mod:`tigon.kernels.act_linear` (the GLU kernels of :mod:`tigon.kernels.glu` without their up operand).
Specification: :mod:`tigon.reference.act_linear`.
"""

from __future__ import annotations

import math

import torch

from .. import _checks
from ..reference import act_linear as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn, sizes
from .glu import HOST_BOUND_GLU, _writable
from .glu import RECORDS as _GLU_RECORDS


def act_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, activation: str = "gelu",
               inplace_backward: bool = False) -> torch.Tensor:
    """A non-gated MLP's down projection of its activation, ``linear(act(h), weight, bias)``, without keeping the
    (..., I) activation for the backward.

    HF's non-gated MLPs compute ``down(act(up(x)))`` (GPT-NeoX / Pythia, phi, Falcon, Nemotron's relu2, the CLIP /
    SigLIP vision towers); autograd then saves h = up(x) (for the activation's backward) *and* a = act(h) (the down
    projection's input, for its weight gradient): two (tokens, I) tensors per layer. This saves h (and the weight)
    only. The backward forms ``dy = dout @ weight``, and one elementwise pass reads dy and h, writes d_h and, over dy,
    the recomputed ``act(h)``, from which ``d_weight = dout.T @ act(h)`` and ``d_bias = dout.sum``: tokens x I x
    (element size) bytes less activation memory per MLP (Pythia-6.9B, I = 16384: 256 MiB per layer at 8192 tokens
    in bf16; phi-2, I = 10240: 160 MiB) for one extra (tokens, I) write in the backward. The activation runs in fp32
    in registers and is rounded once (as torch's own GELU / SiLU on bf16; HF's tanh-GELU written out in torch ops,
    ``gelu_new``, rounds several times).

    Args:
        h: (..., I) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides. The up
            projection's output.
        weight: (H, I) float tensor (``nn.Linear`` layout), on h's device; under autocast it may be fp32 (cast to the
            autocast dtype as ``F.linear`` does).
        bias: (H,) or None.
        activation: ``"gelu"`` (exact, ``x * Phi(x)``; Hendrycks & Gimpel 2016, "Gaussian Error Linear Units"),
            ``"gelu_tanh"`` (the tanh approximation: HF ``gelu_new``, ``gelu_fast``, ``gelu_pytorch_tanh``),
            ``"relu2"`` (``relu(x)^2``; So et al. 2021, "Primer"; HF ``ReLUSquaredActivation``, Nemotron), ``"relu"``,
            ``"silu"``, or ``"quick_gelu"`` (``x * sigmoid(1.702 x)``, HF ``QuickGELUActivation``: CLIP, Qwen2-VL's
            vision tower).
        inplace_backward: if True the backward writes d_h into h's memory (no new (..., I) buffer: h's bytes less at
            the backward's peak). Only for an h that nothing else reads after the backward (the up projection's
            output is such); a second backward through the same graph then raises; ignored by the reference path,
            and where h has elements that share memory (an expanded tensor: a new buffer then). Default False: h is
            never written.

    Returns:
        (..., H) in h's dtype, or the autocast dtype under autocast; gradients in their inputs' dtypes.

    Raises:
        TypeError: a non-floating tensor, or (outside autocast) weight / bias of another dtype than h's;
            inplace_backward not a bool.
        ValueError: h is 0-d, weight is not (H, I) or bias not (H,), devices differ, or activation is unknown.

    The memory saving is eager mode's: under ``torch.compile`` (any compile mode) this is ``F.linear(act(h), weight,
    bias)`` traced, the activation left to Inductor (fused into its neighbours), and the compiler's partitioner
    decides what is saved.
    """
    _checks.tensor("h", h, floating=True)
    _checks.choice("activation", activation, ref.ACTIVATIONS)
    _checks.tensor("weight", weight, floating=True, ndim=2)
    if h.dim() == 0:
        raise ValueError("h must have at least one dimension (..., I), got a 0-d tensor")
    if weight.shape[1] != h.shape[-1]:
        raise ValueError(f"weight must have shape (H, {h.shape[-1]}) for h of shape {tuple(h.shape)}, got "
                         f"{tuple(weight.shape)}")
    if bias is not None and (_checks.tensor("bias", bias, floating=True, ndim=1).shape[0] != weight.shape[0]):
        raise ValueError(f"bias must have shape ({weight.shape[0]},) (weight's rows), got {tuple(bias.shape)}")
    _checks.same_device(h=h, weight=weight, bias=bias)
    _checks.flag("inplace_backward", inplace_backward)  # (bool() took 1 and "False" for True: d_h written over h)
    dev = h.device.type
    autocast = dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev)  # (meta, ...: no autocast to ask about)
    mixed = [t.dtype for t in (weight, bias) if t is not None and t.dtype != h.dtype]
    if mixed and not autocast:
        raise TypeError(f"weight and bias must have h's dtype {h.dtype} outside autocast, got {mixed[0]}")
    if select_backend("act_linear", h) in TORCH_CODE or torch.compiler.is_compiling():
        return ref.act_linear(h, weight, bias, activation)
    from ..kernels import act_linear as k
    from ..kernels._common import fast_apply

    cd = torch.get_autocast_dtype(dev) if autocast else h.dtype
    return fast_apply(k.ActLinearFunction)(h, weight, bias, activation, cd, _writable(inplace_backward, h))


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """h (tokens, intermediate) with std 3 (the activations' tails and relu's zeros), the down projection's weight
    (hidden, intermediate) with std 1/sqrt(intermediate) and its bias (the non-gated MLPs' Linear layers have one)."""
    return dict(h=randn(gen, (s["tokens"], s["intermediate"]), dtype, device, 3.0),
                weight=randn(gen, (s["hidden"], s["intermediate"]), dtype, device, 1.0 / math.sqrt(s["intermediate"])),
                bias=randn(gen, (s["hidden"],), dtype, device))


_GLU_LINEAR = next(r for r in _GLU_RECORDS if r.name == "glu_linear")
"""glu_linear's record: the same slice of a model's sizes (tokens, intermediate, hidden) and the same matmuls (the
down projection: 2 T I H forward, 6 T I H forward + backward), so its ``shape_of`` and ``flops`` are this op's."""

def _down_shape(m) -> dict:
    """glu_linear's sizes (tokens, intermediate, hidden), without the gated MLP's activation it also carries."""
    return {k: v for k, v in _GLU_LINEAR.shape_of(m).items() if k != "activation"}


_INPLACE = Case("gelu, inplace_backward=True", options={"activation": "gelu", "inplace_backward": True},
                tags=frozenset({"bench"}), provider="tigon_inplace")

RECORDS = (OpSpec(
    name="act_linear",
    summary="down_proj(act(h)) of a non-gated MLP without keeping act(h) for the backward",
    fn=act_linear, reference=ref.act_linear, original=ref.act_linear,
    original_name="fc2(act(fc1 output)) (HF GPTNeoXMLP / PhiMLP / NemotronMLP / CLIPMLP)",
    make_inputs=_inputs, shape_of=_down_shape, **sizes("tokens", "intermediate", "hidden"),
    grad_inputs=("h", "weight", "bias"), category="activation",
    # under torch.compile: F.linear(act(h)) traced, the activation fused by Inductor (no kernel of Tigon's there)
    under_compile="inductor", custom_op=False,  # (no custom op: its reference is traced)
    flops=_GLU_LINEAR.flops,
    cases=tuple(Case(f"activation={a}", options={"activation": a}) for a in ref.ACTIVATIONS) + (_INPLACE,),
    bench_notes={"tigon_inplace": "inplace_backward=True: the backward writes the gradient of h into its memory (as "
                                  "in a model, where h is the up projection's output); repeated calls run on "
                                  "overwritten inputs (same work, other values)"},
    leading_dims=("h",),
    # the GLUs' threshold (a patched MLP's host cost is theirs: one autograd.Function, one launch each way); not
    # measured for this op on its own
    host_bound_elements=HOST_BOUND_GLU,
),)
