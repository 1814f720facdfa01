"""Rotary position embedding reference, rotate-half convention.

RoFormer (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding"), in the layout of
Hugging Face ``apply_rotary_pos_emb``: the two halves of the head dimension form the rotated pairs
``(x[i], x[i + D/2])``, rather than interleaved neighbours.
"""

from __future__ import annotations

import torch

from .. import _checks


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x2, x1)`` where ``x1, x2`` are the first and second halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def gather_positions(cos: torch.Tensor, sin: torch.Tensor,
                     position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of the (P, R) tables of every position at ``position_ids`` ((B or 1, T) or (T,)): (B or 1, T, R)
    each (HF ``apply_rotary_pos_emb`` before transformers 4.38: ``cos[position_ids]``).

    Raises:
        ValueError: on the CPU, an id outside [0, P) (checked on the host, as cross-entropy's targets: on CUDA the
            check would be a device synchronisation per call, and the indexing's device-side assert stops there).
    """
    if position_ids.device.type == "cpu" and position_ids.numel() and not torch.compiler.is_compiling() \
            and _checks.has_data(position_ids):
        lo, hi = int(position_ids.min()), int(position_ids.max())
        if lo < 0 or hi >= cos.shape[0]:
            raise ValueError(f"position_ids must be in [0, {cos.shape[0]}) (the rows of the ({cos.shape[0]}, "
                             f"{cos.shape[-1]}) cos / sin table of every position), found {hi if lo >= 0 else lo}")
    ids = position_ids if position_ids.dim() == 2 else position_ids[None]
    return cos[ids], sin[ids]


def rotary_dim_tables(cos: torch.Tensor, sin: torch.Tensor,
                      rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger-Kernel's ``rotary_dim``: the tables that rotate the first ``rotary_dim`` dims of each head, the angle of
    the pair ``(i, i + rotary_dim/2)`` being column i of cos / sin (i < rotary_dim/2; the other columns are not
    read): ``cat(c, c)`` with ``c = cos[..., :rotary_dim // 2]``, the same for sin. This serves both layouts Liger's
    kernel reads: HF's duplicated ``cat(freqs, freqs)`` tables of any width >= rotary_dim, and GPT-OSS's
    non-duplicated ``freqs`` of width rotary_dim / 2."""
    half = rotary_dim // 2
    c, s = cos[..., :half], sin[..., :half]
    return torch.cat((c, c), dim=-1), torch.cat((s, s), dim=-1)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1, rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q * cos + rotate_half(q) * sin`` and the same for ``k`` (HF ``apply_rotary_pos_emb``).

    Partial rotary (cos / sin narrower than the head dim, R < D; GPT-NeoX's ``apply_rotary_pos_emb``): the first R
    dims of each head are rotated as above and the other D - R passed through unchanged.

    Args:
        q: (B, Hq, T, D) for ``unsqueeze_dim=1`` or (B, T, Hq, D) for ``unsqueeze_dim=2``.
        k: the same layout with Hkv heads (any head count; GQA has Hq a multiple of Hkv).
        cos, sin: (1 or B, T, R) or (T, R) (read as (1, T, R): one table for every batch row, as Liger-Kernel's
            ``liger_rope``), R even and at most D (R = D: the whole head is rotated), any float dtype; inserted a
            head axis at ``unsqueeze_dim``.
        position_ids: None, or (B or 1, T) / (T,) integer positions: with 2-D cos / sin, those are the (P, R) tables
            of every position and their rows at the ids are used (:func:`gather_positions`); with 3-D tables
            (already per position, as Liger-Kernel's ``liger_rope`` expects) it is not used.
        unsqueeze_dim: where the head axis is in q and k (1 or 2).
        rotary_dim: None (the rotated dims are cos's width R, every column read), or Liger-Kernel's
            ``rotary_dim``: the first rotary_dim dims of each head are rotated, by the first rotary_dim / 2 columns
            of cos / sin (:func:`rotary_dim_tables`), the rest passed through.

    Returns:
        (q_embed, k_embed) with the shapes of q and k, in q's and k's dtypes. The arithmetic happens in the
        promotion of q's (k's) and cos's dtypes, as in HF; the result is then cast back to q's (k's) dtype.

    cos and sin are treated as constants: they receive no gradient (HF builds them under ``torch.no_grad``),
    which the Triton path matches.
    """
    if rotary_dim is not None:
        cos, sin = rotary_dim_tables(cos, sin, rotary_dim)
    if cos.dim() == 2:
        cos, sin = gather_positions(cos, sin, position_ids) if position_ids is not None else (cos[None], sin[None])
    r = cos.shape[-1]
    if r < q.shape[-1]:
        q_rot, k_rot = rope(q[..., :r], k[..., :r], cos, sin, None, unsqueeze_dim)
        return torch.cat((q_rot, q[..., r:]), dim=-1), torch.cat((k_rot, k[..., r:]), dim=-1)
    cos = cos.detach().unsqueeze(unsqueeze_dim)
    sin = sin.detach().unsqueeze(unsqueeze_dim)
    q_embed = (q * cos + rotate_half(q) * sin).to(q.dtype)
    k_embed = (k * cos + rotate_half(k) * sin).to(k.dtype)
    return q_embed, k_embed


def rope_interleaved(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1,
    deinterleave: bool = False, expanded_tables: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position embedding on interleaved pairs ``(x[2i], x[2i + 1])`` (RoFormer's original layout, Su et al.
    2021, eq. 34), each rotated by the angle of column i of the table's first half.

    ``y[2i] = x[2i] c_i - x[2i+1] s_i``, ``y[2i+1] = x[2i+1] c_i + x[2i] s_i`` with ``c = cos[..., :R/2]`` (HF's
    tables are ``cat(freqs, freqs)``): GLM / GLM-4's ``apply_rotary_pos_emb`` (``modeling_glm4.py``: the first half
    repeat-interleaved, ``rotate_half`` on even / odd dims) and the complex form (Llama 4's / DeepSeek-V2's
    ``apply_rotary_emb``: ``view_as_complex(x) * freqs_cis``, with ``cos = cat(freqs_cis.real, freqs_cis.real)``).
    ``deinterleave=True``: the rotated pairs are written as halves, ``cat(y[0::2], y[1::2])`` (DeepSeek-V3's
    ``apply_rotary_pos_emb_interleave``, ``modeling_deepseek_v3.py``; q and k permuted alike, so q.k is the same).
    Dims R..D of each head are passed through unchanged (GLM's partial rotary). ``expanded_tables=True``: cos / sin
    hold one column per rotated dim, pair i rotating dim 2i with column 2i and dim 2i+1 with column 2i+1 (GLM-4V's
    ``apply_rotary_pos_emb`` of ``modeling_glm4v.py`` in transformers 5.2x, on its repeat-interleaved tables):
    ``y = x * cos + rotate_half_llm(x) * sin`` over the first R dims, R pairs / 2 of them.

    Args:
        q, k: (B, H, T, D) for ``unsqueeze_dim=1`` or (B, T, H, D) for ``unsqueeze_dim=2`` (any head counts).
        cos, sin: (1 or B, T, R) or (T, R), R even and at most D; only their first R/2 columns are read.
        unsqueeze_dim: where the head axis is (1 or 2).
        deinterleave: write each rotated head as halves (evens, then odds) instead of pairs.
        expanded_tables: the tables are laid out like the pairs (see above).

    Returns:
        (q_embed, k_embed), shapes and dtypes of q and k; computed in the promotion of q's (k's) and cos's dtypes,
        as in HF, then cast back. cos and sin receive no gradient.
    """
    if cos.dim() == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    r = cos.shape[-1]
    cos, sin = cos.detach().unsqueeze(unsqueeze_dim), sin.detach().unsqueeze(unsqueeze_dim)
    if expanded_tables:
        c1, c2, s1, s2 = cos[..., 0::2], cos[..., 1::2], sin[..., 0::2], sin[..., 1::2]
    else:
        c1 = c2 = cos[..., : r // 2]
        s1 = s2 = sin[..., : r // 2]

    def one(x):
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        y1, y2 = x1 * c1 - x2 * s1, x2 * c2 + x1 * s2
        y = torch.cat((y1, y2), dim=-1) if deinterleave else torch.stack((y1, y2), dim=-1).flatten(-2)
        return torch.cat((y.to(x.dtype), x[..., r:]), dim=-1)

    return one(q), one(k)


def mrope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mrope_section, unsqueeze_dim: int = 1,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Multimodal rotary position embedding (mRoPE; Qwen2-VL, Wang et al. 2024, "Qwen2-VL: Enhancing
    Vision-Language Model's Perception of the World at Any Resolution", section 2.1): rotate-half rope whose cos / sin
    column i of each half comes from the table of its section, temporal, height or width (HF
    ``apply_multimodal_rotary_pos_emb`` of ``modeling_qwen2_vl.py`` before transformers 5.2x assembled the tables in
    the rotary embedding).

    Args:
        q, k: as :func:`rope`.
        cos, sin: (3, 1 or B, T, R), one table per position axis, R = 2 * sum(mrope_section) and at most D (the
            other D - R dims pass through).
        mrope_section: three section widths (t, h, w) summing to R / 2.
        unsqueeze_dim: where the head axis is (1 or 2).
        interleaved: rotate interleaved pairs with the assembled tables (:func:`rope_interleaved`), as GLM-4V's
            ``apply_multimodal_rotary_pos_emb`` before transformers 5.2x does (``modeling_glm4v.py``).

    Returns:
        :func:`rope` (:func:`rope_interleaved`) of q and k with the assembled tables ``cat(table[i % 3] of the
        split by mrope_section * 2)``.
    """
    split = list(mrope_section) * 2
    cos = torch.cat([m[i % 3] for i, m in enumerate(cos.split(split, dim=-1))], dim=-1)
    sin = torch.cat([m[i % 3] for i, m in enumerate(sin.split(split, dim=-1))], dim=-1)
    if interleaved:
        return rope_interleaved(q, k, cos, sin, unsqueeze_dim)
    return rope(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
