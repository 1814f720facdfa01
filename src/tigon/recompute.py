"""What a checkpointed decoder layer's recomputation runs again: the facts :mod:`tigon.checkpointing` plans from.

PyTorch's non-reentrant checkpoint re-runs a layer's forward in the backward only until the last tensor the layer's
backward needs has been saved again (early stop: ``torch.utils.checkpoint``'s ``_StopRecomputationError``). A
projection whose matmul runs after that point (in a plain pre-norm layer the MLP's down projection: ``nn.Linear``
saves its input before its matmul and the residual add saves nothing) is never recomputed, so keeping its output
saves nothing; the same projection followed by a norm that saves its input (Gemma 2's post-feed-forward norm) is
recomputed. Which is which depends on the forward's order, not on the order the modules are registered in (Falcon-H1
and Bamba register the MLP before the mixers it runs after), and on modules that are not ``nn.Linear`` (the experts
and routers of Mixtral-style MoE blocks hold bare parameters). So :func:`recomputed_outputs` does not guess: it runs
the model once on a few tokens under a non-reentrant checkpoint of every decoder layer and records, during the
recomputation, the ``aten.mm`` / ``aten.addmm`` on a layer's ``nn.Linear`` weights (or on autocast's copies of them:
:class:`WeightMatch`) and the fused attention ops (:func:`attention_ops`) that run again.
"""

from __future__ import annotations

import functools
import weakref

import torch

PROBE_TOKENS = 8
"""Tokens of the probe's one sequence: enough for every path of a layer (MoE routing, attention), cheap on any model."""


def attention_ops() -> frozenset:
    """The fused attention ops a layer that keeps ``"attention"`` saves: PyTorch's scaled-dot-product kernels (flash,
    memory-efficient, cuDNN, CPU flash) and flash-attn's forward when that package has registered it."""
    names = [("aten", "_scaled_dot_product_flash_attention"), ("aten", "_scaled_dot_product_efficient_attention"),
             ("aten", "_scaled_dot_product_cudnn_attention"), ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
             ("flash_attn", "_flash_attn_forward"), ("flash_attn", "_flash_attn_varlen_forward")]
    ops = set()
    for ns, name in names:
        try:
            ops.add(getattr(getattr(torch.ops, ns), name).default)
        except (AttributeError, RuntimeError):
            pass
    return frozenset(ops)


def matmul_weight(func, args) -> torch.Tensor | None:
    """The weight operand (a projection's transposed weight) of an ``aten.mm`` / ``aten.addmm`` call, else None."""
    if func is torch.ops.aten.mm.default:
        return args[1]
    if func is torch.ops.aten.addmm.default:
        return args[2]
    return None


def is_one_of(operand: torch.Tensor, weights: tuple[torch.Tensor, ...]) -> bool:
    """Whether the matmul operand (a projection's transposed weight) is one of ``weights``: the same storage, or under
    tracing (fake tensors, no storage) the transposed shape of one."""
    try:
        ptr = operand.untyped_storage().data_ptr()
        if ptr:
            return any(w.untyped_storage().data_ptr() == ptr for w in weights)
    except (RuntimeError, NotImplementedError, TypeError):
        pass
    return operand.dim() == 2 and any(tuple(operand.shape) == (w.shape[1], w.shape[0]) for w in weights)


class WeightMatch:
    """Which of ``weights`` (projection weights, ``(out, in)``) an ``aten.mm`` / ``aten.addmm`` multiplies by, fed
    every op of a region in order (call it on each): the weight itself (:func:`is_one_of`: its storage, or its
    transposed shape under tracing), or under ``torch.autocast`` its lower-precision copy. Autocast casts the weight
    (``aten._to_copy`` of it, then ``t`` of the copy) before the matmul and caches the copy for the rest of its
    region, so a later call of the same projection multiplies by that copy with no cast before it: a cast of one of
    ``weights`` is noted, the next matmul by a copy of its dtype and transposed shape is that weight's, and the copy is
    remembered (a weak reference: a copy freed since cannot match a new tensor at its address) for later calls.
    """

    def __init__(self, weights: tuple[torch.Tensor, ...]):
        self.weights = tuple(weights)
        self._pending: dict[tuple, list[int]] = {}  # (dtype, transposed shape) -> weights cast, matmul not yet seen
        self._copies: list[tuple[weakref.ref, int]] = []  # autocast's cached copies: (copy, index of its weight)

    def __call__(self, func, args, kwargs=None) -> int | None:
        """The index in ``weights`` of the matmul's weight operand; None for another op or another weight."""
        operand = matmul_weight(func, args)
        if operand is None:
            if func is _TO_COPY and args and isinstance(args[0], torch.Tensor) and args[0].dim() == 2:
                i = self._same_storage(args[0])
                dtype = (kwargs or {}).get("dtype")
                if i is not None and dtype is not None and dtype != args[0].dtype:
                    w = self.weights[i]
                    self._pending.setdefault((dtype, (w.shape[1], w.shape[0])), []).append(i)
            return None
        i = next((j for j, w in enumerate(self.weights) if is_one_of(operand, (w,))), None)
        if i is not None or not (self._pending or self._copies):
            return i
        ptr = _storage_ptr(operand)
        if not ptr:
            return None
        for ref, j in self._copies:
            copy = ref()
            if copy is not None and _storage_ptr(copy) == ptr:
                return j
        queue = self._pending.get((operand.dtype, tuple(operand.shape)))
        if not queue:
            return None
        j = queue.pop(0)
        base = operand._base if operand._base is not None else operand
        self._copies.append((weakref.ref(base), j))
        return j

    def _same_storage(self, tensor: torch.Tensor) -> int | None:
        ptr = _storage_ptr(tensor)
        if not ptr:
            return None
        return next((j for j, w in enumerate(self.weights) if _storage_ptr(w) == ptr), None)


