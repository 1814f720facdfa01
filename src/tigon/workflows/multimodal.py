"""Vision-language models in the tools (``tigon inspect``, ``verify --model``, ``compare``, ``bench --e2e``,
``profile``): the transformers class that builds a config, and image + text batches of the right shapes, from the
config alone (no processor, nothing downloaded).

A config is vision-language when it has a ``vision_config`` and transformers' ``AutoModelForImageTextToText`` maps
it (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V, LLaVA(-NeXT, -OneVision), PaliGemma, Gemma 3, Mllama, InternVL, SmolVLM,
Idefics3, Mistral 3, Aya Vision, Llama 4 ...): it is built
with that class (``Qwen2_5_VLForConditionalGeneration``); every other config with ``AutoModelForCausalLM``.

A batch (:func:`with_images`) puts one image in each sequence, after its first token, laid out as the family's
processor does (the image's placeholder tokens, between the family's image start / end tokens where it has them);
the pixels are standard normal (values as after the processor's normalisation); ``labels`` are the input ids with
the placeholder tokens set to -100 (ignored by the loss); text ids that equal one of the config's special token ids
(``*_token_id`` / ``*_token_index``) are replaced, so each sequence holds exactly one image. Layouts
(:func:`image_layout`: the family's :attr:`tigon.integrations.family_spec.FamilySpec.image_layout`):

``grid``
    Qwen2-VL, Qwen2.5-VL, Qwen3-VL(-MoE), Qwen3.5(-MoE), GLM-4V(-MoE): vision configs with ``spatial_merge_size``
    and ``temporal_patch_size``. One frame of ``h x w`` patches of ``patch_size`` pixels: ``pixel_values``
    ``(batch * h * w, channels * temporal_patch_size * patch_size**2)``, ``image_grid_thw`` ``(batch, 3)`` rows
    ``(1, h, w)``, and ``mm_token_type_ids`` (1 on image tokens) where the model's forward takes it (transformers
    5.2x); ``h * w / merge**2`` image tokens, as near ``image_tokens`` as the merge allows.
``square``
    LLaVA (CLIP, SigLIP or Pixtral vision), PaliGemma, Gemma 3, InternVL, SmolVLM, Idefics3, Mistral 3, Aya Vision,
    Llama 4: one image of the vision config's ``image_size``; ``pixel_values`` ``(batch, channels, size, size)`` (a
    family of ``images_axis``, SmolVLM / Idefics3: ``(batch, 1, ...)``; with ``image_sizes`` for a vision tower of
    ``image_sizes``, Pixtral); the image-token count follows from the config by the family's ``image_tokens`` rule
    (:func:`square_image_tokens`). Llama 4's image is one tile (its processor's ``(batch * tiles, ...)`` rows, one
    per image), its tokens ``<|patch|>`` (``image_token_id``) between its start / end tokens (its processor's
    ``<|image|>`` before them, an id the config does not name, is left out).
``anyres``
    LLaVA-NeXT, LLaVA-OneVision: one square image of the vision config's ``image_size``, as the base tile plus the
    crops of the best of ``image_grid_pinpoints`` (``pixel_values`` ``(batch, tiles, channels, size, size)``,
    ``image_sizes``); base-tile tokens, then the unpadded grid's tokens with a newline token per row
    (:func:`anyres_image_tokens`).
``patches``
    Gemma 4: one image of ``h x w`` patches, flattened (``pixel_values`` ``(batch, h * w, channels * patch_size**2)``,
    uniform in [0, 1] as its processor gives them) with their ``(x, y)`` positions (``image_position_ids``), pooled
    ``pooling_kernel_size**2`` to an image token; ``mm_token_type_ids`` marks the image tokens.
``tiles``
    Mllama: one image of one tile (padded to ``max_num_tiles``), a single ``<|image|>`` token that the
    cross-attention layers attend from every position (``cross_attention_mask`` all ones).
"""

from __future__ import annotations

import inspect
import math

import torch

from ..integrations.families import FAMILIES, family_by_name, tower_family
from ..integrations.family_spec import IMAGE_LAYOUTS as LAYOUTS  # noqa: F401  (re-exported under its name here)
from .errors import ConfigError

