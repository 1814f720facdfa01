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

Scope (:func:`sliced_applies`): grad_weight needed, hidden, weight (and bias) in the compute
dtype, no class weights and no token scaling (both need the target's own logit or weight on every slice); elsewhere
the lean plan runs.
"""

from __future__ import annotations

import torch

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


def slice_plan(n: int, vocab: int, hidden: int, spare_elems: int) -> list[tuple[int, int, bool]]:
    """The vocabulary slices ``(v0, v1, in_tail)`` of pass 2 for ``n`` tokens: a slice's (n, V_s) logits go in
    grad_weight's unwritten rows [v1, V) (``in_tail``) while they hold them, else in the spare buffer of
    ``spare_elems`` elements; the larger of the two wins. At least 16 columns a slice (a spare buffer too small for
    that is exceeded by as much: :func:`sliced_forward` sizes it)."""
    plan, v0 = [], 0
    while v0 < vocab:
        rem = vocab - v0
        tail = rem * hidden // (n + hidden)
        spare = spare_elems // max(n, 1)
        cols = max(tail, spare, 16)
        if cols < rem:
            cols = cols // SLICE_ALIGN * SLICE_ALIGN if cols >= SLICE_ALIGN else cols
        cols = min(cols, rem)
        in_tail = tail >= spare and cols <= tail and n * cols <= (rem - cols) * hidden
        plan.append((v0, v0 + cols, in_tail))
        v0 += cols
    return plan


def _local_targets(target: torch.Tensor, v0: int, v1: int, ignore_index: int) -> torch.Tensor:
    """Targets relative to the slice [v0, v1): t - v0 inside it, ignore_index kept, every other class a value outside
    [0, V_s) that is not ignore_index (no target term on this slice)."""
    other = -1 if ignore_index != -1 else -2
    inside = (target >= v0) & (target < v1)
    local = torch.where(inside, target - v0, other)
    return torch.where(target == ignore_index, ignore_index, local)


def sliced_forward(h, w, b, target, opts: LossOptions, scale: torch.Tensor, need: tuple[bool, bool, bool],
                   loss_rows, z_rows, stats, correct, pred, spare_bytes: int):
    """Both passes of the module docstring for ``h`` (N, H), ``w`` (V, H), ``b`` (V,) or None, all in one dtype, and
    ``target`` (N,) int (contiguous); writes the per-token ``loss_rows``, ``z_rows``, ``stats`` ((N, 2) fp32), and
    ``correct`` / ``pred`` when given (as :func:`tigon.kernels.loss_rows.ce_rows_forward`); ``scale``: the gradients'
    (2,) fp32 scales of :func:`tigon.kernels.loss_reduce.reduce_losses`. Returns (grad_hidden (N, H) or None,
    grad_weight (V, H), grad_bias (V,) fp32 or None) for an upstream of 1."""

    def rows_grad(lg, s, e):  # the loss, the statistics and the unit-upstream gradient of rows [s, e)
        ce_rows_forward(lg, target[s:e], None, None, opts, loss_rows[s:e], z_rows[s:e], stats[s:e],
                        correct[s:e] if correct is not None else None, grad_scales=scale, grad_out=lg,
                        out_pred=pred[s:e] if pred is not None else None)

    one = torch.ones((), dtype=torch.float32, device=w.device)
    return _two_passes(h, w, b, target, opts, stats, need, spare_bytes, rows_grad, one, scale)


def sliced_backward_rows(grad_rows: torch.Tensor, h, w, b, target, stats, opts: LossOptions,
                         need: tuple[bool, bool, bool], spare_bytes: int):
    """The backward of ``reduction="none"`` by the same two passes (the logits recomputed in both): ``grad_rows``
    (N,) the per-token upstream gradient, ``stats`` the forward's row statistics; other arguments as
    :func:`sliced_forward`. Returns (grad_hidden or None, grad_weight, grad_bias fp32 or None) in the compute dtype."""
    coef = grad_rows.to(torch.float32)

    def rows_grad(lg, s, e):
        ce_rows_backward(lg, target[s:e], None, None, stats[s:e], opts, coef[s:e], lg)

    return _two_passes(h, w, b, target, opts, stats, need, spare_bytes, rows_grad, coef, None)


def _two_passes(h, w, b, target, opts: LossOptions, stats, need, spare_bytes: int, rows_grad, coef, scale):
    """Pass 1 (token chunks in grad_weight's memory; ``rows_grad(chunk, s, e)`` overwrites each chunk's logits with
    their gradient) and pass 2 (vocabulary slices, the gradient from ``stats`` times ``coef`` (0-d or (N,)) and the
    reduction's ``scale`` (or None)) of the module docstring."""
    n, hdim = h.shape
    vocab = w.shape[0]
    cd, dev = w.dtype, w.device
    gw = torch.empty((vocab, hdim), dtype=cd, device=dev)
    gh = torch.empty((n, hdim), dtype=cd, device=dev) if need[0] else None
    gb = torch.empty((vocab,), dtype=torch.float32, device=dev) if need[2] and b is not None else None
    flat = gw.view(-1)
    if n == 0:
        gw.zero_()
        if gb is not None:
            gb.zero_()
        return gh, gw, gb
    # pass 1: token chunks of H rows in grad_weight's memory
    rows = max(1, min(n, hdim))
    for s in range(0, n, rows):
        e = min(s + rows, n)
        lg = flat[: (e - s) * vocab].view(e - s, vocab)
        _logits(lg, h[s:e], w, b)
        rows_grad(lg, s, e)
        if gh is not None:
            torch.mm(lg, w, out=gh[s:e])
    # pass 2: vocabulary slices over every token
    plan = slice_plan(n, vocab, hdim, spare_bytes // cd.itemsize)
    spare_cols = max((v1 - v0 for v0, v1, tail in plan if not tail), default=0)
    spare = torch.empty(n * spare_cols, dtype=cd, device=dev) if spare_cols else None
    for v0, v1, in_tail in plan:
        cols = v1 - v0
        lg = (flat[v1 * hdim: v1 * hdim + n * cols] if in_tail else spare[: n * cols]).view(n, cols)
        _logits(lg, h, w[v0:v1], b[v0:v1] if b is not None else None)
        ce_rows_backward(lg, _local_targets(target, v0, v1, opts.ignore_index), None, None, stats, opts, coef, lg,
                         scale=scale, n_classes=vocab)
        torch.mm(lg.t(), h, out=gw[v0:v1])
        if gb is not None:
            torch.sum(lg, dim=0, dtype=torch.float32, out=gb[v0:v1])
    return gh, gw, gb


def _logits(out, h, w, b):
    if b is None:
        torch.mm(h, w.t(), out=out)
    else:
        torch.addmm(b, h, w.t(), out=out)
