"""A model config's sizes and family semantics as :class:`tigon.ops.ModelShapes`, the one place ``tigon verify``,
``tigon bench`` and ``tigon profile`` take their shapes from (each op then takes its slice with its record's
``shape_of``).
"""

from __future__ import annotations

from typing import Any

from ..integrations.components import partial_rotary_factor
from ..integrations.families import glu_activation, rms_semantics
from ..ops import ModelShapes


CPU_MAX_VOCAB = 1024
"""The vocabulary cap of verify and bench on CPU (interpreted kernels are far too slow at, e.g., Llama 3's 128,256)."""


class ConfigFieldError(ValueError):
    """A model config lacks a field the shapes need (the message names it)."""


def config_field(config, name: str, default=None) -> Any:
    """``config.<name>`` for transformers configs, ``config[name]`` for dicts; ``default`` when absent or None. A
    field that varies per layer (Gemma 4's ``head_dim``: its config raises on the global read) gives the global
    value of ``config.to_dict()``, as a ``config.json`` holds it."""
    if isinstance(config, dict):
        value = config.get(name)
    else:
        try:
            value = getattr(config, name, None)
        except Exception:  # transformers' AmbiguousGlobalPerLayerAttributeError (not an AttributeError)
            value = config.to_dict().get(name)
    return default if value is None else value


def text_config(config):
    """The text decoder's config of a multimodal config (``text_config``), else ``config`` itself. A dict's
    ``text_config`` wins even where the outer dict has a ``hidden_size`` of its own (PaliGemma's projection size), as
    ``get_text_config()`` picks it for a config object."""
    if isinstance(config, dict):
        inner = config.get("text_config")
        return inner if isinstance(inner, dict) else config
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def shapes_from_config(config, tokens: int, batch: int = 1,
                       max_vocab: int | None = None) -> tuple[ModelShapes, list[str]]:
    """:class:`ModelShapes` for ``tokens`` tokens (``batch`` sequences) of a model, and notes on what was capped.

    Args:
        config: a transformers config or its dict (``config.json``); multimodal configs give their text decoder's.
            Reads hidden_size, intermediate_size, num_attention_heads, vocab_size (required), num_key_value_heads,
            head_dim, rms_norm_eps, rope_parameters / rope_theta, partial_rotary_factor / rotary_pct (the rotated
            part of each head), final_logit_softcapping, model_type (for the
            family's RMSNorm casting and offset, :mod:`tigon.integrations.families`).
        tokens: tokens in all (>= 1); batch: sequences among them (the rotary op's batch), at most ``tokens``.
        max_vocab: cap on the vocabulary (None or 0: no cap).

    Raises:
        ConfigFieldError: a required field is missing.
    """
    config = text_config(config)
    need = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
    missing = [n for n in need if not isinstance(config_field(config, n), int)]
    if missing:
        model_type = config_field(config, "model_type")
        raise ConfigFieldError(f"the model config has no {', '.join(missing)} (model_type {model_type!r}); the op "
                               f"shapes read {', '.join(need)} (or the names its transformers config class maps to "
                               "them)")
    hidden, heads = config_field(config, "hidden_size"), config_field(config, "num_attention_heads")
    rotary = config_field(config, "rope_parameters", {})
    theta = ((rotary.get("rope_theta") if isinstance(rotary, dict) else None)
             or config_field(config, "rope_theta", 10000.0))
    casting, offset = rms_semantics(config_field(config, "model_type", ""))
    vocab, caps = config_field(config, "vocab_size"), []
    if max_vocab and vocab > max_vocab:
        caps.append(f"vocab {vocab} capped to {max_vocab} (interpreted kernels are too slow at full size; "
                    "--max-vocab changes the cap)")
        vocab = max_vocab
    batch = max(1, min(batch, tokens))
    head_dim = config_field(config, "head_dim", hidden // heads)
    rotary_dim = int(head_dim * partial_rotary_factor(config))  # HF's rotary dim (its int() rounding)
    shapes = ModelShapes(
        tokens=tokens, batch=batch, hidden=hidden, intermediate=config_field(config, "intermediate_size"), heads=heads,
        kv_heads=config_field(config, "num_key_value_heads", heads), head_dim=head_dim,
        rotary_dim=rotary_dim if 0 < rotary_dim < head_dim else None,
        vocab=vocab, rms_eps=float(config_field(config, "rms_norm_eps", 1e-6)), rms_casting_mode=casting,
        rms_offset=offset,
        rope_theta=float(theta), softcap=config_field(config, "final_logit_softcapping"),
        activation=glu_activation(config), **moe_sizes(config))
    return shapes, caps


MOE_FIELDS = {"experts": ("num_experts", "num_local_experts", "n_routed_experts"),
              "top_k": ("num_experts_per_tok", "top_k", "moe_topk"),
              "expert_intermediate": ("moe_intermediate_size",)}
"""ModelShapes' mixture-of-experts sizes -> the config fields that hold them, the first present wins (Qwen3-MoE /
OLMoE ``num_experts``, Mixtral / GPT-OSS ``num_local_experts``, DeepSeek ``n_routed_experts``)."""


def moe_sizes(config) -> dict:
    """The :class:`ModelShapes` keywords of a mixture-of-experts config's sizes (:data:`MOE_FIELDS`); {} for a dense
    one (ModelShapes' defaults)."""
    out = {}
    for key, names in MOE_FIELDS.items():
        value = next((v for v in (config_field(config, n) for n in names) if isinstance(v, int) and v > 0), None)
        if value is not None:
            out[key] = value
    if "experts" not in out:
        return {}
    return out
