"""Activation checkpointing as a first-class case (issue 26): Hugging Face's checkpointing in both of its modes, and a
selective policy that keeps, within each checkpointed decoder layer, the outputs that are dear to recompute.

Plain checkpointing keeps each decoder layer's input and runs the layer's forward again in the backward: every
projection's matmul but those after the last tensor the backward needs (the recomputation stops as soon as that one
has been saved again, which for ``nn.Linear`` happens before its matmul runs: a pre-norm layer's down projection is
not recomputed, one followed by a post-feed-forward norm is; :mod:`tigon.recompute` finds which by running the model
once) and the attention kernel, on top of the memory-bound ops (norms, RoPE, the GLU product, the residual add). The
memory-bound ops are cheap to recompute, Tigon's kernels all the more; the matmuls and the attention are not. Per layer
of Llama-3-8B at 4 x 2048 tokens in bf16, a projection's output of width ``n`` costs ``tokens * n * 2`` bytes to keep
and saves ``2 * tokens * k * n`` FLOPs (``k`` the input width), that is ``k`` FLOPs per kept byte, 4096 for q / k / v /
o / gate / up; the attention's output (and its log-sum-exp) saves ``2 * B * heads * T * (T + 1) * head_dim`` FLOPs
(causal), ``T`` FLOPs per kept byte (2048 at T = 2048, more than the matmuls past T = 4096):

======================  ==========  ===================  ========================
kept output             MiB         recompute avoided    ms at 700 TFLOP/s
======================  ==========  ===================  ========================
q_proj, o_proj          64 each     275 GFLOP each       0.39 each
k_proj, v_proj          16 each     69 GFLOP each        0.10 each
gate_proj, up_proj      224 each    962 GFLOP each       1.37 each
attention (+ lse)       65          137 GFLOP            0.20 (more: the kernel runs below the matmul rate)
all six projections     608         2.61 TFLOP           3.7
======================  ==========  ===================  ========================

Not checkpointing a layer at all costs about 0.9 GiB more per layer with Tigon (its inputs of the norms, q / k / v,
attention, o, the sum, gate and up) for about 4 ms: fewer milliseconds per kept byte than keeping its projections.

:func:`enable` turns on Hugging Face's checkpointing (``policy="full"``, either mode) or, with
``policy="selective"``, non-reentrant checkpointing whose per-layer ``context_fn`` is a
``torch.utils.checkpoint.create_selective_checkpoint_contexts`` policy: ``aten.mm`` / ``aten.addmm`` on a kept
projection's weight and the attention kernel of a layer that keeps it are saved (``MUST_SAVE``), everything else is
recomputed. What is kept comes from a budget of bytes (:func:`plan`): the outputs with the most FLOPs per byte
first, from the last layer down (the backward frees the top layers' activations first, while the gradients of the
layers it has done accumulate, so extra activations on the top layers are freed before the gradients that take their
place grow), until the budget is spent.

Tigon's ops (autograd Functions that launch Triton kernels, invisible to the dispatch mode that implements the
policy) are recomputed, as are the ATen ops inside them: the policy only keeps ``aten.mm`` / ``aten.addmm`` (never
their ``out=`` forms, whose cached value would skip the write into the given buffer) on the weights of the layer's
kept projections, and the attention ops of :func:`attention_ops`. The patched MLP's in-place backward writes its
gradients into gate's and up's memory, kept or not, after the recomputation has handed the kept tensors back: the
cached tensors are not read again. A kept output must not be overwritten in the forward by an op that reads it,
which a Triton kernel does without PyTorch noticing (no version-counter bump, so the selective checkpoint's own
mutation check cannot see it): Tigon's RoPE writes new tensors, but Liger-Kernel's rotates q and k in place in the
projections' outputs, so under Liger a kept q_proj / k_proj would be rotated twice by the recomputation (wrong
gradients, no error). Do not combine this policy with Liger-Kernel's RoPE. Under ``torch.compile`` the policy is applied
by the compiler's partitioner to the traced graph, where weights are fake tensors: the matmuls are then matched by shape
((in, out) of a kept projection, so a kept q_proj also keeps o_proj of the same shape).

Hugging Face's API keeps working: ``model.gradient_checkpointing_enable()`` is plain checkpointing; :func:`enable`
calls it and then replaces the checkpoint function of the layers that keep something.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field

import torch

from . import recompute
from .recompute import attention_ops

POLICIES = ("full", "selective")
"""The values of :func:`enable`'s ``policy``: ``"full"`` is Hugging Face's checkpointing of every layer,
``"selective"`` keeps the outputs :func:`plan` chooses within each checkpointed layer."""

DEFAULT_TFLOPS = 700.0
"""The bf16 matmul rate (TFLOP/s) at which :class:`CheckpointPlan` turns FLOPs into ms unless told (an H200 runs
Llama-3-8B's projections at about 650-750)."""


@dataclass(frozen=True)
class Kept:
    """One output a selective checkpoint keeps: ``name`` (the projection's path in the layer, e.g.
    ``self_attn.q_proj``, or ``"attention"``), ``bytes`` it holds from the forward to the backward at the plan's batch,
    the recompute ``flops`` it saves per step, both over its ``calls`` per forward."""

    name: str
    bytes: int
    flops: float
    calls: int = 1


@dataclass
class LayerPlan:
    """What one decoder layer keeps: ``index`` among the decoder layers, ``name`` (its path in the model), ``kept``
    (in forward order), out of ``offered`` (:func:`candidates`: the outputs whose keeping saves recompute)."""

    index: int
    name: str
    kept: list[Kept] = field(default_factory=list)
    offered: list[Kept] = field(default_factory=list)

    @property
    def left(self) -> list[Kept]:
        """The offered outputs the budget did not reach."""
        kept = {k.name for k in self.kept}
        return [k for k in self.offered if k.name not in kept]

    @property
    def bytes(self) -> int:
        return sum(k.bytes for k in self.kept)

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kept)


