"""Vocabulary-parallel cross-entropy and fused linear cross-entropy, for an LM head whose rows (the vocabulary) are
split over the ranks of a process group (tensor parallelism: torch's ``ColwiseParallel`` on ``lm_head``, Megatron's
vocab-parallel output layer).

Each rank holds the logits (or the head rows) of classes [v0, v1) of V. The logits are never gathered. Per token
(formula of Megatron-LM's vocab-parallel cross-entropy, Shoeybi et al. 2019, extended to the options of
:func:`tigon.functional.cross_entropy`): each rank forms its shard's max and sum of exponentials in fp32
(:mod:`tigon.kernels.vocab_parallel`); the maxima are all-reduced with max, then the sums (rescaled to the global
max), the target's logit (the owner's value; the others add 0) and, for label smoothing, the logits' sum are
all-reduced with sum: one all-reduce of N floats and one of 4N floats per call (per chunk for the fused variant).
Every rank then holds the same loss. The gradient on each shard is the softmax of the shard under the global
log-sum-exp, minus 1 at the target on its owner only (:func:`tigon.kernels.loss_rows.ce_rows_backward`); it needs
no communication. The fused variant forms the hidden states' gradient from the local head rows, a partial sum that
is all-reduced (N x H floats, once per call) as Megatron's column-parallel input gradient is.

Three ways to pass the shards: this rank's plain shard with ``vocab_start`` (and a ``group``); a DTensor sharded on
the vocabulary over a 1-D mesh (its placement says where the shard starts); or a list of every shard in this
process (``group=None``): then the all-reduces are local sums over the list. The last is the same code path with
the reduction done in-process, for tests on one device.

Not supported on shards: class weights, accuracy / predicted tokens (an argmax across ranks), ``grad_in_forward`` /
``inplace_backward``, token scaling, ``accum_dtype`` / ``memory`` (the fp32 accumulator and the default chunk rule of
the fused loss apply). Eager mode: there is no torch.library custom op for these yet, and torch.compile is untested.
"""

from __future__ import annotations

import torch

from .. import _checks
from ..kernels.host_wait import host_read
from ..reference import cross_entropy as ref_ce
from ..reference import vocab_parallel as ref_vp
from ..reference.cross_entropy import LossOutput
from ..support import TORCH_CODE, select_backend
from ._dtensor import waited


# ---- reductions across the shards ----------------------------------------------------------------------------------
class _GroupReduce:
    """All-reduces over a torch.distributed process group (this process holds one shard)."""

    def __init__(self, group):
        import torch.distributed as dist

        self.dist, self.group = dist, group

    def max_(self, ts: list[torch.Tensor]) -> None:
        self.dist.all_reduce(ts[0], op=self.dist.ReduceOp.MAX, group=self.group)

    def sum_(self, ts: list[torch.Tensor]) -> None:
        self.dist.all_reduce(ts[0], op=self.dist.ReduceOp.SUM, group=self.group)


class _LocalReduce:
    """The same reductions over a list holding every shard's tensor (all shards in this process)."""

    @staticmethod
    def max_(ts: list[torch.Tensor]) -> None:
        r = torch.stack(ts).amax(0)
        for t in ts:
            t.copy_(r)

    @staticmethod
    def sum_(ts: list[torch.Tensor]) -> None:
        r = torch.stack(ts).sum(0)
        for t in ts:
            t.copy_(r)


