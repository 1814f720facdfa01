"""What ``tigon bench`` reads of MODEL (:mod:`tigon.workflows.bench`): its config dict, the shape of each op at its
sizes, and the ops it times by default (those :func:`tigon.patch` runs in the model, from the dry run that ``tigon
verify --model`` reads too)."""

from __future__ import annotations

import json
import os

from .. import ops as _ops
from .model_shapes import shapes_from_config as _model_shapes
from .model_shapes import text_config


def shapes_from_config(cfg, tokens: int = 16384, batch: int = 4, max_vocab: int | None = None) -> dict[str, dict]:
    """Each op's shape (its record's ``shape_of``) for ``tokens`` tokens in ``batch`` sequences of a model config
    (a transformers config or its dict; see :func:`tigon.workflows.model_shapes.shapes_from_config`), the
    vocabulary capped at ``max_vocab`` (None: no cap).

    Raises:
        ConfigFieldError: a required config field is missing.
    """
    model, _ = _model_shapes(cfg, tokens, batch=batch, max_vocab=max_vocab)
    return {name: spec.shape_of(model) for name, spec in _ops.registry().items()}


def model_ops(model: str, notes: list[str] | None = None) -> list[str]:
    """The ops :func:`tigon.patch` runs in MODEL with its default options, in registry order: those its replacements
    declare in the dry run on the weightless model (:func:`tigon.workflows.dry_run.model_ops`, the list ``tigon
    verify --model`` checks; a vision-language model's towers included). MODEL as for :func:`config_dict`.

    Fallback: every op of the registry, with a note appended to ``notes``, only where the dry run cannot be done:
    transformers cannot read MODEL's config or build a model of it (a ``model_type`` the installed transformers
    lacks, a model of custom code). The op benchmark needs nothing but the config's sizes (:func:`config_dict`), so
    such a model is still benchmarked, on every op.

    Raises:
        ConfigError: MODEL is not a preset, file, directory or cached Hub id; tigon.patch refuses the model, or
            replaces nothing in it that runs an op of the registry (the message says to name the ops with --op).
    """
    from .dry_run import PatchRejected
    from .dry_run import model_ops as patched_ops
    from .errors import ConfigError
    from .model_source import load_model_config, resolve_source

    resolve_source(model, "--model")  # (an unknown MODEL is an error, not a fallback)
    try:
        hf_config, _ = load_model_config(model, "--model")
        return patched_ops(hf_config)
    except PatchRejected as e:
        raise ConfigError(f"--model {model}: {e}; name the ops to time with --op (or --op all)") from e
    except ConfigError as e:  # transformers cannot read the config or build the model: no dry run
        if notes is not None:
            notes.append(f"ops: every op of the registry (tigon.patch's dry run is not possible here: {e})")
        return list(_ops.registry())


def shapes_config(model: str, config: dict):
    """The config :func:`shapes_from_config` reads MODEL's sizes from: transformers' config of MODEL where
    transformers reads it (:func:`tigon.workflows.model_source.load_model_config`: the class's defaults and attribute
    aliases, as ``tigon verify --model`` and the dry run of :func:`model_ops` read it: DeepSeek's ``head_dim`` is its
    ``qk_rope_head_dim``, GPT-2's ``n_embd`` its ``hidden_size``), else ``config``, MODEL's ``config.json`` as
    :func:`config_dict` gives it (a ``model_type`` the installed transformers lacks)."""
    from .errors import ConfigError
    from .model_source import load_model_config

    try:
        return load_model_config(model, "--model")[0]
    except ConfigError:
        return config


def ops_not_run_note(model: str, ops: list[str]) -> str | None:
    """A note on the ops of ``ops`` (named with ``--op``) that :func:`tigon.patch` does not run in MODEL (its dry run,
    :func:`model_ops`; none where tigon.patch refuses the model), which bench times at the model's shapes all the
    same; None when it runs them all, or when no dry run can be done."""
    from .errors import ConfigError

    try:
        runs = model_ops(model)
    except ConfigError:  # tigon.patch refuses the model, or replaces nothing that runs an op
        runs = []
    missing = [op for op in ops if op not in runs]
    if not missing:
        return None
    return (f"{', '.join(missing)}: not run by tigon.patch in {model} (it runs "
            f"{', '.join(runs) if runs else 'no op there'}); timed at the model's shapes as asked")


def config_dict(model: str, text: bool = True) -> tuple[dict, dict]:
    """(HF config dict, description) of ``model``: a preset name, a ``config.json`` file, a checkpoint dir or a Hub
    id in the local cache (:func:`tigon.workflows.model_source.resolve_source`). A multimodal config gives its text
    decoder's dict (``text_config``), or the whole dict with ``text=False``.

    Raises:
        ConfigError: not a preset, file, directory or cached Hub id with a readable config.json.
    """
    from .. import presets
    from .errors import ConfigError
    from .model_source import resolve_source

    source = resolve_source(model, "--model")
    if source.kind == "preset":
        p = presets.get_preset(model)
        return dict(p["config"], model_type=p["model_type"]), {"source": f"preset:{model}"}
    path = source.config_file
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--model {model}: cannot read {path}: {e}") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"--model {model}: {path} is not a JSON object")
    return text_config(cfg) if text else cfg, {"source": os.path.abspath(path)}  # multimodal: the text decoder's