@dataclass
class CheckpointPlan:
    """What :func:`enable` set up. policy: one of :data:`POLICIES`; reentrant: Hugging Face's ``use_reentrant``;
    batch: (batch size, sequence length) the bytes and FLOPs are counted at (None for ``"full"``); budget_bytes: the
    budget the kept outputs were chosen within; layers: one :class:`LayerPlan` per decoder layer, in model order."""

    policy: str
    reentrant: bool
    batch: tuple[int, int] | None
    budget_bytes: int | None
    layers: list[LayerPlan]

    @property
    def bytes(self) -> int:
        """Bytes kept over plain checkpointing, all layers (at ``batch``)."""
        return sum(lp.bytes for lp in self.layers)

    @property
    def flops(self) -> float:
        """Recompute FLOPs avoided per step, all layers (at ``batch``)."""
        return sum(lp.flops for lp in self.layers)

    def ms(self, tflops: float = DEFAULT_TFLOPS) -> float:
        """The recompute avoided per step, ms, at ``tflops`` (matmul and attention alike: a lower bound)."""
        return self.flops / (tflops * 1e12) * 1e3

    def as_dict(self, tflops: float = DEFAULT_TFLOPS) -> dict:
        """A JSON-serialisable summary: the fields, the totals and each layer's kept outputs."""
        return {"policy": self.policy, "reentrant": self.reentrant, "batch": self.batch,
                "budget_bytes": self.budget_bytes, "kept_bytes": self.bytes, "flops_avoided": self.flops,
                "ms_avoided": self.ms(tflops), "tflops": tflops,
                "layers": [dataclasses.asdict(lp) for lp in self.layers]}

    def describe(self, tflops: float = DEFAULT_TFLOPS) -> str:
        """A table, a line per run of layers that keep the same outputs: what they keep, its bytes (over plain
        checkpointing, in the binary unit that suits their size: KiB, MiB, GiB), the recompute FLOPs it avoids per
        step and those in ms at ``tflops``, per layer, e.g. ``layers 20-31 keep self_attn.q_proj, ...: 608.00 MiB,
        2.61 TFLOP = 3.73 ms each``; then, for a layer that keeps less than it was offered, why: ``budget
        exhausted`` (and what was left, with its bytes) or ``nothing worth keeping`` (no output of the layer would
        be recomputed: :func:`candidates`); last the totals."""
        mode = "reentrant" if self.reentrant else "non-reentrant"
        if self.policy == "full":
            return f"full checkpointing ({mode}) of {len(self.layers)} layers: each keeps its input only"
        ms = 1e3 / (tflops * 1e12)
        lines = [f"selective checkpointing of {len(self.layers)} layers at batch {self.batch[0]} x {self.batch[1]} "
                 f"tokens, budget {_gib(self.budget_bytes)} (bytes kept over plain checkpointing; recompute avoided "
                 f"per step, ms at {tflops:g} TFLOP/s):"]
        runs: list[list[LayerPlan]] = []
        for lp in self.layers:
            if runs and _same(runs[-1][-1], lp):
                runs[-1].append(lp)
            else:
                runs.append([lp])
        for run in runs:
            first, last = run[0], run[-1]
            span = f"layer {first.index}" if first is last else f"layers {first.index}-{last.index}"
            each = "" if first is last else " each"
            if not first.offered:
                lines.append(f"  {span}: input only (nothing worth keeping: no projection or attention output that "
                             "the recomputation runs again)")
                continue
            left = ", ".join(f"{k.name} ({_gib(k.bytes)})" for k in first.left)
            if not first.kept:
                lines.append(f"  {span}: input only (budget exhausted; not kept{each}: {left})")
                continue
            names = ", ".join(k.name for k in first.kept)
            line = (f"  {span} keep {names}: {_gib(first.bytes)}, {_flop(first.flops)} = "
                    f"{first.flops * ms:.3g} ms{each}")
            lines.append(line + (f"; budget exhausted, not kept: {left}" if left else ""))
        lines.append(f"  in all: {_gib(self.bytes)} kept over plain checkpointing, {_flop(self.flops)} of "
                     f"recompute avoided per step = {self.ms(tflops):.3g} ms at {tflops:g} TFLOP/s")
        return "\n".join(lines)

    __str__ = describe


