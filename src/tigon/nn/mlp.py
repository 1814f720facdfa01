"""Gated MLPs with HF ``LlamaMLP`` parameter names: ``down_proj(act(gate_proj(x)) * up_proj(x))``."""

from __future__ import annotations

import torch
from torch import nn

from .. import functional as TF


class _GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}"


class SwiGLUMLP(_GatedMLP):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020; HF LlamaMLP with ``hidden_act="silu"``).

    The activation-product runs in :func:`tigon.functional.swiglu`; the projections are ``nn.Linear``.

    Args:
        hidden_size, intermediate_size: model and MLP widths.
        bias: bias on all three projections (HF ``mlp_bias``).
        device, dtype: of the parameters.

    Shapes and dtypes:
        input (..., hidden_size) in the parameters' dtype; output (..., hidden_size), same dtype.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(TF.swiglu(self.gate_proj(x), self.up_proj(x)))


class GeGLUMLP(_GatedMLP):
    """``down_proj(gelu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020; HF GemmaMLP with ``gelu_pytorch_tanh``).

    The activation-product runs in :func:`tigon.functional.geglu`.

    Args:
        hidden_size, intermediate_size, bias, device, dtype: as :class:`SwiGLUMLP`.
        approximate: ``"tanh"`` (default, HF ``gelu_pytorch_tanh`` / ``gelu_new``) or ``"none"`` (exact ``gelu``).

    Shapes and dtypes:
        input (..., hidden_size) in the parameters' dtype; output (..., hidden_size), same dtype.

    Raises:
        ValueError: unknown ``approximate`` (at construction).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, approximate: str = "tanh",
                 device=None, dtype=None):
        if approximate not in ("tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        super().__init__(hidden_size, intermediate_size, bias, device, dtype)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(TF.geglu(self.gate_proj(x), self.up_proj(x), approximate=self.approximate))

    def extra_repr(self) -> str:
        return super().extra_repr() + f", approximate={self.approximate!r}"
