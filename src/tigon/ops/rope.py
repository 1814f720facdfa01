"""Rotary position embedding: Triton forward and backward (RoFormer, Su et al. 2021; HF rotate-half layout).

With the head dimension split into halves ``x1 = x[:D/2]``, ``x2 = x[D/2:]`` (and likewise c1, c2 of cos and
s1, s2 of sin), HF's ``x * cos + rotate_half(x) * sin`` is

    y1 = x1 * c1 - x2 * s1        y2 = x2 * c2 + x1 * s2

and its transpose, the backward, is

    dx1 = dy1 * c1 + dy2 * s2     dx2 = dy2 * c2 - dy1 * s1

Both are ``y1 = x1 * c1 + x2 * sa``, ``y2 = x2 * c2 + x1 * sb`` with ``(sa, sb) = (-s1, s2)`` forward and
``(s2, -s1)`` backward, so one kernel does both (constexpr ``BACKWARD``). No assumption that c1 == c2 is made:
any cos/sin tensors get the exact transpose.

One program per (batch, position, group of heads): it loads that position's cos and sin in fp32 and applies
them to its [BLOCK_H, D/2] tile of q heads or of k heads (the position's other groups read the same cos/sin
from L2). Separate programs per group, rather than one program walking all heads, keep more loads in flight
when there are few positions. q and k are addressed through all
four strides, so the HF layout (``view(B, T, H, D).transpose(1, 2)`` of a projection) is read in place.

Minimal bytes (bf16, n = numel(q) + numel(k)): forward and backward each 2*n*2 plus B_cos*T*D*2*2 for cos/sin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, next_pow2
from ..support import interpreter_enabled


@triton.jit
def _rotate_heads(
    X, Y, H, sx_h, sx_d, sy_h, sy_d, c1, c2, sa, sb, d, dmask,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):
    # X, Y point at (batch b, the group's first head, position t, dim 0); heads advance by sx_h / sy_h; H <= BLOCK_H
    # heads of the group are valid.
    h = tl.arange(0, BLOCK_H).to(tl.int64)
    mask = (h < H)[:, None] & dmask[None, :]
    xp = X + h[:, None] * sx_h + d[None, :] * sx_d
    x1 = tl.load(xp, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(xp + HALF * sx_d, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * c1[None, :] + x2 * sa[None, :]
    y2 = x2 * c2[None, :] + x1 * sb[None, :]
    yp = Y + h[:, None] * sy_h + d[None, :] * sy_d
    tl.store(yp, y1.to(Y.dtype.element_ty), mask=mask)
    tl.store(yp + HALF * sy_d, y2.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, T, HQ, HKV, GROUPS_Q,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
    sqo_b, sqo_h, sqo_t, sqo_d, sko_b, sko_h, sko_t, sko_d,
    sc_b, sc_t, sc_d, ss_b, ss_t, ss_d,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BACKWARD: tl.constexpr,
):
    # axis 0: (batch, position); axis 1: a group of BLOCK_HQ q heads (the first GROUPS_Q) or BLOCK_HK k heads.
    pid = tl.program_id(0)
    grp = tl.program_id(1)
    b = (pid // T).to(tl.int64)
    t = (pid % T).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    dmask = d < HALF
    cp = COS + b * sc_b + t * sc_t + d * sc_d
    sp = SIN + b * ss_b + t * ss_t + d * ss_d
    c1 = tl.load(cp, mask=dmask, other=0.0).to(tl.float32)
    c2 = tl.load(cp + HALF * sc_d, mask=dmask, other=0.0).to(tl.float32)
    s1 = tl.load(sp, mask=dmask, other=0.0).to(tl.float32)
    s2 = tl.load(sp + HALF * ss_d, mask=dmask, other=0.0).to(tl.float32)
    if BACKWARD:
        sa = s2
        sb = -s1
    else:
        sa = -s1
        sb = s2
    if grp < GROUPS_Q:
        h0 = (grp * BLOCK_HQ).to(tl.int64)
        _rotate_heads(Q + b * sq_b + t * sq_t + h0 * sq_h, QO + b * sqo_b + t * sqo_t + h0 * sqo_h,
                      tl.minimum(HQ - h0, BLOCK_HQ), sq_h, sq_d, sqo_h, sqo_d, c1, c2, sa, sb, d, dmask,
                      HALF, BLOCK_HQ)
    else:
        h0 = ((grp - GROUPS_Q) * BLOCK_HK).to(tl.int64)
        _rotate_heads(K + b * sk_b + t * sk_t + h0 * sk_h, KO + b * sko_b + t * sko_t + h0 * sko_h,
                      tl.minimum(HKV - h0, BLOCK_HK), sk_h, sk_d, sko_h, sko_d, c1, c2, sa, sb, d, dmask,
                      HALF, BLOCK_HK)


def _heads_first(x: torch.Tensor, unsqueeze_dim: int) -> torch.Tensor:
    """The (B, H, T, D) view of q/k/cos-shaped inputs laid out with the head axis at ``unsqueeze_dim``."""
    return x if unsqueeze_dim == 1 else x.transpose(1, 2)


def _block_h(heads: int, block_half: int, device: torch.device) -> int:
    """Heads per program: a [BLOCK_H, D/2] tile of about 2048 elements per half (4096 per program).

    H200, bf16, HF layout, Llama-3-8B heads (32 q / 8 kv, D=128), forward at 1k..64k tokens
    (benchmarks/results/h200/session4/tune2_h200.json): 2048-element half tiles with 4 warps were the fastest of
    256..2048 x 1..4 warps at every size (4.6 us at 1k tokens, 350 us at 64k; 1024-element tiles 5.1 / 358 us).
    The interpreter pays per program, so there every head goes in one tile.
    """
    if interpreter_enabled() or device.type != "cuda":
        target = 1 << 16
    else:
        # head dims >= 256 run one warp (see _num_warps): keep their tiles at the 1024 elements measured with it
        target = 1024 if block_half >= 128 else 2048
    return max(1, min(next_pow2(heads), target // block_half))


def _num_warps(step_elems: int, block_half: int) -> int:
    """One warp per 1024 elements of a program's tile (4 for the 4096-element tiles of D=128, see _block_h).

    Head dims of 256 and up take a single warp: for D=256 that measured 87% of copy bandwidth against 68% with 4.
    """
    if block_half >= 128:
        return 1
    return max(1, min(8, step_elems // 1024))


def rope_apply(q, k, cos, sin, unsqueeze_dim: int, backward: bool, need_q: bool = True, need_k: bool = True):
    """Launch the rotation (``backward=False``) or its transpose (``backward=True``) on q and k.

    q, k: (B, H, T, D) for unsqueeze_dim=1 or (B, T, H, D) for 2, any strides. cos, sin: (1 or B, T, D).
    Returns (q_out, k_out) shaped and (when dense) strided like q and k, in their dtypes; an output whose
    ``need_*`` flag is False is not computed and returned as None.
    """
    qv, kv = _heads_first(q, unsqueeze_dim), _heads_first(k, unsqueeze_dim)
    B, HQ, T, D = qv.shape
    HKV = kv.shape[1]
    qo = torch.empty_like(q) if need_q else None
    ko = torch.empty_like(k) if need_k else None
    qov = _heads_first(qo, unsqueeze_dim) if need_q else qv
    kov = _heads_first(ko, unsqueeze_dim) if need_k else kv
    if B * T == 0 or (qo is None and ko is None):
        return qo, ko
    half = D // 2
    block_half = next_pow2(half)
    block_hq = _block_h(HQ, block_half, q.device)
    block_hk = _block_h(HKV, block_half, q.device)
    groups_q = cdiv(HQ, block_hq) if need_q else 0
    groups_k = cdiv(HKV, block_hk) if need_k else 0
    cb = (lambda c: 0 if c.shape[0] == 1 else c.stride(0))
    _rope_kernel[(B * T, groups_q + groups_k)](
        qv, kv, qov, kov, cos, sin, T, HQ, HKV, groups_q,
        *qv.stride(), *kv.stride(), *qov.stride(), *kov.stride(),
        cb(cos), cos.stride(1), cos.stride(2), cb(sin), sin.stride(1), sin.stride(2),
        HALF=half, BLOCK_HALF=block_half, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BACKWARD=backward,
        num_warps=_num_warps(2 * max(block_hq, block_hk) * block_half, block_half),
    )
    return qo, ko


class RoPEFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(q, k, cos, sin, unsqueeze_dim)``. cos and sin receive no gradient (None)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, unsqueeze_dim):
        q_embed, k_embed = rope_apply(q, k, cos, sin, unsqueeze_dim, backward=False)
        ctx.save_for_backward(cos, sin)
        ctx.unsqueeze_dim = unsqueeze_dim
        return q_embed, k_embed

    @staticmethod
    @torch.autograd.function.once_differentiable  # not differentiable itself: create_graph raises
    def backward(ctx, dq_embed, dk_embed):
        cos, sin = ctx.saved_tensors
        need_q, need_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dq, dk = rope_apply(dq_embed, dk_embed, cos, sin, ctx.unsqueeze_dim, backward=True,
                            need_q=need_q, need_k=need_k)
        return dq, dk, None, None, None
