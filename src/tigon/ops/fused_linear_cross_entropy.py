"""Fused LM head + cross-entropy: the loss of ``hidden @ weight.T`` without materialising the logits. The public op
and its record.

Kernels: :mod:`tigon.kernels.fused_linear_cross_entropy` (token chunks; cuBLAS matmuls and one Triton pass per
chunk). Specification: :mod:`tigon.reference.fused_linear_cross_entropy`.
"""

from __future__ import annotations

import math

import torch

from .. import _checks
from .._checks import ALIAS, UNSET, liger_names
from ..reference import cross_entropy as ref_ce
from ..reference import fused_linear_cross_entropy as ref_flce
from ..reference.cross_entropy import LossOutput
from ..support import COMPILER, TORCH_CODE, dynamo_compiling, select_backend
from ._record import Case, OpSpec, randn, targets
from .cross_entropy import LOSS_CASES, liger_aliases


def fused_linear_cross_entropy(
    hidden: torch.Tensor = UNSET,
    weight: torch.Tensor = UNSET,
    target: torch.Tensor = UNSET,
    bias: torch.Tensor | None = None,
    ce_weight: torch.Tensor | None = None,
    ignore_index: int = -100,
    lse_square_scale: float = 0.0,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    return_z_loss: bool = False,
    accum_dtype: torch.dtype | None = None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    chunk_mem_const: int = 1,
    *,
    logit_scale: float = 1.0,
    class_weight: torch.Tensor | None = None,
    num_items_in_batch: int | torch.Tensor | None = None,
    return_accuracy: bool = False,
    memory: str | int = "auto",
    input: torch.Tensor = ALIAS,  # noqa: A002 (Liger-Kernel's name of hidden)
):
    """cross_entropy(logit_scale * (hidden @ weight.T + bias), target) without materialising the logits.

    Positional order: Liger-Kernel's ``liger_fused_linear_cross_entropy(input, weight, target, bias, ce_weight,
    ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss, accum_dtype,
    use_token_scaling, return_token_accuracy, return_predicted_tokens, chunk_mem_const)`` (0.8.5); Tigon's own
    options are keyword-only. ``input``, Liger's name of hidden, is accepted as a keyword.

    The LM-head loss of a language model, computed chunk by chunk over the tokens so that only a bounded
    (rows, V) block of logits exists at a time (Liger-Kernel's fused linear cross-entropy, Hsu et al. 2024;
    Apple's Cut Cross-Entropy, Wijmans et al. 2024). Matmuls run through torch (cuBLAS), the softmax / loss /
    gradient of each chunk in one Triton kernel with fp32 math; see :mod:`tigon.ops.fused_linear_cross_entropy`.
    For a scalar loss the gradients are computed during the forward and scaled in the backward (3 matmuls in
    all); for ``reduction="none"`` the backward recomputes the logits (4 matmuls). Under ``torch.no_grad`` or
    when nothing requires grad, only the loss is computed. Under ``torch.autocast`` the matmuls run in the
    autocast dtype and the gradients come back in the parameters' dtypes. The caller's tensors are never
    written. For mean/sum the gradients are formed once, so a second backward through the same graph raises.
    Note: for mean/sum the upstream scalar is applied after the logits gradient was rounded to the compute dtype:
    identical to the unfused computation for an upstream of 1, and for a power of two in bfloat16 / float32. In
    float16 the default plan forms that gradient without the division by the token count (folded into the fp32
    accumulators with the upstream), so a GradScaler's scale keeps the unfused computation's accuracy
    (tests/test_flce_fp16.py, which measures about 30x the unfused error on grad_hidden at 65536 tokens and a 2**16
    scale without it). The plans that write float16 gradients directly (``memory="low"``, ``accum_dtype`` the
    weight's) and the torch.compile path keep the division in the chunk, whose small terms then underflow where the
    unfused computation's do not: prefer bfloat16 there.

    Args:
        hidden: (N, H) float32 / bfloat16 / float16 final hidden states (flatten batch and sequence first).
        weight: (V, H) LM-head weight. Under autocast any float dtypes: the matmuls run in the autocast dtype.
            Outside autocast the dtypes may differ, unlike ``F.linear`` and Liger-Kernel's function (whose matmul
            raises on them): the matmuls run in ``torch.promote_types(hidden.dtype, weight.dtype)`` (bf16 hidden
            with an fp32 weight: fp32 matmuls, hidden read as fp32), the loss is fp32 and each gradient comes back
            in its own tensor's dtype. Give both the same dtype for the half-precision matmul speed.
        target: (N,) integer class indices in [0, V), or ``ignore_index``.
        bias: optional (V,) LM-head bias.
        logit_scale: multiplies the logits before the soft-cap (Cohere's ``logit_scale``; Granite's
            ``1 / logits_scaling``).
        class_weight: optional (V,) class weights (``weight`` of :func:`cross_entropy`), no gradient.
        ignore_index, reduction, label_smoothing, lse_square_scale, softcap, num_items_in_batch,
        return_z_loss, return_accuracy: as :func:`cross_entropy`.
        accum_dtype: dtype in which grad_weight is accumulated over the token chunks. ``None`` or
            ``torch.float32`` (default): an fp32 (V, H) buffer, rounded once to the weight's dtype, so the
            gradients are as accurate as the unfused computation's (peak extra memory about 3 GiB at
            Llama-3-8B shapes: the fp32 buffer, a (H, V) logits chunk and the bf16 gradient). The weight's own
            dtype (e.g. ``torch.bfloat16``; Liger-Kernel's default): no fp32 buffer, and logits chunks of
            max(64 MiB, the hidden states' size), so the peak extra memory is about the gradients themselves
            (1.10 GiB there at 8192 tokens), but grad_weight is rounded once per chunk: an approximation, off by
            default. Its error grows with the number of chunks and with how many chunks touch the same vocabulary
            rows: measured 1.08x the unfused bf16 computation's error on uniformly random labels at Llama-3-8B
            shapes (32 chunks, H200; benchmarks/results/h200/flce_h200.json), 4.2x in a CPU simulation where every
            chunk hits every row (benchmarks/results/cpu/lean_accum_sim.txt).
        memory: how much memory the op may hold beside its inputs and the gradients it returns (the logits chunk
            buffer and the fp32 grad_weight accumulator). ``"auto"`` (default): exact accumulation (unless
            ``accum_dtype`` says otherwise) with chunks filling a 3 GiB budget (fewer, larger matmuls); with a
            weight that gets no gradient (a frozen head) chunks of at most 2**27 logits (no accumulator to re-read).
            ``"low"``: Liger-Kernel's peak, exact: no accumulator, the gradients in the parameters' dtype, written
            once each (:mod:`tigon.kernels.flce_sliced`: token chunks in grad_weight's own memory, then vocabulary
            slices over every token; four matmuls instead of three; a spare buffer of 3/4 of grad_hidden's
            bytes; for ``reduction="none"`` both passes run in the backward; ignored tokens are left out of the
            matmuls, found by one host sync per call). It applies where grad_weight is needed, the inputs in one
            dtype, no ``class_weight`` and no ``use_token_scaling``; elsewhere grad_weight is accumulated in the
            weight's dtype with Liger-Kernel's chunk rule (the approximation described under ``accum_dtype``). For a
            mean / sum loss with an upstream gradient other than 1 the gradients are scaled in the backward (a second
            rounding, as Liger's). An int: a budget in bytes for the chunk buffer plus, when it fits with at least 16
            rows of logits, the exact fp32 accumulator (4 * V * H bytes); otherwise the sliced plan with the budget
            as its spare buffer where it applies (the accumulation in the weight's dtype with the whole budget to the
            chunks elsewhere, or when ``accum_dtype`` is given). Chunks never go below 16 rows (slices 16 columns),
            so a budget under 16 * V logits (16 * N) is exceeded by that much. Chunk sizes trade memory for speed:
            each chunk re-reads the gradient accumulator (see :mod:`tigon.kernels.fused_linear_cross_entropy`).

        return_predicted_tokens: also return each token's predicted class, the argmax of its logits, as (N,) int64
            with -1 for ignored tokens (``LossOutput.predicted_tokens``; Liger-Kernel's option of the same name),
            taken in the same pass as the loss: no logits are kept.
        use_token_scaling: multiply each token's loss (z-loss included) by its target's probability under the
            (scaled, soft-capped) logits, a constant of the gradient (detached), before the reduction; the mean's
            denominator is unchanged (Liger-Kernel's option of the same name).
        chunk_mem_const: Liger-Kernel 0.8.5's chunk-size multiplier (its logits chunks hold chunk_mem_const * N * H
            elements), a positive int, accepted for drop-in calls and checked; Tigon sizes its chunks by ``memory``,
            so it changes neither the result nor the chunks.
        ce_weight, return_token_accuracy: Liger-Kernel's names of ``class_weight`` and ``return_accuracy`` (give
            one name of each pair).

    ``return_z_loss`` returns the z-loss as a separate output, as Liger's: with ``reduction="none"`` each token's
    ``lse_square_scale * lse**2`` ((N,), 0 where ignored) beside the per-token losses that include it; with "mean"
    averaged over the non-ignored tokens, unweighted (see :class:`~tigon.functional.LossOutput`).

    Returns:
        As :func:`cross_entropy`: the float32 loss (0-d, or (N,) for "none"), or ``LossOutput`` (with
        ``predicted_tokens`` when asked for). Gradients for hidden / weight / bias have their dtypes and shapes.

    Raises:
        TypeError: hidden, weight or target missing, or hidden given as both hidden and input.
        TypeError, ValueError: as :func:`cross_entropy`, for hidden (N, H), weight (V, H), target (N,), bias and
            class_weight (V,), and logit_scale (finite, non-zero); ValueError for an ``accum_dtype`` other than
            None, torch.float32 or the weight's dtype, and for a ``memory`` other than "auto", "low" or an int >= 0
            (or "low" with ``accum_dtype=torch.float32`` for a weight of another dtype); TypeError for a
            ``return_predicted_tokens`` or ``use_token_scaling`` that is not a bool, or for both names of one option
            given; ValueError for a ``chunk_mem_const`` that is not a positive int.
    """
    # The scalar options' checks and objects, once per distinct set of options (values with their types: 1, 1.0 and
    # True are different keys, so that a cached set is one that passed the checks as given); tensors checked per call.
    # Not while dynamo traces (its graph holds the checks' outcome; symbolic shapes stay out of a dict key).
    if hidden is UNSET or weight is UNSET or target is UNSET or input is not ALIAS:  # (Liger's keyword name)
        hidden, weight, target = liger_names("fused_linear_cross_entropy", ("hidden", hidden, "input", input),
                                             ("weight", weight, None, ALIAS), ("target", target, None, ALIAS))
    compiling = dynamo_compiling() or COMPILER._is_compiling_flag  # (is_compiling(): see support.dynamo_compiling)
    key = None if compiling else (
        ignore_index, type(ignore_index), label_smoothing, type(label_smoothing), lse_square_scale,
        type(lse_square_scale), softcap, type(softcap), logit_scale, type(logit_scale), reduction, type(reduction),
        use_token_scaling, type(use_token_scaling), return_predicted_tokens, type(return_predicted_tokens),
        chunk_mem_const, type(chunk_mem_const), memory, type(memory), accum_dtype, weight.dtype, weight.shape,
        return_accuracy, type(return_accuracy), return_token_accuracy, type(return_token_accuracy),
        ce_weight is None, class_weight is None)
    try:
        call = None if compiling else _CALLS.get(key)
    except TypeError:  # an unhashable option: the checks below name it
        call = key = None
    if call is None or num_items_in_batch is not None:
        class_weight, return_accuracy = liger_aliases(class_weight, ce_weight, return_accuracy,
                                                      return_token_accuracy)
        ref_flce.check_inputs(hidden, weight, target, bias, class_weight, logit_scale=logit_scale,
                              reduction=reduction, label_smoothing=label_smoothing,
                              lse_square_scale=lse_square_scale, softcap=softcap,
                              num_items_in_batch=num_items_in_batch)
        if call is None:
            call = _call_options(key, weight, ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale,
                                 reduction, use_token_scaling, return_predicted_tokens, chunk_mem_const, memory,
                                 accum_dtype, return_accuracy)
    else:
        if ce_weight is not None:  # (both given raised on the call that cached these options)
            class_weight = ce_weight
        ref_flce.check_head(hidden, weight, target, bias, class_weight=class_weight)
    dev_type = hidden.device.type
    if dev_type in ("cpu", "cuda") and torch.is_autocast_enabled(dev_type):  # (meta, ...: no autocast to ask)
        cd = torch.get_autocast_dtype(dev_type)
    else:  # (promote_types is an op call: skipped for the usual equal dtypes)
        cd = hidden.dtype if hidden.dtype == weight.dtype else torch.promote_types(hidden.dtype, weight.dtype)
    backend = select_backend("fused_linear_cross_entropy", hidden)
    if backend in TORCH_CODE or cd not in (torch.float32, torch.bfloat16, torch.float16):
        return ref_flce.fused_linear_cross_entropy(
            hidden, weight, target, bias, ignore_index=ignore_index, reduction=reduction,
            label_smoothing=label_smoothing, lse_square_scale=lse_square_scale, softcap=softcap,
            logit_scale=logit_scale, class_weight=class_weight, num_items_in_batch=num_items_in_batch,
            return_z_loss=return_z_loss, return_accuracy=call.want_acc,
            return_predicted_tokens=return_predicted_tokens, use_token_scaling=use_token_scaling)
    if target.device.type == "cpu":
        ref_ce.check_target_range(target, weight.shape[0], ignore_index)
    grad_on = torch.is_grad_enabled()
    need = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
            grad_on and bias is not None and bias.requires_grad)
    run = _compiled_run() if compiling else _APPLY[0] if _APPLY else _eager_run()
    out = run(hidden, weight, target, bias, class_weight, num_items_in_batch, cd, need, call)
    if len(out) == 2 and not return_z_loss:
        return out[0]
    return LossOutput(out[0], out[1] if return_z_loss else None, out[2] if call.want_acc else None,
                      out[-1] if return_predicted_tokens else None)


