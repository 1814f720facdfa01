"""torch's tensor-parallel plan for a Hugging Face decoder with Llama's module names (``tigon compare --parallel tp``).

The plan Megatron-LM (Shoeybi et al. 2019) and torchtitan use, in torch's styles
(``torch.distributed.tensor.parallel``): in every decoder layer the attention's ``q_proj`` / ``k_proj`` / ``v_proj`` and
the MLP's ``gate_proj`` / ``up_proj`` column-wise (``ColwiseParallel``: each rank its heads and its intermediate
columns), ``o_proj`` and ``down_proj`` row-wise (``RowwiseParallel``: partial sums all-reduced, or reduce-scattered
over the tokens), the input embedding row-wise (its vocabulary rows split) and the LM head column-wise (its
vocabulary rows split: Tigon's fused loss runs vocabulary-parallel on it, :mod:`tigon.integrations.sharded_head`).

With ``sequence_parallel`` the residual stream between the blocks is a ``Shard(1)`` DTensor (each rank its tokens:
the embedding and the row-wise projections reduce-scatter), the norms are ``SequenceParallel`` (Tigon's norms and
fused residual add run on each rank's tokens), the column-wise projections all-gather the tokens they need, and the
final norm hands the head its tokens as a plain tensor, which the head's ``ColwiseParallel(input_layouts=Shard(1))``
all-gathers.

The plan is a dict for ``parallelize_module(model, mesh, plan)``; nothing is applied here. Tested on 2 gloo ranks
(tests/tensor_parallel_checks.py: the patched model trains as the unpatched one under it).
"""

from __future__ import annotations

import torch

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")
NORMS = ("input_layernorm", "post_attention_layernorm")


def _layers(model: torch.nn.Module) -> tuple[str, list[str]]:
    """The decoder's qualified name ("model") and its layers' ("model.layers.0", ...)."""
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        return "", []
    return "model", [f"model.layers.{i}" for i in range(len(layers))]


def tp_plan_problem(model: torch.nn.Module, tp: int) -> str | None:
    """Why :func:`decoder_tp_plan` cannot split ``model`` over ``tp`` ranks (None when it can): it needs Llama's module
    names (``model.embed_tokens``, ``model.layers.<i>`` with the projections of :data:`COLWISE` / :data:`ROWWISE` as
    ``nn.Linear`` and the norms of :data:`NORMS`, ``model.norm``, ``lm_head``; an untied head, or one tied to the
    embedding), and attention and key-value heads that ``tp`` divides."""
    _, layers = _layers(model)
    if not layers:
        return "no decoder layers at model.layers (Llama's module names)"
    names = dict(model.named_modules(remove_duplicate=False))
    need = ["model.embed_tokens", "model.norm", "lm_head"]
    need += [f"{layer}.{name}" for layer in layers for name in COLWISE + ROWWISE + NORMS]
    missing = [n for n in need if n not in names]
    if missing:
        return f"no module {missing[0]} (the plan uses Llama's module names)"
    linear = [n for n in need if n.rsplit(".", 1)[-1].endswith("_proj") or n == "lm_head"]
    other = [n for n in linear if type(names[n]) is not torch.nn.Linear]
    if other:
        return f"{other[0]} is a {type(names[other[0]]).__name__}, not a plain torch.nn.Linear"
    cfg = getattr(model.config, "get_text_config", lambda: model.config)()
    for attr in ("num_attention_heads", "num_key_value_heads"):
        n = getattr(cfg, attr, None)
        if not isinstance(n, int) or n % tp:
            return f"{attr} = {n} is not divisible by the {tp} tensor-parallel ranks"
    return None


def decoder_tp_plan(model: torch.nn.Module, *, sequence_parallel: bool = False) -> dict:
    """torch's tensor-parallel plan of ``model``'s whole decoder and LM head (module docstring), for
    ``parallelize_module(model, mesh, plan)`` on a 1-D mesh (or the tensor-parallel dimension of a 2-D one).

    Args:
        model: a ``<Family>ForCausalLM`` with Llama's module names (:func:`tp_plan_problem` says whether it has).
        sequence_parallel: keep the residual stream split over the tokens (``Shard(1)``) with ``SequenceParallel``
            norms.

    Returns:
        {qualified module name: ParallelStyle}.

    Raises:
        ValueError: ``model`` lacks the modules the plan names (:func:`tp_plan_problem` with tp=1).
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    problem = tp_plan_problem(model, 1)
    if problem is not None:
        raise ValueError(f"decoder_tp_plan: {problem}")
    into = {"input_layouts": Shard(1)} if sequence_parallel else {}  # a projection's input: this rank's tokens
    back = {"output_layouts": Shard(1), "use_local_output": False} if sequence_parallel else {}
    plan = {"model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), **back),
            "lm_head": ColwiseParallel(output_layouts=Replicate(), **into)}
    if sequence_parallel:
        plan["model.norm"] = SequenceParallel(use_local_output=True)  # the head all-gathers its tokens
    for layer in _layers(model)[1]:
        plan.update({f"{layer}.{name}": ColwiseParallel(**into) for name in COLWISE})
        plan.update({f"{layer}.{name}": RowwiseParallel(**back) for name in ROWWISE})
        if sequence_parallel:
            plan.update({f"{layer}.{name}": SequenceParallel() for name in NORMS})
    return plan


def apply_decoder_tp(model: torch.nn.Module, mesh, *, sequence_parallel: bool = False) -> torch.nn.Module:
    """``parallelize_module(model, mesh, decoder_tp_plan(model, ...))``, then tied input and output embeddings tied
    again (``parallelize_module`` gives the embedding and the head each their own ``Shard(0)`` parameter; both split
    the vocabulary rows alike, so the one parameter serves both). Returns ``model``.

    Raises:
        ValueError: as :func:`tp_plan_problem` says for ``mesh``'s size (``mesh``: a 1-D DeviceMesh).
    """
    from torch.distributed.tensor.parallel import parallelize_module

    problem = tp_plan_problem(model, mesh.size())
    if problem is not None:
        raise ValueError(f"apply_decoder_tp: {problem}")
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    parallelize_module(model, mesh, decoder_tp_plan(model, sequence_parallel=sequence_parallel))
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model