def _same(a: LayerPlan, b: LayerPlan) -> bool:
    """Whether two layers' plans print as one line: the same outputs kept and left, of the same sizes."""
    return ([(k.name, k.bytes) for k in a.kept], [(k.name, k.bytes) for k in a.left]) == \
        ([(k.name, k.bytes) for k in b.kept], [(k.name, k.bytes) for k in b.left])


def _gib(n: int | None) -> str:
    """Bytes in the largest binary unit (GiB, MiB, KiB) that keeps the number at least 1: a tiny model's plan does
    not print ``0.00 GiB`` for a budget it spends."""
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def _flop(f: float) -> str:
    """FLOPs in the largest decimal unit (TFLOP, GFLOP, MFLOP) that keeps the number at least 1."""
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(f) >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.0f} FLOP"


# ---- the model's layers and what they could keep -----------------------------------------------------------
def decoder_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The (name, module) of every decoder layer Hugging Face checkpoints (``GradientCheckpointingLayer``), in model
    order.

    Raises:
        ValueError: the model has none (not a transformers model, or one without checkpointing support).
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"model: {type(model).__name__} has no decoder layers that Hugging Face checkpoints "
                         "(transformers.modeling_layers.GradientCheckpointingLayer)")
    return layers


def _attention_shape(model: torch.nn.Module) -> tuple[int, int] | None:
    """(query heads, head dim) from the model's config when its attention runs a fused kernel (not "eager"), else
    None."""
    cfg = getattr(model, "config", None)
    cfg = getattr(cfg, "get_text_config", lambda: cfg)() if cfg is not None else None
    heads = getattr(cfg, "num_attention_heads", None)
    if not isinstance(heads, int) or getattr(cfg, "_attn_implementation", "eager") in (None, "eager"):
        return None
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return heads, int(head_dim)


