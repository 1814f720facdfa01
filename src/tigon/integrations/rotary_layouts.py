"""The rotary layouts a family's module-global rotary function may have, and the Tigon op each runs.

A :class:`~tigon.integrations.family_spec.RopeSpec` names its function's layout; the dispatcher the engine installs in
that global (:func:`tigon.integrations.rotary_forwards.rope_dispatcher`) calls :func:`tigon_call` with the arguments the
attention passed (Hugging Face's usual call, ``(q, k, cos, sin)`` of the rotate-half layout, it serves inline with
the same checks: two Python frames less per call). Each layout is one adapter with the Hugging Face function's
signature: it returns the Tigon result, or None for a call it does not serve (then the original function runs), so a
call that differs from what the family's code does (other arguments, cos / sin of another width) never reaches a
kernel of other semantics.
``unsqueeze_dim`` is taken by keyword only: a fifth positional argument was ``position_ids`` in older transformers.

=================  ==============================================================  ======================
layout             the HF function (transformers modeling file)                    Tigon op
=================  ==============================================================  ======================
``rotate_half``    ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``        ``rope``
                   (Llama and most families; partial: GPT-NeoX's)
``interleaved``    GLM / GLM-4 / GLM-4V's ``apply_rotary_pos_emb``: pairs           ``rope_interleaved``
                   ``(x[2i], x[2i+1])`` over the first ``cos.shape[-1]`` dims
``interleaved_    GLM-4V's ``apply_rotary_pos_emb`` (transformers 5.2x): pairs,      ``rope_interleaved``
expanded``         tables repeat-interleaved (one column per rotated dim)            (``expanded_tables``)
``deinterleave``   DeepSeek-V3's ``apply_rotary_pos_emb_interleave(q, k, cos,       ``rope_interleaved``
                   sin, position_ids=None, unsqueeze_dim=1)``: pairs in, halves out  (``deinterleave=True``)
``half_width``     GPT-OSS's ``apply_rotary_pos_emb``: rotate-half with cos / sin   ``rope`` on
                   of head_dim / 2 columns, one per pair                            ``cat(cos, cos)``
``mrope``          Qwen2-VL / Qwen2.5-VL's ``apply_multimodal_rotary_pos_emb(q, k,  ``mrope``
                   cos, sin, mrope_section, unsqueeze_dim=1)`` (transformers < 5.2x)
``mrope_pairs``    GLM-4V's ``apply_multimodal_rotary_pos_emb(q, k, cos, sin,        ``mrope``
                   mrope_section, unsqueeze_dim=1)`` (transformers < 5.2x):          (``interleaved=True``)
                   mRoPE tables, GLM's interleaved pairs, partial
``complex``        Llama 4 / DeepSeek-V2's ``apply_rotary_emb(xq, xk, freqs_cis)``:  ``rope_interleaved`` on
                   ``view_as_complex`` pairs times ``freqs_cis``, in fp32           ``freqs_cis.real / imag``
``complex_         Llama 4's ``vision_apply_rotary_emb(query, key, freqs_ci)``:     ``rope_interleaved`` on
vision``           the same product, one table for every image: ``freqs_ci``'s      ``freqs_ci.real / imag``
                   ``T * D / 2`` entries viewed as ``(1, T, 1, D / 2)`` against
                   (B, T, H, D) q / k (``reshape_for_broadcast``)
=================  ==============================================================  ======================

The adapters' table conversions (``cat(cos, cos)``, the real and imaginary parts of ``freqs_cis``) touch the (B, T,
head_dim) tables only, a head-count times less memory than q and k.
"""

from __future__ import annotations

import inspect

import torch

from .. import functional as TF

ROPE_OPS: dict[str, str] = {"rotate_half": "rope", "interleaved": "rope_interleaved",
                            "interleaved_expanded": "rope_interleaved",
                            "deinterleave": "rope_interleaved", "half_width": "rope", "mrope": "mrope",
                            "mrope_pairs": "mrope", "complex": "rope_interleaved",
                            "complex_vision": "rope_interleaved"}
"""Each supported layout -> the :mod:`tigon.functional` op its calls run (the report's ``ops``)."""


def _rotate_half(q, k, cos, sin, *, unsqueeze_dim=1, partial):
    if cos.dim() in (2, 3) and (cos.shape[-1] == q.shape[-1] or partial):
        return TF.rope(q, k, cos, sin, None, unsqueeze_dim)  # (positional: no keyword for the DTensor check to read)
    return None


def _interleaved(q, k, cos, sin, *, unsqueeze_dim=1, partial):
    if cos.dim() in (2, 3) and (cos.shape[-1] == q.shape[-1] or partial):
        return TF.rope_interleaved(q, k, cos, sin, unsqueeze_dim)
    return None


def _interleaved_expanded(q, k, cos, sin, *, unsqueeze_dim=1, partial):
    if cos.dim() in (2, 3) and (cos.shape[-1] == q.shape[-1] or partial):
        return TF.rope_interleaved(q, k, cos, sin, unsqueeze_dim, expanded_tables=True)
    return None


