"""Model families as data: what to replace in a Hugging Face modeling module, and how.

A :class:`FamilySpec` names classes and functions of one ``transformers.models.<family>.modeling_<family>`` module
and the few numbers that distinguish the family (RMSNorm casting mode and weight offset, the activation's config
attribute, LM-head softcapping / scaling). The engine in :mod:`tigon.integrations.engine` applies any spec; adding a
family is adding a spec here (and a tiny-config test), never writing a patch function.

Nothing here imports transformers: specs are strings until the engine resolves them.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class NormSpec:
    """A normalisation class whose ``forward`` becomes a Tigon op.

    cls: class name in the family module, or the dotted name of a shared class outside it (``"torch.nn.LayerNorm"``,
        what GPT-NeoX, phi, StableLM and Falcon use). A shared class is patched per model only (instance level:
        its instances inside a model of the family); a class-level patch leaves it alone and says so, because
        Tigon never changes ``torch.nn`` or classes other models use.
    kind: ``"rms_norm"`` (:func:`tigon.functional.rms_norm`) or ``"layer_norm"`` (:func:`tigon.functional.layer_norm`).
    casting_mode, offset: passed to rms_norm (``"llama"``/0.0 for Llama; ``"gemma"``/1.0 for Gemma's ``1 + w``).
    eps_attr: the instance attribute holding epsilon (``variance_epsilon`` in Llama, ``eps`` in Gemma and
        ``torch.nn.LayerNorm``).
    weight_attr, bias_attr: instance attributes holding the affine parameters (bias only for layer_norm).
    """

    cls: str
    kind: str = "rms_norm"
    casting_mode: str = "llama"
    offset: float = 0.0
    eps_attr: str = "variance_epsilon"
    weight_attr: str = "weight"
    bias_attr: str = "bias"


@dataclass(frozen=True)
class MLPSpec:
    """A gated MLP ``down(act(gate(x)) * up(x))`` whose ``forward`` becomes swiglu / geglu.

    A non-gated MLP ``down(act(up(x)))`` (GPT-NeoX, phi, Falcon: ``gate=None``) is declared so that the report names
    it, and is left alone: Tigon's MLP ops are gated, and a lone GELU is one elementwise pass that PyTorch already
    runs as one kernel (nothing to fuse it with that a kernel of Tigon's would save).

    cls: class name in the family module.
    act_config_attr: the attribute of the module's ``config`` naming the activation (``hidden_act``; Gemma 2 and 3
        use ``hidden_activation``). See :data:`ACTIVATIONS` for the supported names.
    activation: a fixed activation name (an :data:`ACTIVATIONS` key) instead of reading the config; the generic
        matcher sets it from its numerical probe.
    gate, up, down: attribute names of the three projections (any callables: nn.Linear, LoRA-wrapped Linear ...);
        ``gate`` None (and no ``gate_up``): a non-gated MLP, reported and left alone.
    gate_up: attribute name of a fused gate-up projection (Phi-3, GLM-4: ``gate, up = gate_up(x).chunk(2, -1)``);
        when set, ``gate`` and ``up`` are not used and the kernel reads the two halves in place.
    experts: the class is a Hugging Face v5 MoE experts module (``@use_experts_implementation``: 3-D
        ``gate_up_proj`` / ``down_proj`` parameters). Its expert loop is not replaced; its ``_apply_gate(gate_up_out)``
        hook (``act(gate) * up`` on the chunked halves, called by the ``grouped_mm`` / ``batched_mm`` experts
        implementations) becomes swiglu / geglu. The ``eager`` experts implementation computes ``act(gate) * up``
        inline and is left alone (reported).
    """

    cls: str
    act_config_attr: str = "hidden_act"
    activation: str | None = None
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    gate_up: str | None = None
    experts: bool = False

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (``gate`` or ``gate_up`` set): only gated MLPs have a Tigon op."""
        return self.gate is not None or self.gate_up is not None

    @property
    def patch_attr(self) -> str:
        """The attribute the engine replaces: ``"_apply_gate"`` for experts modules, else ``"forward"``."""
        return "_apply_gate" if self.experts else "forward"


@dataclass(frozen=True)
class RopeSpec:
    """The module-global rotary function called by the family's attention classes.

    function: its name in the family module (``apply_rotary_pos_emb``); signature ``(q, k, cos, sin, unsqueeze_dim=1)``.
    layout: ``"rotate_half"`` (HF/NeoX halves over the full head dimension, what :func:`tigon.functional.rope`
        implements); anything else (e.g. ``"interleaved"``, GLM's pairs of neighbours) is reported as unsupported
        and the family's rotary function is left alone.
    attention_classes: the classes whose forward calls ``function``; at instance level the rotary kernel is
        enabled only while a patched instance of one of these runs (see :mod:`tigon.integrations.engine`).
    enabled_attr: an attention-instance attribute that says whether the layer applies rotary at all (SmolLM3's
        ``use_rope``; its NoPE layers have it False and are left alone), or None when every layer does.
    off_config_attr: a config attribute that, when true, replaces rotary in the whole model (Falcon's ``alibi``:
        ALiBi biases, no rotary call); such models have no rotary to patch (noted), or None.
    partial_rotary: the family's code handles partial rotary (``partial_rotary_factor`` / ``rotary_pct`` below 1:
        only the first ``rotary_dim`` dims of each head are rotated) in a way :func:`tigon.functional.rope`
        reproduces: its rotary function rotates the first ``cos.shape[-1]`` dims and passes the rest (GPT-NeoX), or
        its attention passes only the rotated slice of q and k to it (phi, StableLM). Then partial-rotary models are
        patched, and the dispatcher sends calls with cos / sin narrower than the head to Tigon (which rotates the
        first ``cos.shape[-1]`` dims, passing the rest). False: partial rotary is refused per model at instance
        level, and at class level the dispatcher runs the original function for any call whose cos / sin do not
        span the full head dim.
    """

    function: str = "apply_rotary_pos_emb"
    layout: str = "rotate_half"
    attention_classes: tuple[str, ...] = ()
    enabled_attr: str | None = None
    off_config_attr: str | None = None
    partial_rotary: bool = False


@dataclass(frozen=True)
class DecoderLayerSpec:
    """A pre-norm decoder layer whose first residual add runs fused with the norm after it.

    The layer's ``forward`` must be exactly Hugging Face Llama's (checked against its source at patch time, see
    :func:`tigon.integrations.forwards.decoder_layer_problem`)::

        residual = hidden_states
        hidden_states = self.<input_norm>(hidden_states)
        hidden_states, _ = self.<attention>(hidden_states=hidden_states, <every other argument by name>)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.<post_norm>(hidden_states)
        hidden_states = self.<mlp>(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states

    The patched forward computes the add and ``post_norm`` as one :func:`tigon.functional.fused_add_rms_norm`
    (with the post norm's own weight and epsilon): one pass over the hidden states instead of two.

    cls: class name in the family module. norm: the :class:`NormSpec` of ``post_norm`` (casting mode, offset,
    weight / epsilon attributes). input_norm, attention, post_norm, mlp: attribute names of the four parts.
    """

    cls: str
    norm: NormSpec
    input_norm: str = "input_layernorm"
    attention: str = "self_attn"
    post_norm: str = "post_attention_layernorm"
    mlp: str = "mlp"


@dataclass(frozen=True)
class CausalLMSpec:
    """The causal-LM class whose forward gets the fused LM head + loss in training.

    cls: class name in the family module.
    backbone, lm_head: attribute names of the decoder (called with every forward argument except
        ``head_only_args`` and ``return_dict``) and of the output projection (an ``nn.Linear``).
    older_lm_head: the output projection's name in older transformers, used when the model has no ``lm_head``
        attribute (GPT-NeoX's ``embed_out``, renamed ``lm_head`` in transformers 5.2x), or None.
    output_class: the ModelOutput class the original forward returns (looked up in the family module first,
        then in ``transformers.modeling_outputs``).
    head_only_args: forward arguments consumed by the head/loss and not passed to the backbone.
    softcap_attr: config attribute with the final logit softcap (``final_logit_softcapping`` in Gemma 2), or None.
    logit_scale_attr: config attribute that multiplies the logits (Cohere's ``logit_scale``), or None.
    logit_divisor_attr: config attribute that divides the logits (Granite's ``logits_scaling``), or None.
    router_aux_loss: for MoE families, the name of the family-module function computing the router
        load-balancing loss (``load_balancing_loss_func``), called as HF does when ``output_router_logits`` is on:
        ``fn(router_logits, model.num_experts, model.num_experts_per_tok, attention_mask)``, added to the loss times
        ``model.router_aux_loss_coef`` and returned as ``aux_loss``. None for dense families.
    """

    cls: str
    backbone: str = "model"
    lm_head: str = "lm_head"
    output_class: str = "CausalLMOutputWithPast"
    head_only_args: tuple[str, ...] = ("labels", "logits_to_keep")
    softcap_attr: str | None = None
    logit_scale_attr: str | None = None
    logit_divisor_attr: str | None = None
    router_aux_loss: str | None = None
    older_lm_head: str | None = None


@dataclass(frozen=True)
class FamilySpec:
    """Everything Tigon replaces in one model family.

    name: the family name accepted by :func:`tigon.patch` (``"llama"``); aliases: other accepted names.
    module: the modeling module (``"transformers.models.llama.modeling_llama"``); models are matched to a family
        by the module of their submodules' classes.
    norms, mlps, rope, causal_lm, decoder_layers: the parts above; empty / None where the family has no such part
        (decoder_layers: only families whose layer is Llama's pre-norm form, see :class:`DecoderLayerSpec`).
    """

    name: str
    module: str
    norms: tuple[NormSpec, ...] = ()
    mlps: tuple[MLPSpec, ...] = ()
    rope: RopeSpec | None = None
    causal_lm: CausalLMSpec | None = None
    aliases: tuple[str, ...] = ()
    decoder_layers: tuple[DecoderLayerSpec, ...] = ()


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter library's layer class whose ``forward`` becomes a Tigon op, in any model that contains it.

    Adapters are not part of a model family: PEFT wraps the family's ``nn.Linear`` modules after the model is built,
    so the engine matches these classes in every model at instance level (``tigon.patch(model)`` after
    ``get_peft_model``), beside the family's (or the generic matcher's) parts.

    kind: the patch kind (``"lora"``). module: the library module holding the classes (``"peft.tuners.lora.layer"``);
    the model can hold such layers only once it is imported, so it is looked up in ``sys.modules`` and never
    imported by Tigon. cls: the class that is fused (PEFT's ``Linear``). base_class: the class of every adapter layer
    of the method (PEFT's ``LoraLayer``); layers of it that are not ``cls`` (Embedding, Conv, quantised linears)
    are reported as skipped.
    """

    kind: str
    module: str
    cls: str
    base_class: str


PEFT_LORA = AdapterSpec("lora", "peft.tuners.lora.layer", "Linear", "LoraLayer")
ADAPTERS: tuple[AdapterSpec, ...] = (PEFT_LORA,)
"""The adapter layers :func:`tigon.patch` fuses (see :mod:`tigon.integrations.lora`)."""


# HF activation names (``transformers.activations.ACT2FN`` keys) -> (Tigon gated op, gelu approximation).
# gelu_new / gelu_fast / gelu_pytorch_tanh are the same tanh approximation written three ways.
ACTIVATIONS: dict[str, tuple[str, str | None]] = {
    "silu": ("swiglu", None),
    "swish": ("swiglu", None),
    "gelu": ("geglu", "none"),
    "gelu_pytorch_tanh": ("geglu", "tanh"),
    "gelu_new": ("geglu", "tanh"),
    "gelu_fast": ("geglu", "tanh"),
}


def _dense(name: str, prefix: str, *, norm: NormSpec | None = None, mlp: MLPSpec | None = None,
           rope: RopeSpec | None = None, causal_lm: CausalLMSpec | None = None,
           aliases: tuple[str, ...] = (), pre_norm_layer: bool = True) -> FamilySpec:
    """The usual shape of a decoder family: ``<Prefix>RMSNorm``, ``<Prefix>MLP``, ``apply_rotary_pos_emb`` called by
    ``<Prefix>Attention``, ``<Prefix>ForCausalLM``, and (``pre_norm_layer``) a ``<Prefix>DecoderLayer`` of Llama's
    pre-norm form, each overridable."""
    norm = norm or NormSpec(f"{prefix}RMSNorm")
    return FamilySpec(
        name=name,
        module=f"transformers.models.{name}.modeling_{name}",
        norms=(norm,),
        mlps=(mlp or MLPSpec(f"{prefix}MLP"),),
        rope=rope or RopeSpec(attention_classes=(f"{prefix}Attention",)),
        causal_lm=causal_lm or CausalLMSpec(f"{prefix}ForCausalLM"),
        aliases=aliases,
        decoder_layers=(DecoderLayerSpec(f"{prefix}DecoderLayer", norm),) if pre_norm_layer else (),
    )


def _gemma_norm(prefix: str) -> NormSpec:  # (1 + w), everything in fp32, cast at the end
    return NormSpec(f"{prefix}RMSNorm", casting_mode="gemma", offset=1.0, eps_attr="eps")


def _moe(name: str, prefix: str, *, dense_mlp: bool) -> FamilySpec:
    """A v5 MoE family: the experts' ``_apply_gate`` hook (and the dense MLP of non-MoE layers where the family has
    one); the MoE causal-LM output with the router load-balancing loss."""
    dense = (MLPSpec(f"{prefix}MLP"),) if dense_mlp else ()
    norm = NormSpec(f"{prefix}RMSNorm")
    return FamilySpec(
        name=name,
        module=f"transformers.models.{name}.modeling_{name}",
        norms=(norm,),
        decoder_layers=(DecoderLayerSpec(f"{prefix}DecoderLayer", norm),),
        mlps=dense + (MLPSpec(f"{prefix}Experts", experts=True),),
        rope=RopeSpec(attention_classes=(f"{prefix}Attention",)),
        causal_lm=CausalLMSpec(f"{prefix}ForCausalLM", output_class="MoeCausalLMOutputWithPast",
                               router_aux_loss="load_balancing_loss_func"),
    )


LLAMA = _dense("llama", "Llama")
MISTRAL = _dense("mistral", "Mistral")
MIXTRAL = _moe("mixtral", "Mixtral", dense_mlp=False)  # every layer is MoE
QWEN2 = _dense("qwen2", "Qwen2")
QWEN3 = _dense("qwen3", "Qwen3")  # Qwen2 plus per-head q_norm / k_norm (the same RMSNorm class)
QWEN3_MOE = _moe("qwen3_moe", "Qwen3Moe", dense_mlp=True)  # per-head q_norm / k_norm; config.mlp_only_layers
GEMMA = _dense("gemma", "Gemma", norm=_gemma_norm("Gemma"))  # (1 + w) in fp32, gelu-tanh gated MLP (hidden_act)
GEMMA2 = _dense(  # pre/post feed-forward norms (same class), config.hidden_activation, final logit softcapping
    "gemma2", "Gemma2", norm=_gemma_norm("Gemma2"), mlp=MLPSpec("Gemma2MLP", act_config_attr="hidden_activation"),
    causal_lm=CausalLMSpec("Gemma2ForCausalLM", softcap_attr="final_logit_softcapping"), pre_norm_layer=False)
GEMMA3 = _dense(  # Gemma 2 plus per-head q_norm / k_norm; the text model Gemma3ForCausalLM
    "gemma3", "Gemma3", norm=_gemma_norm("Gemma3"), mlp=MLPSpec("Gemma3MLP", act_config_attr="hidden_activation"),
    causal_lm=CausalLMSpec("Gemma3ForCausalLM", softcap_attr="final_logit_softcapping"), aliases=("gemma3_text",),
    pre_norm_layer=False)
PHI3 = _dense(  # fused gate_up_proj: up * act(gate) on the chunked halves; partial rotary (Phi-4-mini: 0.75) in
    "phi3", "Phi3", mlp=MLPSpec("Phi3MLP", gate_up="gate_up_proj"),  # apply_rotary_pos_emb, as GPT-NeoX's
    rope=RopeSpec(attention_classes=("Phi3Attention",), partial_rotary=True), pre_norm_layer=False)  # residual dropout
GRANITE = _dense(  # logits / config.logits_scaling
    "granite", "Granite", causal_lm=CausalLMSpec("GraniteForCausalLM", logit_divisor_attr="logits_scaling"),
    pre_norm_layer=False)  # residual_multiplier
OLMO2 = _dense(  # norms after attention / MLP, q_norm / k_norm over the whole projection; (w * x).to(dtype) casting
    "olmo2", "Olmo2", norm=NormSpec("Olmo2RMSNorm", casting_mode="gemma"), pre_norm_layer=False)
GLM4 = _dense(  # fused gate_up_proj; rotary is interleaved pairs over a partial head dim -> left alone
    "glm4", "Glm4", mlp=MLPSpec("Glm4MLP", gate_up="gate_up_proj"),
    rope=RopeSpec(layout="interleaved", attention_classes=("Glm4Attention",)), pre_norm_layer=False)
SMOLLM3 = _dense(  # NoPE layers (config.no_rope_layers[i] == 0) have no rotary to patch
    "smollm3", "SmolLM3", rope=RopeSpec(attention_classes=("SmolLM3Attention",), enabled_attr="use_rope"))

# LayerNorm families: their norms are torch.nn.LayerNorm itself (patched per model, never at class level), their
# decoder layers are not Llama's pre-norm RMSNorm form (no fused_add_rms_norm).
TORCH_LAYER_NORM = NormSpec("torch.nn.LayerNorm", kind="layer_norm", eps_attr="eps")


def _layer_norm_family(name: str, prefix: str, *, mlp: MLPSpec, rope: RopeSpec,
                       causal_lm: CausalLMSpec | None = None) -> FamilySpec:
    """A decoder family normalised by ``torch.nn.LayerNorm`` (:data:`TORCH_LAYER_NORM`), with its MLP, rotary and
    ``<Prefix>ForCausalLM`` (overridable); no :class:`DecoderLayerSpec` (fused_add_rms_norm is an RMSNorm op)."""
    return FamilySpec(name=name, module=f"transformers.models.{name}.modeling_{name}", norms=(TORCH_LAYER_NORM,),
                      mlps=(mlp,), rope=rope, causal_lm=causal_lm or CausalLMSpec(f"{prefix}ForCausalLM"))


GPT_NEOX = _layer_norm_family(  # Pythia; apply_rotary_pos_emb rotates the first cos.shape[-1] dims (rotary_pct)
    "gpt_neox", "GPTNeoX", mlp=MLPSpec("GPTNeoXMLP", gate=None, up="dense_h_to_4h", down="dense_4h_to_h"),
    rope=RopeSpec(attention_classes=("GPTNeoXAttention",), partial_rotary=True),
    causal_lm=CausalLMSpec("GPTNeoXForCausalLM", backbone="gpt_neox", older_lm_head="embed_out"))
PHI = _layer_norm_family(  # phi-1 / phi-2: the attention rotates q[..., :rotary_ndims]; lm_head has a bias
    "phi", "Phi", mlp=MLPSpec("PhiMLP", gate=None, up="fc1", down="fc2"),
    rope=RopeSpec(attention_classes=("PhiAttention",), partial_rotary=True))
STABLELM = _layer_norm_family(  # gated SiLU MLP; the attention rotates q[..., :rotary_ndims]; per-head q/k LayerNorms
    "stablelm", "StableLm", mlp=MLPSpec("StableLmMLP"),
    rope=RopeSpec(attention_classes=("StableLmAttention",), partial_rotary=True))
FALCON = _layer_norm_family(  # config.alibi: ALiBi instead of rotary; MLP act from config.activation
    "falcon", "Falcon", mlp=MLPSpec("FalconMLP", act_config_attr="activation", gate=None, up="dense_h_to_4h",
                                    down="dense_4h_to_h"),
    rope=RopeSpec(attention_classes=("FalconAttention",), off_config_attr="alibi"),
    causal_lm=CausalLMSpec("FalconForCausalLM", backbone="transformer",
                           output_class="CausalLMOutputWithCrossAttentions"))

FAMILIES: dict[str, FamilySpec] = {s.name: s for s in (
    LLAMA, MISTRAL, MIXTRAL, QWEN2, QWEN3, QWEN3_MOE, GEMMA, GEMMA2, GEMMA3, PHI3, GRANITE, OLMO2, GLM4, SMOLLM3,
    GPT_NEOX, PHI, STABLELM, FALCON)}


def register_family(spec: FamilySpec, *, replace: bool = False) -> None:
    """Make ``spec`` available to :func:`tigon.patch` (by name and by model matching).

    Raises:
        ValueError: a family with that name exists and ``replace`` is False.
    """
    if spec.name in FAMILIES and not replace:
        raise ValueError(f"family {spec.name!r} is already registered (pass replace=True to override)")
    FAMILIES[spec.name] = spec


def family_by_name(name: str) -> FamilySpec:
    """The spec registered under ``name`` or one of its aliases (case-insensitive).

    Raises:
        ValueError: unknown name; the message lists the supported families.
    """
    key = name.lower()
    for spec in FAMILIES.values():
        if key == spec.name or key in spec.aliases:
            return spec
    raise ValueError(f"unknown model family {name!r}; supported families: {', '.join(sorted(FAMILIES))}")


def family_by_module(module_name: str) -> FamilySpec | None:
    """The spec whose modeling module is ``module_name``, or None."""
    for spec in FAMILIES.values():
        if spec.module == module_name:
            return spec
    return None


def family_ops(config: dict) -> set[str] | None:
    """The :mod:`tigon.functional` ops a patched model of this config runs, or None for a family Tigon does not know.

    From the family spec: its norms' kinds, the gated op of its gated MLPs' activation (:data:`ACTIVATIONS`; the
    config's activation attribute, else the transformers config class's default), ``rope`` when it has a rotary
    function, ``glu_linear`` when a dense MLP folds its down projection into the SwiGLU, and both cross-entropy ops
    (the fused LM-head loss, and the plain loss the op replaces). ``config`` is a config dict (``config.json``).
    """
    model_type = config.get("model_type")
    spec = next((s for s in FAMILIES.values() if model_type in (s.name, *s.aliases)), None)
    if spec is None:
        return None
    ops = {n.kind for n in spec.norms}
    for m in spec.mlps:
        if not m.gated:
            continue  # left alone (no Tigon op)
        act = m.activation or config.get(m.act_config_attr) or _config_default(model_type, m.act_config_attr)
        if act in ACTIVATIONS:
            ops.add(ACTIVATIONS[act][0])
    if spec.rope is not None:
        ops.add("rope")
    if spec.decoder_layers:
        ops.add("fused_add_rms_norm")
    if "swiglu" in ops and any(m.down and not m.experts for m in spec.mlps):
        ops.add("glu_linear")  # what the patched MLP runs (down projection folded in), timed with silu
    return ops | {"cross_entropy", "fused_linear_cross_entropy"}


def _config_default(model_type: str | None, attr: str):
    """The default of ``attr`` in the ``transformers`` config class of ``model_type`` (None if unknown)."""
    try:
        from transformers import AutoConfig

        return getattr(AutoConfig.for_model(model_type), attr, None)
    except Exception:
        return None


def kind_op(kind: str, config) -> str | None:
    """The :mod:`tigon.functional` op a replacement of patch ``kind`` runs for a model of ``config`` (a transformers
    config or its dict), or None for a kind that runs no single op.

    ``mlp`` runs the gated op of the config's activation (``hidden_act`` / ``hidden_activation``; SwiGLU when it
    names none Tigon has), ``lm_head_loss`` the fused linear cross-entropy, ``lora`` the LoRA linear; the norm and
    rotary kinds are their ops.
    """
    if kind in ("rms_norm", "layer_norm", "rope", "fused_add_rms_norm"):
        return kind
    if kind == "mlp":
        get = config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)
        act = get("hidden_act") or get("hidden_activation")
        return ACTIVATIONS.get(act, ("swiglu", None))[0]
    if kind == "lm_head_loss":
        return "fused_linear_cross_entropy"
    if kind == "lora":
        return "lora_linear"
    return None


def rms_semantics(model_type: str) -> tuple[str, float]:
    """(casting_mode, offset) of the RMSNorm of the family ``model_type`` names (Llama's, ``("llama", 0.0)``, when the
    family is not one of Tigon's or has no RMSNorm)."""
    try:
        spec = family_by_name(model_type or "")
    except ValueError:
        return "llama", 0.0
    rms = next((n for n in spec.norms if n.kind == "rms_norm"), None)
    return (rms.casting_mode, rms.offset) if rms is not None else ("llama", 0.0)


def rotary_function(model) -> tuple[object, str] | None:
    """``(modeling module, function name)`` of the module-global rotary function the first submodule of a registered
    family calls (``apply_rotary_pos_emb``), or None (no registered family, or a family without one)."""
    for m in model.modules():
        spec = family_by_module(type(m).__module__)
        if spec is not None:
            mod = sys.modules.get(spec.module)
            return (mod, spec.rope.function) if spec.rope is not None and mod is not None else None
    return None
