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
* Under ``torch.compile``: the same family runs inside the ``tigon::formed_head_grads`` custom op
  (:mod:`tigon.kernels.formed_grads`: the log-probabilities and the unscaled gradients as its outputs, its backward
  scales them once; a second backward through a retained graph raises, as eager). The options travel as one string
  (:func:`encode`: dynamo folds it to a constant, the op's schema takes no dict), the family's name as another.
  Dynamo traces the rest of the loss (its value and metrics from the log-probabilities) as plain PyTorch.

This module imports no Triton (as every op module); the kernels module is imported on the first compiled call.
"""

from __future__ import annotations

import functools

import torch

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
        return f"i{int(v)}"  # (int(): a symbolic int under dynamic shapes, specialised as a float is below)
    if isinstance(v, float):
        # (str of a float is its shortest round-tripping repr). float(): under torch.compile(dynamic=True) a Python
        # float option is a symbolic float, which a format string cannot take (a graph break); float() specialises it
        # (a guard on its value: a new beta recompiles, as with static shapes)
        return f"f{float(v)}"
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
        from ..kernels import formed_grads as k

        return k.compiled_formed(name, encode(options), hidden, weight, bias, list(tensors), plan, want_entropy,
                                 want_ref)
    from ..kernels.fused_linear_logprobs import FormedGradsFunction

    def run():
        (logp, ent, ref_lp), grads = FAMILIES[name](options, tensors, hidden, weight, bias, plan, True)
        empty = logp.new_empty((0,))
        return (logp, empty if ent is None else ent, empty if ref_lp is None else ref_lp), grads

    anchor, logp, ent, ref_lp = FormedGradsFunction.apply(hidden, weight, bias, run)
    return anchor, logp, ent if want_entropy else None, ref_lp if want_ref else None