_CALLS: dict = {}
"""The :class:`~tigon.kernels.fused_linear_cross_entropy.FlceCall` of each set of scalar options seen (with their
types, the weight's dtype and shape: ``memory``'s plan reads them), so that a training loop's calls skip the options'
checks and objects. At most :data:`_MAX_CALLS` entries (cleared when full)."""
_MAX_CALLS = 256
_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.Size)
_APPLY: list = []
"""``[fast_apply(FusedLinearCrossEntropyFunction)]`` (:func:`tigon.kernels._common.fast_apply`) after the first eager
call (:func:`_eager_run`; importing the kernels with Tigon would import Triton's language before ``TRITON_INTERPRET``
may be set)."""


def _eager_run():
    """:data:`_APPLY`'s entry, made on the first eager call (not while Dynamo traces: it cannot trace fast_apply's
    ``hasattr`` of the Function, and a compiled call runs :func:`_compiled_run`)."""
    from ..kernels._common import fast_apply
    from ..kernels.fused_linear_cross_entropy import FusedLinearCrossEntropyFunction

    _APPLY.append(fast_apply(FusedLinearCrossEntropyFunction))
    return _APPLY[0]


def _compiled_run():
    from ..kernels import fused_linear_cross_entropy as k

    return k.compiled_fused_linear_cross_entropy


