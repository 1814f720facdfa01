"""Fused LM heads + generalised JSD (knowledge distillation without either model's logits): the public op and its
record.

Kernels: :mod:`tigon.kernels.fused_linear_jsd` (the fused cross-entropy's token chunks and matmuls, the divergence
kernel of :func:`tigon.functional.jsd`). Specification: :mod:`tigon.reference.fused_linear_jsd`.
"""

from __future__ import annotations

import math

import torch

from ..reference import fused_linear_jsd as ref
from ..reference.divergence import jsd as ref_jsd
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, liger, randn, targets
from .fused_linear_cross_entropy import HEAD_SIZES, memory_plan


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
    memory: str | int = "auto",
) -> torch.Tensor:
    """Generalised JSD between the student's and the teacher's next-token distributions, from their hidden states
    and LM heads, without the (N, V) logits of either.

    Liger-Kernel 0.8.5's ``liger_fused_linear_jsd`` (same arguments, order and value; ``student_bias``,
    ``teacher_bias``, the soft-caps and ``memory`` are Tigon's): ``jsd(log_softmax(z_s / T), log_softmax(z_t / T),
    shift_labels, jsd_beta)`` with ``z = input @ weight.T (+ bias)`` (soft-capped, ``c tanh(z / c)``, for a model
    with a final-logit soft-cap), the GKD divergence (Agarwal et al. 2024) of :func:`tigon.functional.jsd` averaged
    over the rows not ignored; definition in :mod:`tigon.reference.fused_linear_jsd`. Rows are processed in chunks
    (the fused cross-entropy's chunk rule and ``memory`` budget): per chunk both heads' logits are formed (cuBLAS),
    the rows' divergence and the gradient w.r.t. the student's logits by one Triton kernel over both chunks (fp32
    math, the pointwise terms of :func:`tigon.functional.jsd`), and the student's gradients are accumulated, so
    only a (rows, V) block of each model's logits exists at a time. The gradients are formed in the forward (a
    second backward through the same loss raises) and accumulated in fp32. The teacher gets no gradient. Under
    ``torch.autocast`` the matmuls run in the autocast dtype. Inside a ``torch.compile`` graph it runs as the custom
    op ``tigon::fused_linear_jsd`` (one opaque node; there a second backward does not raise). The caller's tensors
    are never written.

    Args:
        student_input: (N, H) student hidden states, float32 / bfloat16 / float16 (flatten batch and sequence).
        student_weight: (V, H) student LM head, the same dtype. Both get gradients.
        teacher_input: (N, H') teacher hidden states; teacher_weight: (V, H') teacher LM head (one vocabulary);
            cast to the student's compute dtype.
        shift_labels: optional (N,) integer labels; rows whose label is ``ignore_index`` are skipped and not
            counted.
        jsd_beta: in [0, 1]: 0 forward KL(teacher || student), 1 reverse KL, 0.5 the Jensen-Shannon divergence.
        ignore_index: the label of skipped rows.
        temperature: divides both models' logits; finite, > 0.
        accum_dtype: None / torch.float32 (exact: an fp32 grad_weight accumulator) or the student weight's dtype
            (rounded once per chunk, less memory), as :func:`tigon.functional.fused_linear_cross_entropy`'s. Note:
            Liger accumulates in the weight's dtype when it is None.
        student_bias, teacher_bias: optional (V,) LM-head biases (the student's gets a gradient).
        student_softcap, teacher_softcap: each model's final-logit soft-cap ``c`` (Gemma 2's
            ``final_logit_softcapping``: its logits are ``c tanh(z / c)``, before the temperature), or None. The
            kernel caps each model's logits as it reads them and multiplies the student's gradient by the cap's
            derivative: the same passes over the chunk, no (rows, V) temporary.
        memory: as :func:`tigon.functional.fused_linear_cross_entropy`'s (``"low"`` or a budget in bytes), the
            chunk rows sized with each row's two logits rows (the student's and the teacher's, nothing else per
            logit); ``"auto"`` (default) is a 3 GiB budget for the chunk and the fp32 accumulator on CUDA (2048-row
            chunks at Llama-3-8B's head and 8192 tokens).

    Returns:
        The 0-d float32 loss (float64 for float64 inputs); 0 when every row is skipped or N = 0.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, devices, jsd_beta, temperature or ignore_index
            (:func:`tigon.reference.fused_linear_jsd.check_inputs`); ValueError for an ``accum_dtype`` other than
            None, torch.float32 or the student weight's dtype, or a bad ``memory``.
    """
    beta = ref.check_inputs(student_input, student_weight, teacher_input, teacher_weight, shift_labels, jsd_beta,
                            ignore_index, temperature, student_bias, teacher_bias, student_softcap, teacher_softcap)
    if accum_dtype not in (None, torch.float32, student_weight.dtype):
        raise ValueError(f"accum_dtype must be None, torch.float32 or the student weight's dtype "
                         f"({student_weight.dtype}), got {accum_dtype!r}")
    lean, budget = memory_plan(memory, accum_dtype, student_weight)
    dev_type = student_input.device.type
    if dev_type in ("cpu", "cuda") and torch.is_autocast_enabled(dev_type):
        cd = torch.get_autocast_dtype(dev_type)
    else:
        cd = torch.promote_types(student_input.dtype, student_weight.dtype)
    backend = select_backend("fused_linear_jsd", student_input)
    if backend in TORCH_CODE or cd not in (torch.float32, torch.bfloat16, torch.float16):
        return ref.fused_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, shift_labels,
                                    jsd_beta, ignore_index, temperature, accum_dtype, student_bias=student_bias,
                                    teacher_bias=teacher_bias, student_softcap=student_softcap,
                                    teacher_softcap=teacher_softcap)
    from ..kernels import fused_linear_jsd as k

    grad_on = torch.is_grad_enabled()
    need = (grad_on and student_input.requires_grad, grad_on and student_weight.requires_grad,
            grad_on and student_bias is not None and student_bias.requires_grad)
    run = k.compiled_fused_linear_jsd if torch.compiler.is_compiling() else k.FusedLinearJSDFunction.apply
    caps = (None if c is None else float(c) for c in (student_softcap, teacher_softcap))
    return run(student_input, student_weight, teacher_input, teacher_weight, shift_labels, student_bias, teacher_bias,
               beta, int(ignore_index), float(temperature), cd, need, lean, budget, *caps)


