"""The causal mask of a patched model under ``torch.compile``: ``is_causal`` where there is no padding and no packing.

**Why.** transformers' sdpa attention skips building the causal mask, and calls
``scaled_dot_product_attention(..., is_causal=True)`` instead, when nothing is padded or packed and the query spans
the keys. While Dynamo traces, transformers 5.x turns that skip off twice over, so a compiled model gets a
materialised (batch, 1, T, T) mask: the attention kernel then reads the mask and skips none of the masked blocks.

1. ``transformers.masking_utils._ignore_causal_mask_sdpa`` (consulted when the model keeps a KV cache, e.g.
   ``use_cache=True`` in training) refuses the skip under Dynamo on torch < 2.14 (its comment: "This requires
   torch>=2.14", pytorch#176499, because Dynamo folded ``torch.compiler.is_exporting()`` to True).
2. ``transformers.masking_utils.find_packed_sequence_indices`` (consulted when the model gets no cache and no
   ``attention_mask``: every training step with ``use_cache=False``, Tigon's benchmarks and gradient checkpointing)
   cannot read the position ids while tracing, so it always returns a packed-sequence mask under Dynamo ("Sadly
   this is a dynamic control flow"), on every torch version; the skip is then never taken. This is the path the
   decoder's own ``position_ids = arange(T)`` takes, one sequence per row.

On an H100 (Llama-3.2-1B, 16 layers, 4 x 2048, bf16, ``use_cache=False``) the compiled step spent 23.2 + 8.8 ms in
cuDNN's attention backward + forward against 8.9 + under 3.6 ms for the same kernels in the eager step
(``benchmarks/results/h100/README.md``, eighteenth run), which is why ``torch.compile`` gained nothing there.

**What.** While a model patched by :func:`tigon.patch` lives, both checks are wrapped (:class:`CausalMaskSwitch`),
each where this transformers / torch needs it (:func:`problem`, probed once per process):

* ``_ignore_causal_mask_sdpa``: under Dynamo, with no padding mask at all (``attention_mask=None``), a query as
  long as the keys, no sliding window reached and a plain-int offset, the skip is taken, as transformers itself
  does on torch >= 2.14 and in eager mode.
* ``find_packed_sequence_indices``: under Dynamo, while a patched model's decoder (``get_decoder()``) runs a call
  whose caller passed neither ``position_ids`` nor ``attention_mask`` (so the decoder builds ``arange(T)``
  positions itself: nothing is packed), it returns None, the answer transformers gives eagerly for those positions.
  A forward pre-hook and hook on that decoder say which call runs (they do nothing outside Dynamo). Caller-given
  ``position_ids`` (a packing collator's) keep transformers' packed mask. Vision-language models (their decoders
  build multimodal positions) are left out.

Every other call runs transformers' own check. Outside ``torch.compile`` nothing changes. A padding mask of all ones
(a collator's) is still materialised: reading its values would break the graph.

**Scope and limits.** The wrappers are module globals of ``transformers.masking_utils`` (looked up there at each
call), installed by the first patched model and restored when the last one is unpatched or freed; under
``torch.compile`` the first also applies to unpatched models of the process (the skip they would take in eager
mode). A model exported with ``torch.export`` while the wrappers are in place hard-codes ``is_causal=True`` for a
query as long as the keys (transformers' reason to keep the skip off while exporting): unpatch first to export.
``TIGON_COMPILE_CAUSAL_SKIP=0`` turns both off (read at patch time).
"""

from __future__ import annotations

import inspect
import os
import weakref

import torch

FUNCTION = "_ignore_causal_mask_sdpa"
"""The transformers check of the KV-cache path, in ``transformers.masking_utils``."""
PACKED = "find_packed_sequence_indices"
"""The transformers check of the no-cache path (packed sequences from the position ids), same module."""
FIXED_IN = (2, 14)
"""The torch version from which transformers takes :data:`FUNCTION`'s skip under ``torch.compile`` itself."""
ARGS = ("padding_mask", "q_length", "kv_length", "q_offset", "kv_offset", "local_attention_size")
"""The parameters the :data:`FUNCTION` wrapper reads, in transformers' order (5.17 to 5.25)."""
PACKED_ARGS = ("position_ids",)
"""The parameters of :data:`PACKED` (5.17 to 5.25)."""


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _module():
    try:
        from transformers import masking_utils
    except ImportError:
        return None
    return masking_utils


