"""GPT-OSS's clamped SwiGLU on its experts' fused, interleaved gate-up projection: the public op and its record.

Kernels: the GLU kernels of :mod:`tigon.kernels.glu` (activation ``clamped_silu``, column stride 2). Specification:
:func:`tigon.reference.glu.clamped_swiglu` (transformers ``modeling_gpt_oss.py``, ``GptOssExperts._apply_gate``).

DeepSeek-V4's clamped SwiGLU is another formula (no alpha, no ``+ 1`` on up, gate and up as separate tensors or the
chunked halves of one projection): :func:`tigon.functional.swiglu`'s ``limit`` (and ``glu_linear``'s), on the same
kernels and the same clamp helper.
"""

from __future__ import annotations


import torch

from .. import _checks
from ..reference import glu as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn, sizes


def clamped_swiglu(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """GPT-OSS's clamped SwiGLU: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)`` with
    ``g = clamp(gate, max=limit)``, gate and up the even and odd columns of ``gate_up`` (transformers
    ``modeling_gpt_oss.py``, ``GptOssExperts._apply_gate``; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card").

    One pass reads the interleaved projection in place and writes the (..., I) product; the backward recomputes the
    activation and writes the gradient of ``gate_up`` interleaved as it is (no strided slices for autograd to
    scatter back). Math in fp32; the clamps' gradients are torch's (1 inside the closed interval, else 0).

    Args:
        gate_up: (..., 2I) float32 / bfloat16 / float16 (other float dtypes run the reference); any strides (a copy
            is made only when its last dimension is strided).
        alpha: the sigmoid's slope (``config.swiglu_alpha``), a finite number.
        limit: the clamp (``config.swiglu_limit``), a positive finite number.

    Returns:
        (..., I) tensor in gate_up's dtype (contiguous); its gradient in the same dtype.

    Raises:
        TypeError: gate_up not a floating tensor, alpha or limit not a real number.
        ValueError: gate_up's last dimension odd, alpha not finite, limit not positive and finite.
    """
    _checks.tensor("gate_up", gate_up, floating=True)
    if gate_up.dim() == 0 or gate_up.shape[-1] % 2:
        raise ValueError(f"gate_up's last dimension must be even (gate and up interleaved), got {tuple(gate_up.shape)}")
    for name, v in (("alpha", alpha), ("limit", limit)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a real number, got {v!r}")
    if not _checks.finite(alpha):
        raise ValueError(f"alpha must be finite, got {alpha!r}")
    if not (_checks.finite(limit) and limit > 0):
        raise ValueError(f"limit must be positive and finite, got {limit!r}")
    if select_backend("clamped_swiglu", gate_up) in TORCH_CODE:
        return ref.clamped_swiglu(gate_up, alpha, limit)
    from ..kernels import glu as k

    if torch.compiler.is_compiling():
        return k.compiled_clamped_swiglu(gate_up, float(alpha), float(limit))
    return k.ClampedSwiGLUFunction.apply(gate_up, float(alpha), float(limit))


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen) -> dict:
    """gate_up (tokens, 2 x intermediate) with std 4, so that a share of both halves lies outside +-limit (GPT-OSS's
    projections reach the clamp), and GPT-OSS's alpha and limit."""
    return dict(gate_up=randn(gen, (s["tokens"], 2 * s["intermediate"]), dtype, device, 4.0), alpha=1.702, limit=7.0)


RECORDS = (OpSpec(
    name="clamped_swiglu",
    summary="GPT-OSS's clamped SwiGLU on the interleaved gate-up projection of its experts",
    fn=clamped_swiglu, reference=ref.clamped_swiglu, original=ref.clamped_swiglu,
    original_name="GptOssExperts._apply_gate (tigon.reference.glu.clamped_swiglu)",
    make_inputs=_inputs, shape_of=lambda m: {"tokens": m.tokens, "intermediate": m.intermediate},
    **sizes("tokens", "intermediate"), grad_inputs=("gate_up",), category="activation",
    # read gate_up (2n), write out (n); backward: read dout (n), gate_up (2n), write its gradient (2n)
    min_bytes=lambda s, e, mode: (3 if mode == "fwd" else 8) * s["tokens"] * s["intermediate"] * e,
    under_compile="inductor", cases=(Case(),), leading_dims=("gate_up",),
),)
