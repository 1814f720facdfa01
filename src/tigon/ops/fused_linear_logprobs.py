"""Fused LM head + per-token log-probabilities (optionally entropy and log-sum-exp) without materialising the
(tokens, vocab) logits: the primitive under the post-training losses (DPO / ORPO / CPO / SimPO / KTO, GRPO). The
public op and its record.

Kernels: :mod:`tigon.kernels.fused_linear_logprobs` (the fused cross-entropy's token chunks and row kernels, plus an
entropy forward and a general backward). Specification: :mod:`tigon.reference.fused_linear_logprobs`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .. import _checks
from ..reference import cross_entropy as ref_ce
from ..reference import fused_linear_logprobs as ref
from ..reference.fused_linear_logprobs import LogProbsOutput
from ..support import TORCH_CODE, select_backend
from ._record import Case, OpSpec, randn, targets
from .fused_linear_cross_entropy import HEAD_SIZES, memory_plan


def fused_linear_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    temperature: float = 1.0,
    softcap: float | None = None,
    ignore_index: int = -100,
    return_entropy: bool = False,
    return_lse: bool = False,
    return_is_top1: bool = False,
    return_log_sum_sq_probs: bool = False,
    return_mean_logits: bool = False,
    memory: str | int = "auto",
):
    """Per-token ``log_softmax(softcap(hidden @ weight.T + bias) / temperature)[target]`` without the logits.

    What TRL's DPO / GRPO trainers compute from a model's logits (``selective_log_softmax`` of the logits divided by
    the temperature; ``entropy_from_logits``), and what Liger-Kernel's chunked losses recompute inside each loss,
    here as one differentiable primitive: tokens are processed in chunks so that only a bounded (rows, V) block of
    logits exists at a time (the chunking of :func:`fused_linear_cross_entropy`), with fp32 math per row (online
    log-sum-exp, Milakov & Gimelshein 2018). The forward holds no gradient; the backward recomputes the logits
    chunk by chunk (4 matmuls in all, as ``fused_linear_cross_entropy(reduction="none")``), for any upstream
    gradient on the log-probabilities, the entropy and the lse. Under ``torch.no_grad`` only the forward runs.
    Under ``torch.autocast`` the matmuls run in the autocast dtype. The caller's tensors are never written. Inside
    a ``torch.compile`` graph the kernels run as the custom ops ``tigon::fused_linear_logprobs`` (and its
    backward), one opaque node each.

    Args:
        hidden: (N, H) float32 / bfloat16 / float16 final hidden states (flatten batch and sequence first; any
            strides).
        weight: (V, H) LM-head weight, a float tensor: the matmuls run in ``torch.promote_types`` of hidden's and
            weight's dtypes (an fp32 head with bf16 hidden states runs in fp32, as TRL's ``cast_lm_head_to_fp32``),
            under autocast in the autocast dtype.
        target: (N,) integer token ids in [0, V), or ``ignore_index``.
        bias: optional (V,) LM-head bias.
        temperature: divides the logits (after the soft-cap); a finite float > 0 (TRL's ``temperature``).
        softcap: final-logit soft-cap ``c`` (Gemma 2: ``c * tanh(z / c)``), or None.
        ignore_index: target value of tokens to skip: 0 in every output, no gradient (padding, prompt tokens).
        return_entropy: also return each token's entropy ``-sum_v p_v log p_v`` (nats).
        return_lse: also return each token's log-sum-exp of the scaled logits.
        return_is_top1: also return whether each target is its row's argmax (TRL's token accuracy), from the same
            read of each chunk's logits: ``torch.argmax``'s tie rule (the first maximum wins, so a target tied with
            an earlier column is not top-1), on the fp32 transformed logits of the matmul dtype.
        return_log_sum_sq_probs: also return each token's ``log sum_v p_v^2`` (p the softmax of the scaled
            logits; TRL's WPO weights), from the same read of each chunk's logits: the row kernel keeps beside the
            online log-sum-exp's sum ``s = sum exp(x - m)`` the sum ``s2 = sum exp(2 (x - m))`` (rescaled by
            ``exp(2 (m_old - m))`` when the max moves), and returns ``log s2 - 2 log s`` (= ``lse(2 x) - 2 lse(x)``):
            no second pass over the head. Not differentiable (detached, as TRL uses it).
        return_mean_logits: also return each token's mean over the vocabulary of the scaled logits
            ``mean_v softcap(z_v) / temperature`` (TRL's ``mean_logits``, logged by its DPO and KTO trainers), summed
            in fp32 by the row kernel in the same read of each chunk's logits (with or without a soft-cap: under one
            it is not linear in the hidden state). Not differentiable (detached, as TRL returns it).
        memory: the memory the op may hold beside its inputs and the gradients it returns, as in
            :func:`fused_linear_cross_entropy`: ``"auto"`` (default: chunk buffer and the backward's fp32 grad_weight
            accumulator within 3 GiB on CUDA), ``"low"`` (grad_weight accumulated in the weight's dtype, chunks of
            Liger-Kernel's size: about 64 MiB of logits), or a budget in bytes.

    Returns:
        (N,) float32 log-probabilities of the targets (<= 0; 0 at ignored tokens), or, with any ``return_*`` flag,
        ``LogProbsOutput(logprobs, entropy, lse, is_top1, log_sum_sq_probs, mean_logits)`` ((N,) float32 each,
        ``is_top1`` (N,) bool, False at ignored tokens; None for what was not requested). ``logprobs``, ``entropy``
        and ``lse`` are differentiable w.r.t. hidden, weight and bias (the gradients have their dtypes and shapes);
        ``is_top1``, ``log_sum_sq_probs`` and ``mean_logits`` are not (no grad_fn). float64 inputs run the reference
        (float64 outputs).

    Raises:
        TypeError: a ``return_*`` flag that is not a bool.
        TypeError, ValueError: bad shapes, dtypes, devices, temperature (must be finite and > 0), softcap or
            ignore_index (:func:`tigon.reference.fused_linear_logprobs.check_inputs`) and ``memory``; ValueError for
            a target outside [0, V) other than ``ignore_index`` (checked up front for CPU targets; for CUDA targets,
            without a host sync, at the next loss-kernel launch, the affected outputs being NaN).
    """
    flags = {"return_entropy": return_entropy, "return_lse": return_lse, "return_is_top1": return_is_top1,
             "return_log_sum_sq_probs": return_log_sum_sq_probs, "return_mean_logits": return_mean_logits}
    for name, value in flags.items():
        _checks.flag(name, value)
    plan = logprob_plan(hidden, weight, target, bias, temperature=temperature, softcap=softcap,
                        ignore_index=ignore_index, memory=memory)
    if plan is None:
        return ref.fused_linear_logprobs(hidden, weight, target, bias, temperature=temperature, softcap=softcap,
                                         ignore_index=ignore_index, **flags)
    from ..kernels import fused_linear_logprobs as k

    opts, cd, need, lean, budget = plan
    run = (k.compiled_fused_linear_logprobs if torch.compiler.is_compiling()
           else k.FusedLinearLogProbsFunction.apply)
    logp, ent, lse, top1, sq, mean = run(hidden, weight, target, bias, opts, cd, need, return_entropy, lean, budget,
                                         return_is_top1, return_log_sum_sq_probs, return_mean_logits)
    if not any(flags.values()):
        return logp
    # (the flags in LogProbsOutput's order; the kernels give empty tensors for what was not asked for)
    return LogProbsOutput(logp, *(t if wanted else None for t, wanted in zip((ent, lse, top1, sq, mean),
                                                                             flags.values())))


class LogProbPlan(NamedTuple):
    """How :func:`fused_linear_logprobs`' kernels run a call: the row kernels' options
    (:class:`tigon.kernels.loss_rows.LossOptions`: ``logit_scale`` 1 / temperature, the soft-cap over the
    temperature), the matmul dtype ``cd``, ``need`` (gradients for hidden, weight, bias: grad mode and
    requires_grad), and the ``memory`` option's ``lean`` and ``budget``."""

    opts: object
    cd: torch.dtype
    need: tuple[bool, bool, bool]
    lean: bool
    budget: int


def logprob_plan(hidden, weight, target, bias=None, *, temperature: float = 1.0, softcap: float | None = None,
                 ignore_index: int = -100, memory: str | int = "auto") -> LogProbPlan | None:
    """Check the arguments of :func:`fused_linear_logprobs` (same meaning) and plan its kernels: a
    :class:`LogProbPlan`, or None where the reference runs (a PyTorch backend, or a matmul dtype other than float32 /
    bfloat16 / float16). Shared with the losses that drive the kernels themselves (the GRPO family).

    Raises:
        TypeError, ValueError: as :func:`fused_linear_logprobs` (bad inputs, memory, CPU targets out of range).
    """
    ref.check_inputs(hidden, weight, target, bias, temperature=temperature, softcap=softcap,
                     ignore_index=ignore_index)
    lean, budget = memory_plan(memory, None, weight)
    dev_type = hidden.device.type
    if dev_type in ("cpu", "cuda") and torch.is_autocast_enabled(dev_type):
        cd = torch.get_autocast_dtype(dev_type)
    else:
        cd = torch.promote_types(hidden.dtype, weight.dtype)
    backend = select_backend("fused_linear_logprobs", hidden)
    if backend in TORCH_CODE or cd not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    if target.device.type == "cpu":
        ref_ce.check_target_range(target, weight.shape[0], ignore_index)
    from ..kernels.loss_rows import LossOptions

    t = float(temperature)
    opts = LossOptions(int(ignore_index), 0.0, 0.0, None if softcap is None else float(softcap) / t, 1.0 / t)
    grad_on = torch.is_grad_enabled()
    need = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
            grad_on and bias is not None and bias.requires_grad)
    return LogProbPlan(opts, cd, need, lean, budget)


