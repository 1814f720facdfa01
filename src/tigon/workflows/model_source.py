"""Where a model comes from, for every command that takes MODEL (``tigon compare --model``, ``inspect``, ``verify``,
``bench``, ``profile``): a preset name (:data:`tigon.presets.PRESETS`), a ``config.json`` file, a checkpoint
directory, or a Hugging Face Hub id whose snapshot is already in the local Hugging Face cache (``HF_HUB_CACHE``,
``HF_HOME``).

Nothing here touches the network: a Hub id is looked up in the cache only (``huggingface_hub.try_to_load_from_cache``)
and then read from its snapshot directory with ``local_files_only=True``; an id that is not cached is an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import presets as _presets
from .errors import ConfigError, error_text

KINDS = ("preset", "config", "checkpoint", "hub")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
"""The file names transformers loads weights from (``SAFE_WEIGHTS_NAME``, ``WEIGHTS_NAME`` and their indexes)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


@dataclass(frozen=True)
class ModelSource:
    """Where a model config (and maybe weights and a tokenizer) come from.

    kind: one of :data:`KINDS`. path: the preset name, or the absolute path of the ``config.json`` file ("config"),
    of the checkpoint directory ("checkpoint") or of the Hub id's cached snapshot directory ("hub").
    hub_id: the Hub id ("hub" only).
    """

    kind: str
    path: str
    hub_id: str | None = None

    def __str__(self) -> str:
        """``preset:tiny``, ``config:/abs/config.json``, ``checkpoint:/abs/dir`` or ``hub:org/name``."""
        return f"{self.kind}:{self.hub_id or self.path}"

    @property
    def directory(self) -> str | None:
        """The directory holding the config (and the weights and tokenizer, if any); None for a preset."""
        if self.kind == "preset":
            return None
        return os.path.dirname(self.path) if self.kind == "config" else self.path

    @property
    def config_file(self) -> str | None:
        """The path of the ``config.json`` to read; None for a preset."""
        if self.kind == "preset":
            return None
        return self.path if self.kind == "config" else os.path.join(self.path, "config.json")

    @property
    def has_weights(self) -> bool:
        """Whether a checkpoint / Hub snapshot directory holds weights (:data:`WEIGHT_FILES`); a config file or a
        preset never does (their models get random weights)."""
        return self.kind in ("checkpoint", "hub") and any(
            os.path.exists(os.path.join(self.path, name)) for name in WEIGHT_FILES)

    @property
    def has_tokenizer(self) -> bool:
        """Whether the source's directory holds tokenizer files (:data:`TOKENIZER_FILES`)."""
        return self.directory is not None and any(
            os.path.exists(os.path.join(self.directory, name)) for name in TOKENIZER_FILES)


def hub_snapshot(hub_id: str) -> str | None:
    """The directory of ``hub_id``'s cached snapshot (revision ``main``) when its ``config.json`` is in the local
    Hugging Face cache, else None. Never downloads; None also when huggingface_hub is not installed or ``hub_id`` is
    not of the form ``name`` / ``org/name``."""
    if not isinstance(hub_id, str) or not _HUB_ID.fullmatch(hub_id) or "--" in hub_id or ".." in hub_id:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return None
    try:
        found = try_to_load_from_cache(hub_id, "config.json")
    except Exception:  # an id huggingface_hub refuses
        return None
    return os.path.dirname(found) if isinstance(found, str) else None


def _hub_cache() -> str:
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover
        return "the Hugging Face cache"
    return str(constants.HF_HUB_CACHE)


def resolve_source(model: str, arg: str | None = None, presets: bool = True) -> ModelSource:
    """Where MODEL comes from; reads no file (checks that files exist). Order: preset name (when ``presets``), an
    existing file (a ``config.json``), an existing directory (must hold ``config.json``), a Hub id in the local cache.

    Args:
        model: the MODEL argument. arg: the flag that took it (``"--model"``) for error messages, or None.
        presets: whether preset names are accepted.

    Raises:
        ConfigError: ``model`` is not a string, a directory without ``config.json``, or none of the above (the
            message names the cache directory that was searched; nothing is downloaded).
    """
    label = f"{arg} {model}" if arg else repr(model)
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{label}: expected a preset name, a config.json, a checkpoint directory or a Hub id")
    if presets and model in _presets.PRESETS:
        return ModelSource("preset", model)
    if os.path.isfile(model):
        return ModelSource("config", os.path.abspath(model))
    if os.path.isdir(model):
        if not os.path.isfile(os.path.join(model, "config.json")):
            raise ConfigError(f"{label}: directory has no config.json")
        return ModelSource("checkpoint", os.path.abspath(model))
    snapshot = hub_snapshot(model)
    if snapshot is not None:
        return ModelSource("hub", snapshot, hub_id=model)
    preset = f"a preset ({', '.join(_presets.PRESETS)}), " if presets else ""
    raise ConfigError(f"{label} is neither {preset}an existing config.json / checkpoint directory, nor a Hub id in "
                      f"the local Hugging Face cache ({_hub_cache()}; nothing is downloaded)")


def load_model_config(model: str, arg: str | None = None, presets: bool = True):
    """The ``transformers`` config of MODEL, and where it came from. Reads one JSON file at most; no weights.

    Args:
        model, arg, presets: as for :func:`resolve_source`.

    Returns:
        ``(config, ModelSource)``.

    Raises:
        ConfigError: :func:`resolve_source` fails, or transformers cannot read the config (unknown ``model_type``,
            invalid JSON).
    """
    source = resolve_source(model, arg, presets)
    if source.kind == "preset":
        return _presets.build_config(model), source
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source.path, local_files_only=True)
    except Exception as e:  # OSError, ValueError, KeyError, JSONDecodeError ...
        raise ConfigError(f"{f'{arg} ' if arg else ''}{model}: cannot read a model config: {error_text(e)}") from e
    return config, source


def model_config(model: str, layers: int | None = None, arg: str | None = None, presets: bool = True):
    """:func:`load_model_config`, keeping the first ``layers`` decoder layers (None: all of them).

    Returns:
        ``(config, ModelSource)``.

    Raises:
        ConfigError: as :func:`load_model_config`, or ``layers`` outside 1 .. the model's layer count.
    """
    config, source = load_model_config(model, arg, presets)
    try:
        return _presets.keep_layers(config, layers), source
    except ValueError as e:
        raise ConfigError(str(e)) from e
