"""Tigon's public functional API: one export line per op.

Every function validates its arguments, asks :func:`tigon.support.select_backend` which path to take (compiled
Triton, the Triton interpreter, or the PyTorch reference in :mod:`tigon.reference`), and runs it. Both paths
share one signature and one set of semantics; the reference is the specification. Each op lives in its module of
:mod:`tigon.ops` (the function and its record); its kernels in :mod:`tigon.kernels`.

**An export line here registers the op**: :func:`tigon.ops.registry` lists the records of the ops this module
exports, in this order, for ``tigon verify``, ``tigon bench``, ``tigon profile`` and ``tigon env``.

Under ``torch.compile`` every function here traces without a graph break: the backend is chosen once per trace
(:func:`tigon.support.select_backend`), and the kernels run as ``torch.library`` custom ops (see
:mod:`tigon.kernels`), each one opaque node of the graph.

Names follow Liger-Kernel's functional API without its prefix: ``liger_kernel.transformers.functional.liger_X``
is ``tigon.functional.X``.
"""

from .ops.rms_norm import rms_norm
from .ops.fused_add_rms_norm import fused_add_rms_norm
from .ops.layer_norm import layer_norm
from .ops.dyt import dyt
from .ops.poly_norm import poly_norm
from .ops.rms_norm_gated import rms_norm_gated
from .ops.rope import rope
from .ops.rope import rope_interleaved
from .ops.rope import mrope
from .ops.glu import swiglu
from .ops.glu import geglu
from .ops.glu import glu_linear
from .ops.act_linear import act_linear
from .ops.tiled_mlp import tiled_mlp
from .ops.clamped_swiglu import clamped_swiglu
from .ops.moe_glue import moe_gather
from .ops.moe_glue import moe_expert_gate
from .ops.moe_glue import moe_combine
from .ops.relu_squared import relu_squared
from .ops.softmax import softmax
from .ops.cross_entropy import cross_entropy
from .ops.fused_linear_cross_entropy import fused_linear_cross_entropy
from .ops.fused_linear_logprobs import fused_linear_logprobs
from .ops.lora import lora_linear
from .ops.lora_mlp import lora_glu_mlp, lora_gate_up_mlp  # (the registry order: the exports')
from .ops.lora_qkv_rope import lora_qkv_rope
from .ops.divergence import jsd
from .ops.divergence import kl_div
from .ops.divergence import tvd
from .ops.preference import fused_linear_dpo_loss
from .ops.fused_linear_grpo import fused_linear_grpo
from .ops.fused_linear_jsd import fused_linear_jsd
from .ops.group_norm import group_norm
from .ops.sparsemax import sparsemax
from .reference.cross_entropy import LossOutput
from .reference.fused_linear_logprobs import LogProbsOutput
from .reference.fused_linear_grpo import GRPOOutput
from .reference.pairs import PreferenceOutput

OPS = tuple(name for name, obj in list(globals().items())
            if callable(obj) and getattr(obj, "__module__", "").startswith("tigon.ops."))
"""The exported ops' names, in the order of the lines above (the order the tools list them)."""

# Distributed ops (the vocabulary split over ranks): exported after OPS, so not in the registry that verify / bench /
# profile iterate (those run single-process ops); tests/test_vocab_parallel.py checks them against cross_entropy.
from .ops.vocab_parallel import vocab_parallel_cross_entropy  # noqa: E402
from .ops.vocab_parallel import vocab_parallel_fused_linear_cross_entropy  # noqa: E402

__all__ = [*OPS, "vocab_parallel_cross_entropy", "vocab_parallel_fused_linear_cross_entropy", "LogProbsOutput",
           "LossOutput", "PreferenceOutput", "GRPOOutput"]
