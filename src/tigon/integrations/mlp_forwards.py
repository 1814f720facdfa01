"""Replacement ``forward`` functions of gated MLPs built from a :class:`~tigon.integrations.families.MLPSpec`:
``down(swiglu|geglu(gate(x), up(x)))``, the down projection folded into :func:`tigon.functional.glu_linear` where it
can be (:func:`mlp_forward`), and the ``_apply_gate`` hook of MoE experts (:func:`experts_gate`); for every MLP kind
(the non-gated forward: :mod:`tigon.integrations.act_linear_forwards`) why a module cannot take its replacement
(:func:`mlp_problem`), the ops it runs (:func:`mlp_ops`) and the report's description (:func:`describe_mlp`).

The forwards are marked as every Tigon replacement is (:mod:`tigon.integrations.marks`); ops are looked up on
:mod:`tigon.functional` at call time, never bound at import. What they check before calling around a child:
:mod:`tigon.integrations.child_calls`; the activation: :mod:`tigon.integrations.mlp_activations`; small calls on a
GPU: :mod:`tigon.integrations.mlp_host_bound`.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .. import _checks
from .. import functional as TF
from .. import support
from .act_linear_forwards import act_linear_problem, describe_act_linear
from . import mlp_host_bound
from .child_calls import _META_PROBLEM, _outputs_private, fold_problem, plain_calls, under_checkpoint
from .families import ACTIVATIONS as _ACTIVATIONS
from .families import GLU_LINEAR_ACTIVATIONS
from .families import MLPSpec
from .marks import mark, tigon_mark
from .mlp_activations import mlp_activation, nongated_activation
from .mlp_host_bound import describe_host_bound, host_bound

_OWN_DICT = object.__getattribute__  # (a config's own __dict__, past PretrainedConfig.__getattribute__)
_ON_COMPILED_GPU = mlp_host_bound._on_compiled_gpu


def _glu(act: tuple[str, str | None], gate: torch.Tensor, up: torch.Tensor, inplace: bool = False,
         gm: float = 1.0, dm: float = 1.0, limit: float | None = None) -> torch.Tensor:
    """swiglu / geglu of ``act`` (``act(gm * gate) * up * dm``); ``inplace``: the backward writes d_gate / d_up into
    gate's / up's memory; ``limit``: swiglu's clamps (DeepSeek-V4; the callers pass it with swiglu only)."""
    op, approximate = act
    if op == "swiglu":
        return TF.swiglu(gate, up, gate_multiplier=gm, down_multiplier=dm, inplace_backward=inplace, limit=limit)
    return TF.geglu(gate, up, approximate=approximate, gate_multiplier=gm, down_multiplier=dm,
                    inplace_backward=inplace)


def mlp_limit(module, spec: MLPSpec) -> float | None:
    """The module's clamp named by ``spec.limit`` (DeepSeek-V4's ``self.limit``) as a float; None without."""
    return None if spec.limit is None else float(getattr(module, spec.limit))


def mlp_multipliers(module, spec: MLPSpec) -> tuple[float, float]:
    """The module's (gate, down) multipliers named by ``spec.multipliers``; (1.0, 1.0) without."""
    if spec.multipliers is None:
        return 1.0, 1.0
    return float(getattr(module, spec.multipliers[0])), float(getattr(module, spec.multipliers[1]))



def _lora_mlp():
    """:mod:`tigon.integrations.lora_mlp`, imported at its first use (it imports this module)."""
    from . import lora_mlp

    return lora_mlp


