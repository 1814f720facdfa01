"""The scoped rotary dispatcher and the patched attention forward: while a patched attention module's forward runs,
the family's rotary global (``apply_rotary_pos_emb``) dispatches to :func:`tigon.functional.rope` (or the variant the
target names); elsewhere it is the original. Also the hand-over of a fused q / k / v LoRA node's outputs
(:func:`handed_output`, :mod:`tigon.integrations.lora_qkv`).

Marked as every Tigon replacement is (:mod:`tigon.integrations.marks`); the norms' and MLPs' forwards:
:mod:`tigon.integrations.norm_forwards`, :mod:`tigon.integrations.mlp_forwards`,
:mod:`tigon.integrations.act_linear_forwards`.
"""

from __future__ import annotations

import functools
import threading
import types
import weakref

import torch

from .. import support
from .marks import mark


class _Scope(threading.local):
    """Per-thread state of the rotary dispatch: ``depth`` (patched attention forwards running), ``handed`` and
    ``rotated`` (a fused q / k / v node's hand-over, :func:`tigon.integrations.lora_qkv.call`).

    Every attribute exists in every thread from its first read (``__init__`` runs once per thread): under
    ``torch.compile`` Dynamo guards on whether an attribute exists, so one first set by the first call (a plain
    ``threading.local``) failed that guard on the second call and recompiled the whole model once.
    """

    def __init__(self):
        self.depth = 0
        self.handed = None
        self.rotated = None


_scope = _Scope()
_TENSOR = torch.Tensor
_WEAKREF = weakref.ref


def handed_output(module, x):
    """The output a fused attention node already computed for ``module(x)`` (one of the q / k / v projections it
    replaced, :func:`tigon.integrations.lora_qkv.call`), taken once; None for any other call. Asked by every patched
    LoRA layer's forward: one thread-local read when no hand-over is pending."""
    handed = _scope.handed
    if not handed:
        return None
    slot = handed.get(id(module))
    if slot is None or slot[0] is not x:
        return None
    del handed[id(module)]
    return slot[1]


def _same_view(a, b: torch.Tensor) -> bool:
    return (isinstance(a, torch.Tensor) and a.data_ptr() == b.data_ptr() and a.shape == b.shape
            and a.stride() == b.stride())


def _rotated_already(args: tuple, kwargs: dict) -> bool:
    """Whether this rotary call is on the q and k a fused attention node already rotated, with its cos and sin
    (then taken: the next call rotates)."""
    rotated = _scope.rotated
    if rotated is None or kwargs or len(args) != 4:
        return False
    q, k, cos, sin = rotated
    if args[2] is cos and args[3] is sin and _same_view(args[0], q) and _same_view(args[1], k):
        _scope.rotated = None
        return True
    return False


def rope_dispatcher(original, family: str, switch):
    """A drop-in for the module-global rotary function that routes to Tigon's rotary op of the function's layout
    (``switch.layout``, see :mod:`tigon.integrations.rotary_layouts`: :func:`tigon.functional.rope`,
    ``rope_interleaved`` or ``mrope``) when ``switch.class_level`` is set or a patched attention instance is running
    on this thread, else to ``original``.

    Calls it cannot serve (extra positional arguments such as the old ``position_ids``; cos / sin narrower than the
    head unless ``switch.partial``, i.e. the family's function rotates the first ``cos.shape[-1]`` dims as Tigon's
    ops do; tables of another shape than the layout's) go to ``original`` as well. q and k that a fused attention
    node (:mod:`tigon.integrations.lora_qkv`) already rotated are returned as they are.

    A function for a function; for an ``original`` that is an object (transformers 5.2x with ``kernels`` installed
    wraps the function in a ``Func`` module, ``use_kernel_forward_from_hub``) a :class:`ObjectDispatcher`, which
    unpickles models while it is installed.
    """
    from .. import functional as TF
    from .rotary_layouts import tigon_call

    # The usual call, Hugging Face's ``apply_rotary_pos_emb(q, k, cos, sin)`` of the rotate-half layout, is served
    # inline: tigon_call's and its adapter's checks, then tigon.functional.rope (two Python frames less per call).
    # Any other call (keywords, another layout) goes through tigon_call.
    def apply_rotary_pos_emb(*args, **kwargs):
        if switch.class_level or _scope.depth > 0:  # (a patched attention forward is running)
            if _scope.rotated is not None and _rotated_already(args, kwargs):  # (no frame unless set)
                return args[0], args[1]
            if not kwargs and len(args) == 4 and switch.layout == "rotate_half":  # (tigon_call, inline)
                q, k, cos, sin = args
                if (isinstance(q, _TENSOR) and isinstance(k, _TENSOR) and q.shape[-1] == k.shape[-1]
                        and cos.dim() in (2, 3) and (cos.shape[-1] == q.shape[-1] or switch.partial)):
                    return TF.rope(q, k, cos, sin, None, 1)
                return original(*args, **kwargs)
            out = tigon_call(switch.layout, switch.partial, switch.head_axis, args, kwargs)
            if out is not None:
                return out
        return original(*args, **kwargs)

    if isinstance(original, types.FunctionType):
        return mark(functools.wraps(original)(apply_rotary_pos_emb), "rope", family)

    # The same body again, as a method (Dynamo inlines it, not a static __call__): transformers 5.2x's rotary global
    # is a callable object, so this is the hot path there, and delegating to the function above costs a call per
    # rope (tests/test_call_cache.py).
    def __call__(self, *args, **kwargs):
        if switch.class_level or _scope.depth > 0:
            if _scope.rotated is not None and _rotated_already(args, kwargs):
                return args[0], args[1]
            if not kwargs and len(args) == 4 and switch.layout == "rotate_half":  # (tigon_call, inline)
                q, k, cos, sin = args
                if (isinstance(q, _TENSOR) and isinstance(k, _TENSOR) and q.shape[-1] == k.shape[-1]
                        and cos.dim() in (2, 3) and (cos.shape[-1] == q.shape[-1] or switch.partial)):
                    return TF.rope(q, k, cos, sin, None, 1)
                return original(*args, **kwargs)
            out = tigon_call(switch.layout, switch.partial, switch.head_axis, args, kwargs)
            if out is not None:
                return out
        return original(*args, **kwargs)

    return mark(ObjectDispatcher.build(original, __call__), "rope", family)


