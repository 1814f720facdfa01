"""Model presets for ``tigon compare``: architecture shapes as plain data, built with random weights (no download).

Each entry maps a name to ``model_type`` (a Hugging Face ``model_type``, e.g. ``"llama"``), the ``config``
keyword arguments for that family's ``PretrainedConfig``, a one-line ``description`` and the default AdamW
learning rate ``lr`` for training it from scratch. Token ids in
``tigon compare`` are UTF-8 bytes (0..255), valid for every preset here since each vocabulary has >= 256 entries.

Add a preset by adding a dict entry; :func:`build_config` turns it into a ``transformers`` config.
"""

from __future__ import annotations

import copy
from typing import Any

_LLAMA3_ROPE = {"rope_type": "default", "rope_theta": 500000.0}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "model_type": "llama",
        "description": "2-layer Llama, hidden 128, byte vocabulary (the CPU default; trains in seconds)",
        "lr": 1e-3,
        "config": dict(
            vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        ),
    },
    "small": {
        "model_type": "llama",
        "description": "4-layer Llama, hidden 512, byte vocabulary (the CUDA default)",
        "lr": 1e-3,
        "config": dict(
            vocab_size=256, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False,
        ),
    },
    "llama3-8b": {
        "model_type": "llama",
        "description": "Meta Llama 3 8B shapes (32 layers; use --layers to keep a few)",
        "lr": 3e-4,
        "config": dict(
            vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
            num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rms_norm_eps=1e-5,
            rope_parameters=dict(_LLAMA3_ROPE), tie_word_embeddings=False,
        ),
    },
    "llama3.2-1b": {
        "model_type": "llama",
        "description": "Meta Llama 3.2 1B shapes (16 layers, tied embeddings, llama3 RoPE scaling)",
        "lr": 3e-4,
        "config": dict(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
            rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
            },
        ),
    },
    "qwen2-7b": {
        "model_type": "qwen2",
        "description": "Qwen2 7B shapes (28 layers, q/k/v bias, vocab 152064)",
        "lr": 3e-4,
        "config": dict(
            vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
            num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False,
        ),
    },
    "qwen2.5-0.5b": {
        "model_type": "qwen2",
        "description": "Qwen2.5 0.5B shapes (24 layers, hidden 896, q/k/v bias, tied embeddings, vocab 151936)",
        "lr": 3e-4,
        "config": dict(
            vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True,
        ),
    },
    "smollm2-360m": {
        "model_type": "llama",
        "description": "SmolLM2 360M shapes (32 layers, hidden 960, 15 heads, tied embeddings, vocab 49152)",
        "lr": 3e-4,
        "config": dict(
            vocab_size=49152, hidden_size=960, intermediate_size=2560, num_hidden_layers=32,
            num_attention_heads=15, num_key_value_heads=5, max_position_embeddings=8192, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, tie_word_embeddings=True,
        ),
    },
    "gemma2-9b": {
        "model_type": "gemma2",
        "description": "Google Gemma 2 9B shapes (42 layers, head_dim 256, GeGLU, logit softcapping, tied embeddings)",
        "lr": 3e-4,
        "config": dict(
            vocab_size=256000, hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
            num_attention_heads=16, num_key_value_heads=8, head_dim=256, hidden_activation="gelu_pytorch_tanh",
            final_logit_softcapping=30.0, attn_logit_softcapping=50.0, query_pre_attn_scalar=256,
            sliding_window=4096, max_position_embeddings=8192, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        ),
    },
}


def preset_names() -> list[str]:
    """The available preset names, in definition order."""
    return list(PRESETS)


def get_preset(name: str) -> dict[str, Any]:
    """A deep copy of preset ``name`` (``{"model_type", "description", "lr", "config"}``).

    Raises:
        KeyError: unknown name; the message lists the available presets.
    """
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r} (available: {', '.join(PRESETS)})")
    return copy.deepcopy(PRESETS[name])


def keep_layers(config, layers: int | None):
    """Keep the first ``layers`` decoder layers of a transformers ``config`` (in place; returns it).

    Per-layer lists of the config (``layer_types``, sliding-window or NoPE flags...) are cut to match.

    Raises:
        ValueError: ``layers`` < 1 or more than the config's ``num_hidden_layers``.
    """
    if layers is None:
        return config
    total = getattr(config, "num_hidden_layers", None)
    if layers < 1 or (total is not None and layers > total):
        raise ValueError(f"--layers must be between 1 and the model's {total} layers, got {layers}")
    for key, value in list(vars(config).items()):
        if isinstance(value, list) and total is not None and len(value) == total and key != "architectures":
            setattr(config, key, value[:layers])
    config.num_hidden_layers = layers
    return config


def build_config(name: str, num_hidden_layers: int | None = None):
    """The ``transformers`` config for preset ``name``, optionally keeping only ``num_hidden_layers`` layers.

    Raises:
        KeyError: unknown preset.
        ValueError: ``num_hidden_layers`` outside 1 .. the preset's layer count.
    """
    from transformers import AutoConfig

    preset = get_preset(name)
    return keep_layers(AutoConfig.for_model(preset["model_type"], **preset["config"]), num_hidden_layers)
