"""The models of the end-to-end benchmark and ``tigon profile``: their configs, random-weight builds, random
batches, attention implementations, and the description (sizes, parameter counts) each run reports."""

from __future__ import annotations

from typing import Any

import torch

from .errors import ConfigError


def hf_config(model: str, layers: int | None = None, arg: str = "--model"):
    """The ``transformers`` config of ``model`` (a preset name, a config.json file, a checkpoint directory or a Hub id
    in the local cache: :func:`tigon.workflows.model_source.load_model_config`), keeping ``layers`` decoder layers,
    and a description of the source (the preset name, the absolute path or the Hub id). ``arg``: how the command
    took ``model``, for error messages (``"--model"``, or ``"MODEL"`` for ``tigon profile``'s positional).

    Raises:
        ConfigError: ``model`` cannot be found or read, or ``layers`` is out of range.
    """
    from .model_source import model_config

    config, source = model_config(model, layers, arg)
    return config, source.hub_id or source.path


def build_model(config, dtype: torch.dtype, device: torch.device, seed: int,
                attn_implementation: str | None = None) -> torch.nn.Module:
    """A causal LM of ``config`` with random weights from ``seed``, built directly on ``device`` in ``dtype``
    (``AutoModelForCausalLM``, or ``AutoModelForImageTextToText`` for a vision-language config:
    :func:`tigon.workflows.multimodal.auto_class`).

    ``attn_implementation`` ("eager", "sdpa", ...) goes to ``from_config`` when not None.
    """
    from .multimodal import auto_class

    kwargs = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    torch.manual_seed(seed)
    with torch.device(device):
        return auto_class(config).from_config(config, dtype=dtype, **kwargs)


