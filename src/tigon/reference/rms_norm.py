"""RMSNorm reference (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization"; HF LlamaRMSNorm)."""

from __future__ import annotations

import torch

CASTING_MODES = ("llama", "gemma", "none")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, offset: float = 0.0,
    casting_mode: str = "llama", in_place: bool = True,
) -> torch.Tensor:
    """y = x / sqrt(mean(x^2) + eps) * (offset + weight), over the last dimension.

    Args:
        x: (..., hidden), any float dtype.
        weight: (hidden,), or None for a norm without a weight (``y = x / sqrt(mean(x^2) + eps)``, Liger-Kernel's
            ``LigerRMSNorm(elementwise_affine=False)``, HF Gemma3n's ``with_scale=False``): ``offset`` is then
            unused, as in Liger-Kernel, and the output has x's dtype in every casting mode.
        eps: added to the mean square before the reciprocal square root.
        offset: added to the weight (1.0 for Gemma's ``(1 + w)``).
        casting_mode: ``"llama"`` (normalise in fp32, cast to x.dtype, then multiply by the weight, as HF
            LlamaRMSNorm; output dtype is the promotion of x and weight), ``"gemma"`` (everything in fp32, cast
            to x.dtype at the end, as HF GemmaRMSNorm), ``"none"`` (no casts: computed in x.dtype). "fp32" is
            the promotion of x.dtype and float32: float64 x is normalised in float64 (HF would downcast it), so
            that float64 inputs give the float64 truth the tests and ``tigon verify`` compare with.
        in_place: accepted for the kernels' signature and ignored: it only says where the kernels' backward stores
            x's gradient (see :func:`tigon.functional.rms_norm`); values are the same either way.

    Returns:
        (..., hidden) tensor.
    """
    ct = torch.promote_types(x.dtype, torch.float32)
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")
    if weight is None:
        xf = x if casting_mode == "none" else x.to(ct)
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    if casting_mode == "llama":
        xf = x.to(ct)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        w = weight + offset if offset != 0.0 else weight
        return w * xf.to(x.dtype)
    if casting_mode == "gemma":
        xf = x.to(ct)
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (xf * (offset + weight.to(ct))).to(x.dtype)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # "none"
    return y * (offset + weight)


def rms_norm_gated(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, offset: float = 0.0,
    casting_mode: str = "llama", group_size: int | None = None, norm_before_gate: bool = True,
) -> torch.Tensor:
    """Gated RMSNorm: ``rmsnorm(x) * silu(gate)`` (norm before gate), or ``rmsnorm(x * silu(gate))`` (Mamba-2's gated
    norm, Dao & Gu 2024, "Transformers are SSMs", mamba_ssm's ``rmsnorm_fn``; transformers' ``Qwen3NextRMSNormGated``
    / ``Qwen3_5RMSNormGated`` of ``modeling_qwen3_next.py`` (before), ``FalconH1RMSNormGated`` of
    ``modeling_falcon_h1.py`` (either, its ``norm_before_gate``), ``Mamba2RMSNormGated`` of ``modeling_mamba2.py``
    (gate first, "llama" casting)).

    ``group_size``: the statistics are those of each group of ``group_size`` contiguous channels (``hidden //
    group_size`` groups; ``FalconH1RMSNormGated`` with ``n_groups`` groups: ``hidden // n_groups``, the argument of
    mamba_ssm's ``rmsnorm_fn`` and transformers' ``Mamba2RMSNormGated``); None: the whole last dimension.

    ``yn`` as :func:`rms_norm` forms it before its final cast (``"llama"``: ``(offset + w) * xhat.to(x.dtype)``, as
    Qwen3-Next; ``"gemma"``: ``xhat * (offset + w)`` in fp32, as Falcon-H1; ``"none"``: in x's dtype), then
    ``(yn * silu(gate.to(fp32))).to(x.dtype)``. ``norm_before_gate=False``: the row normalised is
    ``x.to(fp32) * silu(gate.to(fp32))`` (in x's dtype for ``"none"``), then ``yn.to(x.dtype)``.

    Args:
        x, gate: (..., hidden), one shape, float dtypes.
        weight: (hidden,) or None; eps, offset, casting_mode: as :func:`rms_norm`.
        group_size: channels per group, a divisor of hidden; None (or hidden): one group.
        norm_before_gate: True: the gate multiplies the normalised row; False: x, before the statistics.

    Returns:
        (..., hidden) in x's dtype.
    """
    ct = torch.promote_types(x.dtype, torch.float32)
    if casting_mode not in CASTING_MODES:
        raise ValueError(f"casting_mode must be one of {CASTING_MODES}, got {casting_mode!r}")
    xf = x if casting_mode == "none" else x.to(ct)
    silu = torch.nn.functional.silu(gate.to(ct))
    if not norm_before_gate:
        xf = xf * silu.to(xf.dtype)
    if group_size is None or group_size == x.shape[-1]:
        xhat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    else:
        xg = xf.unflatten(-1, (x.shape[-1] // group_size, group_size))  # (..., groups, group_size)
        xhat = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).flatten(-2)
    if weight is None:
        yn = xhat
    elif casting_mode == "llama":
        yn = (weight + offset if offset != 0.0 else weight) * xhat.to(x.dtype)
    elif casting_mode == "gemma":
        yn = xhat * (offset + weight.to(ct))
    else:
        yn = xhat * (offset + weight)
    return (yn * silu if norm_before_gate else yn).to(x.dtype)