class ObjectDispatcher:
    """The rotary dispatcher of a global that is a callable object, not a function: transformers 5.2x with
    ``kernels`` installed makes ``apply_rotary_pos_emb`` a ``Func`` module instance, and every attention module holds
    a private instance of that type (``use_kernelized_func``). Pickling one stores "``type(<the module global>)()``"
    (``kernels``' ``_rebuild_kernel_func``), which ``torch.load`` / ``pickle.loads`` evaluate against whatever the
    global is then: a plain function's type cannot be called so, so the dispatcher is an object whose type called
    with no arguments gives a new instance of the original's type (:meth:`__new__`), what the load gets without
    Tigon. Calling it costs the same one Python frame as the function.
    """

    original = None  # (set on each dispatcher's own subclass by build)

    def __new__(cls, *args, **kwargs):
        return type(cls.original)(*args, **kwargs)  # (an instance of the original's type: __init__ is not called)

    @classmethod
    def build(cls, original, call) -> "ObjectDispatcher":
        """The dispatcher of ``original`` whose ``__call__`` is ``call(self, *args, **kwargs)``."""
        sub = type(cls.__name__, (cls,), {"original": original, "__call__": call})
        self = object.__new__(sub)
        functools.update_wrapper(self, original, updated=())  # (__wrapped__, __name__, __module__, __doc__)
        return self

    def __reduce__(self):
        return self.__name__  # (pickled by reference to the module global, as the original pickles itself)


@functools.lru_cache(maxsize=None)
def attention_forward(family: str, original, target=None, qkv=None):
    """Instance forward for attention modules: ``original`` (the class's forward), run inside the rotary scope.

    ``target``: a :class:`~tigon.integrations.rotary_switch.RopeTarget` whose ``ensure(self)`` is called first
    (outside ``torch.compile``), so that copies of patched modules find their rotary dispatcher installed.
    ``qkv``: the :class:`~tigon.integrations.families.RopeSpec` whose q / k / v projections, when they are fused
    adapter layers, run with the rotary as one node (:func:`tigon.integrations.lora_qkv.call`; only for a forward
    of HF Llama's form, :func:`~tigon.integrations.lora_qkv.form_problem`), or None.
    """
    lora_qkv = None
    if qkv is not None:
        from . import lora_qkv  # (it imports this module)

        if lora_qkv.form_problem(original, qkv) is not None:
            lora_qkv = None
    if target is not None:
        from .rotary_switch import SWITCHES as rope_switches  # (it imports this module)

        key = (target.module_name, target.function)

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if target is not None and not (support.dynamo_compiling() or support.COMPILER._is_compiling_flag):
            # (outside torch.compiler.is_compiling(), see support.dynamo_compiling) target.ensure(self) where its check
            # fails: the check, inline (one Python frame less per call), is RopeTarget.ensure's own
            sw = rope_switches.get(key)
            if sw is None or _WEAKREF(self) not in sw.live.data or getattr(sw.module, sw.name) is not sw.dispatcher:
                target.ensure(self)
        _scope.depth += 1
        try:
            if lora_qkv is not None:  # a fused adapter layer has its own forward: plain projections cost no frame
                first = self.__dict__["_modules"].get(qkv.qkv[0])
                if first is not None and "forward" in first.__dict__:
                    return lora_qkv.call(self, qkv, original, args, kwargs)
            return original(self, *args, **kwargs)
        finally:
            _scope.depth -= 1

    # qkv: the projections a fused q / k / v node does not call (tigon profile counts calls by it)
    return mark(forward, "rope", family, **({"qkv": qkv.qkv} if lora_qkv is not None else {}))
