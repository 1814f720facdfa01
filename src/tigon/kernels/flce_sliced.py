"""The fused linear cross-entropy's low-memory exact plan (``memory="low"``): token chunks, then vocabulary slices.

The default plan (:mod:`tigon.kernels.fused_linear_cross_entropy`) adds each token chunk's ``grad_logits.T @ hidden``
into an fp32 (V, H) accumulator: exact, but 4VH bytes beside the gradients (2 GiB at Llama-3-8B's head). Liger-Kernel
and Tigon's ``accum_dtype=`` the weight's dtype add the chunks into grad_weight itself, rounding once per chunk. This
plan needs neither, at the price of a fourth matmul:

1. **Token chunks of H rows** (one row of grad_weight's (V, H) memory per token: the chunk's (H, V) logits fit in the
   grad_weight buffer, not yet written). Per chunk: ``logits = hidden_chunk @ weight.T``, the loss kernel
   (:func:`tigon.kernels.loss_rows.ce_rows_forward`) writes each token's loss and row statistics (max, log-sum) and
   overwrites the chunk with ``d loss / d logits`` for a unit upstream, and ``grad_hidden_chunk = grad_logits @
   weight``: a full-vocabulary product, one rounding, as in the unfused computation.
2. **Vocabulary slices over every token**. Per slice [v0, v1): ``logits = hidden @ weight[v0:v1].T`` (N, V_s) again,
   the backward kernel (:func:`tigon.kernels.loss_rows.ce_rows_backward`, in its vocabulary-shard form: the saved
   row statistics, each target local to the slice) turns it into ``d loss / d logits``, and ``grad_weight[v0:v1] =
   grad_logits.T @ hidden``: one product over all N tokens, fp32-accumulated inside the matmul and rounded once,
   as exact as the fp32 accumulator. grad_bias[v0:v1] is the slice's column sum. The slice's logits live in the
   part of grad_weight not yet written (rows v1..V), slices shrinking as it fills (V_s <= (V - v0) H / (N + H)),
   then in a spare buffer of ``spare_bytes`` (the budget beside the gradients).

Extra memory: grad_weight and grad_hidden in the parameters' dtype (returned) plus the spare buffer: Liger-Kernel's
peak at Llama-3-8B's head with the spare at 3/4 of grad_hidden's bytes. Matmuls: 4 (2 N H V FLOPs each) against the
default's 3 plus its accumulator traffic (one read and write of 4VH bytes per chunk) and the lean plan's 3 plus one
read and write of grad_weight per chunk. The gradients are for an upstream of 1; another upstream multiplies them in
the backward (:func:`tigon.kernels.head_grads.finish_grads`), a second rounding, as Liger-Kernel's.

``reduction="none"`` runs both passes in its backward (:func:`sliced_backward_rows`), with the per-token upstream.

Ignored tokens (``ignore_index``) add nothing to the gradients, so both passes skip them: their rows are found once
(:mod:`tigon.kernels.ignored_rows`: one host sync, none while a CUDA graph is being captured), pass 1's chunks
gather the kept rows of ``hidden`` into grad_weight's memory beside their logits (chunks of V H / (V + 2H) rows: the
gathered rows, the logits and the chunk's grad_hidden before it is scattered), and each slice of pass 2 held in
grad_weight's memory gathers them again after its logits; the slices held in the spare buffer take every row (no room
for a gathered copy there; the kernel writes zeros on ignored rows). The matmuls then cost 2 K H V FLOPs each for K
kept tokens (SFT batches with masked prompts: K well under N), the gathers about 2 K H e bytes per chunk and slice.

Scope (:func:`sliced_applies`): grad_weight needed, hidden, weight (and bias) in the compute
dtype, no class weights and no token scaling (both need the target's own logit or weight on every slice); elsewhere
the lean plan runs.
"""

from __future__ import annotations

import dataclasses

import torch

from .head_grads import _Matmuls
from .ignored_rows import compact_outputs, kept_rows, scatter_outputs
from .loss_rows import LossOptions, ce_rows_backward, ce_rows_forward

SLICE_ALIGN = 128
"""Vocabulary slices are multiples of this many columns where they can be (tensor-core tiles), the last one excepted."""


def sliced_applies(hidden, weight, bias, class_weight, opts: LossOptions, cd: torch.dtype,
                   need: tuple[bool, bool, bool]) -> bool:
    """Whether :func:`sliced_forward` serves this call (see the module docstring's scope)."""
    return (need[1] and class_weight is None and not opts.token_scaling
            and hidden.dtype == cd and weight.dtype == cd and (bias is None or bias.dtype == cd))


def default_spare_bytes(n: int, hidden: int, elem_bytes: int) -> int:
    """``memory="low"``'s spare buffer: 3/4 of grad_hidden's bytes (48 MiB at 8192 x 4096 in bf16), so that the op's
    peak stays at Liger-Kernel's (whose chunks hold N H logits beside the same gradients)."""
    return 3 * n * hidden * elem_bytes // 4


