"""Which Tigon activation a patched MLP runs: a gated MLP's op (swiglu / geglu with its ``approximate``,
:data:`~tigon.integrations.families.ACTIVATIONS`) from its config or the class of its ``act_fn``
(:func:`mlp_activation`), and a non-gated MLP's :func:`tigon.functional.act_linear` activation from the exact class
of its activation module (:func:`nongated_activation`).
"""

from __future__ import annotations

import functools

import torch

from .. import support
from .families import ACTIVATIONS, NONGATED_ACTIVATIONS, MLPSpec


# ---- gated MLPs ----------------------------------------------------------------------------------------------
def mlp_activation(module, spec: MLPSpec, dynamo: bool | None = None) -> tuple[str, str | None] | str:
    """``(op, approximate)`` for the module's activation (see ACTIVATIONS), or a string saying why not.

    ``spec.activation`` when set (generic matcher), else ``module.config.<spec.act_config_attr>``. ``dynamo``:
    ``support.dynamo_compiling()`` where the caller asked it already (None: asked here).
    """
    if spec.activation is not None:
        name, where = spec.activation, "probed activation"
    else:
        config = module.__dict__.get("config") or getattr(module, "config", None)
        # the config's own dict first, read past PretrainedConfig.__getattribute__ in eager mode (its attribute_map
        # aliases: ~1 us and three Python frames per read, ``config.__dict__`` included; dynamo cannot trace
        # object.__getattribute__, and its trace runs once); an aliased name is then read by getattr
        if dynamo is None:
            dynamo = support.dynamo_compiling()
        own = (None if config is None else config.__dict__ if dynamo
               else object.__getattribute__(config, "__dict__"))
        name = (own.get(spec.act_config_attr) or getattr(config, spec.act_config_attr, None)
                if config is not None else None)
        where = f"config.{spec.act_config_attr}"
        if name is None and config is None:  # a module without config (Qwen2.5-VL's vision MLP): its act_fn's class
            name, where = _activation_name(getattr(module, "act_fn", None)), "the class of its act_fn"
        if name is None:
            return f"cannot read config.{spec.act_config_attr} from the module"
    act = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if act is None:
        return f"activation {name!r} ({where}) has no Tigon kernel; supported: " + ", ".join(ACTIVATIONS)
    return act


def _activation_name(act_fn) -> str | None:
    """The :data:`ACTIVATIONS` name of an activation module built by ``transformers.activations.ACT2FN``, when its
    class alone identifies one Tigon op (entries built with options, e.g. ``gelu_10``'s clipping, are not
    considered: their class does not tell the options); else None."""
    if act_fn is None:
        return None
    try:
        from transformers.activations import ACT2CLS
    except ImportError:
        return None
    names = [n for n, cls in ACT2CLS.items() if not isinstance(cls, tuple) and type(act_fn) is cls]
    ops = {ACTIVATIONS.get(n) for n in names}
    return names[0] if names and len(ops) == 1 and None not in ops else None


# ---- non-gated MLPs ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _activation_classes() -> dict[type, str]:
    """Activation module class -> its :data:`NONGATED_ACTIVATIONS` value, for the classes of
    ``transformers.activations.ACT2CLS`` (entries built with options, e.g. ``gelu_10``'s clipping, left out: their
    class alone does not tell the options) and torch's ReLU / SiLU; ``torch.nn.GELU`` is read by its ``approximate``
    (:func:`nongated_activation`)."""
    out = {torch.nn.ReLU: "relu", torch.nn.SiLU: "silu"}
    try:
        from transformers.activations import ACT2CLS
    except ImportError:
        return out
    for name, cls in ACT2CLS.items():
        if not isinstance(cls, tuple) and name in NONGATED_ACTIVATIONS:
            out[cls] = NONGATED_ACTIVATIONS[name]
    return out


def nongated_activation(module, spec: MLPSpec) -> tuple[str | None, str | None]:
    """``(activation, None)``: the :func:`tigon.functional.act_linear` activation of the non-gated MLP ``module``, named
    by the exact class of its activation module ``module.<spec.act>`` (a subclass may compute something else); or
    ``(None, why not)``."""
    act_fn = getattr(module, spec.act, None) if spec.act is not None else None
    cls = type(act_fn)
    name = _activation_classes().get(cls)
    if name is None and cls is torch.nn.GELU:
        name = {"none": "gelu", "tanh": "gelu_tanh"}.get(act_fn.approximate)
    if name is not None:
        return name, None
    if act_fn is None:
        return None, f"no activation module {spec.act!r}"
    return None, (f"activation {cls.__module__}.{cls.__qualname__} ({spec.act}) has no Tigon kernel; supported: "
                  + ", ".join(sorted(NONGATED_ACTIVATIONS)) + ", torch.nn.GELU")
