"""Distillation through both LM heads without their logits: Liger-Kernel's ``LigerFusedLinearJSD`` (its
``transformers`` module) and ``LigerFusedLinearJSDLoss`` (its ``chunked_loss`` module) under Tigon's names, with their
constructor and forward arguments, computed by :func:`tigon.functional.fused_linear_jsd` (and, for the latter's hard
loss, :func:`tigon.functional.fused_linear_cross_entropy`)."""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from .. import functional as TF


class FusedLinearJSD(nn.Module):
    """Generalised JSD of the student's and the teacher's next-token distributions from their hidden states and LM
    heads (Liger's ``LigerFusedLinearJSD``): :func:`tigon.functional.fused_linear_jsd`.

    Args:
        jsd_beta: in [0, 1]; 0 forward KL(teacher || student), 1 reverse KL, 0.5 JSD.
        ignore_index: the label of the rows that are skipped.
        temperature: divides both models' logits (> 0).
        accum_dtype: None / torch.float32 (exact fp32 grad_weight accumulation, Tigon's default) or the student
            weight's dtype (less memory; Liger's default when None).
        student_softcap, teacher_softcap (keyword, Tigon's; Liger has none): each model's final-logit soft-cap ``c``
            (Gemma 2's ``final_logit_softcapping``: ``c * tanh(z / c)`` before the temperature), or None.

    Forward:
        ``loss(student_input, student_weight, teacher_input, teacher_weight, shift_labels=None)``: (N, H) and (V, H)
        for the student, (N, H') and (V, H') for the teacher, (N,) integer labels. Returns a 0-d float32 loss
        averaged over the kept rows; gradients to student_input and student_weight.

    Raises:
        TypeError, ValueError: bad inputs or options, at the forward (from the functional op).
    """

    def __init__(self, jsd_beta: float = 0.5, ignore_index: int = -100, temperature: float = 1.0,
                 accum_dtype: torch.dtype | None = None, *, student_softcap: float | None = None,
                 teacher_softcap: float | None = None):
        super().__init__()
        self.jsd_beta = jsd_beta
        self.ignore_index = ignore_index
        self.temperature = temperature
        self.accum_dtype = accum_dtype
        self.student_softcap = student_softcap
        self.teacher_softcap = teacher_softcap

    def forward(self, student_input, student_weight, teacher_input, teacher_weight, shift_labels=None):
        return TF.fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                   self.jsd_beta, self.ignore_index, self.temperature, self.accum_dtype,
                                   student_softcap=self.student_softcap, teacher_softcap=self.teacher_softcap)

    def extra_repr(self) -> str:
        return (f"jsd_beta={self.jsd_beta}, ignore_index={self.ignore_index}, temperature={self.temperature}"
                + _caps_repr(self))


def _loss_weight(name: str, value):
    """A loss weight as Liger-Kernel takes it: a finite real number (a numpy scalar too) as a float, or a 0-d floating
    tensor as it is (multiplied lazily: no host sync for a CUDA one).

    Raises:
        TypeError: neither (a bool is not a number; a tensor of another shape or dtype). ValueError: not finite.
    """
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or not value.is_floating_point():
            raise TypeError(f"{name} must be a real number or a 0-d floating tensor, got a tensor of shape "
                            f"{tuple(value.shape)} and dtype {value.dtype}")
        return value
    return _checks.number(name, value)


