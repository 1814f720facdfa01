"""Replacement ``forward`` of non-gated MLPs whose forward is ``down(act(up(x)))``, declared by
:attr:`MLPSpec.act <tigon.integrations.families.MLPSpec>`: :func:`tigon.functional.act_linear`, the same result with
``act(h)`` recomputed in the backward instead of saved (:func:`act_linear_forward`); why a module cannot take it
(:func:`act_linear_problem`) and the report's description (:func:`describe_act_linear`). Gated MLPs:
:mod:`tigon.integrations.mlp_forwards`.
"""

from __future__ import annotations

import functools

from .. import functional as TF
from .child_calls import _META_PROBLEM, _hook_problem, _no_hooks, _outputs_private, fold_problem, under_checkpoint
from .families import MLPSpec
from .marks import mark
from .mlp_activations import nongated_activation
from .mlp_host_bound import describe_host_bound, host_bound


def act_linear_problem(module, spec: MLPSpec) -> str | None:
    """Why the non-gated MLP ``module`` (None: its class, at class level) cannot take :func:`act_linear_forward`, or
    None: its spec declares its activation module (:attr:`MLPSpec.act`), the activation has a kernel, and its down
    projection folds into the op (:func:`fold_problem`; on the meta device: once its weights are loaded)."""
    if spec.act is None:
        return (f"non-gated MLP {spec.down}(act({spec.up}(x))) without a declared activation module (MLPSpec.act): "
                "its forward is not known to be exactly that; left alone")
    if module is None:
        return None  # class level: each call checks its instance
    if not callable(getattr(module, spec.up, None)):
        return f"no callable attribute {spec.up!r}"
    act, why = nongated_activation(module, spec)
    if act is None:
        return why
    problem = fold_problem(getattr(module, spec.down, None), linear_cls=spec.linear_cls)
    if problem is not None and problem != _META_PROBLEM:
        return (f"{spec.down} cannot be folded into tigon.functional.act_linear ({problem}); a lone activation gains "
                "nothing, so the MLP is left alone")
    return None


@functools.lru_cache(maxsize=None)
def act_linear_forward(spec: MLPSpec, family: str, original):
    """``forward(self, x) = act_linear(up(x), down.weight, down.bias, activation=...)`` for a non-gated MLP whose
    forward is ``down(act(up(x)))``: the same result, with ``act(h)`` recomputed in the backward instead of saved
    (one (tokens, I) tensor less per layer; :func:`tigon.functional.act_linear`). The activation comes from the class of
    the module's activation module (:func:`nongated_activation`), read per call, as are the conditions under which the
    original forward runs instead: an activation without a kernel, a down projection that does not fold
    (:func:`fold_problem`: hooks, an instance-level forward, LoRA, quantised or DTensor weights), hooks on the
    activation module, a non-reentrant activation checkpoint (:func:`under_checkpoint`: nothing is saved there, and
    the fold would recompute the down projection for nothing) and, on a CUDA GPU, small calls (:func:`host_bound`).
    h is the up projection's own output, so the backward writes d_h into its memory (``inplace_backward``) unless
    the up projection has hooks (which could keep it)."""

    @functools.wraps(original)
    def forward(self, x, *args, **kwargs):
        act, _ = nongated_activation(self, spec)
        if args or kwargs or act is None or host_bound(self, spec, ("act_linear", None), x):
            return original(self, x, *args, **kwargs)
        up, down, act_fn = getattr(self, spec.up), getattr(self, spec.down), getattr(self, spec.act)
        plain = _no_hooks(up, down, act_fn)  # the usual case, in one call
        if ((not plain and _hook_problem(act_fn) is not None) or under_checkpoint()
                or fold_problem(down, hooks_checked=plain, linear_cls=spec.linear_cls) is not None):
            return original(self, x, *args, **kwargs)
        return TF.act_linear(up(x), down.weight, down.bias, activation=act,
                             inplace_backward=plain or _outputs_private(up))

    return mark(forward, "mlp", family)


def describe_act_linear(module, spec: MLPSpec) -> str:
    """What the patched non-gated MLP computes, for the report."""
    act = nongated_activation(module, spec)[0] if module is not None else None
    how = f"activation={act!r}" if act is not None else f"the activation named by the class of self.{spec.act}"
    return (f"tigon.functional.act_linear({spec.up}(x), {spec.down}.weight, {spec.down}.bias, {how}): "
            f"{spec.down}(act({spec.up}(x))) with act(h) recomputed in the backward, not stored; checked again at "
            f"every call: hooks or an instance-level forward added later, a {spec.down} that no longer folds, or a "
            "non-reentrant activation checkpoint make it run the original forward"
            + describe_host_bound(module, spec, "act_linear"))
