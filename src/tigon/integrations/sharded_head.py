"""The LM head's weight for the fused loss when a data-parallel engine shards it.

The fused LM-head loss reads ``lm_head.weight`` (and ``bias``) itself instead of calling ``lm_head(hidden)``. An
engine that gathers a module's parameters only around that module's own forward must therefore be asked to gather
them; everything else about the model is unchanged by data parallelism.

DDP (``DistributedDataParallel``)
    Every rank holds the whole weight; gradients are all-reduced by DDP's parameter hooks. Nothing to do.

FSDP2 (``torch.distributed.fsdp.fully_shard``), the head inside a larger unit (the root)
    During that unit's forward the head's parameters are the unsharded plain tensors: read as they are.

FSDP2, the head its own unit (torchtitan wraps its ``output`` layer so; also ``fully_shard([norm, head])``)
    Outside its forward the weight is a sharded DTensor. :func:`run_in_unit` runs the loss between the unit's
    pre-forward and post-forward hooks, as :func:`torch.distributed.fsdp.register_fsdp_forward_method` runs a
    method other than ``forward``: the pre-forward all-gathers the parameters (in the mixed-precision policy's
    ``param_dtype``, casting the hidden states as it would cast the head's input) and registers the reduce-scatter
    of their gradients in the backward; the post-forward reshards them (when ``reshard_after_forward``) and
    registers the pre-backward hook. So the weight is gathered once, by FSDP, and not kept after the loss; its
    gradient lands in the unsharded parameter's ``.grad`` and FSDP reduce-scatters it into the sharded one, as for
    the original head. The communication is the original head's: with ``reshard_after_forward=True`` FSDP
    all-gathers the head again in the backward, which the fused loss does not need (it formed the weight's
    gradient in the forward); ``reshard_after_forward=False`` on the head's unit (torchtitan's default for its last
    unit) avoids that gather. FSDP2 over tensor parallelism (a 2-D mesh): the gathered weight is this rank's
    vocabulary rows (a ``Shard(0)`` DTensor); the head's other forward pre-hooks (``ColwiseParallel``'s input layout,
    e.g. the all-gather of a sequence-parallel rank's tokens) then run on the hidden states as for the head's call
    (:func:`run_tensor_parallel`), and the loss is vocabulary-parallel.

DeepSpeed ZeRO-3 (the weight a partitioned parameter, marked by DeepSpeed with ``ds_id``)
    Outside the call of a module that owns it the weight is an empty placeholder. DeepSpeed hooks every submodule:
    its pre-forward hook gathers the module's own parameters (``parameters(recurse=False)``), its post-forward hook
    releases them and wraps the outputs in an autograd function whose backward gathers them again, and a hook on the
    inputs releases them once the inputs' gradients are formed. :func:`run_as_forward` calls the head's
    ``nn.Linear`` with the loss as its forward, so those hooks run around the loss as around ``lm_head(hidden)``:
    the same all-gathers as the original head (the backward one too, which the fused loss does not need: it formed
    the weight's gradient in the forward), the weight released after the loss as the original's, its gradient
    reduce-scattered by DeepSpeed's gradient hooks like any other. Tied embeddings: the one parameter is in the
    head's and the embedding's own parameters; the head's call gathers it, as for the original head. A PEFT
    ``modules_to_save`` head: the call of the trained copy (hooked like every submodule). The weight must not be
    looked up outside that call: DeepSpeed's parameter mapping gathers a partitioned parameter looked up during the
    model's forward and registers it with the module running (the whole model), which then keeps it gathered through
    its forward and its backward; the checks at the start of the patched forward read it with :func:`stored_param`.
    Nothing of DeepSpeed is imported: ``ds_id`` and the module's ordinary hooks are all that is used (tested with
    DeepSpeed 0.19.8). ZeRO-1 and 2 do not partition parameters (no ``ds_id``): the plain path.

FSDP1 (``FullyShardedDataParallel``), the head its own unit (the head attribute is the FSDP1 wrapper)
    Outside the unit's forward the head's weight is (a view of) this rank's shard of the unit's flat parameter. The
    loss runs as the wrapped Linear's forward through the wrapper's call (:func:`run_as_forward` with ``call`` the
    wrapper): FSDP1's forward all-gathers the flat parameter before it (casting the hidden states under a
    ``MixedPrecision`` policy), reshards it after (``FULL_SHARD``) and registers its pre-backward hook on the loss
    (it gathers the weight again for the backward, as for the original head: the fused loss formed the weight's
    gradient in the forward and does not need it); the gradient reaches the flat parameter through the Linear's
    unsharded views and FSDP1 reduce-scatters it. A head inside a larger FSDP1 unit (the root) reads the unsharded
    parameters during that unit's forward: nothing to do.

Tensor parallelism: the weight a DTensor sharded ``Shard(0)`` (by vocabulary rows) over a 1-D mesh, outside FSDP2
    As torch's ``ColwiseParallel`` leaves ``lm_head`` (``parallelize_module``; transformers' ``tp_plan`` styles
    ``colwise_gather_output`` / ``colwise_rep`` / ``colwise`` do the same). The loss runs vocabulary-parallel
    (:func:`tigon.functional.vocab_parallel_fused_linear_cross_entropy`, chosen by
    :func:`tigon.integrations.causal_lm.causal_lm_loss` for a DTensor weight): each rank's rows, the row statistics
    all-reduced, the logits never formed whole (the original head all-gathers them for ``output_layouts``
    Replicate, or leaves them sharded, ``Shard(-1)``, for ``loss_parallel()``; either way the loss is the same
    whole-vocabulary cross-entropy). The hidden states reach it as they reach the head: :func:`run_tensor_parallel`
    runs the head's forward pre-hooks on them (torch's ``ColwiseParallel`` input preparation: a plain tensor is
    taken as its ``input_layouts`` says, e.g. this rank's tokens for ``Shard(1)``, sequence parallel, and
    redistributed to Replicate); the gradient of the replicated hidden states is each rank's partial product,
    all-reduced over the group (Megatron's column-parallel input gradient). Tied embeddings: the one ``Shard(0)``
    parameter (a ``RowwiseParallel`` embedding shards its rows the same way) gets the head's rows' gradient here and
    the embedding's through the embedding, as in the original.

Not handled: the fused loss is skipped with the reason (:func:`sharding_problem`) and the original forward runs
    A DTensor weight outside an FSDP2 unit placed otherwise (e.g. ``Shard(1)``, row-wise parallel, or a 2-D
    mesh).

torch.distributed is never imported here: a model that uses it has imported it already.
"""

