"""How a patched forward calls its child modules, asked at every call (plain attribute and dict reads): whether a
child's call may be bypassed or its output reused (hooks of its own or global ones, an instance-level ``forward``:
:func:`_hook_problem`, :func:`_no_hooks`, :func:`_outputs_private`), whether an ``nn.Linear`` folds into a fused op
(:func:`fold_problem`), whether the call runs inside a non-reentrant activation checkpoint (:func:`under_checkpoint`),
and plain ``nn.Linear`` projections called as ``F.linear`` without their ``__call__`` (:func:`_linear_calls`).

Used by the MLP forwards, the patched decoder layer, the fused LoRA layers and the sequence-parallel norm's hooks.
"""

from __future__ import annotations

import torch

from .. import support
from .marks import tigon_mark


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
_MODULE = torch.nn.modules.module


def _global_hooks() -> bool:
    """Whether global module hooks are registered (``torch.nn.modules.module.register_module_forward_hook`` ...)."""
    return bool(_MODULE._global_forward_hooks or _MODULE._global_forward_pre_hooks
                or _MODULE._global_backward_hooks or _MODULE._global_backward_pre_hooks)


def _hook_problem(module, tigon_forward_ok: bool = False) -> str | None:
    """Why calls of ``module`` may not be bypassed or their outputs reused: hooks of its own or global ones, or a
    ``forward`` replaced on the instance (accelerate's offload / device-map hooks do that; with ``tigon_forward_ok``
    Tigon's own patched forward is fine); None if neither. Asked at every call of a patched MLP: plain attribute
    and dict reads only (a few hundred ns)."""
    d = module.__dict__
    if d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]:
        return "it has hooks"
    own = d.get("forward")
    if own is not None and not (tigon_forward_ok and tigon_mark(own) is not None):
        return "its forward is replaced on the instance (e.g. accelerate offloading)"
    m = _MODULE  # (_global_hooks(), inline)
    if (m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
            or m._global_backward_pre_hooks):
        return "global module hooks are registered"
    return None


def fold_problem(module, hooks_checked: bool = False, linear_cls: str | None = None) -> str | None:
    """Why ``module`` cannot be folded into :func:`tigon.functional.glu_linear` (or ``act_linear``; None when it can,
    with the same result as calling it): it must be exactly an ``nn.Linear`` (or an ``nn.Linear`` subclass of the class
    name ``linear_cls``, :attr:`MLPSpec.linear_cls`; not PEFT LoRA or a quantised layer), without forward
    or backward hooks of its own or global ones and without an instance-level ``forward`` (FSDP2 sharding the layer by
    itself, accelerate offloading, user hooks: the folded call would skip them), with plain-tensor parameters (no
    DTensor) off the meta device, registered as ``weight`` and ``bias`` (FSDP1 with flat parameters sets them as plain
    attributes). ``hooks_checked``: the caller knows it has no hooks and no instance-level forward
    (:func:`_no_hooks`)."""
    if type(module) is not torch.nn.Linear and not (linear_cls is not None and type(module).__name__ == linear_cls
                                                    and isinstance(module, torch.nn.Linear)):
        return f"{type(module).__module__}.{type(module).__qualname__}, not a plain torch.nn.Linear"
    problem = None if hooks_checked else _hook_problem(module)
    if problem is not None:
        return problem
    params = module.__dict__["_parameters"]
    if "weight" not in params or "bias" not in params:
        return "its weight or bias is not a registered parameter (FSDP1's flat parameters)"
    for p in params.values():
        if p is None:
            continue
        if type(p) is not torch.nn.Parameter and type(p) is not torch.Tensor:
            return "its parameters are tensor subclasses (DTensor, quantised)"
        if p.is_meta:
            return _META_PROBLEM
    return None


_META_PROBLEM = "its parameters are on the meta device"


def foldable_linear(module) -> bool:
    """Whether ``module`` can be folded into :func:`tigon.functional.glu_linear` (see :func:`fold_problem`)."""
    return fold_problem(module) is None


def _no_hooks(*modules) -> bool:
    """Whether none of ``modules`` has hooks of its own or an instance-level ``forward``, and no global module hooks
    are registered: :func:`_hook_problem` is None for each (the usual case, asked in one call instead of one per
    module; False says nothing, ask :func:`_hook_problem`)."""
    m = _MODULE
    if (m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
            or m._global_backward_pre_hooks):
        return False
    for module in modules:
        d = module.__dict__
        if (d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]
                or "forward" in d):
            return False
    return True


_LINEAR = torch.nn.Linear
_F_LINEAR = torch.nn.functional.linear
_TRACING = torch._C._get_tracing_state


