"""Vocabulary-parallel cross-entropy as a module: Liger-Kernel's ``LigerVocabParallelCrossEntropy`` (0.8.5) under
Tigon's name, over :func:`tigon.functional.vocab_parallel_cross_entropy`."""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from .. import functional as TF

_FORMULAS = ("pytorch", "megatron")
_MODES = ("global", "partition")


def _rank_and_world(group) -> tuple[int, int]:
    """(rank in ``group``, its size) for a process group of several ranks, else (0, 1) (Liger's TP=1: None, a
    single-rank group, or torch.distributed not initialised)."""
    import torch.distributed as dist

    if group is None or not dist.is_available() or not dist.is_initialized():
        return 0, 1
    world = dist.get_world_size(group)
    return (dist.get_rank(group), world) if world > 1 else (0, 1)


class VocabParallelCrossEntropy(nn.Module):
    """Per-token cross-entropy of logits split over tensor-parallel ranks by vocabulary, without gathering them
    (Liger-Kernel's ``LigerVocabParallelCrossEntropy``: the same constructor, forward and result).

    Args (Liger 0.8.5's, in its order):
        ignore_index: the target of tokens that get loss 0 and no gradient.
        label_smoothing: in [0, 1). ``label_smoothing_formula="pytorch"``: torch's, ``(1 - a) * nll + a * mean over
            the V classes of -log p``; ``"megatron"``: the same with ``a * V / (V - 1)`` (Megatron-LM's).
        reduction: must be ``"none"`` (the per-token losses; reduce them downstream), as Liger.
        label_smoothing_mode: ``"global"`` (the mean over all V classes, exact) or ``"partition"`` (Liger's mean
            over each rank's own classes, a per-rank approximation): the same at one rank; with several ranks and
            label smoothing ``"partition"`` raises (Tigon computes the exact global mean only).

    Forward:
        ``loss(vocab_parallel_logits, target, tp_group=None)``: this rank's (S, B, V_local) logits (float32 /
        bfloat16 / float16), holding classes ``[rank * V_local, (rank + 1) * V_local)`` of ``tp_group`` (equal
        shards, Megatron's layout); (S, B) integer global targets, the same on every rank; ``tp_group`` None (or
        one rank) for TP=1. Returns (S, B) float32 per-token losses, identical on every rank; the gradient reaches
        this rank's shard. Computed by :func:`tigon.functional.vocab_parallel_cross_entropy` (fp32 math).

    Raises:
        ValueError: reduction not "none", label_smoothing outside [0, 1), an unknown formula or mode (at
            construction); logits not 3-D, a target not of the logits' leading shape (S, B), ``"partition"`` with
            label smoothing over several ranks, ``"megatron"`` smoothing that scales to 1 or more (V classes need
            label_smoothing < (V - 1) / V), and the functional op's checks (at the forward).
        TypeError: target not a tensor (and the functional op's checks).
    """

    def __init__(self, ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "none",
                 label_smoothing_formula: str = "pytorch", label_smoothing_mode: str = "global"):
        super().__init__()
        if reduction != "none":
            raise ValueError(f"reduction must be 'none' (the per-token losses, as Liger's), got {reduction!r}")
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
                or not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
        _checks.choice("label_smoothing_formula", label_smoothing_formula, _FORMULAS)
        _checks.choice("label_smoothing_mode", label_smoothing_mode, _MODES)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing
        self.reduction = reduction
        self.label_smoothing_formula = label_smoothing_formula
        self.label_smoothing_mode = label_smoothing_mode

    def forward(self, vocab_parallel_logits: torch.Tensor, target: torch.Tensor, tp_group=None) -> torch.Tensor:
        if not isinstance(vocab_parallel_logits, torch.Tensor) or vocab_parallel_logits.dim() != 3:
            shape = tuple(getattr(vocab_parallel_logits, "shape", ()))
            raise ValueError(f"vocab_parallel_logits must be 3-D ([seq, batch, vocab]), got shape {shape} "
                             "(HF's [batch, seq, vocab] works too: the losses are per token)")
        _checks.tensor("target", target)
        if tuple(target.shape) != tuple(vocab_parallel_logits.shape[:-1]):  # ((B, S) for (S, B): other tokens' pairs)
            raise ValueError(f"target must have shape {tuple(vocab_parallel_logits.shape[:-1])} (the logits' "
                             f"leading dimensions), got {tuple(target.shape)}")
        rank, world = _rank_and_world(tp_group)
        v_local = vocab_parallel_logits.shape[-1]
        smoothing = self.label_smoothing
        if smoothing > 0 and world > 1 and self.label_smoothing_mode == "partition":
            raise ValueError("label_smoothing_mode='partition' (Liger's per-rank mean) is not supported with several "
                             "ranks and label smoothing: use 'global', the exact mean over all classes")
        if smoothing > 0 and self.label_smoothing_formula == "megatron":
            n_classes = v_local * world
            if not smoothing * n_classes < n_classes - 1:  # (the scaled smoothing must stay below 1)
                raise ValueError(f"label_smoothing={self.label_smoothing} with label_smoothing_formula='megatron' "
                                 f"scales to label_smoothing * V / (V - 1), which must stay below 1: V = {n_classes} "
                                 f"classes needs label_smoothing < {(n_classes - 1) / n_classes:g}")
            smoothing = smoothing * n_classes / (n_classes - 1)
        logits = vocab_parallel_logits.reshape(-1, v_local)
        shape = target.shape
        target = target.reshape(-1)
        opts = dict(ignore_index=self.ignore_index, reduction="none", label_smoothing=smoothing)
        if world == 1:
            loss = TF.vocab_parallel_cross_entropy([logits], target, **opts)
        else:
            loss = TF.vocab_parallel_cross_entropy(logits, target, group=tp_group, vocab_start=rank * v_local,
                                                   vocab_size=v_local * world, **opts)
        return loss.reshape(shape)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, label_smoothing={self.label_smoothing}, "
                f"reduction={self.reduction!r}, label_smoothing_formula={self.label_smoothing_formula!r}, "
                f"label_smoothing_mode={self.label_smoothing_mode!r}")
