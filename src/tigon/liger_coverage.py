"""Liger-Kernel's public ops and op modules, each with what replaces it in Tigon or why nothing does (issue 21).

:data:`LIGER_OPS` names every ``liger_kernel.transformers.functional.liger_*`` function and every op module that
``liger_kernel.transformers`` and ``liger_kernel.chunked_loss`` export (Liger-Kernel 0.8.x, read from its source:
``transformers/functional.py``, ``transformers/*.py``, ``chunked_loss/__init__.py``; model-level classes such as
``AutoLigerKernelForCausalLM`` and the ``apply_liger_kernel_to_*`` patches are ``tigon.patch``'s business and not
listed). ``tigon env`` reports it, the README's "Not (yet) in Tigon" paragraph gives the same reasons, and
``tests/test_liger_coverage.py`` checks that every target exists, every skipped name is in the README, and, where
Liger is installed, that no name is missing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LigerOp:
    """One Liger-Kernel name: ``tigon`` is what replaces it (``"F.x"`` = ``tigon.functional.x``, ``"nn.X"`` =
    ``tigon.nn.X``, or a family patch of ``tigon.patch``), None when Tigon has nothing; ``note`` says why not, or
    what differs."""

    liger: str
    tigon: str | None
    note: str = ""


_MHC = ("mHC (manifold-constrained hyper-connections: a widened residual stream mixed by Sinkhorn-projected "
        "matrices) changes the model's architecture; of transformers' models DeepSeek-V4 (5.2x) has it, whose family "
        "spec leaves its hyper-connections to PyTorch; not done yet")
_TILED = ("F.tiled_mlp under it (bias-free gate/up/down, the fused GLU kernels per tile, weight gradients accumulated "
          "in place); hidden_act 'gelu' is the exact GELU (Liger runs the tanh GELU)")
_MTA = ("an attention variant (Golovneva et al. 2025: a convolution over the score matrix) that no transformers "
        "model uses; attention is left to SDPA / FlashAttention; not done yet")
_NA = ("neighborhood (local-window) attention for vision models (NATTEN's); attention is left to SDPA / FlashAttention "
       "and no causal LM Tigon patches uses it; not done yet")
_MODULATED = ("adaLN-style (1 + scale) * rms_norm(x) + shift with broadcast scale / shift, used by diffusion "
              "transformers, none of the causal-LM families Tigon patches; not done yet")
_LLAMA4 = ("not as a function of complex freqs_cis (another interface than cos / sin); tigon.patch does rotate "
           "Llama-4's text and vision attention (the llama4 family: F.rope_interleaved on the real and imaginary parts "
           "of freqs_cis, and of the vision tower's freqs_ci)")
_FLKL = ("not done yet: a fused linear KL against a given (N, V) target distribution; Tigon's fused distillation loss, "
         "F.fused_linear_jsd, takes the teacher's head instead (its beta gives either KL at the ends)")
_TP_SCALED = ("not done yet as such: F.vocab_parallel_fused_linear_cross_entropy is the vocabulary-sharded fused loss "
              "(temperature as logit_scale = 1 / temperature), without the per-token entropy output")
_CETVD = ("not done yet as one module: per-token cross-entropy and total variation distance against a given teacher "
          "distribution, unreduced (F.cross_entropy with reduction='none' and F.tvd give the two terms)")
_MUSE = ("MuseGlimmer is not a transformers family Tigon patches (not in transformers 5.17 / 5.25); nn.RMSNorm with "
         "casting_mode='gemma' (and offset=1.0 for the centered norm) / nn.SwiGLUMLP compute the same; not done as "
         "named classes")
_IN_PLACE_OFF = ("in_place defaults to False (Liger: True) until the in-place backward's CUDA tests pass; "
                 "in_place=True is taken")
_INIT_FN = ("init_fn defaults to None: Liger's 'ones', except zeros with a non-zero offset (HF GemmaRMSNorm's init; "
            "Liger's weight starts at ones whatever the offset)")
_ROTARY_DIM = ("Liger 0.8.5's rotary_dim (the first rotary_dim dims rotated by cos / sin's first rotary_dim / 2 "
               "columns) by the partial-rotary kernel; position_ids also selects rows of a 2-D table of every position")
_MLP_CONFIG = ("takes Liger's config (hidden_size, intermediate_size, hidden_act read from it) or Tigon's "
               "(hidden_size, intermediate_size), told apart by type")
_MOE = "the MoE families' experts patch (tigon.patch: mixtral, qwen3_moe, ...: the experts' _apply_gate hook)"

LIGER_OPS: tuple[LigerOp, ...] = (
    # functional
    LigerOp("liger_cross_entropy", "F.cross_entropy"),
    LigerOp("liger_fused_linear_cross_entropy", "F.fused_linear_cross_entropy"),
    LigerOp("liger_fused_linear_jsd", "F.fused_linear_jsd"),
    LigerOp("liger_fused_linear_kl_div", None, _FLKL),
    LigerOp("liger_fused_linear_scaled_cross_entropy_tp", None, _TP_SCALED),
    LigerOp("liger_geglu", "F.geglu", "gate, up for Liger's a, b (same positions)"),
    LigerOp("liger_group_norm", "F.group_norm"),
    LigerOp("liger_jsd", "F.jsd"),
    LigerOp("liger_kl_div", "F.kl_div"),
    LigerOp("liger_tvd", "F.tvd"),
    LigerOp("liger_sparsemax", "F.sparsemax"),
    LigerOp("liger_layer_norm", "F.layer_norm", "x, weight, bias for Liger's X, W, B (same positions)"),
    LigerOp("liger_qwen2vl_mrope", "F.mrope"),
    LigerOp("liger_relu_squared", "F.relu_squared"),
    LigerOp("liger_rms_norm", "F.rms_norm", "x, weight for Liger's X, W (same positions)"),
    LigerOp("liger_poly_norm", "F.poly_norm", _IN_PLACE_OFF),
    LigerOp("liger_fused_add_rms_norm", "F.fused_add_rms_norm",
            f"x, residual, weight for Liger's X, R, W (same positions); {_IN_PLACE_OFF}"),
    LigerOp("liger_rope", "F.rope", _ROTARY_DIM),
    LigerOp("liger_rotary_pos_emb", "F.rope", _ROTARY_DIM),
    LigerOp("liger_swiglu", "F.swiglu", "gate, up for Liger's a, b (same positions)"),
    LigerOp("liger_softmax", "F.softmax"),
    LigerOp("liger_dyt", "F.dyt"),
    LigerOp("liger_multi_token_attention", None, _MTA),
    LigerOp("liger_fused_neighborhood_attention", None, _NA),
    LigerOp("liger_modulated_rms_norm", None, _MODULATED),
    LigerOp("liger_mhc_coeffs", None, _MHC),
    LigerOp("liger_mhc_pre", None, _MHC),
    LigerOp("liger_mhc_post_res", None, _MHC),
    LigerOp("liger_mhc_apply", None, _MHC),
    LigerOp("liger_mhc_forward", None, _MHC),
    LigerOp("liger_attn_res", None,
            "attention residuals (Kimi, arXiv:2603.15031: softmax attention over the outputs of earlier blocks "
            "instead of the residual add) change the model's architecture; no transformers model uses them; not "
            "done yet"),
    LigerOp("liger_llama4_text_rotary_pos_emb", None, _LLAMA4),
    LigerOp("liger_llama4_vision_rotary_pos_emb", None, _LLAMA4),
    # modules
    LigerOp("LigerCrossEntropyLoss", "nn.CrossEntropyLoss"),
    LigerOp("LigerFusedLinearCrossEntropyLoss", "nn.FusedLinearCrossEntropyLoss",
            "forward(hidden, weight, target, bias): hidden first (Liger: lin_weight first)"),
    LigerOp("LigerFusedLinearJSD", "nn.FusedLinearJSD"),
    LigerOp("LigerFusedLinearKLDivLoss", None, _FLKL),
    LigerOp("LigerFusedCETVDLoss", None, _CETVD),
    LigerOp("LigerJSD", "nn.JSD"),
    LigerOp("LigerKLDIVLoss", "nn.KLDivLoss"),
    LigerOp("LigerTVDLoss", "nn.TVDLoss"),
    LigerOp("LigerDyT", "nn.DyT"),
    LigerOp("LigerLayerNorm", "nn.LayerNorm",
            "Liger's constructor and init (not torch's: another third argument and eps default), a torch.nn.LayerNorm "
            "subclass; impl / mode / backend (Liger's backend choice) accepted, checked and unused"),
    LigerOp("LigerRMSNorm", "nn.RMSNorm", f"row_mode (Liger's launch hint) accepted, checked and unused; {_INIT_FN}"),
    LigerOp("LigerFusedAddRMSNorm", "nn.FusedAddRMSNorm", _INIT_FN),
    LigerOp("LigerPolyNorm", "nn.PolyNorm", _IN_PLACE_OFF),
    LigerOp("LigerReLUSquared", "nn.ReLUSquared"),
    LigerOp("LigerSoftmax", "nn.Softmax"),
    LigerOp("LigerSparsemax", "nn.Sparsemax"),
    LigerOp("LigerGEGLUMLP", "nn.GeGLUMLP",
            f"{_MLP_CONFIG}; the activation from the config: the exact GELU for 'gelu' (Liger: tanh for all)"),
    LigerOp("LigerSwiGLUMLP", "nn.SwiGLUMLP", _MLP_CONFIG),
    LigerOp("LigerSwiGLUMLPForMuseGlimmer", None, _MUSE),
    LigerOp("LigerRMSNormForMuseGlimmer", None, _MUSE),
    LigerOp("LigerRMSNormForMuseGlimmerTextCentered", None, _MUSE),
    LigerOp("LigerMLP", "nn.SwiGLUMLP",
            f"{_MLP_CONFIG}; the patched MLP runs F.glu_linear (down projection fused with the product)"),
    LigerOp("LigerPhi3SwiGLUMLP", "the phi3 family patch", "the fused gate_up projection's halves"),
    LigerOp("LigerFalconH1MLP", "the falcon_h1 family patch", "F.swiglu's gate / down multipliers"),
    LigerOp("LigerFalconH1SwiGLUMLP", "the falcon_h1 family patch", "F.swiglu's gate / down multipliers"),
    LigerOp("LigerBlockSparseTop2MLP", _MOE),
    LigerOp("LigerExperts", _MOE),
    LigerOp("LigerQwen3MoeSwiGLUMLP", _MOE),
    LigerOp("LigerVocabParallelCrossEntropy", "nn.VocabParallelCrossEntropy",
            "over F.vocab_parallel_cross_entropy; label_smoothing_mode='partition' (a per-rank approximation) with "
            "label smoothing over several ranks raises ('global', the exact mean, is the default)"),
    LigerOp("LigerGroupNorm", "nn.GroupNorm"),
    LigerOp("LigerTiledGEGLUMLP", "nn.TiledGEGLUMLP", _TILED),
    LigerOp("LigerTiledSwiGLUMLP", "nn.TiledSwiGLUMLP", _TILED),
    LigerOp("LigerMultiTokenAttention", None, _MTA),
    LigerOp("LigerModulatedRMSNorm", None, _MODULATED),
    LigerOp("LigerMHC", None, _MHC),
    LigerOp("LigerFusedNeighborhoodAttention", None, _NA),
    LigerOp("LigerExpertParallelFusedMoe", None,
            "an expert-parallel fused MoE through NVSHMEM (Liger's CuTe kernels package): communication and "
            "grouped GEMMs, outside Tigon's single-device Triton kernels; not done yet"),
    LigerOp("triton_grpo_loss", "F.fused_linear_grpo",
            "through the LM head from the hidden states (Liger's takes the logits); TRL's GRPO trainer via "
            "tigon.integrations.trl.patch_trainer"),
    # chunked losses (liger_kernel.chunked_loss)
    LigerOp("LigerFusedLinearDPOLoss", "nn.FusedLinearDPOLoss"),
    LigerOp("LigerFusedLinearCPOLoss", "nn.FusedLinearCPOLoss"),
    LigerOp("LigerFusedLinearORPOLoss", "nn.FusedLinearORPOLoss",
            "forward's nll_target (a separate target for the NLL term) raises: the NLL term is on target's "
            "chosen rows"),
    LigerOp("LigerFusedLinearSimPOLoss", "nn.FusedLinearSimPOLoss"),
    LigerOp("LigerFusedLinearKTOLoss", "nn.FusedLinearKTOLoss"),
    LigerOp("LigerFusedLinearGRPOLoss", "nn.FusedLinearGRPOLoss"),
    LigerOp("LigerFusedLinearJSDLoss", "nn.FusedLinearJSDLoss"),
    LigerOp("LigerFusedLinearCosineSimilarityLoss", None,
            "a distillation loss, 1 - cosine similarity of the student's and teacher's logits, that no TRL trainer "
            "uses; Tigon's fused distillation is the JSD one; not done yet"),
)
"""Every Liger-Kernel name this module knows: functional, then ``liger_kernel.transformers``' modules, then the
chunked losses."""


def missing() -> dict[str, list[str]]:
    """The Liger-Kernel names Tigon has nothing for, grouped by their reason: reason -> names (Liger's order)."""
    out: dict[str, list[str]] = {}
    for op in LIGER_OPS:
        if op.tigon is None:
            out.setdefault(op.note, []).append(op.liger)
    return out