def slice_plan(n: int, vocab: int, hidden: int, spare_elems: int, kept: int | None = None
               ) -> list[tuple[int, int, bool]]:
    """The vocabulary slices ``(v0, v1, in_tail)`` of pass 2 for ``n`` tokens of which ``kept`` (default all) are not
    ignored: a slice held in grad_weight's unwritten rows [v1, V) (``in_tail``) has the kept rows' (kept, V_s) logits
    there, followed by those rows of hidden (kept, H) when kept < n (gathered); else the slice's (n, V_s) logits go in
    the spare buffer of ``spare_elems`` elements; the larger of the two wins. At least 16 columns a slice (a spare
    buffer too small for that is exceeded by as much: :func:`sliced_forward` sizes it)."""
    k = n if kept is None else kept
    gathered = k * hidden if k < n else 0
    plan, v0 = [], 0
    while v0 < vocab:
        rem = vocab - v0
        tail = max(0, rem * hidden - gathered) // (k + hidden)
        spare = spare_elems // max(n, 1)
        cols = max(tail, spare, 16)
        if cols < rem:
            cols = cols // SLICE_ALIGN * SLICE_ALIGN if cols >= SLICE_ALIGN else cols
        cols = min(cols, rem)
        in_tail = tail >= spare and cols <= tail and k * cols + gathered <= (rem - cols) * hidden
        plan.append((v0, v0 + cols, in_tail))
        v0 += cols
    return plan


LOCAL_IGNORE, LOCAL_OTHER = -1, -2
"""Pass 2's slice-local targets: an ignored row, a row whose target is on another slice (both outside [0, V_s), so
that no local class collides with them, whatever the caller's ignore_index)."""


def _local_targets(target: torch.Tensor, v0: int, v1: int, ignore_index: int) -> torch.Tensor:
    """Targets relative to the slice [v0, v1): t - v0 inside it, :data:`LOCAL_IGNORE` for ignored rows and
    :data:`LOCAL_OTHER` for the rest (no target term on this slice); pass 2 launches with ignore_index
    :data:`LOCAL_IGNORE`."""
    local = torch.where((target >= v0) & (target < v1), target - v0, LOCAL_OTHER)
    return torch.where(target == ignore_index, LOCAL_IGNORE, local)


def sliced_forward(h, w, b, target, opts: LossOptions, scale: torch.Tensor, need: tuple[bool, bool, bool],
                   loss_rows, z_rows, stats, correct, pred, spare_bytes: int):
    """Both passes of the module docstring for ``h`` (N, H), ``w`` (V, H), ``b`` (V,) or None, all in one dtype, and
    ``target`` (N,) int (contiguous); writes the per-token ``loss_rows``, ``z_rows``, ``stats`` ((N, 2) fp32), and
    ``correct`` / ``pred`` when given (as :func:`tigon.kernels.loss_rows.ce_rows_forward`; ignored rows: loss 0,
    statistics (0, log V), not correct, class -1); ``scale``: the gradients' (2,) fp32 scales of
    :func:`tigon.kernels.loss_reduce.reduce_losses`. Returns (grad_hidden (N, H) or None, grad_weight (V, H),
    grad_bias (V,) fp32 or None) for an upstream of 1."""
    idx = kept_rows(target, opts.ignore_index, *w.shape, gather_floor=True)
    t_c = target if idx is None else target.index_select(0, idx)
    outs = compact_outputs(idx, loss_rows, z_rows, stats, correct, pred)
    loss_c, z_c, stats_c, correct_c, pred_c = outs

    def rows_grad(lg, s, e):  # the loss, the statistics and the unit-upstream gradient of kept rows [s, e)
        ce_rows_forward(lg, t_c[s:e], None, None, opts, loss_c[s:e], z_c[s:e], stats_c[s:e],
                        correct_c[s:e] if correct_c is not None else None, grad_scales=scale, grad_out=lg,
                        out_pred=pred_c[s:e] if pred_c is not None else None)

    def scatter():  # the kept rows' outputs into the callers' (N,) tensors (needed by the slices of every row)
        scatter_outputs(idx, (loss_rows, z_rows, stats, correct, pred), outs, w.shape[0])

    one = torch.ones((), dtype=torch.float32, device=w.device)
    return _two_passes(h, w, b, need, spare_bytes, idx, rows_grad, scatter, opts, (target, stats, one),
                       (t_c, stats_c, one), scale)


