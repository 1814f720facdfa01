"""Rotary position embedding: Triton forward and backward (RoFormer, Su et al. 2021; HF rotate-half layout).

With the head dimension split into halves ``x1 = x[:D/2]``, ``x2 = x[D/2:]`` (and likewise c1, c2 of cos and
s1, s2 of sin), HF's ``x * cos + rotate_half(x) * sin`` is

    y1 = x1 * c1 - x2 * s1        y2 = x2 * c2 + x1 * s2

and its transpose, the backward, is

    dx1 = dy1 * c1 + dy2 * s2     dx2 = dy2 * c2 - dy1 * s1

Both are ``y1 = x1 * c1 + x2 * sa``, ``y2 = x2 * c2 + x1 * sb`` with ``(sa, sb) = (-s1, s2)`` forward and
``(s2, -s1)`` backward, so one kernel does both (constexpr ``BACKWARD``). No assumption that c1 == c2 is made:
any cos/sin tensors get the exact transpose.

The rows of q and k (one per batch, position and head) are rotated in [BLOCK_R, D/2] tiles: a program takes
BLOCK_R consecutive rows, finds each row's (batch, position, head) from its index and the strides, and gathers
that position's cos and sin in fp32 (the H rows of a position read the same values from cache, as
torch.compile's generated kernel does). One launch covers q's rows then k's. q and k are addressed through all
four strides, so the HF layout (``view(B, T, H, D).transpose(1, 2)`` of a projection) is read in place, and
there consecutive rows are contiguous in memory.

Partial rotary (GPT-NeoX / Pythia, phi-2, StableLM: cos/sin of R < D columns) rotates the first R dims as above
(HALF = R/2) and copies the other D - R of each row in the same program (the rotation and its transpose are the
identity there), so the output needs no separate concatenation.

Layout variants (constexpr switches of the same kernel):

- ``X_PAIRS`` / ``Y_PAIRS``: the input / output holds the rotated pairs interleaved, ``x1 = x[2i]``, ``x2 = x[2i + 1]``
  (GLM's ``apply_rotary_pos_emb``, the complex form of Llama 4 / DeepSeek-V2) instead of in halves. DeepSeek-V3's
  ``apply_rotary_pos_emb_interleave`` reads interleaved pairs and writes halves (``X_PAIRS`` only); its transpose, the
  backward, reads halves and writes pairs, so the backward swaps the two flags.
- ``SHARED``: one angle per pair, ``c2 = c1`` and ``s2 = s1`` read from the first half of the table (the interleaved
  forms use ``cos[..., :R/2]`` of HF's ``cat(freqs, freqs)`` table).
- ``TABLE_PAIRS``: the table is laid out like the pairs, ``c1, c2 = cos[2i], cos[2i + 1]`` (GLM-4V's repeat-interleaved
  tables in transformers 5.2x) instead of ``cos[i], cos[i + R/2]``.
- ``MROPE`` with ``SEC0``, ``SEC1``: multimodal rotary (mRoPE, Qwen2-VL's ``apply_multimodal_rotary_pos_emb``): cos /
  sin are (3, B, T, R) tables, one per position axis (temporal, height, width), and column i of each half reads the
  table of its section: 0 for i < SEC0, 1 for i < SEC0 + SEC1, else 2 (``mrope_section``; its strides ``sc_s``,
  ``ss_s``).

Minimal bytes (bf16, n = numel(q) + numel(k)): forward and backward each 2*n*2 plus B_cos*T*D*2*2 for cos/sin.
"""

from __future__ import annotations

import functools


import torch
from torch import Tensor
import triton
import triton.language as tl

from ._common import CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, launch_mode, next_pow2, or_empty
from .first_order import first_order


