"""LoRA fine-tuning in the tools (``--lora R`` of ``tigon bench --e2e``, ``profile``, ``inspect``, ``verify``): the
model wrapped by PEFT's ``get_peft_model`` with LoRA of rank R on the projections it has of :data:`LORA_TARGETS`."""

from __future__ import annotations

import importlib.util

import torch

from .errors import ConfigError


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv_proj",
                "gate_up_proj")
"""The projections ``--lora`` puts adapters on, those of them the model has: the names of Llama-style decoders and
the fused projections of Phi-3 / GLM-4 (``qkv_proj``, ``gate_up_proj``)."""


def with_lora(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """``model`` wrapped by PEFT's ``get_peft_model``: LoRA of ``rank`` (alpha 2 x rank, dropout 0) on
    :data:`LORA_TARGETS`, adapters in the model's dtype; every other parameter frozen (the LM head included).

    Raises:
        ImportError: peft is not installed.
    """
    import peft

    cfg = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=list(LORA_TARGETS),
                          bias="none")
    return peft.get_peft_model(model, cfg, autocast_adapter_dtype=False)


def check_lora(rank) -> None:
    """Check a ``--lora R`` rank (None: no LoRA).

    Raises:
        ConfigError: not an integer >= 1, or peft is not installed.
    """
    if rank is None:
        return
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ConfigError(f"--lora must be an integer >= 1, got {rank!r}")
    if importlib.util.find_spec("peft") is None:
        raise ConfigError("--lora needs peft (pip install peft)")
