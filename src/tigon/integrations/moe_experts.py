"""The ``forward`` of a transformers v5 MoE experts module (``@use_experts_implementation``) with Tigon's glue around
transformers' own grouped matmuls: :func:`experts_forward`, set on the instance beside the ``_apply_gate`` hook
(:func:`tigon.integrations.mlp_forwards.experts_gate`), and why a module cannot take it (:func:`glue_problem`).

transformers' ``grouped_mm_experts_forward`` (``integrations/moe.py``) surrounds its two grouped matmuls with a dozen
passes over (S, hidden) and (S, 2 intermediate) tensors (S = tokens x top_k). This forward keeps its sort, offsets
(``histc`` / ``cumsum``: no host sync) and grouped matmuls (``_grouped_linear`` without bias), and replaces the rest
by three ops, each one pass forward and one backward:

    xg = moe_gather(hidden_states, positions)                       # hidden_states[perm // k] and its scatter-add
    h  = moe_expert_gate(grouped(xg, gate_up_proj), offsets, gate_up_proj_bias, activation)   # + bias[ids], gate
    out = moe_combine(grouped(h, down_proj), top_k_weights, positions, offsets, down_proj_bias)
          # + bias[ids], * weights, [inv_perm], .view(T, k, H).sum(1)

``positions`` (T, k) is HF's ``inv_perm``: the sorted row of each (token, slot). The routing weights stay in token
order (their gradient too: no ``sample_weights[perm]`` gather). Values: those of ``grouped_mm_experts_forward`` with
every sum in fp32 and one rounding per op (HF rounds the bias add, the weight product and the activation to the
matmuls' dtype in between). Under ``torch.compile`` the forward traces without a graph break (the sort, ``histc`` and
the grouped matmuls are ATen ops) and each glue op follows the compile mode (:func:`tigon.support.compiled_choice`):
its ``tigon::moe_*`` custom ops (the kernels) in ``"kernels"``, its reference, fused by Inductor, in ``"auto"`` (the
ops' records) and ``"inductor"``.

The replacement applies per call only to what it reproduces: ``config._experts_implementation`` ``"grouped_mm"``
(other implementations, e.g. ``batched_mm`` or ``eager`` set later with ``set_experts_implementation``, run the class's
forward, with Tigon's ``_apply_gate``), no expert parallelism (``_is_expert_parallel``), no post-expert norm, 2-D inputs
and no extra arguments, and an activation Tigon has; otherwise the class's forward runs.
"""

from __future__ import annotations

import functools

import torch

from .. import functional as TF
from .families import MLPSpec
from .marks import mark, tigon_mark
from .mlp_activations import mlp_activation

MOE_OPS = ("moe_gather", "moe_expert_gate", "moe_combine")
"""The :mod:`tigon.functional` ops the experts forward runs (the report's ``ops``)."""
MOE_GATE_OP = MOE_OPS[1]
"""The one of them that holds the experts' activation (what ``tigon profile`` times for the MLP kind)."""

_GATE_ACTIVATION = {("swiglu", None): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_tanh",
                    ("clamped_swiglu", None): "clamped_swiglu"}
"""The gated activation (:data:`~tigon.integrations.families.ACTIVATIONS` value) -> moe_expert_gate's activation."""


@functools.lru_cache(maxsize=None)
def _hf_moe():
    """transformers' ``integrations.moe`` module when it has what this forward calls (``_grouped_linear`` and
    ``grouped_mm_experts_forward``), else None."""
    try:
        from transformers.integrations import moe
    except ImportError:
        return None
    ok = callable(getattr(moe, "_grouped_linear", None)) and callable(getattr(moe, "grouped_mm_experts_forward", None))
    return moe if ok else None


def gate_options(module, spec: MLPSpec):
    """``(activation, alpha, limit)`` of :func:`tigon.functional.moe_expert_gate` for ``module``, or a string saying
    why it has none: GPT-OSS's clamped SwiGLU (``spec.activation``; the module's ``alpha`` / ``limit``), DeepSeek-V4's
    clamp (``spec.limit``, SiLU only), else the config's activation."""
    act = mlp_activation(module, spec)
    if isinstance(act, str):
        return act
    name = _GATE_ACTIVATION.get(act)
    if name is None:
        return f"activation {act[0]!r} has no moe_expert_gate form"
    if name == "clamped_swiglu":
        return name, float(module.alpha), float(module.limit)
    if spec.limit is not None:
        if name != "silu":
            return f"gate and up clamped at self.{spec.limit} around activation {name!r}: SiLU only"
        return name, 1.702, float(getattr(module, spec.limit))
    return name, 1.702, None