@functools.lru_cache(maxsize=None)
def mlp_forward(spec: MLPSpec, family: str, original):
    """``forward(self, x) = down(op(gate(x), up(x)))`` with op = swiglu / geglu picked from the config.

    With ``spec.multipliers`` (Falcon-H1): ``down(op(gate(x) * gm, up(x))) * dm``, gm and dm the op's kernel scalars
    (dm scales the product: the same as scaling ``down``'s output for a projection without bias; with a bias the
    output is scaled after ``down``).

    With ``spec.limit`` (DeepSeek-V4): ``down(swiglu(gate(x), up(x), limit=self.limit))``, the clamps of gate and up
    in the kernel (another activation than SiLU runs the original forward).

    With ``spec.gate_up``: ``gate, up = gate_up(x).chunk(2, -1)`` (the halves are read in place by the kernel).
    An activation without a kernel (checked per call, so class-level patches stay correct for any config) runs the
    original forward. gate and up are this forward's own projection outputs, used by nothing else (unless the
    projections have hooks, which could keep them: then not in place), so the backward writes their gradients into
    their memory (``inplace_backward=True``, as Liger does): two (tokens, intermediate) tensors less at the MLP's
    backward peak; a second backward through the same graph (``retain_graph=True``) then raises. When the down
    projection is a plain ``nn.Linear`` (:func:`~tigon.integrations.child_calls.foldable_linear`) it runs inside
    :func:`tigon.functional.glu_linear`, which in eager mode does not keep the (tokens, intermediate) product for the
    backward (recomputed there): one such tensor less per layer among the activations (under torch.compile the
    compiler's partitioner decides what is saved); otherwise (LoRA, quantised or hooked layers, or inside a
    non-reentrant activation checkpoint: :func:`under_checkpoint`) the module is called on the product. When gate, up
    (or gate-up) and down are adapter layers that :func:`tigon.patch` fused (PEFT LoRA), the whole MLP may run as one
    node instead (:func:`tigon.integrations.lora_mlp.fused_call`). On a CUDA GPU, small calls run the original
    forward (:func:`host_bound`).
    """

    act_attr = spec.act_config_attr if spec.activation is None else None  # (None: mlp_activation reads the spec)

    @functools.wraps(original)
    def forward(self, x, *args, **kwargs):
        # asked once for the helpers below, which would each ask (one Python frame per question)
        dynamo = support.dynamo_compiling()
        compiling = dynamo or support.COMPILER._is_compiling_flag  # (torch.compiler.is_compiling())
        # mlp_activation's usual case inline (the config's own dict, eagerly: see there); anything else asks it
        config = self.__dict__.get("config") if act_attr is not None and not dynamo else None
        name = _OWN_DICT(config, "__dict__").get(act_attr) if config is not None else None
        act = _ACTIVATIONS.get(name) if type(name) is str else None
        if act is None:
            act = mlp_activation(self, spec, dynamo)
        # host_bound applies on a CUDA GPU only: not asked for other tensors (unless a test stands in for its check)
        if (args or kwargs or isinstance(act, str)
                or ((x.is_cuda or mlp_host_bound._on_compiled_gpu is not _ON_COMPILED_GPU)
                    and host_bound(self, spec, act, x, compiling))):
            return original(self, x, *args, **kwargs)
        lim = None
        if spec.limit is not None:  # (DeepSeek-V4's clamp: swiglu's limit; SiLU only)
            if act[0] != "swiglu":
                return original(self, x, *args, **kwargs)
            lim = mlp_limit(self, spec)
        gate_up = spec.gate_up is not None
        mods = self.__dict__["_modules"]  # (the children read past nn.Module.__getattr__: one Python frame less each)
        act_module = mods.get(spec.act or "act_fn")
        if act_module is not None:  # (inline, no helper: no Python call more on the usual path)
            d = act_module.__dict__  # hooks or an instance forward: the fused call would skip them, the original runs
            if (d.get("_forward_hooks") or d.get("_forward_pre_hooks") or d.get("_backward_hooks")
                    or d.get("_backward_pre_hooks") or "forward" in d):
                return original(self, x, *args, **kwargs)
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
        # the usual case in one call (_no_hooks, _linear_calls, fold_problem and under_checkpoint): plain nn.Linear
        # projections computed without their __call__, and whether down folds; None: hooks somewhere, asked below
        calls = plain_calls(proj, down, x, dynamo, compiling)
        plain = calls is not None
        out = calls[0] if plain else None
        if out is None:
            out = (proj[0](x),) if gate_up else (proj[0](x), proj[1](x))
        gate, up = out[0].chunk(2, dim=-1) if gate_up else out
        inplace = plain or _outputs_private(*proj)
        gm, dm = mlp_multipliers(self, spec) if spec.multipliers is not None else (1.0, 1.0)
        if dm != 1.0 and getattr(down, "bias", None) is not None:  # HF scales down(y) = W y + b: not W (dm y) + b
            return down(_glu(act, gate, up, inplace, gm, limit=lim)) * dm
        if calls[1] if plain else (fold_problem(down) is None and not under_checkpoint(compiling)):  # (foldable)
            p = down.__dict__["_parameters"]  # (an nn.Linear's weight and bias, past nn.Module.__getattr__)
            return TF.glu_linear(gate, up, p["weight"], p["bias"], activation=GLU_LINEAR_ACTIVATIONS[act],
                                 gate_multiplier=gm, down_multiplier=dm, inplace_backward=inplace, limit=lim)
        return down(_glu(act, gate, up, inplace, gm, dm, lim))

    return mark(forward, "mlp", family)