class FusedLinearJSDLoss(nn.Module):
    """Distillation loss ``weight_hard_loss * CE(student, labels) + weight_soft_loss * JSD(student, teacher)``
    (Liger's chunked ``LigerFusedLinearJSDLoss``), without either model's logits.

    The hard loss is the student's cross-entropy on its raw logits (no temperature), averaged over the labels that
    are not ``ignore_index`` (:func:`tigon.functional.fused_linear_cross_entropy`); the soft loss the generalised JSD
    of the temperature-scaled distributions averaged over the same rows (:func:`tigon.functional.fused_linear_jsd`),
    as Liger's ``LigerFusedLinearDistillationBase`` computes them. The two run as two passes over the student's head
    (the hard one skipped when ``weight_hard_loss == 0`` and ``return_soft_hard_loss`` is off, as Liger skips it).

    Args (Liger 0.8.5's):
        weight_hard_loss, weight_soft_loss: the two weights.
        beta: the JSD's beta in [0, 1] (0 forward KL(teacher || student), 1 reverse KL).
        ignore_index: the label of the rows that are skipped (in both losses).
        temperature: divides both models' logits in the soft loss (> 0).
        compiled, chunk_size: accepted, not read (Liger's torch.compile switch and chunk size).
        return_soft_hard_loss: return ``(loss, soft_loss, hard_loss)``.
        student_softcap, teacher_softcap (keyword, Tigon's; Liger has none): each model's final-logit soft-cap ``c``
            (Gemma 2's ``final_logit_softcapping``), or None. The student's applies to both losses (its logits are
            capped), the teacher's to the soft loss.

    Forward:
        ``loss(student_input, student_weight, teacher_input, teacher_weight, true_labels, student_bias=None,
        teacher_bias=None)``: (N, H), (V, H), (N, H'), (V, H'), (N,) integer labels (None: every row, no hard
        loss: only with ``weight_hard_loss=0``), optional (V,) biases; or, as Liger takes them (TRL's GKD trainer),
        (B, T, H) / (B, T, H') hidden states and (B, T) labels, the same loss as their B * T rows. Returns a
        0-d float32 loss (or the triple); gradients to student_input, student_weight and student_bias. Unlike
        Liger, the two vocabularies must be equal (Liger pads a smaller student vocabulary with zero logits).

    Raises:
        TypeError, ValueError: bad inputs or options, at the forward (from the functional ops; weight_hard_loss and
            weight_soft_loss not finite real numbers).
    """

    def __init__(self, weight_hard_loss: float = 0.5, weight_soft_loss: float = 0.5, beta: float = 0.5,
                 ignore_index: int = -100, temperature: float = 1.0, compiled: bool = True, chunk_size: int = 1024,
                 return_soft_hard_loss: bool = False, *, student_softcap: float | None = None,
                 teacher_softcap: float | None = None):
        super().__init__()
        self.student_softcap = student_softcap
        self.teacher_softcap = teacher_softcap
        self.weight_hard_loss = weight_hard_loss
        self.weight_soft_loss = weight_soft_loss
        self.beta = beta
        self.ignore_index = ignore_index
        self.temperature = temperature
        self.compiled = compiled
        self.chunk_size = chunk_size
        self.return_soft_hard_loss = return_soft_hard_loss

    def forward(self, student_input, student_weight, teacher_input, teacher_weight, true_labels, student_bias=None,
                teacher_bias=None):
        # (read here: Liger's modules read their attributes at each call, so they may change between calls)
        weight_hard = _loss_weight("weight_hard_loss", self.weight_hard_loss)
        weight_soft = _loss_weight("weight_soft_loss", self.weight_soft_loss)
        student_input, teacher_input, true_labels = _rows(student_input, teacher_input, true_labels)
        soft = TF.fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, true_labels,
                                   self.beta, self.ignore_index, self.temperature, student_bias=student_bias,
                                   teacher_bias=teacher_bias, student_softcap=self.student_softcap,
                                   teacher_softcap=self.teacher_softcap)
        loss = weight_soft * soft
        hard = None
        if isinstance(weight_hard, torch.Tensor) or weight_hard != 0 or self.return_soft_hard_loss:
            if true_labels is None:
                raise TypeError("true_labels must be a tensor of (N,) integer labels for the hard loss "
                                f"(weight_hard_loss={self.weight_hard_loss}, return_soft_hard_loss="
                                f"{self.return_soft_hard_loss}); None only with weight_hard_loss=0")
            hard = TF.fused_linear_cross_entropy(student_input, student_weight, true_labels, student_bias,
                                                 ignore_index=self.ignore_index, softcap=self.student_softcap)
            loss = loss + weight_hard * hard
        return (loss, soft, hard) if self.return_soft_hard_loss else loss

    def extra_repr(self) -> str:
        return (f"weight_hard_loss={self.weight_hard_loss}, weight_soft_loss={self.weight_soft_loss}, "
                f"beta={self.beta}, ignore_index={self.ignore_index}, temperature={self.temperature}"
                + _caps_repr(self))


def _rows(student_input, teacher_input, true_labels):
    """(B, T, H) hidden states and (B, T) labels (TRL's GKD call of Liger's loss, whose chunks run over dim 0) as
    (B * T, H) rows and (B * T,) labels; 2-D inputs and anything else as given (the functional ops check them).

    Raises:
        ValueError: 3-D hidden states whose labels are not of their (B, T) shape."""
    if not (isinstance(student_input, torch.Tensor) and student_input.dim() == 3):
        return student_input, teacher_input, true_labels
    if isinstance(true_labels, torch.Tensor) and true_labels.shape != student_input.shape[:-1]:
        raise ValueError(f"true_labels must have shape {tuple(student_input.shape[:-1])} (student_input's leading "
                         f"dims), got {tuple(true_labels.shape)}")
    student_input = student_input.flatten(0, 1)
    if isinstance(teacher_input, torch.Tensor) and teacher_input.dim() == 3:
        teacher_input = teacher_input.flatten(0, 1)
    if isinstance(true_labels, torch.Tensor):
        true_labels = true_labels.flatten()
    return student_input, teacher_input, true_labels


def _caps_repr(module) -> str:
    """``", student_softcap=..., teacher_softcap=..."`` for the caps that are set (nothing without them)."""
    return "".join(f", {k}={getattr(module, k)}" for k in ("student_softcap", "teacher_softcap")
                   if getattr(module, k) is not None)