class _Plan:
    """What one call needs besides tensors: the reducer, each shard's first class, the option values."""

    def __init__(self, reducer, starts, n_classes, opts: dict, reduction, num_items, kernels: bool):
        self.reducer, self.starts, self.n_classes = reducer, starts, n_classes
        self.ignore_index = int(opts["ignore_index"])
        self.eps = float(opts["label_smoothing"])
        self.zs = float(opts["lse_square_scale"])
        self.softcap = None if opts["softcap"] is None else float(opts["softcap"])
        self.logit_scale = float(opts.get("logit_scale", 1.0))
        self.reduction, self.num_items, self.kernels = reduction, num_items, kernels

    def stats(self, x, target, start):
        if self.kernels:
            from ..kernels.vocab_parallel import local_stats
        else:
            local_stats = ref_vp.local_stats
        return local_stats(x, target, start, self.ignore_index, self.logit_scale, self.softcap, self.eps > 0)

    def grad_(self, x, t_local, gstats, coef, out=None):
        """``coef * d loss / d x`` for a shard's logits ``x``, written into ``out`` (default: over ``x``)."""
        out = x if out is None else out
        if self.kernels:
            from ..kernels.loss_rows import LossOptions, ce_rows_backward

            opts = LossOptions(self.ignore_index, self.eps, self.zs, self.softcap, self.logit_scale)
            ce_rows_backward(x, t_local, None, None, gstats, opts, coef, out, None, n_classes=self.n_classes or 1)
        else:
            out.copy_(ref_vp.shard_grad(x, t_local, gstats, coef, ignore_index=self.ignore_index,
                                        label_smoothing=self.eps, lse_square_scale=self.zs,
                                        logit_scale=self.logit_scale, softcap=self.softcap,
                                        n_classes=self.n_classes or 1))
        return out

    def scale(self, valid: torch.Tensor) -> torch.Tensor | None:
        """0-d fp32: per-token losses -> the reduced loss (None for "none"); the z-loss shares it (no class
        weights)."""
        if self.num_items is not None:
            items = torch.as_tensor(self.num_items, device=valid.device).to(torch.float32).reshape(())
            return 1.0 / items
        if self.reduction == "none":
            return None
        if self.reduction == "sum":
            return torch.ones((), dtype=torch.float32, device=valid.device)
        count = valid.sum().to(torch.float32)
        return torch.where(count > 0, 1.0 / count.clamp_min(1.0), torch.zeros_like(count))

    def combine(self, parts: list[torch.Tensor], valid: torch.Tensor):
        """Per-token (ce, z) and the global (max, log-sum) (n, 2) from every local shard's (n, 5) partials
        (:mod:`tigon.kernels.vocab_parallel`); two reductions across the shards."""
        ms = [p[:, 0].clone() for p in parts]
        self.reducer.max_(ms)
        gmax = ms[0]
        packs = [torch.cat([(p[:, 1] * torch.exp(p[:, 0] - gmax))[:, None], p[:, 2:]], 1) for p in parts]
        self.reducer.sum_(packs)
        s, xt, own, sx = packs[0].unbind(1)
        logs = torch.where(valid, torch.log(s), torch.zeros_like(s))
        nll = (gmax - xt) + logs
        lse = gmax + logs
        ce = (1.0 - self.eps) * nll + (self.eps * (lse - sx / self.n_classes) if self.eps > 0 else 0.0)
        ce = torch.where(valid & (own != 1.0), torch.full_like(ce, float("nan")), ce)  # a target no shard owns
        zero = torch.zeros_like(ce)
        return torch.where(valid, ce, zero), torch.where(valid, self.zs * lse * lse, zero), \
            torch.stack([torch.where(valid, gmax, zero), logs], 1)

    def local_targets(self, target: torch.Tensor, start: int, width: int) -> torch.Tensor:
        """(n,) targets of one shard: t - start where it owns t, ignore_index where ignored, else a value outside
        [0, width) that is not ignore_index (no target term)."""
        other = -1 if self.ignore_index != -1 else -2
        t = target - start
        keep = (t >= 0) & (t < width)
        out = torch.where(keep, t, torch.full_like(t, other))
        return torch.where(target == self.ignore_index, target, out).contiguous()

    def reduce(self, ce, z, scale):
        if scale is None:
            return ce + z, z
        zsum = z.sum() * scale
        return ce.sum() * scale + zsum, zsum


class _VocabParallelCE(torch.autograd.Function):
    """``apply(target, plan, *shards)`` -> (loss, z_loss); gradients for each shard."""

    @staticmethod
    def forward(ctx, target, plan: _Plan, *shards):
        xs = [x if x.stride(-1) == 1 else x.contiguous() for x in shards]
        target = target.contiguous()
        valid = target != plan.ignore_index
        parts = [plan.stats(x, target, s) for x, s in zip(xs, plan.starts)]
        ce, z, gstats = plan.combine(parts, valid)
        scale = plan.scale(valid)
        loss, zl = plan.reduce(ce, z, scale)
        ctx.plan = plan
        ctx.save_for_backward(target, gstats, scale if scale is not None else gstats, *xs)
        ctx.mark_non_differentiable(zl)
        return loss, zl

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        target, gstats, scale, *xs = ctx.saved_tensors
        plan = ctx.plan
        coef = grad_loss.to(torch.float32)
        if plan.reduction != "none" or plan.num_items is not None:
            coef = (coef * scale).reshape(())
        grads = []
        for x, start, need in zip(xs, plan.starts, ctx.needs_input_grad[2:]):
            if not need:
                grads.append(None)
                continue
            t_local = plan.local_targets(target, start, x.shape[1])
            grads.append(plan.grad_(x, t_local, gstats, coef, out=torch.empty_like(x)))
        return (None, None, *grads)