from __future__ import annotations

import sys

import torch

from .child_calls import _global_hooks


def _fsdp_module_class():
    mod = sys.modules.get("torch.distributed.fsdp")
    return getattr(mod, "FSDPModule", None) if mod is not None else None


def _dtensor_class():
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def fsdp1_wrapper(module) -> bool:
    """Whether ``module`` is an FSDP1 unit (``torch.distributed.fsdp.FullyShardedDataParallel``)."""
    mod = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(mod, "FullyShardedDataParallel", None) if mod is not None else None
    return cls is not None and isinstance(module, cls)


def fsdp_unit(*modules: torch.nn.Module | None):
    """The first of ``modules`` (the LM-head attribute, then the Linear it resolves to) that is an FSDP2 unit
    (``fully_shard`` was applied to it), or None."""
    cls = _fsdp_module_class()
    if cls is None:
        return None
    return next((m for m in modules if isinstance(m, cls)), None)


def _has_hooks(unit) -> bool:
    # The FSDP2 internals run_in_unit calls (those register_fsdp_forward_method calls, unchanged since torch 2.4).
    state = getattr(unit, "_get_fsdp_state", None)
    if state is None:
        return False
    state = state()
    return callable(getattr(state, "_pre_forward", None)) and callable(getattr(state, "_post_forward", None))


