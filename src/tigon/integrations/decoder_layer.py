"""Replacement ``forward`` of pre-norm decoder layers: the residual add fused into the next norm
(:func:`tigon.functional.fused_add_rms_norm`), the check that a layer's forward has the form it replaces, and the
report's description. Functions carry Tigon's mark (:mod:`tigon.integrations.marks`).
"""

from __future__ import annotations

import ast
import functools

import torch

from .. import functional as TF
from .. import support
from .families import DecoderLayerSpec
from .child_calls import _hook_problem
from .marks import MARK, mark
from .norm_forwards import norm_eps, norm_problem
from .rotary_calls import forward_statements
from .sequence_parallel import fused_add_norm, sequence_parallel_hooks


@functools.lru_cache(maxsize=None)
def decoder_layer_forward(spec: DecoderLayerSpec, family: str, original):
    """``forward(self, hidden_states, **kwargs)`` of a pre-norm decoder layer (see :class:`DecoderLayerSpec`) with
    ``residual + attention output`` and the post-attention norm computed by one
    :func:`tigon.functional.fused_add_rms_norm`. The attention gets the caller's keyword arguments as the original
    passes them (by name; checked by :func:`decoder_layer_problem`). A post-attention norm with torch's
    ``SequenceParallel`` hooks gets them run around the fused op (:mod:`tigon.integrations.sequence_parallel`: on each
    rank's tokens). Positional extra arguments, a norm with other hooks or another library's instance forward, and
    residual / attention outputs of different dtypes (autocast with fp32 weights: the add promotes) run the original
    computation.

    Gradient checkpointing: transformers versions whose ``GradientCheckpointingLayer`` checkpoints the class's
    ``forward`` (a ``forward_with_checkpointing`` wrapper, 5.2x) would lose it with a replaced forward, so when
    ``original`` is that wrapper this forward does what it does around the fused body (caching off, then
    ``self._gradient_checkpointing_func(partial(body, self, **kwargs), hidden_states)``); older versions checkpoint
    in ``__call__``, around any forward.
    """
    norm = spec.norm
    eps_attr = norm.eps_attr if isinstance(norm.eps_attr, str) else None  # (one name: read inline)
    checkpoints_forward = getattr(getattr(original, "__code__", None), "co_name", "") == "forward_with_checkpointing"

    names = (spec.input_norm, spec.attention, spec.post_norm, spec.mlp)

    def body(self, sp, kids, hidden_states, **kwargs):
        if kids is not None:  # (plain children, see forward: their forwards called directly, as __call__ would)
            input_norm, attention, post, mlp = kids[0].forward, kids[1].forward, kids[2], kids[3].forward
        else:
            input_norm, attention = getattr(self, spec.input_norm), getattr(self, spec.attention)
            post, mlp = getattr(self, spec.post_norm), getattr(self, spec.mlp)
        residual = hidden_states
        hidden_states = input_norm(hidden_states)
        hidden_states, _ = attention(hidden_states=hidden_states, **kwargs)
        fused = None
        if hidden_states.dtype == residual.dtype:
            eps = getattr(post, eps_attr, None) if eps_attr is not None else norm_eps(post, norm)  # (norm_eps inline)
            weight = post.__dict__["_parameters"].get(norm.weight_attr)  # (past nn.Module.__getattr__: one frame less)
            if weight is None:
                weight = getattr(post, norm.weight_attr)
            options = (weight, eps, norm.offset, norm.casting_mode)
            if sp is None:
                fused = TF.fused_add_rms_norm(hidden_states, residual, *options)
            else:  # the norm's SequenceParallel hooks, around the fused op (None: inputs laid out otherwise)
                fused = fused_add_norm(sp, post, lambda x, r: TF.fused_add_rms_norm(x, r, *options), hidden_states,
                                       residual)
        if fused is None:
            hidden_states = residual + hidden_states
            residual = hidden_states
            hidden_states = post(hidden_states)
        else:
            hidden_states, residual = fused
        hidden_states = mlp(hidden_states)
        return residual + hidden_states

    @functools.wraps(original)
    def forward(self, hidden_states, *args, **kwargs):
        if args:
            return original(self, hidden_states, *args, **kwargs)
        sp = None
        # kids: the children ``names`` (input norm, attention, post-attention norm, MLP), or None: each a submodule
        # whose ``__call__`` is ``nn.Module``'s, compiled by no ``module.compile()``, without hooks of its own, and no
        # global module hooks, no ``torch.jit.trace`` running, not under torch.compile (dynamo inlines ``__call__``
        # itself). Then ``child(...)`` is exactly ``child.forward(...)`` (``nn.Module._call_impl``'s path without
        # hooks), which body calls instead: per child two Python frames less (``_wrapped_call_impl``, ``_call_impl``)
        # and, the children read from ``_modules``, one ``nn.Module.__getattr__`` frame less. The post-attention norm,
        # whose forward the fused op replaces, may have no instance-level forward but Tigon's
        # (:func:`~tigon.integrations.child_calls._hook_problem` with ``tigon_forward_ok``). Else (None) the layer
        # reads and calls its children as before. Checked here inline (a helper would be one Python frame more).
        kids = None
        m = _MODULE
        if not (support.dynamo_compiling() or support.COMPILER._is_compiling_flag or _TRACING() is not None
                or m._global_forward_hooks or m._global_forward_pre_hooks or m._global_backward_hooks
                or m._global_backward_pre_hooks):
            mods = self.__dict__.get("_modules")
            kids = tuple(map(mods.get, names)) if mods is not None else ()  # (map of a C method: no frame per name)
            for kid in kids:
                d = getattr(kid, "__dict__", None)
                if (d is None or type(kid).__call__ is not _MODULE_CALL or d["_forward_hooks"]
                        or d["_forward_pre_hooks"] or d["_backward_hooks"] or d["_backward_pre_hooks"]
                        or d.get("_compiled_call_impl") is not None):
                    kids = None
                    break
            if kids is not None:
                own = kids[2].__dict__.get("forward") if len(kids) == 4 else None
                if len(kids) != 4 or (own is not None and getattr(getattr(own, "__func__", own), MARK, None) is None):
                    kids = None
        if kids is None:
            post = getattr(self, spec.post_norm)
            if _hook_problem(post, tigon_forward_ok=True) is not None:
                sp = sequence_parallel_hooks(post)  # torch's SequenceParallel hooks (and nothing else) are run here
                if sp is None:
                    return original(self, hidden_states, *args, **kwargs)
        if (checkpoints_forward and getattr(self, "gradient_checkpointing", False) and self.training
                and torch.is_grad_enabled()):
            if kwargs.get("use_cache"):
                kwargs["use_cache"] = False
            if not getattr(self, "_can_checkpoint_with_cache", False):
                for name in ("cache", "past_key_values", "layer_past"):
                    if kwargs.get(name) is not None:
                        kwargs[name] = None
            return self._gradient_checkpointing_func(functools.partial(body, self, sp, kids, **kwargs), hidden_states)
        return body(self, sp, kids, hidden_states, **kwargs)

    # bypasses: the children whose forward the patched layer no longer calls (tigon profile counts calls by it)
    return mark(forward, "fused_add_rms_norm", family, bypasses=(spec.post_norm,))


