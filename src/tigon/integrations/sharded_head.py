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
    unit) avoids that gather.

Tensor parallelism: the weight a DTensor sharded ``Shard(0)`` (by vocabulary rows) over a 1-D mesh, outside FSDP2
    As torch's ``ColwiseParallel`` leaves ``lm_head``. The loss runs vocabulary-parallel
    (:func:`tigon.functional.vocab_parallel_fused_linear_cross_entropy`, chosen by
    :func:`tigon.integrations.causal_lm.causal_lm_loss` for a DTensor weight): each rank's rows, the row statistics
    all-reduced, the logits never gathered (the original head all-gathers them when its output is Replicate).

Not handled: the fused loss is skipped with the reason (:func:`sharding_problem`) and the original forward runs
    A DTensor weight outside an FSDP2 unit placed otherwise (e.g. ``Shard(1)``, row-wise parallel, or a 2-D
    mesh), a DeepSpeed ZeRO-3 partitioned weight (an empty
    placeholder outside the head's own forward), and a head wrapped by FSDP1 (``FullyShardedDataParallel``: not a
    plain Linear, refused by :func:`tigon.integrations.causal_lm.effective_head`).

torch.distributed is never imported here: a model that uses it has imported it already.
"""

from __future__ import annotations

import sys

import torch


def _fsdp_module_class():
    mod = sys.modules.get("torch.distributed.fsdp")
    return getattr(mod, "FSDPModule", None) if mod is not None else None


def _dtensor_class():
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


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
        None for a plain weight, a head that is (or is inside) an FSDP2 unit, or an FSDP2 unit whose hooks this
        torch provides, or a vocabulary-sharded DTensor weight (:func:`vocab_sharded`); else the reason (a DeepSpeed
        ZeRO-3 parameter, a DTensor weight outside FSDP2 sharded otherwise, an FSDP2 whose internals changed).
    """
    weight = linear.weight
    if hasattr(weight, "ds_id"):
        return ("the LM head weight is a DeepSpeed ZeRO-3 partitioned parameter (gathered only inside the head's own "
                "forward); the fused loss does not gather it yet, the original forward runs")
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
        if vocab_sharded(weight) and (linear.bias is None or vocab_sharded(linear.bias)):
            return None  # tensor parallel by vocabulary rows: the vocabulary-parallel fused loss
        return (f"the LM head weight is a DTensor ({', '.join(map(str, weight.placements))}) outside an FSDP2 unit, "
                "sharded other than by vocabulary rows (Shard(0) over a 1-D mesh, ColwiseParallel): the fused loss "
                "needs the whole weight or its vocabulary rows on each rank; the original forward runs")
    return None


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
