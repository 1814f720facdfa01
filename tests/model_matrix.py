"""The test matrix of Hugging Face models: every registered family and the generic models, as tiny configs.

``CASES`` (tests/test_families.py trains each patched vs original) holds one mini model per family registered before
issue 20 plus an architecture the generic matcher handles; ``MORE_FAMILIES`` the families added for Liger-Kernel
0.8.5's list (dense, MoE, hybrid) and those the generic matcher had before (``GENERIC_DATA``: ERNIE 4.5, GLM,
Cohere, ...), ``VISION_LANGUAGE`` the vision-language models (built from their class, with an
image from :func:`image_inputs`), all checked for one exact step (:data:`CPU_STEP` says which on CPU); ``GENERIC``
holds more architectures of no registered family, each with something the engine must leave alone and say so
(a rotary function the probe rejects, a softcapped head; tests/test_report_truth.py runs Llama 4 under
``family="generic"`` for a rotary function of another interface and an LM head without a usable backbone attribute).
``TABLE_ONLY`` holds the families that have a test file of their own instead of a matrix case (a model too unlike
the others for every matrix test to take: DeepSeek-V4's hyper-connection streams): only the README's support table
(tests/support_table.py) builds them, so that every family spec has a row there (:data:`IN_VISION_LANGUAGE` names the
vision towers that have theirs inside a vision-language row).

Each entry: ``(model_type, config overrides, expected family, expected replaced counts, expected skipped counts)``;
GENERIC adds a sixth field: the transformers class to build when ``AutoModelForCausalLM`` does not map the config,
else None; VISION_LANGUAGE has the class third. Mini models: 2 layers, hidden 64, vocab 300 (byte tokens of real
text), fp32, eager attention; MoE models route 4 experts, top 2, with the router loss on.
"""

from __future__ import annotations

import os

import torch
import transformers

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
V, L = 300, 2
DTYPE = getattr(torch, os.environ.get("TIGON_FAMILY_DTYPE", "float32"))
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=V, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)

DROP = object()
"""An override value that removes the key from TINY (Falcon derives head_dim and has no setter for it)."""