def candidates(model: torch.nn.Module, layer: torch.nn.Module, batch: tuple[int, int],
               recomputed: dict[str, int] | None = None) -> list[Kept]:
    """What ``layer`` could keep at ``batch`` = (batch size, sequence length), in forward order: the outputs whose
    keeping saves recompute, ``recomputed`` (names and calls per forward from
    :func:`tigon.recompute.recomputed_outputs`, which runs the model once to find them when None): each projection
    (bytes ``tokens * out * element size``, FLOPs ``2 * tokens * in * out``, per call; the element size is the
    weight's, or under an active ``torch.autocast`` of the weight's device type its dtype's: call this, :func:`plan`
    or :func:`enable` inside the autocast context the training runs in) and ``"attention"`` (its
    output and fp32 log-sum-exp at the config's query heads and head dim; causal FLOPs
    ``2 * B * heads * T * (T + 1) * head_dim``, per call). Nothing else is offered: not a layer's last
    projection that nothing after it saves (recomputation stops before its matmul), not a hybrid's linear-attention
    or Mamba layer's attention, not an MoE block's experts or router (no ``nn.Linear``), not the attention of a model
    whose attention is "eager" (no fused kernel to save)."""
    if recomputed is None:
        layers = decoder_layers(model)
        index = next((i for i, (_, m) in enumerate(layers) if m is layer), None)
        if index is None:
            raise ValueError(f"layer: a {type(layer).__name__} that is not one of the model's decoder layers")
        recomputed = recompute.recomputed_outputs(model, layers)[index]
    b, t = batch
    tokens = b * t
    modules = dict(recompute.linears(layer))
    out = []
    for name, calls in recomputed.items():
        if name in modules:
            m = modules[name]
            out.append(Kept(name, calls * tokens * m.out_features * _activation_size(m.weight),
                            calls * 2.0 * tokens * m.in_features * m.out_features, calls))
        elif name == "attention" and _attention_shape(model) is not None:
            heads, head_dim = _attention_shape(model)
            size = next((_activation_size(m.weight) for m in modules.values()), 2)
            out.append(Kept("attention", calls * (tokens * heads * head_dim * size + b * heads * t * 4),
                            calls * 2.0 * b * heads * t * (t + 1) * head_dim, calls))
    return out


def _activation_size(weight: torch.Tensor) -> int:
    """Bytes per element of a projection's output: the weight's element size, or under an active ``torch.autocast``
    of its device type (which multiplies floating inputs and weights in its lower-precision dtype) that dtype's."""
    kind = weight.device.type
    if weight.is_floating_point() and weight.dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind).itemsize
    return weight.element_size()


OPTIMIZERS = ("adamw_torch", "adamw_torch_fused")
"""The optimizer names :func:`auto_budget` knows, as Hugging Face's ``TrainingArguments.optim`` spells them:
``"adamw_torch"`` is ``torch.optim.AdamW`` with PyTorch's default implementation (``foreach`` on CUDA: its step
allocates one temporary the size of the second moments, ``torch._foreach_sqrt(exp_avg_sqs)``); ``"adamw_torch_fused"``
is ``AdamW(fused=True)`` (no temporary)."""


def _check_optimizer(optimizer) -> None:
    """ValueError / TypeError naming ``optimizer`` unless it is None, a name of :data:`OPTIMIZERS` or an Adam / AdamW
    instance."""
    if optimizer is None or isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return
    if isinstance(optimizer, str):
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, an Adam / AdamW instance or None, "
                             f"got {optimizer!r}")
        return
    raise TypeError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, a torch.optim.Adam / AdamW instance or "
                    f"None, got {type(optimizer).__name__}")


def _check_batch(batch) -> tuple[int, int]:
    """``batch`` as (batch size, sequence length), two positive ints, or ValueError naming it."""
    if (not isinstance(batch, (tuple, list)) or len(batch) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in batch)):
        raise ValueError(f"batch must be (batch size, sequence length), two positive ints, for policy='selective' "
                         f"(the kept bytes scale with it), got {batch!r}")
    return int(batch[0]), int(batch[1])


