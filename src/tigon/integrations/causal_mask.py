"""The causal mask of a patched model under ``torch.compile``: ``is_causal`` where there is no padding.

**Why.** transformers' sdpa attention skips building the causal mask, and calls
``scaled_dot_product_attention(..., is_causal=True)`` instead, when nothing is padded and the query spans the keys
(``transformers.masking_utils._ignore_causal_mask_sdpa``). While Dynamo traces, transformers 5.x turns that skip
off on torch < 2.14 (its comment: "This requires torch>=2.14", pytorch#176499, because Dynamo folded
``torch.compiler.is_exporting()`` to True), so a compiled model gets a materialised (batch, 1, T, T) mask: the
attention kernel then reads the mask and skips none of the masked blocks. On an H100 (Llama-3.2-1B, 16 layers,
4 x 2048, bf16) the compiled step spent 23.2 + 8.8 ms in cuDNN's attention backward + forward against 8.9 + under
3.6 ms for the same kernels in the eager step (``benchmarks/results/h100/README.md``, eighteenth run), which is
why ``torch.compile`` gained nothing there.

**What.** While a model patched by :func:`tigon.patch` lives, transformers' check is wrapped
(:class:`CausalMaskSwitch`): under Dynamo, with no padding mask at all (``attention_mask=None``), a query as long
as the keys, no sliding window reached and a plain-int offset, the skip is taken, as transformers itself does on
torch >= 2.14 and in eager mode; every other call runs transformers' own check. Outside ``torch.compile`` nothing
changes. A padding mask of all ones (a collator's) is still materialised: reading its values would break the graph.

**Scope and limits.** The wrapper is the module global of ``transformers.masking_utils`` (the function is looked up
there at each call), installed by the first patched model and restored when the last one is unpatched or freed;
under ``torch.compile`` it also applies to unpatched models of the process (the skip they would take in eager
mode). A model exported with ``torch.export`` while the wrapper is in place hard-codes ``is_causal=True`` for a
query as long as the keys (transformers' reason to keep the skip off while exporting): unpatch first to export.
``TIGON_COMPILE_CAUSAL_SKIP=0`` turns the wrapper off (read at patch time). Installed only where it applies
(:func:`problem`): torch < 2.14 and a transformers whose ``masking_utils`` has the check with its usual arguments
and refuses the skip while Dynamo traces (traced once per process to find out: transformers 5.17 on torch 2.11
does, 5.25 on torch 2.13 does not).
"""

from __future__ import annotations

import inspect
import os
import weakref

import torch

FUNCTION = "_ignore_causal_mask_sdpa"
"""The transformers function wrapped, in ``transformers.masking_utils``."""
FIXED_IN = (2, 14)
"""The torch version from which transformers takes the skip under ``torch.compile`` itself."""
ARGS = ("padding_mask", "q_length", "kv_length", "q_offset", "kv_offset", "local_attention_size")
"""The parameters the wrapper reads, in transformers' order (5.17 to 5.25)."""


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _module():
    try:
        from transformers import masking_utils
    except ImportError:
        return None
    return masking_utils


def problem() -> str | None:
    """Why the wrapper is not installed here, or None when it is (or would be) installed."""
    if os.environ.get("TIGON_COMPILE_CAUSAL_SKIP", "1") == "0":
        return "TIGON_COMPILE_CAUSAL_SKIP=0"
    if _torch_version() >= FIXED_IN:
        return f"torch {torch.__version__} takes the skip under torch.compile itself"
    mod = _module()
    fn = getattr(mod, FUNCTION, None) if mod is not None else None
    if fn is None:
        return f"transformers.masking_utils.{FUNCTION} not found"
    original = getattr(fn, "__wrapped__", fn)
    if tuple(inspect.signature(original).parameters) != ARGS:
        return f"transformers.masking_utils.{FUNCTION} has other arguments than {ARGS}"
    if not _materialises(original):
        return "this transformers takes the skip under torch.compile itself"
    return None