def sharding_problem(head: torch.nn.Module, linear: torch.nn.Linear) -> str | None:
    """Why the fused loss cannot read ``linear``'s whole weight when it runs, or None when it can.

    Args:
        head: the model's LM-head attribute (``model.lm_head``; possibly a wrapper around ``linear``).
        linear: the plain ``nn.Linear`` the head applies (:func:`~tigon.integrations.causal_lm.effective_head`).

    Returns:
        None for a plain weight, a DeepSpeed ZeRO-3 parameter (read inside the head's call, :func:`run_as_forward`),
        a head that is (or is inside) an FSDP2 unit whose hooks this torch provides, or a vocabulary-sharded DTensor
        weight (:func:`vocab_sharded`); else the reason (a DTensor weight outside FSDP2 sharded otherwise, an FSDP2
        whose internals changed).
    """
    weight, bias = stored_param(linear, "weight"), stored_param(linear, "bias")
    if fsdp1_wrapper(head):
        return None  # gathered by the FSDP1 unit's forward, around the loss run as the Linear's forward
    if zero3_param(weight):
        return None  # gathered by DeepSpeed's hooks on the head Linear, around its call (run_gathered)
    unit = fsdp_unit(head, linear)
    if unit is not None:
        if _has_hooks(unit):
            return None
        return (f"the LM head is an FSDP2 unit, but this torch ({torch.__version__}) lacks the FSDP2 forward hooks "
                "the fused loss runs in (FSDPState._pre_forward / _post_forward); the original forward runs")
    dtensor = _dtensor_class()
    if dtensor is not None and isinstance(weight, dtensor):
        if getattr(linear, "_is_fsdp_managed_module", False):
            return None  # sharded between steps; unsharded plain tensors inside the enclosing unit's forward
        if vocab_sharded(weight) and (bias is None or vocab_sharded(bias)):
            return None  # tensor parallel by vocabulary rows: the vocabulary-parallel fused loss
        return (f"the LM head weight is a DTensor ({', '.join(map(str, weight.placements))}) outside an FSDP2 unit, "
                f"{_layout_problem(weight, bias)}: the fused loss needs the whole weight or its vocabulary rows on "
                "each rank (Shard(0) over a 1-D mesh, ColwiseParallel: vocab-parallel); the original forward runs")
    return None


OBSERVER = "tigon_observer"
"""Attribute (True) of a hook that only observes a module's call (Tigon's profiler ranges): :func:`hook_problem`
lets the fused loss skip the head's call under it."""


def hook_problem(head: torch.nn.Module, linear: torch.nn.Linear) -> str | None:
    """Why the fused loss, which reads ``linear``'s weight and never calls the head, would skip hooks that calling
    it runs (a forward hook that scales or caps the logits, a pre-hook on the hidden states), or None.

    Forward / backward hooks of ``head`` or ``linear`` other than :data:`OBSERVER` ones and global module hooks are
    a problem. On a head that FSDP1, FSDP2, DeepSpeed ZeRO-3 or tensor parallelism shards, whose own hooks
    :func:`run_gathered` runs or replaces, the hooks those engines registered (their functions defined in
    ``torch.distributed`` or ``deepspeed``: :func:`_engine_hook`) are not, and neither is a forward replaced on the
    instance (transformers' tensor-parallel styles replace it); on any other head a forward replaced on the instance
    is.
    """
    weight = stored_param(linear, "weight")
    engine = bool(fsdp1_wrapper(head) or zero3_param(weight) or fsdp_unit(head, linear) is not None
                  or (_dtensor_class() is not None and isinstance(weight, _dtensor_class())))
    if _global_hooks():
        return "global module hooks are registered (the fused loss does not call the LM head); the original runs"
    for part in dict.fromkeys((head, linear)):
        d = vars(part)
        hooks = [h for k in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
                 for h in d.get(k, {}).values()]
        if any(not getattr(h, OBSERVER, False) and not (engine and _engine_hook(h)) for h in hooks):
            return (f"the LM head ({type(part).__name__}) has hooks, which the fused loss would skip (it reads the "
                    "weight, never calls the head); the original forward runs")
        if "forward" in d and not engine:
            return f"the LM head ({type(part).__name__}) has its forward replaced on the instance; the original runs"
    return None


_ENGINE_MODULES = ("torch.distributed.", "deepspeed.")


def _engine_hook(hook) -> bool:
    """Whether a module hook was registered by a sharding engine (FSDP2, tensor parallelism, DeepSpeed): its
    function (through ``functools.partial`` and bound methods) is defined in ``torch.distributed`` or
    ``deepspeed``."""
    fn = getattr(hook, "func", hook)
    fn = getattr(fn, "__func__", fn)
    return (getattr(fn, "__module__", None) or "").startswith(_ENGINE_MODULES)