# ---- the record ----------------------------------------------------------------------------------------------------
def _inputs(s: dict, dtype, device, gen, ignore_every: int = 0, bias: bool = False) -> dict:
    """hidden (tokens, hidden), an LM-head weight (vocab, hidden) scaled so the logits have std ~2, targets (every
    ``ignore_every``-th -100), with ``bias`` a (vocab,) bias; the model's final-logit softcap when it has one."""
    w = randn(gen, (s["vocab"], s["hidden"]), dtype, device, 2.0 / math.sqrt(s["hidden"]))
    extra = {"softcap": s["softcap"]} if s.get("softcap") else {}
    if bias:
        extra["bias"] = randn(gen, (s["vocab"],), dtype, device, 0.5)
    return dict(hidden=randn(gen, (s["tokens"], s["hidden"]), dtype, device), weight=w,
                target=targets(gen, s["tokens"], s["vocab"], device, ignore_every), **extra)


def trl_linear_logprobs(hidden, weight, target, bias=None, *, temperature=1.0, softcap=None, ignore_index=-100,
                        return_entropy=False, return_lse=False, return_log_sum_sq_probs=False,
                        return_mean_logits=False):
    """TRL's computation on a model's logits: the LM head (``F.linear``) in the input dtype, the logits upcast to
    fp32 (at least) and soft-capped as the model does, divided by the temperature, then log-softmax gathered at the
    targets (``selective_log_softmax``), the entropy from the same logits (``entropy_from_logits``), their
    logsumexp, ``log sum p^2 = lse(2 x) - 2 lse(x)`` and the vocabulary mean of the scaled logits (both detached);
    0 at ignored tokens (TRL's masking)."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    valid = target != ignore_index
    safe = torch.where(valid, target, 0)
    logsm = torch.log_softmax(logits, dim=-1)
    logp = logsm.gather(-1, safe[:, None]).squeeze(-1).masked_fill(~valid, 0.0)
    if not (return_entropy or return_lse or return_log_sum_sq_probs or return_mean_logits):
        return logp
    ent = -(logsm.exp() * logsm).sum(-1).masked_fill(~valid, 0.0) if return_entropy else None
    lse = torch.logsumexp(logits, dim=-1).masked_fill(~valid, 0.0) if return_lse else None
    sq = None
    if return_log_sum_sq_probs:
        x = logits.detach()
        sq = (torch.logsumexp(2 * x, dim=-1) - 2 * torch.logsumexp(x, dim=-1)).masked_fill(~valid, 0.0)
    mean = logits.detach().mean(-1).masked_fill(~valid, 0.0) if return_mean_logits else None
    return LogProbsOutput(logp, ent, lse, None, sq, mean)


RECORDS = (OpSpec(
    name="fused_linear_logprobs",
    summary="LM head + per-token log-probabilities (entropy, lse) without materialising the (tokens, vocab) logits",
    fn=fused_linear_logprobs,
    reference=ref.fused_linear_logprobs,
    original=trl_linear_logprobs,
    original_name="TRL: HF LM head (F.linear in the input dtype), fp32 logits / temperature, log-softmax gathered",
    make_inputs=_inputs,
    **HEAD_SIZES,
    grad_inputs=("hidden", "weight"),
    category="lm_head_loss",
    # forward: the logits (1 matmul); backward: the logits again, grad_hidden and grad_weight (3)
    flops=lambda s, mode: (2 if mode == "fwd" else 8) * s["tokens"] * s["hidden"] * s["vocab"],
    bench_inputs={"ignore_every": 10},
    bench_notes={"tigon_entropy": "return_entropy=True: log-probabilities and entropies (eager / compile compute the "
                                  "log-probabilities only; the entropy adds a pass over each chunk's logits)",
                 "tigon_wpo": "return_entropy=True, return_log_sum_sq_probs=True (TRL's DPO with WPO weights): "
                              "tigon_entropy plus log sum p^2 from the same pass (one multiply-add per logit)",
                 "tigon_lean": "memory='low': grad_weight accumulated in the weight's dtype, chunks of about 64 MiB "
                               "of logits"},
    cases=(
        Case(),
        Case("temperature=0.7", options={"temperature": 0.7}, inputs={"ignore_every": 4}),
        Case("entropy+lse", options={"return_entropy": True, "return_lse": True, "temperature": 0.9},
             inputs={"ignore_every": 4}),
        Case("entropy", options={"return_entropy": True}, variants=("model",)),
        Case("softcap=5.0 temperature=0.7", options={"softcap": 5.0, "temperature": 0.7}, variants=("model",)),
        Case("bias", inputs={"bias": True, "ignore_every": 3}, variants=("model",)),
        Case("log_sum_sq_probs softcap=5.0 temperature=0.7", options={"return_log_sum_sq_probs": True, "softcap": 5.0,
                                                                      "temperature": 0.7}, inputs={"ignore_every": 4}),
        Case("mean_logits softcap=5.0 temperature=0.7", options={"return_mean_logits": True, "softcap": 5.0,
                                                                 "temperature": 0.7}, inputs={"ignore_every": 4}),
        Case("mean_logits+entropy bias", options={"return_mean_logits": True, "return_entropy": True},
             inputs={"bias": True, "ignore_every": 3}, variants=("model",)),
        Case("bench: return_entropy", options={"return_entropy": True}, tags=frozenset({"bench"}),
             provider="tigon_entropy"),
        Case("bench: return_entropy + return_log_sum_sq_probs",
             options={"return_entropy": True, "return_log_sum_sq_probs": True}, tags=frozenset({"bench"}),
             provider="tigon_wpo"),
        Case("bench: memory=low", options={"memory": "low"}, tags=frozenset({"bench"}), provider="tigon_lean"),
    ),
),)