def _call_options(key, weight, ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale, reduction,
                  use_token_scaling, return_predicted_tokens, chunk_mem_const, memory, accum_dtype, return_accuracy):
    """The rest of :func:`fused_linear_cross_entropy`'s option checks (after ``check_inputs``) and its
    :class:`~tigon.kernels.fused_linear_cross_entropy.FlceCall`, cached under ``key`` when every option is a plain
    value (``key`` None: not cached). Raises as that function documents."""
    for name, flag in (("return_predicted_tokens", return_predicted_tokens), ("use_token_scaling", use_token_scaling)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
    if isinstance(chunk_mem_const, bool) or not isinstance(chunk_mem_const, int) or chunk_mem_const < 1:
        raise ValueError(f"chunk_mem_const must be a positive int (Liger-Kernel's chunk-size multiplier), got "
                         f"{chunk_mem_const!r}")
    if accum_dtype not in (None, torch.float32, weight.dtype):
        raise ValueError(f"accum_dtype must be None, torch.float32 or the weight's dtype ({weight.dtype}), "
                         f"got {accum_dtype!r}")
    lean, budget = memory_plan(memory, accum_dtype, weight)
    from ..kernels.cross_entropy import LossOptions
    from ..kernels.fused_linear_cross_entropy import FlceCall


    opts = LossOptions(_checks.integer("ignore_index", ignore_index), float(label_smoothing), float(lse_square_scale),
                       None if softcap is None else float(softcap), float(logit_scale), use_token_scaling)
    # without an explicit accum_dtype, a plan in the weight's dtype is the exact sliced one where it applies
    call = FlceCall(opts, reduction, bool(return_accuracy), lean, budget, return_predicted_tokens,
                    lean and accum_dtype is None)
    if key is not None and all(type(v) in _PLAIN for v in key[0:20:2] + key[20:24] + key[25:26]):
        if len(_CALLS) >= _MAX_CALLS:
            _CALLS.clear()
        _CALLS[key] = call
    return call


def memory_plan(memory, accum_dtype, weight: torch.Tensor) -> tuple[bool, int]:
    """``(lean, budget)`` for :func:`fused_linear_cross_entropy`'s ``memory`` and ``accum_dtype``: lean = grad_weight
    accumulated in the weight's dtype; budget = bytes for the chunk buffer and the accumulator (-1: the default rule
    of :func:`tigon.kernels.fused_linear_cross_entropy.chunk_rows`). Raises ValueError for a bad ``memory``."""
    lean = accum_dtype not in (None, torch.float32)
    if isinstance(memory, str) and memory == "auto":
        return lean, -1
    if isinstance(memory, str) and memory == "low":
        if accum_dtype == torch.float32 and weight.dtype != torch.float32:  # (an fp32 weight's own dtype: no conflict)
            raise ValueError("memory='low' accumulates grad_weight in the weight's dtype; accum_dtype=torch.float32 "
                             "asks for the exact fp32 accumulator: pass one or the other")
        return True, -1
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        raise ValueError(f"memory must be 'auto', 'low' or a budget in bytes (an int >= 0), got {memory!r}")
    vocab, hidden = weight.shape[0], weight.shape[-1]
    exact_fits = memory >= 4 * vocab * hidden + 16 * vocab * weight.element_size()
    return (lean if accum_dtype is not None else not exact_fits), int(memory)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen, ignore_every: int = 0) -> dict:
    """hidden (tokens, hidden), an LM-head weight (vocab, hidden) scaled so the logits have std ~2, targets (every
    ``ignore_every``-th -100), no bias (Llama-style head); the model's final-logit softcap when it has one."""
    w = randn(gen, (s["vocab"], s["hidden"]), dtype, device, 2.0 / math.sqrt(s["hidden"]))
    extra = {"softcap": s["softcap"]} if s.get("softcap") else {}
    return dict(hidden=randn(gen, (s["tokens"], s["hidden"]), dtype, device), weight=w,
                target=targets(gen, s["tokens"], s["vocab"], device, ignore_every), **extra)


