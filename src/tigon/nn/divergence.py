"""Distillation-loss modules over :mod:`tigon.functional`'s divergences: Liger-Kernel's ``LigerJSD``,
``LigerKLDIVLoss`` and ``LigerTVDLoss`` under Tigon's names, with their constructor and forward arguments."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as TF


def _rows(a: torch.Tensor, b: torch.Tensor, labels: torch.Tensor | None):
    """(..., V) tables and (...) labels as (N, V) and (N,), plus the leading shape to restore pointwise losses."""
    if a.dim() == 2:
        return a, b, labels, None
    if a.dim() < 2 or tuple(b.shape) != tuple(a.shape):
        raise ValueError(f"the two tables must have one shape (..., V), got {tuple(a.shape)} and {tuple(b.shape)}")
    if labels is not None and tuple(labels.shape) != tuple(a.shape[:-1]):
        raise ValueError(f"shift_labels must have the leading shape {tuple(a.shape[:-1])}, got {tuple(labels.shape)}")
    v = a.shape[-1]
    return a.reshape(-1, v), b.reshape(-1, v), None if labels is None else labels.reshape(-1), tuple(a.shape)


class JSD(nn.Module):
    """Generalised Jensen-Shannon divergence for distillation: :func:`tigon.functional.jsd` (Liger's ``LigerJSD``).

    Args:
        beta: in [0, 1], the teacher's weight in the mixture (0: forward KL(teacher || student), 1: reverse KL).
        ignore_index: label of the rows that are skipped.

    Forward:
        ``loss(log_q, log_p, shift_labels=None)``: log_q the student's log-probabilities (N, V) or (..., V),
        float32 / bfloat16 / float16; log_p the teacher's, same shape; shift_labels (N,) or (...) integers. Returns
        a 0-d float32 loss averaged over the kept rows.

    Raises:
        ValueError, TypeError: shapes, dtypes, beta outside [0, 1] (from the functional op).
    """

    def __init__(self, beta: float = 0.5, ignore_index: int = -100):
        super().__init__()
        self.beta = beta
        self.ignore_index = ignore_index

    def forward(self, log_q: torch.Tensor, log_p: torch.Tensor, shift_labels: torch.Tensor | None = None):
        q, p, labels, _ = _rows(log_q, log_p, shift_labels)
        return TF.jsd(q, p, labels, self.beta, self.ignore_index)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, ignore_index={self.ignore_index}"


class KLDivLoss(nn.KLDivLoss):
    """``torch.nn.KLDivLoss`` computed by :func:`tigon.functional.kl_div` (Liger's ``LigerKLDIVLoss``).

    Args:
        eps: lower clamp of probability targets inside the log (Liger's), then torch.nn.KLDivLoss's arguments
            (``size_average``, ``reduce``, ``reduction="mean"``, ``log_target=False``; the legacy two set
            ``reduction`` as in torch).

    Forward:
        ``loss(y_pred, y_true)``: y_pred log-probabilities (N, V) or (..., V), y_true probabilities
        (log-probabilities with ``log_target``) of the same shape. Returns a float32 loss: 0-d, or y_pred's shape
        for ``"none"``. ``"batchmean"`` divides the sum by y_pred's first dimension, as torch's module does (for a
        (B, T, V) input: by B, not by the B * T rows).

    Raises:
        As :func:`tigon.functional.kl_div`, at the forward, for bad inputs.
    """

    def __init__(self, eps: float = 1e-10, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = eps

    def forward(self, y_pred: torch.Tensor, y_true: torch.Tensor):
        x, t, _, lead = _rows(y_pred, y_true, None)
        if lead is not None and self.reduction == "batchmean":
            # torch's batchmean is the sum over the batch dimension's size (dim 0), not over the flattened rows
            out = TF.kl_div(x, t, reduction="sum", log_target=self.log_target, eps=self.eps)
            return out / max(lead[0], 1)
        out = TF.kl_div(x, t, reduction=self.reduction, log_target=self.log_target, eps=self.eps)
        return out.reshape(lead) if lead is not None and self.reduction == "none" else out


class TVDLoss(nn.Module):
    """Total variation distance ``|p - q| / 2``: :func:`tigon.functional.tvd` (Liger's ``LigerTVDLoss``).

    Args:
        reduction: ``"batchmean"`` (default, as Liger's module; the functional's default is "mean"), ``"mean"``,
            ``"sum"`` or ``"none"``.
        ignore_index: label of the rows that are skipped.

    Forward:
        ``loss(p, q, shift_labels=None)``: p, q probabilities (N, V) or (..., V); shift_labels (N,) or (...)
        integers. Returns a float32 loss: 0-d, or p's shape for ``"none"``.

    Raises:
        As :func:`tigon.functional.tvd`, at the forward, for bad inputs.
    """

    def __init__(self, reduction: str = "batchmean", ignore_index: int = -100):
        super().__init__()
        self.reduction = reduction
        self.ignore_index = ignore_index

    def forward(self, p: torch.Tensor, q: torch.Tensor, shift_labels: torch.Tensor | None = None):
        a, b, labels, lead = _rows(p, q, shift_labels)
        out = TF.tvd(a, b, labels, self.reduction, self.ignore_index)
        return out.reshape(lead) if lead is not None and self.reduction == "none" else out

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"