def _layout_problem(weight, bias) -> str:
    """What is unsupported about a DTensor head weight (and bias) that :func:`vocab_sharded` refuses."""
    if weight.device_mesh.ndim != 1:
        return (f"placed over a {weight.device_mesh.ndim}-D mesh (a tensor-parallel head is vocab-parallel over one "
                "mesh dimension; FSDP2 + TP: fully_shard the head so that FSDP2 gathers it)")
    p = weight.placements[0]
    if type(p).__name__ == "Shard" and p.dim % weight.ndim == 1:
        return ("sharded other than by vocabulary rows: split by the hidden dimension (row-wise parallel, "
                "RowwiseParallel), where each rank's logits are a partial sum that must be all-reduced whole (V "
                "values per token) before the softmax")
    if bias is not None and not vocab_sharded(bias):
        return "sharded by vocabulary rows but its bias is not (a Shard(0) bias is needed)"
    return f"sharded other than by vocabulary rows ({p})"


_ABSENT = object()


def stored_param(module: torch.nn.Module, name: str):
    """``module``'s parameter ``name`` as stored, read without an engine's gather: DeepSpeed ZeRO-3 replaces
    ``module._parameters`` by a mapping whose item lookup all-gathers a partitioned parameter read during the
    model's forward and keeps it gathered as an "external parameter" of the module running (the whole model) until
    that module's backward ends. The checks that run at the start of the patched forward must not do that. A name
    that is not a registered parameter (a plain tensor attribute) is read with ``getattr``."""
    params = vars(module).get("_parameters")
    # dict's own lookup, not the subclass's __getitem__
    value = dict.get(params, name, _ABSENT) if isinstance(params, dict) else _ABSENT
    return getattr(module, name, None) if value is _ABSENT else value


def zero3_param(t) -> bool:
    """Whether ``t`` is a DeepSpeed ZeRO-3 partitioned parameter (DeepSpeed gives each one a ``ds_id``; ZeRO-1 and 2
    leave parameters plain)."""
    return isinstance(t, torch.Tensor) and hasattr(t, "ds_id")


def vocab_sharded(t) -> bool:
    """Whether ``t`` is a DTensor split by its first dimension (the vocabulary of a head weight or bias) over a 1-D
    mesh: ``Shard(0)``, as torch's ``ColwiseParallel`` places ``lm_head``."""
    dtensor = _dtensor_class()
    if dtensor is None or not isinstance(t, dtensor) or t.device_mesh.ndim != 1:
        return False
    p = t.placements[0]
    return type(p).__name__ == "Shard" and p.dim % t.ndim == 0


def run_in_unit(unit, fn, hidden: torch.Tensor) -> torch.Tensor:
    """``fn(hidden)`` with ``unit``'s parameters gathered by FSDP2, as if it were ``unit``'s forward.

    Args:
        unit: an FSDP2 unit (:func:`fsdp_unit`), or None to call ``fn(hidden)`` as it is.
        fn: reads the unit's parameters (e.g. ``lm_head.weight``) when called, returns a tensor (the loss).
        hidden: the unit's input; under a mixed-precision policy ``fn`` receives it cast to ``param_dtype``.

    Returns:
        ``fn``'s result, in its own dtype (a policy's ``output_dtype`` rounds it, as it would round the logits,
        and it is cast back).
    """
    if unit is None:
        return fn(hidden)
    state = unit._get_fsdp_state()
    # A group (fully_shard([norm, head])) completes its forward when its last module has run: newer torch tracks the
    # modules still to run on the state, and its group hooks update that set; do what they do.
    pending = getattr(state, "_modules_to_run_forward", None) if len(getattr(state, "_modules", ())) > 1 else None
    if pending is not None and not pending:
        pending.update(state._modules)
    args, _ = state._pre_forward(unit, (hidden,), {})
    out = fn(*args)
    if pending is not None:
        pending.discard(unit)
        if pending:  # other modules of the group run later in this pass; the last one completes it
            return out
    res = state._post_forward(unit, args, out)
    return res if res.dtype == out.dtype else res.to(out.dtype)


def run_as_forward(module: torch.nn.Module, fn, hidden: torch.Tensor, call=None) -> torch.Tensor:
    """``fn(hidden)`` called as ``module``'s forward, through ``module(hidden)``: every hook of ``module`` runs around
    it (DeepSpeed ZeRO-3's gather and release of the module's own parameters, and its backward hooks on the output
    and input), and they see ``fn``'s result as the module's output.

    Args:
        module: the LM head's ``nn.Linear`` (its own ``forward`` is restored afterwards, also on an error, including
            an instance-level ``forward`` that was set before).
        fn: reads the module's parameters when called, returns a tensor (the loss).
        hidden: the module's input.
        call: the module called instead of ``module`` (a wrapper whose forward calls ``module``, e.g. an FSDP1 unit);
            None: ``module``.

    Returns:
        ``fn``'s result as the module's hooks return it (DeepSpeed returns it through an autograd function that
        gathers the parameters again before its backward).
    """
    own = module.__dict__.get("forward", _ABSENT)
    module.forward = fn
    try:
        return (module if call is None else call)(hidden)
    finally:
        if own is _ABSENT:
            del module.forward
        else:
            module.forward = own