def plain_linear_jsd(student_input, student_weight, teacher_input, teacher_weight, shift_labels=None, jsd_beta=0.5,
                     ignore_index=-100, temperature=1.0, accum_dtype=None, *, student_bias=None, teacher_bias=None,
                     student_softcap=None, teacher_softcap=None):
    """The plain computation a distillation loop runs: both LM heads in the input dtype (``F.linear``), the logits
    upcast to float32 (and soft-capped there, as ``trl_linear_logprobs`` does), divided by the temperature,
    log-softmax, then the JSD in float32 (Liger-Kernel's test reference for its fused linear JSD)."""
    dt = torch.promote_types(student_input.dtype, student_weight.dtype)
    x = ref.log_probs(student_input, student_weight, student_bias, temperature, dt, student_softcap)
    with torch.no_grad():
        y = ref.log_probs(teacher_input, teacher_weight, teacher_bias, temperature, dt, teacher_softcap)
    return ref_jsd(x, y, shift_labels, jsd_beta, ignore_index)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen, ignore_every: int = 0, labels: bool = True, bias: bool = False) -> dict:
    """Student hidden states and head (tokens, hidden), (vocab, hidden) with logits of std ~2; the teacher's: its own
    hidden states and a head near the student's (a distillation pair); shift_labels (every ``ignore_every``-th
    -100) with ``labels``; the two biases with ``bias``."""
    t, h, v = s["tokens"], s["hidden"], s["vocab"]
    w = randn(gen, (v, h), torch.float32, device, 2.0 / math.sqrt(h))
    out = dict(student_input=randn(gen, (t, h), dtype, device), student_weight=w.to(dtype),
               teacher_input=randn(gen, (t, h), dtype, device),
               teacher_weight=(w + randn(gen, (v, h), torch.float32, device, 1.0 / math.sqrt(h))).to(dtype))
    if labels:
        out["shift_labels"] = targets(gen, t, v, device, ignore_every)
    if bias:
        out["student_bias"] = randn(gen, (v,), dtype, device, 0.5)
        out["teacher_bias"] = randn(gen, (v,), dtype, device, 0.5)
    return out


