"""More model families as data (issue 20, the rest of Liger-Kernel 0.8.5's list that transformers 5.2x has): Gemma 4,
Pixtral, SmolVLM, InternVL, GLM-4V / GLM-4V-MoE, Qwen3-VL-MoE, DeepSeek-V2, DeepSeek-V4, Llama 4 and Granite-MoE; and
Bamba (a Mamba-2 hybrid: its grouped, gate-first Mamba norm); the other vision-language containers of transformers 5.2x
(LLaVA-NeXT, LLaVA-OneVision, Mistral 3, Aya Vision, Idefics3); PhiMoE, FlexOlmo and MiniMax-M2 (MoE with standard
blocks; MiniMax itself, hybrid lightning attention, has no spec: the generic matcher takes its norms, experts, rotary
and head).

The same vocabulary and helpers as :mod:`tigon.integrations.families` (which registers :data:`SPECS` in ``FAMILIES``);
each spec was written after running ``tigon inspect`` / ``tigon.patch`` on a tiny config of the family (see
``tests/model_matrix.py``). Parts left alone are declared :class:`Unsupported` with the reason, so the report lists
them. Nothing here imports transformers.
"""

from __future__ import annotations

from dataclasses import replace

from .families import (
    _LLAVA_SELECT,
    _MULTIMODAL_OUTPUT,
    _VISION_ROPE,
    TORCH_LAYER_NORM,
    _dense,
    _gated_norm,
    _moe,
)
from .family_spec import CausalLMSpec, DecoderLayerSpec, FamilySpec, MLPSpec, NormSpec, RopeSpec, Unsupported

# Llama 4 / DeepSeek-V2: apply_rotary_emb(xq, xk, freqs_cis), interleaved pairs times complex freqs_cis
_COMPLEX = dict(function="apply_rotary_emb", layout="complex")

_EPS = ("variance_epsilon", "eps")  # the epsilon's name in transformers 5.2x, in 5.17 (Gemma 4, Llama 4)

# ---- text families -------------------------------------------------------------------------------------------------
DEEPSEEK_V2 = replace(  # DeepSeek-V3's layout (MLA, kv_a_layernorm, dense layers then MoE with shared experts; HF's
    _moe("deepseek_v2", "DeepseekV2", dense_mlp=True, aux_loss=False),  # head adds no router loss), complex rotary
    rope=RopeSpec(attention_classes=("DeepseekV2Attention",), **_COMPLEX))  # on (B, H, T, D)

LLAMA4 = FamilySpec(  # Llama 4 text model: MoE layers (routed experts + shared expert) or dense MLPs, NoPE layers
    name="llama4", module="transformers.models.llama4.modeling_llama4", aliases=("llama4_text",),
    norms=(NormSpec("Llama4TextRMSNorm", eps_attr=_EPS),  # the weightless q / k norm: Llama4TextL2Norm (in 5.2x an
           NormSpec("Llama4TextL2Norm", eps_attr=_EPS, optional_weight=True),  # alias of Llama4TextWeightlessRMSNorm)
           TORCH_LAYER_NORM),  # the vision tower's: pre / post and two per encoder layer
    mlps=(MLPSpec("Llama4TextMLP"),  # the vision encoder layers' fc2(GELU(fc1(x))) (exact nn.GELU): act_linear
          MLPSpec("Llama4VisionMLP", gate=None, up="fc1", down="fc2", act="activation_fn")),
    causal_lm=CausalLMSpec("Llama4ForCausalLM", output_class="MoeCausalLMOutputWithPast"),  # no router loss in HF
    # the vision-language class merges the image features, then calls its Llama4ForCausalLM without labels and
    # applies its loss_function to the logits: the fused loss through that LM (CausalLMSpec.inner)
    extra_heads=(CausalLMSpec("Llama4ForConditionalGeneration", inner="language_model",
                              output_class="Llama4CausalLMOutputWithPast"),),
    # text attention on (B, T, H, D); the vision attention calls vision_apply_rotary_emb (one table for every image)
    rope=RopeSpec(attention_classes=("Llama4TextAttention", "Llama4VisionAttention"), head_axis=2, **_COMPLEX,
                  alternatives=(("vision_apply_rotary_emb", "complex_vision"),)),
    unsupported=(
        Unsupported("mlp", "Llama4TextExperts", "experts as one bmm over (experts, tokens, hidden) with "
                    "up * act(gate) inline in their forward (no _apply_gate hook, not transformers' MoE experts "
                    "interface): an experts forward of this layout is needed"),
        Unsupported("mlp", "Llama4VisionMLP2", "the pixel-shuffle adapter's MLP, act(fc2(dropout(act(fc1(x))))): "
                    "dropout between the GELU and fc2, and a second GELU after fc2; not the down(act(up(x))) form "
                    "act_linear computes"),
    ),
    image_layout="square", image_tokens=("ratio", "vision_config.pixel_shuffle_ratio"))  # one tile per image

