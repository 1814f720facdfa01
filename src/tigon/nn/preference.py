"""Preference-loss modules with Liger-Kernel's (0.8.5) constructors and call signatures: a Liger user swaps
``LigerFusedLinearDPOLoss`` for :class:`FusedLinearDPOLoss` (and SimPO, CPO, ORPO, KTO) and keeps every call.

Each paired loss's forward is ``loss_fn(lin_weight, _input, target, bias=None, ...)`` (KTO: Liger's
``loss_fn(_input, lin_weight, target, ...)``) with ``_input`` (B, T, H) hidden states of
the chosen then the rejected sequences, ``target`` (B, T), and returns Liger's ``(loss, aux_outputs)``: ``aux_outputs
= (chosen_logps, rejected_logps, chosen_logits_mean, rejected_logits_mean, nll_loss, chosen_rewards,
rejected_rewards[, log_odds_ratio, log_odds_chosen])``. The work is the functional ops of
:mod:`tigon.ops.preference`. Liger's ``compiled`` and ``chunk_size`` are accepted and have no effect (the primitive
sizes its own chunks; ``memory`` sets its budget).
"""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as TF
from ..ops import preference as P
from ..reference import preference as ref
from ..reference.kto import check_kto_options
from ..reference.pairs import liger_tuple


class _PreferenceLoss(nn.Module):
    def __init__(self, ignore_index: int, compiled: bool, chunk_size: int, memory):
        super().__init__()
        self.ignore_index = ignore_index
        self.compiled = compiled
        self.chunk_size = chunk_size
        self.memory = memory

    def _liger(self, out) -> tuple:
        return liger_tuple(out)

    def _check_order(self, lin_weight, _input, weight_first: bool = True) -> None:
        """A call with the weight and the hidden states swapped raises naming the forward's order (the functional
        ops take ``(hidden, weight, ...)``, the paired modules Liger's ``(lin_weight, _input, ...)``, KTO's
        ``(_input, lin_weight, ...)``), instead of a shape error about ``hidden`` that names neither argument."""
        if not (isinstance(lin_weight, torch.Tensor) and isinstance(_input, torch.Tensor)):
            return
        if lin_weight.dim() == 3 and _input.dim() == 2:
            order = ("(lin_weight, _input, target, ...)" if weight_first else "(_input, lin_weight, target, ...)")
            raise ValueError(
                f"{type(self).__name__}.forward takes {order} (Liger-Kernel's order): lin_weight is the (V, H) LM "
                f"head, _input the (B, T, H) hidden states; got lin_weight of shape {tuple(lin_weight.shape)} and "
                f"_input of shape {tuple(_input.shape)}: swapped?")


