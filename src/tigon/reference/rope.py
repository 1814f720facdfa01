"""Rotary position embedding reference, rotate-half convention.

RoFormer (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding"), in the layout of
Hugging Face ``apply_rotary_pos_emb``: the two halves of the head dimension form the rotated pairs
``(x[i], x[i + D/2])``, rather than interleaved neighbours.
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x2, x1)`` where ``x1, x2`` are the first and second halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def gather_positions(cos: torch.Tensor, sin: torch.Tensor,
                     position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of the (P, R) tables of every position at ``position_ids`` ((B or 1, T) or (T,)): (B or 1, T, R)
    each (HF ``apply_rotary_pos_emb`` before transformers 4.38: ``cos[position_ids]``)."""
    ids = position_ids if position_ids.dim() == 2 else position_ids[None]
    return cos[ids], sin[ids]


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None = None,
    unsqueeze_dim: int = 1,
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

    Returns:
        (q_embed, k_embed) with the shapes of q and k, in q's and k's dtypes. The arithmetic happens in the
        promotion of q's (k's) and cos's dtypes, as in HF; the result is then cast back to q's (k's) dtype.

    cos and sin are treated as constants: they receive no gradient (HF builds them under ``torch.no_grad``),
    which the Triton path matches.
    """
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
