"""Model presets for ``tigon compare``: architecture shapes as plain data, built with random weights (no download).

Each entry maps a name to ``model_type`` (a Hugging Face ``model_type``, e.g. ``"llama"``), the ``config``
keyword arguments for that family's ``PretrainedConfig``, a one-line ``description`` and the default AdamW
learning rate ``lr`` for training it from scratch. Token ids in
``tigon compare`` are UTF-8 bytes (0..255), valid for every preset here since each vocabulary has >= 256 entries.

Vision-language presets (``qwen2-vl-7b``, ``qwen2.5-vl-7b`` and their ``-tiny`` CPU forms) give ``text_config`` and
``vision_config``; the tools build them with ``AutoModelForImageTextToText`` and feed them an image per sequence
(:mod:`tigon.workflows.multimodal`). The tiny ones use the byte vocabulary with their special tokens at 250..253,
bytes that never occur in UTF-8 text.

Add a preset by adding a dict entry; :func:`build_config` turns it into a ``transformers`` config.
"""

from __future__ import annotations

import copy
from typing import Any

_LLAMA3_ROPE = {"rope_type": "default", "rope_theta": 500000.0}
_QWEN_VL_IDS = dict(vision_start_token_id=151652, vision_end_token_id=151653, image_token_id=151655,
                    video_token_id=151656)
_QWEN_VL_TEXT = dict(  # Qwen2-VL-7B / Qwen2.5-VL-7B's text decoder: Qwen2 7B with M-RoPE sections (t, h, w)
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
    num_key_value_heads=4, rms_norm_eps=1e-6, hidden_act="silu",
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]})
_TINY_VL_IDS = dict(vision_start_token_id=250, vision_end_token_id=251, image_token_id=252, video_token_id=253)
_TINY_VL_TEXT = dict(  # the "tiny" preset's decoder with M-RoPE sections of its head dim 32
    vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=254,
    eos_token_id=255, rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]})

_QWEN2_7B = dict(
    vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
    num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=False,
)
"""Qwen2-7B's and Qwen2.5-7B's shapes (the same architecture and sizes)."""

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
        "config": dict(_QWEN2_7B),
    },
    "qwen2.5-7b": {
        "model_type": "qwen2",
        "description": "Qwen2.5 7B shapes (28 layers, q/k/v bias, vocab 152064; Qwen2-7B's shapes)",
        "lr": 3e-4,
        "config": dict(_QWEN2_7B),
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
    "qwen2-vl-7b": {
        "model_type": "qwen2_vl",
        "description": "Qwen2-VL 7B shapes: Qwen2 7B text decoder (M-RoPE), 32-block ViT (1280, patch 14, 2x2 merge); "
                       "--layers cuts the text decoder",
        "lr": 3e-4,
        "config": dict(
            text_config=dict(_QWEN_VL_TEXT, max_position_embeddings=32768), **_QWEN_VL_IDS, tie_word_embeddings=False,
            vision_config=dict(depth=32, embed_dim=1280, hidden_size=3584, hidden_act="quick_gelu", mlp_ratio=4,
                               num_heads=16, in_channels=3, patch_size=14, spatial_merge_size=2,
                               temporal_patch_size=2),
        ),
    },
    "qwen2.5-vl-7b": {
        "model_type": "qwen2_5_vl",
        "description": "Qwen2.5-VL 7B shapes: Qwen2 7B text decoder (M-RoPE), 32-block windowed ViT (1280, RMSNorm, "
                       "gated SiLU MLP); --layers cuts the text decoder",
        "lr": 3e-4,
        "config": dict(
            text_config=dict(_QWEN_VL_TEXT, max_position_embeddings=128000), **_QWEN_VL_IDS, tie_word_embeddings=False,
            vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                               hidden_act="silu", in_channels=3, patch_size=14, spatial_merge_size=2,
                               temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
                               tokens_per_second=2),
        ),
    },
    "qwen2-vl-tiny": {
        "model_type": "qwen2_vl",
        "description": "Qwen2-VL layout at the tiny preset's size: 2-layer text decoder, 2-block ViT, byte vocabulary "
                       "(CPU)",
        "lr": 1e-3,
        "config": dict(
            text_config=dict(_TINY_VL_TEXT), **_TINY_VL_IDS, tie_word_embeddings=False,
            vision_config=dict(depth=2, embed_dim=32, hidden_size=128, mlp_ratio=2, num_heads=2, patch_size=2,
                               spatial_merge_size=2, temporal_patch_size=2),
        ),
    },
    "qwen2.5-vl-tiny": {
        "model_type": "qwen2_5_vl",
        "description": "Qwen2.5-VL layout at the tiny preset's size: 2-layer text decoder, 2-block windowed ViT, byte "
                       "vocabulary (CPU)",
        "lr": 1e-3,
        "config": dict(
            text_config=dict(_TINY_VL_TEXT), **_TINY_VL_IDS, tie_word_embeddings=False,
            vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=128,
                               patch_size=2, spatial_merge_size=2, temporal_patch_size=2, window_size=8,
                               fullatt_block_indexes=[1]),
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

    Per-layer lists of the config (``layer_types``, sliding-window or NoPE flags...) are cut to match. A
    vision-language config keeps ``layers`` layers of its text decoder (``config.get_text_config()``); its vision
    encoder stays whole.

    Raises:
        ValueError: ``layers`` < 1 or more than the config's ``num_hidden_layers``.
    """
    if layers is None:
        return config
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    if text is not config:
        keep_layers(text, layers)
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
