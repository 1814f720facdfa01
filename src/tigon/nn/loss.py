"""Loss modules wrapping :func:`tigon.functional.cross_entropy` and
:func:`tigon.functional.fused_linear_cross_entropy`."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as TF
from .._checks import ALIAS, UNSET, liger_names
from ..support import replaced


def _flatten(x: torch.Tensor, target: torch.Tensor, what: str):
    """(..., D) and (...) -> (N, D) and (N,), plus the leading shape to restore per-token outputs."""
    if x.dim() == 2 and target.dim() == 1:
        return x, target, None
    if x.dim() < 1 or tuple(target.shape) != tuple(x.shape[:-1]):
        raise ValueError(f"target must have the leading shape of {what} {tuple(x.shape[:-1])}, "
                         f"got {tuple(target.shape)}")
    return x.reshape(-1, x.shape[-1]), target.reshape(-1), tuple(target.shape)


def _liger_alias(name: str) -> property:
    """A property under Liger-Kernel's name of the module attribute ``name`` (read and set through it), as Liger's
    loss modules store ``ce_weight`` and ``return_token_accuracy``."""
    return property(lambda self: getattr(self, name), lambda self, value: setattr(self, name, value),
                    doc=f"Liger-Kernel's name of :attr:`{name}` (read and set).")


def _restore(out, lead, reduction: str):
    """The per-token outputs (the losses, z-losses and hits of ``"none"``, the predicted tokens) in target's shape
    ``lead``."""
    if lead is None:
        return out
    if isinstance(out, TF.LossOutput):
        if reduction == "none":
            out = replaced(out, loss=out.loss.reshape(lead),
                           z_loss=None if out.z_loss is None else out.z_loss.reshape(lead),
                           accuracy=None if out.accuracy is None else out.accuracy.reshape(lead))
        if out.predicted_tokens is not None:
            out = replaced(out, predicted_tokens=out.predicted_tokens.reshape(lead))
        return out
    return out.reshape(lead) if reduction == "none" else out


class CrossEntropyLoss(nn.Module):
    """``torch.nn.CrossEntropyLoss`` on (..., V) logits, computed by :func:`tigon.functional.cross_entropy`.

    Layout: the class dimension is the LAST one (language-model logits (batch, seq, V)), not torch's dim 1
    ((N, C, d1, ...)). For 2-D (N, V) input the two agree; for more dimensions move the class axis last first.

    Constructor arguments in Liger-Kernel's ``LigerCrossEntropyLoss`` positional order (weight, ignore_index,
    lse_square_scale, label_smoothing, reduction, softcap, return_z_loss, return_token_accuracy,
    return_predicted_tokens); Tigon's own options are keyword-only.

    Args:
        weight: optional (V,) class weights (a buffer, as in torch).
        ignore_index, reduction (``"mean"`` | ``"sum"`` | ``"none"``), label_smoothing: torch semantics.
        lse_square_scale: z-loss coefficient (adds ``lse_square_scale * logsumexp**2`` per token).
        softcap: when set, logits become ``softcap * tanh(logits / softcap)`` first (Gemma 2).
        return_z_loss, return_accuracy: return a :class:`tigon.functional.LossOutput` with those extras.
        inplace_backward: let the kernel write the logits' gradient into the logits' storage (saves memory; the
            logits must not be used after the backward).
        grad_in_forward: None (default): in training mode the forward forms that gradient into a buffer of its
            own (one read of the logits less; the logits are left alone); True: formed over the logits (no extra
            buffer; the logits must not be used after the forward; scalar reductions, no float16); False: the
            backward forms it. In evaluation mode (``not self.training``) the backward forms it whatever the
            setting. See :func:`tigon.functional.cross_entropy`.
        return_predicted_tokens: also return each token's argmax class in the LossOutput (int64 in target's shape,
            -1 where ignored; Liger-Kernel's option of the same name).
        return_token_accuracy: Liger-Kernel's name of ``return_accuracy``.

    Forward:
        ``loss(input, target, num_items_in_batch=None)`` (Liger's keyword name ``_input`` is taken for input):
        input (N, V) or (..., V) float32 / bfloat16 / float16
        logits; target (N,) or (...) integer class indices with input's leading shape. With
        ``num_items_in_batch`` the loss is the sum divided by it (HF gradient accumulation). Returns a float32
        scalar (``"none"``: per-token losses in target's shape), or a LossOutput.

    Raises:
        TypeError: at construction, lse_square_scale is a string (a call in Tigon's former positional order, which
            had reduction third), or both names of one option are given.
        ValueError: target's shape does not match input's leading dimensions, or invalid options (from the
            functional op).
    """

    def __init__(self, weight: torch.Tensor | None = None, ignore_index: int = -100, lse_square_scale: float = 0.0,
                 label_smoothing: float = 0.0, reduction: str = "mean", softcap: float | None = None,
                 return_z_loss: bool = False, return_token_accuracy: bool = False,
                 return_predicted_tokens: bool = False, *, return_accuracy: bool = False,
                 inplace_backward: bool = False, grad_in_forward: bool | None = None):
        super().__init__()
        from ..ops.cross_entropy import liger_aliases

        if isinstance(lse_square_scale, str):
            raise TypeError(f"lse_square_scale must be a number, got str {lse_square_scale!r}: the third positional "
                            "argument is lse_square_scale (Liger-Kernel's order), reduction is the fifth; pass "
                            "reduction by keyword")
        _, return_accuracy = liger_aliases(None, None, return_accuracy, return_token_accuracy)
        self.register_buffer("weight", weight)
        self.return_predicted_tokens = return_predicted_tokens
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.return_z_loss = return_z_loss
        self.return_accuracy = return_accuracy
        self.inplace_backward = inplace_backward
        self.grad_in_forward = grad_in_forward

    def forward(self, input: torch.Tensor = UNSET, target: torch.Tensor = UNSET,
                num_items_in_batch: int | torch.Tensor | None = None, *, _input: torch.Tensor = ALIAS):
        if input is UNSET or target is UNSET or _input is not ALIAS:  # (Liger's keyword name: _input)
            input, target = liger_names("CrossEntropyLoss.forward", ("input", input, "_input", _input),
                                        ("target", target, None, ALIAS))
        logits, tgt, lead = _flatten(input, target, "input")
        out = TF.cross_entropy(
            logits, tgt, self.weight, ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing, lse_square_scale=self.lse_square_scale, softcap=self.softcap,
            num_items_in_batch=num_items_in_batch,
            return_z_loss=self.return_z_loss, return_accuracy=self.return_accuracy,
            inplace_backward=self.inplace_backward, grad_in_forward=self.grad_in_forward if self.training else False,
            return_predicted_tokens=self.return_predicted_tokens,
        )
        return _restore(out, lead, self.reduction)

    return_token_accuracy = _liger_alias("return_accuracy")

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, lse_square_scale={self.lse_square_scale}, "
                f"softcap={self.softcap}")


class FusedLinearCrossEntropyLoss(nn.Module):
    """Cross-entropy of ``logit_scale * (hidden @ weight.T + bias)`` without materialising the logits.

    Wraps :func:`tigon.functional.fused_linear_cross_entropy`: the LM head and the loss in one op, memory
    O(chunk * V) instead of O(N * V). The module holds only the options; the LM-head weight is an argument, so a
    weight tied to the embedding just works.

    Constructor arguments in Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss`` positional order (ce_weight,
    ignore_index, lse_square_scale, label_smoothing, reduction, softcap, return_z_loss, accum_dtype,
    use_token_scaling, return_token_accuracy, return_predicted_tokens); Tigon's own options are keyword-only.

    Args:
        ignore_index, reduction (``"mean"`` | ``"sum"`` | ``"none"``), label_smoothing: torch semantics.
        lse_square_scale: z-loss coefficient. softcap: ``softcap * tanh(logits / softcap)`` before the loss.
        logit_scale: multiplies the logits before softcap and loss (Cohere ``logit_scale``, Granite
            ``1 / logits_scaling``).
        class_weight: optional (V,) class weights (a buffer).
        return_z_loss, return_accuracy: return a :class:`tigon.functional.LossOutput` with those extras.
        accum_dtype: None / torch.float32 (exact grad_weight accumulation) or the weight's dtype (low memory, one
            rounding per token chunk); see :func:`tigon.functional.fused_linear_cross_entropy`.
        return_predicted_tokens: also return each token's argmax class in the LossOutput (int64 in target's shape,
            -1 where ignored; Liger-Kernel's option of the same name).
        use_token_scaling: each token's loss times its target's detached probability (Liger-Kernel's option; see
            :func:`tigon.functional.fused_linear_cross_entropy`).
        ce_weight, return_token_accuracy: Liger-Kernel's names of ``class_weight`` and ``return_accuracy``.

    Unlike Liger-Kernel's ``LigerFusedLinearCrossEntropyLoss.forward(lin_weight, _input, target, bias)`` the forward
    takes hidden first; Liger's keyword names ``lin_weight`` and ``_input`` are taken, so a keyword call in Liger's
    names works as there. A call in Liger's order raises, naming it: where target's length is not V (the shapes
    disagree), and where N == V when the head's weight is an ``nn.Parameter`` (``lm_head.weight``) and hidden is not.

    Forward:
        ``loss(hidden, weight, target, bias=None, *, num_items_in_batch=None)``: hidden (N, H) or (..., H) float
        activations; weight (V, H) and bias (V,) in hidden's dtype; target (N,) or (...) integer ids with
        hidden's leading shape. Returns a float32 scalar (``"none"``: per-token losses in target's shape), or a
        LossOutput. Gradients flow to hidden, weight and bias.

    Raises:
        TypeError: at construction, ce_weight is neither None nor a tensor (a call in Tigon's former positional
            order, which began with ignore_index), or both names of one option are given.
        TypeError: hidden is an ``nn.Parameter`` and weight is not (Liger's argument order).
        ValueError: target's shape does not match hidden's leading dimensions, or invalid options (from the
            functional op).
    """

    def __init__(self, ce_weight: torch.Tensor | None = None, ignore_index: int = -100,
                 lse_square_scale: float = 0.0, label_smoothing: float = 0.0, reduction: str = "mean",
                 softcap: float | None = None, return_z_loss: bool = False, accum_dtype: torch.dtype | None = None,
                 use_token_scaling: bool = False, return_token_accuracy: bool = False,
                 return_predicted_tokens: bool = False, *, logit_scale: float = 1.0,
                 class_weight: torch.Tensor | None = None, return_accuracy: bool = False):
        super().__init__()
        from ..ops.cross_entropy import liger_aliases

        if ce_weight is not None and not isinstance(ce_weight, torch.Tensor):
            raise TypeError(f"ce_weight must be None or a (V,) tensor, got {type(ce_weight).__name__} {ce_weight!r}: "
                            "the first positional argument is ce_weight (Liger-Kernel's order), ignore_index the "
                            "second; pass ignore_index by keyword")
        class_weight, return_accuracy = liger_aliases(class_weight, ce_weight, return_accuracy, return_token_accuracy)
        self.use_token_scaling = use_token_scaling
        self.register_buffer("class_weight", class_weight)
        self.accum_dtype = accum_dtype
        self.return_predicted_tokens = return_predicted_tokens
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.lse_square_scale = lse_square_scale
        self.softcap = softcap
        self.logit_scale = logit_scale
        self.return_z_loss = return_z_loss
        self.return_accuracy = return_accuracy

    def forward(self, hidden: torch.Tensor = UNSET, weight: torch.Tensor = UNSET, target: torch.Tensor = UNSET,
                bias: torch.Tensor | None = None, *, num_items_in_batch: int | torch.Tensor | None = None,
                _input: torch.Tensor = ALIAS, lin_weight: torch.Tensor = ALIAS):
        if (hidden is UNSET or weight is UNSET or target is UNSET or _input is not ALIAS
                or lin_weight is not ALIAS):  # (Liger's keyword names: a keyword call in any order)
            hidden, weight, target = liger_names(
                "FusedLinearCrossEntropyLoss.forward", ("hidden", hidden, "_input", _input),
                ("weight", weight, "lin_weight", lin_weight), ("target", target, None, ALIAS))
        if isinstance(hidden, nn.Parameter) and not isinstance(weight, nn.Parameter):
            raise TypeError("hidden is an nn.Parameter and weight is not: arguments in Liger-Kernel's order? "
                            "LigerFusedLinearCrossEntropyLoss takes (lin_weight, _input, target); Tigon's takes "
                            "(hidden, weight, target)")
        h, tgt, lead = _flatten(hidden, target, "hidden")
        out = TF.fused_linear_cross_entropy(
            h, weight, tgt, bias, ignore_index=self.ignore_index, reduction=self.reduction,
            label_smoothing=self.label_smoothing, lse_square_scale=self.lse_square_scale, softcap=self.softcap,
            logit_scale=self.logit_scale, class_weight=self.class_weight, num_items_in_batch=num_items_in_batch,
            return_z_loss=self.return_z_loss, return_accuracy=self.return_accuracy, accum_dtype=self.accum_dtype,
            return_predicted_tokens=self.return_predicted_tokens, use_token_scaling=self.use_token_scaling,
        )
        return _restore(out, lead, self.reduction)

    ce_weight = _liger_alias("class_weight")
    return_token_accuracy = _liger_alias("return_accuracy")

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, lse_square_scale={self.lse_square_scale}, "
                f"softcap={self.softcap}, logit_scale={self.logit_scale}"
                + (f", accum_dtype={self.accum_dtype}" if self.accum_dtype is not None else ""))
