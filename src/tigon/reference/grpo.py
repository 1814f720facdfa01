"""The GRPO family's per-token losses on per-token log-probabilities, as TRL's ``GRPOTrainer`` computes them.

Pure PyTorch on (B, T) tensors: autograd differentiates it (a few elementwise passes over B x T values); the
log-probabilities come from :func:`tigon.functional.fused_linear_logprobs` (the LM head, the heavy part). Used by
:func:`tigon.functional.fused_linear_grpo`, :class:`tigon.nn.FusedLinearGRPOLoss` and the float64 reference
:mod:`tigon.reference.fused_linear_grpo`.

Source: TRL 1.16, ``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss`` and ``get_gamma_weights`` (the
formulas below follow it term for term; the tests run TRL's own method on the same log-probabilities). With
``log_ratio = logp - old_logp`` per token (``old_logp = logp.detach()`` when not given: one policy update per
generation) and the importance weight ``w = exp(log_ratio)`` per token (``importance_sampling_level="token"``) or
``exp(masked mean of log_ratio)`` per sequence (``"sequence"``, GSPO, Zheng et al. 2025):

* ``grpo`` / ``bnpo`` / ``dr_grpo`` / ``dapo`` / ``luspo`` (PPO's clipped surrogate, Schulman et al. 2017; GRPO,
  Shao et al. 2024): ``-min(w' A, clip(w, 1 - epsilon_low, 1 + epsilon_high) A)``, ``w' = min(w, delta)`` with the
  two-sided clipping of INTELLECT-2 (``delta``), else ``w``;
* ``cispo`` (MiniMax-M1): ``-sg(min(w, epsilon_high)) A logp`` (sg: no gradient);
* ``sapo`` (Soft Adaptive Policy Optimization): ``-sigmoid(tau (w - 1)) 4 / tau A``, tau = ``sapo_temperature_pos``
  where A > 0, else ``sapo_temperature_neg``;
* ``vespo``: ``-sg(phi) A logp``, phi = e^lambda w^k e^(-lambda w) of the sequence's summed log-ratio (gamma
  weights, k / lambda by the sign of A);

times ``vllm_is_ratio`` when given (not for vespo, whose phi takes it in log space), plus ``beta`` times the k3
estimate of KL(policy || reference) per token, ``exp(ref - logp) - (ref - logp) - 1`` (Schulman 2020, "Approximating
KL divergence"; times ``w`` with ``use_bias_correction_kl``). Reduced over the completion mask: ``grpo`` / ``sapo``
per-sequence means averaged over sequences; ``bnpo`` sum / mask tokens; ``dr_grpo`` sum / (B *
max_completion_length); ``dapo`` / ``cispo`` / ``vespo`` sum / ``num_items_in_batch`` (per process; default the
mask's tokens over all processes); ``luspo`` per-sequence sums averaged. ``entropy_coef`` subtracts that times the
masked mean entropy (TRL's entropy bonus).

Not covered (TRL features that are not a loss of these inputs): the division by the gradient-accumulation steps
(the trainer's), ``top_entropy_quantile`` (an entropy mask from a global quantile), ``off_policy_mask_threshold``
and ``tool_mask`` (multiply them into ``attention_mask``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from .. import _checks

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
"""Every ``loss_type`` of TRL 1.16's GRPOTrainer (Liger-Kernel 0.8.5 lists the same)."""
CLIPPED = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
"""The loss types of the clipped surrogate (they log clip ratios)."""
LEVELS = ("token", "sequence")


def _real(name: str, value, *, positive: bool = False, optional: bool = False) -> float | None:
    if optional and value is None:
        return None
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not _checks.finite(float(value)):
        raise ValueError(f"{name} must be a finite number{' or None' if optional else ''}, got {value!r}")
    if positive and not float(value) > 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class GRPOOptions:
    """The options of the GRPO loss (TRL's ``GRPOConfig`` names and defaults, Liger's where TRL has none).

    Raises:
        ValueError: an unknown ``loss_type`` or ``importance_sampling_level``; a non-finite number; temperatures or
            ``delta`` not > 0; ``dr_grpo`` without a ``max_completion_length`` > 0.
    """

    beta: float = 0.04
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    loss_type: str = "dapo"
    max_completion_length: int | None = None
    importance_sampling_level: str = "token"
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    delta: float | None = None
    use_bias_correction_kl: bool = False
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0
    entropy_coef: float = 0.0

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling_level not in LEVELS:
            raise ValueError(f"importance_sampling_level must be one of {LEVELS}, got "
                             f"{self.importance_sampling_level!r}")
        for name in ("beta", "epsilon_low", "epsilon_high", "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg",
                     "vespo_lambda_neg", "entropy_coef"):
            _real(name, getattr(self, name))
        _real("sapo_temperature_pos", self.sapo_temperature_pos, positive=True)
        _real("sapo_temperature_neg", self.sapo_temperature_neg, positive=True)
        _real("delta", self.delta, positive=True, optional=True)
        _checks.flag("use_bias_correction_kl", self.use_bias_correction_kl)
        m = self.max_completion_length
        if m is not None and (not isinstance(m, numbers.Integral) or isinstance(m, bool) or m <= 0):
            raise ValueError(f"max_completion_length must be None or an int > 0, got {m!r}")
        if self.loss_type == "dr_grpo" and m is None:
            raise ValueError("max_completion_length must be given for loss_type='dr_grpo'")