class FusedLinearDPOLoss(_PreferenceLoss):
    """DPO on the LM head without its logits: :func:`tigon.functional.fused_linear_dpo_loss` (Liger's
    ``LigerFusedLinearDPOLoss``).

    Args:
        ignore_index, beta, alpha, compute_nll_loss, average_log_prob, loss_type, label_smoothing, discopop_tau:
            Liger's, with the meaning of the functional op; loss_type takes every TRL 1.16 DPO loss type (Liger's ten
            plus ``ipo``, ``aot``, ``aot_unpaired``, ``sft``, ``sigmoid_norm``) or a list of them.
        compiled, chunk_size: accepted for Liger compatibility; no effect.
        use_ref_model: whether the loss uses a reference model (given as ``ref_input`` / ``ref_weight`` /
            ``ref_bias``, or as ``ref_chosen_logps`` / ``ref_rejected_logps``); False: reference log-probs are 0.
        loss_weights, f_divergence_type, f_alpha_divergence_coef: TRL's options (keyword only).
        memory: the primitive's memory budget (``"auto"``, ``"low"`` or bytes).

    Forward:
        ``loss_fn(lin_weight, _input, target, bias=None, ref_input=None, ref_weight=None, ref_bias=None, *,
        ref_chosen_logps=None, ref_rejected_logps=None)``: lin_weight (V, H); _input (B, T, H) float32 / bfloat16 /
        float16, chosen rows first; target (B, T) integer ids; ref_input (B, T, H_ref), ref_weight (V, H_ref),
        ref_bias (V,); ref_chosen_logps / ref_rejected_logps (B / 2,). Returns Liger's ``(loss, aux_outputs)``
        (float32; only the loss has a gradient).

    Raises:
        ValueError, TypeError: options out of range at construction (as the functional op); at the forward, bad
            inputs (as the functional op), or ``use_ref_model`` without a reference model or reference log-probs.
    """

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0, compute_nll_loss: bool = False,
                 compiled: bool = True, use_ref_model: bool = True, average_log_prob: bool = False,
                 chunk_size: int = 1, loss_type="sigmoid", label_smoothing: float = 0.0, discopop_tau: float = 0.05,
                 *, loss_weights=None, f_divergence_type: str = "reverse_kl", f_alpha_divergence_coef: float = 0.5,
                 memory="auto"):
        super().__init__(ignore_index, compiled, chunk_size, memory)
        ref.check_dpo_options(beta, loss_type, loss_weights, label_smoothing, discopop_tau, f_divergence_type,
                              f_alpha_divergence_coef)
        self.beta, self.alpha, self.compute_nll_loss = beta, alpha, compute_nll_loss
        self.use_ref_model, self.average_log_prob = use_ref_model, average_log_prob
        self.loss_type, self.loss_weights, self.label_smoothing = loss_type, loss_weights, label_smoothing
        self.discopop_tau = discopop_tau
        self.f_divergence_type, self.f_alpha_divergence_coef = f_divergence_type, f_alpha_divergence_coef

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None, ref_input: torch.Tensor | None = None,
                ref_weight: torch.Tensor | None = None, ref_bias: torch.Tensor | None = None, *,
                ref_chosen_logps: torch.Tensor | None = None, ref_rejected_logps: torch.Tensor | None = None):
        self._check_order(lin_weight, _input)
        if not self.use_ref_model:
            ref_input = ref_weight = ref_bias = ref_chosen_logps = ref_rejected_logps = None
        elif ref_input is None and ref_chosen_logps is None:
            raise ValueError("use_ref_model=True needs the reference model (ref_input, ref_weight) or its "
                             "log-probabilities (ref_chosen_logps, ref_rejected_logps); pass use_ref_model=False "
                             "for a reference-free loss")
        return self._liger(TF.fused_linear_dpo_loss(
            _input, lin_weight, target, bias, ref_input, ref_weight, ref_bias, ref_chosen_logps=ref_chosen_logps,
            ref_rejected_logps=ref_rejected_logps, ignore_index=self.ignore_index, beta=self.beta,
            loss_type=self.loss_type, loss_weights=self.loss_weights, label_smoothing=self.label_smoothing,
            discopop_tau=self.discopop_tau, f_divergence_type=self.f_divergence_type,
            f_alpha_divergence_coef=self.f_alpha_divergence_coef, compute_nll_loss=self.compute_nll_loss,
            alpha=self.alpha, average_log_prob=self.average_log_prob, memory=self.memory))

    def extra_repr(self) -> str:
        return f"loss_type={self.loss_type!r}, beta={self.beta}, use_ref_model={self.use_ref_model}"


