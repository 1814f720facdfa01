"""Replacement ``forward`` functions of norms built from a :class:`~tigon.integrations.families.NormSpec`:
:func:`tigon.functional.rms_norm`, :func:`~tigon.functional.rms_norm_gated` and :func:`~tigon.functional.layer_norm`
on the instance's own weight (and bias) and epsilon (:func:`norm_forward`), and why a module cannot take them
(:func:`norm_problem`).

The forwards are marked as every Tigon replacement is (:mod:`tigon.integrations.marks`); ops are looked up on
:mod:`tigon.functional` at call time, never bound at import. The MLPs' forwards: :mod:`tigon.integrations.mlp_forwards`
and :mod:`tigon.integrations.act_linear_forwards`; the rotary and attention ones:
:mod:`tigon.integrations.rotary_forwards`.
"""

from __future__ import annotations

import functools

import torch

from .. import functional as TF
from .families import NormSpec
from .marks import mark


@functools.lru_cache(maxsize=None)
def norm_forward(spec: NormSpec, family: str, original):
    """``forward(self, x)`` running rms_norm / layer_norm with the instance's own weight (and bias) and epsilon;
    ``forward(self, x, gate)`` running rms_norm_gated for a gated norm (``spec.gated``; no gate: the original; the
    instance's groups of statistics and gate order, :func:`gated_options`)."""
    eps_attr = spec.eps_attr if isinstance(spec.eps_attr, str) else None  # (one name: read inline)
    if spec.kind == "rms_norm" and spec.gated:

        @functools.wraps(original)
        def forward(self, hidden_states, gate=None, *args, **kwargs):
            if gate is None or args or kwargs:
                return original(self, hidden_states, gate, *args, **kwargs)
            n_groups, before = gated_options(self, spec)
            return TF.rms_norm_gated(hidden_states, gate, getattr(self, spec.weight_attr), norm_eps(self, spec),
                                     spec.offset, spec.casting_mode,
                                     hidden_states.shape[-1] // n_groups if n_groups != 1 else None, before)

    elif spec.kind == "rms_norm":

        @functools.wraps(original)
        def forward(self, hidden_states, *args, **kwargs):
            if args or kwargs:
                return original(self, hidden_states, *args, **kwargs)
            weight = self.__dict__["_parameters"].get(spec.weight_attr)  # (past nn.Module.__getattr__: one frame less)
            if weight is None and not spec.optional_weight:
                weight = getattr(self, spec.weight_attr)
            elif weight is None:
                weight = getattr(self, spec.weight_attr, None)
            eps = getattr(self, eps_attr, None) if eps_attr is not None else norm_eps(self, spec)  # (norm_eps inline)
            return TF.rms_norm(hidden_states, weight, eps, spec.offset, spec.casting_mode)

    elif spec.kind == "layer_norm":

        @functools.wraps(original)
        def forward(self, hidden_states, *args, **kwargs):
            if args or kwargs:
                return original(self, hidden_states, *args, **kwargs)
            weight = getattr(self, spec.weight_attr, None)
            if spec.offset and weight is not None:
                weight = weight + spec.offset  # Nemotron's LayerNorm1P: (1 + w), a (hidden,) add
            return TF.layer_norm(hidden_states, weight, getattr(self, spec.bias_attr, None),
                                 norm_eps(self, spec))

    else:
        raise ValueError(f"NormSpec.kind must be 'rms_norm' or 'layer_norm', got {spec.kind!r}")
    return mark(forward, spec.kind, family)


def norm_eps(module, spec: NormSpec):
    """The module's epsilon: its attribute ``spec.eps_attr``, or of a tuple of names the first it has (None if none)."""
    if isinstance(spec.eps_attr, str):
        return getattr(module, spec.eps_attr, None)
    return next((v for v in (getattr(module, n, None) for n in spec.eps_attr) if v is not None), None)


def gated_options(module, spec: NormSpec) -> tuple:
    """(n_groups, norm_before_gate) of a gated norm instance: its ``n_groups`` (Falcon-H1's), or its width over its
    ``group_size`` (Mamba-2's copies), else 1; its ``norm_before_gate``, else the spec's. Unchecked values
    (:func:`norm_problem` checks them)."""
    n_groups = getattr(module, "n_groups", None)
    if n_groups is None:
        size, w = getattr(module, "group_size", None), getattr(module, spec.weight_attr, None)
        if size is None:
            n_groups = 1
        elif (isinstance(size, int) and size > 0 and isinstance(w, torch.Tensor) and w.dim() == 1
              and w.shape[0] % size == 0):
            n_groups = w.shape[0] // size
        else:
            n_groups = f"group_size={size!r}"  # not an int: norm_problem says why
    return n_groups, getattr(module, "norm_before_gate", spec.norm_before_gate)


def norm_problem(module, spec: NormSpec) -> str | None:
    """Why ``module`` cannot take the Tigon norm forward, or None when it can."""
    w = getattr(module, spec.weight_attr, None)
    if spec.kind == "rms_norm" and not isinstance(w, torch.Tensor) and not (spec.optional_weight and w is None):
        return f"no tensor attribute {spec.weight_attr!r} (RMSNorm without weight is not supported)"
    if isinstance(w, torch.Tensor) and w.dim() != 1:
        return f"{spec.weight_attr} has shape {tuple(w.shape)}, expected 1-D"
    if not isinstance(norm_eps(module, spec), (int, float)):
        return f"no numeric epsilon attribute {spec.eps_attr!r}"
    n_groups, before = gated_options(module, spec) if spec.gated else (1, True)
    if not isinstance(n_groups, int) or n_groups < 1 or (isinstance(w, torch.Tensor) and w.shape[0] % n_groups):
        return (f"grouped gated RMSNorm: its groups (n_groups / group_size: {n_groups}) do not split its width "
                f"{tuple(w.shape) if isinstance(w, torch.Tensor) else w}")
    if not isinstance(before, bool):
        return f"norm_before_gate={before!r} is not a bool"
    return None
