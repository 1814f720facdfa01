"""A linear layer with a LoRA adapter (Hu et al. 2021) as one autograd node: the public op and its record.

Kernels: :mod:`tigon.kernels.lora` (cuBLAS matmuls with in-place accumulation, no Triton). Specification:
:mod:`tigon.reference.lora`.
"""

from __future__ import annotations

import math

import torch

from ..reference import lora as ref
from ..support import TORCH_CODE, select_backend
from ._record import OpSpec, randn


def lora_linear(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                bias: torch.Tensor | None = None, *, scaling: float = 1.0) -> torch.Tensor:
    """``linear(x, weight, bias) + scaling * linear(linear(x, lora_a), lora_b)`` as one autograd node.

    The forward of PEFT's ``lora.Linear`` with one active adapter, no dropout and no DoRA (LoRA, Hu et al. 2021):
    ``base_layer(x) + lora_B(lora_A(x)) * scaling``. The base output and the low-rank product are formed in one
    (..., N) buffer (``addmm_``), and the backward accumulates ``dx = dy W + s (dy B) A`` in one (..., K) buffer;
    only x and the (..., r) ``x A^T`` are kept for the backward. A base weight that does not require grad (PEFT
    freezes it) gets no gradient and costs no matmul; one that does gets ``dy^T x``. See
    :mod:`tigon.kernels.lora` for the passes saved. Under ``torch.compile`` this runs the reference (plain matmuls
    that Inductor schedules itself).

    Args:
        x: (..., K) float32 / bfloat16 / float16 (other float dtypes run the reference).
        weight: (N, K) base weight (``nn.Linear`` layout), x's dtype outside autocast.
        lora_a: (r, K) adapter A; lora_b: (N, r) adapter B; both x's dtype outside autocast.
        bias: (N,) or None.
        scaling: s, PEFT's ``scaling[adapter]`` (``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with rsLoRA).

    Returns:
        (..., N) in x's dtype (the autocast dtype under autocast, where the matmuls run in that dtype as
        ``F.linear`` does); gradients in each input's dtype.

    Raises:
        TypeError: a non-floating tensor, scaling not a real number, or (outside autocast) weight, lora_a, lora_b
            or bias of another dtype than x's.
        ValueError: shapes that do not fit (the message names the argument), tensors on different devices, or a
            scaling that is not finite.
    """
    s = ref.check_inputs(x, weight, lora_a, lora_b, bias, scaling)
    dev = x.device.type
    autocast = dev in ("cpu", "cuda") and torch.is_autocast_enabled(dev)  # (meta, ...: no autocast to ask about)
    if not autocast:
        for name, t in (("weight", weight), ("lora_a", lora_a), ("lora_b", lora_b), ("bias", bias)):
            if t is not None and t.dtype != x.dtype:
                raise TypeError(f"{name} must have x's dtype {x.dtype} outside autocast, got {t.dtype}")
    if select_backend("lora_linear", x) in TORCH_CODE or torch.compiler.is_compiling():
        return ref.lora_linear(x, weight, lora_a, lora_b, bias, scaling=s)
    from ..kernels import lora as k

    cd = torch.get_autocast_dtype(dev) if autocast else x.dtype
    return k.with_leading_dims(k.LoRALinearFunction.apply(x, weight, lora_a, lora_b, bias, s, cd), x)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """x (tokens, in), a base weight (out, in) and A (rank, in) with std 1/sqrt(in), B (out, rank) with std
    1/sqrt(rank) (a trained adapter: PEFT starts B at zero, where the low-rank path would test nothing), s = 2."""
    k, n, r = s["in_features"], s["out_features"], s["rank"]
    return dict(x=randn(gen, (s["tokens"], k), dtype, device),
                weight=randn(gen, (n, k), dtype, device, 1.0 / math.sqrt(k)),
                lora_a=randn(gen, (r, k), dtype, device, 1.0 / math.sqrt(k)),
                lora_b=randn(gen, (n, r), dtype, device, 1.0 / math.sqrt(r)),
                scaling=2.0)


def _flops(s: dict, mode: str) -> float:
    """Forward: x W^T and the two low-rank products; backward (base weight frozen): dy W, the two low-rank products
    of dx, and dA, dB."""
    base = 2 * s["tokens"] * s["in_features"] * s["out_features"]
    low = 2 * s["tokens"] * s["rank"] * (s["in_features"] + s["out_features"])
    return base + low if mode == "fwd" else 2 * base + 3 * low


RECORDS = (OpSpec(
    name="lora_linear",
    summary="a linear layer plus its LoRA adapter, y = x W^T + s (x A^T) B^T, as one autograd node (PEFT LoRA)",
    fn=lora_linear,
    reference=ref.lora_linear,
    original=ref.lora_linear,
    original_name="PEFT lora.Linear: base_layer(x) + lora_B(lora_A(x)) * scaling",
    make_inputs=_inputs,
    # the MLP's up / gate projection, the largest LoRA layer of a Llama decoder layer
    shape_of=lambda m: {"tokens": m.tokens, "in_features": m.hidden, "out_features": m.intermediate,
                        "rank": m.lora_rank},
    size_format="tokens x in x out, rank",
    size_label=lambda s: f"{s['tokens']}x{s['in_features']}x{s['out_features']} r{s['rank']}",
    grad_inputs=("x", "lora_a", "lora_b"),
    category="lora",
    flops=_flops,
    under_compile="inductor", custom_op=False,  # (no custom op: its reference is traced)
    leading_dims=("x",),
),)
