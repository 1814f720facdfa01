"""Fused linear GRPO loss reference: the policy's (and the reference model's) per-token log-probabilities from
materialised logits (:func:`tigon.reference.fused_linear_logprobs.fused_linear_logprobs`), then the per-token GRPO
formulas of :mod:`tigon.reference.grpo` (TRL 1.16's ``GRPOTrainer._compute_loss``).

The specification of :func:`tigon.functional.fused_linear_grpo` (which runs the same pipeline with the fused
log-probabilities). Computed in the inputs' dtype promoted to at least float32; float64 inputs give the float64
truth the tests compare with.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from .. import _checks
from .cross_entropy import widened
from .grpo import GRPOOptions, grpo_loss
from .fused_linear_logprobs import fused_linear_logprobs as ref_logprobs

IGNORE = -100
"""The target id the masked tokens get before the log-probabilities (they are never read)."""


class GRPOOutput(NamedTuple):
    """Returned by :func:`fused_linear_grpo` with ``return_metrics=True``: the 0-d float32 loss, and a dict of 0-d
    detached metrics under TRL's logging keys (:func:`tigon.reference.grpo.grpo_loss`)."""

    loss: torch.Tensor
    metrics: dict


def check_inputs(_input, weight, selected_token_ids, attention_mask, advantages, bias, ref_per_token_logps,
                 old_per_token_logps, ref_input, ref_weight, ref_bias, vllm_is_ratio) -> tuple[int, int]:
    """Validate the tensors of :func:`fused_linear_grpo` (the LM heads' own checks come with the log-probabilities);
    returns (B, T).

    Raises:
        TypeError: a tensor of the wrong kind (floating / integer).
        ValueError: selected_token_ids / attention_mask not (B, T); _input not (B, T, H) or (B * T, H); advantages not
            (B,) or (B, T); a per-token tensor not (B, T); ref_input without ref_weight (or the reverse);
            vllm_is_ratio not (B, T), (B, 1) or (B,); devices differ.
    """
    _checks.tensor("selected_token_ids", selected_token_ids, integer=True, signed=True, ndim=2)
    _checks.tensor("attention_mask", attention_mask, ndim=2)
    b, t = selected_token_ids.shape
    if tuple(attention_mask.shape) != (b, t):
        raise ValueError(f"attention_mask must have selected_token_ids' shape {(b, t)}, "
                         f"got {tuple(attention_mask.shape)}")
    for name, x in (("_input", _input), ("ref_input", ref_input)):
        if x is None:
            continue
        _checks.tensor(name, x, floating=True)
        if not ((x.dim() == 3 and tuple(x.shape[:2]) == (b, t)) or (x.dim() == 2 and x.shape[0] == b * t)):
            raise ValueError(f"{name} must be (B, T, H) = ({b}, {t}, H) or (B * T, H), got {tuple(x.shape)}")
    _checks.tensor("advantages", advantages, floating=True)
    if tuple(advantages.shape) not in ((b,), (b, t)):
        raise ValueError(f"advantages must be ({b},) or ({b}, {t}), got {tuple(advantages.shape)}")
    for name, x in (("ref_per_token_logps", ref_per_token_logps), ("old_per_token_logps", old_per_token_logps)):
        if x is not None:
            _checks.tensor(name, x, floating=True)
            if tuple(x.shape) != (b, t):
                raise ValueError(f"{name} must be ({b}, {t}), got {tuple(x.shape)}")
    if vllm_is_ratio is not None:
        _checks.tensor("vllm_is_ratio", vllm_is_ratio, floating=True)
        if tuple(vllm_is_ratio.shape) not in ((b,), (b, 1), (b, t)):
            raise ValueError(f"vllm_is_ratio must be ({b},), ({b}, 1) or ({b}, {t}), got "
                             f"{tuple(vllm_is_ratio.shape)}")
    if (ref_input is None) != (ref_weight is None):
        raise ValueError("ref_input and ref_weight go together: give both (the reference model's hidden states and "
                         "LM-head weight) or neither")
    _checks.same_device(_input=_input, weight=weight, selected_token_ids=selected_token_ids,
                        attention_mask=attention_mask, advantages=advantages, bias=bias,
                        ref_per_token_logps=ref_per_token_logps, old_per_token_logps=old_per_token_logps,
                        ref_input=ref_input, ref_weight=ref_weight, ref_bias=ref_bias, vllm_is_ratio=vllm_is_ratio)
    return b, t


OPTION_NAMES = ("beta", "epsilon_low", "epsilon_high", "loss_type", "max_completion_length",
                "importance_sampling_level", "sapo_temperature_pos", "sapo_temperature_neg", "delta",
                "use_bias_correction_kl", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg",
                "entropy_coef")
"""The arguments of :func:`fused_linear_grpo` that are :class:`tigon.reference.grpo.GRPOOptions` fields."""


