"""The ``tigon::formed_head_grads`` custom op: the post-training losses' chunk loops with the LM head's gradients
formed in the forward, inside ``torch.compile`` (:mod:`tigon.ops.formed_grads` says what a family is and when this
runs; eager calls run the same families through
:class:`tigon.kernels.fused_linear_logprobs.FormedGradsFunction`).

The forward returns the per-token log-probabilities and the unscaled gradients as tensors (the compiled graph saves
them for its backward like any activation, as ``tigon::fused_linear_cross_entropy`` does), and a CPU token; the
backward, ``tigon::formed_head_grads_backward``, scales them by the upstream gradient
(:func:`tigon.kernels.head_grads.scale_grads`, out of place: its inputs are saved outputs) once per forward: a second
backward through a retained graph raises, as eager. The token is read on the host, so no device synchronisation,
but ``mode="reduce-overhead"`` skips CUDA graphs for a graph holding a CPU tensor.

The families differentiate the loss's formula with autograd chunk by chunk; a custom op's implementation runs below
the autograd dispatch keys, so :func:`_autograd_inside` turns them back on around it.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Optional

import torch
from torch import Tensor

from ._common import CUSTOM_OP_TAGS, or_empty
from .head_grads import grad_buffers, scale_grads
from .loss_rows import LossOptions


@contextlib.contextmanager
def _autograd_inside():
    """Autograd on inside a custom op's implementation (which runs below the autograd dispatch keys, with grad mode
    off): the families differentiate their formula chunk by chunk there. The keys' exclusion is restored after."""
    k = torch._C.DispatchKey
    keys = (k.AutogradFunctionality, k.AutogradOther, k.AutogradNestedTensor, k.ADInplaceOrView)
    was = [torch._C._dispatch_tls_is_dispatch_key_excluded(key) for key in keys]
    for key in keys:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        with torch.enable_grad():
            yield
    finally:
        for key, excluded in zip(keys, was):
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, excluded)


def _plan(ignore_index, softcap, logit_scale, cd, need, lean, budget):
    from ..ops.fused_linear_logprobs import LogProbPlan

    return LogProbPlan(LossOptions(ignore_index, 0.0, 0.0, softcap, logit_scale), cd, need, lean, budget)


