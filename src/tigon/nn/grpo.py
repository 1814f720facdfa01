"""``FusedLinearGRPOLoss``: Liger-Kernel's ``LigerFusedLinearGRPOLoss`` (0.8.5) under Tigon's name, with its constructor
and forward arguments, computed by :func:`tigon.functional.fused_linear_grpo`."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as TF
from ..reference.grpo import GRPOOptions, liger_metrics


class GRPOMetrics(tuple):
    """Liger's metrics tuple, ``(kl, clip_ratio)`` when beta != 0 else ``(clip_ratio,)`` (0-d detached tensors; see
    :func:`tigon.reference.grpo.liger_metrics`), carrying every metric TRL logs as ``.trl`` (a dict under TRL's keys:
    ``"kl"``, ``"entropy"``, ``"clip_ratio/low_mean"``, ``"clip_ratio/high_mean"``, ``"clip_ratio/region_mean"``,
    ``"clip_ratio/low_min"``, ``"clip_ratio/high_max"``, ``"cispo_clip_ratio"``, ``"vespo/phi_seq_mean"``, those that
    apply).

    Built like a tuple too (``GRPOMetrics(iterable)``, ``.trl`` then empty), and copied / pickled with ``.trl``: Liger's
    metrics are a plain tuple, which ``copy.deepcopy``, ``pickle`` and accelerate's ``gather`` / ``gather_for_metrics``
    / ``send_to_device`` (``type(obj)(generator)``) rebuild; a required ``trl`` argument made each raise TypeError."""

    trl: dict

    def __new__(cls, items=(), trl: dict | None = None):
        out = super().__new__(cls, items)
        out.trl = {} if trl is None else trl
        return out

    def __reduce__(self):
        return type(self), (tuple(self), self.trl)


class FusedLinearGRPOLoss(nn.Module):
    """The GRPO-family loss of the policy's LM head without its logits (Liger's ``LigerFusedLinearGRPOLoss``).

    Args (Liger 0.8.5's, in its order; then Tigon's keyword-only ones):
        beta, epsilon_low, epsilon_high, loss_type, max_completion_length, importance_sampling_level,
        sapo_temperature_pos, sapo_temperature_neg, temperature, delta, use_bias_correction_kl, vespo_k_pos,
        vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: as :func:`tigon.functional.fused_linear_grpo` (TRL 1.16's
        GRPOConfig meanings; default loss_type "dapo", beta 0.04).
        compiled, chunk_size: accepted, not read (Liger's torch.compile switch and chunk size; the chunks follow
            ``memory``). use_ref_model: with beta != 0, a reference (log-probabilities or model) is required.
        entropy_coef: TRL's entropy bonus coefficient. compute_entropy: also compute the mean entropy metric
            (``metrics.trl["entropy"]``; one more pass over each chunk's logits). memory: the log-probabilities'
            ``memory`` option.

    Forward:
        ``loss_fn(_input, lin_weight, selected_token_ids, attention_mask, advantages, bias=None,
        ref_per_token_logps=None, old_per_token_logps=None, ref_input=None, ref_weight=None, ref_bias=None,
        vllm_is_ratio=None, num_items_in_batch=None)``: _input (B, T, H), lin_weight (V, H), selected_token_ids
        and attention_mask (B, T), advantages (B,); see :func:`tigon.functional.fused_linear_grpo`. Returns
        ``(loss, metrics)``: the 0-d float32 loss (gradients to _input, lin_weight and bias) and a
        :class:`GRPOMetrics`.

    Raises:
        ValueError: bad options at construction (:class:`tigon.reference.grpo.GRPOOptions`); TypeError, ValueError for
            bad inputs at the forward (from the functional op).
    """

    def __init__(self, beta: float = 0.04, compiled: bool = True, use_ref_model: bool = True, chunk_size: int = 1,
                 epsilon_low: float = 0.2, epsilon_high: float = 0.2, loss_type: str = "dapo",
                 max_completion_length: int | None = None, importance_sampling_level: str = "token",
                 sapo_temperature_pos: float = 1.0, sapo_temperature_neg: float = 1.05, temperature: float = 1.0,
                 delta: float | None = None, use_bias_correction_kl: bool = False, vespo_k_pos: float = 2.0,
                 vespo_lambda_pos: float = 3.0, vespo_k_neg: float = 3.0, vespo_lambda_neg: float = 2.0, *,
                 entropy_coef: float = 0.0, compute_entropy: bool = False, memory: str | int = "auto"):
        super().__init__()
        self.beta, self.epsilon_low, self.epsilon_high, self.loss_type = beta, epsilon_low, epsilon_high, loss_type
        self.max_completion_length = max_completion_length
        self.importance_sampling_level = importance_sampling_level
        self.sapo_temperature_pos, self.sapo_temperature_neg = sapo_temperature_pos, sapo_temperature_neg
        self.temperature, self.delta, self.use_bias_correction_kl = temperature, delta, use_bias_correction_kl
        self.vespo_k_pos, self.vespo_lambda_pos = vespo_k_pos, vespo_lambda_pos
        self.vespo_k_neg, self.vespo_lambda_neg = vespo_k_neg, vespo_lambda_neg
        self.compiled, self.use_ref_model, self.chunk_size = compiled, use_ref_model, chunk_size
        self.entropy_coef, self.compute_entropy, self.memory = entropy_coef, compute_entropy, memory
        self.options()  # bad options raise here

    def options(self) -> GRPOOptions:
        """The loss options of the module's attributes (Liger's names; set them between calls as with Liger)."""
        return GRPOOptions(**{k: getattr(self, k) for k in GRPOOptions.__dataclass_fields__})

    def forward(self, _input, lin_weight, selected_token_ids, attention_mask, advantages, bias=None,
                ref_per_token_logps=None, old_per_token_logps=None, ref_input=None, ref_weight=None, ref_bias=None,
                vllm_is_ratio=None, num_items_in_batch=None):
        o = self.options()
        loss, metrics = TF.fused_linear_grpo(
            _input, lin_weight, selected_token_ids, attention_mask, advantages, bias, ref_per_token_logps,
            old_per_token_logps, ref_input, ref_weight, ref_bias, o.beta, o.epsilon_low, o.epsilon_high, o.loss_type,
            o.max_completion_length, o.importance_sampling_level, o.sapo_temperature_pos, o.sapo_temperature_neg,
            self.temperature, self.compiled, self.use_ref_model, self.chunk_size, vllm_is_ratio, o.delta,
            o.use_bias_correction_kl, o.vespo_k_pos, o.vespo_lambda_pos, o.vespo_k_neg, o.vespo_lambda_neg,
            num_items_in_batch, entropy_coef=o.entropy_coef, compute_entropy=self.compute_entropy,
            return_metrics=True, memory=self.memory)
        return loss, GRPOMetrics(liger_metrics(o, metrics, loss), metrics)

    def extra_repr(self) -> str:
        return (f"loss_type={self.loss_type!r}, beta={self.beta}, epsilon_low={self.epsilon_low}, "
                f"epsilon_high={self.epsilon_high}, importance_sampling_level={self.importance_sampling_level!r}, "
                f"temperature={self.temperature}")