def cast_floating(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model``, its floating-point parameters and buffers cast to ``dtype`` in place; complex and integer ones keep
    their dtype (``model.to(dtype)`` casts complex buffers too, dropping their imaginary part: Llama 4's vision rotary
    table ``freqs_ci`` would stop rotating; ``Module.float()`` / ``.double()`` cast floating tensors only, likewise)."""
    return model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)


def attn_implementations() -> list[str]:
    """The attention implementation names transformers knows here: "eager" and its attention registry's keys."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:  # pragma: no cover - older transformers
        return ["eager", "sdpa", "flash_attention_2", "flex_attention"]
    keys = ALL_ATTENTION_FUNCTIONS.valid_keys() if hasattr(ALL_ATTENTION_FUNCTIONS, "valid_keys") \
        else list(ALL_ATTENTION_FUNCTIONS)
    return list(dict.fromkeys(["eager", *keys]))


def check_attn_implementation(name: str | None) -> None:
    """Raise :class:`ConfigError` (naming ``--attn-implementation``) unless ``name`` is None, a name of
    :func:`attn_implementations` or a Hub kernel repository ``"org/repo"`` (transformers loads it, e.g.
    ``"kernels-community/flash-attn"``)."""
    if name is None:
        return
    names = attn_implementations()
    if not isinstance(name, str) or not (name in names or name.count("/") == 1 and all(name.split("/"))):
        raise ConfigError(f"--attn-implementation {name!r}: unknown attention implementation (choose from "
                          f"{', '.join(names)}, or a Hub kernel 'org/repo')")


def random_batches(vocab: int, n: int, batch_size: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """``n`` (batch_size, seq_len) int64 batches of uniform random token ids in [0, vocab), CPU, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (batch_size, seq_len), generator=g) for _ in range(n)]


def step_batches(config, n: int, batch_size: int, seq_len: int, seed: int, image_tokens: int | None = None) -> list:
    """The ``n`` training batches of a model: :func:`random_batches` over its text vocabulary; for a vision-language
    config each with one random image per sequence (:func:`tigon.workflows.multimodal.with_images`; ``image_tokens``
    per image for the grid families, default ``seq_len // 4``), a dict of forward arguments.

    Raises:
        ConfigError: a vision-language family without image inputs, ``seq_len`` too short for its image, or an
            ``image_tokens`` the model does not take (:func:`tigon.workflows.multimodal.check_image_tokens`).
    """
    from .model_shapes import text_config
    from .multimodal import check_image_tokens, is_vision_language, with_images

    check_image_tokens(config, image_tokens)
    batches = random_batches(int(text_config(config).vocab_size), n, batch_size, seq_len, seed)
    if not is_vision_language(config):
        return batches
    return [with_images(b, config, image_tokens=image_tokens, seed=seed + i) for i, b in enumerate(batches)]


def take_rows(batch, start: int, stop: int):
    """Sequences ``start:stop`` of a batch of :func:`step_batches` (a rank's share of the global batch)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    from .multimodal import take

    return take(batch, start, stop)


def model_info(config, source: str, batch=None) -> dict[str, Any]:
    """Description of a model config (no weights needed): architecture, sizes (a vision-language model's text
    decoder's) and parameter count, and ``matmul_parameters`` (:func:`matmul_parameters`; the MFU numerator's count
    per token). For a vision-language model and one of its batches (``batch``, :func:`step_batches`), the vision
    encoder's parameters (``vision_parameters``: all but the text decoder, the LM head and the input embedding)
    count in ``matmul_parameters`` in proportion to the positions they run on: their patches per sequence over the
    sequence's tokens.

    Raises:
        ConfigError: transformers cannot build a causal LM from ``config``.
    """
    from .model_shapes import text_config

    text = text_config(config)  # a vision-language model's sizes are its text decoder's
    info = {"source": source, "model_type": getattr(config, "model_type", None),
            "architecture": (getattr(config, "architectures", None) or [None])[0],
            "num_hidden_layers": getattr(text, "num_hidden_layers", None),
            "hidden_size": getattr(text, "hidden_size", None),
            "intermediate_size": getattr(text, "intermediate_size", None),
            "vocab_size": getattr(text, "vocab_size", None)}
    from .dry_run import build_meta_model

    m = build_meta_model(config)  # ConfigError for a config transformers cannot build, before any run
    info["architecture"] = type(m).__name__
    info["num_parameters"] = sum(p.numel() for p in m.parameters())
    info["matmul_parameters"] = matmul_parameters(m)
    if isinstance(batch, dict):
        from .multimodal import vision_positions

        text_part = {id(p) for p in m.get_decoder().parameters()} | {id(p) for p in m.get_output_embeddings()
                                                                     .parameters()}
        text_part |= {id(p) for p in m.get_input_embeddings().parameters()}
        vision = sum(p.numel() for p in m.parameters() if id(p) not in text_part)
        positions, seq = vision_positions(batch, config), batch["input_ids"].shape[1]
        info.update(vision_parameters=vision, vision_positions_per_sequence=positions,
                    matmul_parameters=int(info["matmul_parameters"] - vision + vision * positions / seq))
    return info


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters of ``model`` that multiply each token's activations in a training step: all of them but the input
    embedding (a lookup), which counts when it is tied to the LM head (the head's matmul uses it), and of a MoE layer's
    experts only the ``top_k`` of ``num_experts`` a token is routed to (:func:`idle_expert_parameters`). The MFU
    numerator's count."""
    n = sum(p.numel() for p in model.parameters()) - idle_expert_parameters(model)
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    if emb is not None and (out is None or out.weight is not emb.weight):
        n -= emb.weight.numel()
    return n


def idle_expert_parameters(model: torch.nn.Module) -> int:
    """The expert weights a token does not run, summed over ``model``'s MoE layers: of every experts module (an int
    ``num_experts`` E and its own parameters stacked over E: Hugging Face v5's ``<Family>Experts``), the share
    ``1 - top_k / E``, ``top_k`` from a router beside it (a sibling module with int ``top_k``, which itself counts
    whole) or else the config's ``num_experts_per_tok``. 0 for a dense model; an experts module whose ``top_k`` is
    found nowhere counts whole."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if callable(getattr(config, "get_text_config", None)) else config
    default_k = getattr(text, "num_experts_per_tok", None)
    idle = 0
    for parent in model.modules():
        children = list(parent.children())
        routers = [getattr(c, "top_k", None) for c in children]
        k_here = next((k for k in routers if isinstance(k, int) and not isinstance(k, bool)), default_k)
        for child in children:
            e = getattr(child, "num_experts", None)
            if getattr(child, "top_k", None) is not None:  # the router: every token runs all of it
                continue
            if isinstance(e, bool) or not isinstance(e, int) or not isinstance(k_here, int) or not 0 < k_here < e:
                continue
            stacked = sum(p.numel() for p in child.parameters(recurse=False) if p.dim() >= 2 and p.shape[0] == e)
            idle += stacked - stacked * k_here // e
    return idle
