"""A patched attention whose q, k and v projections are fused PEFT LoRA layers: the projections and the rotary as one
:func:`tigon.functional.lora_qkv_rope` node, the check of the attention's forward, and the reasons it is not.

The patched attention forward (:func:`tigon.integrations.rotary_forwards.attention_forward`, the rope patch's) asks
:func:`call` when its class's forward begins with Hugging Face Llama's form (Llama, Qwen2, Mistral and the families
that copy it; :func:`form_problem` reads the source)::

    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)

and the three projections are layers :func:`tigon.patch` fused (``lora=True``; each passed
:func:`~tigon.integrations.lora.lora_problem`), without hooks, each fusing this call
(:func:`~tigon.integrations.lora._fused_adapter`: not merged, not disabled, no active dropout, dtypes), with
cos / sin spanning the head (or the family declared partial rotary). Then it computes q, k and v with the node before
the class's forward runs, and hands them over: each projection's patched forward returns its (B, T, H D) buffer
for that ``hidden_states`` (:func:`~tigon.integrations.rotary_forwards.handed_output`), so the forward's
``view(hidden_shape).transpose(1, 2)`` gives back the node's (B, H, T, D) output, and the rotary dispatcher returns
q and k as they are when they are those outputs with the same cos and sin. Everything after (the KV cache, the attention
function, sliding windows, o_proj) is the class's own code, unchanged. A hand-over the forward did not take raises
RuntimeError (the source check makes that a transformers change, not a silent double rotation).

Other forms keep the layers apart and say why in the report: per-head q / k norms between the projections and the
rotary (Qwen3, Gemma 3, OLMo 2), a fused qkv projection (Phi-3), another layout of rotary. Under ``torch.compile``
the class's forward runs with each projection fused on its own.
"""

from __future__ import annotations

import ast
import functools
import sys

import torch

from .. import functional as TF
from .families import ADAPTERS, AdapterSpec, RopeSpec
from .child_calls import _hook_problem
from .marks import tigon_mark
from .rotary_forwards import _scope
from .lora import _fused_adapter, lora_problem
from .rotary_calls import forward_statements


def _template(spec: RopeSpec) -> list[str]:
    q, k, v = spec.qkv
    return ["input_shape = hidden_states.shape[:-1]", "hidden_shape = (*input_shape, -1, self.head_dim)",
            f"query_states = self.{q}(hidden_states).view(hidden_shape).transpose(1, 2)",
            f"key_states = self.{k}(hidden_states).view(hidden_shape).transpose(1, 2)",
            f"value_states = self.{v}(hidden_states).view(hidden_shape).transpose(1, 2)",
            "cos, sin = position_embeddings",
            f"query_states, key_states = {spec.function}(query_states, key_states, cos, sin)"]


@functools.lru_cache(maxsize=None)
def form_problem(forward, spec: RopeSpec) -> str | None:
    """Why the attention ``forward`` (a class's) does not begin with HF Llama's q / k / v and rotary form for
    ``spec``'s projections and function (see the module docstring), or None when it does."""
    if spec.layout != "rotate_half":
        return f"its rotary layout is {spec.layout!r}; the fused node rotates the rotate-half layout"
    parsed = forward_statements(forward)
    if isinstance(parsed, str):
        return parsed
    fn, body = parsed
    params = [a.arg for a in fn.args.args[1:3]]
    lines = [ast.unparse(s) for s in body[:7]]
    template = _template(spec)
    if params == ["hidden_states", "position_embeddings"] and lines == template:
        uses = [n for n in ast.walk(fn) if isinstance(n, ast.Attribute) and n.attr in spec.qkv
                and isinstance(n.value, ast.Name) and n.value.id == fn.args.args[0].arg]
        if len(uses) == 3:
            return None
        return "its forward calls q / k / v projections more than once"
    qk = " ".join(line for line in lines if line.startswith(("query_states =", "key_states =")))
    if "norm" in qk:
        return ("per-head q / k norms between the projections and the rotary (e.g. Qwen3's q_norm / k_norm): the "
                "fused node rotates the projections' outputs directly")
    return ("its forward does not begin with HF Llama's form (q / k / v = self.<proj>(hidden_states).view(hidden_shape)"
            f".transpose(1, 2), then {spec.function}(query_states, key_states, cos, sin))")


def _adapter(m) -> AdapterSpec | None:
    """The adapter spec with a q / k / v op whose layer class ``m`` is (None: none)."""
    for a in ADAPTERS:
        mod = sys.modules.get(a.module)
        cls = getattr(mod, a.cls, None) if mod is not None and a.qkv_rope_op else None
        if cls is not None and isinstance(m, cls):
            return a
    return None


def problem(module, spec: RopeSpec, lora_enabled: bool = True) -> str | None:
    """Why the patched attention ``module`` with adapter layers on q / k / v does not run them with its rotary as one
    node (None when it does); for the report, at patch time."""
    if spec.layout != "rotate_half":
        return form_problem(None, spec)
    layers = [getattr(module, n, None) for n in spec.qkv]
    bare = [n for n, m in zip(spec.qkv, layers) if _adapter(m) is None]
    if bare:
        return f"{', '.join(bare)} carr{'ies' if len(bare) == 1 else 'y'} no adapter layer"
    if not lora_enabled:
        return f"tigon.patch(..., {_adapter(layers[0]).kind}=False) leaves its adapter layers to PEFT"
    if not isinstance(getattr(module, "head_dim", None), int):
        return "no int attribute head_dim"
    for n, m in zip(spec.qkv, layers):
        why = lora_problem(m) or _hook_problem(m, tigon_forward_ok=True)
        if why is not None:
            return f"{n}: {why}"
    return form_problem(type(module).forward, spec)