_PLAIN = (torch.nn.Parameter, torch.Tensor)


def _call_problem(module) -> str | None:
    """What, per call, sends ``module`` to its class's forward (the checks that can change after patching)."""
    impl = getattr(getattr(module, "config", None), "_experts_implementation", None)
    if impl != "grouped_mm":
        return (f"config._experts_implementation is {impl!r}: only transformers' 'grouped_mm' experts are replaced "
                "(its forward runs, with Tigon's _apply_gate where that applies)")
    if getattr(module, "_is_expert_parallel", False) or type(module.gate_up_proj) not in _PLAIN:
        # (transformers 5.17 has no _is_expert_parallel: a sharded module's weights are DTensors there)
        return ("expert / tensor parallel (_is_expert_parallel, or DTensor weights): its sentinel rows are left to "
                "transformers' forward")
    if getattr(module, "has_post_expert_norm", False):
        return "has_post_expert_norm: a norm between the experts and the routing weights; left to transformers"
    return None


def glue_problem(module, spec: MLPSpec) -> str | None:
    """Why the experts ``module`` cannot take :func:`experts_forward` (it then keeps only the ``_apply_gate`` patch),
    or None: no ``grouped_mm`` experts in this transformers, a class forward other than transformers' experts
    dispatcher, an instance ``forward`` set by another library (tensor / expert parallelism), distributed (DTensor)
    weights, weights not of the expected shapes, an activation without a gate form, or the per-call conditions
    (:func:`_call_problem`) false now."""
    if _hf_moe() is None:
        return "no grouped_mm experts implementation in this transformers (integrations.moe._grouped_linear)"
    forward = getattr(type(module), "forward", None)
    if tigon_mark(forward) is None and not _dispatcher(forward):
        return (f"{type(module).__name__}.forward is not transformers' experts dispatcher "
                "(@use_experts_implementation) as its code reads; left alone")
    own = module.__dict__.get("forward")
    if own is not None and tigon_mark(own) is None:
        return "its instance forward was set by another library (tensor / expert parallelism?); left alone"
    options = _module_options(module, spec)
    return options if isinstance(options, str) else None


def _module_options(module, spec: MLPSpec) -> str | tuple:
    """:func:`gate_options` of the experts ``module``, or why it cannot take :func:`experts_forward` (the checks of
    :func:`glue_problem` that read the module: flags, weights, activation, and the per-call ones)."""
    if not all(isinstance(getattr(module, a, None), bool) for a in ("has_gate", "has_bias", "is_transposed")):
        return "no has_gate / has_bias / is_transposed flags (not a @use_experts_implementation module)"
    if not module.has_gate:
        return "experts without a gate (has_gate False)"
    names = ("gate_up_proj", "down_proj") + (("gate_up_proj_bias", "down_proj_bias") if module.has_bias else ())
    for name in names:
        p = getattr(module, name, None)
        if not isinstance(p, torch.Tensor) or p.dim() != (2 if name.endswith("bias") else 3):
            return f"{name} is not a {2 if name.endswith('bias') else 3}-D tensor"
        if type(p) not in _PLAIN:
            return f"{name} is a {type(p).__name__} (a tensor subclass, e.g. a DTensor): left to transformers"
    if not isinstance(getattr(module, "num_experts", None), int):
        return "no num_experts"
    return _call_problem(module) or gate_options(module, spec)


def class_glue(cls: type) -> bool:
    """Whether a class-level patch of the experts class ``cls`` also sets :func:`experts_forward` on it: this
    transformers has ``grouped_mm`` experts and ``cls.forward`` is their dispatcher, not yet Tigon's (each module's
    own conditions, :func:`glue_problem`, are checked per call)."""
    forward = getattr(cls, "forward", None)
    return _hf_moe() is not None and tigon_mark(forward) is None and _dispatcher(forward)


