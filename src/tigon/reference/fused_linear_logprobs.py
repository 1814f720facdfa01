"""Fused linear log-probabilities reference: materialise the logits, then log-softmax and gather.

The specification of :func:`tigon.functional.fused_linear_logprobs`. Per token ``i`` with target ``t = target[i]``
(tokens whose target equals ``ignore_index`` give 0 in every output and receive no gradient), temperature ``T`` and
final-logit soft-cap ``c``:

    z_i   = hidden_i @ weight.T + bias                         the LM head's logits
    x_i   = c * tanh(z_i / c) / T      (or z_i / T without a soft-cap)
    lse_i = logsumexp_v x_iv
    logp_i = x_it - lse_i                                      log-probability of the target
    H_i   = -sum_v p_iv log p_iv = lse_i - sum_v p_iv x_iv     entropy (nats), p_i = softmax(x_i)
    is_top1_i = (argmax_v x_iv == t)                           the target is the row's top-1 (no gradient)
    sq_i  = log sum_v p_iv^2 = lse(2 x_i) - 2 lse_i            log of the collision probability (no gradient)
    mean_i = (1 / V) sum_v x_iv                                the mean scaled logit (no gradient)

``sq`` (``log_sum_sq_probs``) is TRL's name and use: DPO's WPO weights (Zhou et al. 2024, "WPO: Enhancing RLHF with
Weighted Preference Optimization", Eq. 2) subtract it from each token's log-probability under ``torch.no_grad``, so it
is returned detached, as TRL's fused head returns it.

``mean`` (``mean_logits``) is TRL's too: its fused LM head (``trl.kernels.chunked_logprob``, TRL 1.16) returns the
vocabulary mean of the logits after the logit scale, the soft-cap and the temperature, in fp32 and without gradient;
DPO and KTO log it (``logits/chosen``, ``logits/rejected``). Without a soft-cap it is linear in the hidden state
(``h . mean_v W_v + mean_v b_v``, over T); with one it is not, and needs every logit: the kernels sum them in the pass
that forms the log-sum-exp.

``is_top1`` follows ``torch.argmax``'s tie rule: among equal maxima the first index wins, so a target tied with an
earlier column is not top-1 (TRL's token accuracy, ``argmax == label``). It is taken on the transformed logits ``x``
(a soft-cap may round two distinct logits to one value; the temperature never reorders them).

This is what TRL's trainers compute from a model's logits (``trl.trainer.utils.selective_log_softmax``: the logits
divided by the temperature, then log-softmax gathered at the target; ``entropy_from_logits`` on the same scaled
logits; Gemma 2's soft-cap is applied inside the model, before the temperature). Computed in the inputs' dtype
promoted to at least float32 (float64 inputs give a float64 truth).

Gradients (what the Triton path implements; here autograd derives them): for upstream gradients ``a`` (on logp),
``h`` (on H) and ``l`` (on lse),
    d/dx_iv = a (1[v = t] - p_v) + h p_v ((lse - x_v) - H) + l p_v
then times the soft-cap and temperature derivative ``(1 - tanh^2(z / c)) / T``.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from .. import _checks
from .cross_entropy import check_target_range
from .fused_linear_cross_entropy import check_head


class LogProbsOutput(NamedTuple):
    """Returned by :func:`fused_linear_logprobs` when any of its ``return_*`` flags is set.

    logprobs: (N,) float32 (float64 for float64 inputs) log-probability of each target, 0 at ignored tokens.
    entropy: (N,) entropy of each token's distribution in nats, 0 at ignored tokens; None unless requested.
    lse: (N,) log-sum-exp of each token's scaled logits (``x`` of the module docstring), 0 at ignored tokens;
        None unless requested. These three are differentiable.
    is_top1: (N,) bool, whether the target is the first argmax of its row's logits (TRL's token accuracy), False at
        ignored tokens; not differentiable (detached); None unless requested.
    log_sum_sq_probs: (N,) ``log sum_v p_v^2`` of each token's distribution (<= 0; in [-log V, 0]), 0 at ignored
        tokens; not differentiable (detached; TRL's WPO weights); None unless requested.
    mean_logits: (N,) mean over the vocabulary of each token's scaled logits (``x``), 0 at ignored tokens; not
        differentiable (detached; TRL's ``logits/*`` metrics); None unless requested.
    """

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    is_top1: torch.Tensor | None = None
    log_sum_sq_probs: torch.Tensor | None = None
    mean_logits: torch.Tensor | None = None


def check_inputs(hidden, weight, target, bias, *, temperature, softcap, ignore_index) -> None:
    """Validate :func:`fused_linear_logprobs`'s tensors and options.

    Raises:
        TypeError: hidden / weight / bias not floating, target not an integer tensor, ignore_index not an int.
        ValueError: hidden not (N, H), weight not (V, H) with V >= 1, target not (N,), bias not (V,), devices
            differ, temperature not a finite float > 0, softcap not None or a finite float > 0.
    """
    check_head(hidden, weight, target, bias)
    if (not isinstance(temperature, numbers.Real) or isinstance(temperature, bool)
            or not _checks.finite(float(temperature)) or not float(temperature) > 0.0):
        raise ValueError(f"temperature must be a finite float > 0, got {temperature!r}")
    _checks.softcap("softcap", softcap)
    _checks.integer("ignore_index", ignore_index)


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
):
    """Per-token ``log softmax(softcap(hidden @ weight.T + bias) / temperature)[target]``; see the module docstring.

    Args:
        hidden: (N, H) float tensor (final hidden states, batch and sequence flattened).
        weight: (V, H) LM-head weight.
        target: (N,) integer token ids in [0, V), or ``ignore_index``.
        bias: optional (V,) LM-head bias.
        temperature: divides the (soft-capped) logits; finite, > 0 (TRL's ``temperature``).
        softcap: final-logit soft-cap ``c`` (Gemma 2), applied before the temperature; None for none.
        ignore_index: target value of tokens to skip (0 in every output, no gradient).
        return_entropy, return_lse: also return each token's entropy / log-sum-exp (:class:`LogProbsOutput`).
        return_is_top1: also return whether each target is its row's argmax ((N,) bool, False where ignored).
        return_log_sum_sq_probs: also return each token's ``log sum_v p_v^2`` (detached; 0 where ignored).
        return_mean_logits: also return each token's mean scaled logit ``mean_v x_v`` (detached; 0 where ignored).

    Returns:
        The (N,) log-probabilities in the inputs' dtype promoted to at least float32, or
        ``LogProbsOutput(logprobs, entropy, lse, is_top1, log_sum_sq_probs, mean_logits)`` (None for what was not
        requested).

    Raises:
        TypeError, ValueError: see :func:`check_inputs`; ValueError for a target outside [0, V) other than
            ``ignore_index``.
    """
    check_inputs(hidden, weight, target, bias, temperature=temperature, softcap=softcap, ignore_index=ignore_index)
    check_target_range(target, weight.shape[0], ignore_index)
    ct = torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)
    x = hidden.to(ct) @ weight.to(ct).t()
    if bias is not None:
        x = x + bias.to(ct)
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    if temperature != 1.0:
        x = x / temperature
    valid = target != ignore_index
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    logsm = torch.log_softmax(x, dim=-1)
    safe = torch.where(valid, target, torch.zeros_like(target)).long()
    logp = torch.where(valid, logsm.gather(1, safe[:, None]).squeeze(1), zero)
    if not (return_entropy or return_lse or return_is_top1 or return_log_sum_sq_probs or return_mean_logits):
        return logp
    ent = torch.where(valid, -(logsm.exp() * logsm).sum(-1), zero) if return_entropy else None
    lse = torch.where(valid, torch.logsumexp(x, dim=-1), zero) if return_lse else None
    top1 = (valid & (x.detach().argmax(-1) == target)) if return_is_top1 else None
    sq = None
    if return_log_sum_sq_probs:
        xd = x.detach()
        sq = torch.where(valid, torch.logsumexp(2 * xd, dim=-1) - 2 * torch.logsumexp(xd, dim=-1), zero)
    mean = torch.where(valid, x.detach().mean(-1), zero) if return_mean_logits else None
    return LogProbsOutput(logp, ent, lse, top1, sq, mean)
