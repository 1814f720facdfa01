"""``tigon.AutoModelForCausalLM``: transformers' auto class, with Tigon applied to the model it builds.

>>> import tigon
>>> model = tigon.AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B", dtype=torch.bfloat16)
>>> print(model.tigon_report)                     # what was replaced, what was skipped and why

The model is built by ``transformers.AutoModelForCausalLM`` exactly as without Tigon; then :func:`tigon.patch` is
applied to that instance (the family spec when the model's family is registered, else the generic matcher). Nothing
outside the model changes (apart from the scoped rotary dispatcher, see :mod:`tigon.integrations.engine`), and
``tigon.unpatch(model)`` gives the plain transformers model back.
"""

from __future__ import annotations

import inspect as _inspect

from .integrations import patch as _patch
from .integrations.plan import check_options
from .integrations.report import PatchReport

PATCH_OPTIONS = tuple(n for n, p in _inspect.signature(_patch).parameters.items() if p.kind == p.KEYWORD_ONLY)
"""The keyword arguments consumed by :func:`tigon.patch` (everything else goes to transformers)."""


def _split(kwargs: dict) -> tuple[dict, dict]:
    """``kwargs`` split into :func:`tigon.patch`'s options and transformers' arguments; the options are checked
    first, so that a bad one is refused before transformers builds or loads the model (:func:`tigon.patch`'s
    TypeError / ValueError, named as there)."""
    tigon_kwargs = {k: kwargs.pop(k) for k in PATCH_OPTIONS if k in kwargs}
    check_options(tigon_kwargs)
    return tigon_kwargs, kwargs


def _patched(model, tigon_kwargs: dict):
    from .integrations import patch

    report: PatchReport = patch(model, **tigon_kwargs)
    model.tigon_report = report
    return model


class AutoModelForCausalLM:
    """Build a Hugging Face causal LM and patch it with Tigon (instance level).

    Every method takes the arguments of the same method of ``transformers.AutoModelForCausalLM`` plus the keyword
    options of :func:`tigon.patch` (:data:`PATCH_OPTIONS`), which are taken out before the call reaches transformers.

    The returned model is the transformers model itself (same class, same parameters) with the
    :class:`~tigon.integrations.report.PatchReport` attached as ``model.tigon_report``.

    Raises:
        ImportError: transformers is not installed.
        TypeError: nothing in the model can be patched (see :func:`tigon.patch`).
        ValueError: ``strict=True`` and something requested cannot be patched (nothing is patched then).
        Anything transformers raises for the same arguments.
    """

    def __init__(self, *args, **kwargs):
        raise OSError("tigon.AutoModelForCausalLM is built with from_pretrained(...) or from_config(config), "
                      "like transformers.AutoModelForCausalLM")

    @staticmethod
    def _hf():
        try:
            from transformers import AutoModelForCausalLM as HFAuto
        except ImportError as e:  # pragma: no cover - depends on the environment
            raise ImportError("tigon.AutoModelForCausalLM needs transformers (pip install 'tigon[hf]')") from e
        return HFAuto

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """``transformers.AutoModelForCausalLM.from_pretrained(...)``, then :func:`tigon.patch` on the result.

        Args:
            pretrained_model_name_or_path: a Hub id or a local directory, as for transformers.
            *model_args, **kwargs: passed to transformers (``dtype``, ``device_map``, ``attn_implementation`` ...),
                except the :func:`tigon.patch` options listed on the class.

        Returns:
            the model, in the dtype / device transformers put it, with ``model.tigon_report``.
        """
        tigon_kwargs, hf_kwargs = _split(dict(kwargs))
        model = cls._hf().from_pretrained(pretrained_model_name_or_path, *model_args, **hf_kwargs)
        return _patched(model, tigon_kwargs)

    @classmethod
    def from_config(cls, config, **kwargs):
        """``transformers.AutoModelForCausalLM.from_config(config, ...)`` (random weights), then :func:`tigon.patch`.

        Args:
            config: a ``transformers.PretrainedConfig`` of a causal-LM architecture.
            **kwargs: passed to transformers (``dtype``, ``attn_implementation``, ``trust_remote_code`` ...), except
                the :func:`tigon.patch` options listed on the class.

        Returns:
            the model with ``model.tigon_report``.
        """
        tigon_kwargs, hf_kwargs = _split(dict(kwargs))
        model = cls._hf().from_config(config, **hf_kwargs)
        return _patched(model, tigon_kwargs)