# ---- arguments -----------------------------------------------------------------------------------------------------
def _dtensor_shard(t, dim: int, name: str):
    """(local tensor, first index along ``dim``, global size along ``dim``, group) of a DTensor sharded on ``dim``
    over a 1-D mesh."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    placements = tuple(t.placements)
    if t.device_mesh.ndim != 1 or not (isinstance(placements[0], Shard) and placements[0].dim % t.ndim == dim):
        raise ValueError(f"{name} must be a DTensor sharded on dimension {dim} over a 1-D mesh (Shard({dim})), got "
                         f"placements {placements} on a {t.device_mesh.ndim}-D mesh")
    _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, placements)
    return t.to_local(), int(offset[dim]), int(t.shape[dim]), t.device_mesh.get_group(0)


def _shards(arg, name: str, dim: int, group, vocab_start, vocab_size):
    """(list of local shards, their first classes, reducer, total classes or None) for the three forms."""
    if isinstance(arg, (list, tuple)):
        if group is not None or vocab_start is not None:
            raise ValueError(f"{name} is a list of every shard in this process: group and vocab_start must be None")
        if not arg:
            raise ValueError(f"{name} is an empty list")
        starts, pos = [], 0
        for i, t in enumerate(arg):
            _checks.tensor(f"{name}[{i}]", t, floating=True, ndim=2 if dim == 1 else (1, 2))
            starts.append(pos)
            pos += t.shape[dim if t.ndim == 2 else 0]
        if vocab_size is not None and vocab_size != pos:
            raise ValueError(f"vocab_size={vocab_size} but the shards of {name} hold {pos} classes")
        return list(arg), starts, _LocalReduce(), pos
    if _checks.is_dtensor(arg):
        if group is not None or vocab_start is not None:
            raise ValueError(f"{name} is a DTensor: its mesh gives the group and its placement the shard's start; "
                             "group and vocab_start must be None")
        local, start, total, grp = _dtensor_shard(arg, dim if arg.ndim == 2 else 0, name)
        return [local], [start], _GroupReduce(grp), total
    if vocab_start is None:
        raise ValueError(f"{name} is one rank's shard: pass vocab_start (the global id of its first class), or a "
                         "DTensor, or a list of every shard")
    if isinstance(vocab_start, bool) or not isinstance(vocab_start, int) or vocab_start < 0:
        raise ValueError(f"vocab_start must be an int >= 0, got {vocab_start!r}")
    return [arg], [vocab_start], _GroupReduce(group), vocab_size


def _total_classes(n_classes, shards, reducer, dim: int) -> int:
    """The vocabulary size: given, or the shards' widths summed across the group (one all-reduce, a host read)."""
    if n_classes is not None:
        return int(n_classes)
    width = torch.tensor([float(shards[0].shape[dim])], device=shards[0].device)
    reducer.sum_([width])
    return int(host_read(width.item))


def _finish(loss, z, return_z_loss: bool):
    return LossOutput(loss, z) if return_z_loss else loss


