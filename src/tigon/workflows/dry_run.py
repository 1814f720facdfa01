"""What :func:`tigon.patch` does to a model, found without loading it: the model built from its config on PyTorch's
``meta`` device (modules and parameter shapes, no weights read or allocated), patched at instance level by the one
patch engine, and unpatched again.

``tigon inspect`` reports it; ``tigon verify --model`` checks the ops it runs and ``tigon bench --model`` times
them (both from :func:`model_ops`); ``tigon compare`` and ``tigon profile`` read it before training. The engine
decides on the weightless model what it decides on the loaded one (the generic matcher probes meta modules on CPU
stand-ins; see :mod:`tigon.integrations.generic`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

import torch

from .errors import ConfigError, error_text


class PatchRejected(ConfigError):
    """``tigon.patch`` refused the model (it raised TypeError or ValueError: no supported family and nothing the
    generic matcher recognises, a ``strict`` problem ...); the message is tigon.patch's."""


def rejected(e: Exception) -> PatchRejected:
    """The :class:`PatchRejected` for tigon.patch's TypeError / ValueError ``e`` (its message on one line)."""
    msg = " ".join(str(e).split())
    return PatchRejected(msg if msg.startswith("tigon.patch") else f"tigon.patch does not support this model: {msg}")


def build_meta_model(config) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_config(config)`` on the meta device (no memory, no weights);
    ``AutoModelForImageTextToText`` for a vision-language config (:func:`tigon.workflows.multimodal.auto_class`).

    Raises:
        ConfigError: the config does not describe a causal language model transformers can build.
    """
    from .multimodal import auto_class

    try:
        with torch.device("meta"):
            return auto_class(config).from_config(config)
    except Exception as e:  # ValueError, AssertionError (a pad_token_id beyond the vocabulary), RuntimeError ...
        raise ConfigError(f"cannot build a causal LM from this config ({type(config).__name__}): "
                          f"{type(e).__name__}: {error_text(e)}") from e


@contextlib.contextmanager
def dry_run(config, patch_fn: Callable | None = None, unpatch_fn: Callable | None = None, *,
            lora_rank: int | None = None) -> Iterator[tuple]:
    """``with dry_run(config) as (model, report):`` the weightless model of ``config`` patched by
    :func:`tigon.patch` (instance level, default options) and its :class:`~tigon.integrations.PatchReport`; the
    model is unpatched on leaving, so nothing of the process's state changes (the rotary dispatcher the patch
    installs is removed again).

    Args:
        config: a transformers config of a causal LM.
        patch_fn, unpatch_fn: replace :func:`tigon.patch` / :func:`tigon.unpatch` (for tests).
        lora_rank: wrap the model first as ``tigon bench --e2e --lora R`` does
            (:func:`tigon.workflows.lora.with_lora`: PEFT LoRA of that rank on the projections of
            :data:`~tigon.workflows.lora.LORA_TARGETS` it has), so that the report covers the LoRA layers.

    Raises:
        ConfigError: the model cannot be built (:func:`build_meta_model`), or ``lora_rank`` is given and PEFT is
            not installed or finds none of the target projections.
        PatchRejected: tigon.patch refuses the model.
    """
    if patch_fn is None or unpatch_fn is None:
        import tigon

        patch_fn = patch_fn or tigon.patch
        unpatch_fn = unpatch_fn or tigon.unpatch
    model = build_meta_model(config)
    if lora_rank is not None:
        model = _with_lora(model, lora_rank)
    try:
        report = patch_fn(model)
    except (TypeError, ValueError) as e:
        raise rejected(e) from e
    try:
        yield model, report
    finally:
        unpatch_fn(model)


def model_ops(config, registry: Mapping | None = None, *, lora_rank: int | None = None) -> list[str]:
    """The ops (names of ``registry``, default :func:`tigon.ops.registry`, in its order) that :func:`tigon.patch` runs
    in the model of ``config`` with its default options.

    They are those its replacements declare (:attr:`~tigon.integrations.report.PatchEntry.ops`) in :func:`dry_run`
    on the weightless model: what the patch report says runs, the source of "the ops a model calls" for every tool
    (``tigon verify --model``, ``tigon bench --model``). A replacement's ``checkpoint_ops`` (what it runs instead
    under activation checkpointing, e.g. ``swiglu`` for an MLP that runs ``glu_linear``) and opt-in options
    (``cross_entropy=True``) are not default runs, so not among them.

    Args:
        config: a transformers config of a causal LM or a vision-language model.
        registry: op name -> spec (default :func:`tigon.ops.registry`).
        lora_rank: as for :func:`dry_run` (the LoRA ops join them).

    Raises:
        ConfigError: as :func:`dry_run` (the model cannot be built; LoRA problems).
        PatchRejected: tigon.patch refuses the model, or replaces nothing in it that runs an op of ``registry`` (the
            message names what it skipped).
    """
    if registry is None:
        from ..ops import registry as _registry

        registry = _registry()
    with dry_run(config, lora_rank=lora_rank) as (_, report):
        used = {op for e in report.replaced for op in e.ops}
    ops = [op for op in registry if op in used]
    if not ops:
        skipped = sorted({f"{e.kind} ({e.detail})" for e in report.skipped})
        raise PatchRejected("tigon.patch replaces nothing there that runs a Tigon op"
                            + (f"; it skips {'; '.join(skipped)}" if skipped else ""))
    return ops


def _with_lora(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """The weightless ``model`` wrapped by :func:`tigon.workflows.lora.with_lora` (PEFT LoRA of ``rank``).

    Raises:
        ConfigError: PEFT is not installed, or it finds none of the target projections in the model.
    """
    from .lora import LORA_TARGETS, check_lora, with_lora

    check_lora(rank)
    try:
        return with_lora(model, rank)
    except ValueError as e:  # PEFT: "Target modules {...} not found in the base model"
        raise ConfigError(f"--lora {rank}: PEFT found none of {', '.join(LORA_TARGETS)} in this model: "
                          f"{error_text(e)}") from e