IGNORE_INDEX = -100
"""The label of the image's placeholder tokens (transformers' loss ignores it)."""


def is_vision_language(config) -> bool:
    """Whether ``config`` (a transformers config) is a vision-language model's: it has a ``vision_config`` and
    ``AutoModelForImageTextToText`` maps its type."""
    if getattr(config, "vision_config", None) is None:
        return False
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    return getattr(config, "model_type", None) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def auto_class(config):
    """transformers' auto class that builds ``config``: ``AutoModelForImageTextToText`` for a vision-language config
    (:func:`is_vision_language`), else ``AutoModelForCausalLM``."""
    import transformers

    return transformers.AutoModelForImageTextToText if is_vision_language(config) else \
        transformers.AutoModelForCausalLM


def model_class(config):
    """The model class :func:`auto_class` builds for ``config`` (``Qwen2VLForConditionalGeneration``), or None when
    the installed transformers maps none."""
    import transformers
    from transformers.models.auto import modeling_auto

    names = (modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES if is_vision_language(config)
             else modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    name = names.get(getattr(config, "model_type", None))
    return getattr(transformers, name, None) if isinstance(name, str) else None


def _get(config, *names, default=None):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def _side(value) -> int:
    """An image / patch size given as an int or a (height, width) pair, as one side (square images only)."""
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _family(model_type: str):
    """The family spec of a config's ``model_type`` (:func:`tigon.integrations.families.family_by_name`), or None
    for a model type of no registered family."""
    try:
        return family_by_name(model_type)
    except ValueError:
        return None


def image_layout(config) -> str:
    """The batch layout of a vision-language ``config`` (one of :data:`LAYOUTS`, see the module docstring): the
    ``image_layout`` of its family's spec (:func:`tigon.integrations.families.family_by_name` of its ``model_type``);
    for a model type of no registered family, ``grid`` when its vision config has ``spatial_merge_size`` and
    ``temporal_patch_size`` (the Qwen-VL form).

    Raises:
        ConfigError: ``config`` is not vision-language, or its family has no layout (the message names it).
    """
    vision = getattr(config, "vision_config", None)
    model_type = getattr(config, "model_type", None)
    if vision is None or not is_vision_language(config):
        raise ConfigError(f"model_type {model_type!r} is not a vision-language model (no vision_config that "
                          "AutoModelForImageTextToText maps)")
    spec = _family(model_type)
    if spec is None and getattr(vision, "spatial_merge_size", None) and getattr(vision, "temporal_patch_size", None):
        return "grid"  # no registered family: a Qwen-VL-like vision config still takes grid inputs
    layout = spec.image_layout if spec is not None else None
    if layout is None:
        supported = sorted(s.name for s in FAMILIES.values() if s.image_layout is not None)
        raise ConfigError(f"no image inputs for model_type {model_type!r} yet (supported: {', '.join(supported)}; "
                          "and other model types whose vision config has spatial_merge_size and temporal_patch_size)")
    return layout


def _tower(config):
    """The family spec of ``config``'s vision tower (:func:`tigon.integrations.families.tower_family`), or None."""
    return tower_family(getattr(config.vision_config, "model_type", None))


def square_image_tokens(config) -> int:
    """The image-token count of one image for a ``square`` layout config (an ``anyres`` one's base tile): the vision
    config's patches by the ``image_tokens`` rule of the family's spec
    (:attr:`tigon.integrations.family_spec.FamilySpec.image_tokens`: Gemma 3's ``mm_tokens_per_image``, InternVL's
    patches times ``downsample_ratio**2``, SmolVLM / Idefics3 / Mistral 3 / Aya Vision's patches over a merge
    factor squared, Llama 4's patches times its vision config's ``pixel_shuffle_ratio**2``, LLaVA's feature
    selection), a token per patch where it has none (PaliGemma, a model type of no registered family)."""
    vision, spec = config.vision_config, _family(config.model_type)
    patches = (_side(vision.image_size) // _side(vision.patch_size)) ** 2
    rule, attr = (spec.image_tokens if spec is not None else None) or (None, None)
    if rule == "count":
        return int(_attr(config, attr))
    if rule == "ratio":
        return int(patches * _attr(config, attr) ** 2)
    if rule == "merge":
        return patches // int(_attr(config, attr)) ** 2
    if rule == "select":  # LLaVA's: the tower's class token (CLIP's), the first feature dropped under "default"
        tower = _tower(config)
        if tower is None or not tower.image_sizes:  # (a tower of image_sizes, Pixtral: its patches)
            cls_token = tower is not None and tower.class_token
            return patches + cls_token - (_attr(config, attr, "default") == "default")
    return patches


def _attr(config, path: str, *default):
    """The config attribute an image-token rule names: ``"downsample_ratio"``, or a dotted path into a sub-config
    (``"vision_config.pixel_shuffle_ratio"``); ``default`` (when given) where an attribute on the way is missing."""
    value = config
    for name in path.split("."):
        value = getattr(value, name, *default)
    return value


def anyres_grid(config) -> tuple[int, int]:
    """The crops ``(rows, columns)`` of an ``anyres`` layout's square image: the best of ``image_grid_pinpoints``
    for it (transformers' ``select_best_resolution``) over the vision config's ``image_size``."""
    from transformers.image_processing_utils import select_best_resolution

    size = _side(config.vision_config.image_size)
    height, width = select_best_resolution((size, size), config.image_grid_pinpoints)
    return height // size, width // size


def anyres_image_tokens(config) -> int:
    """The image-token count of one ``anyres`` image (as the family's processor counts a square image): the base
    tile's (:func:`square_image_tokens`), then the grid's patches with the padding of the longer side removed (and,
    LLaVA-OneVision, scaled down to about ``N`` tiles' patches when more, by its ``vision_aspect_ratio``
    ``"anyres_max_N"``, as its ``pack_image_features``), plus a newline token per row."""
    side = _side(config.vision_config.image_size) // _side(config.vision_config.patch_size)
    rows, cols = anyres_grid(config)
    height, width = side * rows, side * cols
    height, width = height - 2 * ((height - min(height, width)) // 2), width - 2 * ((width - min(height, width)) // 2)
    limit = getattr(config, "vision_aspect_ratio", None)
    ratio = math.sqrt(height * width / (int(limit.removeprefix("anyres_max_")) * side ** 2)) if limit else 1.0
    if ratio > 1.1:
        height, width = int(height // ratio), int(width // ratio)
    return square_image_tokens(config) + height * width + height


FREE_IMAGE_TOKENS = ("grid", "patches")
"""The layouts whose image-token count a caller chooses (:func:`with_images`' ``image_tokens``: the image's size);
every other layout's count is fixed by the config."""


def check_image_tokens(config, image_tokens: int | None) -> None:
    """Refuse an image-token count (``tigon bench --e2e --image-tokens N``) that a model would not use: a text-only
    model's, or one of a family whose count is fixed by its config (not one of :data:`FREE_IMAGE_TOKENS`); None
    passes.

    Raises:
        ConfigError: the message names ``--image-tokens`` and, for a fixed count, says what it is.
    """
    if image_tokens is None:
        return
    model_type = getattr(config, "model_type", None)
    if not is_vision_language(config):
        raise ConfigError(f"--image-tokens applies to vision-language models; model_type {model_type!r} is not one")
    layout = image_layout(config)
    if layout in FREE_IMAGE_TOKENS:
        return
    fixed = {"square": square_image_tokens, "anyres": anyres_image_tokens}.get(layout, lambda _: 1)(config)
    raise ConfigError(f"--image-tokens {image_tokens}: model_type {model_type!r} ({layout!r} image layout) takes "
                      f"{fixed} image token(s) per image, fixed by its config; leave --image-tokens out (it sets the "
                      f"image's size for the {' / '.join(FREE_IMAGE_TOKENS)} layouts only: Qwen-VL, GLM-4V, Gemma 4)")


def image_token_id(config) -> int:
    """The id of the image placeholder token (``image_token_id``, or ``image_token_index`` in older configs)."""
    value = _get(config, "image_token_id", "image_token_index")
    if not isinstance(value, int):
        raise ConfigError(f"model_type {config.model_type!r}: the config has no image_token_id")
    return value


def special_token_ids(config) -> set[int]:
    """Every ``*_token_id`` / ``*_token_index`` value of ``config`` (not its sub-configs): ids random text must not
    hold (a stray image or vision-start token would add an image the batch has no pixels for)."""
    return {v for k, v in vars(config).items() if isinstance(v, int) and not isinstance(v, bool)
            and k.endswith(("_token_id", "_token_index"))}


def grid_size(tokens: int, merge: int) -> tuple[int, int]:
    """``(h, w)`` patches of a one-frame image with about ``tokens`` image tokens after a ``merge x merge`` merge:
    multiples of ``merge``, as square as possible, ``h * w / merge**2 <= max(tokens, 1)``."""
    tokens = max(int(tokens), 1)
    a = max(1, math.isqrt(tokens))
    return a * merge, (tokens // a) * merge


def _image_span(config, layout: str, image_tokens: int) -> list[int]:
    """The token ids one image takes in the text: start token, placeholders, end token (those the family has)."""
    vocab = int(config.get_text_config().vocab_size)
    image = image_token_id(config)
    if layout == "tiles":
        return [image]
    start = _get(config, "vision_start_token_id", "image_start_token_id", "boi_token_index", "boi_token_id")
    end = _get(config, "vision_end_token_id", "image_end_token_id", "eoi_token_index", "eoi_token_id")
    return ([start] if isinstance(start, int) and start < vocab else []) + [image] * image_tokens + \
        ([end] if isinstance(end, int) and end < vocab else [])


def with_images(input_ids: torch.Tensor, config, *, image_tokens: int | None = None, seed: int = 0) -> dict:
    """A vision-language training batch from text token ids: each sequence gets one image (see the module docstring).

    Args:
        input_ids: (batch, seq) int64 token ids (CPU); not modified.
        config: a vision-language transformers config (:func:`is_vision_language`).
        image_tokens: image tokens per image wanted for the ``grid`` and ``patches`` layouts (default
            ``seq // 4``); the other layouts' count is fixed by the config.
        seed: seeds the pixels.

    Returns:
        ``{"input_ids", "labels", "pixel_values", ...}``: the model's forward arguments, CPU tensors, pixels fp32;
        every tensor's first dimension is a multiple of the batch (:func:`take` slices them per sequence).

    Raises:
        ValueError: ``input_ids`` is not a (batch, seq) integer tensor, or ``image_tokens`` < 1.
        ConfigError: an unsupported family (:func:`image_layout`), or ``seq`` too short for the image's tokens
            (the message names ``--seq-len``).
    """
    if not (isinstance(input_ids, torch.Tensor) and input_ids.dim() == 2 and input_ids.dtype == torch.long):
        raise ValueError(f"input_ids must be a (batch, seq) int64 tensor, got "
                         f"{getattr(input_ids, 'dtype', type(input_ids).__name__)} of shape "
                         f"{tuple(getattr(input_ids, 'shape', ()))}")
    if image_tokens is not None and (not isinstance(image_tokens, int) or image_tokens < 1):
        raise ValueError(f"image_tokens must be an integer >= 1 or None, got {image_tokens!r}")
    layout = image_layout(config)
    vision = config.vision_config
    batch, seq = input_ids.shape
    gen = torch.Generator().manual_seed(seed)
    channels = int(_get(vision, "num_channels", "in_channels", "in_chans", default=3))
    extra: dict[str, torch.Tensor] = {}
    if layout == "grid":
        merge, patch = int(vision.spatial_merge_size), _side(vision.patch_size)
        h, w = grid_size(seq // 4 if image_tokens is None else image_tokens, merge)
        n = h * w // merge ** 2
        extra["pixel_values"] = torch.randn(batch * h * w, channels * _side(vision.temporal_patch_size) * patch ** 2,
                                            generator=gen)
        extra["image_grid_thw"] = torch.tensor([[1, h, w]] * batch)
    elif layout == "square":
        n, size = square_image_tokens(config), _side(vision.image_size)
        pixels = torch.randn(batch, channels, size, size, generator=gen)
        extra["pixel_values"] = pixels[:, None] if family_by_name(config.model_type).images_axis else pixels
        tower = _tower(config)
        if tower is not None and tower.image_sizes:
            extra["image_sizes"] = torch.tensor([[size, size]] * batch)
    elif layout == "anyres":
        n, size = anyres_image_tokens(config), _side(vision.image_size)
        rows, cols = anyres_grid(config)
        extra["pixel_values"] = torch.randn(batch, 1 + rows * cols, channels, size, size, generator=gen)
        extra["image_sizes"] = torch.tensor([[size, size]] * batch)
    elif layout == "patches":
        pool, patch = int(vision.pooling_kernel_size), _side(vision.patch_size)
        h, w = grid_size(seq // 4 if image_tokens is None else image_tokens, pool)
        n = h * w // pool ** 2
        extra["pixel_values"] = torch.rand(batch, h * w, channels * patch ** 2, generator=gen)
        xy = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy"), -1).reshape(1, h * w, 2)
        extra["image_position_ids"] = xy.expand(batch, -1, -1).clone()
    else:  # tiles
        n, tiles, size = 1, int(vision.max_num_tiles), int(vision.image_size)
        extra["pixel_values"] = torch.randn(batch, 1, tiles, channels, size, size, generator=gen)
        extra["aspect_ratio_ids"] = torch.full((batch, 1), vision.supported_aspect_ratios.index([1, 1]) + 1)
        mask = torch.zeros(batch, 1, tiles, dtype=torch.long)
        mask[..., 0] = 1
        extra["aspect_ratio_mask"] = mask
        extra["cross_attention_mask"] = mask[:, None].expand(batch, seq, 1, tiles).clone()
    span = _image_span(config, layout, n)
    if len(span) + 1 > seq:
        raise ConfigError(f"--seq-len {seq} is too short for an image of {n} image tokens ({config.model_type}): "
                          f"needs at least {len(span) + 1}")
    ids = input_ids.clone()
    reserved = special_token_ids(config)
    if reserved:
        safe = next(i for i in range(len(reserved) + 1) if i not in reserved)
        ids[torch.isin(ids, torch.tensor(sorted(reserved)))] = safe
    ids[:, 1:1 + len(span)] = torch.tensor(span)
    image = ids == image_token_id(config)
    cls = model_class(config)
    if cls is not None and "mm_token_type_ids" in inspect.signature(cls.forward).parameters:
        extra["mm_token_type_ids"] = image.long()  # 1 marks an image token (Qwen-VL's M-RoPE positions: 5.2x)
    return {"input_ids": ids, "labels": ids.masked_fill(image, IGNORE_INDEX), **extra}


def vision_positions(batch: dict, config) -> int:
    """Positions the vision encoder runs on per sequence of a :func:`with_images` batch: the image's patches (grid:
    before the merge; Mllama: every tile, padded ones too; anyres: every tile)."""
    layout, vision = image_layout(config), config.vision_config
    if layout == "grid":  # every image's patches, one after the other
        return batch["pixel_values"].shape[0] // batch["input_ids"].shape[0]
    if layout == "patches":  # (batch, patches, values)
        return batch["pixel_values"].shape[1]
    patches = (_side(vision.image_size) // _side(vision.patch_size)) ** 2
    if layout == "tiles":
        return patches * int(getattr(vision, "max_num_tiles", 1))
    if layout == "anyres":  # the base image and each tile of the grid
        return patches * (1 + math.prod(anyres_grid(config)))
    return patches


def take(batch: dict, start: int, stop: int) -> dict:
    """Sequences ``start:stop`` of a :func:`with_images` batch: each tensor's rows of those sequences (a tensor of
    ``k * batch`` rows holds ``k`` consecutive rows per sequence, e.g. a grid image's patches)."""
    n = batch["input_ids"].shape[0]
    return {k: v[start * (v.shape[0] // n):stop * (v.shape[0] // n)] for k, v in batch.items()}