@functools.lru_cache(maxsize=None)
def experts_gate(spec: MLPSpec, family: str, original):
    """``_apply_gate(self, gate_up_out) = op(*gate_up_out.chunk(2, -1))`` for a v5 MoE experts module,
    ``clamped_swiglu(gate_up_out, self.alpha, self.limit)`` for GPT-OSS's (``spec.activation`` ``"clamped_swiglu"``),
    or ``swiglu(*gate_up_out.chunk(2, -1), limit=self.limit)`` for DeepSeek-V4's (``spec.limit``; another activation
    than SiLU runs ``original``).

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
        if spec.limit is not None and act[0] != "swiglu":  # (DeepSeek-V4's clamp: SiLU only)
            return original(self, gate_up_out, *args, **kwargs)
        gate, up = gate_up_out.chunk(2, dim=-1)
        return _glu(act, gate, up, limit=mlp_limit(self, spec))

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
    if spec.experts and (spec.activation == "clamped_swiglu" or spec.limit is not None):
        problem = clamped_experts_problem(module, spec)
        if problem is not None:
            return problem
    elif spec.experts:
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
                    "is not separable; load with experts_implementation='grouped_mm' or 'batched_mm', or call "
                    "model.set_experts_implementation('grouped_mm') and tigon.patch(model) again, to use the kernels")
    else:
        names = (spec.gate_up, spec.down) if spec.gate_up is not None else (spec.gate, spec.up, spec.down)
        for attr in names:
            if not callable(getattr(module, attr, None)):
                return f"no callable attribute {attr!r}"
        for attr in spec.multipliers or ():
            value = getattr(module, attr, None)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return f"multiplier attribute {attr!r} is not a number ({type(value).__name__})"
    if spec.limit is not None and not spec.experts and (problem := _limit_problem(module, spec)) is not None:
        return problem
    act = mlp_activation(module, spec)
    if isinstance(act, str):
        return act
    if spec.limit is not None and act[0] != "swiglu":
        return (f"gate and up clamped at self.{spec.limit} around activation {act[0]!r}: only "
                "tigon.functional.swiglu takes a limit; left alone")
    return None


def _limit_problem(module, spec: MLPSpec) -> str | None:
    """Why the module's clamp ``spec.limit`` is no positive finite number (:func:`tigon.functional.swiglu`'s
    ``limit``), or None."""
    v = getattr(module, spec.limit, None)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (_checks.finite(v) and v > 0):
        return f"{type(module).__name__}.{spec.limit} is not a positive finite number ({v!r}); left alone"
    return None


def clamped_experts_problem(module, spec: MLPSpec | None = None) -> str | None:
    """Why a clamped experts ``module`` cannot take Tigon's op as its ``_apply_gate``, or None: GPT-OSS's
    (:func:`tigon.functional.clamped_swiglu`; ``spec`` None or without ``limit``) or DeepSeek-V4's
    (``swiglu(limit=...)``, ``spec.limit``). Its class must have the hook (transformers 5.2x; its own forward and the
    grouped_mm / batched_mm experts call it) as :func:`clamped_hook_problem` reads it, and the module numbers for
    the constants (GPT-OSS's ``alpha`` / ``limit``, DeepSeek-V4's ``spec.limit``)."""
    problem = clamped_hook_problem(type(module), spec)
    if problem is not None:
        return problem
    if spec is not None and spec.limit is not None:
        return _limit_problem(module, spec)
    for name in ("alpha", "limit"):
        v = getattr(module, name, None)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"{type(module).__name__}.{name} is not a number ({v!r})"
    return None


def clamped_hook_problem(cls: type, spec: MLPSpec | None = None) -> str | None:
    """Why the class ``cls`` has no ``_apply_gate`` that is GPT-OSS's clamped SwiGLU (``spec`` None or without
    ``limit``) or DeepSeek-V4's (``spec.limit``: gate and up the chunked halves, clamped at ``self.<limit>``, no alpha;
    and its own forward, which the ``eager`` experts implementation runs, calls the hook), read from their source;
    or None."""
    hook = getattr(cls, "_apply_gate", None)
    if hook is None:
        return "no _apply_gate hook in this transformers: its forward computes the clamped SwiGLU inline"
    if tigon_mark(hook) is not None:
        return None
    source = _source(hook)
    if spec is not None and spec.limit is not None:
        if not (all(w in source for w in (f"self.{spec.limit}", "clamp", "chunk(2")) and "alpha" not in source):
            return (f"{cls.__name__}._apply_gate is not DeepSeek-V4's clamped SwiGLU on the chunked gate / up halves "
                    f"(self.{spec.limit}, no alpha) as its source reads; left alone")
        if "_apply_gate" not in _source(getattr(cls, "forward", None)):
            return (f"{cls.__name__}.forward (the eager experts loop) does not call _apply_gate as its source reads; "
                    "left alone")
        return None
    if not all(word in source for word in ("self.alpha", "self.limit", "clamp", "sigmoid", "1::2")):
        return (f"{cls.__name__}._apply_gate is not GPT-OSS's clamped SwiGLU on interleaved gate / up "
                "(self.alpha, self.limit) as its source reads; left alone")
    return None


def _source(fn) -> str:
    """The source of ``fn`` (of the function it wraps: ``inspect.unwrap``), or "" when it cannot be read."""
    try:
        return inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError, ValueError):
        return ""


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
    clamp = ""
    if spec.limit is not None:  # DeepSeek-V4's clamps: swiglu's limit (SiLU only)
        if act is None or isinstance(act, str):
            name = f"<tigon.functional.swiglu if config.{spec.act_config_attr} is SiLU, else the original>"
        clamp = f", limit=self.{spec.limit}"
        if spec.experts:
            return (f"_apply_gate(gate_up) = {name}(*gate_up.chunk(2, -1){clamp}) (gate clamped above, up both ways "
                    "at the limit; the experts' own loop and the grouped_mm / batched_mm experts call it)")
    lora = _lora_mlp().describe(module, spec, act[0] if isinstance(act, tuple) else "act", lora_enabled)
    if lora is not None and not lora.startswith("its adapter layers are not"):
        return lora
    if spec.experts:
        return f"_apply_gate(gate_up) = {name}(*gate_up.chunk(2, -1)) for the grouped_mm / batched_mm experts"
    inner = f"*{spec.gate_up}(x).chunk(2, -1)" if spec.gate_up is not None else f"{spec.gate}(x), {spec.up}(x)"
    inner += clamp
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