_TO_COPY = torch.ops.aten._to_copy.default


def _storage_ptr(tensor: torch.Tensor) -> int:
    """The address of the tensor's storage, 0 where it has none (fake tensors under tracing)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return 0


def linears(layer: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """The layer's ``nn.Linear`` modules whose outputs a selective checkpoint may keep, without PEFT's LoRA layers
    (their small A / B matrices, and their base layers: Tigon's fused LoRA adds the low-rank product into the base
    matmul's output in place, which a kept output must not be)."""
    return [(n, m) for n, m in layer.named_modules()
            if isinstance(m, torch.nn.Linear) and "lora_" not in n and not n.endswith("base_layer")]


def recomputed_outputs(model: torch.nn.Module, layers: list[tuple[str, torch.nn.Module]]) -> list[dict[str, int]]:
    """Per decoder layer of ``layers`` (:func:`tigon.checkpointing.decoder_layers`), in forward order, the names of
    its projections (:func:`linears`) whose matmul the recomputation of a non-reentrant checkpoint runs again, and
    ``"attention"`` when it runs a fused attention op (:func:`attention_ops`) again: the outputs whose keeping saves
    recompute, each with the number of times it runs per forward (Gemma 3n's AltUp router runs twice: keeping it
    keeps, and saves, both outputs).

    Runs ``model(input_ids=...)`` once on :data:`PROBE_TOKENS` tokens in training mode with every layer checkpointed
    (``torch.utils.checkpoint.checkpoint(use_reentrant=False)``, the recomputation under a dispatch mode that records
    the ops it runs: those a selective-checkpoint policy sees), and the backward to the embeddings' output only (no
    parameter gradient is formed). The model's parameters keep their ``requires_grad`` (what a layer saves depends on
    it: set it as for training first); its training flags, its layers' checkpointing settings and the RNG state are
    restored.

    Raises:
        ValueError: the model's forward or backward failed on a batch of token ids (no input embeddings, weights on
            the meta device, an attention implementation that refuses the config), with the cause chained.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import checkpoint

    attention = attention_ops()
    found: list[dict[str, int]] = [{} for _ in layers]

    class Record(TorchDispatchMode):
        """Counts in ``names`` the layer's projections and attention as their ops run, while ``counting`` (the
        recomputation; the forward is watched too, for the weight copies autocast caches there: :class:`WeightMatch`).
        """

        def __init__(self, named, names, match, counting):
            super().__init__()
            self.named, self.names, self.match, self.counting = named, names, match, counting

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            index = self.match(func, args, kwargs)
            name = self.named[index][0] if index is not None else "attention" if func in attention else None
            if name is not None and self.counting:
                self.names[name] = self.names.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    def recorder(i: int, layer: torch.nn.Module):
        named, runs = linears(layer), [0]
        match = WeightMatch(tuple(m.weight for _, m in named))

        def run(function, *args):  # the first run is the forward, the second the recomputation: recorded
            runs[0] += 1
            with Record(named, found[i], match, counting=runs[0] == 2):
                return function(*args)

        def checkpointed(function, *args):
            return checkpoint(functools.partial(run, function), *args, use_reentrant=False)

        return checkpointed

    embeddings = model.get_input_embeddings()
    weight = embeddings.weight
    ids = torch.arange(3, 3 + PROBE_TOKENS, device=weight.device)[None] % embeddings.num_embeddings
    leaf: list[torch.Tensor] = []

    def make_leaf(module, inputs, output):
        leaf.append(output.detach().requires_grad_())
        return leaf[-1]

    training = {m: m.training for m in model.modules()}
    saved = [{k: layer.__dict__[k] for k in ("gradient_checkpointing", "_gradient_checkpointing_func")
              if k in layer.__dict__} for _, layer in layers]
    hook = embeddings.register_forward_hook(make_leaf)
    devices = [weight.device] if weight.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.enable_grad():
            model.train()
            for i, (_, layer) in enumerate(layers):
                layer.gradient_checkpointing, layer._gradient_checkpointing_func = True, recorder(i, layer)
            out = model(input_ids=ids, use_cache=False)
            logits = out[0] if isinstance(out, tuple) else getattr(out, "logits", None)
            if logits is None:
                logits = out.last_hidden_state
            torch.autograd.grad(logits.float().sum(), leaf[:1], allow_unused=True)
    except Exception as e:
        raise ValueError(f"model: a {type(model).__name__} failed to run a forward and backward on {PROBE_TOKENS} "
                         f"token ids with its decoder layers checkpointed, which finds the outputs worth keeping "
                         f"({type(e).__name__}: {e})") from e
    finally:
        hook.remove()
        for m, flag in training.items():
            m.training = flag
        for (_, layer), attrs in zip(layers, saved):
            for k in ("gradient_checkpointing", "_gradient_checkpointing_func"):
                layer.__dict__.pop(k, None)
            layer.__dict__.update(attrs)
    return found
