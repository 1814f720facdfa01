"""Model families as data: what to replace in a Hugging Face modeling module, and how.

A :class:`FamilySpec` names classes and functions of one ``transformers.models.<family>.modeling_<family>`` module
and the few numbers that distinguish the family (RMSNorm casting mode and weight offset, the activation's config
attribute, LM-head softcapping / scaling). The engine in :mod:`tigon.integrations.engine` applies any spec; adding a
family is adding a spec here (and a tiny-config test), never writing a patch function.

Nothing here imports transformers: specs are strings until the engine resolves them.
"""

from __future__ import annotations

import sys
from dataclasses import replace

from .family_spec import (  # noqa: F401  (re-exported: the spec vocabulary is importable from here too)
    ACTIVATIONS,
    GLU_LINEAR_ACTIVATIONS,
    ADAPTERS,  # noqa: F401
    NONGATED_ACTIVATIONS,
    PEFT_LORA,  # noqa: F401
    ROPE_LAYOUTS,  # noqa: F401
    AdapterSpec,  # noqa: F401
    CausalLMSpec,
    DecoderLayerSpec,
    FamilySpec,
    MLPSpec,
    NormSpec,
    RopeSpec,
    Unsupported,
)


def _dense(name: str, prefix: str, *, norm: NormSpec | None = None, mlp: MLPSpec | None = None,
           mlps: tuple[MLPSpec, ...] | None = None, rope: RopeSpec | None = None,
           causal_lm: CausalLMSpec | None = None, aliases: tuple[str, ...] = (), pre_norm_layer: bool = True,
           **more) -> FamilySpec:
    """The usual shape of a decoder family: ``<Prefix>RMSNorm``, ``<Prefix>MLP``, ``apply_rotary_pos_emb`` called by
    ``<Prefix>Attention``, ``<Prefix>ForCausalLM``, and (``pre_norm_layer``) a ``<Prefix>DecoderLayer`` of Llama's
    pre-norm form, each overridable (``mlps`` replaces the one ``mlp``); ``more``: other :class:`FamilySpec` fields
    (``extra_heads``, ``unsupported``)."""
    norm = norm or NormSpec(f"{prefix}RMSNorm")
    return FamilySpec(
        name=name,
        module=f"transformers.models.{name}.modeling_{name}",
        norms=(norm,),
        mlps=mlps if mlps is not None else (mlp or MLPSpec(f"{prefix}MLP"),),
        rope=rope or RopeSpec(attention_classes=(f"{prefix}Attention",)),
        causal_lm=causal_lm or CausalLMSpec(f"{prefix}ForCausalLM"),
        aliases=aliases,
        decoder_layers=(DecoderLayerSpec(f"{prefix}DecoderLayer", norm),) if pre_norm_layer else (),
        **more,
    )


def _gemma_norm(prefix: str) -> NormSpec:  # (1 + w), everything in fp32, cast at the end
    return NormSpec(f"{prefix}RMSNorm", casting_mode="gemma", offset=1.0, eps_attr="eps")


def _moe(name: str, prefix: str, *, dense_mlp: bool, aux_loss: bool = True, experts: bool = True,
         pre_norm_layer: bool = True, **more) -> FamilySpec:
    """A v5 MoE family: the experts' ``_apply_gate`` hook (``experts``), the dense MLP of non-MoE layers or shared
    experts (``dense_mlp``: ``<Prefix>MLP``), and the MoE causal-LM output, with the router load-balancing loss where
    the family's head adds it (``aux_loss``: HunYuan-MoE and DeepSeek-V3 return router logits but add no loss).
    ``more``: :func:`_dense`'s overrides (``norm``, ``rope``, ``unsupported``, ...)."""
    dense = (MLPSpec(f"{prefix}MLP"),) if dense_mlp else ()
    head = CausalLMSpec(f"{prefix}ForCausalLM", output_class="MoeCausalLMOutputWithPast",
                        router_aux_loss="load_balancing_loss_func" if aux_loss else None)
    mlps = dense + ((MLPSpec(f"{prefix}Experts", experts=True),) if experts else ())
    return _dense(name, prefix, mlps=mlps, causal_lm=head, pre_norm_layer=pre_norm_layer, **more)


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
GEMMA3 = _dense(  # Gemma 2 plus per-head q_norm / k_norm; the text model Gemma3ForCausalLM, and the vision-language
    "gemma3", "Gemma3", norm=_gemma_norm("Gemma3"), mlp=MLPSpec("Gemma3MLP", act_config_attr="hidden_activation"),
    causal_lm=CausalLMSpec("Gemma3ForCausalLM", softcap_attr="final_logit_softcapping"), aliases=("gemma3_text",),
    pre_norm_layer=False,  # Gemma3ForConditionalGeneration (no final softcapping in its head; SigLIP vision tower)
    extra_heads=(CausalLMSpec("Gemma3ForConditionalGeneration", output_class="Gemma3CausalLMOutputWithPast"),),
    image_layout="square", image_tokens=("count", "mm_tokens_per_image"))
