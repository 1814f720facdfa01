"""The causal-LM head: Hugging Face's ``ForCausalLMLoss`` semantics on Tigon's fused linear + cross-entropy.

:func:`causal_lm_loss` is the loss of ``lm_head(hidden)`` exactly as ``transformers.loss.loss_utils.ForCausalLMLoss``
defines it (labels padded with ``ignore_index`` and shifted left by one unless ``shift_labels`` is given; ``sum /
num_items_in_batch`` when that is given, else the mean over non-ignored tokens), computed by
:func:`tigon.functional.fused_linear_cross_entropy`, so the (tokens, vocab) logits never exist.

:func:`causal_lm_forward` builds the replacement ``forward`` for a causal-LM class from its
:class:`~tigon.integrations.families.CausalLMSpec`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import sys
import warnings
from collections.abc import Mapping

import torch

from .. import functional as TF
from .._checks import is_dtensor
from .families import CausalLMSpec
from .marks import mark, tigon_mark
from .sharded_head import fsdp1_wrapper, hook_problem, run_gathered, sharding_problem, stored_param


def shifted_targets(labels: torch.Tensor, shift_labels: torch.Tensor | None = None,
                    ignore_index: int = -100) -> torch.Tensor:
    """Flat next-token targets as HF ``ForCausalLMLoss`` builds them.

    Args:
        labels: (..., T) integer token ids (ignore_index marks positions without a target).
        shift_labels: already-shifted targets (any shape); when given, ``labels`` is not used.
        ignore_index: the padding value appended before shifting.

    Returns:
        (N,) int64 targets, N = labels.numel() (or shift_labels.numel()).
    """
    if shift_labels is None:
        padded = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = padded[..., 1:]
    return shift_labels.reshape(-1)


def slice_to_keep(hidden: torch.Tensor, logits_to_keep) -> torch.Tensor:
    """``hidden`` restricted to the positions whose logits HF would compute (``logits_to_keep`` semantics).

    Uses ``transformers.modeling_utils.slice_logits_to_keep`` when the installed version has it, else the rule of
    transformers 5.0: an int keeps the last ``logits_to_keep`` positions (0 keeps all), a tensor indexes dim 1.
    """
    # getattr with a default, not an import in a try/except: under torch.compile a failing import (transformers
    # < 5.1 lacks the helper) is an exception that dynamo cannot trace (a graph break, measured on torch 2.11 +
    # transformers 5.17).
    slice_logits_to_keep = getattr(_module("transformers.modeling_utils"), "slice_logits_to_keep", None)
    if slice_logits_to_keep is not None:
        return slice_logits_to_keep(hidden, logits_to_keep)
    idx = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    return hidden[:, idx, :]


def _divide(loss: torch.Tensor, num_items_in_batch) -> torch.Tensor:
    if num_items_in_batch is None:
        return loss
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def causal_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    shift_labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    num_items_in_batch: int | torch.Tensor | None = None,
    softcap: float | None = None,
    logit_scale: float = 1.0,
    flce_options: dict | None = None,
) -> torch.Tensor:
    """``ForCausalLMLoss(softcap(logit_scale * (hidden @ weight.T + bias)), labels)`` without the logits.

    Args:
        hidden: (..., H) final hidden states (already sliced by ``logits_to_keep``), any float dtype.
        weight: (V, H) LM-head weight (possibly tied to the input embedding); bias: (V,) or None. A DTensor
            weight (and bias) sharded by vocabulary rows (tensor parallel, ``ColwiseParallel``) runs
            :func:`tigon.functional.vocab_parallel_fused_linear_cross_entropy` (``flce_options`` do not apply).
        labels: (...) token ids with the same leading shape as ``hidden``; shifted by one here. Ignored when
            ``shift_labels`` is given.
        shift_labels: pre-shifted targets with hidden's leading shape (HF's ``shift_labels`` kwarg).
        ignore_index: target value that contributes nothing.
        num_items_in_batch: when given, the loss is ``sum / num_items_in_batch`` (gradient accumulation);
            else the mean over non-ignored targets.
        softcap, logit_scale: LM-head specifics (Gemma 2's final logit softcapping; Cohere/Granite scaling).
        flce_options: more keyword arguments for :func:`tigon.functional.fused_linear_cross_entropy` (e.g.
            ``{"accum_dtype": torch.bfloat16}``; see ``tigon.patch(fused_linear_cross_entropy={...})``).

    Returns:
        scalar float32 loss.

    Raises:
        ValueError: the number of targets differs from the number of hidden rows (HF would fail the same way).
    """
    target = shifted_targets(labels, shift_labels, ignore_index).to(hidden.device)
    h = hidden.reshape(-1, hidden.shape[-1])
    if h.shape[0] != target.numel():
        raise ValueError(f"causal LM loss: {h.shape[0]} hidden positions but {target.numel()} targets "
                         "(labels must match the positions kept by logits_to_keep)")
    reduction = "sum" if num_items_in_batch is not None else "mean"
    if is_dtensor(weight):  # tensor parallel by vocabulary rows (sharded_head.vocab_sharded): no whole weight
        loss = TF.vocab_parallel_fused_linear_cross_entropy(h, weight, target, bias, ignore_index=ignore_index,
                                                            reduction=reduction, softcap=softcap,
                                                            logit_scale=logit_scale)
        return _divide(_first(loss), num_items_in_batch)
    loss = TF.fused_linear_cross_entropy(h, weight, target, bias, ignore_index=ignore_index, reduction=reduction,
                                         softcap=softcap, logit_scale=logit_scale, **(flce_options or {}))
    return _divide(_first(loss), num_items_in_batch)


def causal_lm_loss_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    shift_labels: torch.Tensor | None = None,
    ignore_index: int = -100,
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """HF ``ForCausalLMLoss`` on materialised (..., V) logits, computed by :func:`tigon.functional.cross_entropy`.

    Same arguments and semantics as :func:`causal_lm_loss`; returns a scalar float32 loss.
    """
    target = shifted_targets(labels, shift_labels, ignore_index).to(logits.device)
    flat = logits.reshape(-1, logits.shape[-1])
    if flat.shape[0] != target.numel():
        raise ValueError(f"causal LM loss: {flat.shape[0]} logit rows but {target.numel()} targets")
    if num_items_in_batch is not None and _positive_count(num_items_in_batch):
        # the count inside the loss: its backward then sees an upstream of 1 and hands on the gradient the forward
        # formed (a division after the loss would make it recompute it)
        items = num_items_in_batch.reshape(()) if torch.is_tensor(num_items_in_batch) else num_items_in_batch
        return _first(TF.cross_entropy(flat, target, ignore_index=ignore_index, num_items_in_batch=items))
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = TF.cross_entropy(flat, target, ignore_index=ignore_index, reduction=reduction)
    return _divide(_first(loss), num_items_in_batch)


def _positive_count(num_items_in_batch) -> bool:
    """True for a count the loss takes itself: an int > 0, a one-element CPU tensor > 0 (read), any one-element CUDA
    tensor (not read: no sync). A float, or a count of 0 (Hugging Face's sum / 0, a NaN loss, which the loss would
    refuse) keep the division after the loss."""
    if torch.is_tensor(num_items_in_batch):
        if num_items_in_batch.numel() != 1:
            return False
        return num_items_in_batch.device.type != "cpu" or bool(num_items_in_batch.item() > 0)
    return isinstance(num_items_in_batch, int) and not isinstance(num_items_in_batch, bool) and num_items_in_batch > 0


# ---- checks shared by the engine (patch time) and the forward (call time) -------------------------------------
def uses_default_loss(model) -> bool:
    """True when ``model.loss_function`` is HF's ``ForCausalLMLoss`` (no custom loss the fused path would bypass)."""
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING
    except ImportError:  # pragma: no cover - transformers without the loss registry
        return False
    return getattr(model, "loss_function", None) is LOSS_MAPPING.get("ForCausalLM")


def _is_modules_to_save(module) -> bool:
    # PEFT's ModulesToSaveWrapper (duck-typed so PEFT need not be installed): the trained copy per adapter lives in
    # ``modules_to_save[adapter]``, the frozen original in ``original_module``.
    return isinstance(getattr(module, "modules_to_save", None), torch.nn.ModuleDict) \
        and hasattr(module, "active_adapters") and hasattr(module, "disable_adapters")


def effective_head(head) -> tuple[torch.nn.Linear | None, str]:
    """The plain ``nn.Linear`` whose weight (and bias) ``head(x)`` applies, looking through wrappers.

    An FSDP1 unit (``FullyShardedDataParallel`` around the head) resolves to the Linear it wraps. A PEFT
    ``ModulesToSaveWrapper`` (a trainable LM head via ``modules_to_save``) resolves to the copy of the active
    adapter, or to the original module when adapters are disabled or none of it is active, exactly as its forward
    dispatches. Anything else that is not a plain Linear (a LoRA layer on the head, a quantised Linear) cannot be
    expressed as one weight (a hooked head: :func:`~tigon.integrations.sharded_head.hook_problem`).

    Returns:
        ``(linear, "")`` or ``(None, reason)``.
    """
    for _ in range(4):  # wrappers nest at most a few levels
        if isinstance(head, torch.nn.Linear) and type(head).forward is torch.nn.Linear.forward:
            return head, ""
        if fsdp1_wrapper(head):  # FSDP1 unit around the head: its hooks gather the weight (sharded_head.run_gathered)
            head = head._fsdp_wrapped_module
            continue
        if _is_modules_to_save(head):
            active = list(head.active_adapters or ())
            known = getattr(head, "_adapters", head.modules_to_save.keys())
            if head.disable_adapters or not active or any(a not in known for a in active):
                head = head.original_module
            elif active[0] in head.modules_to_save:
                head = head.modules_to_save[active[0]]
            else:
                return None, "PEFT modules_to_save wrapper without a module for the active adapter"
            continue
        break
    name = type(head).__name__
    if hasattr(head, "base_layer") and hasattr(head, "lora_A"):
        return None, (f"the LM head is a PEFT LoRA layer ({name}): its output is base + low-rank update, not one "
                      "weight; the original forward (materialised logits) runs")
    return None, f"the LM head is {name}, not a plain torch.nn.Linear (e.g. quantised or wrapped)"


def head_attr(model, spec: CausalLMSpec) -> str:
    """The attribute of ``model`` holding its output projection: ``spec.lm_head``, or ``spec.older_lm_head`` when
    the model has only that (an older transformers)."""
    if spec.older_lm_head is not None and not hasattr(model, spec.lm_head) and hasattr(model, spec.older_lm_head):
        return spec.older_lm_head
    return spec.lm_head


def head_owner(model, spec: CausalLMSpec):
    """The module holding the LM head and backbone of ``spec``: ``model``, or for a head reached through a causal LM
    of its own (:attr:`~tigon.integrations.family_spec.CausalLMSpec.inner`) that LM (None when it has no such
    attribute)."""
    return model if spec.inner is None else getattr(model, spec.inner, None)


def head_problem(model, spec: CausalLMSpec) -> str | None:
    """Why the fused head cannot replace ``model``'s LM head, or None when it can (see :func:`effective_head`, and
    :func:`~tigon.integrations.sharded_head.sharding_problem` for weights sharded by FSDP2, DeepSpeed or DTensor).
    A head reached through an inner causal LM (``spec.inner``) is that LM's head; the loss function is ``model``'s."""
    owner = head_owner(model, spec)
    if owner is None:
        return f"no attribute {spec.inner!r} (the causal LM whose head it is)"
    if spec.inner is not None and not uses_default_loss(model):
        return "the model has a custom loss_function / loss_type; its loss is kept"
    problem = _own_head_problem(owner, spec, loss=spec.inner is None)
    return f"its {spec.inner}: {problem}" if problem is not None and spec.inner is not None else problem


def inner_problem(model, spec: CausalLMSpec) -> str | None:
    """For a head reached through an inner causal LM (``spec.inner``): why that LM's forward, called now, would not
    hand back its hidden states (it is not Tigon's LM-head forward: unpatched since, or replaced on the instance by
    another library); None when it would, or for any other head. Asked at every training call with labels."""
    if spec.inner is None:
        return None
    inner = getattr(model, spec.inner)
    mk = tigon_mark(inner.__dict__.get("forward", type(inner).forward))
    if mk is None or mk.get("kind") != "lm_head_loss":
        return (f"its {spec.inner} ({type(inner).__name__}) does not run Tigon's LM-head forward (unpatched, or "
                "its forward replaced by another library)")
    return None


def _own_head_problem(model, spec: CausalLMSpec, loss: bool) -> str | None:
    name = head_attr(model, spec)
    head = getattr(model, name, None)
    linear, why = effective_head(head)
    if linear is None:
        return why
    weight = stored_param(linear, "weight")  # not linear.weight: DeepSpeed ZeRO-3 would gather it here
    if weight is None and fsdp1_wrapper(head):
        pass  # FSDP1 without use_orig_params: the weight is an attribute set by FSDP around the unit's forward only
    elif not weight.is_floating_point():
        return f"{name}.weight has dtype {weight.dtype}"
    if (why := sharding_problem(head, linear) or hook_problem(head, linear)) is not None:
        return why
    if getattr(model, spec.backbone, None) is None:
        return f"no backbone attribute {spec.backbone!r}"
    if loss and not uses_default_loss(model):
        return "the model has a custom loss_function / loss_type; its loss is kept"
    return None


HIDDEN_IN_LOGITS = "tigon_hidden_in_logits"
"""Keyword argument of a patched causal-LM forward, passed only by the patched forward of a class that holds it
(:attr:`~tigon.integrations.family_spec.CausalLMSpec.inner`, Llama 4's vision-language class) through its own
``**kwargs``: return the last hidden states, sliced by ``logits_to_keep``, in the logits' place (the LM head not run),
everything else as the original forward without labels returns it."""


_WARNED: set[str] = set()


def _warn_once(family: str, why: str) -> None:
    key = f"{family}: {why}"
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(f"tigon ({family}): fused LM-head loss not used, {why}", stacklevel=4)


def _config_value(model, attr: str | None, text: bool = False):
    """``model.config.<attr>`` (of ``config.get_text_config()`` with ``text``), None when absent or ``attr`` is None."""
    if attr is None:
        return None
    config = getattr(model, "config", None)
    if text and config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    return getattr(config, attr, None)


def _logit_scale(model, spec: CausalLMSpec) -> float:
    scale = 1.0
    mult = _config_value(model, spec.logit_scale_attr, spec.text_config_attrs)
    div = _config_value(model, spec.logit_divisor_attr, spec.text_config_attrs)
    if mult is not None:
        scale *= float(mult)
    if div is not None:
        scale /= float(div)
    return scale


def _module(name: str):
    """The module ``name``, from sys.modules when already imported (always, for a model's own family module).

    The patched forward runs inside torch.compile: dynamo traces a dict lookup, but importlib.import_module is
    marked as skipped (a graph break, which also makes ``fullgraph=True`` fail).
    """
    mod = sys.modules.get(name)
    return mod if mod is not None else importlib.import_module(name)


def _moe_value(model, spec: CausalLMSpec, name: str):
    """An MoE head's ``num_experts`` / ``num_experts_per_tok`` / ``router_aux_loss_coef``: the head's attribute, or
    with ``spec.text_config_attrs`` the text config's (a vision-language MoE head keeps them there)."""
    if spec.text_config_attrs:
        return _config_value(model, name, True)
    return getattr(model, name)


def _router_aux_loss(model, spec: CausalLMSpec, family_module: str, router_logits, attention_mask):
    fn = getattr(_module(family_module), spec.router_aux_loss)
    return fn(router_logits, _moe_value(model, spec, "num_experts"), _moe_value(model, spec, "num_experts_per_tok"),
              attention_mask)


def output_class(family_module: str, name: str | tuple[str, ...]):
    """The ModelOutput class ``name`` from the family module, else from ``transformers.modeling_outputs``; for a tuple
    of names (one per transformers version), the first that exists.

    Raises:
        AttributeError: none of the names exists in either module.
    """
    names = (name,) if isinstance(name, str) else name
    for where in (_module(family_module), _module("transformers.modeling_outputs")):
        for n in names:
            cls = getattr(where, n, None)
            if cls is not None:
                return cls
    raise AttributeError(f"no output class {' / '.join(names)} in {family_module} or transformers.modeling_outputs")


def _return_dict(model, arguments: dict) -> bool:
    # transformers' can_return_tuple: an explicit return_dict wins, else config.return_dict, else True.
    rd = arguments.pop("return_dict", None)
    if rd is None:
        rd = getattr(getattr(model, "config", None), "return_dict", True)
    return True if rd is None else bool(rd)


def tuple_keeping_logits(out) -> tuple:
    """``out`` (a ModelOutput whose ``logits`` the fused loss left None) as the tuple of ``return_dict=False``:
    ``out.to_tuple()`` with the logits' slot kept as None. ``to_tuple`` drops None fields, which would move every later
    entry one place forward of where the original forward puts it (``outputs[1]`` the KV cache instead of the
    logits; an MoE's ``router_logits`` shifted too); Liger-Kernel's forwards keep the slot the same way. Other None
    fields are dropped, as the original drops them. A ModelOutput value (a vision-language model's ``image_outputs``)
    becomes its own tuple, as in the original, whose encoders get ``return_dict=False`` through its keyword arguments.
    """
    # the class's field table, not dataclasses.fields (dynamo cannot trace that on a class, see causal_lm_forward)
    return tuple(_as_tuple(getattr(out, name)) for name in type(out).__dataclass_fields__
                 if name == "logits" or getattr(out, name, None) is not None)


def _as_tuple(value):
    """A nested ModelOutput as its ``to_tuple()`` (its own nested ones likewise); any other value as it is."""
    if not isinstance(value, _module("transformers.utils.generic").ModelOutput):
        return value
    return tuple(_as_tuple(v) for v in value.to_tuple())


def loss_options(fused: bool, ce: bool, flce) -> dict:
    """The LM-head-loss options a patched forward was built with, as shown to users and compared on re-patching
    (a new dict per call). ``accum_dtype`` None and torch.float32 mean the same (fp32 accumulation): both are left
    out, as is ``memory="auto"``, so that options with the same meaning compare equal."""
    extra = {k: v for k, v in dict(flce).items()
             if not (k == "accum_dtype" and v in (None, torch.float32)) and not (k == "memory" and v == "auto")}
    return {"fused_linear_cross_entropy": extra if fused and extra else bool(fused), "cross_entropy": bool(ce)}


@functools.lru_cache(maxsize=None)
def causal_lm_forward(spec: CausalLMSpec, family: str, family_module: str, original, fused: bool, ce: bool,
                      flce_options: tuple = ()):
    """The replacement ``forward(self, *args, **kwargs)`` for a causal-LM class.

    ``flce_options``: ``(key, value)`` pairs (a tuple, so that the forwards can be cached) passed as keyword
    arguments to :func:`tigon.functional.fused_linear_cross_entropy` by the fused path.

    With labels and HF's default loss:
      * training and ``fused``: backbone -> hidden states sliced by ``logits_to_keep`` ->
        :func:`causal_lm_loss`; the output's ``logits`` is None (its slot kept in the tuple of
        ``return_dict=False``: :func:`tuple_keeping_logits`). A head that is its own FSDP2 unit is read inside
        that unit's forward hooks, a DeepSpeed ZeRO-3 head inside its own call
        (:func:`~tigon.integrations.sharded_head.run_gathered`). A head reached through an inner causal LM
        (``spec.inner``): the original forward, the inner LM's hidden states in the logits' place
        (:data:`HIDDEN_IN_LOGITS`), then :func:`causal_lm_loss` on the inner LM's head.
      * otherwise with ``ce``: the original forward without labels, then :func:`causal_lm_loss_from_logits`.
    Everything else (no labels, eval without ``ce``, a custom loss, an LM head that is not a plain Linear, arguments
    that do not bind) runs ``original`` unchanged. Called with :data:`HIDDEN_IN_LOGITS` (by a patched class holding
    this model), the backbone's hidden states come back in the logits' place whatever the mode. Every argument except
    ``head_only_args`` and ``return_dict`` reaches the backbone as it would in the original, including unknown kwargs
    (``cache`` / ``past_key_values``).
    """
    sig = inspect.signature(original)
    params = list(sig.parameters.values())
    self_name = params[0].name
    var_kw = next((p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    bindable = not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    takes_router = "output_router_logits" in sig.parameters

    def _backbone(self, arguments: dict):
        """The backbone's outputs, its last hidden states sliced by ``logits_to_keep``, the output fields besides
        the loss and logits, and whether the router loss is on (its ``aux_loss`` then among the fields)."""
        backbone_args = {k: v for k, v in arguments.items() if k not in spec.head_only_args}
        router = False
        if spec.router_aux_loss is not None:
            router = backbone_args.get("output_router_logits")
            if router is None:  # the original's default: the config's, where its forward takes the argument (an
                # original that only reads it from **kwargs, as transformers 5.17's Qwen3.5-MoE, adds no aux loss then)
                router = takes_router and bool(_config_value(self, "output_router_logits", spec.text_config_attrs))
            backbone_args["output_router_logits"] = router
        outputs = getattr(self, spec.backbone)(**backbone_args)
        hidden = outputs.last_hidden_state if hasattr(outputs, "last_hidden_state") else outputs[0]
        hidden = slice_to_keep(hidden, arguments.get("logits_to_keep", 0))
        cls = output_class(family_module, spec.output_class)
        # The class's field table, not dataclasses.fields(cls): dynamo cannot trace the latter on a class (graph
        # break under torch.compile); ModelOutput classes have no ClassVar / InitVar pseudo-fields to filter out.
        extra = {name: getattr(outputs, name) for name in cls.__dataclass_fields__
                 if name not in ("loss", "logits", "aux_loss") and hasattr(outputs, name)}
        if router:
            extra["aux_loss"] = _router_aux_loss(self, spec, family_module, outputs.router_logits,
                                                 arguments.get("attention_mask"))
        return cls, hidden, extra, router

    def _head_loss(self, owner, arguments: dict, hidden):
        """The fused loss of ``owner``'s LM head on ``hidden`` (``owner``: the model, or its inner causal LM), read
        inside the engine's hooks that gather the head's parameters."""
        outer = getattr(owner, head_attr(owner, spec))
        head, _ = effective_head(outer)

        def head_loss(h):  # reads the head's parameters when called: inside the engine's hooks that gather them
            return causal_lm_loss(
                h, head.weight, arguments.get("labels"), head.bias,
                shift_labels=arguments.get("shift_labels"),
                ignore_index=arguments.get("ignore_index", -100),
                num_items_in_batch=arguments.get("num_items_in_batch"),
                softcap=_config_value(self, spec.softcap_attr, spec.text_config_attrs),
                logit_scale=_logit_scale(self, spec),
                flce_options=dict(flce_options),
            )

        return run_gathered(outer, head, head_loss, hidden)

    def _fused(self, arguments: dict):
        return_dict = _return_dict(self, arguments)
        cls, hidden, extra, router = _backbone(self, arguments)
        loss = _head_loss(self, self, arguments, hidden)
        if router:
            loss = loss + _moe_value(self, spec, "router_aux_loss_coef") * extra["aux_loss"].to(loss.device)
        out = cls(loss=loss, logits=None, **extra)
        return out if return_dict else tuple_keeping_logits(out)

    def _hidden(self, arguments: dict):
        """Called by a patched class that holds this model (:data:`HIDDEN_IN_LOGITS`): the hidden states in the
        logits' place, no loss."""
        return_dict = _return_dict(self, arguments)
        cls, hidden, extra, _ = _backbone(self, arguments)
        out = cls(logits=hidden, **extra)
        return out if return_dict else out.to_tuple()

    def _through_inner(self, arguments: dict):
        """The original forward with the inner causal LM (``spec.inner``) handing back its hidden states in the
        logits' place, then the fused loss on its head. The output: the original's, with that loss and the logits
        None (their slot kept in the tuple of ``return_dict=False``, as :func:`tuple_keeping_logits` keeps it)."""
        return_dict = _return_dict(self, arguments)
        labels = arguments.pop("labels")
        out = original(self, **arguments, return_dict=return_dict, **{HIDDEN_IN_LOGITS: True})
        hidden = out.logits if return_dict else out[0]
        loss = _head_loss(self, getattr(self, spec.inner), {**arguments, "labels": labels}, hidden)
        if not return_dict:  # the original's (loss, logits, *rest)
            return (loss, None) + tuple(out[1:])
        return type(out)(**{**{k: v for k, v in out.items() if k != "logits"}, "loss": loss})

    def _with_ce(self, arguments: dict):
        return_dict = _return_dict(self, arguments)
        labels = arguments.pop("labels")
        out = original(self, **arguments, return_dict=True)
        loss = causal_lm_loss_from_logits(
            out.logits, labels,
            shift_labels=arguments.get("shift_labels"),
            ignore_index=arguments.get("ignore_index", -100),
            num_items_in_batch=arguments.get("num_items_in_batch"),
        )
        if spec.router_aux_loss is not None and getattr(out, "aux_loss", None) is not None:
            loss = loss + _moe_value(self, spec, "router_aux_loss_coef") * out.aux_loss.to(loss.device)
        out = type(out)(**{**{k: v for k, v in out.items()}, "loss": loss})
        return out if return_dict else out.to_tuple()

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        hidden = kwargs.pop(HIDDEN_IN_LOGITS, False)
        if not bindable:
            return original(self, *args, **kwargs)
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:  # let the original raise its own error
            return original(self, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop(self_name)
        if var_kw is not None:
            arguments.update(arguments.pop(var_kw, {}))
        if hidden:
            return _hidden(self, arguments)
        if arguments.get("labels") is None or not uses_default_loss(self):
            return original(self, *args, **kwargs)
        if fused and self.training:
            problem = head_problem(self, spec) or inner_problem(self, spec)
            if problem is None:
                return _through_inner(self, arguments) if spec.inner is not None else _fused(self, arguments)
            _warn_once(family, problem)
        if ce:
            return _with_ce(self, arguments)
        return original(self, *args, **kwargs)

    return mark(forward, "lm_head_loss", family, options=loss_options(fused, ce, flce_options))


# ---- tigon.patch(fused_linear_cross_entropy=...) ------------------------------------------------------------
# Keys of ``patch(fused_linear_cross_entropy={...})``, forwarded to tigon.functional.fused_linear_cross_entropy.
FLCE_OPTIONS = ("accum_dtype", "memory")


def flce_options(value) -> tuple[bool, tuple]:
    """``patch``'s ``fused_linear_cross_entropy`` argument as ``(enabled, options)``; ``options`` is a sorted tuple of
    ``(key, value)`` pairs (hashable: the patched forwards are cached by it).

    A bool turns the fused loss on or off; a mapping turns it on with those keyword options (only
    :data:`FLCE_OPTIONS`).

    Raises:
        TypeError: neither a bool nor a mapping (e.g. None or a string).
        ValueError: an unknown key, an ``accum_dtype`` that is not None or a floating-point torch.dtype, or a
            ``memory`` other than "auto", "low" or an int >= 0 (bytes).
    """
    if isinstance(value, bool):
        return value, ()
    if not isinstance(value, Mapping):
        raise TypeError(f"tigon.patch: fused_linear_cross_entropy must be True, False or a dict of options "
                        f"({', '.join(FLCE_OPTIONS)}), got {value!r}")
    for key in value:
        if key not in FLCE_OPTIONS:
            raise ValueError(f"tigon.patch: unknown fused_linear_cross_entropy option {key!r} "
                             f"(allowed: {', '.join(FLCE_OPTIONS)})")
    dt = value.get("accum_dtype")
    if dt is not None and not (isinstance(dt, torch.dtype) and dt.is_floating_point):
        raise ValueError(f"tigon.patch: fused_linear_cross_entropy option 'accum_dtype' must be None or a "
                         f"floating-point torch.dtype (torch.float32, or the LM head's dtype), got {dt!r}")
    mem = value.get("memory", "auto")
    if not (mem in ("auto", "low") if isinstance(mem, str) else
            isinstance(mem, int) and not isinstance(mem, bool) and mem >= 0):
        raise ValueError(f"tigon.patch: fused_linear_cross_entropy option 'memory' must be 'auto', 'low' or a "
                         f"budget in bytes (an int >= 0), got {mem!r}")
    return True, tuple(sorted(value.items()))


def check_accum_dtype(model, accum_dtype) -> None:
    """Raise ValueError now, not at the first training step, when ``accum_dtype`` cannot be used with the model's
    LM head (it must be None, torch.float32 or the head weight's dtype)."""
    if accum_dtype in (None, torch.float32):
        return
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dtype != accum_dtype:
        raise ValueError(f"tigon.patch: fused_linear_cross_entropy accum_dtype={accum_dtype} differs from the LM "
                         f"head's dtype {weight.dtype}; use None / torch.float32, or cast the model first")
