"""Ignored tokens left out of the fused LM-head loss's matmuls.

A token whose target is ``ignore_index`` has loss 0 and a zero gradient, yet a chunk loop that takes every row spends
2 H V FLOPs on its logits and as many on each of its gradient products. SFT batches mask their prompts (often half the
tokens or more), and the benches ignore every tenth. The fused linear cross-entropy therefore finds the kept rows
once (``nonzero``: one host sync per call, marked by :func:`tigon.kernels.host_wait.host_read`) and runs its chunks
over those rows, gathered. The per-token outputs go back to their rows afterwards; an ignored row gets what the kernels
would have written: loss 0, z 0, statistics (0, log V), not correct, predicted class -1.

Where it does not pay, every row is computed (:func:`kept_rows` returns None):
- fewer than :data:`MIN_SKIPPED` of the rows are ignored (a causal LM's shifted labels ignore one token a sequence:
  nothing to gain there), or none is kept;
- a CUDA graph is being captured (no sync allowed);
- the head is smaller than ``min_macs`` multiply-adds per call, where a sync and a few gathers cost more than the
  matmuls they save (:data:`SKIP_MIN_MACS` for the default plan).

Used by the default plan's forward (:func:`tigon.kernels.fused_linear_cross_entropy.flce_forward`), the
log-probabilities' forward and the recomputing backwards of per-token losses (``backward_over_chunks``' ``kept``:
the cross-entropy's ``reduction="none"``, the log-probabilities' backward), the sliced plan
(:mod:`tigon.kernels.flce_sliced`), the preference losses' formed passes
(:func:`tigon.ops.preference_formed._formed_pass`: DPO and the paired losses, KTO; eager and inside
``torch.compile``'s custom op, which runs at the call, where a sync is allowed) and the fused linear JSD
(:func:`tigon.kernels.fused_linear_jsd.jsd_forward`: both models' kept rows, the default plan only). Not by the
fused cross-entropy's lean plan (its memory has no room for the gathered copy of the hidden states) nor under its
``memory`` budget in bytes (which does not count the gathers).

The formed passes chunk whole units (a pair, a sequence; the batch when a loss couples them) whose kept rows vary in
number: :func:`kept_groups` gives each group's count, :func:`group_cuts` the chunks (balanced, the fewest within the
plan's cap), ``backward_over_chunks``' ``bounds`` runs them. There each chunk's rows are gathered into a (rows, H)
buffer (not all the kept rows at once), so the extra memory is two (rows, H) buffers beside the (rows, V) chunk (one,
on the formed passes, whose grad_hidden holds the kept rows alone until the chunk loop ends: :func:`placed`), and
a byte budget counts them (``row_bytes`` of :func:`tigon.kernels.fused_linear_cross_entropy.chunk_rows`): these passes
skip under every plan, the lean one and byte budgets included, where the kept rows of a unit fit.
"""

from __future__ import annotations

import math

import torch

from .host_wait import host_read

SKIP_MIN_MACS = 1 << 32
"""The default plan gathers kept rows when N x V x H reaches this (4.3e9 multiply-adds: about 3 us of H200 matmul time
per ignored tenth, against a sync and a few small launches; Qwen2.5-0.5B's head at 1024 tokens is 1.4e11)."""


MIN_SKIPPED = 1 / 32
"""The least share of ignored rows worth the gathers (they cost about two passes over the kept hidden states)."""


def kept_rows(target: torch.Tensor, ignore_index: int, vocab: int, hidden: int, min_macs: int = 0,
              gather_floor: bool = False) -> torch.Tensor | None:
    """The (K,) int64 indices of the rows of ``target`` (N,) that are not ``ignore_index``, 0 < K < N (one host
    sync), or None (compute every row): see the module docstring; ``min_macs``: the least N V H worth a sync;
    ``gather_floor``: also None when a (vocab, hidden) grad_weight cannot hold one gathered row beside its logits and
    its grad_hidden row (vocab * hidden < vocab + 2 * hidden: a head of 1-2 classes; the sliced plan's chunks)."""
    n = target.numel()
    if not _sync_pays(target, n * vocab * hidden, min_macs) or (gather_floor and vocab * hidden < vocab + 2 * hidden):
        return None
    idx = host_read((target != ignore_index).nonzero).squeeze(1)
    k = idx.numel()
    return None if not _skipping_pays(n, k) else idx


def _sync_pays(target: torch.Tensor, macs: int, min_macs: int) -> bool:
    """Whether finding the kept rows (a host sync) may pay: rows to find, a head of at least ``min_macs``
    multiply-adds, and no CUDA graph being captured."""
    if target.numel() == 0 or macs < min_macs:
        return False
    return not (target.device.type == "cuda" and torch.cuda.is_current_stream_capturing())


def _skipping_pays(n: int, k: int) -> bool:
    """Whether leaving out the n - k ignored of n rows pays: some rows kept and at least :data:`MIN_SKIPPED` not."""
    return k > 0 and n - k >= n * MIN_SKIPPED