PHI3 = _dense(  # fused gate_up_proj: up * act(gate) on the chunked halves; partial rotary (Phi-4-mini: 0.75) in
    "phi3", "Phi3", mlp=MLPSpec("Phi3MLP", gate_up="gate_up_proj"),  # apply_rotary_pos_emb, as GPT-NeoX's
    rope=RopeSpec(attention_classes=("Phi3Attention",), partial_rotary=True), pre_norm_layer=False)  # residual dropout
GRANITE = _dense(  # logits / config.logits_scaling
    "granite", "Granite", causal_lm=CausalLMSpec("GraniteForCausalLM", logit_divisor_attr="logits_scaling"),
    pre_norm_layer=False)  # residual_multiplier
OLMO2 = _dense(  # norms after attention / MLP, q_norm / k_norm over the whole projection; (w * x).to(dtype) casting
    "olmo2", "Olmo2", norm=NormSpec("Olmo2RMSNorm", casting_mode="gemma"), pre_norm_layer=False)
GLM4 = _dense(  # fused gate_up_proj; rotary on interleaved pairs over a partial head dim (rope_interleaved)
    "glm4", "Glm4", mlp=MLPSpec("Glm4MLP", gate_up="gate_up_proj"),
    rope=RopeSpec(layout="interleaved", attention_classes=("Glm4Attention",), partial_rotary=True),
    pre_norm_layer=False)
SMOLLM3 = _dense(  # NoPE layers (config.no_rope_layers[i] == 0) have no rotary to patch
    "smollm3", "SmolLM3", rope=RopeSpec(attention_classes=("SmolLM3Attention",), enabled_attr="use_rope"))

def _gated_norm(cls: str, casting_mode: str = "llama", norm_before_gate: bool = True) -> NormSpec:
    """A gated RMSNorm, ``norm(x) * silu(gate)`` (the Gated DeltaNet's / Mamba mixer's output norm): rms_norm_gated
    (Qwen3-Next's rounds the normalised value before the weight, ``"llama"``; Falcon-H1's is all fp32, ``"gemma"``;
    ``norm_before_gate=False``: Mamba-2's copies, ``norm(x * silu(gate))``, whose instances do not say)."""
    return NormSpec(cls, casting_mode=casting_mode, gated=True, norm_before_gate=norm_before_gate)


# Dense families added for Liger-Kernel 0.8.5's list (issue 20); each checked with tigon inspect on a tiny config.
OLMO3 = _dense(  # OLMo 2's layout (post-attention / post-MLP norms, q_norm / k_norm over the projection) + sliding
    "olmo3", "Olmo3", norm=NormSpec("Olmo3RMSNorm", casting_mode="gemma"), pre_norm_layer=False)  # window layers
EXAONE4 = _dense(  # post-norm layers with q_norm / k_norm; under a sliding window only sliding layers apply rotary
    "exaone4", "Exaone4", pre_norm_layer=False)  # (the full-attention layers are NoPE: a note)