def _deinterleave(q, k, cos, sin, position_ids=None, *, unsqueeze_dim=1, partial):
    if cos.dim() in (2, 3) and cos.shape[-1] == q.shape[-1]:  # HF's function rotates every dim
        return TF.rope_interleaved(q, k, cos, sin, unsqueeze_dim, deinterleave=True)
    return None


def _half_width(q, k, cos, sin, *, unsqueeze_dim=1, partial):
    if cos.dim() in (2, 3) and 2 * cos.shape[-1] == q.shape[-1]:
        return TF.rope(q, k, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1),
                       unsqueeze_dim=unsqueeze_dim)
    return None


def _mrope(q, k, cos, sin, mrope_section, *, unsqueeze_dim=1, partial):
    if cos.dim() == 4 and (cos.shape[-1] == q.shape[-1] or partial):
        return TF.mrope(q, k, cos, sin, mrope_section, unsqueeze_dim)
    return None


def _mrope_pairs(q, k, cos, sin, mrope_section, *, unsqueeze_dim=1, partial):
    if cos.dim() == 4 and (cos.shape[-1] == q.shape[-1] or partial):
        return TF.mrope(q, k, cos, sin, mrope_section, unsqueeze_dim, interleaved=True)
    return None


def _complex(xq, xk, freqs_cis, *, partial, head_axis=1):
    if not freqs_cis.is_complex() or freqs_cis.dim() not in (2, 3) or 2 * freqs_cis.shape[-1] != xq.shape[-1]:
        return None
    cos, sin = freqs_cis.real.float(), freqs_cis.imag.float()  # HF multiplies in complex64 (fp32 pairs)
    return TF.rope_interleaved(xq, xk, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1), head_axis)


def _complex_vision(query, key, freqs_ci, *, partial):
    # HF views freqs_ci as (1, T, 1, D / 2) against the (B, T, H, D / 2) pairs of q and k: heads at axis 2
    if not (query.dim() == 4 and freqs_ci.is_complex() and 2 * freqs_ci.numel() == query.shape[1] * query.shape[-1]):
        return None
    return _complex(query, key, freqs_ci.reshape(query.shape[1], -1), partial=partial, head_axis=2)


_ADAPTERS = {"rotate_half": _rotate_half, "interleaved": _interleaved, "interleaved_expanded": _interleaved_expanded,
             "deinterleave": _deinterleave,
             "half_width": _half_width, "mrope": _mrope, "mrope_pairs": _mrope_pairs,
             "complex": _complex, "complex_vision": _complex_vision}
_SIGNATURES = {name: inspect.signature(fn) for name, fn in _ADAPTERS.items()}


_BINDS: dict[tuple, bool] = {}
"""Whether a call of a layout's function binds, by (layout, number of positional arguments, keyword names): binding
depends on nothing else, so :func:`tigon_call` asks ``inspect.Signature.bind`` (~45 Python calls, a few us of host
time per attention forward) once per call form; a handful of entries per process."""


def _binds(layout: str, n_args: int, names: tuple) -> bool:
    key = (layout, n_args, names)
    ok = _BINDS.get(key)
    if ok is None:
        try:
            _SIGNATURES[layout].bind(*(None,) * n_args, **dict.fromkeys(names), partial=False)
            ok = True
        except TypeError:
            ok = False
        _BINDS[key] = ok
    return ok


def tigon_call(layout: str, partial: bool, head_axis: int, args: tuple, kwargs: dict):
    """The Tigon result of a call ``fn(*args, **kwargs)`` of a rotary function of ``layout``, or None when the call
    is not one Tigon serves (arguments the HF function does not take, tables of another shape, q and k of different
    head dims): the caller then runs the original. ``partial``: cos / sin narrower than the head are served (the
    family's code rotates the first ``cos.shape[-1]`` dims, :attr:`RopeSpec.partial_rotary`); ``head_axis``: where
    the heads are in q and k for layouts whose function does not say (``complex``)."""
    ok = _BINDS.get((layout, len(args), tuple(kwargs)))  # (_binds' cache, read inline)
    if not (ok if ok is not None else _binds(layout, len(args), tuple(kwargs))):
        return None
    if len(args) >= 2 and layout != "complex":  # q and k positional (Hugging Face's calls): no binding needed
        q, k = args[0], args[1]
        if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.shape[-1] != k.shape[-1]:
            return None
        return _ADAPTERS[layout](*args, **kwargs, partial=partial)
    bound = _SIGNATURES[layout].bind(*args, **kwargs, partial=partial)
    q, k = tuple(bound.arguments.values())[:2]
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)) or q.shape[-1] != k.shape[-1]:
        return None
    if layout == "complex":
        bound.arguments["head_axis"] = head_axis
    return _ADAPTERS[layout](*bound.args, **bound.kwargs)
