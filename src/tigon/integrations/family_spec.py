"""The vocabulary of model-family data: the dataclasses a :class:`FamilySpec` is made of, the adapter specs and the
activation table. The families themselves are in :mod:`tigon.integrations.families`.

Nothing here imports transformers: specs are strings until the engine resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

@dataclass(frozen=True)
class NormSpec:
    """A normalisation class whose ``forward`` becomes a Tigon op.

    cls: class name in the family module, or the dotted name of a shared class outside it (``"torch.nn.LayerNorm"``,
        what GPT-NeoX, phi, StableLM and Falcon use). A shared class is patched per model only (instance level:
        its instances inside a model of the family); a class-level patch leaves it alone and says so, because
        Tigon never changes ``torch.nn`` or classes other models use.
    kind: ``"rms_norm"`` (:func:`tigon.functional.rms_norm`) or ``"layer_norm"`` (:func:`tigon.functional.layer_norm`).
    casting_mode, offset: passed to rms_norm (``"llama"``/0.0 for Llama; ``"gemma"``/1.0 for Gemma's ``1 + w``);
        for layer_norm, ``offset`` is added to the weight before the op (Nemotron's ``LayerNorm1P``: ``1 + w``).
    eps_attr: the instance attribute holding epsilon (``variance_epsilon`` in Llama, ``eps`` in Gemma and
        ``torch.nn.LayerNorm``), or a tuple of names, the first an instance has (a class that renamed it between
        transformers versions: Gemma 4's and Llama 4's norms have ``eps`` in 5.17, ``variance_epsilon`` in 5.2x).
    weight_attr, bias_attr: instance attributes holding the affine parameters (bias only for layer_norm).
    optional_weight: an instance without ``weight_attr`` normalises without a weight (rms_norm's ``weight=None``):
        Llama-4's weightless q / k norm, Gemma 4's ``with_scale=False`` norms. False: such an instance is skipped.
    gated: a gated RMSNorm, ``forward(hidden_states, gate)`` returning ``rmsnorm(hidden_states) * silu(gate)`` or
        ``rmsnorm(hidden_states * silu(gate))``: :func:`tigon.functional.rms_norm_gated` (Qwen3-Next / Qwen3.5's
        ``RMSNormGated``, Falcon-H1's and Mamba-2's Mamba norms), statistics per group where the instance says so
        (an attribute ``n_groups``, Falcon-H1's, or ``group_size``, Mamba-2's copies), the gate order its attribute
        ``norm_before_gate`` says, else ``norm_before_gate`` here.
    norm_before_gate: a gated norm's gate order when its instances carry no ``norm_before_gate`` attribute (False:
        Mamba-2's ``MambaRMSNormGated`` copies, which gate first).
    """

    cls: str
    kind: str = "rms_norm"
    casting_mode: str = "llama"
    offset: float = 0.0
    eps_attr: str | tuple[str, ...] = "variance_epsilon"
    weight_attr: str = "weight"
    bias_attr: str = "bias"
    optional_weight: bool = False
    gated: bool = False
    norm_before_gate: bool = True


@dataclass(frozen=True)
class MLPSpec:
    """A gated MLP ``down(act(gate(x)) * up(x))`` whose ``forward`` becomes swiglu / geglu (or ``glu_linear``), or a
    non-gated MLP ``down(act(up(x)))`` whose ``forward`` becomes :func:`tigon.functional.act_linear`.

    A non-gated MLP (GPT-NeoX, phi, Falcon, Nemotron, the CLIP / SigLIP vision towers: ``gate=None``) runs
    ``act_linear(up(x), down.weight, down.bias, activation=...)``: the down projection's input ``act(h)`` is
    recomputed in the backward instead of being saved beside h (one (tokens, I) tensor less per layer). Its
    activation is named by the class of its activation module (``act``), and the down projection must be a plain
    ``nn.Linear`` (or ``linear_cls``); otherwise, or without ``act``, it is reported and left alone.

    cls: class name in the family module.
    act_config_attr: the attribute of the module's ``config`` naming the activation (``hidden_act``; Gemma 2 and 3
        use ``hidden_activation``). See :data:`ACTIVATIONS` for the supported names.
    activation: a fixed activation name (an :data:`ACTIVATIONS` key) instead of reading the config; the generic
        matcher sets it from its numerical probe. ``"clamped_swiglu"`` with ``experts``: GPT-OSS's experts, whose own
        ``_apply_gate`` (clamped SwiGLU on interleaved gate / up, the module's ``alpha`` / ``limit``) becomes
        :func:`tigon.functional.clamped_swiglu`.
    gate, up, down: attribute names of the three projections (any callables: nn.Linear, LoRA-wrapped Linear ...);
        ``gate`` None (and no ``gate_up``): a non-gated MLP ``down(act(up(x)))``.
    gate_up: attribute name of a fused gate-up projection (Phi-3, GLM-4: ``gate, up = gate_up(x).chunk(2, -1)``);
        when set, ``gate`` and ``up`` are not used and the kernel reads the two halves in place.
    experts: the class is a Hugging Face v5 MoE experts module (``@use_experts_implementation``: 3-D
        ``gate_up_proj`` / ``down_proj`` parameters). Its expert loop is not replaced; its ``_apply_gate(gate_up_out)``
        hook (``act(gate) * up`` on the chunked halves, called by the ``grouped_mm`` / ``batched_mm`` experts
        implementations) becomes swiglu / geglu. The ``eager`` experts implementation computes ``act(gate) * up``
        inline and is left alone (reported).
    multipliers: attribute names of the module's gate and down multipliers (HF FalconH1MLP: ``("gate_multiplier",
        "down_multiplier")``, its forward ``down(up(x) * act(gate(x) * gate_multiplier)) * down_multiplier``), read
        at each call and passed to the op as kernel scalars; None: no multipliers.
    act: for a non-gated MLP whose forward is exactly ``down(act(up(x)))``, the attribute holding its activation
        module (GPT-NeoX's and Falcon's ``act``, phi's and CLIP's ``activation_fn``, Nemotron's ``act_fn``); the
        module's class names the activation (:data:`NONGATED_ACTIVATIONS` of its ``ACT2FN`` name, or
        ``torch.nn.GELU`` by its ``approximate``). None: the non-gated MLP is reported and left alone.
    linear_cls: the family's own ``nn.Linear`` subclass its down projection may be, computing ``nn.Linear``'s map
        (Falcon's ``FalconLinear``: ``x @ W.T + b`` in two ATen calls), folded into ``act_linear`` like a plain
        ``nn.Linear`` (one rounding of the bias add less); None: only ``torch.nn.Linear`` itself is folded.
    limit: the attribute of the module holding the clamp of its gate and up (DeepSeek-V4's ``self.limit``,
        ``config.swiglu_limit``: ``act_fn(gate.clamp(max=limit)) * up.clamp(-limit, limit)``), read at each call and
        passed as :func:`tigon.functional.swiglu`'s / ``glu_linear``'s ``limit`` (SiLU only: another activation runs
        the original). With ``experts``: the class's own ``_apply_gate`` must be that clamped SwiGLU on the chunked
        halves (read from its source) and becomes ``swiglu(*gate_up.chunk(2, -1), limit=self.limit)``. None: no
        clamp.
    """

    cls: str
    act_config_attr: str = "hidden_act"
    activation: str | None = None
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    gate_up: str | None = None
    experts: bool = False
    multipliers: tuple[str, str] | None = None
    act: str | None = None
    linear_cls: str | None = None
    limit: str | None = None

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

    function: its name in the family module (``apply_rotary_pos_emb``).
    layout: the function's layout and signature, which picks the Tigon op its calls run
        (:data:`tigon.integrations.rotary_layouts.ROPE_OPS`): ``"rotate_half"`` (HF/NeoX halves,
        ``(q, k, cos, sin, unsqueeze_dim=1)``: :func:`tigon.functional.rope`), ``"interleaved"`` (GLM's pairs
        ``(x[2i], x[2i+1])``: ``rope_interleaved``), ``"deinterleave"`` (DeepSeek-V3's
        ``apply_rotary_pos_emb_interleave``: pairs in, halves out), ``"half_width"`` (GPT-OSS: cos / sin of one
        column per pair), ``"mrope"`` (Qwen2-VL's ``apply_multimodal_rotary_pos_emb`` with ``mrope_section``:
        ``mrope``), ``"complex"`` (Llama 4 / DeepSeek-V2's ``apply_rotary_emb(xq, xk, freqs_cis)``),
        ``"complex_vision"`` (Llama 4's ``vision_apply_rotary_emb(query, key, freqs_ci)``: one table for every image,
        heads at axis 2). Any other layout (:data:`ROPE_LAYOUTS`) is reported as unsupported, with its reason, and
        left alone.
    attention_classes: the classes whose forward calls ``function``; at instance level the rotary kernel is
        enabled only while a patched instance of one of these runs (see :mod:`tigon.integrations.engine`).
    enabled_attr: an attention-instance attribute that says whether the layer applies rotary at all (SmolLM3's
        ``use_rope``; its NoPE layers have it False and are left alone), or None when every layer does.
    off_config_attr: a config attribute that, when true, replaces rotary in the whole model (Falcon's ``alibi``:
        ALiBi biases, no rotary call); such models have no rotary to patch (noted), or None.
    partial_rotary: the family's code handles partial rotary (``partial_rotary_factor`` / ``rotary_pct`` below 1:
        only the first ``rotary_dim`` dims of each head are rotated) in a way Tigon's rotary ops reproduce: its
        rotary function rotates the first ``cos.shape[-1]`` dims and passes the rest (GPT-NeoX, GLM), or its
        attention passes only the rotated slice of q and k to it (phi, StableLM). Then partial-rotary models are
        patched, and the dispatcher sends calls with cos / sin narrower than the head to Tigon. False: partial
        rotary is refused per model at instance level, and at class level the dispatcher runs the original function
        for any call whose cos / sin do not span the full head dim.
    alternatives: ``(function, layout)`` of other module-global rotary functions the same attention classes call
        instead for some configurations or transformers versions (DeepSeek-V3's
        ``apply_rotary_pos_emb_interleave`` under ``config.rope_interleave``; Qwen2-VL's
        ``apply_multimodal_rotary_pos_emb`` before transformers 5.2x); per attention instance the engine routes the
        one its forward calls (:mod:`tigon.integrations.rotary_calls`), and those absent from the module are ignored.
    head_axis: where the heads are in q and k for a layout whose function does not say (``"complex"``: 1 for
        DeepSeek-V2's (B, H, T, D), 2 for Llama 4's (B, T, H, D)).
    qkv: the attention classes' q, k and v projection attributes. When all three are fused adapter layers (PEFT
        LoRA) and the class's forward begins with HF Llama's form (``self.<q>(hidden_states).view(hidden_shape)
        .transpose(1, 2)`` for q, k, v, then ``<function>(query_states, key_states, cos, sin)``; checked against
        its source, :mod:`tigon.integrations.lora_qkv`), the projections and the rotary run as one
        :attr:`AdapterSpec.qkv_rope_op` node; other forms (Qwen3's q_norm / k_norm in between) keep them apart,
        with the reason in the report.
    """

    function: str = "apply_rotary_pos_emb"
    layout: str = "rotate_half"
    attention_classes: tuple[str, ...] = ()
    enabled_attr: str | None = None
    off_config_attr: str | None = None
    partial_rotary: bool = False
    alternatives: tuple[tuple[str, str], ...] = ()
    head_axis: int = 1
    qkv: tuple[str, str, str] = ("q_proj", "k_proj", "v_proj")

    def candidates(self) -> tuple[RopeSpec, ...]:
        """This spec's function, then each of :attr:`alternatives`, as single-function specs."""
        return (replace(self, alternatives=()),) + tuple(replace(self, function=f, layout=lay, alternatives=())
                                                         for f, lay in self.alternatives)


ROPE_LAYOUTS: dict[str, str] = {}
"""Rotary layouts families may declare that no Tigon op takes -> why (the report's reason). Empty since the
interleaved, half-width, mRoPE and complex layouts have ops (:mod:`tigon.integrations.rotary_layouts`)."""

IMAGE_LAYOUTS = ("grid", "square", "anyres", "patches", "tiles")
"""The image layouts a family may declare (:attr:`FamilySpec.image_layout`); each is a batch form of
:func:`tigon.workflows.multimodal.with_images` (see :mod:`tigon.workflows.multimodal`)."""

IMAGE_TOKEN_RULES = ("count", "ratio", "merge", "select")
"""The rules a ``square`` / ``anyres`` family's image-token count may follow (:attr:`FamilySpec.image_tokens`), each
of a config attribute (see :func:`tigon.workflows.multimodal.square_image_tokens`)."""


@dataclass(frozen=True)
class DecoderLayerSpec:
    """A pre-norm decoder layer whose first residual add runs fused with the norm after it.

    The layer's ``forward`` must be exactly Hugging Face Llama's (checked against its source at patch time, see
    :func:`tigon.integrations.decoder_layer.decoder_layer_problem`)::

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
        then in ``transformers.modeling_outputs``); a tuple names the class of each transformers version, the first
        that exists is used (vision-language models return ``MultimodalCausalLMOutputWithPast`` in 5.2x, a class of
        their own before).
    head_only_args: forward arguments consumed by the head/loss and not passed to the backbone.
    softcap_attr: config attribute with the final logit softcap (``final_logit_softcapping`` in Gemma 2), or None.
    logit_scale_attr: config attribute that multiplies the logits (Cohere's ``logit_scale``), or None.
    logit_divisor_attr: config attribute that divides the logits (Granite's ``logits_scaling``), or None.
    text_config_attrs: read ``softcap_attr`` / ``logit_scale_attr`` / ``logit_divisor_attr`` and the MoE router
        settings (``output_router_logits``, ``num_experts``, ``num_experts_per_tok``, ``router_aux_loss_coef``) from
        ``config.get_text_config()`` (a vision-language head that takes them from its text config, as PaliGemma's
        softcapping and Qwen3.5-MoE's router loss do) instead of ``config`` and the head's attributes.
    router_aux_loss: for MoE families, the name of the family-module function computing the router
        load-balancing loss (``load_balancing_loss_func``), called as HF does when ``output_router_logits`` is on:
        ``fn(router_logits, model.num_experts, model.num_experts_per_tok, attention_mask)``, added to the loss times
        ``model.router_aux_loss_coef`` and returned as ``aux_loss``. None for dense families.
    inner: for a class whose forward calls a causal LM of its own (a head of the family, the attribute ``inner``
        names) without labels and computes HF's loss on the logits it returns: Llama 4's vision-language class
        merges the image features into the embeddings, then calls its ``language_model`` (a ``Llama4ForCausalLM``).
        Patched, its forward runs the original, the inner LM (whose forward the engine patches with it: one report
        entry) handing back its last hidden states, sliced by ``logits_to_keep``, in the logits' place
        (:data:`~tigon.integrations.causal_lm.HIDDEN_IN_LOGITS`), then the fused loss on the inner LM's head;
        ``backbone`` and ``lm_head`` name the inner LM's attributes, the config attributes are read from this
        class's config. Only for a forward that does nothing to the logits but return them and pass them to
        ``self.loss_function`` (no router loss is added). None: the class holds its backbone and head itself.
    """

    cls: str
    backbone: str = "model"
    lm_head: str = "lm_head"
    output_class: str | tuple[str, ...] = "CausalLMOutputWithPast"
    head_only_args: tuple[str, ...] = ("labels", "logits_to_keep")
    softcap_attr: str | None = None
    logit_scale_attr: str | None = None
    logit_divisor_attr: str | None = None
    router_aux_loss: str | None = None
    older_lm_head: str | None = None
    text_config_attrs: bool = False
    inner: str | None = None


@dataclass(frozen=True)
class Unsupported:
    """A class of the family that Tigon leaves alone, with the reason: each instance in a model is listed under the
    report's ``skipped`` (and a class-level patch lists the class), so the report says what was not replaced and why.

    kind: the report kind it would be (``"rms_norm"``, ``"mlp"``, ...). cls: class name in the family module (or a
    dotted name). reason: why there is no Tigon replacement (e.g. the kernel variant it would need).
    """

    kind: str
    cls: str
    reason: str


@dataclass(frozen=True)
class FamilySpec:
    """Everything Tigon replaces in one model family.

    name: the family name accepted by :func:`tigon.patch` (``"llama"``); aliases: other accepted names.
    module: the modeling module (``"transformers.models.llama.modeling_llama"``); models are matched to a family
        by the module of their submodules' classes.
    norms, mlps, rope, causal_lm, decoder_layers: the parts above; empty / None where the family has no such part
        (decoder_layers: only families whose layer is Llama's pre-norm form, see :class:`DecoderLayerSpec`).
    extra_heads: more LM-head classes of the same module (Gemma 3's ``Gemma3ForConditionalGeneration`` beside
        ``Gemma3ForCausalLM``); :attr:`heads` is all of them.
    unsupported: classes of the family left alone, each with the reason (:class:`Unsupported`).
    container: a vision-language container whose language model is another family's classes (Llava, PaliGemma,
        SmolVLM, InternVL): a class-level patch of the family leaves that model alone and says so.
    sinks: attention classes with a learned sink logit per head (``module.sinks``, passed to the attention function
        as ``s_aux``: GPT-OSS): a model of them whose config asks for eager attention is switched to
        :func:`tigon.integrations.sink_attention.sink_attention` (SDPA, instance level only).
    varlen_attention: vision attention classes whose non-flash path calls the attention once per ``cu_seqlens``
        chunk (Qwen-VL, GLM-4V towers): a model whose vision config asks for sdpa is switched to
        :func:`tigon.integrations.varlen_attention.varlen_sdpa` (one SDPA call per chunk length, instance level only).
    image_layout: how a vision-language model of the family takes an image (one of :data:`IMAGE_LAYOUTS`), which
        shapes the image + text batches of the tools (:func:`tigon.workflows.multimodal.with_images`): ``"grid"``
        (Qwen-VL, GLM-4V: patches of one frame flattened to ``(patches, values)`` rows with ``image_grid_thw``,
        merged ``spatial_merge_size**2`` to an image token), ``"square"`` (LLaVA, PaliGemma, Gemma 3, InternVL,
        SmolVLM, Idefics3, Mistral 3, Aya Vision, Llama 4: one image of the vision config's ``image_size``, a token
        count fixed by the config), ``"anyres"`` (LLaVA-NeXT, LLaVA-OneVision: a base tile plus the crops of the best
        ``image_grid_pinpoints``), ``"patches"`` (Gemma 4: flattened patches with their ``(x, y)`` positions, pooled
        to image tokens) or ``"tiles"`` (Mllama: padded tiles that cross-attention layers attend to). None: the tools
        build no image inputs for the family (a text-only family, a vision tower, or a layout not written yet).
    image_tokens: how many image tokens one image of a ``square`` family (an ``anyres`` family's base tile) takes,
        from the vision config's patches ``P = (image_size // patch_size)**2``, as ``(rule, attribute of the
        config)`` (a dotted path reads a sub-config's: ``"vision_config.pixel_shuffle_ratio"``), the rule one of
        :data:`IMAGE_TOKEN_RULES`: ``("count", a)`` the attribute itself (Gemma 3's ``mm_tokens_per_image``);
        ``("ratio", a)`` ``int(P * a**2)`` (InternVL's ``downsample_ratio``, Llama 4's vision config's
        ``pixel_shuffle_ratio``: one tile per image); ``("merge",
        a)`` ``P // a**2`` (SmolVLM's and Idefics3's ``scale_factor``, Mistral 3's ``spatial_merge_size``, Aya
        Vision's ``downsample_factor``); ``("select", a)`` LLaVA's feature selection by the strategy ``a`` names
        (``vision_feature_select_strategy``, ``"default"`` when the config has none): ``P``, plus one when the vision
        tower's family has a :attr:`class_token`, less the first feature under ``"default"``, and ``P`` for a tower
        of :attr:`image_sizes` (LLaVA, LLaVA-NeXT, LLaVA-OneVision). None: a token per patch (PaliGemma).
    images_axis: a ``square`` family whose ``pixel_values`` have an images axis after the batch, ``(batch, images,
        channels, size, size)`` (SmolVLM, Idefics3).
    class_token: a vision-tower family whose features begin with a class token before the patches' (CLIP): LLaVA's
        ``select`` count (:attr:`image_tokens`) has it.
    image_sizes: a vision-tower family whose forward takes each image's ``(height, width)`` as ``image_sizes`` and
        gives one feature per patch, packed over the images (Pixtral): a ``square`` batch of a model with this tower
        carries ``image_sizes``, and LLaVA's ``select`` count is its patches (its configs select ``"full"``: the
        ``"default"`` cut of the first feature does not apply to a packed sequence).
    """

    name: str
    module: str
    norms: tuple[NormSpec, ...] = ()
    mlps: tuple[MLPSpec, ...] = ()
    rope: RopeSpec | None = None
    causal_lm: CausalLMSpec | None = None
    aliases: tuple[str, ...] = ()
    decoder_layers: tuple[DecoderLayerSpec, ...] = ()
    extra_heads: tuple[CausalLMSpec, ...] = ()
    unsupported: tuple[Unsupported, ...] = ()
    container: bool = False
    sinks: tuple[str, ...] = ()
    varlen_attention: tuple[str, ...] = ()
    image_layout: str | None = None
    image_tokens: tuple[str, str] | None = None
    images_axis: bool = False
    class_token: bool = False
    image_sizes: bool = False

    @property
    def heads(self) -> tuple[CausalLMSpec, ...]:
        """Every LM-head class of the family: ``causal_lm`` (when set) and ``extra_heads``."""
        return ((self.causal_lm,) if self.causal_lm is not None else ()) + self.extra_heads


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
    are reported as skipped. mlp_op: the :mod:`tigon.functional` op that runs a patched gated MLP whose gate, up and
    down projections are all fused layers of this kind as one node (:mod:`tigon.integrations.lora_mlp`), or None.
    gate_up_op: the op for a gated MLP with one fused gate-up projection (Phi-3, GLM-4: ``MLPSpec.gate_up``) whose
    gate-up and down projections are such layers, or None. qkv_rope_op: the op that runs an attention's q, k, v
    projections (all layers of this kind) and its rotate-half rotary as one node (:mod:`tigon.integrations.lora_qkv`),
    or None.
    """

    kind: str
    module: str
    cls: str
    base_class: str
    mlp_op: str | None = None
    gate_up_op: str | None = None
    qkv_rope_op: str | None = None


PEFT_LORA = AdapterSpec("lora", "peft.tuners.lora.layer", "Linear", "LoraLayer", mlp_op="lora_glu_mlp",
                        gate_up_op="lora_gate_up_mlp", qkv_rope_op="lora_qkv_rope")
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
    # not an HF activation name: GPT-OSS's experts hook (MLPSpec.activation), clamp / alpha / +1 on up
    "clamped_swiglu": ("clamped_swiglu", None),
}

GLU_LINEAR_ACTIVATIONS: dict[tuple[str, str | None], str] = {
    ("swiglu", None): "silu", ("geglu", "none"): "gelu", ("geglu", "tanh"): "gelu_tanh"}
"""A gated MLP's :data:`ACTIVATIONS` entry -> :func:`tigon.functional.glu_linear`'s ``activation``."""

# HF activation names (``transformers.activations.ACT2FN`` keys) -> the activation of the non-gated MLP's op,
# tigon.functional.act_linear (its ``activation`` argument).
NONGATED_ACTIVATIONS: dict[str, str] = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu2": "relu2",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "quick_gelu": "quick_gelu",
}


@dataclass(frozen=True)
class Match:
    """One module the engine should patch (or report): found by a family spec or by the generic matcher.

    kind: report kind (``rms_norm``, ``mlp``, ``rope``, ``lm_head_loss``); cls: the class whose attribute is
    replaced; comp: the component spec (NormSpec / MLPSpec / RopeSpec / CausalLMSpec); family_module: the modeling
    module's name (for rope: the module holding the rotary global); problem: why it
    cannot be patched (probe failure), or None; inner: for an LM head reached through a causal LM of its own
    (:attr:`CausalLMSpec.inner`), that LM's ``(path, module, Match)`` (its forward is
    patched with this one, :func:`tigon.integrations.plan.held_heads`), or None.
    """

    kind: str
    cls: type
    comp: object
    family_module: str
    problem: str | None = None
    inner: tuple | None = None