@torch.no_grad()
def gamma_weights(advantages, log_ratio, mask, is_ratio, k_pos, lambda_pos, k_neg, lambda_neg) -> torch.Tensor:
    """VESPO's (B, 1) sequence weights phi(w) = e^lambda w^k e^(-lambda w) (phi(1) = 1), in log space, no gradient:
    w = exp(sum of the masked per-token log-ratios clamped to [-20, 20], plus the summed log of ``is_ratio``),
    clamped to [1e-8, e^20]; k, lambda by the sign of the (B, 1) advantages. TRL's ``get_gamma_weights``."""
    low = math.log(1e-8)
    seq = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
    if is_ratio is not None:
        seq = seq + torch.sum(torch.clamp(torch.log(is_ratio), low, 20.0), dim=-1, keepdim=True)
    log_w = torch.clamp(seq, low, 20.0)
    nonneg = advantages >= 0
    k = torch.where(nonneg, k_pos, k_neg)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _per_process_tokens(mask: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    """dapo's normalizer: ``num_items_in_batch`` (tokens of the whole generation batch, over all processes), else the
    mask's tokens summed over the processes (one all-reduce when torch.distributed is initialised), clamped to >= 1,
    divided by the number of processes (TRL's ``num_items_in_batch.clamp(min=1) / num_processes``)."""
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if num_items_in_batch is not None:
        total = torch.as_tensor(num_items_in_batch, device=mask.device).to(mask.dtype).reshape(())  # (a (1,) too)
    else:
        total = mask.sum()
        if world > 1:
            total = total.clone()
            dist.all_reduce(total)
    return total.clamp(min=1.0) / world


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's ``global_masked_mean`` on one process: the masked mean of a (B, T) tensor, or the plain mean of a (B, 1)
    one (a per-sequence value)."""
    x = x.to(mask.dtype)
    if x.shape[1] == 1:
        return x.sum() / x.shape[0]
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def _seq_means(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TRL's ``masked_seq_mean``: (B,) per-sequence masked means (NaN for an empty sequence)."""
    x = x.to(mask.dtype)
    return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)


def _nan_extreme(x: torch.Tensor, fn) -> torch.Tensor:
    """``fn`` (torch.amin / amax) over the non-NaN entries of a 1-D tensor, NaN when there are none (TRL's nanmin /
    nanmax), without a host synchronisation."""
    nan = torch.isnan(x)
    fill = math.inf if fn is torch.amin else -math.inf
    out = fn(torch.where(nan, fill, x)) if x.numel() else x.new_tensor(fill)
    return torch.where(nan.all(), math.nan, out)