DEEPSEEK_V4 = FamilySpec(  # transformers >= 5.2x: hyper-connection streams (mHC) around attention and MoE blocks,
    name="deepseek_v4", module="transformers.models.deepseek_v4.modeling_deepseek_v4",  # compressed sparse attention;
    norms=(NormSpec("DeepseekV4RMSNorm", casting_mode="gemma"),),  # (w * x).to(dtype), fp32 weights (kept in fp32)
    # the shared expert and the routed experts' _apply_gate: SwiGLU with gate clamped above and up both ways at
    # self.limit (config.swiglu_limit): tigon.functional.swiglu(limit=...) / glu_linear(limit=...)
    mlps=(MLPSpec("DeepseekV4MLP", limit="limit"), MLPSpec("DeepseekV4Experts", experts=True, limit="limit")),
    causal_lm=CausalLMSpec("DeepseekV4ForCausalLM", output_class="MoeCausalLMOutputWithPast",
                           router_aux_loss="load_balancing_loss_func"),
    unsupported=(
        Unsupported("rms_norm", "DeepseekV4UnweightedRMSNorm", "x * rsqrt(mean(x.float()^2) + eps).to(x.dtype): the "
                    "factor is rounded to x's dtype before the product, a casting none of rms_norm's modes has"),
        Unsupported("rope", "DeepseekV4Attention", "apply_rotary_pos_emb(x, cos, sin) rotates one tensor per call "
                    "(queries, the shared key-value, the compressed keys, and the output by -sin): another interface "
                    "than (q, k, cos, sin), left alone"),
    ))

GRANITEMOE = replace(  # Granite's multipliers (residual, embedding, attention, logits / logits_scaling), every layer
    _moe("granitemoe", "GraniteMoe", dense_mlp=False, pre_norm_layer=False),  # MoE; the head keeps the router loss
    causal_lm=CausalLMSpec("GraniteMoeForCausalLM", output_class="MoeCausalLMOutputWithPast",
                           router_aux_loss="load_balancing_loss_func", logit_divisor_attr="logits_scaling"))

# MoE families with a standard decoder block that reached Tigon only through the generic matcher before (each checked
# with tigon inspect on a tiny config); their heads keep the router loss as HF adds it
PHIMOE = FamilySpec(  # torch.nn.LayerNorm norms (per model), every layer MoE (sparsemixer router left alone), rotary
    name="phimoe", module="transformers.models.phimoe.modeling_phimoe", norms=(TORCH_LAYER_NORM,),  # (longrope
    mlps=(MLPSpec("PhimoeExperts", experts=True),), rope=RopeSpec(attention_classes=("PhimoeAttention",)),  # tables)
    causal_lm=CausalLMSpec("PhimoeForCausalLM", output_class="MoeCausalLMOutputWithPast",  # lm_head_bias: a bias
                           router_aux_loss="load_balancing_loss_func"))
FLEX_OLMO = _moe(  # OLMo 2's layout ((w * x).to(dtype) norms after attention / MLP, q / k norms over the projection)
    "flex_olmo", "FlexOlmo", dense_mlp=False, pre_norm_layer=False,  # with every layer MoE
    norm=NormSpec("FlexOlmoRMSNorm", casting_mode="gemma"))
MINIMAX_M2 = _moe(  # Mixtral's layer form, q / k norms over the projection, partial rotary (rotary_dim) in
    "minimax_m2", "MiniMaxM2", dense_mlp=False,  # apply_rotary_pos_emb (the first cos.shape[-1] dims)
    rope=RopeSpec(attention_classes=("MiniMaxM2Attention",), partial_rotary=True))