@torch.library.custom_op("tigon::formed_head_grads", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _formed_op(family_name: str, spec: str, hidden: Tensor, weight: Tensor, bias: Optional[Tensor],
               tensors: list[Optional[Tensor]], ignore_index: int, softcap: Optional[float], logit_scale: float,
               cd: torch.dtype, need_hidden: bool, need_weight: bool, need_bias: bool, lean: bool, budget: int,
               want_entropy: bool, want_ref: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                                            Tensor]:
    """(anchor, logp, entropy, ref_logp, grad_hidden, grad_weight, grad_bias, token): the 0-d fp32 zero, (N,) fp32
    log-probabilities, (N,) fp32 entropies (or (0,) unless ``want_entropy``), (N,) fp32 reference log-probabilities
    (or (0,) unless ``want_ref``), the family's gradients for an upstream gradient of 1 in the dtypes of
    :func:`tigon.kernels.head_grads.grad_buffers`' scalar path of the formed passes (``formed``: a bfloat16
    grad_hidden for bfloat16 hidden states and matmuls; (0,) where not needed), and the call's 0-d int64 CPU
    token (:func:`_new_token`: its backward runs once)."""
    from ..ops.formed_grads import FAMILIES, decode

    plan = _plan(ignore_index, softcap, logit_scale, cd, (need_hidden, need_weight, need_bias), lean, budget)
    def plain(t):  # (the inputs may require a gradient: with autograd back on, the kernels' out= matmuls refuse)
        return None if t is None else t.detach()

    with _autograd_inside():
        (logp, ent, ref_lp), grads = FAMILIES[family_name](decode(spec), [plain(t) for t in tensors], plain(hidden),
                                                           plain(weight), plain(bias), plan, False)
    gh, gw, gb = (or_empty(g, logp) for g in grads)
    return (logp.new_zeros(()), logp, or_empty(ent, logp), or_empty(ref_lp, logp), gh, gw, gb, _new_token())


@_formed_op.register_fake
def _(family_name, spec, hidden, weight, bias, tensors, ignore_index, softcap, logit_scale, cd, need_hidden,
      need_weight, need_bias, lean, budget, want_entropy, want_ref):
    n = hidden.shape[0]
    f32 = dict(dtype=torch.float32)
    empty = hidden.new_empty((0,), **f32)
    # the real allocator on fake tensors: the same shapes and dtypes as the kernels' path, by construction
    grads = [or_empty(g, empty) for g in grad_buffers(n, hidden, weight, cd, (need_hidden, need_weight, need_bias),
                                                      lean, True, formed=True)]
    return (hidden.new_empty((), **f32), hidden.new_empty((n,), **f32),
            hidden.new_empty((n,) if want_entropy else (0,), **f32),
            hidden.new_empty((n,) if want_ref else (0,), **f32), *grads, torch.empty((), dtype=torch.int64))


def _formed_setup(ctx, inputs, output):
    hidden, weight, bias = inputs[2:5]
    ctx.need = tuple(inputs[10:13])
    ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
    ctx.save_for_backward(*output[4:8])


def _formed_grad(ctx, grad_anchor, *_unused):
    nones = (None,) * 12
    if grad_anchor is None or not any(ctx.need):
        return (None,) * 5 + nones
    gh, gw, gb, token = ctx.saved_tensors
    outs = _scale_formed(gh, gw, gb, grad_anchor, token, *ctx.need, *ctx.dtypes)
    return (None, None, *(t if wanted else None for t, wanted in zip(outs, ctx.need))) + nones


_formed_op.register_autograd(_formed_grad, setup_context=_formed_setup)


# ---- the backward: once per forward ----------------------------------------------------------------------------------
_LIVE: set = set()
"""The tokens of the custom op's calls whose backward has not run (each removed when its token tensor is freed)."""
_COUNTER = itertools.count()


def _new_token() -> Tensor:
    """A fresh 0-d int64 CPU tensor, its value registered in :data:`_LIVE` while the tensor lives."""
    value = next(_COUNTER)
    _LIVE.add(value)
    token = torch.tensor(value, dtype=torch.int64)
    weakref.finalize(token, _LIVE.discard, value)
    return token


@torch.library.custom_op("tigon::formed_head_grads_backward", mutates_args=(), tags=CUSTOM_OP_TAGS)
def _scale_formed(grad_hidden: Tensor, grad_weight: Tensor, grad_bias: Tensor, grad_loss: Tensor, token: Tensor,
                  need_hidden: bool, need_weight: bool, need_bias: bool, hidden_dtype: torch.dtype,
                  weight_dtype: torch.dtype, bias_dtype: Optional[torch.dtype]) -> tuple[Tensor, Tensor, Tensor]:
    """The formed gradients times the upstream 0-d ``grad_loss``, cast to the inputs' dtypes
    (:func:`tigon.kernels.head_grads.scale_grads`, out of place: the inputs are the forward's saved outputs); (0,)
    where not needed. Raises RuntimeError when the forward's ``token`` was already used (a second backward through
    the same graph: as eager, whose :class:`~tigon.kernels.fused_linear_logprobs.FormedGradsFunction` releases its
    gradients). The token is a CPU tensor: no device synchronisation."""
    value = int(token.item())
    if value not in _LIVE:
        raise RuntimeError("tigon: this loss forms its gradients in the forward and scales them in the backward: "
                           "a second backward through the same graph is not possible")
    _LIVE.discard(value)
    need = (need_hidden, need_weight, need_bias)
    grads = [t if wanted else None for t, wanted in zip((grad_hidden, grad_weight, grad_bias), need)]
    outs = scale_grads(grads, grad_loss, (hidden_dtype, weight_dtype, bias_dtype), inplace=False)
    return tuple(or_empty(t, grad_loss) for t in outs)


@_scale_formed.register_fake
def _(grad_hidden, grad_weight, grad_bias, grad_loss, token, need_hidden, need_weight, need_bias, hidden_dtype,
      weight_dtype, bias_dtype):
    def like(t, wanted, dtype):
        return t.new_empty(t.shape, dtype=dtype) if wanted else grad_loss.new_empty((0,))

    return (like(grad_hidden, need_hidden, hidden_dtype), like(grad_weight, need_weight, weight_dtype),
            like(grad_bias, need_bias, bias_dtype))


def compiled_formed(name: str, spec: str, hidden, weight, bias, tensors: list, plan, want_entropy: bool,
                    want_ref: bool):
    """:func:`tigon.ops.formed_grads.run_formed` as the ``tigon::formed_head_grads`` custom op (``spec``: the
    options, :func:`tigon.ops.formed_grads.encode`): ``(anchor, logp, entropy or None, ref_logp or None)``."""
    o = plan.opts
    anchor, logp, ent, ref_lp, *_ = _formed_op(name, spec, hidden, weight, bias, tensors, o.ignore_index, o.softcap,
                                                o.logit_scale, plan.cd, *plan.need, plan.lean, plan.budget,
                                                want_entropy, want_ref)
    return anchor, logp, ent if want_entropy else None, ref_lp if want_ref else None