def step_workspace_bytes(model: torch.nn.Module, optimizer=None) -> int:
    """Bytes the optimizer's step allocates on top of the weights, gradients and optimizer state: the room that step's
    peak leaves the activations of the forward and backward before it.

    Args:
        model: the model whose trainable parameters (``requires_grad``) the optimizer updates.
        optimizer: None (0: nothing assumed), one of :data:`OPTIMIZERS`, or a ``torch.optim.Adam`` / ``AdamW``
            instance (its own param groups, each with its ``fused`` / ``foreach`` settings; a name stands for one
            group of the model's trainable parameters). PyTorch's ``foreach`` Adam(W) forms ``sqrt(exp_avg_sq)`` for
            all parameters of a param group of one device and dtype at once (one buffer their size, freed before the
            next group: the largest such group counts, the lower and so safe side of the room where one group mixes
            devices or dtypes); the single-tensor path does it a parameter at a time (the
            largest parameter); the fused kernel allocates none. Source: ``torch/optim/adam.py``
            (``_multi_tensor_adam``, ``_single_tensor_adam``, ``_fused_adam``). On a CPU the default is the
            single-tensor path.

    Raises:
        ValueError: an optimizer name not in :data:`OPTIMIZERS`.
        TypeError: an optimizer instance other than ``torch.optim.Adam`` / ``AdamW``.
    """
    _check_optimizer(optimizer)  # even when nothing is trainable: a typo is still a typo
    if optimizer is None:
        return 0
    if isinstance(optimizer, str):  # one param group: the model's trainable parameters
        groups = [([p for p in model.parameters() if p.requires_grad], optimizer == "adamw_torch_fused", None)]
    else:  # the instance's own groups, each with its own settings
        groups = [([p for p in g["params"] if p.requires_grad], bool(g.get("fused")), g.get("foreach"))
                  for g in optimizer.param_groups]
    out = 0
    for params, fused, foreach in groups:
        if not params or fused:
            continue
        if foreach is None:  # PyTorch's default: foreach when every parameter is on an accelerator
            foreach = all(p.device.type != "cpu" for p in params)
        if not foreach:
            out = max(out, max(p.numel() * p.element_size() for p in params))
            continue
        by_kind: dict = {}  # the foreach step runs per param group, and in it per (device, dtype)
        for p in params:
            by_kind[(p.device, p.dtype)] = by_kind.get((p.device, p.dtype), 0) + p.numel() * p.element_size()
        out = max(out, max(by_kind.values()))
    return out


def auto_budget(model: torch.nn.Module, batch: tuple[int, int], optimizer=None) -> int:
    """The bytes a selective checkpoint may keep without raising the step's peak, when that peak is at the end of the
    backward or in the optimizer step, as in a full fine-tune with Tigon's fused LM-head loss (no logits) whose
    gradients are freed between steps (``zero_grad(set_to_none=True)``, no accumulation).

    The backward allocates each layer's parameter gradients as it frees that layer's activations, so the decoder
    layers' trainable parameter bytes are room that the activations can use before it; so is the optimizer step's
    own temporary (:func:`step_workspace_bytes`: the size of all trainable parameters for PyTorch's default
    ``foreach`` AdamW on a GPU, none for the fused one). Less the layers' checkpointed inputs
    (``tokens * hidden * element size`` each), the fused loss's fp32 buffer of the LM head's gradient (formed in the
    forward: alive at its end together with every kept output; 2 GiB for Llama-3-8B's head) and one layer's
    gradients of slack (the recomputation's working set). 0 when that is negative or nothing is trainable in the
    layers (LoRA): plain checkpointing.

    Measured on an H200 (Llama-3-8B, 32 layers, 4 x 2048 tokens, foreach AdamW): 8.6 GiB without the optimizer's
    room, 1.09x Liger-Kernel's tok/s; 20 GiB (every projection and attention output kept), 1.20x, the peak unchanged
    at 74.85 GiB (``benchmarks/results/h200/session16/``).

    Args:
        model: a Hugging Face model. batch: (batch size, sequence length). optimizer: see
            :func:`step_workspace_bytes` (None: no room assumed from the step).

    Raises:
        ValueError: ``batch`` not two positive ints; a model without decoder layers; an unknown optimizer name
            (TypeError for an optimizer of another class), even when nothing is trainable.
    """
    batch = _check_batch(batch)
    workspace = step_workspace_bytes(model, optimizer)
    layers = decoder_layers(model)
    grads = [sum(p.numel() * p.element_size() for p in m.parameters() if p.requires_grad) for _, m in layers]
    if not any(grads):
        return 0
    hidden = getattr(getattr(model, "config", None), "hidden_size", 0) or 0
    size = next((p.element_size() for p in model.parameters()), 2)
    inputs = len(layers) * batch[0] * batch[1] * hidden * size
    head = getattr(model, "get_output_embeddings", lambda: None)()
    weight = getattr(head, "weight", None)
    head_grad = weight.numel() * 4 if isinstance(weight, torch.Tensor) and weight.requires_grad else 0
    room = sum(grads) + workspace
    return max(0, room - inputs - head_grad - max(grads, default=0))