FULL = {"rms_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}
QK_NORMS = {**FULL, "rms_norm": 4 * L + 1}  # + q_norm / k_norm per layer (Qwen3, OLMo 2) or pre/post FF (Gemma 2)
ADD = {"fused_add_rms_norm": L}  # decoder layers of Llama's pre-norm form: residual add fused into the next norm

CASES = {
    "llama": ("llama", {}, "llama", {**FULL, **ADD}, {}),
    "mistral": ("mistral", {}, "mistral", {**FULL, **ADD}, {}),
    # batched_mm experts (any dtype and device; grouped_mm is bf16-only on CUDA) call the _apply_gate hook
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm"),
                "mixtral", {**FULL, **ADD}, {}),
    "qwen2": ("qwen2", {}, "qwen2", {**FULL, **ADD}, {}),
    "qwen3": ("qwen3", {}, "qwen3", {**QK_NORMS, **ADD}, {}),
    # layer 0 dense (Qwen3MoeMLP), layer 1 MoE (experts' _apply_gate): both count as mlp
    "qwen3_moe": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, mlp_only_layers=[0],
                                    experts_implementation="batched_mm"), "qwen3_moe", {**QK_NORMS, **ADD}, {}),
    "gemma": ("gemma", {}, "gemma", {**FULL, **ADD}, {}),
    "gemma2": ("gemma2", dict(final_logit_softcapping=30.0), "gemma2", QK_NORMS, {}),
    # pre/post attention + pre/post feed-forward + q_norm / k_norm per layer
    "gemma3": ("gemma3_text", dict(final_logit_softcapping=30.0), "gemma3", {**FULL, "rms_norm": 6 * L + 1}, {}),
    "phi3": ("phi3", {}, "phi3", FULL, {}),
    "granite": ("granite", dict(logits_scaling=4.0, embedding_multiplier=2.0, residual_multiplier=0.5),
                "granite", FULL, {}),
    "olmo2": ("olmo2", {}, "olmo2", QK_NORMS, {}),
    # interleaved partial rotary (rope_interleaved); post-attention / post-MLP norms
    "glm4": ("glm4", {}, "glm4", {"rms_norm": 4 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # layer 1 is a NoPE layer: one rotary attention to patch
    "smollm3": ("smollm3", dict(no_rope_layers=[1, 0]), "smollm3", {**FULL, **ADD, "rope": 1}, {}),
    # LayerNorm families: torch.nn.LayerNorm instances (per model), non-gated MLPs as act_linear (GELU, phi's tanh
    # GELU), partial rotary (GPT-NeoX 25%: the rotary function rotates cos.shape[-1] dims; phi 50% and StableLM 25%:
    # the attention passes the rotated slice); phi's LM head has a bias
    "gpt_neox": ("gpt_neox", {}, "gpt_neox", {"layer_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    "phi": ("phi", {}, "phi", {"layer_norm": L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    "stablelm": ("stablelm", {}, "stablelm", {"layer_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # parallel attention + MLP after one norm; full rotary (Falcon derives head_dim from hidden / heads); its MLP's
    # down projection a FalconLinear (folded into act_linear)
    "falcon": ("falcon", dict(head_dim=DROP, num_kv_heads=2), "falcon", {"layer_norm": L + 1, "mlp": L, "rope": L,
                                                                         "lm_head_loss": 1}, {}),
    # not registered: the generic matcher, everything probed (dropout off: the runs must be deterministic)
    "generic-seed_oss": ("seed_oss", dict(attention_dropout=0.0, residual_dropout=0.0), "generic", FULL, {}),
}

_MLA = dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16,
            v_head_dim=16, n_group=1, topk_group=1, experts_implementation="batched_mm")
_MOE = dict(num_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm", output_router_logits=True)
_LINEAR_ATTENTION = dict(layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
                         linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16)  # Gated DeltaNet

GENERIC = {
    # layer 0 has activation sparsity (its MLP is not a plain gated MLP), layer 1 not; softcapped head
    "gemma3n": ("gemma3n_text", dict(num_kv_shared_layers=0, layer_types=["sliding_attention", "full_attention"],
                                     activation_sparsity_pattern=[0.95, 0.0], vocab_size_per_layer_input=V,
                                     hidden_size_per_layer_input=16, laurel_rank=8),
                "generic", {"rms_norm": 20, "mlp": 1}, {"rope": 1, "mlp": 1, "lm_head_loss": 1}, None),
}


_GEMMA4 = dict(_MOE, hidden_size_per_layer_input=16, vocab_size_per_layer_input=V, num_kv_shared_layers=0,
               layer_types=["sliding_attention", "full_attention"], enable_moe_block=True, top_k_experts=2,
               moe_intermediate_size=32, final_logit_softcapping=30.0, initializer_range=0.01, rms_norm_eps=1e-5)


_GROUPED = dict(num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                output_router_logits=True, experts_implementation="grouped_mm")
GENERIC_DATA = {
    # families the generic matcher had (with parts skipped), now data (families_generic_data.py); their MoE forms with
    # grouped_mm experts (Tigon's glue forward). Entry: MORE_FAMILIES' five fields, then the generic matcher's
    # (replaced, skipped) counts on the same model (tigon.patch(model, family="generic"): tests/test_generic_data.py)
    # ERNIE 4.5: interleaved rotary (rope_interleaved), MLP biases (use_bias)
    "ernie4_5": ("ernie4_5", dict(use_bias=True), "ernie4_5", {**FULL, **ADD}, {},
                 ({"rms_norm": 5, "mlp": L, "lm_head_loss": 1}, {"rope": 1})),
    # ERNIE-4.5-MoE: layer 0 dense (moe_layer_start_index=1), layer 1 experts + shared experts; router loss
    "ernie4_5_moe": ("ernie4_5_moe", dict(_GROUPED, moe_layer_start_index=1, moe_num_shared_experts=1), "ernie4_5_moe",
                     {**FULL, **ADD, "mlp": 3}, {}, ({"rms_norm": 5, "mlp": 3, "lm_head_loss": 1}, {"rope": 1})),
    # GLM: fused gate_up_proj, interleaved partial rotary (0.5)
    "glm": ("glm", {}, "glm", {**FULL, **ADD}, {}, ({"rms_norm": 5, "mlp": L, "lm_head_loss": 1}, {"rope": 1})),
    # GLM-4-MoE: q / k norms, partial rotate-half rotary (0.5), layer 0 dense, layer 1 experts + shared experts
    "glm4_moe": ("glm4_moe", dict(_GROUPED, use_qk_norm=True, first_k_dense_replace=1), "glm4_moe",
                 {**QK_NORMS, **ADD, "mlp": 3}, {}, ({"rms_norm": 9, "mlp": 3, "lm_head_loss": 1}, {"rope": L})),
    # GLM-4-MoE-Lite: MLA (kv_a / q_a norms), rope_interleave -> apply_rotary_pos_emb_interleave (deinterleave)
    "glm4_moe_lite": ("glm4_moe_lite", dict(_GROUPED, num_key_value_heads=4, first_k_dense_replace=1, q_lora_rank=16,
                                            kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                            n_group=1, topk_group=1), "glm4_moe_lite",
                      {**FULL, **ADD, "rms_norm": 9, "mlp": 3}, {},
                      ({"rms_norm": 9, "mlp": 3, "lm_head_loss": 1}, {"rope": L})),
    # Qwen2-MoE: experts + shared expert per layer, router loss; the fused residual add is new
    "qwen2_moe": ("qwen2_moe", _GROUPED, "qwen2_moe", {**FULL, **ADD, "mlp": 2 * L}, {},
                  ({"rms_norm": 5, "mlp": 2 * L, "rope": L, "lm_head_loss": 1}, {})),
    # Cohere: bias-free LayerNorms (one per layer, attention and MLP in parallel), pair rotary on repeat-interleaved
    # tables, logits * logit_scale
    "cohere": ("cohere", dict(logit_scale=0.5), "cohere", {"layer_norm": L + 1, "mlp": L, "rope": L, "lm_head_loss": 1},
               {}, ({"mlp": L}, {"rope": 1, "rms_norm": L + 1, "lm_head_loss": 1})),
    # Cohere with q / k norms: a weight per head (heads, head_dim), left alone with the reason
    "cohere-qk_norm": ("cohere", dict(logit_scale=0.5, use_qk_norm=True), "cohere",
                       {"layer_norm": L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {"layer_norm": 2 * L}, None),
    # Cohere2: sliding layer 0 (rotary), full layer 1 (NoPE: no rotary call)
    "cohere2": ("cohere2", dict(logit_scale=0.5, sliding_window=8, layer_types=["sliding_attention", "full_attention"]),
                "cohere2", {"layer_norm": L + 1, "mlp": L, "rope": 1, "lm_head_loss": 1}, {},
                ({"mlp": L}, {"rope": 1, "rms_norm": L + 1, "lm_head_loss": 1})),
    # Cohere2-MoE: LayerNorms (rms_norm_eps unset), layer 0 dense (with rotary), layer 1 experts + shared experts
    "cohere2_moe": ("cohere2_moe", dict(_GROUPED, logit_scale=0.5, num_shared_experts=1, sliding_window=8,
                                        layer_types=["sliding_attention", "full_attention"],
                                        mlp_layer_types=["dense", "sparse"]), "cohere2_moe",
                    {"layer_norm": L + 1, "mlp": 3, "rope": 1, "lm_head_loss": 1}, {}, None),
    # Cohere2-MoE with RMSNorms (rms_norm_eps set)
    "cohere2_moe-rms_norm": ("cohere2_moe", dict(_GROUPED, logit_scale=0.5, rms_norm_eps=1e-6), "cohere2_moe",
                             {"rms_norm": L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}, None),
    # EXAONE-MoE: q / k norms, layer 0 dense, layer 1 experts + shared experts
    "exaone_moe": ("exaone_moe", dict(_GROUPED, first_k_dense_replace=1), "exaone_moe", {**QK_NORMS, **ADD, "mlp": 3},
                   {}, ({"rms_norm": 9, "mlp": 3, "rope": L, "lm_head_loss": 1}, {})),
    # dots1: q / k norms over the head dim, layer 0 dense, layer 1 experts + shared expert (n_shared_experts is
    # needed: its config's default None fails to build)
    "dots1": ("dots1", dict(_GROUPED, n_shared_experts=1, first_k_dense_replace=1), "dots1",
              {**QK_NORMS, **ADD, "mlp": 3}, {}, ({"rms_norm": 9, "mlp": 3, "rope": L, "lm_head_loss": 1}, {})),
    # Helium: (w * x).to(dtype) RMSNorms, interleaved rotary; Youtu: dense MLA with rope_interleave (deinterleave)
    "helium": ("helium", {}, "helium", {**FULL, **ADD}, {},
               ({"rms_norm": 5, "mlp": L, "lm_head_loss": 1}, {"rope": 1})),
    "youtu": ("youtu", dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=16,
                            qk_nope_head_dim=16, v_head_dim=16), "youtu",  # (5.17's rotary tables: head_dim wide)
              {**FULL, **ADD, "rms_norm": 9}, {},
              ({"rms_norm": 9, "mlp": L, "lm_head_loss": 1}, {"rope": L})),
}


MORE_FAMILIES = {
    # families declared for Liger-Kernel 0.8.5's list (issue 20); tests/test_families.py checks loss and every gradient
    # of one step against the original (fp32, 1e-5), that the ops the report declares ran, and the dry run
    "olmo3": ("olmo3", {}, "olmo3", QK_NORMS, {}),
    # under a sliding window only the sliding layers apply rotary: the full-attention layer is NoPE (a note)
    "exaone4": ("exaone4", dict(sliding_window=8, layer_types=["sliding_attention", "full_attention"]), "exaone4",
                {**QK_NORMS, "rope": 1}, {}),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", {}, "hunyuan_v1_dense", {**QK_NORMS, **ADD}, {}),
    "ministral": ("ministral", {}, "ministral", {**FULL, **ADD}, {}),
    # LayerNorm1P (1 + w), partial rotary 0.5; the non-gated relu2 MLP: act_linear(activation="relu2")
    "nemotron": ("nemotron", {}, "nemotron", {"layer_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # logits * lm_head_multiplier; the MLP's multipliers as the GLU kernel's scalars; small Mamba-2 mixers
    "falcon_h1": ("falcon_h1", dict(lm_head_multiplier=0.5, mlp_multipliers=[1.5, 0.5], mamba_d_ssm=32,
                                    mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=16),
                  "falcon_h1", {"rms_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # the Mamba mixers' gated output norm (mamba_rms_norm) with 2 groups of statistics: rms_norm_gated's group_size
    "falcon_h1-groups": ("falcon_h1", dict(mamba_rms_norm=True, mamba_n_groups=2, mamba_d_ssm=32, mamba_n_heads=4,
                                           mamba_d_head=8, mamba_d_state=8, mamba_chunk_size=16),
                         "falcon_h1", {"rms_norm": 3 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # the gate before the norm (mamba_norm_before_gate=False), 4 groups: rms_norm_gated(norm_before_gate=False)
    "falcon_h1-gate_first": ("falcon_h1", dict(mamba_rms_norm=True, mamba_norm_before_gate=False, mamba_n_groups=4,
                                               mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
                                               mamba_chunk_size=16),
                             "falcon_h1", {"rms_norm": 3 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # Mamba-2 hybrid: layer 0 a Mamba mixer (its norm gates first, 2 groups of statistics), layer 1 attention with
    # partial rotary (0.5)
    "bamba": ("bamba", dict(attn_layer_indices=[1], mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8,
                            mamba_chunk_size=16), "bamba", {"rms_norm": 2 * L + 2, "mlp": L, "rope": 1,
                                                            "lm_head_loss": 1}, {}),
    # MoE: the router load-balancing loss (output_router_logits) stays in the fused loss
    "olmoe": ("olmoe", _MOE, "olmoe", QK_NORMS, {}),
    "hunyuan_v1_moe": ("hunyuan_v1_moe", dict(_MOE, moe_intermediate_size=32), "hunyuan_v1_moe",
                       {**QK_NORMS, **ADD, "mlp": 2 * L}, {}),  # shared MLP + experts per layer
    # half-width rotary (rope on cat(cos, cos)); the experts' clamped SwiGLU hook (clamped_swiglu); the eager
    # attention with sinks on torch SDPA (sinks)
    "gpt_oss": ("gpt_oss", dict(_MOE, num_local_experts=4), "gpt_oss",
                {"rms_norm": 2 * L + 1, "mlp": L, "rope": L, "sinks": L, "lm_head_loss": 1}, {}),
    # layer 0 dense, layer 1 MoE (experts + shared expert); MLA: rotary on the rope slice
    "deepseek_v3": ("deepseek_v3", dict(_MLA, rope_interleave=False), "deepseek_v3",
                    {"rms_norm": 7, "mlp": 3, "rope": L, "lm_head_loss": 1, **ADD}, {}),
    # rope_interleave (the default): the attention calls apply_rotary_pos_emb_interleave (rope_interleaved,
    # deinterleave=True) instead of apply_rotary_pos_emb
    "deepseek_v3-interleave": ("deepseek_v3", dict(_MLA, rope_interleave=True), "deepseek_v3",
                               {"rms_norm": 7, "mlp": 3, "rope": L, "lm_head_loss": 1, **ADD}, {}),
    # layer 0 Gated DeltaNet (its gated RMSNorm: rms_norm_gated) with a dense MLP, layer 1 attention (partial rotary)
    # + MoE
    "qwen3_next": ("qwen3_next", dict(_MOE, **_LINEAR_ATTENTION, mlp_only_layers=[0], moe_intermediate_size=32,
                                      shared_expert_intermediate_size=32), "qwen3_next",
                   {"rms_norm": 8, "mlp": 3, "rope": 1, "lm_head_loss": 1}, {}),
    # Qwen3.5 (dense, MoE): Qwen3-Next's hybrid text decoder (see there); their vision-language form below
    "qwen3_5": ("qwen3_5_text", _LINEAR_ATTENTION, "qwen3_5", {"rms_norm": 8, "mlp": L, "rope": 1, "lm_head_loss": 1},
                {}),
    "qwen3_5_moe": ("qwen3_5_moe_text", dict(_MOE, **_LINEAR_ATTENTION, moe_intermediate_size=32,
                                             shared_expert_intermediate_size=32), "qwen3_5_moe",
                    {"rms_norm": 8, "mlp": 2 * L, "rope": 1, "lm_head_loss": 1}, {}),
    # families_more.py. Gemma 4 text: sandwich norms, v_norm / router norm without weight, per-layer inputs, the MoE
    # block beside the MLP; its one-tensor rotary is another interface (skipped). Smaller initial weights and eps
    # 1e-5: with HF's attention scale 1.0 the defaults make the step so ill-conditioned that HF's own fp32 gradients
    # are 2.8e-5 from float64 (Tigon's 1.5e-5)
    "gemma4": ("gemma4_text", _GEMMA4, "gemma4", {"rms_norm": 12 * L + 2, "mlp": 2 * L, "lm_head_loss": 1},
               {"rope": L}),
    # DeepSeek-V3's layout with complex-form rotary (rope_interleaved on freqs_cis' real / imaginary parts)
    "deepseek_v2": ("deepseek_v2", _MLA, "deepseek_v2", {"rms_norm": 7, "mlp": 3, "rope": L, "lm_head_loss": 1, **ADD},
                    {}),
    # Llama 4 text: MoE layers (shared expert patched, bmm experts skipped), weightless q / k norm; complex rotary
    # (rope_interleaved) on the RoPE layers, NoPE every fourth (none of these two)
    "llama4": ("llama4_text", dict(intermediate_size_mlp=128, num_local_experts=2), "llama4",
               {"rms_norm": 3 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {"mlp": L}),
    # Granite's multipliers (logits / logits_scaling) with MoE layers. The router loss stays off: transformers 5.17's
    # original head fails with output_router_logits (no router logits collected, aux_loss the int 0)
    "granitemoe": ("granitemoe", dict(num_local_experts=4, num_experts_per_tok=2, experts_implementation="batched_mm",
                                      logits_scaling=4.0, residual_multiplier=0.5),
                   "granitemoe", FULL, {}),
    # MoE families with standard blocks added as data: PhiMoE (torch LayerNorms, lm_head with a bias), FlexOlmo
    # (OLMo 2's norms), MiniMax-M2 (Mixtral's layer form, q / k norms over the projection, partial rotary)
    "phimoe": ("phimoe", dict(_MOE, num_local_experts=4, lm_head_bias=True), "phimoe",
               {"layer_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    "flex_olmo": ("flex_olmo", _MOE, "flex_olmo", QK_NORMS, {}),
    "minimax_m2": ("minimax_m2", dict(_MOE, num_local_experts=4, partial_rotary_factor=0.5), "minimax_m2",
                   {**QK_NORMS, **ADD}, {}),
    **{case: entry[:5] for case, entry in GENERIC_DATA.items()},
}


_GMOE = dict(num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             output_router_logits=True, experts_implementation="grouped_mm")
GENERIC_MOE = {
    # MoE families through the generic matcher (tests/test_moe_generic.py patches each with family="generic"; all but
    # MiniMax are data now, GENERIC_DATA): the generic matcher's experts (the probed _apply_gate and transformers'
    # grouped_mm experts with Tigon's glue) and the head with the router loss where HF adds it.
    # Qwen2-MoE: experts + shared expert per layer, router loss
    "generic-qwen2_moe": ("qwen2_moe", _GMOE, "generic", {"rms_norm": 5, "mlp": 2 * L, "rope": L, "lm_head_loss": 1},
                          {}, None),
    # ERNIE-4.5-MoE: interleaved rotary (the probe rejects it), layer 0 dense
    "generic-ernie4_5_moe": ("ernie4_5_moe", _GMOE, "generic", {"rms_norm": 5, "mlp": 3, "lm_head_loss": 1},
                             {"rope": 1}, None),
    # GLM-4-MoE: partial rotary (left to its family's code), no router loss in its head
    "generic-glm4_moe": ("glm4_moe", _GMOE, "generic", {"rms_norm": 5, "mlp": 3, "lm_head_loss": 1}, {"rope": L},
                         None),
    "generic-exaone_moe": ("exaone_moe", _GMOE, "generic", {"rms_norm": 9, "mlp": 3, "rope": L, "lm_head_loss": 1},
                           {}, None),
    # MiniMax: hybrid lightning (linear) attention in layer 0, softmax attention in layer 1; every layer MoE
    "generic-minimax": ("minimax", _GMOE, "generic", {"rms_norm": 6, "mlp": L, "rope": 1, "lm_head_loss": 1}, {},
                        None),
}


GENERIC_ONLY = ("generic-minimax",)
"""GENERIC_MOE's cases of families without data: the support table's rows of the generic matcher's MoE handling (the
others' rows are their families', GENERIC_DATA)."""


TABLE_ONLY = {
    # DeepSeek-V4 (tests/test_deepseek_v4.py trains it, patched vs original): mHC streams, compressed sparse attention,
    # MoE layers whose shared expert and routed experts clamp gate / up at swiglu_limit (swiglu / glu_linear limit=)
    "deepseek_v4": ("deepseek_v4", dict(moe_intermediate_size=32, num_key_value_heads=1, head_dim=32, q_lora_rank=32,
                                        o_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2, index_n_heads=2,
                                        index_head_dim=16, index_topk=4, o_groups=2, qk_rope_head_dim=8,
                                        sliding_window=8, num_nextn_predict_layers=0),
                    "deepseek_v4", {"rms_norm": 11, "mlp": 2 * L, "lm_head_loss": 1}, {"rms_norm": 7, "rope": L}),
    **{case: entry[:5] for case, entry in GENERIC_MOE.items() if case in GENERIC_ONLY},
}
"""Same entries as MORE_FAMILIES; the support table's cases only (see the module docstring)."""

IN_VISION_LANGUAGE = {"clip": "llava", "siglip": "paligemma", "pixtral": "pixtral"}
"""Family specs of vision towers with no model of their own -> the VISION_LANGUAGE case whose support-table row shows
them (applied inside the container's model)."""


_ROPE3 = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}  # mRoPE sections of head_dim 16
_QWEN_VL_IDS = dict(image_token_id=5, video_token_id=6, vision_start_token_id=4)
_QWEN_VIS = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=2,
                 temporal_patch_size=1)
_VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=8,
            patch_size=4)
IMAGE_TOKEN = 5
_GLM_ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2], "partial_rotary_factor": 0.5}
_GLM_IDS = dict(image_token_id=IMAGE_TOKEN, video_token_id=6, image_start_token_id=4, image_end_token_id=7,
                video_start_token_id=3, video_end_token_id=3)
_GLM_VIS = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64, patch_size=2,
                temporal_patch_size=1, image_size=4)

# Llama 4: a MoE text decoder (2 experts, skipped; the shared expert patched) and a one-layer vision tower of 2x2
# patches of 4 pixels (image_size 8), pixel-shuffled (ratio 0.5) to one image token between its start / end tokens
_LLAMA4_VLM = dict(text_config=dict(TINY, model_type="llama4_text", intermediate_size_mlp=128, num_local_experts=2),
                   image_token_id=IMAGE_TOKEN, boi_token_index=3, eoi_token_index=4,
                   vision_config=dict(_VIT, intermediate_size=128, vision_output_dim=64, projector_input_dim=64,
                                      projector_output_dim=64))

VA = {"vision_attention": 1}  # a one-block vision tower's packed attention, batched by chunk length
VISION_LANGUAGE = {
    # vision-language models (not AutoModelForCausalLM: built from their class): the text tower, the vision tower's
    # norms and MLPs, the LM head of the conditional-generation class; one 8x8 image (or 2x2 patches) with its image
    # tokens among the text. Entry: (model_type, config overrides, class, family, replaced counts, skipped counts).
    # Qwen-VL: the text rotary runs on cos / sin already assembled from the mRoPE sections; the vision rotary is
    # another interface (skipped); vision MLPs non-gated (Qwen2-VL, Qwen3-VL) or gated (Qwen2.5-VL)
    "qwen2_vl": ("qwen2_vl", dict(text_config=dict(TINY, rope_parameters=_ROPE3), **_QWEN_VL_IDS, vision_config=dict(
        depth=1, embed_dim=32, num_heads=2, hidden_size=64, patch_size=2, temporal_patch_size=1)),
        "Qwen2VLForConditionalGeneration", "qwen2_vl", {**FULL, **ADD, **VA, "layer_norm": 2 + 1, "mlp": L + 1},
        {"rope": 1}),
    "qwen2_5_vl": ("qwen2_5_vl", dict(text_config=dict(TINY, rope_parameters=_ROPE3), **_QWEN_VL_IDS,
                                      vision_config=dict(_QWEN_VIS, fullatt_block_indexes=[0])),
                   "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", {**FULL, **ADD, **VA,
                                                                         "rms_norm": 2 * L + 1 + 3,
                                                                         "mlp": L + 1}, {"rope": 1}),
    "qwen3_vl": ("qwen3_vl", dict(text_config=dict(TINY, rope_parameters=dict(_ROPE3, mrope_interleaved=True)),
                                  **_QWEN_VL_IDS, vision_config=dict(_QWEN_VIS, num_position_embeddings=16,
                                                                     deepstack_visual_indexes=[0])),
                 "Qwen3VLForConditionalGeneration", "qwen3_vl", {**QK_NORMS, **ADD, **VA, "layer_norm": 4,
                                                                 "mlp": L + 1},
                 {"rope": 1}),
    # Qwen3.5-MoE: the hybrid MoE text decoder and a Qwen3-VL-like vision tower; its head keeps the router loss, with
    # the router settings read from the text config
    "qwen3_5_moe": ("qwen3_5_moe", dict(text_config=dict(TINY, **_MOE, **_LINEAR_ATTENTION, moe_intermediate_size=32,
                                                         shared_expert_intermediate_size=32,
                                                         rope_parameters=dict(_ROPE3, mrope_interleaved=True,
                                                                              partial_rotary_factor=0.5)),
                                        **_QWEN_VL_IDS, vision_config=dict(_QWEN_VIS, num_position_embeddings=16,
                                                                           deepstack_visual_indexes=[])),
                    "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe",
                    {"rms_norm": 8, "mlp": 2 * L + 1, "rope": 1, "lm_head_loss": 1, "layer_norm": 3, **VA},
                    {"rope": 1}),
    # Llama language model, CLIP vision tower: three families; the projector and CLIP's MLP are non-gated (act_linear)
    "llava": ("llava", dict(text_config=dict(TINY, model_type="llama"), image_token_id=IMAGE_TOKEN,
                            vision_config=dict(_VIT, model_type="clip_vision_model")),
              "LlavaForConditionalGeneration", "llava", {**FULL, **ADD, "layer_norm": 4, "mlp": L + 2}, {}),
    # Gemma language model, SigLIP vision tower (its pooling head's LayerNorm and MLP too)
    "paligemma": ("paligemma", dict(text_config=dict(TINY, model_type="gemma"), image_token_id=IMAGE_TOKEN,
                                    projection_dim=64, vision_config=dict(_VIT, model_type="siglip_vision_model",
                                                                          projection_dim=64)),
                  "PaliGemmaForConditionalGeneration", "paligemma", {**FULL, **ADD, "layer_norm": 4, "mlp": L + 2}, {}),
    # the projector's soft-embedding RMSNorm beside the text tower's; SigLIP vision tower
    "gemma3": ("gemma3", dict(text_config=dict(TINY, model_type="gemma3_text"), image_token_id=IMAGE_TOKEN,
                              mm_tokens_per_image=4, boi_token_index=3, eoi_token_index=4,
                              vision_config=dict(_VIT, model_type="siglip_vision_model", patch_size=2)),
               "Gemma3ForConditionalGeneration", "gemma3",
               {**FULL, "rms_norm": 6 * L + 2, "layer_norm": 4, "mlp": L + 2}, {}),
    # layer 1 is a cross-attention layer (its q / k norms; no rotary); LayerNorm ViT with a global transformer
    "mllama": ("mllama", dict(text_config=dict(TINY, cross_attention_layers=[1]), image_token_index=IMAGE_TOKEN,
                              vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                 num_global_layers=1, attention_heads=2, image_size=8, patch_size=4,
                                                 max_num_tiles=1, vision_output_dim=64, intermediate_layers_indices=[0],
                                                 supported_aspect_ratios=[[1, 1]])),
               "MllamaForConditionalGeneration", "mllama", {**FULL, "rms_norm": 2 * L + 3, "rope": 1, "layer_norm": 6,
                                                            "mlp": L + 2}, {}),
    # families_more.py. Qwen3-VL with MoE text layers (layer 0 dense): the router loss with the text config's settings
    "qwen3_vl_moe": ("qwen3_vl_moe", dict(text_config=dict(TINY, **_MOE, moe_intermediate_size=32, mlp_only_layers=[0],
                                                           rope_parameters=dict(_ROPE3, mrope_interleaved=True)),
                                          **_QWEN_VL_IDS, vision_config=dict(_QWEN_VIS, num_position_embeddings=16,
                                                                             deepstack_visual_indexes=[0])),
                     "Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe", {**QK_NORMS, **ADD, **VA,
                                                                             "layer_norm": 4,
                                                                             "mlp": L + 1}, {"rope": 1}),
    # GLM-4V: GLM-4 text layers (interleaved partial rotary on mRoPE tables: rope_interleaved), gated vision MLPs, the
    # merger left alone
    "glm4v": ("glm4v", dict(text_config=dict(TINY, rope_parameters=_GLM_ROPE), **_GLM_IDS, vision_config=_GLM_VIS),
              "Glm4vForConditionalGeneration", "glm4v", {"rms_norm": 4 * L + 1 + 4, "mlp": L + 1, "layer_norm": 1,
                                                         **VA,
                                                         "rope": L, "lm_head_loss": 1}, {"rope": 1, "mlp": 1}),
    # GLM-4V-MoE: pre-norm MoE text layers with partial rotate-half rotary (patched), router loss
    "glm4v_moe": ("glm4v_moe", dict(text_config=dict(TINY, **_MOE, n_routed_experts=4, moe_intermediate_size=32,
                                                    first_k_dense_replace=1, n_group=1, topk_group=1,
                                                    rope_parameters=_GLM_ROPE), **_GLM_IDS, vision_config=_GLM_VIS),
                  "Glm4vMoeForConditionalGeneration", "glm4v_moe", {**FULL, **ADD, **VA, "rms_norm": 2 * L + 1 + 4,
                                                                "mlp": 4,
                                                                "layer_norm": 1}, {"rope": 1, "mlp": 1}),
    # InternVL: InternViT (LayerNorms, non-gated MLP: act_linear) + LayerNorm projector (skipped), Qwen2 text tower
    "internvl": ("internvl", dict(text_config=dict(TINY, model_type="qwen2"), image_token_id=IMAGE_TOKEN,
                                  image_seq_length=4, vision_config=dict(_VIT, image_size=[8, 8], patch_size=[2, 2],
                                                                         model_type="internvl_vision")),
                 "InternVLForConditionalGeneration", "internvl", {**FULL, **ADD, "layer_norm": 3, "mlp": L + 1},
                 {"mlp": 1}),
    # SmolVLM: its own SigLIP-like vision tower, Llama text tower
    "smolvlm": ("smolvlm", dict(text_config=dict(TINY, model_type="llama"), image_token_id=IMAGE_TOKEN, scale_factor=2,
                                vision_config=dict(_VIT, patch_size=2, model_type="smolvlm_vision")),
                "SmolVLMForConditionalGeneration", "smolvlm", {**FULL, **ADD, "layer_norm": 3, "mlp": L + 1}, {}),
    # LLaVA-NeXT / LLaVA-OneVision: the LLaVA projector; one 8x8 image (one patch) as the base
    # tile and a 2x1 grid of crops
    "llava_next": ("llava_next", dict(text_config=dict(TINY, model_type="llama"), image_token_index=IMAGE_TOKEN,
                                      image_grid_pinpoints=[[16, 8]],
                                      vision_config=dict(_VIT, model_type="clip_vision_model", patch_size=8)),
                   "LlavaNextForConditionalGeneration", "llava_next", {**FULL, **ADD, "layer_norm": 4, "mlp": L + 2},
                   {}),
    "llava_onevision": ("llava_onevision", dict(
        text_config=dict(TINY, model_type="qwen2"), image_token_index=IMAGE_TOKEN, image_grid_pinpoints=[[16, 8]],
        vision_config=dict(_VIT, model_type="siglip_vision_model", patch_size=8)),
                        "LlavaOnevisionForConditionalGeneration", "llava_onevision",
                        {**FULL, **ADD, "layer_norm": 4, "mlp": L + 3}, {}),
    # Idefics3 (SmolVLM's base): its own SigLIP-like vision tower, Llama text tower
    "idefics3": ("idefics3", dict(text_config=dict(TINY, model_type="llama"), image_token_id=IMAGE_TOKEN,
                                  scale_factor=2, vision_config=dict(_VIT, patch_size=2)),
                 "Idefics3ForConditionalGeneration", "idefics3", {**FULL, **ADD, "layer_norm": 3, "mlp": L + 1}, {}),
    # Mistral 3: Pixtral vision tower, Mistral text tower; the projector's RMSNorm (its patch merger: skipped)
    "mistral3": ("mistral3", dict(text_config=dict(TINY, model_type="mistral"), image_token_index=IMAGE_TOKEN,
                                  spatial_merge_size=2, vision_config=dict(_VIT, head_dim=16, patch_size=2)),
                 "Mistral3ForConditionalGeneration", "mistral3", {**FULL, **ADD, "rms_norm": 2 * L + 1 + 3 + 1,
                                                                  "mlp": L + 1}, {"rope": 1, "mlp": 1}),
    # Aya Vision: SigLIP vision tower, Cohere 2 text tower (logit_scale); the projector's LayerNorm (SwiGLU: skipped)
    "aya_vision": ("aya_vision", dict(text_config=dict(TINY, model_type="cohere2"), image_token_index=IMAGE_TOKEN,
                                      downsample_factor=2, vision_config=dict(_VIT, model_type="siglip_vision_model",
                                                                              patch_size=2)),
                   "AyaVisionForConditionalGeneration", "aya_vision",
                   {"layer_norm": 8, "mlp": L + 2, "rope": L, "lm_head_loss": 1}, {"mlp": 1}),
    # Gemma 4: the text decoder above and a vision tower of the same module (its RMSNorms, v_norm without weight, and
    # gated MLP; its multidimensional rotary skipped); 16 patches of 2x2 pixels pooled 2x2 into 4 image tokens
    "gemma4": ("gemma4", dict(text_config=dict(TINY, **_GEMMA4), image_token_id=IMAGE_TOKEN, boi_token_id=3,
                              eoi_token_id=4, video_token_id=6, audio_token_id=7,
                              vision_config=dict(_VIT, num_key_value_heads=2, head_dim=16, patch_size=2,
                                                 pooling_kernel_size=2, position_embedding_size=8)),
               "Gemma4ForConditionalGeneration", "gemma4", {"rms_norm": 12 * L + 2 + 8, "mlp": 2 * L + 1,
                                                            "lm_head_loss": 1}, {"rope": L + 1}),
    # Pixtral vision encoder in a Llava container with a Mistral text tower
    "pixtral": ("llava", dict(text_config=dict(TINY, model_type="mistral"), image_token_id=IMAGE_TOKEN,
                              vision_feature_select_strategy="full", vision_feature_layer=-1,
                              vision_config=dict(_VIT, head_dim=16, model_type="pixtral")),
                "LlavaForConditionalGeneration", "llava", {**FULL, **ADD, "rms_norm": 2 * L + 1 + 3, "mlp": L + 2},
                {"rope": 1}),
    # Llama 4 (its text model: MORE_FAMILIES' llama4) with its vision tower: LayerNorms, the encoder layer's MLP
    # (act_linear) and its rotary (vision_apply_rotary_emb: rope_interleaved); the pixel-shuffle adapter's MLP and the
    # bmm experts skipped; the head through its Llama4ForCausalLM (tests/test_vlm_held_head.py)
    "llama4-vlm": ("llama4", _LLAMA4_VLM, "Llama4ForConditionalGeneration", "llama4",
                   {"rms_norm": 3 * L + 1, "layer_norm": 4, "mlp": L + 1, "rope": L + 1, "lm_head_loss": 1},
                   {"mlp": L + 1}),
}

_QFORMER = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                encoder_hidden_size=32)
HELD_HEADS = {
    # vision-language models whose forward calls a causal LM of their own (not a backbone) and computes the loss on
    # its logits (tests/test_vlm_held_head.py; inputs built there). Entry: (model_type, config overrides, class, the
    # image tokens in input_ids). Llama 4 (VISION_LANGUAGE's llama4-vlm): its Llama4ForCausalLM (the llama4 family's
    # head, the container declared as one: the fused loss runs through it); one 8x8 image of 2x2 patches,
    # pixel-shuffled to 1 token. BLIP-2 / InstructBLIP with a Llama text model (InstructBLIP-Vicuna's layout): of no
    # family, they slice the logits to the labels' length before the loss: their head is reported skipped
    "llama4": ("llama4", _LLAMA4_VLM, "Llama4ForConditionalGeneration", 1),
    "blip-2": ("blip-2", dict(text_config=dict(TINY, model_type="llama"), vision_config=_VIT, qformer_config=_QFORMER,
                              num_query_tokens=2, image_token_index=IMAGE_TOKEN),
               "Blip2ForConditionalGeneration", 2),
    "instructblip": ("instructblip", dict(text_config=dict(TINY, model_type="llama"), vision_config=_VIT,
                                          qformer_config=_QFORMER, num_query_tokens=2, image_token_index=IMAGE_TOKEN),
                     "InstructBlipForConditionalGeneration", 2),
}



def image_inputs(case: str, seq: int = 10) -> dict:
    """``input_ids`` (text tokens 8..249 from a fixed seed, with the image's tokens), ``labels`` (the image tokens
    ignored) and the image inputs for a VISION_LANGUAGE case: one random image in the layout its model takes, built
    from its config as the tools build it (:func:`tigon.workflows.multimodal.with_images`; the grid and patch
    families' image spans 2x2 patches, one image token after the merge / pooling)."""
    from tigon.workflows.multimodal import with_images

    ids = torch.randint(8, 250, (1, seq), generator=torch.Generator().manual_seed(0))
    model_type, overrides = VISION_LANGUAGE[case][:2]
    return {k: v.to(DEVICE) for k, v in with_images(ids, config(model_type, overrides), image_tokens=1).items()}


LAYER_NORM_VARIANTS = {
    # configurations of the LayerNorm families (and partial rotary) beyond CASES' defaults (tests/test_families.py
    # checks loss and gradients of one step, and the dry run). GPT-NeoX with a sequential residual (two norms per layer)
    "gpt_neox-sequential": ("gpt_neox", dict(use_parallel_residual=False), "gpt_neox",
                            {"layer_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # q / k LayerNorms over the head dim (torch.nn.LayerNorm): one more pair per layer
    "phi-qk_layernorm": ("phi", dict(qk_layernorm=True), "phi", {"layer_norm": 3 * L + 1, "mlp": L, "rope": L,
                                                                  "lm_head_loss": 1}, {}),
    # per-head q / k LayerNorms (StableLmLayerNormPerHead: 4 + 2 torch.nn.LayerNorm per layer), parallel residual
    # (no post-attention norm)
    "stablelm-qk_layernorm": ("stablelm", dict(qk_layernorm=True, use_parallel_residual=True), "stablelm",
                              {"layer_norm": 7 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # Falcon-40B's layout: ln_attn and ln_mlp per layer, grouped kv heads
    "falcon-new_decoder": ("falcon", dict(head_dim=DROP, num_kv_heads=2, new_decoder_architecture=True), "falcon",
                           {"layer_norm": 2 * L + 1, "mlp": L, "rope": L, "lm_head_loss": 1}, {}),
    # not a LayerNorm family, but the same partial rotary as GPT-NeoX inside apply_rotary_pos_emb (Phi-4-mini: 0.75)
    "phi3-partial_rotary": ("phi3", dict(partial_rotary_factor=0.5), "phi3", FULL, {}),
    # ALiBi instead of rotary (config.alibi): no rotary to patch (a note, not a skip)
    "falcon-alibi": ("falcon", dict(head_dim=DROP, alibi=True), "falcon", {"layer_norm": L + 1, "mlp": L,
                                                                           "lm_head_loss": 1}, {}),
}
LAYER_NORM = {"gpt_neox", "phi", "stablelm", "falcon", *LAYER_NORM_VARIANTS}
"""The LayerNorm families' cases of CASES and their variants (their training step is checked everywhere)."""


CPU_STEP = {"olmoe", "phimoe", "flex_olmo", "minimax_m2", "nemotron", "falcon_h1", "falcon_h1-groups",
            "falcon_h1-gate_first", "bamba", "qwen3_next", "qwen2_vl", "llava", "paligemma", "llama4", "pixtral",
            "llava_next", "aya_vision", "llama4-vlm", *GENERIC_DATA}
"""MORE_FAMILIES / VISION_LANGUAGE cases (and the Liger-list families of CASES) whose training step the CPU run checks
against the original: one per mechanism (MoE router loss, LayerNorm (1 + w), logit multiplier and skipped parts, the
grouped gated RMSNorm in either gate order, partial rotary with a hybrid decoder, one-module and multi-family
vision-language models, the text config's softcap, a weightless RMSNorm beside skipped experts, a vision encoder of
another family in a Llava container, Llama 4's vision rotary on its complex table). The others check their report and
dry run on CPU; their step runs on CUDA or with TIGON_FAMILY_ALL=1."""


def check_step(case: str) -> bool:
    """Whether the test of ``case`` runs its training step here (see :data:`CPU_STEP`)."""
    return DEVICE == "cuda" or case in CPU_STEP or os.environ.get("TIGON_FAMILY_ALL") == "1" or case in LAYER_NORM


def require_family(model_type: str) -> None:
    """Skip the calling test when the installed transformers has no ``model_type`` (the GPU image's transformers 5.17
    may lack families newer than it)."""
    import pytest

    if model_type not in transformers.models.auto.configuration_auto.CONFIG_MAPPING_NAMES:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type!r} models")


def config(model_type: str, overrides: dict):
    """The transformers config of a matrix entry (eager attention; ``experts_implementation`` applied)."""
    overrides = dict(overrides)
    experts = overrides.pop("experts_implementation", None)
    base = {} if "text_config" in overrides else TINY
    kwargs = {k: v for k, v in {**base, **overrides}.items() if v is not DROP}
    cfg = transformers.AutoConfig.for_model(model_type, **kwargs)
    cfg._attn_implementation = "eager"
    if experts is not None:
        cfg._experts_implementation = experts
    return cfg


def build(model_type: str, overrides: dict, seed: int = 0, cls: str | None = None):
    """A matrix model on DEVICE in DTYPE (its floating tensors: a complex buffer, Llama 4's vision rotary table, keeps
    its dtype), in training mode, with weights from ``seed``."""
    from tigon.workflows.e2e_models import cast_floating

    cfg = config(model_type, overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, cls)(cfg) if cls else transformers.AutoModelForCausalLM.from_config(cfg)
    return cast_floating(model.to(DEVICE), DTYPE).train()


def assert_report_runs(report, used: dict, steps: int = 1, checkpointed: bool = False) -> None:
    """The replacements of a patch ``report`` are what ran in ``steps`` training steps (forward and backward with
    labels) of the patched model: ``used`` (:func:`tigon.support.backend_usage`) holds exactly the ops the replaced
    entries declare (:attr:`~tigon.integrations.PatchEntry.ops`), each called at least once per replaced module and
    step. A fused decoder layer computes its post-attention norm inside ``fused_add_rms_norm``: those norms (one per
    fused layer) stay patched for the layer's fallback and are not counted as calls. ``checkpointed``: the steps ran
    under non-reentrant activation checkpointing, where an entry runs its ``checkpoint_ops`` unless they are None
    (``()``: none of Tigon's ops, the original forward)."""
    from collections import Counter

    declared = Counter(op for e in report.replaced
                       for op in (e.checkpoint_ops if checkpointed and e.checkpoint_ops is not None else e.ops))
    assert set(used) == set(declared), f"ops that ran {sorted(used)} != ops the report declares {dict(declared)}"
    bypassed = report.counts.get("fused_add_rms_norm", 0)
    for op, n in declared.items():
        calls = sum(used[op].values())
        need = (n - bypassed if op == "rms_norm" else n) * steps
        assert calls >= need, f"{op}: {calls} calls in {steps} step(s) for {n} replaced module(s)\n{report}"
