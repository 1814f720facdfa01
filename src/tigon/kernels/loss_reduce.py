"""The reduction of the cross-entropy losses' per-token values: per-token losses -> the loss, z-loss, accuracy and the
scales their gradients need, in one launch and without a host sync (``reduce_losses``). Shared by the cross-entropy op
(:mod:`tigon.kernels.cross_entropy`) and the fused LM-head loss (:mod:`tigon.kernels.fused_linear_cross_entropy`).
Conventions (the z-loss averaged per non-ignored token, unweighted; an all-ignored batch gives 0): the cross-entropy
reference in :mod:`tigon.reference`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import launcher, next_pow2


# Reduction modes of _reduce_kernel: how the scale (per-token losses -> the loss) is formed.
_MEAN, _SUM, _ITEMS_TENSOR, _ITEMS_NUMBER, _NONE = range(5)
_REDUCTION_MODES = {"mean": _MEAN, "sum": _SUM, "none": _NONE}


@triton.jit
def _reduce_kernel(
    T, CW, ITEMS, LOSS_ROWS, Z_ROWS, CORRECT, OUT_LOSS, OUT_Z, OUT_ACC, OUT_SCALE, n_rows, V, ignore_index, items,
    MODE: tl.constexpr, HAS_WEIGHT: tl.constexpr, SUMS: tl.constexpr, COMPUTE_ACC: tl.constexpr,
    ZERO_ACC: tl.constexpr, BLOCK: tl.constexpr,
):
    # One program walks all rows in BLOCK steps (fixed order: deterministic): valid-token count, the target
    # weights' sum (mean with class weights), and optionally the loss / z / hit sums; writes the scale and the
    # reduced values. One launch in place of ~15 small torch ops (host time at small batches).
    n_valid = tl.zeros([BLOCK], tl.float32)
    w_valid = tl.zeros([BLOCK], tl.float32)
    s_loss = tl.zeros([BLOCK], tl.float32)
    s_z = tl.zeros([BLOCK], tl.float32)
    s_hit = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        rows = start + tl.arange(0, BLOCK)
        rmask = rows < n_rows
        t = tl.load(T + rows, mask=rmask, other=ignore_index)
        valid = rmask & (t != ignore_index)
        n_valid += tl.where(valid, 1.0, 0.0)
        if HAS_WEIGHT:
            if MODE == 0:
                t_safe = tl.minimum(tl.maximum(t, 0), V - 1).to(tl.int32)
                w_valid += tl.load(CW + t_safe, mask=valid, other=0.0)
        if SUMS:
            s_loss += tl.load(LOSS_ROWS + rows, mask=rmask, other=0.0)
            s_z += tl.load(Z_ROWS + rows, mask=rmask, other=0.0)
        if COMPUTE_ACC:
            s_hit += tl.load(CORRECT + rows, mask=rmask, other=0.0)
    count = tl.sum(n_valid, axis=0)
    if MODE == 0:  # the z-loss per non-ignored token, unweighted; the cross-entropy by the target weights' sum
        z_scale = tl.where(count != 0, tl.math.div_rn(1.0, tl.where(count != 0, count, 1.0)), 0.0)
        if HAS_WEIGHT:
            denom = tl.sum(w_valid, axis=0)
            scale = tl.where(denom != 0, tl.math.div_rn(1.0, tl.where(denom != 0, denom, 1.0)), 0.0)
        else:
            scale = z_scale
    elif MODE == 1:
        scale = 1.0
        z_scale = scale
    elif MODE == 2:
        scale = tl.math.div_rn(1.0, tl.load(ITEMS).to(tl.float32))
        z_scale = scale
    else:
        scale = tl.math.div_rn(1.0, items)
        z_scale = scale
    if MODE != 4:
        tl.store(OUT_SCALE, scale)
        tl.store(OUT_SCALE + 1, z_scale)
        if SUMS:
            sz = tl.sum(s_z, axis=0)
            tl.store(OUT_LOSS, (tl.sum(s_loss, axis=0) - sz) * scale + sz * z_scale)
            tl.store(OUT_Z, sz * z_scale)
    if COMPUTE_ACC:
        # div_rn: IEEE round-to-nearest (a plain '/' compiles to an approximate division on CUDA).
        tl.store(OUT_ACC, tl.math.div_rn(tl.sum(s_hit, axis=0), tl.maximum(count, 1.0)))
    elif ZERO_ACC:  # the placeholder accuracy of a call that did not ask for it (no separate fill kernel)
        tl.store(OUT_ACC, 0.0)


def reduce_losses(
    target: torch.Tensor, cw: torch.Tensor | None, ignore_index: int, vocab: int, reduction: str, num_items_in_batch,
    loss_rows: torch.Tensor | None = None, z_rows: torch.Tensor | None = None, correct: torch.Tensor | None = None,
    zero_acc: bool = False, scale_out: torch.Tensor | None = None,
):
    """Per-token values -> (loss, z_loss, accuracy, scales), in one kernel launch and without a host sync.
    ``scale_out``: a (2,) fp32 tensor to write the scales into (a scale-only call's, rewritten with the same values)
    instead of a new one.

    ``scales`` (a (2,) fp32 tensor; None for "none") turn summed per-token values into the reduced loss: element 0
    for the cross-entropy part, element 1 for the z-loss. mean: 1 / the sum of the target weights of non-ignored
    tokens, and 1 / their count for the z-loss (equal without class weights; 0 when the divisor is 0, so an
    all-ignored batch gives loss 0 and zero gradients); sum: 1; with ``num_items_in_batch`` (int, float or
    tensor): 1 / num_items_in_batch for both. ``loss``: sum(ce rows) * scales[0] + sum(z rows) * scales[1],
    ``z_loss``: sum(z rows) * scales[1] (0-d fp32; the rows themselves for "none"; None when the rows are not
    given: a scale-only call). ``accuracy``: sum(correct) / max(1, non-ignored tokens) when ``correct`` (N,)
    is given (for "none" ``correct`` itself: each token's 1.0 / 0.0 hit, 0 where ignored, Liger-Kernel's per-token
    ``token_accuracy``), else a 0-d zero with ``zero_acc`` (written by the same kernel when it runs), else None.
    """
    f32 = dict(dtype=torch.float32, device=target.device)
    items_tensor = isinstance(num_items_in_batch, torch.Tensor)
    if items_tensor and num_items_in_batch.device != target.device:  # e.g. the HF Trainer's count on the CPU
        num_items_in_batch = num_items_in_batch.to(target.device, non_blocking=True)
    if num_items_in_batch is not None:
        mode = _ITEMS_TENSOR if items_tensor else _ITEMS_NUMBER
    else:
        mode = _REDUCTION_MODES[reduction]
    sums = loss_rows is not None and mode != _NONE
    scale = None if mode == _NONE else scale_out if scale_out is not None else torch.empty(2, **f32)
    loss = torch.empty(size=(), **f32) if sums else None
    z = torch.empty(size=(), **f32) if sums else None
    # the zero accuracy is written by the kernel when it runs anyway (a scalar reduction), else filled by torch;
    # "none" keeps the per-token hits (scale is None there, so no launch)
    acc = None if mode == _NONE else torch.empty(size=(), **f32) if correct is not None or zero_acc else None
    if scale is not None or acc is not None:
        any_t = scale if scale is not None else acc
        n = target.shape[0]
        block = min(max(next_pow2(n), 16), 4096)  # one program: 65,536 tokens are 16 steps
        launcher(_reduce_kernel)[(1,)](
            target, cw if cw is not None else any_t,
            num_items_in_batch.reshape(()) if items_tensor else any_t,
            loss_rows if sums else any_t, z_rows if sums else any_t, correct if correct is not None else any_t,
            loss if sums else any_t, z if sums else any_t, acc if acc is not None else any_t,
            scale if scale is not None else any_t, n, vocab, int(ignore_index),
            float(num_items_in_batch) if mode == _ITEMS_NUMBER else 1.0,
            MODE=mode, HAS_WEIGHT=cw is not None, SUMS=sums, COMPUTE_ACC=correct is not None,
            ZERO_ACC=correct is None and acc is not None, BLOCK=block, num_warps=8 if block >= 2048 else 4,
        )
    if mode == _NONE and correct is not None:
        acc = correct
    elif acc is None and zero_acc:
        acc = torch.zeros(size=(), **f32)
    if mode == _NONE and loss_rows is not None:
        loss, z = loss_rows, z_rows
    return loss, z, acc, scale
