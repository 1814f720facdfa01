"""Switching a model's attention implementation to one of Tigon's, per model: what the sink attention
(:mod:`tigon.integrations.sink_attention`) and the vision towers' length-batched packed attention
(:mod:`tigon.integrations.varlen_attention`) share.

transformers picks a module's attention function by ``module.config._attn_implementation`` through its
``AttentionInterface`` (``modeling_utils.py``). Tigon registers a new name and sets it on the model's own copy of
each config concerned (:func:`switch`): models built from one config object (a policy and its reference model) share
it, and patching one must not switch the other (nor make its report say it was patched). :func:`switched` finds what
:func:`switch` set, for ``tigon.unpatch``.
"""

from __future__ import annotations

import copy

import torch


def switch(model: torch.nn.Module, configs: dict[int, object], name: str) -> None:
    """Give every module of ``model`` that holds one of ``configs`` (``id(config) -> config``) a copy of it with
    ``_attn_implementation = name`` (one copy per config object, shared by the modules that shared it).

    A module config that holds one of ``configs`` as a sub-config (``config.sub_configs``: a vision-language model's
    ``config.vision_config``) becomes a shallow copy holding the new copy instead, at any depth: the model's
    ``config.vision_config`` stays its tower's config, so that transformers' ``set_attn_implementation`` (which finds
    a sub-model by its sub-config's identity) reaches the tower, and the caller's config objects are left as they
    were (their other sub-configs stay shared)."""
    own = {key: copy.deepcopy(cfg) for key, cfg in configs.items()}

    def rebound(cfg):
        if id(cfg) not in own:
            subs = {k: getattr(cfg, k, None) for k in getattr(cfg, "sub_configs", None) or {}}
            new = {k: rebound(sub) for k, sub in subs.items() if sub is not None}
            if any(new[k] is not subs[k] for k in new):
                own[id(cfg)] = copy.copy(cfg)
                for k, sub in new.items():
                    setattr(own[id(cfg)], k, sub)
            else:
                own[id(cfg)] = cfg
        return own[id(cfg)]

    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            m.config = rebound(cfg)
    for key in configs:
        own[key]._attn_implementation = name


def switched(model: torch.nn.Module, name: str) -> tuple[dict[int, object], list[tuple[str, torch.nn.Module]]]:
    """The configs of ``model``'s modules whose ``_attn_implementation`` is ``name`` (``id -> config``) and the
    ``(path, module)`` pairs holding them, in ``named_modules`` order."""
    configs: dict[int, object] = {}
    holders = []
    for path, m in model.named_modules():
        cfg = getattr(m, "config", None)
        if getattr(cfg, "_attn_implementation", None) == name:
            configs[id(cfg)] = cfg
            holders.append((path, m))
    return configs, holders