def plan(model: torch.nn.Module, policy: str = "selective", *, budget_bytes: int | None = None,
         batch: tuple[int, int] | None = None, reentrant: bool = False, optimizer=None) -> CheckpointPlan:
    """What :func:`enable` would keep, without changing the model (see the module docstring).

    ``"selective"``: every candidate output of every layer (:func:`candidates`) ordered by FLOPs per byte, then from
    the last layer down, then in forward order, taken while it fits the budget (one that does not fit is skipped
    and smaller ones after it may still be taken).

    Args:
        model: a Hugging Face model (patched by Tigon or not).
        policy: one of :data:`POLICIES`.
        budget_bytes: bytes to keep over plain checkpointing, all layers, at ``batch``; None: :func:`auto_budget`.
        optimizer: with ``budget_bytes=None``, the optimizer whose step follows the backward (one of
            :data:`OPTIMIZERS` or an Adam / AdamW instance): its step's temporary is room for the activations
            (:func:`step_workspace_bytes`). None assumes none.
        batch: (batch size, sequence length) of a micro-batch; needed by ``"selective"`` (bytes scale with it).
        reentrant: Hugging Face's ``use_reentrant`` (``"full"`` only: the selective policy needs the non-reentrant
            mode).

    Raises:
        ValueError: unknown ``policy``; ``"selective"`` with ``reentrant=True`` or without ``batch``; a negative
            ``budget_bytes``; a model without decoder layers; ``optimizer`` with a budget given or with
            ``"full"``; an unknown optimizer name (TypeError for an optimizer of another class).
    """
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not isinstance(reentrant, bool):
        raise TypeError(f"reentrant must be a bool, got {type(reentrant).__name__}")
    layers = decoder_layers(model)
    plans = [LayerPlan(i, name) for i, (name, _) in enumerate(layers)]
    if policy == "full":
        if budget_bytes is not None or optimizer is not None:
            raise ValueError("budget_bytes and optimizer apply to policy='selective' only (full checkpointing keeps "
                             "nothing extra)")
        return CheckpointPlan(policy, reentrant, batch, None, plans)
    if reentrant:
        raise ValueError("reentrant=True: policy='selective' needs non-reentrant checkpointing (torch's selective "
                         "checkpoint contexts); use reentrant=False, or policy='full' for the reentrant mode")
    batch = _check_batch(batch)
    if budget_bytes is None:
        budget_bytes = auto_budget(model, batch, optimizer)
    elif optimizer is not None:
        raise ValueError("optimizer sizes the automatic budget: give budget_bytes or optimizer, not both")
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be an int >= 0 (bytes) or None, got {budget_bytes!r}")
    found = recompute.recomputed_outputs(model, layers)
    for lp, (_, layer), names in zip(plans, layers, found):
        lp.offered = candidates(model, layer, batch, names)
    items = [(lp, j, k) for lp in plans for j, k in enumerate(lp.offered)]
    items.sort(key=lambda it: (-it[2].flops / max(it[2].bytes, 1), -it[0].index, it[1]))
    left, chosen = budget_bytes, set()
    for lp, j, k in items:
        if k.bytes <= left:
            left -= k.bytes
            chosen.add((lp.index, j))
    for lp in plans:
        lp.kept = [k for j, k in enumerate(lp.offered) if (lp.index, j) in chosen]
    return CheckpointPlan(policy, reentrant, batch, budget_bytes, plans)


# ---- turning it on ---------------------------------------------------------------------------------------------
def hf_enable(model: torch.nn.Module, reentrant: bool) -> None:
    """Hugging Face's activation (gradient) checkpointing on ``model``, ``use_reentrant=reentrant``: through
    ``activation_checkpointing_enable`` where transformers has it (the newer name), else
    ``gradient_checkpointing_enable``. Reentrant with frozen input embeddings (LoRA), also
    ``model.enable_input_require_grads()``: the reentrant checkpoint runs a layer's backward only when one of its
    inputs requires grad, else the layers' trainable parameters get no gradient (PyTorch warns, nothing fails)."""
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    weight = getattr(embeddings, "weight", None)
    if reentrant and isinstance(weight, torch.Tensor) and not weight.requires_grad:
        model.enable_input_require_grads()