def _original(mod, name: str, args: tuple[str, ...]):
    """transformers' function ``name`` (unwrapped), or the reason it cannot be wrapped."""
    fn = getattr(mod, name, None)
    if fn is None:
        return None, f"transformers.masking_utils.{name} not found"
    original = getattr(fn, "__wrapped__", fn)
    if tuple(inspect.signature(original).parameters) != args:
        return None, f"transformers.masking_utils.{name} has other arguments than {args}"
    return original, None


def skip_problem() -> str | None:
    """Why :data:`FUNCTION` is not wrapped here, or None when it is (or would be)."""
    if _torch_version() >= FIXED_IN:
        return f"torch {torch.__version__} takes the skip under torch.compile itself"
    mod = _module()
    if mod is None:
        return "no transformers"
    original, why = _original(mod, FUNCTION, ARGS)
    if why is None and not _materialises(original):
        why = "this transformers takes the skip under torch.compile itself"
    return why


def packed_problem() -> str | None:
    """Why :data:`PACKED` is not wrapped here, or None when it is (or would be)."""
    mod = _module()
    if mod is None:
        return "no transformers"
    original, why = _original(mod, PACKED, PACKED_ARGS)
    if why is None and not _packs(original):
        why = "this transformers finds unpacked positions under torch.compile itself"
    return why


def problem() -> str | None:
    """Why neither wrapper is installed here, or None when one or both are (or would be)."""
    if os.environ.get("TIGON_COMPILE_CAUSAL_SKIP", "1") == "0":
        return "TIGON_COMPILE_CAUSAL_SKIP=0"
    skip, packed = skip_problem(), packed_problem()
    return None if skip is None or packed is None else f"{FUNCTION}: {skip}; {PACKED}: {packed}"


_PROBED: dict = {}


def _traced(fn, probe) -> bool:
    """``probe(fn, x)`` (a bool) under Dynamo on ``x = arange(8)[None]``, once per function and process
    (``backend="eager"``, no compiler involved; a failing trace: False)."""
    if fn not in _PROBED:
        out: dict = {}

        def run(x):
            out["answer"] = probe(fn, x)
            return x + 1

        try:
            torch.compile(run, backend="eager", fullgraph=True)(torch.arange(8)[None])
            _PROBED[fn] = out.get("answer") is True
        except Exception:  # noqa: BLE001 - no Dynamo here: nothing to fix
            _PROBED[fn] = False
    return _PROBED[fn]


def _materialises(fn) -> bool:
    """Whether ``fn`` (transformers' :data:`FUNCTION`) refuses the skip under Dynamo for an unpadded square causal
    mask. transformers 5.17 on torch 2.11 refuses it (the H100 run); 5.25 on torch 2.13 takes it."""
    return _traced(fn, lambda f, x: f(None, 8, 8, 0, 0) is False)


def _packs(fn) -> bool:
    """Whether ``fn`` (transformers' :data:`PACKED`) returns a packed-sequence mask under Dynamo for one plain
    sequence (``arange(8)``): transformers 5.17 and 5.25 do, on every torch."""
    return _traced(fn, lambda f, x: f(x) is not None)


class _Calls:
    """What the patched decoder call being traced was given: ``own_positions`` is True while a call whose caller
    passed neither ``position_ids`` nor ``attention_mask`` runs under Dynamo (set and cleared by :func:`_enter` /
    :func:`_leave`, which Dynamo traces as side effects of the compiled forward)."""

    def __init__(self):
        self.own_positions = False


CALLS = _Calls()


def _enter(module, args, kwargs):
    if torch.compiler.is_compiling():
        CALLS.own_positions = (len(args) <= 1 and kwargs.get("position_ids") is None
                               and kwargs.get("attention_mask") is None)