VERIFY_ONLY = frozenset({"verify"})
"""The model-shape verify rows that the tests' quick grid leaves out (the CPU suite's time)."""

RECORDS = (OpSpec(
    name="fused_linear_jsd",
    summary="student and teacher LM heads + generalised JSD (distillation) without either model's logits",
    fn=fused_linear_jsd,
    reference=ref.fused_linear_jsd,
    original=plain_linear_jsd,
    original_name="both LM heads in the input dtype (F.linear), fp32 log-softmax / temperature, then the JSD in fp32",
    make_inputs=_inputs,
    **HEAD_SIZES,
    grad_inputs=("student_input", "student_weight"),
    category="lm_head_loss",
    # forward: the two heads' logits (2 matmuls); with the gradients, formed in the forward: 2 more
    flops=lambda s, mode: (4 if mode == "fwd" else 8) * s["tokens"] * s["hidden"] * s["vocab"],
    bench_inputs={"ignore_every": 10},
    grads_in_forward=("tigon", "tigon_lean", "tigon_1gib", "liger"),
    peers={"liger": liger("liger_fused_linear_jsd", "student_input", "student_weight", "teacher_input",
                          "teacher_weight", shift_labels="shift_labels")},
    host_syncs=("liger",),  # Liger reads the count of kept rows with .item()
    bench_notes={"tigon_lean": "memory='low': grad_weight accumulated in the weight's dtype (Liger's default), "
                               "Liger's chunk rule",
                 "tigon_1gib": "memory=1 << 30: at Llama-3-8B's head the fp32 grad_weight accumulator does not fit, "
                               "so it accumulates in the weight's dtype (Liger's default), in 4 chunks of 2048 rows "
                               "(both heads' logits)"},
    cases=(
        Case(),
        Case("ignored rows, temperature=2", options={"temperature": 2.0}, inputs={"ignore_every": 3}),
        Case("beta=0 (forward KL)", options={"jsd_beta": 0.0}, inputs={"ignore_every": 4}, variants=("model",),
             tags=VERIFY_ONLY),
        Case("beta=1 (reverse KL), no labels", options={"jsd_beta": 1.0}, inputs={"labels": False},
             variants=("model",), tags=VERIFY_ONLY),
        Case("biases, temperature=0.7", options={"temperature": 0.7}, inputs={"bias": True}, variants=("model",),
             tags=VERIFY_ONLY),
        Case("soft-caps 5 / 3, temperature=0.8", options={"student_softcap": 5.0, "teacher_softcap": 3.0,
                                                           "temperature": 0.8}, inputs={"ignore_every": 3}),
        Case("student soft-cap 2, beta=0", options={"student_softcap": 2.0, "jsd_beta": 0.0}, variants=("model",),
             tags=VERIFY_ONLY),
        Case("bench: memory=low", options={"memory": "low"}, tags=frozenset({"bench"}), provider="tigon_lean"),
        Case("bench: memory=1 GiB", options={"memory": 1 << 30}, tags=frozenset({"bench"}), provider="tigon_1gib"),
    ),
),)
