"""``torch.nn.Module`` drop-ins backed by :mod:`tigon.functional`.

Parameter names and shapes match the modules they replace (HF ``LlamaRMSNorm`` / ``LlamaMLP``, Liger-Kernel's
``LigerRMSNorm`` / ``LigerFusedAddRMSNorm`` / ``LigerLayerNorm`` / ``LigerSwiGLUMLP`` / ``LigerGEGLUMLP`` / ``LigerDyT``
/ ``LigerPolyNorm`` / ``LigerReLUSquared`` / ``LigerSoftmax`` / ``LigerJSD`` / ``LigerKLDIVLoss`` / ``LigerTVDLoss`` /
``LigerGroupNorm`` / ``LigerSparsemax``, the chunked preference losses ``LigerFusedLinearDPOLoss`` ...,
``LigerTiledSwiGLUMLP`` / ``LigerTiledGEGLUMLP``, ``LigerVocabParallelCrossEntropy``), so state dicts load
unchanged; ``LayerNorm`` is also a ``torch.nn.LayerNorm`` subclass, whose state dict loads too. ``tigon.nn.X`` takes
Liger-Kernel's ``LigerX`` constructor arguments in Liger's order (tests/test_liger_signatures.py), Tigon's own options
keyword-only after them.
"""

from __future__ import annotations

from .activation import ReLUSquared, Softmax
from .divergence import JSD, KLDivLoss, TVDLoss
from .loss import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from .mlp import GeGLUMLP, SwiGLUMLP, TiledGEGLUMLP, TiledSwiGLUMLP
from .norm import DyT, FusedAddRMSNorm, LayerNorm, PolyNorm, RMSNorm
from .preference import (FusedLinearCPOLoss, FusedLinearDPOLoss, FusedLinearKTOLoss, FusedLinearORPOLoss,
                         FusedLinearSimPOLoss)
from .grpo import FusedLinearGRPOLoss
from .fused_linear_jsd import FusedLinearJSD, FusedLinearJSDLoss
from .norm import GroupNorm
from .activation import Sparsemax
from .vocab_parallel import VocabParallelCrossEntropy

__all__ = ["RMSNorm", "FusedAddRMSNorm", "LayerNorm", "SwiGLUMLP", "GeGLUMLP", "CrossEntropyLoss",
           "FusedLinearCrossEntropyLoss", "JSD", "KLDivLoss", "TVDLoss", "ReLUSquared", "Softmax", "DyT", "PolyNorm",
           "FusedLinearDPOLoss", "FusedLinearSimPOLoss", "FusedLinearCPOLoss", "FusedLinearORPOLoss",
           "FusedLinearKTOLoss", "FusedLinearGRPOLoss", "FusedLinearJSD", "FusedLinearJSDLoss", "GroupNorm",
           "Sparsemax", "TiledSwiGLUMLP", "TiledGEGLUMLP", "VocabParallelCrossEntropy"]
