"""``torch.nn.Module`` drop-ins backed by :mod:`tigon.functional`.

Parameter names and shapes match the modules they replace (HF ``LlamaRMSNorm`` / ``LlamaMLP``,
``torch.nn.LayerNorm``), so state dicts load unchanged.
"""

from __future__ import annotations

from .loss import CrossEntropyLoss, FusedLinearCrossEntropyLoss
from .mlp import GeGLUMLP, SwiGLUMLP
from .norm import LayerNorm, RMSNorm

__all__ = ["RMSNorm", "LayerNorm", "SwiGLUMLP", "GeGLUMLP", "CrossEntropyLoss", "FusedLinearCrossEntropyLoss"]