def grpo_loss(
    per_token_logps: torch.Tensor,
    attention_mask: torch.Tensor,
    advantages: torch.Tensor,
    ref_per_token_logps: torch.Tensor | None = None,
    old_per_token_logps: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    vllm_is_ratio: torch.Tensor | None = None,
    num_items_in_batch=None,
    options: GRPOOptions = GRPOOptions(),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO-family loss of per-token log-probabilities and the metrics TRL logs (formulas: module docstring).

    Args:
        per_token_logps: (B, T) float log-probabilities of the sampled completion tokens under the policy
            (differentiable; float32, or float64 for the reference).
        attention_mask: (B, T) completion mask (bool / int / float): the tokens that count, each weighted by its
            value as TRL multiplies by it (0 / 1 as a rule; a fractional value is a weight, not a 1).
        advantages: (B,) or (B, T) advantages.
        ref_per_token_logps: (B, T) reference-model log-probabilities (read when ``options.beta != 0``; None: the
            policy's own, detached, i.e. a zero KL term).
        old_per_token_logps: (B, T) log-probabilities of the policy that sampled (None: the policy's own, detached).
        entropies: (B, T) per-token entropies (nats), for the ``"entropy"`` metric and ``options.entropy_coef``.
        vllm_is_ratio: (B, T), (B, 1) or (B,) importance-sampling correction of the sampler (TRL's
            ``importance_sampling_ratio``), or None.
        num_items_in_batch: tokens of the whole generation batch (dapo / cispo / vespo normalizer), or None.
        options: :class:`GRPOOptions`.

    Returns:
        (loss, metrics): the 0-d loss in ``per_token_logps``' dtype, and 0-d detached metrics under TRL's keys:
        ``"kl"`` (when beta != 0), ``"entropy"`` (when ``entropies`` is given), ``"clip_ratio/low_mean"``,
        ``"clip_ratio/high_mean"``, ``"clip_ratio/region_mean"``, ``"clip_ratio/low_min"``,
        ``"clip_ratio/high_max"`` (clipped loss types), ``"cispo_clip_ratio"`` (cispo), ``"vespo/phi_seq_mean"``
        (vespo). Masked tokens contribute nothing (their log-probabilities may be anything finite or not).

    Raises:
        ValueError: ``entropy_coef != 0`` without ``entropies``.
    """
    o = options
    logp = per_token_logps
    dt = logp.dtype
    mask = attention_mask.to(dt)  # a weight per token, as TRL multiplies by it (0 / 1 as a rule)
    adv, ratio = per_row_inputs(advantages, vllm_is_ratio, dt)
    per_token, coef_1, kl, phi = token_losses(logp, mask, adv, ref_per_token_logps, old_per_token_logps, ratio, o)
    loss = reduce_loss(per_token, mask, entropies, num_items_in_batch, o)
    with torch.no_grad():
        metrics = _metrics(o, mask, adv, coef_1, kl, entropies, phi)
    return loss, metrics


def per_row_inputs(advantages: torch.Tensor, vllm_is_ratio: torch.Tensor | None, dt: torch.dtype):
    """(advantages, vllm_is_ratio) in ``dt``, a (B,) one as (B, 1) (broadcast over the tokens)."""
    adv = advantages.to(dt)
    adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
    ratio = None
    if vllm_is_ratio is not None:
        ratio = vllm_is_ratio.to(dt)
        ratio = ratio.unsqueeze(-1) if ratio.dim() == 1 else ratio
    return adv, ratio


def couples_tokens(o: GRPOOptions) -> bool:
    """Whether a token's loss depends on other tokens' log-probabilities (of its own sequence): sequence-level
    importance sampling (the sequence's mean log-ratio) and vespo (its gamma weight of the sequence's summed
    log-ratio). Otherwise :func:`token_losses` is elementwise in the log-probabilities."""
    return o.importance_sampling_level == "sequence" or o.loss_type == "vespo"


def token_losses(logp, mask, adv, ref_per_token_logps, old_per_token_logps, ratio, o: GRPOOptions):
    """The per-token losses before the reduction (formulas: module docstring): ``(per_token, coef_1, kl, phi)``,
    (b, t) tensors in ``logp``'s dtype (kl None when beta == 0, phi None unless vespo) for (b, t) log-probabilities,
    the mask (each token's weight, 0: not counted; any dtype), advantages and ``ratio`` (b, 1) or (b, t)
    (:func:`per_row_inputs`), reference and old log-probabilities (b, t) or None. Rows are whole sequences (the
    sequence-level terms reduce over dim -1); where :func:`couples_tokens` is False any (1, t) run of tokens works
    too."""
    dt = logp.dtype
    keep = mask != 0
    mask = mask.to(dt)
    same = logp.detach()
    # masked tokens: ratio 1 and zero KL, so that a log-probability left at 0 there gives no inf * 0
    old = same if old_per_token_logps is None else torch.where(keep, old_per_token_logps.to(dt), same)
    log_ratio = logp - old
    if o.importance_sampling_level == "token":
        log_w = log_ratio
    else:
        log_w = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_w)
    kl = None
    if o.beta != 0.0:
        ref = same if ref_per_token_logps is None else torch.where(keep, ref_per_token_logps.to(dt), same)
        kl = torch.exp(ref - logp) - (ref - logp) - 1.0
        if o.use_bias_correction_kl:
            kl = kl * coef_1
    phi = None
    if o.loss_type == "cispo":
        per_token = -torch.clamp(coef_1, max=o.epsilon_high).detach() * adv * logp
    elif o.loss_type in CLIPPED:
        coef_2 = torch.clamp(coef_1, 1.0 - o.epsilon_low, 1.0 + o.epsilon_high)
        if o.delta is not None:
            coef_1 = torch.clamp(coef_1, max=o.delta)  # TRL logs the clip ratios of this one too
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    elif o.loss_type == "sapo":
        tau = torch.where(adv > 0, o.sapo_temperature_pos, o.sapo_temperature_neg).to(dt)
        per_token = -(torch.sigmoid(tau * (coef_1 - 1.0)) * 4.0 / tau) * adv
    else:  # vespo
        phi = gamma_weights(adv, log_ratio, mask, ratio, o.vespo_k_pos, o.vespo_lambda_pos, o.vespo_k_neg,
                            o.vespo_lambda_neg)
        per_token = -phi * adv * logp
    if ratio is not None and o.loss_type != "vespo":
        per_token = per_token * ratio
    if kl is not None:
        per_token = per_token + o.beta * kl
    return per_token, coef_1, kl, phi


def reduce_loss(per_token, mask, entropies, num_items_in_batch, o: GRPOOptions) -> torch.Tensor:
    """The loss from the (B, T) per-token losses of :func:`token_losses`, the (B, T) float mask and, for the entropy
    bonus, the (B, T) entropies: linear in both, with coefficients that depend on the mask alone (the loss type's
    normalizer), so its gradient is known before the log-probabilities are."""
    masked = per_token * mask
    if o.loss_type in ("grpo", "sapo"):
        loss = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif o.loss_type == "bnpo":
        loss = masked.sum() / mask.sum().clamp(min=1.0)
    elif o.loss_type == "dr_grpo":
        loss = masked.sum() / (per_token.shape[0] * o.max_completion_length)
    elif o.loss_type == "luspo":
        loss = masked.sum(-1).mean()
    else:  # dapo, cispo, vespo
        loss = masked.sum() / _per_process_tokens(mask, num_items_in_batch)
    if o.entropy_coef != 0.0:
        if entropies is None:
            raise ValueError("entropy_coef != 0 needs the per-token entropies")
        loss = loss - o.entropy_coef * ((entropies * mask).sum() / mask.sum().clamp(min=1.0))
    return loss


def _metrics(o: GRPOOptions, mask, adv, coef_1, kl, entropies, phi) -> dict[str, torch.Tensor]:
    """The metrics TRL's ``_compute_loss`` logs, as 0-d tensors (see :func:`grpo_loss`)."""
    out = {}
    if kl is not None:
        out["kl"] = _masked_mean(kl, mask)
    if entropies is not None:
        out["entropy"] = _masked_mean(entropies, mask)
    if o.loss_type in CLIPPED:
        low = (coef_1 < 1.0 - o.epsilon_low) & (adv < 0)
        high = (coef_1 > 1.0 + o.epsilon_high) & (adv > 0)
        out["clip_ratio/low_mean"] = _masked_mean(low, mask)
        out["clip_ratio/high_mean"] = _masked_mean(high, mask)
        out["clip_ratio/region_mean"] = _masked_mean(low | high, mask)
        out["clip_ratio/low_min"] = _nan_extreme(_seq_means(low, mask), torch.amin)
        out["clip_ratio/high_max"] = _nan_extreme(_seq_means(high, mask), torch.amax)
    elif o.loss_type == "cispo":
        out["cispo_clip_ratio"] = _masked_mean((coef_1 > o.epsilon_high) & (adv > 0), mask)
    elif o.loss_type == "vespo":
        out["vespo/phi_seq_mean"] = _masked_mean(phi, mask)
    return out


def liger_metrics(options: GRPOOptions, metrics: dict[str, torch.Tensor], like: torch.Tensor) -> tuple:
    """Liger-Kernel's metrics tuple from :func:`grpo_loss`'s dict: ``(kl, clip_ratio)`` when beta != 0, else
    ``(clip_ratio,)``; clip_ratio is TRL's ``clip_ratio/region_mean`` (``cispo_clip_ratio`` for cispo, 0 for sapo and
    vespo, as Liger reports them)."""
    clip = metrics.get("clip_ratio/region_mean", metrics.get("cispo_clip_ratio"))
    if clip is None:
        clip = like.new_zeros(())
    return ((metrics["kl"],) if options.beta != 0.0 else ()) + (clip,)