def sliced_backward_rows(grad_rows: torch.Tensor, h, w, b, target, stats, opts: LossOptions,
                         need: tuple[bool, bool, bool], spare_bytes: int):
    """The backward of ``reduction="none"`` by the same two passes (the logits recomputed in both): ``grad_rows``
    (N,) the per-token upstream gradient, ``stats`` the forward's row statistics; other arguments as
    :func:`sliced_forward`. Returns (grad_hidden or None, grad_weight, grad_bias fp32 or None) in the compute dtype."""
    coef = grad_rows.to(torch.float32)
    idx = kept_rows(target, opts.ignore_index, *w.shape, gather_floor=True)
    if idx is None:
        kept = (target, stats, coef)
    else:
        kept = (target.index_select(0, idx), stats.index_select(0, idx), coef.index_select(0, idx))
    t_c, stats_c, coef_c = kept

    def rows_grad(lg, s, e):
        ce_rows_backward(lg, t_c[s:e], None, None, stats_c[s:e], opts, coef_c[s:e], lg)

    return _two_passes(h, w, b, need, spare_bytes, idx, rows_grad, None, opts, (target, stats, coef), kept, None)


def _two_passes(h, w, b, need, spare_bytes: int, idx, rows_grad, between, opts: LossOptions, every, kept, scale):
    """Pass 1 and pass 2 of the module docstring over the rows ``idx`` (None: all of them) of ``h``.

    Pass 1: token chunks in grad_weight's memory; ``rows_grad(chunk, s, e)`` overwrites the logits of kept rows
    [s, e) (indices into ``idx``) with their gradient; then ``between()`` (unless None). Pass 2: vocabulary slices,
    the gradient from the row statistics: ``kept`` = (target, stats, coef) of the kept rows for the slices held in
    grad_weight's memory, ``every`` = the same for all rows for those in the spare buffer; ``coef`` 0-d or per row,
    ``scale`` the reduction's (2,) scales or None."""
    n, hdim = h.shape
    vocab = w.shape[0]
    cd, dev = w.dtype, w.device
    k = n if idx is None else idx.numel()  # (kept_rows never gives an empty idx)
    local_opts = dataclasses.replace(opts, ignore_index=LOCAL_IGNORE)
    mm = _Matmuls(dev, cd)  # (one dtype throughout: its products are plain torch.mm / addmm into the buffers)
    gw = torch.empty((vocab, hdim), dtype=cd, device=dev)
    gh = None
    if need[0]:
        gh = torch.empty((n, hdim), dtype=cd, device=dev) if idx is None else torch.zeros((n, hdim), dtype=cd,
                                                                                           device=dev)
    gb = torch.empty((vocab,), dtype=torch.float32, device=dev) if need[2] and b is not None else None
    flat = gw.view(-1)
    if n == 0:
        if between is not None:
            between()
        gw.zero_()
        if gb is not None:
            gb.zero_()
        return gh, gw, gb
    # pass 1: token chunks in grad_weight's memory (the kept rows gathered there beside their logits)
    rows = max(1, min(k, hdim if idx is None else vocab * hdim // (vocab + 2 * hdim)))
    for s in range(0, k, rows):
        e = min(s + rows, k)
        r = e - s
        lg = flat[: r * vocab].view(r, vocab)
        if idx is None:
            hs = h[s:e]
        else:
            hs = flat[r * vocab: r * (vocab + hdim)].view(r, hdim)
            torch.index_select(h, 0, idx[s:e], out=hs)
        mm.logits(lg, hs, w, b)
        rows_grad(lg, s, e)
        if gh is not None and idx is None:
            mm.mm(gh[s:e], lg, w)
        elif gh is not None:
            part = flat[r * (vocab + hdim): r * (vocab + 2 * hdim)].view(r, hdim)
            mm.mm(part, lg, w)
            gh.index_copy_(0, idx[s:e], part)
    if between is not None:
        between()
    # pass 2: vocabulary slices (the kept rows in grad_weight's memory, every row in the spare buffer)
    plan = slice_plan(n, vocab, hdim, spare_bytes // cd.itemsize, k)
    spare_cols = max((v1 - v0 for v0, v1, tail in plan if not tail), default=0)
    spare = torch.empty(n * spare_cols, dtype=cd, device=dev) if spare_cols else None
    for v0, v1, in_tail in plan:
        cols = v1 - v0
        if in_tail:
            at = v1 * hdim
            lg = flat[at: at + k * cols].view(k, cols)
            if idx is None:
                hs = h
            else:
                hs = flat[at + k * cols: at + k * (cols + hdim)].view(k, hdim)
                torch.index_select(h, 0, idx, out=hs)
            tg, st, cf = kept
        else:
            lg, hs = spare[: n * cols].view(n, cols), h
            tg, st, cf = every
        mm.logits(lg, hs, w[v0:v1], b[v0:v1] if b is not None else None)
        ce_rows_backward(lg, _local_targets(tg, v0, v1, opts.ignore_index), None, None, st, local_opts, cf, lg,
                         scale=scale, n_classes=vocab)
        mm.mm(gw[v0:v1], lg.t(), hs)
        if gb is not None:
            torch.sum(lg, dim=0, dtype=torch.float32, out=gb[v0:v1])
    return gh, gw, gb