def _leave(module, args, kwargs, output):
    if torch.compiler.is_compiling():
        CALLS.own_positions = False


_HOOK_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Decoder -> the ids its :func:`_enter` / :func:`_leave` hooks had when first registered."""


def _hook(found: torch.nn.Module) -> tuple:
    """Register :func:`_enter` (forward pre-hook) and :func:`_leave` (forward hook, always called) on the decoder
    ``found``; returns their handles. A decoder hooked before gets them back under the same ids: ``torch.compile``
    guards on the hook ids, and new ones at every patch would recompile a compiled model each time it is unpatched
    and patched again (after 8 recompiles Dynamo runs the forward eagerly). The ids are unique to these hooks
    (torch never hands an id out twice), and they are inserted as ``register_forward_*_hook`` inserts them."""
    ids = _HOOK_IDS.get(found)
    if ids is None or ids[0] in found._forward_pre_hooks or ids[1] in found._forward_hooks:
        handles = (found.register_forward_pre_hook(_enter, with_kwargs=True),
                   found.register_forward_hook(_leave, with_kwargs=True, always_call=True))
        _HOOK_IDS[found] = tuple(h.id for h in handles)
        return handles
    from torch.utils.hooks import RemovableHandle

    pre = RemovableHandle(found._forward_pre_hooks, extra_dict=found._forward_pre_hooks_with_kwargs)
    post = RemovableHandle(found._forward_hooks,
                           extra_dict=[found._forward_hooks_with_kwargs, found._forward_hooks_always_called])
    pre.id, post.id = ids
    found._forward_pre_hooks[pre.id] = _enter
    found._forward_pre_hooks_with_kwargs[pre.id] = True
    found._forward_hooks[post.id] = _leave
    found._forward_hooks_with_kwargs[post.id] = True
    found._forward_hooks_always_called[post.id] = True
    return pre, post


def decoder(model: torch.nn.Module) -> torch.nn.Module | None:
    """The module of ``model`` that builds the position ids and the mask (``get_decoder()``, through a PEFT
    wrapper), or None: none found, or a vision-language model (its decoder builds multimodal positions)."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    if getattr(getattr(base, "config", None), "vision_config", None) is not None:
        return None
    try:
        found = base.get_decoder()
    except Exception:  # noqa: BLE001 - no decoder to watch
        return None
    return found if isinstance(found, torch.nn.Module) else None