class FusedLinearCPOLoss(_PreferenceLoss):
    """CPO on the LM head without its logits: :func:`tigon.ops.preference.fused_linear_cpo_loss` (Liger's
    ``LigerFusedLinearCPOLoss``; TRL's CPOTrainer loss types through ``loss_type`` / ``gamma``, keyword only).

    Args:
        ignore_index, beta, alpha, label_smoothing, compute_nll_loss, average_log_prob: Liger's (NLL term on,
            summed log-probs by default). compiled, chunk_size: no effect. loss_type (``"sigmoid"``, ``"hinge"``,
            ``"ipo"``, ``"simpo"``), gamma, memory: keyword only.

    Forward:
        ``loss_fn(lin_weight, _input, target, bias=None)``: as :class:`FusedLinearDPOLoss` without a reference
        model. Returns Liger's ``(loss, aux_outputs)`` (rewards ``beta * logp``).

    Raises:
        ValueError, TypeError: options out of range at construction, bad inputs at the forward.
    """

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0,
                 label_smoothing: float = 0.0, compute_nll_loss: bool = True, compiled: bool = True,
                 average_log_prob: bool = False, chunk_size: int = 1, *, loss_type: str = "sigmoid",
                 gamma: float = 0.5, memory="auto"):
        super().__init__(ignore_index, compiled, chunk_size, memory)
        ref.check_cpo_options(beta, loss_type, label_smoothing, gamma)
        self.beta, self.alpha, self.label_smoothing, self.gamma = beta, alpha, label_smoothing, gamma
        self.compute_nll_loss, self.average_log_prob, self.loss_type = compute_nll_loss, average_log_prob, loss_type

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None):
        self._check_order(lin_weight, _input)
        return self._liger(P.fused_linear_cpo_loss(
            _input, lin_weight, target, bias, ignore_index=self.ignore_index, beta=self.beta,
            loss_type=self.loss_type, label_smoothing=self.label_smoothing, gamma=self.gamma,
            compute_nll_loss=self.compute_nll_loss, alpha=self.alpha, average_log_prob=self.average_log_prob,
            memory=self.memory))


class FusedLinearSimPOLoss(_PreferenceLoss):
    """SimPO on the LM head without its logits: :func:`tigon.ops.preference.fused_linear_simpo_loss` (Liger's
    ``LigerFusedLinearSimPOLoss``: averaged log-probs, NLL term on).

    Args:
        ignore_index, beta, alpha, label_smoothing, compute_nll_loss, gamma: Liger's. compiled, chunk_size: no
            effect. memory: keyword only.

    Forward:
        ``loss_fn(lin_weight, _input, target, bias=None)``; returns Liger's ``(loss, aux_outputs)``.

    Raises:
        ValueError, TypeError: options out of range at construction, bad inputs at the forward.
    """

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, alpha: float = 1.0,
                 label_smoothing: float = 0.0, compute_nll_loss: bool = True, compiled: bool = True,
                 gamma: float = 0.5, chunk_size: int = 1, *, memory="auto"):
        super().__init__(ignore_index, compiled, chunk_size, memory)
        ref.check_cpo_options(beta, "simpo", label_smoothing, gamma)
        self.beta, self.alpha, self.label_smoothing, self.gamma = beta, alpha, label_smoothing, gamma
        self.compute_nll_loss = compute_nll_loss

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None):
        self._check_order(lin_weight, _input)
        return self._liger(P.fused_linear_simpo_loss(
            _input, lin_weight, target, bias, ignore_index=self.ignore_index, beta=self.beta, gamma=self.gamma,
            label_smoothing=self.label_smoothing, compute_nll_loss=self.compute_nll_loss, alpha=self.alpha,
            memory=self.memory))


