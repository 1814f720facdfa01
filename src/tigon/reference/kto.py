"""Kahneman-Tversky Optimization on an LM head: the specification of :func:`tigon.ops.preference.fused_linear_kto_loss`.

KTO is unpaired: each of the B sequences carries its own label (desirable, ``preference_labels[b] = True``, or
undesirable). With the sequence log-probabilities of :mod:`tigon.reference.pairs` (sums, or averages with
``average_log_prob``), ``u_b = logp_b - ref_logp_b`` (``ref_logp_b = 0`` without a reference) and ``z`` the KL
estimate given by the caller (TRL computes it from mismatched completions and clamps it at 0; 0 when not given):

    kto                desirable: 1 - sigma(beta (u_b - z))      undesirable: 1 - sigma(beta (z - u_b))
                       (Ethayarajh et al. 2024, "KTO", eq. 7)
    apo_zero_unpaired  desirable: 1 - sigma(beta u_b)            undesirable: sigma(beta u_b)
                       (D'Oosterlinck et al. 2024, APO, eq. 7, unpaired)

weighted by ``desirable_weight`` / ``undesirable_weight`` and averaged over the B sequences (TRL 1.16's
``KTOTrainer``, ``trl/trainer/kto_trainer.py``; Liger-Kernel's ``LigerFusedLinearKTOLoss``, weights 1, type ``kto``).
Rewards ``beta u_b``. The metrics are Liger's sums over each group: log-probs, logits (every position and class,
without the logits: :func:`tigon.reference.pairs.row_logit_sums`) and rewards.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from .. import _checks
from .fused_linear_logprobs import fused_linear_logprobs as _token_logps
from .pairs import check_batch, policy_and_reference, row_logit_sums

KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")
"""TRL 1.16 ``KTOConfig.loss_type``'s values, both covered."""


class KTOOutput(NamedTuple):
    """:func:`fused_linear_kto_loss`'s result, Liger's order (float32; float64 for float64 inputs; only ``loss``
    carries a gradient): the 0-d loss, then 0-d sums over the desirable (chosen) and undesirable (rejected)
    sequences of their log-probabilities, logits and rewards."""

    loss: torch.Tensor
    chosen_logps_sum: torch.Tensor
    rejected_logps_sum: torch.Tensor
    chosen_logits_sum: torch.Tensor
    rejected_logits_sum: torch.Tensor
    chosen_rewards_sum: torch.Tensor
    rejected_rewards_sum: torch.Tensor


def check_kto_options(beta=0.1, loss_type="kto", desirable_weight=1.0, undesirable_weight=1.0) -> None:
    """Validate KTO's options.

    Raises:
        ValueError: loss_type not in :data:`KTO_LOSS_TYPES`, beta < 0, a weight < 0.
        TypeError: a number that is not one.
    """
    _checks.choice("loss_type", loss_type, KTO_LOSS_TYPES)
    _checks.number("beta", beta, minimum=0.0)  # 0: a legitimate ablation, taken by Liger-Kernel
    _checks.number("desirable_weight", desirable_weight, minimum=0.0)
    _checks.number("undesirable_weight", undesirable_weight, minimum=0.0)


def kto_losses(logps, ref_seq, ref_logps, kl, preference_labels, beta, loss_type, desirable_weight,
               undesirable_weight) -> tuple[torch.Tensor, torch.Tensor]:
    """The (B,) weighted per-sequence losses (module docstring; their mean is the loss) and the (B,) log-ratios ``u``
    from the policy's (B,) sequence log-probabilities ``logps`` and the reference's: ``ref_seq`` (the model's, or
    None), else ``ref_logps`` (given), else 0. Each sequence's loss depends on its own log-probability alone."""
    if ref_seq is None:
        ref_seq = ref_logps.detach().to(logps.dtype) if ref_logps is not None else torch.zeros_like(logps)
    z = kl.detach().to(logps.dtype) if kl is not None else torch.zeros((), dtype=logps.dtype, device=logps.device)
    u = logps - ref_seq
    good = preference_labels
    if loss_type == "kto":
        losses = torch.where(good, 1 - torch.sigmoid(beta * (u - z)), 1 - torch.sigmoid(beta * (z - u)))
    else:
        losses = torch.where(good, 1 - torch.sigmoid(beta * u), torch.sigmoid(beta * u))
    return losses * torch.full_like(losses, float(undesirable_weight)).masked_fill(good, float(desirable_weight)), u


