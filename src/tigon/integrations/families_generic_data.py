"""Families that reached Tigon only through the generic matcher before, now as data: ERNIE 4.5 (dense and MoE), GLM,
GLM-4-MoE and GLM-4-MoE-Lite, Qwen2-MoE, Cohere / Cohere2 / Cohere2-MoE, EXAONE-MoE, dots1, Helium and Youtu.

The generic matcher probes each module against rotate-half rotary over the full head, RMSNorm and a head whose logits
are the projection's output, so it left these families' interleaved rotary (ERNIE, GLM, Cohere), partial rotary
(GLM-4-MoE), LayerNorms (Cohere) and logit-scaled heads (Cohere) alone, and their residual adds unfused (no layer
spec). Each spec below was written from the family's modeling code in transformers 5.25 (checked in 5.17) and a tiny
config through ``tigon inspect`` / ``tigon.patch`` (``tests/model_matrix.py``, ``GENERIC_DATA``). Same vocabulary and
helpers as :mod:`tigon.integrations.families`, which registers :data:`SPECS`; nothing here imports transformers.
"""

from __future__ import annotations

from .families import _dense, _moe
from .family_spec import CausalLMSpec, FamilySpec, MLPSpec, NormSpec, RopeSpec


def _pairs(prefix: str, *, partial: bool = False, expanded: bool = False) -> RopeSpec:
    """Rotary on interleaved pairs ``(x[2i], x[2i+1])`` (``rope_interleaved``), called by ``<Prefix>Attention``:
    GLM's ``cos[..., :half].repeat_interleave(2)`` in the function, or (``expanded``) Cohere's tables already
    repeat-interleaved by its rotary embedding (one column per rotated dim)."""
    return RopeSpec(layout="interleaved_expanded" if expanded else "interleaved",
                    attention_classes=(f"{prefix}Attention",), partial_rotary=partial)


# ---- ERNIE 4.5: Llama's layer form; apply_rotary_pos_emb on GLM's pairs over the full head, computed in fp32 and
# rounded once (what rope_interleaved does); MLPs with config.use_bias biases; the MoE head adds the router loss
ERNIE4_5 = _dense("ernie4_5", "Ernie4_5", rope=_pairs("Ernie4_5"))
ERNIE4_5_MOE = _moe(  # dense layers (moe_layer_start_index / interval) and shared experts: Ernie4_5_MoeMLP
    "ernie4_5_moe", "Ernie4_5_Moe", dense_mlp=True, rope=_pairs("Ernie4_5_Moe"))

# ---- GLM: Llama's layer form with GLM-4's fused gate_up_proj MLP and interleaved partial rotary; GLM-4-MoE: partial
# rotate-half rotary (the first cos.shape[-1] dims), q / k norms (use_qk_norm), shared experts, no router loss in HF
GLM = _dense("glm", "Glm", mlp=MLPSpec("GlmMLP", gate_up="gate_up_proj"), rope=_pairs("Glm", partial=True))
GLM4_MOE = _moe("glm4_moe", "Glm4Moe", dense_mlp=True, aux_loss=False,
                rope=RopeSpec(attention_classes=("Glm4MoeAttention",), partial_rotary=True))
GLM4_MOE_LITE = _moe(  # DeepSeek-V3's MLA layout and rotary functions (rope_interleave, the default, calls
    "glm4_moe_lite", "Glm4MoeLite", dense_mlp=True, aux_loss=False,  # apply_rotary_pos_emb_interleave: pairs in,
    rope=RopeSpec(attention_classes=("Glm4MoeLiteAttention",),  # halves out)
                  alternatives=(("apply_rotary_pos_emb_interleave", "deinterleave"),)))

# ---- Qwen2-MoE: everything the generic matcher took, plus the fused residual add (Llama's layer form); the shared
# expert is a Qwen2MoeMLP (its sigmoid gate stays in the block's forward); mlp_only_layers are dense
QWEN2_MOE = _moe("qwen2_moe", "Qwen2Moe", dense_mlp=True)

# ---- Cohere: a LayerNorm without bias (mean-centred, fp32, weight in fp32, cast at the end: layer_norm's one
# rounding) before attention and MLP in parallel (no fused add); rotary on pairs with repeat-interleaved tables, in
# fp32; logits * config.logit_scale. The q / k norms (use_qk_norm) have a weight per head, (heads, head_dim): not
# layer_norm's 1-D weight, so they are reported and left alone (the engine's norm check says so)
_COHERE_NORM = dict(kind="layer_norm", eps_attr="variance_epsilon")


def _cohere(name: str, prefix: str, *, moe: bool = False) -> FamilySpec:
    """Cohere (Command-R), Cohere2 (Command-R7B: rotary on the sliding-window layers only) and Cohere2-MoE (an
    RMSNorm instead of the LayerNorm when ``rms_norm_eps`` is set; every layer dense or MoE with shared experts, no
    router loss in HF's head)."""
    norms = (NormSpec(f"{prefix}LayerNorm", **_COHERE_NORM),) + ((NormSpec(f"{prefix}RMSNorm"),) if moe else ())
    head = CausalLMSpec(f"{prefix}ForCausalLM", logit_scale_attr="logit_scale",
                        **(dict(output_class="MoeCausalLMOutputWithPast") if moe else {}))
    mlps = (MLPSpec(f"{prefix}MLP"),) + ((MLPSpec(f"{prefix}Experts", experts=True),) if moe else ())
    return FamilySpec(name=name, module=f"transformers.models.{name}.modeling_{name}", norms=norms, mlps=mlps,
                      rope=_pairs(prefix, expanded=True), causal_lm=head)


COHERE = _cohere("cohere", "Cohere")
COHERE2 = _cohere("cohere2", "Cohere2")
COHERE2_MOE = _cohere("cohere2_moe", "Cohere2Moe", moe=True)

# ---- EXAONE-MoE: EXAONE 4's q / k norms with Llama's pre-norm layer form (NoPE full-attention layers under a
# sliding window: their forward does not reach the rotary call), shared experts, no router loss in HF's head
EXAONE_MOE = _moe("exaone_moe", "ExaoneMoe", dense_mlp=True, aux_loss=False)

# ---- dots1: DeepSeek-V3's MoE layout (first_k_dense_replace dense layers, shared experts) with Qwen3's attention
# (q / k norms over the head dim), rotate-half rotary, Llama's layer form; no router loss in HF's head
DOTS1 = _moe("dots1", "Dots1", dense_mlp=True, aux_loss=False)

# ---- Helium: Llama's layout with (w * x).to(dtype) RMSNorms (weight times the fp32 value, one rounding) and GLM's
# interleaved rotary over the full head; Youtu: a dense DeepSeek-V3 (MLA, rope_interleave's pairs-in / halves-out
# rotary, its kv_a / q_a norms)
HELIUM = _dense("helium", "Helium", norm=NormSpec("HeliumRMSNorm", casting_mode="gemma"), rope=_pairs("Helium"))
YOUTU = _dense("youtu", "Youtu", rope=RopeSpec(attention_classes=("YoutuAttention",),
                                               alternatives=(("apply_rotary_pos_emb_interleave", "deinterleave"),)))

SPECS: tuple[FamilySpec, ...] = (ERNIE4_5, ERNIE4_5_MOE, GLM, GLM4_MOE, GLM4_MOE_LITE, QWEN2_MOE, COHERE, COHERE2,
                                 COHERE2_MOE, EXAONE_MOE, DOTS1, HELIUM, YOUTU)
"""The families of this module, registered in :data:`tigon.integrations.families.FAMILIES`."""
