"""An attention's q / k / v projections with LoRA adapters (LoRA, Hu et al. 2021) and the rotary embedding of q and k
(RoFormer, Su et al. 2021) as one autograd node: the public op and its record.

Kernels: :mod:`tigon.kernels.lora_qkv_rope` (cuBLAS matmuls and the rope kernel of :mod:`tigon.kernels.rope`;
what it saves and the passes it spares are counted there). Specification: :mod:`tigon.reference.lora_qkv_rope`.
"""

from __future__ import annotations

import math

import torch

from ..reference import lora_qkv_rope as ref
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn
from .lora_mlp import _same_dtype_outside_autocast
from .rope import rotary_tables


def lora_qkv_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_weight: torch.Tensor, q_a: torch.Tensor,
                  q_b: torch.Tensor, k_weight: torch.Tensor, k_a: torch.Tensor, k_b: torch.Tensor,
                  v_weight: torch.Tensor, v_a: torch.Tensor, v_b: torch.Tensor, *, head_dim: int | None = None,
                  q_bias: torch.Tensor | None = None, k_bias: torch.Tensor | None = None,
                  v_bias: torch.Tensor | None = None, q_scaling: float = 1.0, k_scaling: float = 1.0,
                  v_scaling: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of an attention whose q_proj, k_proj and v_proj carry LoRA adapters, each ``y_p = x W_p^T + b_p +
    s_p (x A_p^T) B_p^T`` viewed as (B, H_p, T, D), with q and k rotated (HF rotate-half RoPE), as one autograd node.

    HF's Llama / Qwen2 / Mistral attention up to its attention call after PEFT wraps q_proj, k_proj and v_proj in
    ``lora.Linear`` layers (one active adapter, no dropout, no DoRA): ``self.q_proj(hidden_states).view(hidden_shape)
    .transpose(1, 2)`` for q, k and v, then ``apply_rotary_pos_emb(q, k, cos, sin)``. The three A products run as one
    matmul of the stacked A's (x read once), the rotation writes over the projections' buffers in one launch, and
    the backward applies the rope kernel's transpose to dq and dk, then accumulates every dx term (the three base
    ``dy_p W_p`` and the low-rank ``dxb A``) into one (B, T, K) buffer. Kept for the backward: x and the
    (B T, r_q + r_k + r_v) ``x A^T`` (not q, k, v). Base weights that do not require grad (PEFT freezes them) get no
    gradient and cost no matmul. Under ``torch.compile`` this runs the reference (Inductor schedules the matmuls and
    the rotation itself).

    Args:
        x: (B, T, K) hidden states, float32 / bfloat16 / float16 (other float dtypes run the reference), any strides.
        cos, sin: (1 or B, T, R) or (T, R), HF's ``position_embeddings``: R even, 0 < R <= head_dim (R < head_dim:
            the first R dims of each head are rotated, the rest passed through), any float dtype; they receive no
            gradient.
        q_weight, k_weight, v_weight: (H_q D, K), (H_k D, K), (H_v D, K) base weights (``nn.Linear`` layout); x's
            dtype outside autocast (as every weight, adapter and bias here).
        q_a, k_a, v_a: (r_p, K) adapters A; q_b, k_b, v_b: (H_p D, r_p) adapters B (the ranks may differ: PEFT's
            ``rank_pattern``).
        head_dim: D; None: cos's last dimension (the whole head rotated).
        q_bias, k_bias, v_bias: (H_p D,) or None (Qwen2's projections have biases).
        q_scaling, k_scaling, v_scaling: each adapter's s, PEFT's ``scaling[adapter]`` (``lora_alpha / r``).

    Returns:
        (q, k, v): (B, H_q, T, D), (B, H_k, T, D), (B, H_v, T, D), the transposed views of (B, T, H_p D) buffers
        (HF's layout), in x's dtype (the autocast dtype under autocast, where the matmuls run in that dtype as
        ``F.linear`` does); gradients in each input's dtype.

    Raises:
        TypeError: a non-floating tensor, head_dim not an int, a scaling that is not a real number, or (outside
            autocast) a weight, adapter or bias of another dtype than x's.
        ValueError: x not 3-D; shapes that do not fit (the message names the projection and the argument); an
            out_features not a multiple of head_dim; cos / sin not (1 or B, T, R) or (T, R) with R even and at most
            head_dim; tensors on different devices; a scaling that is not finite.
    """
    head_dim, s_q, s_k, s_v = ref.check_qkv_rope_inputs(x, cos, sin, q_weight, q_a, q_b, k_weight, k_a, k_b, v_weight,
                                                        v_a, v_b, head_dim, q_bias, k_bias, v_bias, q_scaling,
                                                        k_scaling, v_scaling)
    tensors = dict(q_weight=q_weight, q_a=q_a, q_b=q_b, k_weight=k_weight, k_a=k_a, k_b=k_b, v_weight=v_weight,
                   v_a=v_a, v_b=v_b, q_bias=q_bias, k_bias=k_bias, v_bias=v_bias)
    autocast = _same_dtype_outside_autocast(x, tensors)
    if select_backend("lora_qkv_rope", x) in TORCH_CODE or torch.compiler.is_compiling():
        return ref.lora_qkv_rope(x, cos, sin, **tensors, head_dim=head_dim, q_scaling=s_q, k_scaling=s_k,
                                 v_scaling=s_v)
    from ..kernels import lora_qkv_rope as k

    cd = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
    if cos.dim() == 2:  # (T, R): one table for every batch row
        cos, sin = cos[None], sin[None]
    return k.LoRAQKVRoPEFunction.apply(x, cos, sin, *tensors.values(), s_q, s_k, s_v, head_dim, cd)


# ---- the record ----------------------------------------------------------------------------------------------------
def _shape(m) -> dict:
    return {"tokens": m.batch * m.seq, "batch": m.batch, "seq": m.seq, "hidden": m.hidden, "heads": m.heads,
            "kv_heads": m.kv_heads, "head_dim": m.head_dim, "rotary_dim": m.rotary_dim or m.head_dim,
            "theta": m.rope_theta, "rank": m.lora_rank}


def _inputs(s: dict, dtype, device, gen, bias: bool = False) -> dict:
    """x (batch, seq, hidden); base weights with std 1/sqrt(hidden), A with std 1/sqrt(hidden), B with std
    1/sqrt(rank) (trained adapters: PEFT starts B at zero), s = 2; HF rotary tables (1, seq, rotary_dim) for the
    model's theta; ``bias``: q / k / v biases (Qwen2)."""
    b, t, h, r, d = s["batch"], s["seq"], s["hidden"], s["rank"], s["head_dim"]
    out = dict(x=randn(gen, (b, t, h), dtype, device))
    cos, sin = rotary_tables(t, s["rotary_dim"], s["theta"], dtype, device)
    out.update(cos=cos[None], sin=sin[None], head_dim=d)
    for p, heads in (("q", s["heads"]), ("k", s["kv_heads"]), ("v", s["kv_heads"])):
        out[f"{p}_weight"] = randn(gen, (heads * d, h), dtype, device, 1.0 / math.sqrt(h))
        out[f"{p}_a"] = randn(gen, (r, h), dtype, device, 1.0 / math.sqrt(h))
        out[f"{p}_b"] = randn(gen, (heads * d, r), dtype, device, 1.0 / math.sqrt(r))
        out[f"{p}_scaling"] = 2.0
        if bias:
            out[f"{p}_bias"] = randn(gen, (heads * d,), dtype, device, 0.1)
    return out


def _flops(s: dict, mode: str) -> float:
    """Three LoRA projections (see :func:`tigon.ops.lora._flops`) of widths heads x D, kv_heads x D, kv_heads x D
    (the rotation is memory-bound and small beside them)."""
    t, h, r = s["tokens"], s["hidden"], s["rank"]
    n = (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
    base = 2 * t * h * n
    low = 2 * t * r * (3 * h + n)
    return base + low if mode == "fwd" else 2 * base + 3 * low


RECORDS = (OpSpec(
    name="lora_qkv_rope",
    summary="an attention's q / k / v projections with LoRA adapters and the RoPE of q and k as one autograd node "
            "(PEFT LoRA)",
    fn=lora_qkv_rope,
    reference=ref.lora_qkv_rope,
    original=ref.lora_qkv_rope,
    original_name="HF LlamaAttention's q_proj / k_proj / v_proj (PEFT lora.Linear) and apply_rotary_pos_emb",
    make_inputs=_inputs,
    shape_of=_shape,
    size_format="batch x seq x hidden, (q heads + kv heads) x head_dim, rank",
    size_label=lambda s: f"{s['batch']}x{s['seq']}x{s['hidden']} ({s['heads']}+{s['kv_heads']})x{s['head_dim']} "
                         f"r{s['rank']}",
    grad_inputs=("x", "q_a", "q_b", "k_a", "k_b", "v_a", "v_b"),
    category="lora",
    flops=_flops,
    cases=(Case(), Case("q / k / v biases (Qwen2)", inputs={"bias": True})),
    under_compile="inductor", custom_op=False,  # (no custom op: its reference is traced)
),)
