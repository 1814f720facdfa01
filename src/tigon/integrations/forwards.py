"""Replacement ``forward`` functions built from a spec: norms, gated MLPs, and the scoped rotary dispatcher.

Each factory returns a plain function ``forward(self, ...)`` usable both as a class attribute (class-level patch) and
bound to one instance with :class:`types.MethodType` (instance-level patch). Every function carries the attribute
:data:`MARK` (``{"kind": ..., "family": ...}``) so the engine can recognise its own patches, and
``functools.wraps(original)`` so ``inspect.signature`` (used by Trainer and generate) still sees the original.

Ops are looked up on :mod:`tigon.functional` at call time, never bound at import.
"""

from __future__ import annotations

import functools
import threading

import torch

from .. import functional as TF
from .families import ACTIVATIONS, MLPSpec, NormSpec

MARK = "__tigon_patch__"


def mark(fn, kind: str, family: str):
    """Tag ``fn`` as a Tigon replacement of ``kind`` for ``family`` and return it."""
    setattr(fn, MARK, {"kind": kind, "family": family})
    return fn


def tigon_mark(fn) -> dict | None:
    """The MARK dict of a function or bound method, or None when it is not Tigon's."""
    return getattr(getattr(fn, "__func__", fn), MARK, None)


# ---- norms ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def norm_forward(spec: NormSpec, family: str, original):
    """``forward(self, x)`` running rms_norm / layer_norm with the instance's own weight (and bias) and epsilon."""
    if spec.kind == "rms_norm":

        @functools.wraps(original)
        def forward(self, hidden_states, *args, **kwargs):
            if args or kwargs:
                return original(self, hidden_states, *args, **kwargs)
            return TF.rms_norm(hidden_states, getattr(self, spec.weight_attr), getattr(self, spec.eps_attr),
                               spec.offset, spec.casting_mode)

    elif spec.kind == "layer_norm":

        @functools.wraps(original)
        def forward(self, hidden_states, *args, **kwargs):
            if args or kwargs:
                return original(self, hidden_states, *args, **kwargs)
            return TF.layer_norm(hidden_states, getattr(self, spec.weight_attr, None),
                                 getattr(self, spec.bias_attr, None), getattr(self, spec.eps_attr))

    else:
        raise ValueError(f"NormSpec.kind must be 'rms_norm' or 'layer_norm', got {spec.kind!r}")
    return mark(forward, spec.kind, family)


def norm_problem(module, spec: NormSpec) -> str | None:
    """Why ``module`` cannot take the Tigon norm forward, or None when it can."""
    w = getattr(module, spec.weight_attr, None)
    if spec.kind == "rms_norm" and not isinstance(w, torch.Tensor):
        return f"no tensor attribute {spec.weight_attr!r} (RMSNorm without weight is not supported)"
    if isinstance(w, torch.Tensor) and w.dim() != 1:
        return f"{spec.weight_attr} has shape {tuple(w.shape)}, expected 1-D"
    if not isinstance(getattr(module, spec.eps_attr, None), (int, float)):
        return f"no numeric epsilon attribute {spec.eps_attr!r}"
    return None


# ---- gated MLPs ----------------------------------------------------------------------------------------------
def mlp_activation(module, spec: MLPSpec) -> tuple[str, str | None] | str:
    """``(op, approximate)`` for the module's activation (see ACTIVATIONS), or a string saying why not."""
    config = getattr(module, "config", None)
    name = getattr(config, spec.act_config_attr, None) if config is not None else None
    if name is None:
        return f"cannot read config.{spec.act_config_attr} from the module"
    act = ACTIVATIONS.get(name)
    if act is None:
        return f"activation {name!r} (config.{spec.act_config_attr}) has no Tigon kernel; supported: " + \
            ", ".join(ACTIVATIONS)
    return act


@functools.lru_cache(maxsize=None)
def mlp_forward(spec: MLPSpec, family: str, original):
    """``forward(self, x) = down(op(gate(x), up(x)))`` with op = swiglu / geglu picked from the config.

    An activation without a kernel (checked per call, so class-level patches stay correct for any config) runs the
    original forward.
    """

    @functools.wraps(original)
    def forward(self, x, *args, **kwargs):
        act = mlp_activation(self, spec)
        if args or kwargs or isinstance(act, str):
            return original(self, x, *args, **kwargs)
        op, approximate = act
        gate, up = getattr(self, spec.gate)(x), getattr(self, spec.up)(x)
        h = TF.swiglu(gate, up) if op == "swiglu" else TF.geglu(gate, up, approximate=approximate)
        return getattr(self, spec.down)(h)

    return mark(forward, "mlp", family)


def mlp_problem(module, spec: MLPSpec) -> str | None:
    """Why ``module`` cannot take the Tigon MLP forward, or None when it can."""
    for attr in (spec.gate, spec.up, spec.down):
        if not callable(getattr(module, attr, None)):
            return f"no callable attribute {attr!r}"
    act = mlp_activation(module, spec)
    return act if isinstance(act, str) else None


def describe_mlp(module, spec: MLPSpec) -> str:
    op, approximate = mlp_activation(module, spec)
    name = f"tigon.functional.{op}" + (f"(approximate={approximate!r})" if op == "geglu" else "")
    return f"{spec.down}({name}({spec.gate}(x), {spec.up}(x)))"


# ---- rotary embedding ----------------------------------------------------------------------------------------
_scope = threading.local()


def _rope_scope_active() -> bool:
    return getattr(_scope, "depth", 0) > 0


def rope_dispatcher(original, family: str, switch):
    """A drop-in for the module-global rotary function that routes to :func:`tigon.functional.rope` when
    ``switch.class_level`` is set or a patched attention instance is running on this thread, else to ``original``.

    Calls it cannot serve (extra positional arguments such as the old ``position_ids``, partial rotary dims) go
    to ``original`` as well.
    """

    @functools.wraps(original)
    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        if (switch.class_level or _rope_scope_active()) and not args and set(kwargs) <= {"unsqueeze_dim"} \
                and cos.shape[-1] == q.shape[-1] == k.shape[-1]:
            return TF.rope(q, k, cos, sin, **kwargs)
        return original(q, k, cos, sin, *args, **kwargs)

    return mark(apply_rotary_pos_emb, "rope", family)


@functools.lru_cache(maxsize=None)
def attention_forward(family: str, original):
    """Instance forward for attention modules: ``original`` (the class's forward), run inside the rotary scope."""

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        _scope.depth = getattr(_scope, "depth", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _scope.depth -= 1

    return mark(forward, "rope", family)