# Gemma 4's RMSNorm: w (not 1 + w) in fp32, cast at the end; with_scale=False instances have no weight
_GEMMA4_NORM = NormSpec("Gemma4RMSNorm", casting_mode="gemma", eps_attr=_EPS, optional_weight=True)
GEMMA4 = FamilySpec(  # Gemma 4: text decoder (sandwich norms, per-layer inputs, optional MoE block), vision and audio
    name="gemma4", module="transformers.models.gemma4.modeling_gemma4", aliases=("gemma4_text",),  # towers
    norms=(_GEMMA4_NORM,),
    mlps=(MLPSpec("Gemma4TextMLP", act_config_attr="hidden_activation"),
          MLPSpec("Gemma4TextExperts", act_config_attr="hidden_activation", experts=True),
          MLPSpec("Gemma4VisionMLP", act_config_attr="hidden_activation")),
    causal_lm=CausalLMSpec("Gemma4ForCausalLM", output_class="Gemma4CausalLMOutputWithPast",
                           softcap_attr="final_logit_softcapping"),
    extra_heads=(CausalLMSpec("Gemma4ForConditionalGeneration", output_class="Gemma4CausalLMOutputWithPast",
                              softcap_attr="final_logit_softcapping", text_config_attrs=True),),
    unsupported=(
        Unsupported("rope", "Gemma4TextAttention", "apply_rotary_pos_emb(x, cos, sin) rotates one tensor per call (q "
                    "and k separately, after their norms): another interface than (q, k, cos, sin), left alone"),
        Unsupported("rope", "Gemma4VisionAttention", "the vision tower's multidimensional rotary "
                    "(apply_multidimensional_rope: one rotation per spatial axis on slices of the head): another "
                    "interface, left alone"),
    ),
    image_layout="patches")

# ---- vision-language families ------------------------------------------------------------------------------------
PIXTRAL = FamilySpec(  # Pixtral's vision encoder (Llava / Mistral 3 containers): RMSNorms, gated MLPs, 2-D rotary
    name="pixtral", module="transformers.models.pixtral.modeling_pixtral",
    norms=(NormSpec("PixtralRMSNorm"),), mlps=(MLPSpec("PixtralMLP"),), image_sizes=True,  # patches of any size
    unsupported=(Unsupported("rope", "PixtralAttention", "2-D rotary over patches: cos / sin of (patches, head_dim) "
                             "broadcast with unsqueeze_dim=0; tigon.functional.rope takes the head axis at 1 or 2"),))

SMOLVLM = FamilySpec(  # SigLIP-like vision tower of its own module, Llama text tower (its own family), linear connector
    name="smolvlm", module="transformers.models.smolvlm.modeling_smolvlm", container=True,
    norms=(TORCH_LAYER_NORM,),
    mlps=(MLPSpec("SmolVLMVisionMLP", gate=None, up="fc1", down="fc2", act="activation_fn"),),
    causal_lm=CausalLMSpec("SmolVLMForConditionalGeneration", output_class="SmolVLMCausalLMOutputWithPast"),
    image_layout="square", image_tokens=("merge", "scale_factor"), images_axis=True)

INTERNVL = FamilySpec(  # InternViT (LayerNorm or RMSNorm by config.norm_type) + a LayerNorm projector, Qwen2 text tower
    name="internvl", module="transformers.models.internvl.modeling_internvl", container=True,
    norms=(NormSpec("InternVLVisionRMSNorm"), TORCH_LAYER_NORM),
    mlps=(MLPSpec("InternVLVisionMLP", gate=None, up="fc1", down="fc2", act="activation_fn"),),
    causal_lm=CausalLMSpec("InternVLForConditionalGeneration", output_class="InternVLCausalLMOutputWithPast"),
    unsupported=(Unsupported("mlp", "InternVLMultiModalProjector", "layer_norm, then linear_2(act(linear_1(x))) in "
                             "one forward: not a plain non-gated MLP (its LayerNorm is replaced)"),),
    image_layout="square", image_tokens=("ratio", "downsample_ratio"))


def _llava_like(name: str, prefix: str, *, image_layout: str, head: dict | None = None, **parts) -> FamilySpec:
    """A container of the LLaVA line (text and vision towers of other families): its conditional-generation head
    (own output class, or transformers 5.2x's multimodal one), its ``image_layout`` and ``parts`` (norms, mlps,
    unsupported, image_tokens, ...)."""
    return FamilySpec(name=name, module=f"transformers.models.{name}.modeling_{name}", container=True,
                      causal_lm=CausalLMSpec(f"{prefix}ForConditionalGeneration", **{
                          "output_class": (f"{prefix}CausalLMOutputWithPast", _MULTIMODAL_OUTPUT), **(head or {})}),
                      image_layout=image_layout, **parts)