HUNYUAN_V1_DENSE = _dense("hunyuan_v1_dense", "HunYuanDenseV1")  # per-head query / key layernorm after the rotary
MINISTRAL = _dense("ministral", "Ministral")  # Mistral with interleaved sliding-window layers
FALCON_H1 = replace(_dense(  # hybrid attention + Mamba-2 (its gated output norm: rms_norm_gated); muP multipliers
    "falcon_h1", "FalconH1", pre_norm_layer=False,  # everywhere, logits * config.lm_head_multiplier; the MLP's gate /
    mlp=MLPSpec("FalconH1MLP", multipliers=("gate_multiplier", "down_multiplier")),  # down ones: GLU kernel scalars
    causal_lm=CausalLMSpec("FalconH1ForCausalLM", logit_scale_attr="lm_head_multiplier")),
    norms=(NormSpec("FalconH1RMSNorm"), _gated_norm("FalconH1RMSNormGated", "gemma")))

# MoE families: experts through the _apply_gate hook, the head keeps the router loss (and aux_loss) where HF adds it.
OLMOE = _moe("olmoe", "Olmoe", dense_mlp=False, pre_norm_layer=False)  # q_norm / k_norm over the projection
HUNYUAN_V1_MOE = _moe("hunyuan_v1_moe", "HunYuanMoEV1", dense_mlp=True, aux_loss=False)  # shared_mlp per layer
DEEPSEEK_V3 = _moe(  # MLA attention: rotary on the rope slice; rope_interleave (the default) calls
    "deepseek_v3", "DeepseekV3", dense_mlp=True, aux_loss=False,  # apply_rotary_pos_emb_interleave (pairs in,
    rope=RopeSpec(attention_classes=("DeepseekV3Attention",),  # halves out: rope_interleaved(deinterleave=True))
                  alternatives=(("apply_rotary_pos_emb_interleave", "deinterleave"),)))
GPT_OSS = replace(_moe(  # (w * x).to(dtype) norms; attention sinks on torch SDPA; mlp returns (out, router scores)
    "gpt_oss", "GptOss", dense_mlp=False, experts=False, pre_norm_layer=False,
    norm=NormSpec("GptOssRMSNorm", casting_mode="gemma"),
    rope=RopeSpec(layout="half_width", attention_classes=("GptOssAttention",))),  # cos / sin of one column per pair
    mlps=(MLPSpec("GptOssExperts", experts=True, activation="clamped_swiglu"),),  # its _apply_gate: clamped_swiglu
    sinks=("GptOssAttention",))  # eager sink attention -> SDPA with the sink folded into an extra key
QWEN3_NEXT = replace(_moe(  # hybrid Gated DeltaNet (gated output norm: rms_norm_gated) + attention layers; (1 + w)
    "qwen3_next", "Qwen3Next", dense_mlp=True, pre_norm_layer=False,  # norms; partial rotary (0.25) in
    rope=RopeSpec(attention_classes=("Qwen3NextAttention",), partial_rotary=True)),  # apply_rotary_pos_emb
    norms=(_gemma_norm("Qwen3Next"), _gated_norm("Qwen3NextRMSNormGated")))

# LayerNorm families: their norms are torch.nn.LayerNorm itself (patched per model, never at class level), their
# decoder layers are not Llama's pre-norm RMSNorm form (no fused_add_rms_norm).
TORCH_LAYER_NORM = NormSpec("torch.nn.LayerNorm", kind="layer_norm", eps_attr="eps")


def _layer_norm_family(name: str, prefix: str, *, mlp: MLPSpec, rope: RopeSpec,
                       causal_lm: CausalLMSpec | None = None, norm: NormSpec = TORCH_LAYER_NORM) -> FamilySpec:
    """A decoder family normalised by a LayerNorm (``torch.nn.LayerNorm``, :data:`TORCH_LAYER_NORM`, unless ``norm``),
    with its MLP, rotary and ``<Prefix>ForCausalLM`` (overridable); no :class:`DecoderLayerSpec` (fused_add_rms_norm
    is an RMSNorm op)."""
    return FamilySpec(name=name, module=f"transformers.models.{name}.modeling_{name}", norms=(norm,),
                      mlps=(mlp,), rope=rope, causal_lm=causal_lm or CausalLMSpec(f"{prefix}ForCausalLM"))