def vocab_parallel_cross_entropy(
    logits,
    target: torch.Tensor,
    *,
    group=None,
    vocab_start: int | None = None,
    vocab_size: int | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_z_loss: bool = False,
):
    """Cross-entropy of logits split over ranks by vocabulary, without gathering them (module docstring).

    Equal to ``tigon.functional.cross_entropy(torch.cat(all shards, dim=1), target, ...)`` (same formula, options and
    reductions; the z-loss averaged per non-ignored token, unweighted), on every rank.

    Args:
        logits: this rank's shard (N, Vl) of the logits, holding classes [vocab_start, vocab_start + Vl); or a
            DTensor (N, V) sharded ``Shard(1)`` over a 1-D mesh (its group and offset are used); or a list of every
            shard in order (all in this process: the reductions are local; ``group`` and ``vocab_start`` None).
            float32 / bfloat16 / float16; the loss math is fp32.
        target: (N,) integer global class ids in [0, V) or ``ignore_index``; the same on every rank.
        group: the process group the vocabulary is split over (None: the default group); plain shards only.
        vocab_start: global id of this shard's first class (plain shards only).
        vocab_size: V, the total number of classes; when None (plain shards) it is the sum of the shards' widths,
            one extra all-reduce and host read, made only when label smoothing or a CPU target check needs it.
        ignore_index, reduction, label_smoothing, lse_square_scale, softcap, num_items_in_batch, return_z_loss: as
            :func:`tigon.functional.cross_entropy`.

    Returns:
        The float32 loss, 0-d or (N,) for "none", identical on every rank (or ``LossOutput(loss, z_loss)``). The
        gradient reaches each rank's own shard (for a DTensor: a DTensor gradient with its placements).

    Raises:
        TypeError: logits not floating, target not integer, ignore_index not an int (a bool or a float is not one),
            return_z_loss not a bool.
        ValueError: shapes (each shard (N, Vl), target (N,)), a missing or negative vocab_start, a DTensor not
            sharded on the vocabulary over a 1-D mesh, bad options (as cross_entropy), targets outside [0, V) on
            the CPU (on CUDA their loss is NaN: no host read).
    """
    shards, starts, reducer, n_classes = _shards(logits, "logits", 1, group, vocab_start, vocab_size)
    ignore_index = _checks.integer("ignore_index", ignore_index)  # (True was 1, -100.5 was -100)
    _checks.flag("return_z_loss", return_z_loss)
    for i, x in enumerate(shards):
        ref_ce.check_inputs(x, target, None, reduction=reduction, label_smoothing=label_smoothing,
                            lse_square_scale=lse_square_scale, softcap=softcap, num_items_in_batch=num_items_in_batch)
    if label_smoothing > 0 or target.is_cpu:
        n_classes = _total_classes(n_classes, shards, reducer, 1)
        if target.is_cpu:
            ref_ce.check_target_range(target, n_classes, ignore_index)
    kernels = select_backend("cross_entropy", shards[0]) not in TORCH_CODE
    plan = _Plan(reducer, starts, n_classes, dict(ignore_index=ignore_index, label_smoothing=label_smoothing,
                                                  lse_square_scale=lse_square_scale, softcap=softcap),
                 reduction, num_items_in_batch, kernels)
    loss, z = _VocabParallelCE.apply(target, plan, *shards)
    return _finish(loss, z, return_z_loss)