def _linear_calls(modules, x: torch.Tensor, dynamo: bool) -> tuple | None:
    """``tuple(m(x) for m in modules)`` for modules that :func:`_no_hooks` passed, when each is exactly an
    ``nn.Linear`` not compiled by ``module.compile()``, eagerly outside ``torch.jit.trace``: then ``m(x)`` is
    ``F.linear(x, m.weight, m.bias)`` (``_call_impl``'s path without hooks, then ``Linear.forward``), computed here
    directly: five Python frames less per projection (``_wrapped_call_impl``, ``_call_impl``, ``forward`` and two
    ``nn.Module.__getattr__``). None otherwise (the caller calls the modules), also when ``weight`` or ``bias`` is not
    a registered parameter (FSDP1 with flat parameters sets them as plain attributes). ``dynamo``: the caller's
    ``support.dynamo_compiling()``."""
    if dynamo or _TRACING() is not None:  # (torch.compile traces the modules' calls itself)
        return None
    out = ()
    for m in modules:  # (a loop: a generator or comprehension is a Python frame)
        d = m.__dict__
        if type(m) is not _LINEAR or d.get("_compiled_call_impl") is not None:
            return None
        p = d["_parameters"]
        if "weight" not in p or "bias" not in p:  # (FSDP1's flat parameters: the weight is a plain attribute view)
            return None
        out += (_F_LINEAR(x, p["weight"], p["bias"]),)
    return out


def plain_calls(proj: tuple, down, x: torch.Tensor, dynamo: bool, compiling: bool):
    """A gated MLP's usual case in one call (a patched MLP's forward asks it at every call): None when
    :func:`_no_hooks` of ``proj`` (its gate and up, or gate-up, projections) and ``down`` is False (hooks of their own,
    an instance-level ``forward``, or global module hooks: the caller asks :func:`_hook_problem` per module). Else
    ``(outputs, folds)``: ``outputs`` :func:`_linear_calls` of ``proj`` (None: the caller calls the modules; here
    every projection is checked before any is computed), ``folds`` whether ``fold_problem(down, hooks_checked=True)``
    is None and the call is not :func:`under_checkpoint`. The same answers as those four functions, whose bodies run
    here inline (each a Python frame less per MLP call). ``dynamo`` / ``compiling``: the caller's
    ``support.dynamo_compiling()`` and ``torch.compiler.is_compiling()``."""
    m = _MODULE  # (_no_hooks, inline)
    if (m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
            or m._global_backward_pre_hooks):
        return None
    for module in (*proj, down):  # (a loop: a generator would be a Python frame)
        d = module.__dict__
        if (d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]
                or "forward" in d):
            return None
    outputs = None
    if not dynamo and _TRACING() is None:  # (_linear_calls, inline; torch.compile traces the modules' calls itself)
        for module in proj:
            d = module.__dict__
            p = d["_parameters"]
            if (type(module) is not _LINEAR or d.get("_compiled_call_impl") is not None or "weight" not in p
                    or "bias" not in p):  # (FSDP1's flat parameters: the weight is a plain attribute view)
                break
        else:
            outputs = ()
            for module in proj:
                p = module.__dict__["_parameters"]
                outputs += (_F_LINEAR(x, p["weight"], p["bias"]),)
    folds = False
    if type(down) is _LINEAR:  # (fold_problem(down, hooks_checked=True) is None, inline)
        params = down.__dict__["_parameters"]
        folds = "weight" in params and "bias" in params
        for p in params.values():
            if p is not None and ((type(p) is not _PARAMETER and type(p) is not _TENSOR) or p.is_meta):
                folds = False
    if folds and not compiling:  # (under_checkpoint(compiling), inline)
        top = _TOP_SAVED_HOOKS
        hooks = top(False) if top is not None else None
        folds = not (hooks and getattr(hooks[0], "__module__", None) == "torch.utils.checkpoint")
    return outputs, folds


_PARAMETER = torch.nn.Parameter
_TENSOR = torch.Tensor


def _outputs_private(*modules) -> bool:
    """Whether the outputs of ``modules`` are seen by nothing but the MLP (no hooks, no instance-level forward that
    could keep them), so that the backward may write gradients into them. Tigon's own forwards (a patched PEFT LoRA
    projection) return a fresh tensor that nothing keeps, as ``nn.Linear`` does."""
    for m in modules:  # (a loop, not all() of a generator: one Python frame less per module)
        if _hook_problem(m, True) is not None:
            return False
    return True


def under_checkpoint(compiling: bool | None = None) -> bool:
    """Whether this call runs inside a non-reentrant activation checkpoint (``torch.utils.checkpoint``, as Hugging
    Face's gradient checkpointing uses by default): its saved-tensor hooks are the innermost ones, in the first
    forward and in the recomputation alike (so both take the same path, as checkpointing requires).

    There the fold of the down projection into :func:`tigon.functional.glu_linear` saves no memory (nothing in the
    region is kept) and costs a matmul: the recomputation stops as soon as the last tensor to save is packed, which
    for ``nn.Linear`` happens before its matmul runs and for an ``autograd.Function`` only after its forward (the
    down projection's matmul, recomputed for nothing: 32 x (8192 x 14336 x 4096) per step, 50 ms of 905, on a
    Llama-3-8B step on the H200). Not asked under torch.compile (the compiler decides what is saved there):
    ``compiling``, ``torch.compiler.is_compiling()`` where the caller asked it already (None: asked here).
    """
    if compiling is None:
        compiling = support.dynamo_compiling() or support.COMPILER._is_compiling_flag  # (torch.compiler.is_compiling())
    if compiling:
        return False
    top = _TOP_SAVED_HOOKS
    hooks = top(False) if top is not None else None  # (the innermost saved-tensor hooks, or None)
    return bool(hooks) and getattr(hooks[0], "__module__", None) == "torch.utils.checkpoint"


_TOP_SAVED_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