def _parts(m, name: str):
    base = m.base_layer
    return base.weight, m.lora_A[name].weight, m.lora_B[name].weight, base.bias, m.scaling[name]


def _fused(module, spec: RopeSpec, args: tuple, kwargs: dict):
    """``(x, layers, (q, k, v), cos, sin)`` computed by the fused node for this call, or None when the call does
    not take it (see the module docstring). Cheap attribute checks first: it runs for every attention call."""
    layers = tuple(module.__dict__["_modules"].get(n) for n in spec.qkv)
    names = []
    for m in layers:
        mk = tigon_mark(m.__dict__.get("forward")) if m is not None else None
        if mk is None or mk.get("adapter") is None or not mk["adapter"].qkv_rope_op:
            return None
    x = args[0] if args else kwargs.get("hidden_states")
    pe = args[1] if len(args) > 1 else kwargs.get("position_embeddings")
    if (not isinstance(x, torch.Tensor) or x.dim() != 3 or not isinstance(pe, (tuple, list)) or len(pe) != 2
            or torch.compiler.is_compiling()):
        return None
    cos, sin = pe
    d = module.head_dim
    if (not isinstance(cos, torch.Tensor) or not isinstance(sin, torch.Tensor) or cos.dim() not in (2, 3)
            or not (cos.shape[-1] == d or (spec.partial_rotary and cos.shape[-1] < d))):
        return None
    for m in layers:
        name = None if _hook_problem(m, tigon_forward_ok=True) is not None else _fused_adapter(m, x)
        if name is None:
            return None
        names.append(name)
    (wq, aq, bq, cq, sq), (wk, ak, bk, ck, sk), (wv, av, bv, cv, sv) = (_parts(m, n) for m, n in zip(layers, names))
    q, k, v = TF.lora_qkv_rope(x, cos, sin, wq, aq, bq, wk, ak, bk, wv, av, bv, head_dim=d, q_bias=cq, k_bias=ck,
                               v_bias=cv, q_scaling=sq, k_scaling=sk, v_scaling=sv)
    return x, layers, (q, k, v), cos, sin


def call(module, spec: RopeSpec, original, args: tuple, kwargs: dict):
    """``original(module, *args, **kwargs)`` (the class's attention forward), with q / k / v and the rotary computed
    by one :func:`tigon.functional.lora_qkv_rope` node when this call takes it (see the module docstring).

    Raises:
        RuntimeError: the forward did not take the hand-over (it did not call each projection once on
            ``hidden_states`` and the rotary function on their outputs), which :func:`form_problem` rules out.
    """
    fused = _fused(module, spec, args, kwargs)
    if fused is None:
        return original(module, *args, **kwargs)
    x, layers, (q, k, v), cos, sin = fused
    before = (_scope.handed, _scope.rotated)
    _scope.handed = {id(m): (x, y.transpose(1, 2).flatten(2)) for m, y in zip(layers, (q, k, v))}
    _scope.rotated = (q, k, cos, sin)
    try:
        out = original(module, *args, **kwargs)
        left = [n for n, m in zip(spec.qkv, layers) if id(m) in _scope.handed]
        left += [spec.function] if _scope.rotated is not None else []
        if left:
            raise RuntimeError(f"tigon: {type(module).__name__}.forward did not call {', '.join(left)} as its source "
                               "read at patch time (HF Llama's form); the fused q / k / v node's outputs were not "
                               "used. Unpatch the model (tigon.unpatch) and report this transformers version.")
        return out
    finally:
        _scope.handed, _scope.rotated = before


def describe(module, spec: RopeSpec, lora_enabled: bool) -> tuple[tuple[str, ...], str] | None:
    """``(ops, text)`` for the report of an attention whose q / k / v are adapter layers (None when none is):
    ``(("lora_qkv_rope",), ...)`` when they run with the rotary as one node, else ``((), why not)``."""
    layers = [getattr(module, n, None) for n in spec.qkv] if module is not None else []
    adapter = next((a for a in map(_adapter, layers) if a is not None), None)
    if adapter is None:
        fused = [n for n, c in module.named_children() if _adapter(c) is not None] if module is not None else []
        if fused and all(m is None for m in layers):  # one fused qkv projection (Phi-3's qkv_proj)
            return (), (f"its adapter layers ({', '.join(fused)}) are not fused with the rotary (the node takes "
                        f"separate {' / '.join(spec.qkv)} projections, not one fused qkv projection)")
        return None
    why = problem(module, spec, lora_enabled)
    if why is not None:
        return (), f"its {' / '.join(spec.qkv)} adapter layers are not fused with the rotary ({why})"
    return (adapter.qkv_rope_op,), (
        f"{' / '.join(spec.qkv)} with their PEFT LoRA adapters and {spec.function} as one "
        f"tigon.functional.{adapter.qkv_rope_op} node (one stacked A product, q and k rotated in place, the rotary's "
        "transpose and every dx term into one buffer in the backward; base weights frozen; the attention's own "
        "forward after it); the layers one by one and the scoped rope at a call where an adapter is merged, "
        "disabled or has active dropout")