# ---- fused linear --------------------------------------------------------------------------------------------------
class _VocabParallelFLCE(torch.autograd.Function):
    """``apply(hidden, target, plan, cd, need, n_shards, *weights, *biases)`` -> (loss, z_loss)."""

    @staticmethod
    def forward(ctx, hidden, target, plan: _Plan, cd, need, n_shards, *params):
        from ..kernels.fused_linear_cross_entropy import chunk_rows
        from ..kernels.head_grads import _Matmuls, _operands, grad_buffers

        ws, bs = list(params[:n_shards]), list(params[n_shards:])
        n, hdim = hidden.shape
        dev = hidden.device
        target = target.contiguous()
        valid = target != plan.ignore_index
        scale = plan.scale(valid)
        scalar = scale is not None and any(need)
        ops = [_operands(hidden, w, b, cd) for w, b in zip(ws, bs)]
        h = ops[0][0]
        t_locals = [plan.local_targets(target, s, w.shape[0]) for s, w in zip(plan.starts, ws)]
        rows = chunk_rows(n, max(w.shape[0] for w in ws), hdim, dev, False, scalar and need[1], cd.itemsize)
        bufs = [torch.empty((rows, w.shape[0]), dtype=cd, device=dev) for w in ws]
        # halves: a 2-byte weight's gradient is cast in its fp32 accumulator's memory (no second (Vl, H) buffer)
        grads = [grad_buffers(n, hidden, w, cd, (need[0], need[1], need[2] and b is not None), False, True, True)
                 if scalar else (None, None, None) for w, b in zip(ws, bs)]
        ce, z = torch.empty(n, dtype=torch.float32, device=dev), torch.empty(n, dtype=torch.float32, device=dev)
        gstats = torch.empty((n, 2), dtype=torch.float32, device=dev)
        with torch.autocast(dev.type, enabled=False):
            mm = _Matmuls(dev, cd)
            for s in range(0, n, rows):
                e = min(s + rows, n)
                hs = h[s:e]
                lgs = [buf[: e - s] for buf in bufs]
                for lg, (_, w, b) in zip(lgs, ops):
                    mm.logits(lg, hs, w, b)
                parts = [plan.stats(lg, target[s:e], st) for lg, st in zip(lgs, plan.starts)]
                ce[s:e], z[s:e], gstats[s:e] = plan.combine(parts, valid[s:e])
                if scalar:
                    for lg, tl_, (_, w, _b), (gh, gw, gb) in zip(lgs, t_locals, ops, grads):
                        plan.grad_(lg, tl_[s:e], gstats[s:e], scale)
                        mm.chunk_grads(lg, hs, w, gh[s:e] if gh is not None else None, gw, gb, s == 0)
        loss, zl = plan.reduce(ce, z, scale)
        ctx.plan, ctx.cd, ctx.need, ctx.n_shards = plan, cd, need, n_shards
        ctx.dtypes = (hidden.dtype, [w.dtype for w in ws], [b.dtype if b is not None else None for b in bs])
        ctx.done = False
        if scalar:
            if need[0]:
                plan.reducer.sum_([g[0] for g in grads])  # the hidden states' gradient: a sum over the shards
            ctx.grads = grads
        else:
            ctx.grads = None
            ctx.save_for_backward(hidden, target, gstats, *ws, *[b if b is not None else gstats for b in bs])
            ctx.has_bias = [b is not None for b in bs]
        ctx.mark_non_differentiable(zl)
        return loss, zl

    @staticmethod
    def backward(ctx, grad_loss, _grad_z):
        from ..kernels.fused_linear_cross_entropy import backward_over_chunks
        from ..kernels.head_grads import finish_grad, scale_grads

        plan, n_sh = ctx.plan, ctx.n_shards
        h_dtype, w_dtypes, b_dtypes = ctx.dtypes
        if not any(ctx.need):
            return (None,) * (6 + 2 * n_sh)
        if ctx.grads is not None:
            if ctx.done:
                raise RuntimeError("tigon.vocab_parallel_fused_linear_cross_entropy: the gradients were formed in "
                                   "the forward and handed to the first backward; a second backward is not possible")
            ctx.done = True
            outs = [scale_grads(g, grad_loss, (h_dtype, wd, bd), inplace=True)
                    for g, wd, bd in zip(ctx.grads, w_dtypes, b_dtypes)]
            ctx.grads = None
            gh = outs[0][0]
        else:
            hidden, target, gstats, *rest = ctx.saved_tensors
            ws = rest[:n_sh]
            bs = [b if has else None for b, has in zip(rest[n_sh:], ctx.has_bias)]
            coef = grad_loss.to(torch.float32)
            outs, ghs = [], []
            for w, b, start in zip(ws, bs, plan.starts):
                t_local = plan.local_targets(target, start, w.shape[0])

                def rows_grad(lg, s, e, t_local=t_local):
                    plan.grad_(lg, t_local[s:e], gstats[s:e], coef[s:e])

                need = (ctx.need[0], ctx.need[1], ctx.need[2] and b is not None)
                out = backward_over_chunks(hidden, w, b, ctx.cd, need, False, True, -1, rows_grad, scalar=True)
                outs.append(out)
                ghs.append(out[0])
            if ctx.need[0]:
                plan.reducer.sum_(ghs)
            outs = [tuple(finish_grad(t, None, dt) for t, dt in zip(o, (h_dtype, wd, bd)))
                    for o, wd, bd in zip(outs, w_dtypes, b_dtypes)]
            gh = outs[0][0]
        return (gh if ctx.need[0] else None, None, None, None, None, None,
                *[o[1] for o in outs], *[o[2] for o in outs])