class FusedLinearORPOLoss(_PreferenceLoss):
    """ORPO on the LM head without its logits: :func:`tigon.ops.preference.fused_linear_orpo_loss` (Liger's
    ``LigerFusedLinearORPOLoss``: averaged log-probs, NLL term on).

    Args:
        ignore_index, beta, compute_nll_loss: Liger's. compiled, chunk_size: no effect. memory: keyword only.

    Forward:
        ``loss_fn(lin_weight, _input, target, bias=None, nll_target=None)``; returns Liger's ``(loss, aux_outputs)``
        with ``log_odds_ratio`` and ``log_odds_chosen`` last.

    Raises:
        ValueError, TypeError: options out of range at construction, bad inputs at the forward; ValueError for an
            ``nll_target`` (a separate NLL target, not supported: it would need a second pass over the chosen rows).
    """

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, compute_nll_loss: bool = True,
                 compiled: bool = True, chunk_size: int = 1, *, memory="auto"):
        super().__init__(ignore_index, compiled, chunk_size, memory)
        ref.check_cpo_options(beta)
        self.beta, self.compute_nll_loss = beta, compute_nll_loss

    def forward(self, lin_weight: torch.Tensor, _input: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None, nll_target: torch.Tensor | None = None):
        self._check_order(lin_weight, _input)
        if nll_target is not None:
            raise ValueError("nll_target is not supported: the NLL term is taken on target's chosen rows")
        return self._liger(P.fused_linear_orpo_loss(
            _input, lin_weight, target, bias, ignore_index=self.ignore_index, beta=self.beta,
            compute_nll_loss=self.compute_nll_loss, memory=self.memory))


class FusedLinearKTOLoss(_PreferenceLoss):
    """KTO on the LM head without its logits: :func:`tigon.ops.preference.fused_linear_kto_loss` (Liger's
    ``LigerFusedLinearKTOLoss``).

    Args:
        ignore_index, beta, use_ref_model, average_log_prob: Liger's (no reference model by default). compiled,
            chunk_size: no effect. loss_type, desirable_weight, undesirable_weight (TRL's), memory: keyword only.

    Forward:
        ``loss_fn(_input, lin_weight, target, bias=None, preference_labels=None, ref_input=None, ref_weight=None,
        ref_bias=None, kl=None)`` (Liger's order: the input first here): _input (B, T, H), preference_labels (B,)
        bool, kl the KL estimate (a float or a 0-d / (B,) tensor). Returns Liger's ``(loss, (chosen_logps_sum,
        rejected_logps_sum, chosen_logits_sum, rejected_logits_sum, chosen_rewards_sum, rejected_rewards_sum))``.

    Raises:
        ValueError, TypeError: options out of range at construction; at the forward, bad inputs, no
            preference_labels, or ``use_ref_model`` without ref_input / ref_weight.
    """

    def __init__(self, ignore_index: int = -100, beta: float = 0.1, compiled: bool = True,
                 use_ref_model: bool = False, average_log_prob: bool = False, chunk_size: int = 1, *,
                 loss_type: str = "kto", desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
                 memory="auto"):
        super().__init__(ignore_index, compiled, chunk_size, memory)
        check_kto_options(beta, loss_type, desirable_weight, undesirable_weight)
        self.beta, self.use_ref_model, self.average_log_prob = beta, use_ref_model, average_log_prob
        self.loss_type, self.desirable_weight, self.undesirable_weight = loss_type, desirable_weight, undesirable_weight

    def forward(self, _input: torch.Tensor, lin_weight: torch.Tensor, target: torch.Tensor,
                bias: torch.Tensor | None = None, preference_labels: torch.Tensor | None = None,
                ref_input: torch.Tensor | None = None, ref_weight: torch.Tensor | None = None,
                ref_bias: torch.Tensor | None = None, kl: torch.Tensor | None = None):
        self._check_order(lin_weight, _input, weight_first=False)
        if preference_labels is None:
            raise ValueError("preference_labels is required: a (B,) bool tensor, True for a desirable completion")
        if not self.use_ref_model:
            ref_input = ref_weight = ref_bias = None
        elif ref_input is None or ref_weight is None:
            raise ValueError("use_ref_model=True needs ref_input and ref_weight")
        return self._liger(P.fused_linear_kto_loss(
            _input, lin_weight, target, preference_labels, bias, ref_input, ref_weight, ref_bias, kl=kl,
            ignore_index=self.ignore_index, beta=self.beta, loss_type=self.loss_type,
            desirable_weight=self.desirable_weight, undesirable_weight=self.undesirable_weight,
            average_log_prob=self.average_log_prob, memory=self.memory))