def grpo_pipeline(logprobs, args: dict, formed=None, **logprob_options):
    """:func:`fused_linear_grpo` for its arguments ``args`` (name -> value, every parameter) with the
    log-probabilities of ``logprobs`` (a function with :func:`tigon.functional.fused_linear_logprobs`' signature;
    ``logprob_options`` go to it): the fused op, this module's reference, or the plain TRL computation (the record's
    original). Masked tokens are not scored. ``compiled`` and ``chunk_size`` (Liger's) are not read.

    ``formed``: None, or a function ``formed(hidden (B * T, H), ids (B * T,), ref (B, T) or None, options, b, t,
    want_entropy, args)`` returning ``(loss, metrics)`` (the fused op's gradients formed in its forward,
    :func:`tigon.ops.fused_linear_grpo.formed_policy_loss`), or None where it cannot, for the log-probabilities'
    path below."""
    a = args
    options = GRPOOptions(**{k: a[k] for k in OPTION_NAMES})
    b, t = check_inputs(a["_input"], a["weight"], a["selected_token_ids"], a["attention_mask"], a["advantages"],
                        a["bias"], a["ref_per_token_logps"], a["old_per_token_logps"], a["ref_input"],
                        a["ref_weight"], a["ref_bias"], a["vllm_is_ratio"])
    ids = torch.where(a["attention_mask"] != 0, a["selected_token_ids"], IGNORE).reshape(-1)
    if ids.device.type == "cpu" and not torch.compiler.is_compiling() and _checks.has_data(ids):
        # (where the LM heads check their targets, which would name them "target": no host read on a GPU)
        v, sel = a["weight"].shape[0], widened(a["selected_token_ids"])
        bad = (a["attention_mask"] != 0) & ((sel < 0) | (sel >= v))
        if bool(bad.any()):
            raise ValueError(f"selected_token_ids must be in [0, {v}) where attention_mask is set; "
                             f"found {int(sel[bad][0])}")

    def rows(x):
        return x.reshape(b * t, x.shape[-1])

    entropy = _checks.flag("compute_entropy", a["compute_entropy"]) or options.entropy_coef != 0.0
    _checks.flag("use_ref_model", a["use_ref_model"])
    _checks.flag("return_metrics", a["return_metrics"])
    _checks.num_items(a["num_items_in_batch"], zero=True, real=True)  # (0, an empty batch: clamped to 1, as TRL)
    temperature = a["temperature"]
    ref = None
    if options.beta != 0.0:
        ref_input, ref_weight, ref_bias = a["ref_input"], a["ref_weight"], a["ref_bias"]
        if a["ref_per_token_logps"] is not None:
            if ref_input is not None:
                warnings.warn("both ref_per_token_logps and ref_input are given: ref_per_token_logps is used",
                              stacklevel=3)
            ref = a["ref_per_token_logps"]
        elif ref_input is not None:
            with torch.no_grad():
                ref = logprobs(rows(ref_input.detach()), ref_weight.detach(), ids,
                               None if ref_bias is None else ref_bias.detach(), temperature=temperature,
                               **logprob_options).reshape(b, t)
        elif a["use_ref_model"]:
            raise ValueError("use_ref_model=True with beta != 0 needs ref_per_token_logps or ref_input / ref_weight")
    out = None if formed is None else formed(rows(a["_input"]), ids, ref, options, b, t, entropy, a)
    if out is None:
        lp = logprobs(rows(a["_input"]), a["weight"], ids, a["bias"], temperature=temperature,
                      return_entropy=entropy, **logprob_options)
        logp, ent = (lp.logprobs, lp.entropy) if entropy else (lp, None)
        out = grpo_loss(logp.reshape(b, t), a["attention_mask"], a["advantages"], ref, a["old_per_token_logps"],
                        None if ent is None else ent.reshape(b, t), a["vllm_is_ratio"], a["num_items_in_batch"],
                        options)
    loss, metrics = out
    return GRPOOutput(loss, metrics) if a["return_metrics"] else loss


def fused_linear_grpo(
    _input: torch.Tensor,
    weight: torch.Tensor,
    selected_token_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    advantages: torch.Tensor,
    bias: torch.Tensor | None = None,
    ref_per_token_logps: torch.Tensor | None = None,
    old_per_token_logps: torch.Tensor | None = None,
    ref_input: torch.Tensor | None = None,
    ref_weight: torch.Tensor | None = None,
    ref_bias: torch.Tensor | None = None,
    beta: float = 0.04,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    importance_sampling_level: str = "token",
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    temperature: float = 1.0,
    compiled: bool = True,
    use_ref_model: bool = True,
    chunk_size: int = 1,
    vllm_is_ratio: torch.Tensor | None = None,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    num_items_in_batch=None,
    *,
    entropy_coef: float = 0.0,
    compute_entropy: bool = False,
    return_metrics: bool = False,
):
    """Reference of :func:`tigon.functional.fused_linear_grpo` (same arguments and semantics; no ``memory``)."""
    return grpo_pipeline(ref_logprobs, dict(_input=_input, weight=weight, selected_token_ids=selected_token_ids,
        attention_mask=attention_mask, advantages=advantages, bias=bias, ref_per_token_logps=ref_per_token_logps,
        old_per_token_logps=old_per_token_logps, ref_input=ref_input, ref_weight=ref_weight, ref_bias=ref_bias,
        beta=beta, epsilon_low=epsilon_low, epsilon_high=epsilon_high, loss_type=loss_type,
        max_completion_length=max_completion_length, importance_sampling_level=importance_sampling_level,
        sapo_temperature_pos=sapo_temperature_pos, sapo_temperature_neg=sapo_temperature_neg, temperature=temperature,
        compiled=compiled, use_ref_model=use_ref_model, chunk_size=chunk_size, vllm_is_ratio=vllm_is_ratio,
        delta=delta, use_bias_correction_kl=use_bias_correction_kl, vespo_k_pos=vespo_k_pos,
        vespo_lambda_pos=vespo_lambda_pos, vespo_k_neg=vespo_k_neg, vespo_lambda_neg=vespo_lambda_neg,
        num_items_in_batch=num_items_in_batch, entropy_coef=entropy_coef, compute_entropy=compute_entropy,
        return_metrics=return_metrics))