def enable(model: torch.nn.Module, policy: str = "selective", *, budget_bytes: int | None = None,
           batch: tuple[int, int] | None = None, reentrant: bool = False, optimizer=None) -> CheckpointPlan:
    """Turn on activation checkpointing of every decoder layer of ``model`` (a Hugging Face model, patched by Tigon
    before or after, or not at all) and return what each layer keeps.

    ``"full"``: Hugging Face's checkpointing (``use_reentrant=reentrant``), the same as
    ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})`` (see
    :func:`hf_enable`). ``"selective"`` refuses ``reentrant=True`` (ValueError naming it: torch's selective
    checkpoint contexts run under the non-reentrant checkpoint only) and replaces a reentrant checkpointing that
    ``model.gradient_checkpointing_enable`` set before: the same non-reentrant checkpointing, then each layer that
    :func:`plan` gives outputs to keep gets
    ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...)`` with a selective-checkpoint policy
    keeping exactly those (see the module docstring). Arguments and errors: :func:`plan`. Call
    ``model.gradient_checkpointing_disable()`` to turn it off. Any later ``gradient_checkpointing_enable`` /
    ``activation_checkpointing_enable`` replaces the selective policy by plain checkpointing, silently: with Hugging
    Face's ``Trainer`` leave ``TrainingArguments.gradient_checkpointing`` (``activation_checkpointing``) off, or its
    ``use_reentrant=True`` kwargs, since the Trainer calls it again at the start of training.
    """
    from torch.utils.checkpoint import checkpoint

    p = plan(model, policy, budget_bytes=budget_bytes, batch=batch, reentrant=reentrant, optimizer=optimizer)
    hf_enable(model, reentrant)
    if policy == "full":
        return p
    ops = attention_ops()
    for lp, (_, layer) in zip(p.layers, decoder_layers(model)):
        if not lp.kept:
            continue
        names = {k.name for k in lp.kept}
        kept = tuple(m for n, m in recompute.linears(layer) if n in names)
        context = functools.partial(_contexts, kept, ops if "attention" in names else frozenset())
        layer._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False, context_fn=context)
    return p


def _contexts(kept: tuple[torch.nn.Linear, ...], attention: frozenset):
    """A checkpoint's ``context_fn``: the selective-checkpoint contexts of a new :func:`_policy` per checkpointed
    call (its state, autocast's weight copies and the forward's answers, belongs to that call)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy(kept, attention))


# ---- the policy ------------------------------------------------------------------------------------------------
def _policy(kept: tuple[torch.nn.Linear, ...], attention: frozenset):
    """The selective-checkpoint policy of one checkpointed call of a layer: ``MUST_SAVE`` for ``aten.mm`` /
    ``aten.addmm`` whose weight operand is the weight of one of the ``kept`` projections (read at the call, so that
    moving the model later is fine; the same storage, by shape under tracing, or under ``torch.autocast`` the weight's
    cast copy: :class:`tigon.recompute.WeightMatch`) and for the ops in ``attention``, ``PREFER_RECOMPUTE`` for
    everything else. Older torch asks again in the recomputation (``ctx.is_recompute``): it gets the forward's answers
    in the same order per op, so that what it takes from the cache is what the forward put there."""
    from torch.utils.checkpoint import CheckpointPolicy

    save, recompute_ = CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE
    match: list = []
    answers: dict = {}  # op -> the forward's answers, in order
    replayed: dict = {}  # op -> how many of them the recomputation has taken

    def policy(ctx, func, *args, **kwargs):
        if getattr(ctx, "is_recompute", False):
            done = answers.get(func, ())
            n = replayed.get(func, 0)
            replayed[func] = n + 1
            return done[n] if n < len(done) else recompute_
        if not match:
            match.append(recompute.WeightMatch(tuple(m.weight for m in kept)))
        hit = match[0](func, args, kwargs) is not None or func in attention
        answer = save if hit else recompute_
        answers.setdefault(func, []).append(answer)
        return answer

    return policy