GPT_NEOX = _layer_norm_family(  # Pythia; apply_rotary_pos_emb rotates the first cos.shape[-1] dims (rotary_pct)
    "gpt_neox", "GPTNeoX", mlp=MLPSpec("GPTNeoXMLP", gate=None, up="dense_h_to_4h", down="dense_4h_to_h", act="act"),
    rope=RopeSpec(attention_classes=("GPTNeoXAttention",), partial_rotary=True),
    causal_lm=CausalLMSpec("GPTNeoXForCausalLM", backbone="gpt_neox", older_lm_head="embed_out"))
PHI = _layer_norm_family(  # phi-1 / phi-2: the attention rotates q[..., :rotary_ndims]; lm_head has a bias
    "phi", "Phi", mlp=MLPSpec("PhiMLP", gate=None, up="fc1", down="fc2", act="activation_fn"),
    rope=RopeSpec(attention_classes=("PhiAttention",), partial_rotary=True))
STABLELM = _layer_norm_family(  # gated SiLU MLP; the attention rotates q[..., :rotary_ndims]; per-head q/k LayerNorms
    "stablelm", "StableLm", mlp=MLPSpec("StableLmMLP"),
    rope=RopeSpec(attention_classes=("StableLmAttention",), partial_rotary=True))
FALCON = _layer_norm_family(  # config.alibi: ALiBi instead of rotary; MLP act from config.activation; its Linear
    "falcon", "Falcon", mlp=MLPSpec("FalconMLP", act_config_attr="activation", gate=None, up="dense_h_to_4h",
                                    down="dense_4h_to_h", act="act", linear_cls="FalconLinear"),  # x @ W.T + b
    rope=RopeSpec(attention_classes=("FalconAttention",), off_config_attr="alibi"),
    causal_lm=CausalLMSpec("FalconForCausalLM", backbone="transformer",
                           output_class="CausalLMOutputWithCrossAttentions"))
NEMOTRON = _layer_norm_family(  # LayerNorm1P: LayerNorm with (1 + w); non-gated relu2 MLP; partial rotary (0.5)
    "nemotron", "Nemotron", norm=NormSpec("NemotronLayerNorm1P", kind="layer_norm", offset=1.0, eps_attr="eps"),
    mlp=MLPSpec("NemotronMLP", gate=None, act="act_fn"),
    rope=RopeSpec(attention_classes=("NemotronAttention",), partial_rotary=True))


# Vision-language models: tigon.patch applies every registered family a model contains, so the text tower of another
# family (Llava's Llama, PaliGemma's Gemma) and the vision encoder (CLIP, SigLIP) are patched by their own specs; the
# specs below hold the container (its LM head + loss, its projector) or, where one modeling module holds both towers
# (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Mllama, Gemma 3), every part.
_VISION_ROPE = ("the vision tower's rotary (apply_rotary_pos_emb_vision on (patches, heads, head_dim) with cos / sin "
                "of (patches, head_dim), computed in fp32): another interface than apply_rotary_pos_emb, left alone")
_MULTIMODAL_OUTPUT = "MultimodalCausalLMOutputWithPast"  # transformers 5.2x; each family's own class before
_LLAVA_SELECT = ("select", "vision_feature_select_strategy")  # the LLaVA line's image tokens (FamilySpec.image_tokens)


def _vision(name: str, mlp: str, **more) -> FamilySpec:
    """A ViT vision encoder (CLIP, SigLIP): torch.nn.LayerNorm and a non-gated ``fc2(act(fc1(x)))`` MLP; ``more``:
    other :class:`FamilySpec` fields (``class_token``)."""
    return FamilySpec(name=name, module=f"transformers.models.{name}.modeling_{name}", norms=(TORCH_LAYER_NORM,),
                      mlps=(MLPSpec(mlp, gate=None, up="fc1", down="fc2", act="activation_fn"),), **more)


