"""Fused linear generalised JSD reference: materialise both models' logits, then :func:`tigon.reference.divergence.jsd`.

The specification of :func:`tigon.functional.fused_linear_jsd` (Liger-Kernel's ``liger_fused_linear_jsd``):

    x = log_softmax(cap_s(student_input @ student_weight.T + student_bias) / temperature)      student, (N, V)
    y = log_softmax(cap_t(teacher_input @ teacher_weight.T + teacher_bias) / temperature)      teacher, (N, V)
    loss = jsd(x, y, shift_labels, jsd_beta, ignore_index)

the generalised Jensen-Shannon divergence of GKD (Agarwal et al. 2024; jsd_beta 0: forward KL(teacher || student), 1:
reverse KL(student || teacher)) summed over the vocabulary and averaged over the rows whose label is not
``ignore_index`` (all rows without labels; 0 when none is kept). The teacher is a constant: no gradient flows to it.
Computed in the inputs' dtype promoted to at least float32 (float64 inputs give the float64 truth). ``cap`` is
each model's final-logit soft-cap ``c tanh(z / c)`` (``student_softcap``, ``teacher_softcap``, Tigon's: Gemma 2's
``final_logit_softcapping``, which the model's forward applies to its logits, so before the temperature; TRL's
``GKDTrainer`` takes the logits so capped), or the identity where None.
"""

from __future__ import annotations


import torch

from .. import _checks
from .divergence import jsd


def check_inputs(student_input, student_weight, teacher_input, teacher_weight, shift_labels, jsd_beta, ignore_index,
                 temperature, student_bias=None, teacher_bias=None, student_softcap=None,
                 teacher_softcap=None) -> float:
    """Validate :func:`fused_linear_jsd`'s arguments; returns jsd_beta as a float.

    Raises:
        TypeError: a float tensor not floating, shift_labels not an integer tensor, jsd_beta / temperature not a
            number, ignore_index not an int.
        ValueError: student_input not (N, H), student_weight not (V, H), teacher_input not (N, H'), teacher_weight
            not (V, H') (one vocabulary), a bias not (V,), shift_labels not (N,), devices differ, jsd_beta outside
            [0, 1], temperature not > 0, a soft-cap not None or a finite float > 0.
    """
    _checks.tensor("student_input", student_input, floating=True, ndim=2)
    _checks.tensor("student_weight", student_weight, floating=True, ndim=2)
    _checks.tensor("teacher_input", teacher_input, floating=True, ndim=2)
    _checks.tensor("teacher_weight", teacher_weight, floating=True, ndim=2)
    for name, b in (("student_bias", student_bias), ("teacher_bias", teacher_bias)):
        if b is not None:
            _checks.tensor(name, b, floating=True, ndim=1)
    if shift_labels is not None:
        _checks.tensor("shift_labels", shift_labels, integer=True, ndim=1)
    _checks.same_device(student_input=student_input, student_weight=student_weight, teacher_input=teacher_input,
                        teacher_weight=teacher_weight, shift_labels=shift_labels, student_bias=student_bias,
                        teacher_bias=teacher_bias)
    n, v = student_input.shape[0], student_weight.shape[0]
    for name, x, w in (("student", student_input, student_weight), ("teacher", teacher_input, teacher_weight)):
        if w.shape[1] != x.shape[1]:
            raise ValueError(f"{name}_weight must have shape (V, {x.shape[1]}) to match {name}_input "
                             f"{tuple(x.shape)}, got {tuple(w.shape)}")
    if v == 0 or teacher_weight.shape[0] != v:
        raise ValueError(f"student_weight and teacher_weight must have one vocabulary size V >= 1, got "
                         f"{tuple(student_weight.shape)} and {tuple(teacher_weight.shape)}")
    if teacher_input.shape[0] != n:
        raise ValueError(f"teacher_input must have student_input's {n} rows, got {tuple(teacher_input.shape)}")
    if shift_labels is not None and shift_labels.shape[0] != n:
        raise ValueError(f"shift_labels must have shape ({n},), got {tuple(shift_labels.shape)}")
    for name, b in (("student_bias", student_bias), ("teacher_bias", teacher_bias)):
        if b is not None and b.shape[0] != v:
            raise ValueError(f"{name} must have shape ({v},), got {tuple(b.shape)}")
    beta = _checks.number("jsd_beta", jsd_beta)
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"jsd_beta must be in [0, 1] (0: forward KL, 1: reverse KL), got {jsd_beta!r}")
    if _checks.number("temperature", temperature) <= 0.0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    _checks.integer("ignore_index", ignore_index)
    _checks.softcap("student_softcap", student_softcap)
    _checks.softcap("teacher_softcap", teacher_softcap)
    return beta


def log_probs(hidden, weight, bias, temperature, dtype, softcap=None) -> torch.Tensor:
    """``log_softmax(cap(hidden @ weight.T + bias) / temperature)`` with the matmul in ``dtype``, and the soft-cap
    ``c tanh(z / c)`` and the softmax in at least float32 (as TRL's fused LM head and
    :func:`tigon.ops.fused_linear_logprobs.trl_linear_logprobs` cap the logits): the reference's (``dtype`` at least
    float32) and, at the input dtype, the plain computation's."""
    z = torch.nn.functional.linear(hidden.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return torch.log_softmax(z / temperature, dim=-1)


def fused_linear_jsd(
    student_input: torch.Tensor,
    student_weight: torch.Tensor,
    teacher_input: torch.Tensor,
    teacher_weight: torch.Tensor,
    shift_labels: torch.Tensor | None = None,
    jsd_beta: float = 0.5,
    ignore_index: int = -100,
    temperature: float = 1.0,
    accum_dtype: torch.dtype | None = None,
    *,
    student_bias: torch.Tensor | None = None,
    teacher_bias: torch.Tensor | None = None,
    student_softcap: float | None = None,
    teacher_softcap: float | None = None,
) -> torch.Tensor:
    """The module docstring's loss (``accum_dtype`` is the kernel path's and is not read here); 0-d, float32 or
    float64 for float64 inputs."""
    beta = check_inputs(student_input, student_weight, teacher_input, teacher_weight, shift_labels, jsd_beta,
                        ignore_index, temperature, student_bias, teacher_bias, student_softcap, teacher_softcap)
    ct = torch.promote_types(torch.promote_types(student_input.dtype, student_weight.dtype), torch.float32)
    x = log_probs(student_input, student_weight, student_bias, temperature, ct, student_softcap)
    with torch.no_grad():
        y = log_probs(teacher_input, teacher_weight, teacher_bias, temperature, ct, teacher_softcap)
    return jsd(x, y, shift_labels, beta, int(ignore_index))