def _projector(prefix: str) -> MLPSpec:
    """LLaVA's projector: ``linear_2(act(linear_1(x)))``, the activation from ``config.projector_hidden_act``."""
    return MLPSpec(f"{prefix}MultiModalProjector", act_config_attr="projector_hidden_act", gate=None, up="linear_1",
                   down="linear_2", act="act")


LLAVA_NEXT = _llava_like(  # anyres tiles, image_newline
    "llava_next", "LlavaNext", image_layout="anyres", image_tokens=_LLAVA_SELECT, mlps=(_projector("LlavaNext"),))
LLAVA_ONEVISION = _llava_like(
    "llava_onevision", "LlavaOnevision", image_layout="anyres", image_tokens=_LLAVA_SELECT,
    mlps=(_projector("LlavaOnevision"),))
MISTRAL3 = _llava_like(  # Pixtral vision tower, Mistral / Ministral text tower; the projector's RMSNorm is replaced
    "mistral3", "Mistral3", image_layout="square", image_tokens=("merge", "spatial_merge_size"),
    norms=(NormSpec("Mistral3RMSNorm"),),
    unsupported=(Unsupported("mlp", "Mistral3MultiModalProjector", "RMSNorm and the patch merger (a per-image "
                             "unfold + linear) before linear_2(act(linear_1(x))) in one forward: not a plain "
                             "non-gated MLP"),))
AYA_VISION = _llava_like(  # SigLIP vision tower, Cohere 2 text tower; logits times the text config's logit_scale
    "aya_vision", "AyaVision", image_layout="square", image_tokens=("merge", "downsample_factor"),
    norms=(TORCH_LAYER_NORM,),
    head=dict(logit_scale_attr="logit_scale", text_config_attrs=True),
    unsupported=(Unsupported("mlp", "AyaVisionMultiModalProjector", "pixel shuffle and LayerNorm before a SwiGLU "
                             "of linear_1's two halves (act(second) * first) in one forward: not a plain gated MLP "
                             "(its LayerNorm is replaced)"),))
IDEFICS3 = _llava_like(  # SmolVLM's base: its own SigLIP-like vision tower, Llama text tower, linear connector
    "idefics3", "Idefics3", image_layout="square", image_tokens=("merge", "scale_factor"), images_axis=True,
    norms=(TORCH_LAYER_NORM,),
    mlps=(MLPSpec("Idefics3VisionMLP", gate=None, up="fc1", down="fc2", act="activation_fn"),))


def _glm4v(name: str, prefix: str, *, text_mlp: MLPSpec, vision_mlp: str, rope: RopeSpec,
           head: CausalLMSpec, experts: tuple[MLPSpec, ...] = ()) -> FamilySpec:
    """GLM-4V (dense or MoE): a GLM text decoder and a vision tower of RMSNorms and gated MLPs in one module; the
    vision patch merger (projection, LayerNorm and GELU before a gated MLP in one forward) keeps its forward. The MoE
    form's text layers are Llama's pre-norm form (``experts``: a :class:`DecoderLayerSpec`), the dense form's GLM-4's
    post-norm layers."""
    text_norm = f"{prefix}TextRMSNorm" if experts else f"{prefix}RMSNorm"
    norms = tuple(NormSpec(c) for c in dict.fromkeys((text_norm, f"{prefix}RMSNorm"))) + (TORCH_LAYER_NORM,)
    return FamilySpec(
        name=name, module=f"transformers.models.{name}.modeling_{name}", aliases=(f"{name}_text",), norms=norms,
        mlps=(text_mlp, *experts, MLPSpec(vision_mlp)), rope=rope, causal_lm=head,
        decoder_layers=(DecoderLayerSpec(f"{prefix}TextDecoderLayer", norms[0]),) if experts else (),
        varlen_attention=(f"{prefix}VisionAttention",), image_layout="grid",
        unsupported=(Unsupported("mlp", f"{prefix}VisionPatchMerger", "projection, LayerNorm and GELU before its gated "
                                 "MLP in one forward: not a plain gated MLP (its LayerNorm is replaced)"),
                     Unsupported("rope", f"{prefix}VisionAttention", _VISION_ROPE)))


