"""Replacement ``forward`` functions built from a spec: norms, gated and non-gated MLPs (the scoped rotary dispatcher
and the attention forward: :mod:`tigon.integrations.rotary_forwards`).

Each factory returns a plain function ``forward(self, ...)`` usable both as a class attribute (class-level patch) and
bound to one instance with :class:`types.MethodType` (instance-level patch). Every function carries the attribute
:data:`MARK` (``{"kind": ..., "family": ...}``) so the engine can recognise its own patches, and
``functools.wraps(original)`` so ``inspect.signature`` (used by Trainer and generate) still sees the original.

Ops are looked up on :mod:`tigon.functional` at call time, never bound at import.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .. import functional as TF
from .. import support
from .families import ACTIVATIONS, NONGATED_ACTIVATIONS, MLPSpec, NormSpec

MARK = "__tigon_patch__"


def mark(fn, kind: str, family: str, **extra):
    """Tag ``fn`` as a Tigon replacement of ``kind`` for ``family`` (plus ``extra`` facts, e.g. the options it was
    built with) and return it."""
    setattr(fn, MARK, {"kind": kind, "family": family, **extra})
    return fn


def tigon_mark(fn) -> dict | None:
    """The MARK dict of a function or bound method, or None when it is not Tigon's."""
    return getattr(getattr(fn, "__func__", fn), MARK, None)