def _dispatcher(fn) -> bool:
    """Whether ``fn`` is ``@use_experts_implementation``'s forward, which picks the function of
    ``config._experts_implementation`` (read from its own code: ``functools.wraps`` made it look like the class's
    original forward, which ``inspect`` would show)."""
    names = getattr(getattr(fn, "__code__", None), "co_names", ())
    return "get_interface" in names and "_experts_implementation" in names


@functools.lru_cache(maxsize=None)
def experts_forward(spec: MLPSpec, family: str, original, class_level: bool = False):
    """``forward(self, hidden_states (T, H), top_k_index (T, k), top_k_weights (T, k)) -> (T, H)``: transformers'
    ``grouped_mm_experts_forward`` with Tigon's glue (module docstring); ``original`` (the class's forward, the
    experts-implementation dispatcher) where a call is not one it reproduces. Bound to an instance, :func:`glue_problem`
    was checked when patching and its per-call part (:func:`_call_problem`) is checked on every call; set on the class
    (``class_level``, ``tigon.patch("olmoe")``: every model of the family, built before or after), the module's part of
    :func:`glue_problem` is checked on every call (a few attribute reads; the class forward is this one, and an
    instance forward set by another library is called instead of it)."""
    def per_call(module) -> str | tuple:  # the gate options, or why this call runs the class's forward
        return _module_options(module, spec) if class_level else _call_problem(module) or gate_options(module, spec)
    # (read here, not in the forward: under torch.compile Dynamo warns at every trace of an lru_cache call; this
    # forward is only made where _hf_moe() is not None, glue_problem / class_glue)
    hf_moe = _hf_moe()

    @functools.wraps(original)
    def forward(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs):
        options = None if args or kwargs or hidden_states.dim() != 2 or top_k_index.dim() != 2 else per_call(self)
        if not isinstance(options, tuple):
            return original(self, hidden_states, top_k_index, top_k_weights, *args, **kwargs)
        activation, alpha, limit = options
        grouped = hf_moe._grouped_linear
        tokens, k = top_k_index.shape
        experts = self.num_experts
        ids, perm = torch.sort(top_k_index.reshape(-1))
        # grouped_mm's offsets as transformers forms them (histc: no host sync, CUDA-graph safe; float on CPU / MPS)
        counts = torch.histc(ids.float() if ids.device.type in ("cpu", "mps") else ids.int(), bins=experts, min=0,
                             max=experts - 1)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        positions = torch.empty_like(perm)
        positions[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
        positions = positions.view(tokens, k)
        bias = self.has_bias
        rows = TF.moe_gather(hidden_states, positions)
        gate_up = grouped(rows, self.gate_up_proj, offsets, is_transposed=self.is_transposed)
        h = TF.moe_expert_gate(gate_up, offsets, self.gate_up_proj_bias if bias else None, activation, alpha, limit)
        down = grouped(h, self.down_proj, offsets, is_transposed=self.is_transposed)
        out = TF.moe_combine(down, top_k_weights, positions, offsets, self.down_proj_bias if bias else None)
        return out.to(hidden_states.dtype)

    return mark(forward, "mlp", family, experts_forward=True)


def describe(module, spec: MLPSpec, gate: str) -> str:
    """The report's detail of a patched experts module: the glue forward and ``gate`` (the ``_apply_gate`` patch's
    description), or why the forward is left as it is."""
    if module is None:
        return (f"{gate}; forward: transformers' grouped_mm experts with Tigon's glue (tigon.functional.moe_gather, "
                "moe_expert_gate, moe_combine) for each module that takes it, checked per call (else the class's "
                "forward)")
    problem = glue_problem(module, spec)
    if problem is not None:
        return f"{gate}; forward left as is ({problem})"
    options = gate_options(module, spec)
    extra = f", limit={options[2]:g}" if options[2] is not None else ""
    extra = f", alpha={options[1]:g}{extra}" if options[0] == "clamped_swiglu" else extra
    bias = "with the per-expert biases, " if module.has_bias else ""
    return (f"forward: transformers' grouped_mm experts with Tigon's glue around its grouped matmuls: "
            f"tigon.functional.moe_gather, moe_expert_gate(activation={options[0]!r}{extra}), moe_combine ({bias}"
            "one pass each way; config._experts_implementation 'grouped_mm' checked per call, else the class's "
            f"forward); {gate}")