_PROBED: dict = {}


def _materialises(fn) -> bool:
    """Whether ``fn`` (transformers' check) refuses the skip under Dynamo for an unpadded square causal mask:
    traced once per function and process (``backend="eager"``, no compiler involved; a failing trace: False).
    transformers 5.17 on torch 2.11 refuses it (the H100 run); 5.25 on torch 2.13 takes it."""
    if fn not in _PROBED:
        out: dict = {}

        def probe(x):
            out["skip"] = fn(None, 8, 8, 0, 0)
            return x + 1

        try:
            torch.compile(probe, backend="eager", fullgraph=True)(torch.zeros(1))
            _PROBED[fn] = out.get("skip") is False
        except Exception:  # noqa: BLE001 - no Dynamo here: nothing to fix
            _PROBED[fn] = False
    return _PROBED[fn]


class CausalMaskSwitch:
    """The wrapper installed as ``transformers.masking_utils._ignore_causal_mask_sdpa`` and the models that keep it.

    ``wrapper(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None) -> bool``: True
    (skip the mask: sdpa's ``is_causal``) under Dynamo when ``padding_mask`` is None, ``q_length == kv_length > 1``,
    ``q_offset`` is not a tensor and ``kv_length`` is below ``local_attention_size`` (when given); otherwise
    transformers' own answer."""

    def __init__(self, module):
        self.module = module
        self.original = getattr(module, FUNCTION)
        self.live: weakref.WeakSet = weakref.WeakSet()
        original = self.original

        def wrapper(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
            if (padding_mask is None and torch.compiler.is_compiling() and not isinstance(q_offset, torch.Tensor)
                    and isinstance(q_length, int) and q_length == kv_length and q_length > 1
                    and (local_attention_size is None or kv_length < local_attention_size)):
                return True
            return original(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)

        wrapper.__wrapped__ = original
        wrapper.__doc__ = original.__doc__
        self.wrapper = wrapper

    def install(self) -> None:
        if getattr(self.module, FUNCTION) is not self.wrapper:
            setattr(self.module, FUNCTION, self.wrapper)

    def release(self) -> bool:
        """Restore transformers' function when no live model needs the wrapper; True when restored."""
        if self.live:
            return False
        if getattr(self.module, FUNCTION) is self.wrapper:
            setattr(self.module, FUNCTION, self.original)
        return True


_SWITCH: CausalMaskSwitch | None = None


def hold(model: torch.nn.Module) -> str:
    """Install the wrapper for ``model`` (a patched model using sdpa attention) and say what was done, for the
    patch report's notes."""
    global _SWITCH
    why = problem()
    if why is not None:
        return f"causal mask under torch.compile: transformers' own (wrapper not installed: {why})"
    if _SWITCH is None or _SWITCH.module is not _module():
        _SWITCH = CausalMaskSwitch(_module())
    _SWITCH.live.add(model)
    _SWITCH.install()
    return ("causal mask under torch.compile: sdpa's is_causal where attention_mask is None and the query spans the "
            "keys, as transformers does eagerly and on torch >= 2.14 (transformers.masking_utils."
            f"{FUNCTION} wrapped while a patched model lives; TIGON_COMPILE_CAUSAL_SKIP=0 turns it off)")


def release(model: torch.nn.Module | None = None) -> bool:
    """Drop ``model``'s hold (None: only look for models freed without :func:`tigon.unpatch`); restore
    transformers' function when no live model holds it. True when it was restored now."""
    global _SWITCH
    if _SWITCH is None:
        return False
    if model is not None:
        _SWITCH.live.discard(model)
    if _SWITCH.release():
        _SWITCH = None
        return True
    return False


def installed() -> bool:
    """Whether the wrapper is transformers' function now."""
    mod = _module()
    return _SWITCH is not None and mod is not None and getattr(mod, FUNCTION, None) is _SWITCH.wrapper