GLM4V = _glm4v(  # GLM-4 text layers (post-attention / post-MLP norms); text rotary on interleaved pairs of the
    "glm4v", "Glm4v", text_mlp=MLPSpec("Glm4vTextMLP", gate_up="gate_up_proj"), vision_mlp="Glm4VisionMlp",
    rope=RopeSpec(layout="interleaved_expanded", attention_classes=("Glm4vTextAttention",),  # mRoPE tables,
                  partial_rotary=True,  # repeat-interleaved (5.2x); assembled in the rotary function before 5.2x
                  alternatives=(("apply_multimodal_rotary_pos_emb", "mrope_pairs"),)),
    head=CausalLMSpec("Glm4vForConditionalGeneration",
                      output_class=(_MULTIMODAL_OUTPUT, "Glm4vCausalLMOutputWithPast")))
GLM4V_MOE = _glm4v(  # pre-norm MoE text layers; partial rotate-half rotary (the first cos.shape[-1] dims)
    "glm4v_moe", "Glm4vMoe", text_mlp=MLPSpec("Glm4vMoeTextMLP"), vision_mlp="Glm4vMoeisionMlp",
    experts=(MLPSpec("Glm4vMoeTextExperts", experts=True),),
    rope=RopeSpec(attention_classes=("Glm4vMoeTextAttention",), partial_rotary=True),
    head=CausalLMSpec("Glm4vMoeForConditionalGeneration", router_aux_loss="load_balancing_loss_func",
                      output_class=("MultimodalMoeCausalLMOutputWithPast", "Glm4vMoeCausalLMOutputWithPast"),
                      text_config_attrs=True))

QWEN3_VL_MOE = FamilySpec(  # Qwen3-VL with MoE text layers (mlp_only_layers dense), router loss from the text config
    name="qwen3_vl_moe", module="transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe",
    aliases=("qwen3_vl_moe_text",), norms=(NormSpec("Qwen3VLMoeTextRMSNorm"), TORCH_LAYER_NORM),
    mlps=(MLPSpec("Qwen3VLMoeTextMLP"), MLPSpec("Qwen3VLMoeTextExperts", experts=True),
          MLPSpec("Qwen3VLMoeVisionMLP", gate=None, up="linear_fc1", down="linear_fc2", act="act_fn")),
    rope=RopeSpec(attention_classes=("Qwen3VLMoeTextAttention",)),
    decoder_layers=(DecoderLayerSpec("Qwen3VLMoeTextDecoderLayer", NormSpec("Qwen3VLMoeTextRMSNorm")),),
    causal_lm=CausalLMSpec("Qwen3VLMoeForConditionalGeneration", router_aux_loss="load_balancing_loss_func",
                           output_class="Qwen3VLMoeCausalLMOutputWithPast", text_config_attrs=True),
    unsupported=(Unsupported("rope", "Qwen3VLMoeVisionAttention", _VISION_ROPE),),
    varlen_attention=("Qwen3VLMoeVisionAttention",), image_layout="grid")

BAMBA = replace(  # hybrid Mamba-2 + attention layers (input_layernorm / pre_ff_layernorm: not Llama's layer form);
    _dense("bamba", "Bamba", pre_norm_layer=False,  # partial rotary (0.5) in apply_rotary_pos_emb; the mixer's norm
           rope=RopeSpec(attention_classes=("BambaAttention",), partial_rotary=True)),  # gates first, per group of
    norms=(NormSpec("BambaRMSNorm"), _gated_norm("BambaRMSNormGated", "llama", norm_before_gate=False)))  # group_size

SPECS: tuple[FamilySpec, ...] = (GEMMA4, PIXTRAL, SMOLVLM, INTERNVL, LLAVA_NEXT, LLAVA_ONEVISION, MISTRAL3,
                                 AYA_VISION, IDEFICS3, GLM4V, GLM4V_MOE, QWEN3_VL_MOE, DEEPSEEK_V2,
                                 DEEPSEEK_V4, LLAMA4, GRANITEMOE, BAMBA, PHIMOE, FLEX_OLMO, MINIMAX_M2)
"""The families of this module, registered in :data:`tigon.integrations.families.FAMILIES`."""