def _qwen_vl(name: str, prefix: str, *, text: str, norms: tuple[NormSpec, ...], mlps: tuple[MLPSpec, ...],
             vision_attention: str) -> FamilySpec:
    """A Qwen-VL family: text decoder and vision tower in one modeling module; the text rotary is rotate-half on cos /
    sin that the rotary embedding already assembled from the mRoPE sections (transformers 5.2x), or, in earlier
    versions, ``apply_multimodal_rotary_pos_emb`` with ``mrope_section`` (:func:`tigon.functional.mrope`)."""
    return FamilySpec(
        name=name, module=f"transformers.models.{name}.modeling_{name}", norms=norms, mlps=mlps,
        rope=RopeSpec(attention_classes=(f"{prefix}{text}Attention",),
                      alternatives=(("apply_multimodal_rotary_pos_emb", "mrope"),)),
        causal_lm=CausalLMSpec(f"{prefix}ForConditionalGeneration",
                               output_class=(_MULTIMODAL_OUTPUT, f"{prefix}CausalLMOutputWithPast")),
        decoder_layers=(DecoderLayerSpec(f"{prefix}{text}DecoderLayer", norms[0]),),
        unsupported=(Unsupported("rope", vision_attention, _VISION_ROPE),), varlen_attention=(vision_attention,),
        image_layout="grid")


CLIP = _vision("clip", "CLIPMLP", class_token=True)  # its features: the class token, then the patches
SIGLIP = _vision("siglip", "SiglipMLP")
LLAVA = FamilySpec(  # the language model and the vision tower are other families (Llama, CLIP by default)
    name="llava", module="transformers.models.llava.modeling_llava", container=True,
    mlps=(MLPSpec("LlavaMultiModalProjector", act_config_attr="projector_hidden_act", gate=None, up="linear_1",
                  down="linear_2", act="act"),),
    causal_lm=CausalLMSpec("LlavaForConditionalGeneration", output_class="LlavaCausalLMOutputWithPast"),
    image_layout="square", image_tokens=_LLAVA_SELECT)
PALIGEMMA = FamilySpec(  # Gemma / Gemma 2 language model, SigLIP vision tower; the head softcaps with the text config
    name="paligemma", module="transformers.models.paligemma.modeling_paligemma", container=True,
    causal_lm=CausalLMSpec("PaliGemmaForConditionalGeneration", output_class="PaliGemmaCausalLMOutputWithPast",
                           softcap_attr="final_logit_softcapping", text_config_attrs=True),
    image_layout="square")
QWEN2_VL = _qwen_vl(  # vision: torch.nn.LayerNorm, non-gated VisionMlp
    "qwen2_vl", "Qwen2VL", text="", norms=(NormSpec("Qwen2VLRMSNorm"), TORCH_LAYER_NORM),
    mlps=(MLPSpec("Qwen2MLP"), MLPSpec("VisionMlp", gate=None, up="fc1", down="fc2", act="act")),
    vision_attention="VisionAttention")
QWEN2_5_VL = _qwen_vl(  # vision: the same RMSNorm, a gated MLP with biases (activation from its act_fn)
    "qwen2_5_vl", "Qwen2_5_VL", text="", norms=(NormSpec("Qwen2_5_VLRMSNorm"),),
    mlps=(MLPSpec("Qwen2MLP"), MLPSpec("Qwen2_5_VLMLP")), vision_attention="Qwen2_5_VLVisionAttention")
QWEN3_VL = _qwen_vl(  # per-head q_norm / k_norm; vision: torch.nn.LayerNorm, non-gated MLP
    "qwen3_vl", "Qwen3VL", text="Text", norms=(NormSpec("Qwen3VLTextRMSNorm"), TORCH_LAYER_NORM),
    mlps=(MLPSpec("Qwen3VLTextMLP"),
          MLPSpec("Qwen3VLVisionMLP", gate=None, up="linear_fc1", down="linear_fc2", act="act_fn")),
    vision_attention="Qwen3VLVisionAttention")