def kept_for_chunks(target: torch.Tensor, ignore_index: int, vocab: int, hidden: int,
                    lean: bool) -> torch.Tensor | None:
    """:func:`kept_rows` at :data:`SKIP_MIN_MACS` (read at each call, so that changing the module's value takes
    effect) for the default plan's chunk loops, or None for ``lean``: the lean plan, whose memory (the gradients plus
    Liger-Kernel's chunks) has no room for a gathered copy of the hidden states; callers pass a ``memory`` budget in
    bytes as ``lean`` too, since it does not count that copy."""
    return None if lean else kept_rows(target, ignore_index, vocab, hidden, SKIP_MIN_MACS)


def compact_outputs(idx: torch.Tensor | None, loss_rows, z_rows, stats, correct, pred) -> tuple:
    """Buffers of the kept rows for the per-token outputs (each None where the caller's is None), or the caller's own
    tensors when ``idx`` is None."""
    if idx is None:
        return loss_rows, z_rows, stats, correct, pred
    k = idx.numel()
    return (loss_rows.new_empty(k), z_rows.new_empty(k), stats.new_empty((k, 2)),
            correct.new_empty(k) if correct is not None else None, pred.new_empty(k) if pred is not None else None)


def scatter_outputs(idx: torch.Tensor | None, full: tuple, part: tuple, vocab: int) -> None:
    """Write the kept rows' outputs ``part`` (:func:`compact_outputs`' order) into the callers' (N,) tensors ``full``,
    and what the kernels give an ignored row into the other rows. Nothing when ``idx`` is None."""
    if idx is None:
        return
    loss_rows, z_rows, stats, correct, pred = full
    scatter_rows(idx, ((loss_rows, part[0], 0.0), (z_rows, part[1], 0.0), (correct, part[3], 0.0),
                       (pred, part[4], -1)), stats, part[2], vocab)


def scatter_rows(idx: torch.Tensor, outputs, stats: torch.Tensor | None = None, stats_part: torch.Tensor | None = None,
                 vocab: int = 1) -> None:
    """Per-token outputs computed over the kept rows ``idx`` (K,) written back into the callers' (N, ...) tensors:
    ``outputs`` holds ``(dst, src, fill)`` triples (dst None: skipped), each ignored row of dst getting ``fill``, what
    the kernels write there; ``stats`` (N, 2) fp32 row statistics from ``stats_part`` (K, 2), an ignored row's being
    (0, log ``vocab``) (:func:`tigon.kernels.loss_rows.row_stats`)."""
    for dst, src, fill in outputs:
        if dst is not None:
            dst.fill_(fill).index_copy_(0, idx, src)
    if stats is not None:
        stats[:, 0].zero_()
        stats[:, 1].fill_(math.log(vocab))
        stats.index_copy_(0, idx, stats_part)


def placed(x: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """Rows ``x`` (K, ...) computed for the rows ``idx`` (K,) of N, in that order (the kept rows, or every row in
    another order: the formed passes' pairs), as a new (N, ...) tensor: each at its row, zeros at the others (what
    the kernels give an ignored row); no fill where ``idx`` holds every row."""
    out = (x.new_empty if idx.numel() == n else x.new_zeros)((n, *x.shape[1:]))
    return out.index_copy_(0, idx, x)


def kept_groups(target: torch.Tensor, ignore_index: int, vocab: int, hidden: int,
                group: int) -> tuple[torch.Tensor, list[int]] | None:
    """For a loss of whole groups of ``group`` consecutive rows (the formed passes' pairs or sequences): the (K,)
    int64 kept rows of ``target`` (N,), ascending, and each group's count of them (a host list of N / group ints), or
    None where skipping does not pay (:func:`kept_rows`' rules at :data:`SKIP_MIN_MACS`, read at the call). One host
    sync, the counts': the rows then come from a stable sort of the ignored flags (kept first), whose first K entries
    are the kept rows in order, with no sync of their own."""
    n = target.numel()
    if not _sync_pays(target, n * vocab * hidden, SKIP_MIN_MACS):
        return None
    keep = target.reshape(-1) != ignore_index
    sizes = host_read(keep.view(n // group, group).sum(1).tolist)
    k = sum(sizes)
    if not _skipping_pays(n, k):
        return None
    order = torch.sort(keep.logical_not().to(torch.uint8), stable=True).indices
    return order[:k], sizes


def group_cuts(sizes: list[int], cap: int) -> list[int] | None:
    """Chunks of whole consecutive groups of ``sizes`` rows (ints >= 0, not all 0), at most ``cap`` rows each: the
    indices of the groups that start a chunk, then ``len(sizes)``; the fewest chunks, the largest of them as small as
    that number allows (balanced, as :func:`tigon.kernels.fused_linear_cross_entropy.chunk_rows` does for groups of
    one size); None when one group exceeds ``cap``. Every chunk holds rows: an empty group joins a chunk of others."""
    if max(sizes) > cap:
        return None

    def greedy(limit: int) -> list[int]:
        cuts, rows = [0], 0
        for g, k in enumerate(sizes):
            if rows + k > limit:
                cuts.append(g)
                rows = 0
            rows += k
        return cuts + [len(sizes)]

    best = greedy(cap)
    lo, hi = max(max(sizes), -(-sum(sizes) // (len(best) - 1))), cap
    while lo < hi:  # the least cap that keeps the fewest chunks
        mid = (lo + hi) // 2
        if len(greedy(mid)) == len(best):
            hi = mid
        else:
            lo = mid + 1
    return greedy(lo)