def hf_linear_cross_entropy(hidden, weight, target, bias=None, *, logit_scale=1.0, class_weight=None, **kw):
    """Hugging Face's LM head + loss: ``lm_head`` in the input dtype, then the loss on fp32-upcast logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if logit_scale != 1.0:
        logits = logits * logit_scale
    return ref_ce.cross_entropy(logits, target, class_weight, **kw)


def eager_linear_cross_entropy(hidden, weight, target, softcap=None, **_):
    """Hugging Face's LM head and loss as its models run them: the logits upcast to fp32, soft-capped, torch's loss."""
    logits = (hidden @ weight.T).float()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return torch.nn.functional.cross_entropy(logits, target, ignore_index=-100)


def _liger(hidden, weight, target, softcap=None, **_):
    # liger_fused_linear_cross_entropy(input, weight, target, bias=None, ...): positional, softcap by keyword.
    from liger_kernel.transformers import functional as LF

    extra = {"softcap": softcap} if softcap is not None else {}
    return LF.liger_fused_linear_cross_entropy(hidden, weight, target, **extra)


def _cce(hidden, weight, target, softcap=None, **_):
    from cut_cross_entropy import linear_cross_entropy

    return linear_cross_entropy(hidden, weight, target, softcap=softcap)


def _lean(**inputs):
    """grad_weight accumulated in the weight's dtype (Liger's memory; rounded per chunk)."""
    return fused_linear_cross_entropy(**inputs, accum_dtype=inputs["weight"].dtype)


def _low(**inputs):
    """memory="low": Liger's memory, exact (the sliced plan of tigon.kernels.flce_sliced where it applies)."""
    return fused_linear_cross_entropy(**inputs, memory="low")