MLLAMA = FamilySpec(  # Llama 3.2 Vision: self-attention layers, gated cross-attention layers, a LayerNorm ViT
    name="mllama", module="transformers.models.mllama.modeling_mllama",
    norms=(NormSpec("MllamaTextRMSNorm"), TORCH_LAYER_NORM),
    mlps=(MLPSpec("MllamaTextMLP"), MLPSpec("MllamaVisionMLP", gate=None, up="fc1", down="fc2", act="activation_fn")),
    rope=RopeSpec(attention_classes=("MllamaTextSelfAttention",)),
    causal_lm=CausalLMSpec("MllamaForCausalLM"),
    extra_heads=(CausalLMSpec("MllamaForConditionalGeneration",
                              output_class=(_MULTIMODAL_OUTPUT, "CausalLMOutputWithPast")),),
    image_layout="tiles")


def _qwen3_5(name: str, prefix: str, *, moe: bool) -> FamilySpec:
    """Qwen3.5 (dense or MoE): Qwen3-Next's hybrid text decoder (Gated DeltaNet + attention layers, (1 + w) norms,
    partial rotary) and a Qwen3-VL-like vision tower in one module; the text head and the vision-language head (its
    MoE router settings in the text config)."""
    moe_head = dict(output_class="MoeCausalLMOutputWithPast", router_aux_loss="load_balancing_loss_func")
    vlm_output = (f"{prefix}CausalLMOutputWithPast",) if moe else (_MULTIMODAL_OUTPUT,)
    return FamilySpec(
        name=name, module=f"transformers.models.{name}.modeling_{name}", aliases=(f"{name}_text",),
        norms=(_gemma_norm(prefix), _gated_norm(f"{prefix}RMSNormGated"), TORCH_LAYER_NORM),
        mlps=(MLPSpec(f"{prefix}MLP"),) + ((MLPSpec(f"{prefix}Experts", experts=True),) if moe else ())
        + (MLPSpec(f"{prefix}VisionMLP", gate=None, up="linear_fc1", down="linear_fc2", act="act_fn"),),
        rope=RopeSpec(attention_classes=(f"{prefix}Attention",), partial_rotary=True),
        causal_lm=CausalLMSpec(f"{prefix}ForCausalLM", **(moe_head if moe else {})),
        extra_heads=(CausalLMSpec(f"{prefix}ForConditionalGeneration", **{**(moe_head if moe else {}),
                                                                          "output_class": vlm_output},
                                  text_config_attrs=True),),
        unsupported=(Unsupported("rope", f"{prefix}VisionAttention", _VISION_ROPE),),
        varlen_attention=(f"{prefix}VisionAttention",), image_layout="grid")


QWEN3_5 = _qwen3_5("qwen3_5", "Qwen3_5", moe=False)
QWEN3_5_MOE = _qwen3_5("qwen3_5_moe", "Qwen3_5Moe", moe=True)

FAMILIES: dict[str, FamilySpec] = {s.name: s for s in (
    LLAMA, MISTRAL, MIXTRAL, QWEN2, QWEN3, QWEN3_MOE, GEMMA, GEMMA2, GEMMA3, PHI3, GRANITE, OLMO2, GLM4, SMOLLM3,
    GPT_NEOX, PHI, STABLELM, FALCON, OLMO3, EXAONE4, HUNYUAN_V1_DENSE, MINISTRAL, NEMOTRON, FALCON_H1, OLMOE,
    HUNYUAN_V1_MOE, DEEPSEEK_V3, GPT_OSS, QWEN3_NEXT, CLIP, SIGLIP, LLAVA, PALIGEMMA, QWEN2_VL, QWEN2_5_VL, QWEN3_VL,
    MLLAMA, QWEN3_5, QWEN3_5_MOE)}

from .families_more import SPECS as _MORE_SPECS  # noqa: E402  (declared there with the helpers above)

FAMILIES.update({s.name: s for s in _MORE_SPECS})

from .families_generic_data import SPECS as _GENERIC_DATA_SPECS  # noqa: E402  (families the generic matcher had)

FAMILIES.update({s.name: s for s in _GENERIC_DATA_SPECS})


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
    spec = family_named(name.lower())
    if spec is not None:
        return spec
    raise ValueError(f"unknown model family {name!r}; supported families: {', '.join(sorted(FAMILIES))}")