def kto_with(token_logps, hidden, weight, target, preference_labels, bias=None, ref_hidden=None, ref_weight=None,
             ref_bias=None, *, ref_logps=None, kl=None, ignore_index: int = -100, beta: float = 0.1,
             loss_type: str = "kto", desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
             average_log_prob: bool = False, policy_lp=None, ref_lp=None, formed=None) -> KTOOutput:
    """KTO with the per-token log-prob function ``token_logps`` (see :data:`tigon.reference.pairs.TokenLogps`):
    the body of the public op (Tigon's kernels), of :func:`fused_linear_kto_loss` and of TRL's plain computation.
    ``policy_lp``, ``ref_lp``: (B, T) per-token log-probabilities computed already
    (:func:`tigon.reference.pairs.policy_and_reference`). ``formed``: None, or a function of this one's arguments
    (less these three) returning the output with the policy's gradients formed in its forward
    (:func:`tigon.ops.preference_formed.formed_kto_loss`), or None where it cannot.

    Raises:
        As :func:`fused_linear_kto_loss`.
    """
    check_batch(hidden, weight, target, bias, ref_hidden, ref_weight, ref_bias, paired=False)
    check_kto_options(beta, loss_type, desirable_weight, undesirable_weight)
    b = hidden.shape[0]
    _checks.tensor("preference_labels", preference_labels, ndim=1)
    if preference_labels.dtype != torch.bool or preference_labels.shape[0] != b:
        raise ValueError(f"preference_labels must be a ({b},) bool tensor (True: desirable), got "
                         f"{tuple(preference_labels.shape)} {preference_labels.dtype}")
    if ref_logps is not None:
        if ref_hidden is not None:
            raise ValueError("give either the reference model (ref_hidden, ref_weight) or ref_logps, not both")
        _checks.tensor("ref_logps", ref_logps, floating=True, ndim=1)
        if ref_logps.shape[0] != b:
            raise ValueError(f"ref_logps must have shape ({b},), got {tuple(ref_logps.shape)}")
    if isinstance(kl, numbers.Real) and not isinstance(kl, bool):  # Liger subtracts it as given: a float works
        kl = torch.tensor(_checks.number("kl", kl), dtype=torch.float32, device=hidden.device)
    if kl is not None:
        _checks.tensor("kl", kl, floating=True, ndim=(0, 1))
        if kl.dim() == 1 and kl.shape[0] not in (1, b):
            raise ValueError(f"kl must be 0-d, (1,) or ({b},) (one per sequence), got {tuple(kl.shape)}")
    _checks.same_device(hidden=hidden, preference_labels=preference_labels, ref_logps=ref_logps, kl=kl)
    if not isinstance(average_log_prob, (bool, int)):
        raise TypeError(f"average_log_prob must be a bool, got {type(average_log_prob).__name__}")
    if formed is not None:
        out = formed(token_logps, hidden, weight, target, preference_labels, bias, ref_hidden, ref_weight, ref_bias,
                     ref_logps=ref_logps, kl=kl, ignore_index=ignore_index, beta=beta, loss_type=loss_type,
                     desirable_weight=desirable_weight, undesirable_weight=undesirable_weight,
                     average_log_prob=average_log_prob)
        if out is not None:
            return out
    _, _, logps, ref_seq = policy_and_reference(token_logps, hidden, weight, target, bias, ref_hidden, ref_weight,
                                                ref_bias, ignore_index, bool(average_log_prob), policy_lp, ref_lp)
    losses, u = kto_losses(logps, ref_seq, ref_logps, kl, preference_labels, beta, loss_type, desirable_weight,
                           undesirable_weight)
    rewards = (beta * u).detach()
    sums = row_logit_sums(hidden, weight, bias, logps.dtype)
    return KTOOutput(losses.mean(), *_group_sums(logps.detach(), preference_labels),
                     *_group_sums(sums, preference_labels), *_group_sums(rewards, preference_labels))


def _group_sums(x: torch.Tensor, good: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 0-d sums of (B,) ``x`` over the desirable (``good``) and the undesirable sequences, each with the others
    zeroed (the same sums, up to the order of the additions): no data-dependent shape. ``x[good]`` is a ``nonzero``,
    a graph break under ``torch.compile`` without ``fullgraph``, there inside the formed path's ``torch.no_grad``
    block, where torch 2.11's AOTAutograd (the GPU image's) then failed to compile the graph before the break
    ("element 0 of tensors does not require grad")."""
    return torch.where(good, x, 0.0).sum(), torch.where(good, 0.0, x).sum()


def fused_linear_kto_loss(hidden, weight, target, preference_labels, bias=None, ref_hidden=None, ref_weight=None,
                          ref_bias=None, *, ref_logps=None, kl=None, ignore_index: int = -100, beta: float = 0.1,
                          loss_type: str = "kto", desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
                          average_log_prob: bool = False) -> KTOOutput:
    """KTO with the logits materialised: the specification of :func:`tigon.ops.preference.fused_linear_kto_loss` (same
    arguments, less ``memory``)."""
    return kto_with(_token_logps, hidden=hidden, weight=weight, target=target,
        preference_labels=preference_labels, bias=bias, ref_hidden=ref_hidden, ref_weight=ref_weight,
        ref_bias=ref_bias, ref_logps=ref_logps, kl=kl, ignore_index=ignore_index, beta=beta, loss_type=loss_type,
        desirable_weight=desirable_weight, undesirable_weight=undesirable_weight, average_log_prob=average_log_prob)


__all__ = ["KTOOutput", "KTO_LOSS_TYPES", "check_kto_options", "fused_linear_kto_loss", "kto_losses", "kto_with"]