# ---- norms ---------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def norm_forward(spec: NormSpec, family: str, original):
    """``forward(self, x)`` running rms_norm / layer_norm with the instance's own weight (and bias) and epsilon;
    ``forward(self, x, gate)`` running rms_norm_gated for a gated norm (``spec.gated``; no gate: the original; the
    instance's groups of statistics and gate order, :func:`gated_options`)."""
    eps_attr = spec.eps_attr if isinstance(spec.eps_attr, str) else None  # (one name: read inline)
    if spec.kind == "rms_norm" and spec.gated:

        @functools.wraps(original)
        def forward(self, hidden_states, gate=None, *args, **kwargs):
            if gate is None or args or kwargs:
                return original(self, hidden_states, gate, *args, **kwargs)
            n_groups, before = gated_options(self, spec)
            return TF.rms_norm_gated(hidden_states, gate, getattr(self, spec.weight_attr), norm_eps(self, spec),
                                     spec.offset, spec.casting_mode,
                                     hidden_states.shape[-1] // n_groups if n_groups != 1 else None, before)

    elif spec.kind == "rms_norm":

        @functools.wraps(original)
        def forward(self, hidden_states, *args, **kwargs):
            if args or kwargs:
                return original(self, hidden_states, *args, **kwargs)
            weight = self.__dict__["_parameters"].get(spec.weight_attr)  # (past nn.Module.__getattr__: one frame less)
            if weight is None and not spec.optional_weight:
                weight = getattr(self, spec.weight_attr)
            elif weight is None:
                weight = getattr(self, spec.weight_attr, None)
            eps = getattr(self, eps_attr, None) if eps_attr is not None else norm_eps(self, spec)  # (norm_eps inline)
            return TF.rms_norm(hidden_states, weight, eps, spec.offset, spec.casting_mode)

    elif spec.kind == "layer_norm":

        @functools.wraps(original)
        def forward(self, hidden_states, *args, **kwargs):
            if args or kwargs:
                return original(self, hidden_states, *args, **kwargs)
            weight = getattr(self, spec.weight_attr, None)
            if spec.offset and weight is not None:
                weight = weight + spec.offset  # Nemotron's LayerNorm1P: (1 + w), a (hidden,) add
            return TF.layer_norm(hidden_states, weight, getattr(self, spec.bias_attr, None),
                                 norm_eps(self, spec))

    else:
        raise ValueError(f"NormSpec.kind must be 'rms_norm' or 'layer_norm', got {spec.kind!r}")
    return mark(forward, spec.kind, family)


def norm_eps(module, spec: NormSpec):
    """The module's epsilon: its attribute ``spec.eps_attr``, or of a tuple of names the first it has (None if none)."""
    if isinstance(spec.eps_attr, str):
        return getattr(module, spec.eps_attr, None)
    return next((v for v in (getattr(module, n, None) for n in spec.eps_attr) if v is not None), None)


def gated_options(module, spec: NormSpec) -> tuple:
    """(n_groups, norm_before_gate) of a gated norm instance: its ``n_groups`` (Falcon-H1's), or its width over its
    ``group_size`` (Mamba-2's copies), else 1; its ``norm_before_gate``, else the spec's. Unchecked values
    (:func:`norm_problem` checks them)."""
    n_groups = getattr(module, "n_groups", None)
    if n_groups is None:
        size, w = getattr(module, "group_size", None), getattr(module, spec.weight_attr, None)
        if size is None:
            n_groups = 1
        elif (isinstance(size, int) and size > 0 and isinstance(w, torch.Tensor) and w.dim() == 1
              and w.shape[0] % size == 0):
            n_groups = w.shape[0] // size
        else:
            n_groups = f"group_size={size!r}"  # not an int: norm_problem says why
    return n_groups, getattr(module, "norm_before_gate", spec.norm_before_gate)


def norm_problem(module, spec: NormSpec) -> str | None:
    """Why ``module`` cannot take the Tigon norm forward, or None when it can."""
    w = getattr(module, spec.weight_attr, None)
    if spec.kind == "rms_norm" and not isinstance(w, torch.Tensor) and not (spec.optional_weight and w is None):
        return f"no tensor attribute {spec.weight_attr!r} (RMSNorm without weight is not supported)"
    if isinstance(w, torch.Tensor) and w.dim() != 1:
        return f"{spec.weight_attr} has shape {tuple(w.shape)}, expected 1-D"
    if not isinstance(norm_eps(module, spec), (int, float)):
        return f"no numeric epsilon attribute {spec.eps_attr!r}"
    n_groups, before = gated_options(module, spec) if spec.gated else (1, True)
    if not isinstance(n_groups, int) or n_groups < 1 or (isinstance(w, torch.Tensor) and w.shape[0] % n_groups):
        return (f"grouped gated RMSNorm: its groups (n_groups / group_size: {n_groups}) do not split its width "
                f"{tuple(w.shape) if isinstance(w, torch.Tensor) else w}")
    if not isinstance(before, bool):
        return f"norm_before_gate={before!r} is not a bool"
    return None


# ---- gated MLPs ----------------------------------------------------------------------------------------------
def mlp_activation(module, spec: MLPSpec, dynamo: bool | None = None) -> tuple[str, str | None] | str:
    """``(op, approximate)`` for the module's activation (see ACTIVATIONS), or a string saying why not.

    ``spec.activation`` when set (generic matcher), else ``module.config.<spec.act_config_attr>``. ``dynamo``:
    ``support.dynamo_compiling()`` where the caller asked it already (None: asked here).
    """
    if spec.activation is not None:
        name, where = spec.activation, "probed activation"
    else:
        config = module.__dict__.get("config") or getattr(module, "config", None)
        # the config's own dict first, read past PretrainedConfig.__getattribute__ in eager mode (its attribute_map
        # aliases: ~1 us and three Python frames per read, ``config.__dict__`` included; dynamo cannot trace
        # object.__getattribute__, and its trace runs once); an aliased name is then read by getattr
        if dynamo is None:
            dynamo = support.dynamo_compiling()
        own = (None if config is None else config.__dict__ if dynamo
               else object.__getattribute__(config, "__dict__"))
        name = (own.get(spec.act_config_attr) or getattr(config, spec.act_config_attr, None)
                if config is not None else None)
        where = f"config.{spec.act_config_attr}"
        if name is None and config is None:  # a module without config (Qwen2.5-VL's vision MLP): its act_fn's class
            name, where = _activation_name(getattr(module, "act_fn", None)), "the class of its act_fn"
        if name is None:
            return f"cannot read config.{spec.act_config_attr} from the module"
    act = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if act is None:
        return f"activation {name!r} ({where}) has no Tigon kernel; supported: " + ", ".join(ACTIVATIONS)
    return act


def _activation_name(act_fn) -> str | None:
    """The :data:`ACTIVATIONS` name of an activation module built by ``transformers.activations.ACT2FN``, when its
    class alone identifies one Tigon op (entries built with options, e.g. ``gelu_10``'s clipping, are not
    considered: their class does not tell the options); else None."""
    if act_fn is None:
        return None
    try:
        from transformers.activations import ACT2CLS
    except ImportError:
        return None
    names = [n for n, cls in ACT2CLS.items() if not isinstance(cls, tuple) and type(act_fn) is cls]
    ops = {ACTIVATIONS.get(n) for n in names}
    return names[0] if names and len(ops) == 1 and None not in ops else None


def _glu(act: tuple[str, str | None], gate: torch.Tensor, up: torch.Tensor, inplace: bool = False,
         gm: float = 1.0, dm: float = 1.0) -> torch.Tensor:
    """swiglu / geglu of ``act`` (``act(gm * gate) * up * dm``); ``inplace``: the backward writes d_gate / d_up into
    gate's / up's memory."""
    op, approximate = act
    if op == "swiglu":
        return TF.swiglu(gate, up, gate_multiplier=gm, down_multiplier=dm, inplace_backward=inplace)
    return TF.geglu(gate, up, approximate=approximate, gate_multiplier=gm, down_multiplier=dm,
                    inplace_backward=inplace)


def mlp_multipliers(module, spec: MLPSpec) -> tuple[float, float]:
    """The module's (gate, down) multipliers named by ``spec.multipliers``; (1.0, 1.0) without."""
    if spec.multipliers is None:
        return 1.0, 1.0
    return float(getattr(module, spec.multipliers[0])), float(getattr(module, spec.multipliers[1]))


_GLU_LINEAR_ACTIVATION = {("swiglu", None): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_tanh"}


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


def _lora_mlp():
    """:mod:`tigon.integrations.lora_mlp`, imported at its first use (it imports this module)."""
    from . import lora_mlp

    return lora_mlp


def _on_compiled_gpu(x: torch.Tensor, compiling: bool | None = None) -> bool:
    """Whether the kernels would run compiled on a CUDA GPU for ``x`` in eager mode (where the host-bound choice of
    :func:`host_bound` applies; under the interpreter or torch.compile the kernels' host cost is not what it
    saves). ``compiling``: ``torch.compiler.is_compiling()`` where the caller asked it already (None: asked here)."""
    if not x.is_cuda:
        return False
    if compiling is None:
        compiling = support.dynamo_compiling() or support.COMPILER._is_compiling_flag  # (is_compiling())
    return not compiling and not support.interpreter_enabled()


def _intermediate(module, spec: MLPSpec) -> int | None:
    """The MLP's intermediate size, from its gate (or fused gate-up) projection's ``out_features`` (None if absent)."""
    if spec.gate_up is not None:
        n = getattr(getattr(module, spec.gate_up), "out_features", None)
        return n // 2 if isinstance(n, int) else None
    n = getattr(getattr(module, spec.gate if spec.gate is not None else spec.up), "out_features", None)  # (non-gated)
    return n if isinstance(n, int) else None


def host_bound(module, spec: MLPSpec, act: tuple[str, str | None], x: torch.Tensor,
               compiling: bool | None = None) -> bool:
    """Whether the patched MLP ``module`` runs its original forward for input ``x``: on a CUDA GPU in eager mode,
    when its product has at most the ``host_bound_elements`` of its op's record (swiglu / geglu; see
    :attr:`tigon.ops.OpSpec.host_bound_elements`) tokens x intermediate elements. ``compiling``: as
    :func:`_on_compiled_gpu`'s."""
    if not _on_compiled_gpu(x, compiling):
        return False
    limit = support.host_bound_elements(_host_bound_default(act[0]))
    if not limit or not x.dim():
        return False
    inter = _intermediate(module, spec)
    return inter is not None and x.numel() // max(x.shape[-1], 1) * inter <= limit


@functools.lru_cache(maxsize=None)
def _host_bound_default(op: str) -> int:
    """The record's :attr:`~tigon.ops.OpSpec.host_bound_elements` of ``op`` (read once)."""
    from .. import ops

    return ops.get(op).host_bound_elements


def describe_host_bound(module, spec: MLPSpec, op: str | None = None) -> str:
    """The patch report's sentence on the host-bound choice of a patched MLP ("" when its threshold is 0); ``op``: the
    record that holds the threshold (default: the gated op of the MLP's activation)."""
    act = mlp_activation(module, spec) if module is not None and op is None else None
    op = op or (act[0] if isinstance(act, tuple) else "swiglu")
    limit = support.host_bound_elements(_host_bound_default(op))
    if not limit or spec.experts:
        return ""
    return (f"; on a CUDA GPU in eager mode, a call of at most {limit} tokens x intermediate elements runs the "
            "original forward (ATen: less host time at sizes where the step waits on the host; the original's "
            f"numerics; tigon.ops.get({op!r}).host_bound_elements, TIGON_HOST_BOUND_ELEMENTS overrides it)")


@functools.lru_cache(maxsize=None)
def mlp_forward(spec: MLPSpec, family: str, original):
    """``forward(self, x) = down(op(gate(x), up(x)))`` with op = swiglu / geglu picked from the config.

    With ``spec.multipliers`` (Falcon-H1): ``down(op(gate(x) * gm, up(x))) * dm``, gm and dm the op's kernel scalars
    (dm scales the product: the same as scaling ``down``'s output for a projection without bias; with a bias the
    output is scaled after ``down``).

    With ``spec.gate_up``: ``gate, up = gate_up(x).chunk(2, -1)`` (the halves are read in place by the kernel).
    An activation without a kernel (checked per call, so class-level patches stay correct for any config) runs the
    original forward. gate and up are this forward's own projection outputs, used by nothing else (unless the
    projections have hooks, which could keep them: then not in place), so the backward writes their gradients into
    their memory (``inplace_backward=True``, as Liger does): two (tokens, intermediate) tensors less at the MLP's
    backward peak; a second backward through the same graph (``retain_graph=True``) then raises. When the down
    projection is a plain ``nn.Linear`` (:func:`foldable_linear`) it runs inside :func:`tigon.functional.glu_linear`,
    which in eager mode does not keep the (tokens, intermediate) product for the backward (recomputed there): one such
    tensor less per layer among the activations (under torch.compile the compiler's partitioner decides what is
    saved); otherwise (LoRA, quantised or hooked layers, or inside a non-reentrant activation checkpoint:
    :func:`under_checkpoint`) the module is called on the product. When gate, up (or gate-up) and down are adapter
    layers that :func:`tigon.patch` fused (PEFT LoRA), the whole MLP may run as one node instead
    (:func:`tigon.integrations.lora_mlp.fused_call`). On a CUDA GPU, small calls run the original forward
    (:func:`host_bound`).
    """

    @functools.wraps(original)
    def forward(self, x, *args, **kwargs):
        # asked once for the helpers below, which would each ask (one Python frame per question)
        dynamo = support.dynamo_compiling()
        compiling = dynamo or support.COMPILER._is_compiling_flag  # (torch.compiler.is_compiling())
        act = mlp_activation(self, spec, dynamo)
        if args or kwargs or isinstance(act, str) or host_bound(self, spec, act, x, compiling):
            return original(self, x, *args, **kwargs)
        gate_up = spec.gate_up is not None
        mods = self.__dict__["_modules"]  # (the children read past nn.Module.__getattr__: one Python frame less each)
        proj = (mods.get(spec.gate_up),) if gate_up else (mods.get(spec.gate), mods.get(spec.up))
        if None in proj:  # (not submodules: attributes of another kind)
            proj = (getattr(self, spec.gate_up),) if gate_up else (getattr(self, spec.gate), getattr(self, spec.up))
        own = proj[0].__dict__.get("forward")  # (an adapter layer's forward is set on the instance)
        adapter = (tigon_mark(own) or {}).get("adapter") if own is not None else None
        if adapter is not None and (adapter.gate_up_op if gate_up else adapter.mlp_op) is not None:
            out = _lora_mlp().fused_call(self, spec, act, x)
            if out is not None:
                return out
        down = mods.get(spec.down)
        if down is None:
            down = getattr(self, spec.down)
        plain = _no_hooks(*proj, down)  # the usual case, in one call: no _hook_problem per module below
        out = _linear_calls(proj, x, dynamo) if plain else None  # (plain nn.Linear projections without their __call__)
        if out is None:
            out = (proj[0](x),) if gate_up else (proj[0](x), proj[1](x))
        gate, up = out[0].chunk(2, dim=-1) if gate_up else out
        inplace = plain or _outputs_private(*proj)
        gm, dm = mlp_multipliers(self, spec) if spec.multipliers is not None else (1.0, 1.0)
        if dm != 1.0 and getattr(down, "bias", None) is not None:  # HF scales down(y) = W y + b: not W (dm y) + b
            return down(_glu(act, gate, up, inplace, gm)) * dm
        if fold_problem(down, hooks_checked=plain) is None and not under_checkpoint(compiling):  # (foldable_linear)
            p = down.__dict__["_parameters"]  # (an nn.Linear's weight and bias, past nn.Module.__getattr__)
            return TF.glu_linear(gate, up, p["weight"], p["bias"], activation=_GLU_LINEAR_ACTIVATION[act],
                                 gate_multiplier=gm, down_multiplier=dm, inplace_backward=inplace)
        return down(_glu(act, gate, up, inplace, gm, dm))

    return mark(forward, "mlp", family)


@functools.lru_cache(maxsize=None)
def experts_gate(spec: MLPSpec, family: str, original):
    """``_apply_gate(self, gate_up_out) = op(*gate_up_out.chunk(2, -1))`` for a v5 MoE experts module, or
    ``clamped_swiglu(gate_up_out, self.alpha, self.limit)`` for GPT-OSS's (``spec.activation`` ``"clamped_swiglu"``).

    ``gate_up_out``: (S, 2 * I) output of the experts' fused gate-up projection for S routed (token, expert) pairs;
    returns (S, I) in its dtype. An activation without a kernel runs ``original`` (the class's hook).
    """

    @functools.wraps(original)
    def _apply_gate(self, gate_up_out, *args, **kwargs):
        act = mlp_activation(self, spec)
        if args or kwargs or isinstance(act, str):
            return original(self, gate_up_out, *args, **kwargs)
        if act[0] == "clamped_swiglu":  # GPT-OSS: interleaved gate / up, the module's alpha and limit
            return TF.clamped_swiglu(gate_up_out, self.alpha, self.limit)
        gate, up = gate_up_out.chunk(2, dim=-1)
        return _glu(act, gate, up)

    return mark(_apply_gate, "mlp", family)


def default_experts_gate():
    """transformers' ``_default_apply_gate`` (``act_fn(gate) * up`` on the chunked halves), or None when the
    installed transformers has no experts-implementation hook."""
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:
        return None
    return _default_apply_gate


def mlp_problem(module, spec: MLPSpec) -> str | None:
    """Why ``module`` cannot take the Tigon MLP forward (or experts hook), or None when it can. A non-gated MLP
    never can (``module`` may be None then: the reason is the spec's)."""
    if not spec.gated:
        return act_linear_problem(module, spec)
    if spec.experts and spec.activation == "clamped_swiglu":
        return clamped_experts_problem(module)
    if spec.experts:
        hook = getattr(type(module), "_apply_gate", None)
        default = default_experts_gate()
        if hook is None or default is None:
            return "no _apply_gate hook in this transformers (experts implementation interface missing)"
        if hook is not default and tigon_mark(hook) is None:
            return f"{type(module).__name__} defines its own _apply_gate (a custom gating function); left alone"
        if getattr(module, "has_gate", True) is False or getattr(module, "is_concatenated", True) is False:
            return "experts without a concatenated [gate; up] projection"
        impl = getattr(getattr(module, "config", None), "_experts_implementation", None)
        if impl == "eager":
            return ("config._experts_implementation is 'eager': its loop computes act_fn(gate) * up inline, which "
                    "is not separable; load with experts_implementation='grouped_mm' or 'batched_mm' to use the "
                    "kernel")
    else:
        names = (spec.gate_up, spec.down) if spec.gate_up is not None else (spec.gate, spec.up, spec.down)
        for attr in names:
            if not callable(getattr(module, attr, None)):
                return f"no callable attribute {attr!r}"
        for attr in spec.multipliers or ():
            value = getattr(module, attr, None)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"multiplier attribute {attr!r} is not a number ({type(value).__name__})"
    act = mlp_activation(module, spec)
    return act if isinstance(act, str) else None


def clamped_experts_problem(module) -> str | None:
    """Why GPT-OSS's experts ``module`` cannot take :func:`tigon.functional.clamped_swiglu` as its ``_apply_gate``,
    or None: its class must have the hook (transformers 5.2x; its own forward and the grouped_mm / batched_mm
    experts call it), written as GPT-OSS's clamped SwiGLU on ``self.alpha`` / ``self.limit``, and the module numbers
    for both."""
    problem = clamped_hook_problem(type(module))
    if problem is not None:
        return problem
    for name in ("alpha", "limit"):
        v = getattr(module, name, None)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{type(module).__name__}.{name} is not a number ({v!r})"
    return None


def clamped_hook_problem(cls: type) -> str | None:
    """Why the class ``cls`` has no ``_apply_gate`` that is GPT-OSS's clamped SwiGLU (read from its source), or None."""
    hook = getattr(cls, "_apply_gate", None)
    if hook is None:
        return "no _apply_gate hook in this transformers: its forward computes the clamped SwiGLU inline"
    if tigon_mark(hook) is None:
        try:
            source = inspect.getsource(hook)
        except (OSError, TypeError):
            source = ""
        if not all(word in source for word in ("self.alpha", "self.limit", "clamp", "sigmoid", "1::2")):
            return (f"{cls.__name__}._apply_gate is not GPT-OSS's clamped SwiGLU on interleaved gate / up "
                    "(self.alpha, self.limit) as its source reads; left alone")
    return None


def _folds(module, spec: MLPSpec) -> tuple[bool, str | None]:
    """Whether the patched MLP ``module`` runs its down projection inside glu_linear (on the meta device: once its
    weights are loaded), and why not (:func:`fold_problem`)."""
    problem = fold_problem(getattr(module, spec.down, None))
    return problem is None or problem == _META_PROBLEM, problem


def mlp_ops(module, spec: MLPSpec, lora_enabled: bool = True) -> tuple[str, ...]:
    """The :mod:`tigon.functional` op the patched MLP (experts hook) of ``module`` runs: ``lora_glu_mlp`` (or
    ``lora_gate_up_mlp`` with one gate-up projection) when its projections are fused LoRA layers taken in with it,
    ``glu_linear`` when its down projection is folded in, else ``swiglu`` / ``geglu`` of its activation; () when
    ``module`` is None (a class-level patch: the activation comes from each model's config) or its activation has no
    kernel."""
    if not spec.gated:
        return ("act_linear",) if module is not None and nongated_activation(module, spec)[0] is not None else ()
    act = mlp_activation(module, spec) if module is not None else None
    if not isinstance(act, tuple):
        return ()
    adapter = _lora_mlp().mlp_adapter(module, spec)
    if adapter is not None and _lora_mlp().mlp_problem(module, spec, lora_enabled) is None:
        return (_lora_mlp().adapter_op(adapter, spec),)
    return ("glu_linear",) if not spec.experts and _folds(module, spec)[0] else (act[0],)


def describe_mlp(module, spec: MLPSpec, lora_enabled: bool = True) -> str:
    """What the patched MLP computes, e.g. ``down_proj(tigon.functional.swiglu(gate_proj(x), up_proj(x)))``; for
    projections that are adapter layers, whether they run with it as one node and why not
    (:func:`tigon.integrations.lora_mlp.describe`); for a non-gated MLP, :func:`describe_act_linear`."""
    if not spec.gated:
        return describe_act_linear(module, spec)
    act = mlp_activation(module, spec) if module is not None else None
    if act is None or isinstance(act, str):
        name = f"<tigon.functional.swiglu or geglu, chosen per call by config.{spec.act_config_attr}>"
    else:
        name = f"tigon.functional.{act[0]}" + (f"(approximate={act[1]!r})" if act[0] == "geglu" else "")
    if spec.experts and spec.activation == "clamped_swiglu":
        return f"_apply_gate(gate_up) = {name}(gate_up, self.alpha, self.limit) (interleaved gate / up)"
    lora = _lora_mlp().describe(module, spec, act[0] if isinstance(act, tuple) else "act", lora_enabled)
    if lora is not None and not lora.startswith("its adapter layers are not"):
        return lora
    if spec.experts:
        return f"_apply_gate(gate_up) = {name}(*gate_up.chunk(2, -1)) for the grouped_mm / batched_mm experts"
    inner = f"*{spec.gate_up}(x).chunk(2, -1)" if spec.gate_up is not None else f"{spec.gate}(x), {spec.up}(x)"
    folds, problem = _folds(module, spec) if module is not None else (True, None)
    if folds:
        # a model built on the meta device (tigon inspect, deferred loading) folds once its weights are real
        fold = (f"; {'a plain nn.Linear ' if module is None else ''}{spec.down} is folded in "
                + ("once its weights are loaded (on the meta device now) " if problem else "")
                + "(tigon.functional.glu_linear: the product is recomputed in the backward, not stored; checked "
                "again at every call: hooks or an instance-level forward added later make it call the layer; inside a "
                "non-reentrant activation checkpoint it calls the layer too, so that the recomputation stops before "
                "that matmul)")
    else:
        fold = f"; {spec.down} is called on the product ({problem})"
    lora_note = f"; {lora}" if lora is not None else ""
    return f"{spec.down}({name}({inner})){fold}{describe_host_bound(module, spec)}{lora_note}"


# ---- non-gated MLPs ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _activation_classes() -> dict[type, str]:
    """Activation module class -> its :data:`NONGATED_ACTIVATIONS` value, for the classes of
    ``transformers.activations.ACT2CLS`` (entries built with options, e.g. ``gelu_10``'s clipping, left out: their
    class alone does not tell the options) and torch's ReLU / SiLU; ``torch.nn.GELU`` is read by its ``approximate``
    (:func:`nongated_activation`)."""
    out = {torch.nn.ReLU: "relu", torch.nn.SiLU: "silu"}
    try:
        from transformers.activations import ACT2CLS
    except ImportError:
        return out
    for name, cls in ACT2CLS.items():
        if not isinstance(cls, tuple) and name in NONGATED_ACTIVATIONS:
            out[cls] = NONGATED_ACTIVATIONS[name]
    return out


def nongated_activation(module, spec: MLPSpec) -> tuple[str | None, str | None]:
    """``(activation, None)``: the :func:`tigon.functional.act_linear` activation of the non-gated MLP ``module``, named
    by the exact class of its activation module ``module.<spec.act>`` (a subclass may compute something else); or
    ``(None, why not)``."""
    act_fn = getattr(module, spec.act, None) if spec.act is not None else None
    cls = type(act_fn)
    name = _activation_classes().get(cls)
    if name is None and cls is torch.nn.GELU:
        name = {"none": "gelu", "tanh": "gelu_tanh"}.get(act_fn.approximate)
    if name is not None:
        return name, None
    if act_fn is None:
        return None, f"no activation module {spec.act!r}"
    return None, (f"activation {cls.__module__}.{cls.__qualname__} ({spec.act}) has no Tigon kernel; supported: "
                  + ", ".join(sorted(NONGATED_ACTIVATIONS)) + ", torch.nn.GELU")


def act_linear_problem(module, spec: MLPSpec) -> str | None:
    """Why the non-gated MLP ``module`` (None: its class, at class level) cannot take :func:`act_linear_forward`, or
    None: its spec declares its activation module (:attr:`MLPSpec.act`), the activation has a kernel, and its down
    projection folds into the op (:func:`fold_problem`; on the meta device: once its weights are loaded)."""
    if spec.act is None:
        return (f"non-gated MLP {spec.down}(act({spec.up}(x))) without a declared activation module (MLPSpec.act): "
                "its forward is not known to be exactly that; left alone")
    if module is None:
        return None  # class level: each call checks its instance
    if not callable(getattr(module, spec.up, None)):
        return f"no callable attribute {spec.up!r}"
    act, why = nongated_activation(module, spec)
    if act is None:
        return why
    problem = fold_problem(getattr(module, spec.down, None), linear_cls=spec.linear_cls)
    if problem is not None and problem != _META_PROBLEM:
        return (f"{spec.down} cannot be folded into tigon.functional.act_linear ({problem}); a lone activation gains "
                "nothing, so the MLP is left alone")
    return None


@functools.lru_cache(maxsize=None)
def act_linear_forward(spec: MLPSpec, family: str, original):
    """``forward(self, x) = act_linear(up(x), down.weight, down.bias, activation=...)`` for a non-gated MLP whose
    forward is ``down(act(up(x)))``: the same result, with ``act(h)`` recomputed in the backward instead of saved
    (one (tokens, I) tensor less per layer; :func:`tigon.functional.act_linear`). The activation comes from the class of
    the module's activation module (:func:`nongated_activation`), read per call, as are the conditions under which the
    original forward runs instead: an activation without a kernel, a down projection that does not fold
    (:func:`fold_problem`: hooks, an instance-level forward, LoRA, quantised or DTensor weights), hooks on the
    activation module, a non-reentrant activation checkpoint (:func:`under_checkpoint`: nothing is saved there, and
    the fold would recompute the down projection for nothing) and, on a CUDA GPU, small calls (:func:`host_bound`).
    h is the up projection's own output, so the backward writes d_h into its memory (``inplace_backward``) unless
    the up projection has hooks (which could keep it)."""

    @functools.wraps(original)
    def forward(self, x, *args, **kwargs):
        act, _ = nongated_activation(self, spec)
        if args or kwargs or act is None or host_bound(self, spec, ("act_linear", None), x):
            return original(self, x, *args, **kwargs)
        up, down, act_fn = getattr(self, spec.up), getattr(self, spec.down), getattr(self, spec.act)
        plain = _no_hooks(up, down, act_fn)  # the usual case, in one call
        if ((not plain and _hook_problem(act_fn) is not None) or under_checkpoint()
                or fold_problem(down, hooks_checked=plain, linear_cls=spec.linear_cls) is not None):
            return original(self, x, *args, **kwargs)
        return TF.act_linear(up(x), down.weight, down.bias, activation=act,
                             inplace_backward=plain or _outputs_private(up))

    return mark(forward, "mlp", family)


def describe_act_linear(module, spec: MLPSpec) -> str:
    """What the patched non-gated MLP computes, for the report."""
    act = nongated_activation(module, spec)[0] if module is not None else None
    how = f"activation={act!r}" if act is not None else f"the activation named by the class of self.{spec.act}"
    return (f"tigon.functional.act_linear({spec.up}(x), {spec.down}.weight, {spec.down}.bias, {how}): "
            f"{spec.down}(act({spec.up}(x))) with act(h) recomputed in the backward, not stored; checked again at every "
            f"call: hooks or an instance-level forward added later, a {spec.down} that no longer folds, or a "
            "non-reentrant activation checkpoint make it run the original forward"
            + describe_host_bound(module, spec, "act_linear"))