def family_named(model_type) -> FamilySpec | None:
    """The spec registered under exactly ``model_type`` (a config's ``model_type``) or one of its aliases, or None (an
    unknown or missing name: no error, unlike :func:`family_by_name`, which also folds the case)."""
    for spec in FAMILIES.values():
        if model_type == spec.name or model_type in spec.aliases:
            return spec
    return None


def family_by_module(module_name: str) -> FamilySpec | None:
    """The spec whose modeling module is ``module_name``, or None."""
    for spec in FAMILIES.values():
        if spec.module == module_name:
            return spec
    return None


def _tower_type(model_type: str) -> str:
    """The family name of a tower's config type (``clip_vision_model`` -> ``clip``)."""
    for suffix in ("_vision_model", "_text_model", "_vision", "_text"):
        if model_type.endswith(suffix) and model_type[: -len(suffix)] in FAMILIES:
            return model_type[: -len(suffix)]
    return model_type


def tower_family(model_type: str | None) -> FamilySpec | None:
    """The registered family of a tower's config type (a vision config's ``clip_vision_model`` -> CLIP, ``pixtral``
    -> Pixtral), or None (no type, or no registered family)."""
    try:
        return family_by_name(_tower_type(model_type)) if model_type else None
    except ValueError:
        return None


def kind_op(kind: str, config) -> str | None:
    """The :mod:`tigon.functional` op a replacement of patch ``kind`` runs for a model of ``config`` (a transformers
    config or its dict), or None for a kind that runs no single op.

    ``mlp`` runs the gated op of the config's activation (``hidden_act`` / ``hidden_activation``; SwiGLU when it names
    none Tigon has), or ``act_linear`` in a family whose MLPs are all non-gated (GPT-NeoX, phi, Falcon, Nemotron),
    ``lm_head_loss`` the fused linear cross-entropy, ``lora`` the LoRA linear; the norm and rotary kinds are their
    ops. A vision-language config's text model decides (its ``text_config``'s family, :func:`tower_family`, and
    activation): LLaVA's MLP op is its Llama's SwiGLU, not the ``act_linear`` of the projector, the only MLP that
    LLaVA's own family declares. (The ops a model runs are the dry run's, :func:`tigon.workflows.dry_run.model_ops`;
    ``tigon profile`` takes this one for a kind whose replacements declare several, or one with matmuls inside.)
    """
    if kind in ("rms_norm", "layer_norm", "rope", "fused_add_rms_norm"):
        return kind
    if kind == "mlp":
        get = _getter(config)
        text_config = get("text_config")
        text = _getter(text_config or {})
        spec = tower_family(text("model_type")) if text_config else family_named(get("model_type"))
        if spec is not None and spec.mlps and all(not m.gated and m.act is not None for m in spec.mlps):
            return "act_linear"
        return ACTIVATIONS.get(_config_activation(config), ("swiglu", None))[0]
    if kind == "lm_head_loss":
        return "fused_linear_cross_entropy"
    if kind == "lora":
        return "lora_linear"
    return None


def _getter(config):
    """``name -> value or None`` of a transformers config or its dict."""
    return config.get if isinstance(config, dict) else lambda name: getattr(config, name, None)


def _config_activation(config) -> str | None:
    """The HF activation name of a config's MLPs (``hidden_act`` / ``hidden_activation``; a vision-language
    config's ``text_config`` first), or None where it names none."""
    get = _getter(config)
    text = _getter(get("text_config") or {})
    return text("hidden_act") or text("hidden_activation") or get("hidden_act") or get("hidden_activation")


def glu_activation(config) -> str:
    """:func:`tigon.functional.glu_linear`'s ``activation`` for the gated MLPs of ``config`` (a transformers config or
    its dict): ``"gelu_tanh"`` for Gemma's ``gelu_pytorch_tanh``, ``"silu"`` where the config names SiLU, none, or
    one Tigon's gated ops lack (the op bench and verify then time / check at the model's shapes)."""
    return GLU_LINEAR_ACTIVATIONS.get(ACTIVATIONS.get(_config_activation(config), ("swiglu", None)), "silu")


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