def vocab_parallel_fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight,
    target: torch.Tensor,
    bias=None,
    *,
    group=None,
    vocab_start: int | None = None,
    vocab_size: int | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    lse_square_scale: float = 0.0,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_z_loss: bool = False,
):
    """``cross_entropy(logit_scale * (hidden @ W.T + b), target)`` for an LM head W (V, H) whose rows are split over
    ranks, without the logits: neither gathered nor whole on any rank (module docstring).

    Chunked over the tokens as :func:`tigon.functional.fused_linear_cross_entropy`; per chunk the local logits
    ``hidden_chunk @ W_local.T`` feed the local pass, two all-reduces of the chunk's partials, and (scalar
    reductions) the gradient pass and its matmuls. The hidden states' gradient is each rank's partial product,
    all-reduced once per call (in the forward for "mean" / "sum", in the backward for "none", which recomputes the
    logits).

    Args:
        hidden: (N, H) float32 / bfloat16 / float16 hidden states, the same on every rank: a plain tensor, or a
            DTensor (redistributed to Replicate first when sharded, e.g. sequence parallel: an all-gather); an
            AsyncCollectiveTensor (a collective's result not waited for yet) is waited for.
        weight: this rank's head rows (Vl, H) with ``vocab_start``; or a DTensor (V, H) sharded ``Shard(0)`` over a
            1-D mesh (torch's ColwiseParallel); or a list of every shard (all in this process, local reductions).
        target: (N,) global class ids in [0, V) or ``ignore_index``, the same on every rank.
        bias: None, or the matching (Vl,) shard / DTensor ``Shard(0)`` / list.
        group, vocab_start, vocab_size: as :func:`vocab_parallel_cross_entropy`.
        logit_scale, ignore_index, reduction, label_smoothing, lse_square_scale, softcap, num_items_in_batch,
            return_z_loss: as :func:`tigon.functional.fused_linear_cross_entropy`.

    Returns:
        The float32 loss (0-d, or (N,) for "none"), identical on every rank, or ``LossOutput(loss, z_loss)``.
        Gradients: the local head rows' (a DTensor's: with its placement), and the hidden states' whole gradient
        on every rank.

    Raises:
        TypeError, ValueError: as :func:`vocab_parallel_cross_entropy` and
            :func:`tigon.functional.fused_linear_cross_entropy` (hidden (N, H), weight (Vl, H), bias (Vl,)).
    """
    ws, starts, reducer, n_classes = _shards(weight, "weight", 0, group, vocab_start, vocab_size)
    ignore_index = _checks.integer("ignore_index", ignore_index)
    _checks.flag("return_z_loss", return_z_loss)
    if bias is None:
        bs = [None] * len(ws)
    elif isinstance(bias, (list, tuple)) or _checks.is_dtensor(bias):
        bs = _shards(bias, "bias", 0, None, None, None)[0]
    else:
        bs = [bias]
    if len(bs) != len(ws):
        raise ValueError(f"bias must have one shard per weight shard ({len(ws)}), got {len(bs)}")
    if _checks.is_dtensor(hidden):  # every rank needs all rows (as ColwiseParallel's Replicate input)
        from torch.distributed.tensor import Replicate

        rep = (Replicate(),) * hidden.device_mesh.ndim
        if tuple(hidden.placements) != rep:
            hidden = hidden.redistribute(hidden.device_mesh, rep)
        hidden = hidden.to_local()
    hidden = waited(hidden)  # a collective's result not waited for yet (AsyncCollectiveTensor): its plain tensor
    from ..reference import fused_linear_cross_entropy as ref_flce

    for w, b in zip(ws, bs):
        ref_flce.check_inputs(hidden, w, target, b, None, logit_scale=logit_scale, reduction=reduction,
                              label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap,
                              num_items_in_batch=num_items_in_batch)
    if label_smoothing > 0 or target.is_cpu:
        n_classes = _total_classes(n_classes, ws, reducer, 0)
        if target.is_cpu:
            ref_ce.check_target_range(target, n_classes, ignore_index)
    dev_type = hidden.device.type
    if dev_type in ("cpu", "cuda") and torch.is_autocast_enabled(dev_type):
        cd = torch.get_autocast_dtype(dev_type)
    else:
        cd = torch.promote_types(hidden.dtype, ws[0].dtype)
    kernels = select_backend("fused_linear_cross_entropy", hidden) not in TORCH_CODE
    if cd not in (torch.float32, torch.bfloat16, torch.float16):
        kernels = False
    plan = _Plan(reducer, starts, n_classes, dict(ignore_index=ignore_index, label_smoothing=label_smoothing,
                                                  lse_square_scale=lse_square_scale, softcap=softcap,
                                                  logit_scale=logit_scale),
                 reduction, num_items_in_batch, kernels)
    grad_on = torch.is_grad_enabled()
    need = (grad_on and hidden.requires_grad, grad_on and any(w.requires_grad for w in ws),
            grad_on and any(b is not None and b.requires_grad for b in bs))
    loss, z = _VocabParallelFLCE.apply(hidden, target, plan, cd, need, len(ws), *ws, *bs)
    return _finish(loss, z, return_z_loss)