@triton.jit
def _rotate_rows(
    X, Y, COS, SIN, pid, n_rows, H, T, sx_b, sx_h, sx_t, sx_d, sy_b, sy_h, sy_t, sy_d,
    sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, sc_s, ss_s,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_R: tl.constexpr, BACKWARD: tl.constexpr, ROW64: tl.constexpr, X_PAIRS: tl.constexpr,
    Y_PAIRS: tl.constexpr, SHARED: tl.constexpr, SEC0: tl.constexpr, SEC1: tl.constexpr, TABLE_PAIRS: tl.constexpr,
    MROPE: tl.constexpr,
):
    # Rows r = (b * T + t) * H + h of one tensor (q or k); this program rotates rows [pid * BLOCK_R, + BLOCK_R).
    # PASS: the head dims after the 2 * HALF rotated ones (partial rotary), copied unchanged (the rotation is the
    # identity there, forward and backward).
    # ROW64: 2**31 rows or more (head dims of 16 and less at > 32 GiB), where the int32 row index would wrap.
    # X_PAIRS, Y_PAIRS, SHARED, SEC0, SEC1: the layout variants of the module docstring.
    if ROW64:
        r = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    else:
        r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < n_rows
    h = (r % H).to(tl.int64)
    bt = r // H
    b = (bt // T).to(tl.int64)
    t = (bt % T).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    mask = rmask[:, None] & (d < HALF)[None, :]
    # Interleaved pairs are read and written as whole contiguous rows [BLOCK_R, 2 * BLOCK_HALF] and split into / joined
    # from (evens, odds): two stride-2 accesses per row would be scalar, unvectorised loads and stores (8x the
    # instructions of the rotate-half layout's).
    e = tl.arange(0, 2 * BLOCK_HALF)
    emask = rmask[:, None] & (e < 2 * HALF)[None, :]
    # cos/sin rows are gathered per row: the H rows of a position read the same (cached) values.
    crow = COS + (b * sc_b + t * sc_t)[:, None]
    srow = SIN + (b * ss_b + t * ss_t)[:, None]
    if TABLE_PAIRS:  # pair i reads columns 2i and 2i + 1 of the table
        cc = tl.load(crow + e[None, :] * sc_d, mask=emask, other=0.0).to(tl.float32)
        ss = tl.load(srow + e[None, :] * ss_d, mask=emask, other=0.0).to(tl.float32)
        c1, c2 = tl.split(tl.reshape(cc, [BLOCK_R, BLOCK_HALF, 2]))
        s1, s2 = tl.split(tl.reshape(ss, [BLOCK_R, BLOCK_HALF, 2]))
    else:  # pair i reads columns i and i + HALF
        cp = crow + d[None, :] * sc_d
        sp = srow + d[None, :] * ss_d
        if MROPE:  # column i of each half reads the table of its section (0, 1 or 2)
            sec = ((d >= SEC0).to(tl.int64) + (d >= SEC0 + SEC1).to(tl.int64))[None, :]
            cp += sec * sc_s
            sp += sec * ss_s
        c1 = tl.load(cp, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(sp, mask=mask, other=0.0).to(tl.float32)
        if SHARED:  # one angle per pair, from the first half of the table
            c2 = c1
            s2 = s1
        else:
            c2 = tl.load(cp + HALF * sc_d, mask=mask, other=0.0).to(tl.float32)
            s2 = tl.load(sp + HALF * ss_d, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        sa = s2
        sb = -s1
    else:
        sa = -s1
        sb = s2
    xrow = X + (b * sx_b + t * sx_t + h * sx_h)[:, None]
    yrow = Y + (b * sy_b + t * sy_t + h * sy_h)[:, None]
    if X_PAIRS:  # pair i is (x[2i], x[2i + 1])
        xx = tl.load(xrow + e[None, :] * sx_d, mask=emask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(xx, [BLOCK_R, BLOCK_HALF, 2]))
    else:  # pair i is (x[i], x[i + HALF])
        xp = xrow + d[None, :] * sx_d
        x1 = tl.load(xp, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(xp + HALF * sx_d, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * c1 + x2 * sa
    y2 = x2 * c2 + x1 * sb
    if Y_PAIRS:
        yy = tl.reshape(tl.join(y1, y2), [BLOCK_R, 2 * BLOCK_HALF])
        tl.store(yrow + e[None, :] * sy_d, yy.to(Y.dtype.element_ty), mask=emask)
    else:
        yp = yrow + d[None, :] * sy_d
        tl.store(yp, y1.to(Y.dtype.element_ty), mask=mask)
        tl.store(yp + HALF * sy_d, y2.to(Y.dtype.element_ty), mask=mask)
    if PASS > 0:
        e = 2 * HALF + tl.arange(0, BLOCK_PASS)
        pmask = rmask[:, None] & (e < 2 * HALF + PASS)[None, :]
        xt = tl.load(xrow + e[None, :] * sx_d, mask=pmask, other=0.0)
        tl.store(yrow + e[None, :] * sy_d, xt.to(Y.dtype.element_ty), mask=pmask)


@triton.jit
def _rope_kernel(
    Q, K, QO, KO, COS, SIN, T, HQ, HKV, NQ, NK, PROGS_Q,
    sq_b, sq_h, sq_t, sq_d, sk_b, sk_h, sk_t, sk_d,
    sqo_b, sqo_h, sqo_t, sqo_d, sko_b, sko_h, sko_t, sko_d,
    sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, sc_s, ss_s,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_R: tl.constexpr, BACKWARD: tl.constexpr, ROW64: tl.constexpr, X_PAIRS: tl.constexpr,
    Y_PAIRS: tl.constexpr, SHARED: tl.constexpr, SEC0: tl.constexpr, SEC1: tl.constexpr, TABLE_PAIRS: tl.constexpr,
    MROPE: tl.constexpr,
):
    # The first PROGS_Q programs rotate q's NQ rows, the others k's NK rows.
    pid = tl.program_id(0)
    if pid < PROGS_Q:
        _rotate_rows(Q, QO, COS, SIN, pid, NQ, HQ, T, sq_b, sq_h, sq_t, sq_d, sqo_b, sqo_h, sqo_t, sqo_d,
                     sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, sc_s, ss_s, HALF, BLOCK_HALF, PASS, BLOCK_PASS, BLOCK_R,
                     BACKWARD, ROW64, X_PAIRS, Y_PAIRS, SHARED, SEC0, SEC1, TABLE_PAIRS, MROPE)
    else:
        _rotate_rows(K, KO, COS, SIN, pid - PROGS_Q, NK, HKV, T, sk_b, sk_h, sk_t, sk_d, sko_b, sko_h, sko_t,
                     sko_d, sc_b, sc_t, sc_d, ss_b, ss_t, ss_d, sc_s, ss_s, HALF, BLOCK_HALF, PASS, BLOCK_PASS,
                     BLOCK_R, BACKWARD, ROW64, X_PAIRS, Y_PAIRS, SHARED, SEC0, SEC1, TABLE_PAIRS, MROPE)


def _heads_first(x: torch.Tensor, unsqueeze_dim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(shape, strides) of q/k-shaped ``x`` (head axis at ``unsqueeze_dim``) read as (B, H, T, D): those of
    ``x.transpose(1, 2)`` for ``unsqueeze_dim=2``, without making that view (the kernel takes x's pointer and these
    strides)."""
    shape, st = x.shape, x.stride()
    if unsqueeze_dim == 1:
        return shape, st
    return (shape[0], shape[2], shape[1], shape[3]), (st[0], st[2], st[1], st[3])


# Elements of a program's tile per half (BLOCK_R rows x D/2) and its warps; see _rows_config.
HALF_TILE = 1024
TILE_WARPS = 2


def _rows_config(block_half: int, device: torch.device) -> tuple[int, int]:
    """(rows per program, num_warps): a [BLOCK_R, D/2] tile of HALF_TILE elements per half, TILE_WARPS warps.

    H200, bf16, HF layout, Llama-3-8B heads (32 q / 8 kv, D=128), forward, 1k..64k tokens
    (benchmarks/results/h200/session6/tune4_rope_rms16k.json): 1024-element half tiles (16 rows) with 2 warps were
    the fastest of 1024..8192 x 2..8 warps at every size: 4.7 / 9.5 / 22.3 / 42.1 / 165.8 / 332.1 us at 1k / 2k /
    4k / 8k / 32k / 64k tokens, against 4.7 / 9.5 / 22.6 / 43.3 / 172.8 / 347.3 for the per-position kernel it
    replaced (one program per position and group of heads) and torch.compile's 9.5 / 10.8 / 25.9 / 43.0 / 165.5 /
    329.4 in the same run. At Gemma-2's D=256 the same tiles (4 rows) were within 1% of the best of 512..2048 x 1..4
    warps at 16k and 64k tokens, and fwd+bwd 197 us at 16k against 212 for the per-position kernel
    (session6/tune6_rope_gemma2.json). The interpreter pays per program, so there a program takes 65,536 elements per
    half (rope_apply caps its rows at q's or k's rows there: the interpreter pays for every element of a tile too).
    """
    if not compiled_cuda(device):
        return max(1, (1 << 16) // block_half), 4
    return max(1, HALF_TILE // block_half), TILE_WARPS


PAIRS_HALVES, PAIRS_INTERLEAVED, PAIRS_DEINTERLEAVE, PAIRS_EXPANDED = 0, 1, 2, 3
"""``pairs`` of :func:`rope_apply`: rotate-half in and out; interleaved pairs in and out (GLM, the complex form);
interleaved pairs in, halves out (DeepSeek-V3's ``apply_rotary_pos_emb_interleave``); interleaved pairs in and out
with tables of one column per rotated dim, ``cos[2i], cos[2i + 1]`` for pair i (GLM-4V in transformers 5.2x)."""


def rope_apply(q, k, cos, sin, unsqueeze_dim: int, backward: bool, need_q: bool = True, need_k: bool = True,
               inplace: bool = False, pairs: int = PAIRS_HALVES, sections=(), out=None, mode=None):
    """Launch the rotation (``backward=False``) or its transpose (``backward=True``) on q and k.

    q, k: (B, H, T, D) for unsqueeze_dim=1 or (B, T, H, D) for 2, any strides. cos, sin: (1 or B, T, R), R even
    and at most D: the first R head dims are rotated, the other D - R copied (partial rotary; R = D: all rotated).
    pairs: :data:`PAIRS_HALVES` (pair i is dims i and i + R/2), :data:`PAIRS_INTERLEAVED` (dims 2i and 2i + 1, one
    angle per pair from ``cos[..., :R/2]``), :data:`PAIRS_DEINTERLEAVE` (interleaved in, halves out; the backward
    reads halves and writes pairs) or :data:`PAIRS_EXPANDED` (interleaved, pair i reading columns 2i and 2i + 1).
    sections: () or mRoPE's (s0, s1, s2) with s0 + s1 + s2 = R/2, cos / sin then (3, 1 or B, T, R).
    Returns (q_out, k_out) shaped and (when dense) strided like q and k, in their dtypes; an output whose
    ``need_*`` flag is False is not computed and returned as None. ``inplace``: the results overwrite q and k
    (each row is read before it is written, by the same program), which are returned; q and k must then be
    separate tensors whose elements do not overlap (no expanded or aliasing views), or rows race. ``out``: None, or
    ``(q_out, k_out)`` to write into instead (q's and k's shapes, any strides, not overlapping q or k; the
    LoRA q / k / v node's backward writes dq, dk into its (tokens, heads x head_dim) buffers this way). ``mode``:
    :func:`~tigon.kernels._common.launch_mode` of q's device as the caller has it (:class:`RoPEFunction`'s backward
    passes its forward's), or None: asked here.
    """
    if out is not None:
        qo, ko = (out[0] if need_q else None), (out[1] if need_k else None)
    else:
        qo = (q if inplace else torch.empty_like(q)) if need_q else None
        ko = (k if inplace else torch.empty_like(k)) if need_k else None
    if unsqueeze_dim == 1:  # (B, H, T, D) already: _heads_first's shapes and strides, inline
        (B, HQ, T, D), sq = q.shape, q.stride()
        HKV, sk = k.shape[1], k.stride()
        sqo = qo.stride() if need_q else sq
        sko = ko.stride() if need_k else sk
    else:
        (B, HQ, T, D), sq = _heads_first(q, unsqueeze_dim)
        (_, HKV, _, _), sk = _heads_first(k, unsqueeze_dim)
        sqo = _heads_first(qo, unsqueeze_dim)[1] if need_q else sq
        sko = _heads_first(ko, unsqueeze_dim)[1] if need_k else sk
    if B * T == 0 or (qo is None and ko is None):
        return qo, ko
    half = cos.shape[-1] // 2
    rest = 0 if inplace else D - 2 * half  # in place, the passed-through dims are already where they belong
    nq = B * T * HQ if need_q else 0
    nk = B * T * HKV if need_k else 0
    dev = q.device
    if mode is None:
        mode = launch_mode(dev)  # (compiled_cuda(dev) and launcher(_rope_kernel), in one call)
    block_half, block_r, warps, progs_q, grid = _launch(half, nq, nk, dev, mode.compiled, _rows_config)
    sc_s, ss_s = (cos.stride(0), sin.stride(0)) if sections else (0, 0)
    if sections:  # the strides of one section's (1 or B, T, R) table
        cos, sin = cos[0], sin[0]
    sc, ss = cos.stride(), sin.stride()
    pairs_in, pairs_out = pairs != PAIRS_HALVES, pairs in (PAIRS_INTERLEAVED, PAIRS_EXPANDED)
    if backward:  # the transpose reads the output's layout and writes the input's
        pairs_in, pairs_out = pairs_out, pairs_in
    mode[_rope_kernel][grid](
        q, k, qo if need_q else q, ko if need_k else k, cos, sin, T, HQ, HKV, nq, nk, progs_q, *sq, *sk, *sqo, *sko,
        0 if cos.shape[0] == 1 else sc[0], sc[1], sc[2], 0 if sin.shape[0] == 1 else ss[0], ss[1], ss[2], sc_s, ss_s,
        HALF=half, BLOCK_HALF=block_half, PASS=rest, BLOCK_PASS=next_pow2(rest) if rest else 1, BLOCK_R=block_r,
        BACKWARD=backward,
        ROW64=max(nq, nk) + block_r >= 2**31, X_PAIRS=pairs_in, Y_PAIRS=pairs_out,
        SHARED=pairs in (PAIRS_INTERLEAVED, PAIRS_DEINTERLEAVE), SEC0=sections[0] if sections else 0,
        SEC1=sections[1] if sections else 0, TABLE_PAIRS=pairs == PAIRS_EXPANDED, MROPE=bool(sections),
        num_warps=warps,
    )
    return qo, ko


@functools.lru_cache(maxsize=1024)
def _launch(half: int, nq: int, nk: int, device: torch.device, compiled: bool, rows_config) -> tuple:
    """(BLOCK_HALF, BLOCK_R, num_warps, q's programs, grid) of :func:`rope_apply` for ``nq`` / ``nk`` rows of q / k,
    cached per sizes, device, whether the kernels run compiled and ``rows_config`` (:func:`_rows_config`, passed by
    the caller so that replacing it, as tests do, is a new key)."""
    block_half = next_pow2(half)
    block_r, warps = rows_config(block_half, device)
    if not compiled:  # the interpreter computes the whole tile: no more rows than q or k has
        block_r = min(block_r, next_pow2(max(nq, nk, 1)))
    progs_q = cdiv(nq, block_r)
    return block_half, block_r, warps, progs_q, (progs_q + cdiv(nk, block_r),)


class RoPEFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(q, k, cos, sin, unsqueeze_dim, pairs=0, sections=())`` (see :func:`rope_apply`).
    cos and sin receive no gradient (None)."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, unsqueeze_dim, pairs=PAIRS_HALVES, sections=()):
        ctx.mode = mode = launch_mode(q.device)  # (kept for the backward's launch: one call less there)
        q_embed, k_embed = rope_apply(q, k, cos, sin, unsqueeze_dim, backward=False, pairs=pairs, sections=sections,
                                      mode=mode)
        ctx.to_save = (cos, sin)  # (ctx.save_for_backward(cos, sin), inline: all it does; one Python frame less)
        ctx.unsqueeze_dim, ctx.pairs, ctx.sections = unsqueeze_dim, pairs, sections
        return q_embed, k_embed

    @staticmethod
    def backward(ctx, dq_embed, dk_embed):
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(RoPEFunction.backward, ctx, dq_embed, dk_embed, linear=True)
        cos, sin = ctx.saved_tensors
        need_q, need_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dq, dk = rope_apply(dq_embed, dk_embed, cos, sin, ctx.unsqueeze_dim, backward=True,
                            need_q=need_q, need_k=need_k, pairs=ctx.pairs, sections=ctx.sections, mode=ctx.mode)
        return dq, dk, None, None, None, None, None


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::rope", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int, backward: bool, need_q: bool,
          need_k: bool, pairs: int = 0, sections: list[int] | None = None) -> tuple[Tensor, Tensor]:
    """The rotation of q and k (``backward=False``) or its transpose (``backward=True``); ``pairs`` and
    ``sections``: the layout variants of :func:`rope_apply`.

    Returns outputs shaped, typed and (when dense) strided like q and k (``torch.empty_like``); (0,) for an output
    whose ``need_*`` is False. The transpose of the transpose is the rotation, so this op is its own backward.
    """
    qo, ko = rope_apply(q, k, cos, sin, unsqueeze_dim, backward=backward, need_q=need_q, need_k=need_k,
                        pairs=pairs, sections=tuple(sections or ()))
    return or_empty(qo, q), or_empty(ko, k)


@_rope.register_fake
def _(q, k, cos, sin, unsqueeze_dim, backward, need_q, need_k, pairs=0, sections=None):
    return (torch.empty_like(q) if need_q else q.new_empty((0,)),
            torch.empty_like(k) if need_k else k.new_empty((0,)))


def _rope_setup(ctx, inputs, output):
    _q, _k, cos, sin, unsqueeze_dim, backward, _nq, _nk, pairs, sections = inputs
    ctx.save_for_backward(cos, sin)
    ctx.unsqueeze_dim, ctx.backward, ctx.pairs, ctx.sections = unsqueeze_dim, backward, pairs, sections


def _rope_grad(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    need_q, need_k = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gq, gk = _rope(dq, dk, cos, sin, ctx.unsqueeze_dim, not ctx.backward, need_q, need_k, ctx.pairs,
                   ctx.sections)
    return if_wanted(gq, need_q), if_wanted(gk, need_k), None, None, None, None, None, None, None, None


_rope.register_autograd(_rope_grad, setup_context=_rope_setup)


def compiled_rope(q, k, cos, sin, unsqueeze_dim, pairs=PAIRS_HALVES, sections=()):
    """``RoPEFunction.apply`` as the ``tigon::rope`` custom op: (q_embed, k_embed)."""
    return _rope(q, k, cos, sin, unsqueeze_dim, False, True, True, pairs, list(sections) or None)