def run_gathered(head: torch.nn.Module, linear: torch.nn.Linear, fn, hidden: torch.Tensor) -> torch.Tensor:
    """``fn(hidden)`` where ``linear``'s parameters are whole: inside the FSDP2 unit's hooks when ``head`` or
    ``linear`` is one (:func:`run_in_unit`), inside ``linear``'s call under DeepSpeed ZeRO-3 (:func:`run_as_forward`)
    or through an FSDP1 unit's call when ``head`` is one;
    for a vocabulary-sharded head (tensor parallel) on the hidden states as the head's input hooks lay them out
    (:func:`run_tensor_parallel`); else called as it is.

    Args:
        head: the model's LM-head attribute; linear: the plain Linear it applies
            (:func:`~tigon.integrations.causal_lm.effective_head`).
        fn, hidden: as for :func:`run_in_unit`.
    """
    unit = fsdp_unit(head, linear)
    if unit is not None:
        def in_unit(h):
            # FSDP2 over tensor parallelism (a 2-D mesh): the gathered weight is this rank's vocabulary rows, and the
            # hidden states reach it as the head's tensor-parallel input hooks lay them out (sequence parallel: this
            # rank's tokens, all-gathered there); FSDP's own pre-forward hook has run already
            if vocab_sharded(stored_param(linear, "weight")):
                return run_tensor_parallel(linear, fn, h, skip=_fsdp_hook_ids(unit))
            return fn(h)

        return run_in_unit(unit, in_unit, hidden)
    if fsdp1_wrapper(head):
        return run_as_forward(linear, fn, hidden, call=head)
    weight = stored_param(linear, "weight")
    if zero3_param(weight):
        return run_as_forward(linear, fn, hidden)
    if vocab_sharded(weight):
        return run_tensor_parallel(linear, fn, hidden)
    return fn(hidden)


def _fsdp_hook_ids(unit) -> frozenset:
    """The ids of the forward pre-hooks FSDP2 registered for ``unit``'s state (one module's handle, or a group's
    handles on each of its modules): :func:`run_in_unit` runs FSDP's pre-forward itself."""
    handle = getattr(unit._get_fsdp_state(), "_pre_forward_hook_handle", None)
    return frozenset(h.id for h in getattr(handle, "handles", (handle,)) if hasattr(h, "id"))


def run_tensor_parallel(module: torch.nn.Module, fn, hidden: torch.Tensor,
                        skip: frozenset = frozenset()) -> torch.Tensor:
    """``fn(hidden)`` with ``hidden`` prepared as ``module``'s input: ``module``'s forward pre-hooks run on it first
    (torch's ``ColwiseParallel`` registers one that makes a plain tensor a DTensor with the style's
    ``input_layouts`` and redistributes it to Replicate), its forward hooks do not (``fn`` returns the loss, not the
    logits those would lay out). With no pre-hook (transformers' tensor-parallel styles replace ``forward`` instead
    and take a plain input as Replicate) ``hidden`` is passed as it is.

    Args:
        module: the LM head's ``nn.Linear``, its weight a vocabulary-sharded DTensor (:func:`vocab_sharded`).
        fn: the loss of the (DTensor or replicated plain) hidden states.
        hidden: (..., H) the hidden states reaching the head.
        skip: ids of pre-hooks not to run (FSDP2's, when the head is also an FSDP2 unit: :func:`run_in_unit` has run
            its pre-forward).
    """
    args, kwargs = (hidden,), {}
    with_kwargs = getattr(module, "_forward_pre_hooks_with_kwargs", {})
    for hook_id, hook in list(module._forward_pre_hooks.items()):
        if hook_id in skip:
            continue
        if hook_id in with_kwargs:
            res = hook(module, args, kwargs)
            if res is not None:
                args, kwargs = res
        else:
            res = hook(module, args)
            if res is not None:
                args = res if isinstance(res, tuple) else (res,)
    return fn(args[0])
