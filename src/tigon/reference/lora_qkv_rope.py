"""An attention's q / k / v projections with LoRA adapters (LoRA, Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
Language Models") followed by the rotary position embedding of q and k (RoFormer, Su et al. 2021), HF rotate-half
layout.

What Hugging Face's Llama / Qwen2 / Mistral attention computes before its attention call, after PEFT wraps q_proj,
k_proj and v_proj in ``lora.Linear`` layers (one active adapter, no dropout, no DoRA)::

    query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)   # and k, v alike
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
"""

from __future__ import annotations

import torch

from .. import _checks
from .lora import check_inputs, lora_linear
from .rope import rope


def check_qkv_rope_inputs(x, cos, sin, q_weight, q_a, q_b, k_weight, k_a, k_b, v_weight, v_a, v_b, head_dim,
                          q_bias, k_bias, v_bias, q_scaling, k_scaling, v_scaling) -> tuple[int, float, float, float]:
    """Validate :func:`lora_qkv_rope`'s arguments; returns ``(head_dim, s_q, s_k, s_v)`` (head_dim None: cos's last
    dimension).

    Raises:
        TypeError: a non-floating tensor, head_dim not an int, or a scaling that is not a real number.
        ValueError: x not (B, T, K); a projection whose shapes do not fit (the message names the projection and the
            argument) or whose out_features is not a multiple of head_dim; cos / sin not (1 or B, T, R) or (T, R)
            with R even and 0 < R <= head_dim; tensors on different devices; a scaling that is not finite.
    """
    _checks.tensor("x", x, floating=True, ndim=3)
    for name, t in (("cos", cos), ("sin", sin)):
        _checks.tensor(name, t, floating=True, ndim=(2, 3))
    _checks.same_device(x=x, cos=cos, sin=sin)
    scalings = []
    for p, (w, a, b, bias, s) in zip("qkv", ((q_weight, q_a, q_b, q_bias, q_scaling),
                                             (k_weight, k_a, k_b, k_bias, k_scaling),
                                             (v_weight, v_a, v_b, v_bias, v_scaling))):
        try:
            scalings.append(check_inputs(x, w, a, b, bias, s))
        except ValueError as e:
            raise ValueError(f"{p} projection: {e} ({p}_weight, {p}_a, {p}_b, {p}_bias)") from None
        except TypeError as e:
            raise TypeError(f"{p} projection: {e} ({p}_weight, {p}_a, {p}_b, {p}_bias, {p}_scaling)") from None
    if head_dim is None:
        head_dim = cos.shape[-1]
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise TypeError(f"head_dim must be a positive int or None, got {type(head_dim).__name__} {head_dim!r}")
    for p, w in (("q", q_weight), ("k", k_weight), ("v", v_weight)):
        if w.shape[0] % head_dim:
            raise ValueError(f"{p}_weight's out_features {w.shape[0]} must be a multiple of head_dim {head_dim} "
                             "(heads x head_dim)")
    B, T = x.shape[:2]
    R = cos.shape[-1]
    if R == 0 or R % 2 or R > head_dim:
        raise ValueError(f"cos's last dimension (the rotated dims R) must be even, positive and at most head_dim "
                         f"{head_dim}, got cos {tuple(cos.shape)}")
    for name, t in (("cos", cos), ("sin", sin)):
        if t.shape[:-2] not in ((), (1,), (B,)) or t.shape[-2] != T or t.shape[-1] != R:
            raise ValueError(f"{name} must have shape (1 or {B}, {T}, {R}) or ({T}, {R}) (x's batch and positions, "
                             f"cos's rotated dims), got {tuple(t.shape)}")
    return (head_dim, *scalings)


def lora_qkv_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_weight: torch.Tensor, q_a: torch.Tensor,
                  q_b: torch.Tensor, k_weight: torch.Tensor, k_a: torch.Tensor, k_b: torch.Tensor,
                  v_weight: torch.Tensor, v_a: torch.Tensor, v_b: torch.Tensor, *, head_dim: int | None = None,
                  q_bias: torch.Tensor | None = None, k_bias: torch.Tensor | None = None,
                  v_bias: torch.Tensor | None = None, q_scaling: float = 1.0, k_scaling: float = 1.0,
                  v_scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``q, k, v = (lora_linear(x, W_p, A_p, B_p, b_p, s_p).view(B, T, -1, head_dim).transpose(1, 2) for p in q, k,
    v)``, then ``q, k = rope(q, k, cos, sin)``, as PEFT's layers and HF's attention form them.

    Args:
        x: (B, T, K) hidden states.
        cos, sin: (1 or B, T, R) or (T, R) rotary tables (HF's ``position_embeddings``), R even and at most head_dim
            (R < head_dim: the first R dims of each head are rotated, the rest passed through).
        q_weight, k_weight, v_weight: (H_q D, K), (H_k D, K), (H_v D, K) base weights (``nn.Linear`` layout).
        q_a, k_a, v_a: (r_p, K) adapters A; q_b, k_b, v_b: (N_p, r_p) adapters B (the ranks may differ).
        head_dim: D (None: cos's last dimension).
        q_bias, k_bias, v_bias: (N_p,) or None (Qwen2's q / k / v have biases).
        q_scaling, k_scaling, v_scaling: each adapter's s (PEFT's ``scaling[adapter]``).

    Returns:
        (q, k, v): (B, H_q, T, D), (B, H_k, T, D), (B, H_v, T, D), the transposed views of the (B, T, H D)
        projections, in the dtype torch's linear gives.

    Raises:
        TypeError, ValueError: see :func:`check_qkv_rope_inputs`.
    """
    d, s_q, s_k, s_v = check_qkv_rope_inputs(x, cos, sin, q_weight, q_a, q_b, k_weight, k_a, k_b, v_weight, v_a,
                                             v_b, head_dim, q_bias, k_bias, v_bias, q_scaling, k_scaling, v_scaling)
    q, k, v = (lora_linear(x, w, a, b, bias, scaling=s).view(*x.shape[:-1], w.shape[0] // d, d).transpose(1, 2)
               for w, a, b, bias, s in ((q_weight, q_a, q_b, q_bias, s_q), (k_weight, k_a, k_b, k_bias, s_k),
                                        (v_weight, v_a, v_b, v_bias, s_v)))
    q, k = rope(q, k, cos, sin)
    return q, k, v