class CausalMaskSwitch:
    """The wrappers installed in ``transformers.masking_utils`` and the models that keep them.

    ``skip(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None) -> bool`` (for
    :data:`FUNCTION`, None where not needed): True (skip the mask: sdpa's ``is_causal``) under Dynamo when
    ``padding_mask`` is None, ``q_length == kv_length > 1``, ``q_offset`` is not a tensor and ``kv_length`` is below
    ``local_attention_size`` (when given); otherwise transformers' own answer.

    ``packed(position_ids) -> Tensor | None`` (for :data:`PACKED`, None where not needed): None under Dynamo while a
    watched decoder runs a call that builds its own positions (:class:`_Calls`); otherwise transformers' own answer.
    """

    def __init__(self, module):
        self.module = module
        self.live: weakref.WeakSet = weakref.WeakSet()
        self.hooks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.originals: dict = {}
        self.wrappers: dict = {}
        if skip_problem() is None:
            original = self.originals[FUNCTION] = _original(module, FUNCTION, ARGS)[0]

            def skip(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
                if (padding_mask is None and torch.compiler.is_compiling() and not isinstance(q_offset, torch.Tensor)
                        and isinstance(q_length, int) and q_length == kv_length and q_length > 1
                        and (local_attention_size is None or kv_length < local_attention_size)):
                    return True
                return original(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)

            self.wrappers[FUNCTION] = skip
        if packed_problem() is None:
            find = self.originals[PACKED] = _original(module, PACKED, PACKED_ARGS)[0]

            def packed(position_ids):
                if CALLS.own_positions and torch.compiler.is_compiling():
                    return None
                return find(position_ids)

            self.wrappers[PACKED] = packed
        for name, wrapper in self.wrappers.items():
            wrapper.__wrapped__ = self.originals[name]
            wrapper.__doc__ = self.originals[name].__doc__

    def fits(self, module) -> bool:
        """Whether a new switch of ``module`` would wrap what this one wraps: the same functions of transformers,
        each where this transformers / torch needs it (:func:`skip_problem`, :func:`packed_problem`)."""
        wanted = {name for name, why in ((FUNCTION, skip_problem()), (PACKED, packed_problem())) if why is None}
        return (self.module is module and set(self.wrappers) == wanted
                and all(getattr(module, name) is original for name, original in self.originals.items()))

    def install(self) -> None:
        for name, wrapper in self.wrappers.items():
            if getattr(self.module, name) is not wrapper:
                setattr(self.module, name, wrapper)

    def watch(self, model: torch.nn.Module) -> bool:
        """Hook ``model``'s decoder (:func:`decoder`) for the packed-sequence wrapper; False when there is none."""
        found = decoder(model) if PACKED in self.wrappers else None
        if found is None:
            return False
        if model not in self.hooks:
            self.hooks[model] = _hook(found)
        return True

    def unwatch(self, model: torch.nn.Module) -> None:
        for handle in self.hooks.pop(model, ()):
            handle.remove()

    def release(self) -> bool:
        """Restore transformers' functions when no live model needs the wrappers; True when restored."""
        if self.live:
            return False
        for name, wrapper in self.wrappers.items():
            if getattr(self.module, name) is wrapper:
                setattr(self.module, name, self.originals[name])
        return True


_SWITCH: CausalMaskSwitch | None = None
_SPARE: CausalMaskSwitch | None = None
"""The last released switch, taken again by :func:`hold` while transformers' functions are still those it wraps:
its wrappers stay the same objects, so a compiled model unpatched and patched again is not recompiled for them."""


def hold(model: torch.nn.Module) -> str:
    """Install the wrappers for ``model`` (a patched model using sdpa attention) and say what was done, for the
    patch report's notes."""
    global _SWITCH, _SPARE
    why = problem()
    if why is not None:
        return f"causal mask under torch.compile: transformers' own (wrappers not installed: {why})"
    if _SWITCH is None or _SWITCH.module is not _module():
        spare, _SPARE = _SPARE, None
        _SWITCH = spare if spare is not None and spare.fits(_module()) else CausalMaskSwitch(_module())
    _SWITCH.live.add(model)
    _SWITCH.install()
    paths = []
    if FUNCTION in _SWITCH.wrappers:
        paths.append("with a KV cache")
    if _SWITCH.watch(model):
        paths.append("without one, where the caller passes no position_ids")
    if not paths:
        return ("causal mask under torch.compile: transformers' own (this model's decoder builds multimodal positions "
                f"or has no get_decoder(); {FUNCTION}: {skip_problem()})")
    return ("causal mask under torch.compile: sdpa's is_causal where attention_mask is None and the query spans the "
            f"keys ({'; '.join(paths)}), as transformers does eagerly (transformers.masking_utils.{FUNCTION} / "
            f"{PACKED} wrapped while a patched model lives; TIGON_COMPILE_CAUSAL_SKIP=0 turns it off)")


def release(model: torch.nn.Module | None = None) -> bool:
    """Drop ``model``'s hold (None: only look for models freed without :func:`tigon.unpatch`); restore
    transformers' functions when no live model holds them. True when they were restored now."""
    global _SWITCH, _SPARE
    if _SWITCH is None:
        return False
    if model is not None:
        _SWITCH.live.discard(model)
        _SWITCH.unwatch(model)
    if _SWITCH.release():
        _SWITCH, _SPARE = None, _SWITCH
        return True
    return False


def installed() -> bool:
    """Whether one of the wrappers is transformers' function now."""
    mod = _module()
    return _SWITCH is not None and mod is not None and any(
        getattr(mod, name, None) is wrapper for name, wrapper in _SWITCH.wrappers.items())
