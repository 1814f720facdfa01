"""Losses whose LM-head gradients are formed in the forward, eager and under ``torch.compile``: :func:`run_formed`.

The post-training losses (the GRPO family, :mod:`tigon.ops.fused_linear_grpo`; the preference losses,
:mod:`tigon.ops.preference_formed`) form the head's gradients chunk by chunk in their forward (3 head matmuls per
chunk: logits, grad_hidden, grad_weight; :func:`tigon.kernels.fused_linear_logprobs.logprobs_grads_in_forward`) and
the backward only scales them by the upstream gradient. Each loss registers its pass as a *family*
(:func:`family`): ``run(options, tensors, hidden, weight, bias, plan, halves) -> ((logp, entropy or None, ref_logp or
None), (gh, gw, gb))`` with ``options`` a dict of Python scalars (the loss's options), ``tensors`` a list of optional
tensors (its other inputs, no gradient), ``plan`` a :class:`tigon.ops.fused_linear_logprobs.LogProbPlan`.

* Eager: :class:`tigon.kernels.fused_linear_logprobs.FormedGradsFunction` runs the family (``halves`` on: a 2-byte
  weight's fp32 grad_weight cast in place) and carries the gradients to the leaves.
* Under ``torch.compile``: the same family runs inside the ``tigon::formed_head_grads`` custom op, which returns the
  per-token log-probabilities and the unscaled gradients as tensors (the compiled graph saves them for its backward
  like any activation, as ``tigon::fused_linear_cross_entropy`` does); its autograd formula scales them by the
  upstream (:func:`tigon.kernels.head_grads.scale_grads`, out of place, in the ``tigon::formed_head_grads_backward``
  custom op, which runs once per forward: a second backward through a retained graph raises, as eager; the forward's
  token that says so is a CPU tensor, so no device synchronisation, but ``mode="reduce-overhead"`` skips CUDA graphs
  for a graph holding it). The options travel as one string
  (:func:`encode`: dynamo folds it to a constant, the op's schema takes no dict), the family's name as another.
  Dynamo traces the rest of the loss (its value and metrics from the log-probabilities) as plain PyTorch.

The family's pass differentiates the loss's formula with autograd chunk by chunk; a custom op's implementation runs
below the autograd dispatch keys, so :func:`_autograd_inside` turns them back on around it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from typing import Optional

import torch
from torch import Tensor

from ..kernels._common import CUSTOM_OP_TAGS, or_empty

FAMILIES: dict = {}
"""Family name -> its pass (see the module docstring)."""


def family(name: str):
    """Register the decorated function as the pass of the formed-gradient family ``name``."""
    def register(fn):
        FAMILIES[name] = fn
        return fn
    return register


# ---- the options as a string (the custom op's schema has no dict; dynamo folds this to a constant) ----------------
_SEPARATORS = (";", "=", ",")


def _enc(v) -> str:
    if v is None:
        return "n"
    if isinstance(v, bool):
        return "b1" if v else "b0"
    if isinstance(v, int):
        return f"i{v}"
    if isinstance(v, float):
        return f"f{v}"  # (str of a float is its shortest round-tripping repr)
    if isinstance(v, str):
        for c in _SEPARATORS:
            if c in v:
                raise ValueError(f"tigon: an option string may not contain {c!r} under torch.compile, got {v!r}")
        return f"s{v}"
    if isinstance(v, (list, tuple)):
        return "l" + ",".join([_enc(x) for x in v])
    raise TypeError(f"tigon: an option of a formed-gradient loss must be None, a bool, int, float, str or a list of "
                    f"them under torch.compile, got {type(v).__name__}")


def encode(options: dict) -> str:
    """``options`` (name -> None, bool, int, float, str, or a flat list / tuple of these) as one string, for the
    custom op; :func:`decode` inverts it (lists come back as lists)."""
    return ";".join([f"{k}={_enc(v)}" for k, v in options.items()])


def _dec(s: str):
    tag, body = s[0], s[1:]
    if tag == "l":
        return [_dec(x) for x in body.split(",")] if body else []
    return {"n": lambda b: None, "b": lambda b: b == "1", "i": int, "f": float, "s": str}[tag](body)


@functools.lru_cache(maxsize=256)
def _decoded(spec: str) -> tuple:
    return tuple((k, _dec(v)) for k, v in (item.split("=", 1) for item in spec.split(";") if item))


def decode(spec: str) -> dict:
    """The options dict of :func:`encode`'s string."""
    return dict(_decoded(spec))


# ---- the two paths -------------------------------------------------------------------------------------------------
def run_formed(name: str, options: dict, hidden, weight, bias, tensors: list, plan, want_entropy: bool = False,
               want_ref: bool = False):
    """Run the family ``name`` on (hidden (N, H), weight (V, H), bias (V,) or None), its ``options`` and ``tensors``
    with the log-probabilities' ``plan``: ``(anchor, logp (N,), entropy (N,) or None, ref_logp (N,) or None)``, all
    fp32; ``anchor`` a 0-d zero that carries the formed gradients (a loss computed from the outputs without autograd,
    plus the anchor, has them times its upstream scalar; a second backward through it raises), the others detached.
    ``want_entropy`` / ``want_ref``: the family returns an entropy / a reference model's log-probabilities."""
    if torch.compiler.is_compiling():
        o = plan.opts
        anchor, logp, ent, ref_lp, *_ = _formed_op(name, encode(options), hidden, weight, bias, list(tensors),
                                                    o.ignore_index, o.softcap, o.logit_scale, plan.cd, *plan.need,
                                                    plan.lean, plan.budget, want_entropy, want_ref)
        return anchor, logp, ent if want_entropy else None, ref_lp if want_ref else None
    from ..kernels.fused_linear_logprobs import FormedGradsFunction

    def run():
        (logp, ent, ref_lp), grads = FAMILIES[name](options, tensors, hidden, weight, bias, plan, True)
        return (logp, or_empty(ent, logp), or_empty(ref_lp, logp)), grads

    anchor, logp, ent, ref_lp = FormedGradsFunction.apply(hidden, weight, bias, run)
    return anchor, logp, ent if want_entropy else None, ref_lp if want_ref else None


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
    from ..kernels.loss_rows import LossOptions
    from .fused_linear_logprobs import LogProbPlan

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
    :func:`tigon.kernels.head_grads.grad_buffers`' scalar path ((0,) where not needed), and the call's 0-d int64 CPU
    token (:func:`_new_token`: its backward runs once)."""
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
    from ..kernels.head_grads import grad_buffers

    n = hidden.shape[0]
    f32 = dict(dtype=torch.float32)
    empty = hidden.new_empty((0,), **f32)
    # the real allocator on fake tensors: the same shapes and dtypes as the kernels' path, by construction
    grads = [or_empty(g, empty) for g in grad_buffers(n, hidden, weight, cd, (need_hidden, need_weight, need_bias),
                                                      lean, True)]
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
    from ..kernels.head_grads import scale_grads

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
