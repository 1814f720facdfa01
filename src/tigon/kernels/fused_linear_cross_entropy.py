"""Fused linear + cross-entropy: the LM-head loss without the (N, V) logits.

The approach of Liger-Kernel's fused linear cross-entropy (Hsu et al. 2024) and, in spirit, Apple's Cut
Cross-Entropy (Wijmans et al. 2024): tokens are processed in chunks of ``rows`` so that only a (rows, V)
logits buffer ever exists. Per chunk:

1. ``logits = hidden_chunk @ weight.T (+ bias)`` by torch (cuBLAS), ``out=`` the preallocated chunk buffer;
2. the cross-entropy Triton kernel of :mod:`tigon.kernels.loss_rows` reads the chunk (fp32 math, online
   log-sum-exp over vocabulary blocks), writes per-token loss / lse, and - when gradients are wanted - a
   second pass overwrites the chunk buffer in place with ``d loss / d logits`` (``logit_scale`` and the
   soft-cap derivative included);
3. ``grad_hidden_chunk = grad_logits @ weight`` and ``grad_weight += grad_logits.T @ hidden_chunk`` (and
   ``grad_bias += grad_logits.sum(0)``), accumulated in fp32 buffers and cast to the parameters' dtypes at
   the end.

For a scalar loss (mean / sum) the gradients are computed during the forward (3 matmuls in all) for an upstream gradient
of 1 and scaled by the real upstream scalar in backward. For ``reduction="none"`` only the per-token row statistics
(max, log-sum) are saved; the backward recomputes the logits chunk by chunk and applies the per-token upstream gradient
(4 matmuls in all). Under ``torch.no_grad`` (or when nothing needs a gradient) only the loss is computed. The caller's
tensors are never written.

Low-memory accumulation (``lean``, ``accum_dtype=`` the weight's dtype in
:func:`tigon.functional.fused_linear_cross_entropy`): grad_hidden and grad_weight are written straight into tensors of
the parameters' dtypes, grad_weight accumulated chunk after chunk by cuBLAS (``beta=1``: one rounding per chunk), and
chunks hold at most ``LEAN_CHUNK_ELEMS`` logits. Peak extra memory is then about the gradients themselves plus 64 MiB,
as Liger-Kernel's; the price is that rounding per chunk (see the function's docstring for the measured error).
``memory="low"`` takes the exact plan of :mod:`tigon.kernels.flce_sliced` instead where it applies (``sliced``): the
same peak, no rounding per chunk, one matmul more.

Ignored tokens: where at least 1/32 of the rows are ignored and the head is big enough to pay for a host sync, the
chunks run over the kept rows only, gathered (:mod:`tigon.kernels.ignored_rows`); grad_hidden's ignored rows are
zeros and the per-token outputs are what the kernels give an ignored row.

Matmul precision and the fp32 accumulators: :mod:`tigon.kernels.head_grads`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from ._common import CUSTOM_OP_TAGS, cdiv, compiled_cuda, if_wanted, num_items_tensor, or_empty
from .first_order import first_order
from .flce_sliced import default_spare_bytes, sliced_applies, sliced_backward_rows, sliced_forward
from . import ignored_rows
from .ignored_rows import compact_outputs, kept_for_chunks, placed, scatter_outputs
from .head_grads import _fp32_out_supported, _Matmuls, _operands, finish_grads, grad_buffers, no_autocast, scale_grads
from .loss_reduce import reduce_losses
from .loss_rows import (
    LossOptions, ce_rows_backward, ce_rows_forward, class_weight_args, row_stats,
)

# Chunk size (tokens per chunk). Each chunk adds grad_logits.T @ hidden_chunk into the (V, H) fp32 grad_weight
# buffer, which costs a read and a write of that buffer (8*V*H bytes) for 2*rows*V*H FLOPs: rows/4 FLOP per
# byte. The H200 needs ~200 FLOP/B to stay matmul-bound, so chunks should hold ~1000 tokens. We take as many rows
# as a memory budget allows, and at least H/2 (and MIN_CHUNK_ROWS_CUDA): the loss's peak extra memory is the fp32
# accumulator plus the chunk buffer (4VH + rows*V*2 bytes in bf16; the cast at the end writes into the
# accumulator's own memory, see RowHalves, where a new tensor would add to that peak:
# head_grads.cast_in_place_pays), and FLCE_BUDGET_BYTES_CUDA (3 GiB, torch.compile's peak extra memory at
# Llama-3-8B's head) bounds the sum; where the accumulator alone exceeds it, chunks shrink to H/2 rows and no
# further, since every chunk beyond the minimum costs one more read and write of the accumulator (8VH bytes: about
# 1.7 ms at Gemma-2's 256k x 3584 head). At 8192 tokens: Llama-3 (128k vocabulary) 2 chunks, Qwen2 (152k) 3,
# Gemma-2 (256k) 5. The rule was rows = H within that budget until small heads showed it too small: Qwen2.5-0.5B
# (896 -> 151936), fwd+bwd kernel time (benchmarks/results/h200/tune-fused_linear_cross_entropy_qwen2.5-0.5b_h200_
# 20261202.json), at 4096 / 16384 tokens: rows 896 (5 / 19 chunks) 8.86 / 29.90 ms, 2048 rows 7.03 / 26.88, 4096
# 6.68 / 25.76, 8192 6.80 / 25.46, against torch.compile's 6.74 / 26.72 ms (5.3 GB extra at 16k); the budget rule
# gives one chunk at 4k and two at 16k there, and the same chunks as before at the three larger heads. End to end (4
# layers, 4 x 2048 tokens, AdamW; benchmarks/results/h200/session5/e2e_gemma2-9b_4l_chunk2p*.json) Gemma-2's peak
# went 26.63 / 26.30 / 26.11 GiB for 3 / 4 / 5 chunks (Liger-Kernel: 26.20) at 40.95k / 39.99k / 39.41k tokens/s.
# MAX_CHUNK_ELEMS_CUDA (2**30 logits) only guards absurd shapes. On CPU / under the interpreter a small cap keeps
# memory low; tests lower these to force several chunks.
# Measured on an H200 (torch 2.11, bf16, mean loss, forward + backward; benchmarks/results/h200/flce_h200.json):
#   N=8K, H=4K, V=128K: rows 1024 / 2048 / 4096 / 8192 -> 45.4 / 42.6 / 40.5 / 41.2 ms; peak extra memory
#                       3.35 GB for all but 8192 rows (4.34 GB). torch.compile 39.2 ms, 3.0 GiB.
#   Earlier: N=16K, H=2K, V=256K: 256-row chunks 166.7 ms; rows=H (1024) 96.7 ms; torch 129.3 ms.
# Low-memory accumulation (``lean``: grad_weight accumulated in the weight's dtype, no fp32 buffer) keeps the
# chunk buffer at max(LEAN_CHUNK_ELEMS, N*H) logits: 64 MiB in bf16, or as large as the hidden states themselves
# for long batches, Liger-Kernel's rule (V/H chunks of N/(V/H) rows), so that the number of chunks, each re-reading
# and re-writing grad_weight, stays about V/H. (At N=32K, H=4K, V=128K a fixed 64 MiB chunk measured 220.6 ms
# against Liger's 162.9 ms with this rule; the rule itself is not yet measured here.)
# Measured (same file, N=8K, H=4K, V=128K): 2**24 / 2**25 / 2**26 / 2**27 logits (128 .. 1024 rows) ->
# 91.9 / 55.4 / 45.7 / 41.9 ms, peak extra 1.07 / 1.10 / 1.16 / 1.29 GiB: every chunk re-reads and re-writes the
# whole bf16 grad_weight, so small chunks are bandwidth-bound.
# A frozen head (LoRA fine-tuning: the LM head gets no gradient) has no accumulator to re-read per chunk, so the
# argument for big chunks above is gone: a chunk costs its two matmuls (logits, and grad_hidden = grad_logits W),
# which stay matmul-bound at a few hundred rows (2 x rows x H x V FLOPs each; 1024 x 4096 x 128256 is 1.1 TFLOP),
# and one elementwise pass over its logits, the same bytes in total however the tokens are cut. The budget's
# 3 GiB then only holds the chunk buffer, one chunk of every token (1.0 GB at 4096 x 128256 in bf16: Tigon's
# 0.84 GiB over Liger-Kernel's peak in the LoRA row of issue 25, whose chunks are ~128 rows). Chunks of a frozen
# head hold at most FROZEN_CHUNK_ELEMS_CUDA logits (512 MiB in bf16: 2 chunks of 2048 rows at 4096 x 128256), and
# at least MIN_CHUNK_ROWS_CUDA rows. H200, 8192 x 4096 -> 128256 frozen, fwd + bwd (the memory= option reproduces
# the old rule: memory=3 << 30): one chunk 26.0 ms / 2.43 GiB extra; 1 << 27 logits a chunk 27.0-30.1 ms / 0.62 GiB
# (LoRA row: 1.09x Liger at 9.06 GiB against its 9.81); 1 << 28 splits the difference.
# With the fp32 accumulator, token chunks (align <= 1) hold at most ACC_CHUNK_ROWS_CUDA rows: past ~4096 rows fewer
# accumulator passes stop paying (above: Llama-3-8B 2 x 4096 rows 40.5 ms, one 8192-row chunk 41.2; Qwen2.5-0.5B, 16k
# tokens, 4 x 4096 25.76 ms, 2 x 8192 25.46: results/h200/tune-fused_linear_cross_entropy_qwen2.5-0.5b_h200_20261202
# .log) while the buffer grows V * 2 bytes a row: Llama-3.2-1B's one 8192-row chunk
# (2.10 GB beside the 1.05 GB accumulator) was issue 26's 0.38 GiB over Liger's step peak (benchmarks/step_memory.py).
MAX_CHUNK_ELEMS_CUDA = 1 << 30
ACC_CHUNK_ROWS_CUDA = 4096
FLCE_BUDGET_BYTES_CUDA = 3 << 30
FROZEN_CHUNK_ELEMS_CUDA = 1 << 28
MIN_CHUNK_ROWS_CUDA = 256
MAX_CHUNK_ELEMS_CPU = 1 << 18
LEAN_CHUNK_ELEMS = 1 << 25
LEAN_MIN_ROWS = 128


def chunk_rows(n: int, vocab: int, hidden: int, device: torch.device, lean: bool = False,
               fp32_weight_grad: bool = False, elem_bytes: int = 2, budget: int = -1, align: int = 1, *,
               frozen_weight: bool = False, row_bytes: int = 0, cap: bool = False) -> int:
    """Tokens per chunk for ``n`` tokens, a (vocab, hidden) LM head on ``device`` (see the constants above; ``lean``:
    the low-memory accumulation's budget; ``fp32_weight_grad``: a (vocab, hidden) fp32 accumulator shares
    FLCE_BUDGET_BYTES_CUDA with the chunk buffer of ``elem_bytes`` per logit), balanced over the chunks, a multiple
    of 16 if possible. ``budget`` >= 0 (bytes, the ``memory=`` option): the chunk buffer and the fp32 accumulator
    fit in it instead, on any device, down to a floor of 16 rows. ``align`` > 1: whole groups of ``align`` rows
    (sequences), balanced over the fewest chunks that hold them; 0 when one group exceeds the rule.
    ``frozen_weight``: no weight gradient is formed (a frozen head), so the default rule on CUDA caps a chunk at
    FROZEN_CHUNK_ELEMS_CUDA logits (see above); with ``fp32_weight_grad`` it takes at most ACC_CHUNK_ROWS_CUDA rows
    (or H/2 where that is more) unless ``align`` > 1 or ``cap``. ``row_bytes``: what each row of a chunk costs beside
    its logits (gathered rows: the formed passes' kept rows), counted where the rule is a budget in bytes
    (``budget`` >= 0, or the default rule's FLCE_BUDGET_BYTES_CUDA). ``cap``: the most rows a chunk may hold (>= 1)
    instead, before balancing (``align`` not read)."""
    if budget >= 0:
        spare = budget - (4 * vocab * hidden if fp32_weight_grad else 0)
        max_rows = max(16, spare // max(vocab * elem_bytes + row_bytes, 1))
        max_rows = max(16, max_rows // 16 * 16)
    elif compiled_cuda(device):
        if lean:
            max_rows = max(LEAN_MIN_ROWS, max(LEAN_CHUNK_ELEMS, n * hidden) // max(vocab, 1))
        else:
            # as many rows as the budget leaves beside the fp32 accumulator, never under H/2 (MIN_CHUNK_ROWS_CUDA)
            spare = FLCE_BUDGET_BYTES_CUDA - (4 * vocab * hidden if fp32_weight_grad else 0)
            floor = max(hidden // 2, MIN_CHUNK_ROWS_CUDA)
            max_rows = max(floor, spare // max(vocab * elem_bytes + row_bytes, 1))
            max_rows = min(max_rows, MAX_CHUNK_ELEMS_CUDA // max(vocab, 1))
            if fp32_weight_grad and align <= 1 and not cap:
                max_rows = min(max_rows, max(floor, ACC_CHUNK_ROWS_CUDA))
            if frozen_weight:
                max_rows = min(max_rows, max(MIN_CHUNK_ROWS_CUDA, FROZEN_CHUNK_ELEMS_CUDA // max(vocab, 1)))
        max_rows = max(16, max_rows // 16 * 16)  # tensor-core friendly row counts
    else:
        max_rows = MAX_CHUNK_ELEMS_CPU // max(vocab, 1)
    max_rows = max(1, max_rows)
    if cap:
        return max_rows
    if n <= max_rows:
        return max(n, 1)
    if align > 1:
        groups, per_chunk = cdiv(n, align), max_rows // align
        return cdiv(groups, cdiv(groups, per_chunk)) * align if per_chunk else 0
    rows = cdiv(n, cdiv(n, max_rows))
    rows16 = cdiv(rows, 16) * 16
    return rows16 if rows16 <= max_rows else rows


def grads_in_forward(reduction: str, need: tuple[bool, bool, bool]) -> bool:
    """Whether :func:`flce_forward` forms the gradients (for an upstream gradient of 1): for a scalar loss
    (``reduction`` "mean" / "sum"; num_items_in_batch is only accepted with those) when any of ``need`` (grad
    for hidden, weight, bias) is set. The one statement of that rule, for the eager and the compiled paths."""
    return reduction != "none" and any(need)


def flce_forward(hidden, weight, target, bias, class_weight, opts: LossOptions, reduction: str, num_items,
                 cd: torch.dtype, need: tuple[bool, bool, bool], want_acc: bool, lean: bool = False,
                 halves: bool = False, budget: int = -1, pred: torch.Tensor | None = None, zero_acc: bool = True,
                 sliced: bool = False, fold_out: torch.Tensor | None = None):
    """Loss pass over the chunks; for a scalar reduction with ``any(need)`` also the unscaled gradients.
    ``pred``: an (N,) int64 tensor to write each token's argmax class into (-1 for ignored tokens), or None.
    ``zero_acc=False``: accuracy None (not a 0-d zero) unless ``want_acc`` (one allocation fewer).

    ``lean``: low-memory accumulation (see :func:`grad_buffers`, :data:`LEAN_CHUNK_ELEMS`); ``budget``: bytes for
    the chunk buffer and the fp32 accumulator (-1: the default rule; :func:`chunk_rows`); ``sliced``: with ``lean``,
    the exact low-memory plan of :mod:`tigon.kernels.flce_sliced` where it applies (its spare buffer: ``budget``
    bytes, or :func:`~tigon.kernels.flce_sliced.default_spare_bytes` for -1); ``halves``: see
    :func:`grad_buffers` (grad_weight then comes back as a :class:`RowHalves` for :func:`scale_grads`);
    ``fold_out``: a (1,) fp32 tensor holding 1, for the float16 rule below.
    Returns (loss, z_loss, accuracy (0-d zero unless ``want_acc``; (N,) hits for "none"), stats (N, 2) fp32 (the
    rows' max and log-sum: :func:`tigon.kernels.loss_rows.row_stats`), grads (gh, gw, gb) or None).

    Float16 with fp32 accumulators (the default plan, ``fold_out`` given): the logits' gradient is formed without
    the division by the token count (the z-loss's scale: 1 / the count, 1 / num_items_in_batch, 1 for a sum), which
    goes into ``fold_out`` for the backward to multiply with the upstream gradient, so that the float16 chunk holds
    O(1) values (class weights relative to their mean): divided by the token count first, its small terms underflow
    where the unfused computation, multiplied by a GradScaler scale first, keeps them (tests/test_flce_fp16.py). The
    lean and sliced plans write float16 gradients directly and keep the scale in the chunk (their sums would risk
    overflow).
    """
    n, hdim = hidden.shape
    vocab = weight.shape[0]
    dev = hidden.device
    h, w, b = _operands(hidden, weight, bias, cd)
    target = target.contiguous()
    cw, cw_sum = class_weight_args(class_weight, dev)
    precompute = grads_in_forward(reduction, need)
    # the gradients' scale is needed before the chunks (the loss itself is reduced after them)
    scale = reduce_losses(target, cw, opts.ignore_index, vocab, reduction, num_items)[3] if precompute else None
    f32 = dict(dtype=torch.float32, device=dev)
    loss_rows, z_rows, stats = torch.empty(n, **f32), torch.empty(n, **f32), row_stats(n, dev)
    correct = torch.empty(n, **f32) if want_acc else None
    chunk_scale = scale
    if (fold_out is not None and precompute and cd == torch.float16 and not lean
            and (dev.type != "cuda" or _fp32_out_supported(dev, cd))):
        # the z-loss's scale (1 / the token count, or 1 / num_items_in_batch; 1 for a sum) leaves the chunk: it holds
        # (count / sum of class weights) * w_t terms, O(1) whatever the weights' size, and the z term even where the
        # weights sum to 0. Not where cuBLAS cannot write fp32 products (old torch): they would pass through fp16.
        fold_out.copy_(scale[1:])
        chunk_scale = torch.where(fold_out != 0, scale / fold_out, 0.0)
    if sliced and lean and precompute and sliced_applies(hidden, weight, bias, class_weight, opts, cd, need):
        spare = budget if budget >= 0 else default_spare_bytes(n, hdim, cd.itemsize)
        with no_autocast(dev):
            grads = sliced_forward(h, w, b, target, opts, scale, need, loss_rows, z_rows, stats, correct, pred, spare)
        loss, z, acc, _ = reduce_losses(target, cw, opts.ignore_index, vocab, reduction, num_items, loss_rows,
                                        z_rows, correct, zero_acc=zero_acc, scale_out=scale)
        return loss, z, acc, stats, grads
    # the rows whose target is not ignored (ignored_rows.kept_for_chunks: left out of the matmuls where that pays;
    # None: all rows); the size is checked here first so that a small head makes no call at all (host time of a
    # host-bound step)
    big = n * vocab * hdim >= ignored_rows.SKIP_MIN_MACS
    idx = kept_for_chunks(target, opts.ignore_index, vocab, hdim, lean or budget >= 0) if big else None
    if idx is None:
        m, h_run, t_run, outs = n, h, target, (loss_rows, z_rows, stats, correct, pred)
    else:
        m, h_run, t_run = idx.numel(), h.index_select(0, idx), target.index_select(0, idx)
        outs = compact_outputs(idx, loss_rows, z_rows, stats, correct, pred)
    # lean (memory="low"): Liger's chunk rule for the loss alone too (reduction="none" and no-grad calls), so that
    # the forward stays at that peak as well
    rows = chunk_rows(m, vocab, hdim, dev, lean, precompute and need[1] and not lean, cd.itemsize, budget,
                      frozen_weight=not need[1])
    gh, gw, gb = (grad_buffers(n, hidden, weight, cd, need, lean, True, halves, rows * vocab * cd.itemsize)
                  if precompute else (None,) * 3)
    gh_part = None
    if gh is not None and idx is not None:  # kept rows' grad_hidden, chunk by chunk, then into their rows
        gh.zero_()
        gh_part = torch.empty((rows, hdim), dtype=gh.dtype, device=dev)
    buf = torch.empty(size=(rows, vocab), dtype=cd, device=dev)
    with no_autocast(dev):
        mm = _Matmuls(dev, cd)
        for s in range(0, m, rows):
            e = min(s + rows, m)
            if e - s == m:  # one chunk: the tensors themselves (slice ops cost a few us of host time each)
                hs, tg, (lr, zr, st, cr, pr), gr = h_run, t_run, outs, gh
            else:
                hs, tg, lr, zr, st = h_run[s:e], t_run[s:e], outs[0][s:e], outs[1][s:e], outs[2][s:e]
                cr = outs[3][s:e] if outs[3] is not None else None
                pr = outs[4][s:e] if outs[4] is not None else None
                gr = gh[s:e] if gh is not None else None
            if gh_part is not None:
                gr = gh_part[: e - s]
            lg = buf if e - s == rows else buf[: e - s]
            mm.logits(lg, hs, w, b)
            ce_rows_forward(lg, tg, cw, cw_sum, opts, lr, zr, st, cr, grad_scales=chunk_scale, grad_out=lg,
                            out_pred=pr)
            if precompute:
                mm.chunk_grads(lg, hs, w, gr, gw, gb, s == 0)
                if gh_part is not None:
                    gh.index_copy_(0, idx[s:e], gr)
    if idx is not None:
        scatter_outputs(idx, (loss_rows, z_rows, stats, correct, pred), outs, vocab)
    loss, z, acc, _ = reduce_losses(target, cw, opts.ignore_index, vocab, reduction, num_items, loss_rows, z_rows,
                                    correct, zero_acc=zero_acc, scale_out=scale)
    return loss, z, acc, stats, ((gh, gw, gb) if precompute else None)


def flce_backward_rows(grad_rows, hidden, weight, target, bias, class_weight, stats, opts: LossOptions,
                       cd: torch.dtype, need: tuple[bool, bool, bool], lean: bool = False, halves: bool = False,
                       budget: int = -1, sliced: bool = False):
    """Backward for reduction="none": recompute each logits chunk and apply the per-token upstream gradient.
    ``lean``, ``halves``, ``budget``, ``sliced``: as :func:`flce_forward`.

    Returns (grad_hidden, grad_weight, grad_bias) in the inputs' dtypes (None where not needed).
    """
    if sliced and lean and sliced_applies(hidden, weight, bias, class_weight, opts, cd, need):
        n = hidden.shape[0]
        spare = budget if budget >= 0 else default_spare_bytes(n, hidden.shape[1], cd.itemsize)
        h, w, b = _operands(hidden, weight, bias, cd)
        with no_autocast(hidden.device):
            grads = sliced_backward_rows(grad_rows, h, w, b, target, stats, opts, need, spare)
        return finish_grads(grads, None, (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None))
    cw, cw_sum = class_weight_args(class_weight, hidden.device)
    coef = grad_rows.to(torch.float32)
    kept = kept_for_chunks(target, opts.ignore_index, *weight.shape, lean or budget >= 0)
    if kept is not None:
        target, stats, coef = target.index_select(0, kept), stats.index_select(0, kept), coef.index_select(0, kept)

    def rows_grad(lg, s, e):
        ce_rows_backward(lg, target[s:e], cw, cw_sum, stats[s:e], opts, coef[s:e], lg)

    return backward_over_chunks(hidden, weight, bias, cd, need, lean, halves, budget, rows_grad, kept=kept)


def loop_rows(hidden, weight, cd: torch.dtype, need: tuple[bool, bool, bool], lean: bool, budget: int,
              elem_bytes: int | None = None, align: int = 1) -> int:
    """The rows per chunk :func:`backward_over_chunks` takes for these arguments (:func:`chunk_rows`), whole groups of
    ``align`` rows (chunks that hold whole sequences of ``align`` tokens); 0 when one such group exceeds the chunk
    rule (the caller then needs another plan)."""
    n, hdim = hidden.shape
    return chunk_rows(n, weight.shape[0], hdim, hidden.device, lean, need[1] and not lean, elem_bytes or cd.itemsize,
                      budget, align, frozen_weight=not need[1])


def loop_cap(hidden, weight, cd: torch.dtype, need: tuple[bool, bool, bool], lean: bool, budget: int, *,
             n: int | None = None, row_bytes: int = 0) -> int:
    """The most rows a chunk of :func:`backward_over_chunks` may hold for these arguments (:func:`chunk_rows`' cap) when
    it runs ``n`` rows (default: ``hidden``'s), each costing ``row_bytes`` beside its logits: the bound of the
    explicit chunks its ``bounds`` take (:func:`tigon.kernels.ignored_rows.group_cuts`)."""
    n = hidden.shape[0] if n is None else n
    return chunk_rows(n, weight.shape[0], hidden.shape[1], hidden.device, lean, need[1] and not lean, cd.itemsize,
                      budget, frozen_weight=not need[1], row_bytes=row_bytes, cap=True)


def backward_over_chunks(hidden, weight, bias, cd: torch.dtype, need: tuple[bool, bool, bool], lean: bool,
                         halves: bool, budget: int, rows_grad, *, elem_bytes: int | None = None,
                         scalar: bool = False, align: int = 1, before=None,
                         kept: torch.Tensor | None = None, bounds: list[int] | None = None,
                         formed: bool = False) -> tuple:
    """The backward of a per-token loss of the LM head's logits, chunk by chunk: each (rows, V) chunk of logits
    ``hidden[s:e] @ weight.T (+ bias)`` is recomputed into one buffer, ``rows_grad(chunk, s, e)`` overwrites it with
    the gradient w.r.t. those logits, and the chunk's matmuls add it into grad_hidden / grad_weight / grad_bias.
    ``lean``, ``halves``, ``budget``: as :func:`flce_forward`. Returns (grad_hidden, grad_weight, grad_bias) in the
    inputs' dtypes (None where ``need`` says not).

    A loss whose gradient is formed in its forward (the fused linear JSD) runs this loop there: ``rows_grad`` then
    also writes the chunk's loss, ``scalar`` returns the unscaled accumulators of :func:`grad_buffers`' scalar path
    (for :func:`scale_grads`), and ``elem_bytes`` (default: the compute dtype's size) is what each logit of a chunk
    costs in memory for :func:`chunk_rows`, ``rows_grad``'s own (rows, V) buffers included. ``align``: every chunk
    holds whole groups of ``align`` rows (a loss coupling the tokens of a sequence; :func:`loop_rows` must be > 0).
    ``before(chunk, s, e)``: called with each chunk's buffer before its logits are formed there, for work that may use
    the buffer first (a reference model's logits of the same rows:
    :func:`tigon.ops.preference_formed.formed_pair_loss`).
    ``kept``: the (K,) indices of the rows that are not ignored (:func:`tigon.kernels.ignored_rows.kept_rows`), or
    more generally of the rows to run, in the order to run them (each at most once): the chunks then run over those rows
    only, each chunk's rows gathered into a (rows, H) buffer (``hidden`` of any strides), ``rows_grad``'s and
    ``before``'s [s, e) index them (the caller passes its per-row tensors compacted alike), and grad_hidden's other rows
    are zeros. ``formed`` (the passes that form a loss's gradients in its forward,
    :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`; with ``scalar``): grad_hidden in the dtype
    :func:`grad_buffers`' ``formed`` gives, and with ``kept`` its rows run accumulate in their own (K, H) buffer, in the
    order run, each chunk's written in place (no (rows, H) buffer of them, no zero fill during the loop), and go to
    their rows of an (N, H) grad_hidden once the chunk buffer is free. ``bounds``: explicit chunks instead of the
    rule's, [bounds[j], bounds[j + 1]) over the rows run (the kept rows with ``kept``): an int list from 0 to that
    count, strictly increasing (whole groups of rows of varying sizes: :func:`tigon.kernels.ignored_rows.group_cuts`;
    within :func:`loop_cap` for the same arguments); ``align`` is then not read.

    Deferred gradients (a unit of rows split over several chunks, whose gradient needs the whole unit's forward:
    :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`' ``pieces``): ``rows_grad`` may return
    False, the chunk's gradient not known yet (no gradient matmul: its logits are formed for the forward alone), or
    a list of earlier chunks' (s, e) whose gradients it now knows: after this chunk's matmuls, each of those has its
    logits formed again (no ``before``), ``rows_grad(chunk, s, e)`` (which then returns None) and its matmuls. None:
    the chunk's gradient, as above."""
    n = hidden.shape[0]
    vocab = weight.shape[0]
    dev = hidden.device
    h, w, b = _operands(hidden, weight, bias, cd, contiguous=kept is None)
    m = n if kept is None else kept.numel()
    if bounds is None:
        rows = max(1, loop_rows(h if kept is None else h[:m], weight, cd, need, lean, budget, elem_bytes, align))
        starts = range(0, m, rows)
    else:
        rows, starts = max(e - s for s, e in zip(bounds, bounds[1:])), bounds[:-1]
    compact = formed and kept is not None  # grad_hidden of the rows run, in their order (placed after the loop)
    gh, gw, gb = grad_buffers(n, hidden, weight, cd, need, lean, scalar, halves, rows * vocab * cd.itemsize,
                              formed=formed, gh_rows=m if compact else n)
    part = hbuf = None
    if kept is not None:  # each chunk's kept rows gathered, and their grad_hidden then scattered into their rows
        hbuf = torch.empty((rows, h.shape[1]), dtype=h.dtype, device=dev)
        if gh is not None and not compact:
            gh.zero_()
            part = torch.empty((rows, gh.shape[1]), dtype=gh.dtype, device=dev)
    buf = torch.empty(size=(rows, vocab), dtype=cd, device=dev)
    wrote = [False]  # whether a chunk's grad_weight was written (the first one written sets gw)

    def rows_of(s, e):
        one = e - s == m  # one chunk of every row run: no slice ops
        lg = buf if e - s == rows else buf[: e - s]
        if hbuf is not None:
            return one, lg, torch.index_select(h, 0, kept[s:e], out=hbuf[: e - s])
        return one, lg, h if one else h[s:e]

    def grads_of(lg, hs, s, e, one):
        gr = part[: e - s] if part is not None else gh if one or gh is None else gh[s:e]
        mm.chunk_grads(lg, hs, w, gr, gw, gb, not wrote[0])
        wrote[0] = True
        if part is not None:
            gh.index_copy_(0, kept[s:e], gr)

    with no_autocast(dev):
        mm = _Matmuls(dev, cd)
        for j, s in enumerate(starts):
            e = min(s + rows, m) if bounds is None else bounds[j + 1]
            one, lg, hs = rows_of(s, e)
            if before is not None:
                before(lg, s, e)
            mm.logits(lg, hs, w, b)
            redo = rows_grad(lg, s, e)
            if redo is False:
                continue
            grads_of(lg, hs, s, e, one)
            for s2, e2 in redo or ():  # earlier chunks whose gradients are known now: their logits again
                one, lg, hs = rows_of(s2, e2)
                mm.logits(lg, hs, w, b)
                rows_grad(lg, s2, e2)
                grads_of(lg, hs, s2, e2, one)
    buf = lg = hs = hbuf = None  # the chunk buffer is free before the casts (grad_buffers counted on it) or placing
    if compact and gh is not None:
        gh = placed(gh, kept, n)
    if scalar:
        return gh, gw, gb
    return finish_grads((gh, gw, gb), None, (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None))


class FlceCall(NamedTuple):
    """The scalar options of one fused linear cross-entropy call, built once per distinct set of options and reused
    by every call with the same ones (:func:`tigon.ops.fused_linear_cross_entropy.fused_linear_cross_entropy`'s
    cache): fewer arguments for autograd to unpack, no option objects built per call."""

    opts: LossOptions
    reduction: str
    want_acc: bool
    lean: bool
    budget: int
    want_pred: bool
    sliced: bool = False  # with lean: the exact low-memory plan (tigon.kernels.flce_sliced) where it applies


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    """autograd wrapper; ``apply(hidden, weight, target, bias, class_weight, num_items, cd, need, call)``. ``need`` =
    (grad for hidden, weight, bias) decided by the caller (grad mode and requires_grad), ``cd`` the matmul dtype,
    ``call`` a :class:`FlceCall`. Returns (loss, z_loss), then the accuracy (0-d fp32; (N,) for "none") with
    ``call.want_acc``, then the predicted tokens ((N,) int64) with ``call.want_pred``: only the outputs asked for
    are allocated; all but the loss non-differentiable.
    """

    @staticmethod
    def forward(ctx, hidden, weight, target, bias, class_weight, num_items, cd, need, call: FlceCall):
        want_pred = call.want_pred
        pred = target.new_empty((hidden.shape[0],), dtype=torch.int64) if want_pred else None
        fold = hidden.new_ones((1,), dtype=torch.float32) if cd == torch.float16 else None
        loss, z, acc, stats, grads = flce_forward(
            hidden, weight, target, bias, class_weight, call.opts, call.reduction, num_items, cd, need, call.want_acc,
            call.lean, True, call.budget, pred, zero_acc=False, sliced=call.sliced, fold_out=fold)
        ctx.call, ctx.cd, ctx.need, ctx.grads, ctx.done, ctx.fold = call, cd, need, grads, False, fold
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        if grads is None and call.reduction == "none" and any(need):
            ctx.save_for_backward(hidden, weight, target.contiguous(), bias, class_weight, stats)
        out = (loss, z)
        if acc is not None:
            out += (acc,)
        if want_pred:
            out += (pred,)
        # ctx.mark_non_differentiable(*out[1:]) and ctx.set_materialize_grads(False), inline (all they do; two Python
        # frames less): z_loss and accuracy get no gradient, and no zeros are materialised for them (two fills per
        # backward)
        ctx.non_differentiable, ctx.materialize_grads = out[1:], False
        return out

    @staticmethod
    def backward(ctx, grad_loss, *_unused):
        if torch.is_grad_enabled():  # create_graph=True: not differentiable itself, a second backward raises
            return first_order(FusedLinearCrossEntropyFunction.backward, ctx, grad_loss, *_unused)
        none = (None,) * 5
        if grad_loss is None or not any(ctx.need):
            return (None, None, None, None) + none
        if ctx.done:
            raise RuntimeError("tigon.fused_linear_cross_entropy: backward was already run through this graph; "
                               "for a mean/sum loss the gradients are formed once in the forward and released by "
                               "the first backward, so retain_graph=True cannot replay it")
        if ctx.grads is not None:  # scalar loss: scale the gradients computed in forward (one launch, no sync)
            ctx.done = True
            grads, ctx.grads = ctx.grads, None
            gh, gw, gb = finish_grads(grads, grad_loss if ctx.fold is None else grad_loss * ctx.fold, ctx.dtypes)
        else:
            hidden, weight, target, bias, class_weight, stats = ctx.saved_tensors
            call = ctx.call
            gh, gw, gb = flce_backward_rows(grad_loss, hidden, weight, target, bias, class_weight, stats, call.opts,
                                            ctx.cd, ctx.need, call.lean, True, call.budget, call.sliced)
        return (gh, gw, None, gb) + none


# ---------------------------------------------------------------------- torch.compile: custom ops
# The same launchers as the autograd.Function above, as torch.library custom ops (see tigon.kernels).
@torch.library.custom_op("tigon::fused_linear_cross_entropy", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _flce(hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor], class_weight: Optional[Tensor],
          num_items: Optional[Tensor], ignore_index: int, label_smoothing: float, lse_square_scale: float,
          softcap: Optional[float], logit_scale: float, reduction: str, cd: torch.dtype, need_hidden: bool,
          need_weight: bool, need_bias: bool, want_acc: bool, lean: bool, budget: int, want_pred: bool = False,
          token_scaling: bool = False, sliced: bool = False
          ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(loss, z_loss, accuracy, stats, grad_hidden, grad_weight, grad_bias, predicted tokens).

    loss, z_loss: fp32, 0-d (or (N,) for ``reduction="none"``); accuracy: 0-d fp32 (0 unless ``want_acc``; (N,)
    hits for "none"); stats: (N, 2) fp32 (row max, log-sum). For a scalar reduction with a gradient needed, the
    gradients of the loss for an upstream gradient of 1, computed during the forward as in eager mode (the backward
    only scales and casts them):
    grad_hidden (N, H), grad_weight (V, H), grad_bias (V,), in the dtypes of
    ``tigon.kernels.head_grads.grad_buffers`` (fp32; ``lean``: the parameters' dtypes where they
    equal ``cd``). Each is (0,) when not computed. They are outputs, not hidden state, so that the compiled graph
    saves them for its backward like any activation. Predicted tokens: (N,) int64 (each token's argmax class, -1
    where ignored) with ``want_pred``, else (0,). ``token_scaling``: :class:`LossOptions`'. ``sliced``:
    :func:`flce_forward`'s (its gradients have the lean plan's dtypes).
    """
    opts = LossOptions(ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale, token_scaling)
    need = (need_hidden, need_weight, need_bias)
    pred = target.new_empty((hidden.shape[0] if want_pred else 0,), dtype=torch.int64)
    loss, z, acc, stats, grads = flce_forward(hidden, weight, target, bias, class_weight, opts, reduction, num_items,
                                              cd, need, want_acc, lean, budget=budget,
                                              pred=pred if want_pred else None, sliced=sliced)
    gh, gw, gb = grads if grads is not None else (None, None, None)
    return loss, z, acc, stats, or_empty(gh, stats), or_empty(gw, stats), or_empty(gb, stats), pred


@_flce.register_fake
def _(hidden, weight, target, bias, class_weight, num_items, ignore_index, label_smoothing, lse_square_scale,
      softcap, logit_scale, reduction, cd, need_hidden, need_weight, need_bias, want_acc, lean, budget,
      want_pred=False, token_scaling=False, sliced=False):
    n = hidden.shape[0]
    loss_shape = (n,) if reduction == "none" else ()
    f32 = dict(dtype=torch.float32)
    empty = hidden.new_empty((0,), **f32)
    need = (need_hidden, need_weight, need_bias)
    if grads_in_forward(reduction, need):
        # The real allocator on fake tensors: the same shapes and dtypes as the kernel path, by construction.
        grads = [or_empty(g, empty) for g in grad_buffers(n, hidden, weight, cd, need, lean, True)]
    else:
        grads = [empty, empty.new_empty((0,)), empty.new_empty((0,))]
    acc_shape = loss_shape if want_acc else ()  # "none": each token's hit
    return (hidden.new_empty(loss_shape, **f32), hidden.new_empty(loss_shape, **f32),
            hidden.new_empty(acc_shape, **f32), hidden.new_empty((n, 2), **f32), *grads,
            target.new_empty((n if want_pred else 0,), dtype=torch.int64))


@torch.library.custom_op("tigon::fused_linear_cross_entropy_backward_rows", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _flce_backward_rows(grad_rows: Tensor, hidden: Tensor, weight: Tensor, target: Tensor, bias: Optional[Tensor],
                        class_weight: Optional[Tensor], stats: Tensor, ignore_index: int, label_smoothing: float,
                        lse_square_scale: float, softcap: Optional[float], logit_scale: float, cd: torch.dtype,
                        need_hidden: bool, need_weight: bool, need_bias: bool, lean: bool, budget: int,
                        token_scaling: bool = False, sliced: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Backward of ``reduction="none"`` (the logits are recomputed): (grad_hidden, grad_weight, grad_bias) in
    the inputs' shapes and dtypes, (0,) where not needed."""
    opts = LossOptions(ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale, token_scaling)
    gh, gw, gb = flce_backward_rows(grad_rows, hidden, weight, target.contiguous(), bias, class_weight, stats, opts,
                                    cd, (need_hidden, need_weight, need_bias), lean, budget=budget, sliced=sliced)
    return or_empty(gh, stats), or_empty(gw, stats), or_empty(gb, stats)


@_flce_backward_rows.register_fake
def _(grad_rows, hidden, weight, target, bias, class_weight, stats, ignore_index, label_smoothing, lse_square_scale,
      softcap, logit_scale, cd, need_hidden, need_weight, need_bias, lean, budget, token_scaling=False, sliced=False):
    empty = stats.new_empty((0,))
    return (hidden.new_empty(hidden.shape) if need_hidden else empty,
            weight.new_empty(weight.shape) if need_weight else empty.new_empty((0,)),
            bias.new_empty(bias.shape) if need_bias and bias is not None else empty.new_empty((0,)))


def _flce_setup(ctx, inputs, output):
    (hidden, weight, target, bias, class_weight, _num_items, *scalars) = inputs
    (ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale, reduction, cd, nh, nw, nb, _acc, lean,
     budget, *extra) = scalars
    token_scaling = bool(extra[1]) if len(extra) > 1 else False
    sliced = bool(extra[2]) if len(extra) > 2 else False
    ctx.need = (nh, nw, nb)
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.scalar = grads_in_forward(reduction, ctx.need)
    if ctx.scalar:
        ctx.save_for_backward(*output[4:7])
    else:
        ctx.save_for_backward(hidden, weight, target, bias, class_weight, output[3])
        ctx.scalars = (ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale, cd, nh, nw, nb, lean,
                       budget, token_scaling, sliced)


def _flce_grad(ctx, grad_loss, *_unused):
    nones = (None,) * 18
    if not any(ctx.need):
        return (None,) * 4 + nones
    if ctx.scalar:
        saved = [t if wanted else None for t, wanted in zip(ctx.saved_tensors, ctx.need)]
        gh, gw, gb = scale_grads(saved, grad_loss, ctx.dtypes, inplace=False)
    else:
        hidden, weight, target, bias, class_weight, stats = ctx.saved_tensors
        outs = _flce_backward_rows(grad_loss, hidden, weight, target, bias, class_weight, stats, *ctx.scalars)
        gh, gw, gb = (if_wanted(t, wanted) for t, wanted in zip(outs, ctx.need))
    return (gh, gw, None, gb) + nones


_flce.register_autograd(_flce_grad, setup_context=_flce_setup)


def compiled_fused_linear_cross_entropy(hidden, weight, target, bias, class_weight, num_items, cd, need,
                                        call: FlceCall):
    """``FusedLinearCrossEntropyFunction.apply`` as the ``tigon::fused_linear_cross_entropy`` custom op: the same
    outputs ((loss, z_loss), the accuracy with ``call.want_acc``, the predicted tokens with ``call.want_pred``)."""
    opts = call.opts
    loss, z, acc, *_, pred = _flce(
        hidden, weight, target, bias, class_weight, num_items_tensor(num_items, hidden.device), opts.ignore_index,
        opts.label_smoothing, opts.lse_square_scale, opts.softcap, opts.logit_scale, call.reduction, cd, need[0],
        need[1], need[2], call.want_acc, call.lean, call.budget, call.want_pred, opts.token_scaling, call.sliced)
    return (loss, z.detach()) + ((acc.detach(),) if call.want_acc else ()) + ((pred,) if call.want_pred else ())