_MODULE = torch.nn.modules.module
_MODULE_CALL = torch.nn.Module.__call__
_TRACING = torch._C._get_tracing_state


def _layer_template(spec: DecoderLayerSpec) -> list[str]:
    return ["residual = hidden_states", f"hidden_states = self.{spec.input_norm}(hidden_states)",
            f"hidden_states, _ = self.{spec.attention}(...)", "hidden_states = residual + hidden_states",
            "residual = hidden_states", f"hidden_states = self.{spec.post_norm}(hidden_states)",
            f"hidden_states = self.{spec.mlp}(hidden_states)", "hidden_states = residual + hidden_states",
            "return hidden_states"]


@functools.lru_cache(maxsize=None)
def _forward_form_problem(forward, spec: DecoderLayerSpec) -> str | None:
    """Why ``forward``'s source is not the pre-norm form of ``spec`` (None when it is)."""
    parsed = forward_statements(forward)
    if isinstance(parsed, str):
        return parsed
    fn, body = parsed
    lines = [ast.unparse(s) for s in body]
    call = None
    for i, line in enumerate(lines):
        head = f"hidden_states, _ = self.{spec.attention}("
        if line.startswith(head):
            call, lines[i] = body[i].value, f"hidden_states, _ = self.{spec.attention}(...)"
    if lines != _layer_template(spec) or call is None:
        return ("its forward is not the pre-norm form residual + attention, norm, residual + mlp (transformers "
                "changed it?); left alone")
    args = fn.args
    params = [a.arg for a in args.args[1:] + args.kwonlyargs]
    passed = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg is not None}
    if (call.args or params[:1] != ["hidden_states"] or any(passed.get(p) != p for p in params)
            or set(passed) != set(params) or args.kwarg is None
            or not any(k.arg is None and ast.unparse(k.value) == args.kwarg.arg for k in call.keywords)):
        return "its attention call does not pass every argument by name; left alone"
    return None


def decoder_layer_problem(module, spec: DecoderLayerSpec) -> str | None:
    """Why ``module`` (a decoder layer, or its class for a class-level patch) cannot take the fused forward, or
    None: its class's forward must be the pre-norm form of ``spec`` (read from its source), and an instance needs
    the four parts, a post-attention norm with a 1-D weight tensor and a numeric epsilon."""
    cls = module if isinstance(module, type) else type(module)
    problem = _forward_form_problem(cls.forward, spec)
    if problem is not None or isinstance(module, type):
        return problem
    for attr in (spec.input_norm, spec.attention, spec.post_norm, spec.mlp):
        if not callable(getattr(module, attr, None)):
            return f"no callable attribute {attr!r}"
    return norm_problem(getattr(module, spec.post_norm), spec.norm)


def describe_decoder_layer(spec: DecoderLayerSpec) -> str:
    """What the patched layer computes, e.g. ``residual + self_attn(...) and post_attention_layernorm as
    tigon.functional.fused_add_rms_norm(...)``."""
    n = spec.norm
    return (f"residual + {spec.attention}(...) and {spec.post_norm} as one tigon.functional.fused_add_rms_norm"
            f"(casting_mode={n.casting_mode!r}, offset={n.offset:g})")