HEAD_SIZES = dict(
    shape_of=lambda m: {"tokens": m.tokens, "hidden": m.hidden, "vocab": m.vocab, "softcap": m.softcap},
    size_format="tokens x hidden x vocab",
    size_label=lambda s: f"{s['tokens']}x{s['hidden']}x{s['vocab']}" + (f" softcap {s['softcap']}"
                                                                         if s.get("softcap") else ""),
)
"""The size fields of an LM-head op's record (tokens x hidden x vocab, and the model's softcap)."""


RECORDS = (OpSpec(
    name="fused_linear_cross_entropy",
    summary="LM head + cross-entropy without materialising the (tokens, vocab) logits",
    fn=fused_linear_cross_entropy,
    reference=ref_flce.fused_linear_cross_entropy,
    original=hf_linear_cross_entropy,
    original_name="HF LM head (F.linear in the input dtype) + the loss on fp32-upcast logits",
    eager=eager_linear_cross_entropy,
    make_inputs=_inputs,
    **HEAD_SIZES,
    grad_inputs=("hidden", "weight"),
    category="lm_head_loss",
    flops=lambda s, mode: (2 if mode == "fwd" else 6) * s["tokens"] * s["hidden"] * s["vocab"],  # 1 or 3 matmuls
    bench_inputs={"ignore_every": 10},
    peers={"liger": _liger, "cce": _cce},
    host_syncs=("liger",),
    cases=(
        Case(),
        *LOSS_CASES,
        Case("bench: accum_dtype=weight", fn=_lean, tags=frozenset({"bench"}), provider="tigon_lean"),
        Case("memory=low", fn=_low, inputs={"ignore_every": 4}, tags=frozenset({"bench", "verify"}),
             provider="tigon_low",
             unit_upstream=True),
    ),
),)
