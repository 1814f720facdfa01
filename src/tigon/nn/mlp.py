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


class _TiledGatedMLP(nn.Module):
    """Liger-Kernel's ``LigerTiled*MLP(config, num_shards=None)``: bias-free HF gate/up/down projections, run by
    :func:`tigon.functional.tiled_mlp` over ``num_shards`` token tiles (None: ``ceil(seq / hidden_size)``)."""

    _ACTS: dict = {}

    def __init__(self, config, num_shards: int | None = None):
        super().__init__()
        if num_shards is not None and (isinstance(num_shards, bool) or not isinstance(num_shards, int)
                                       or num_shards < 1):
            raise ValueError(f"num_shards must be an int >= 1 or None, got {num_shards!r}")
        act = getattr(config, "hidden_act", None)
        if act is not None and act not in self._ACTS:
            raise ValueError(f"{type(self).__name__} needs config.hidden_act in {sorted(self._ACTS)}, got {act!r}")
        self.activation = self._ACTS[act] if act is not None else next(iter(self._ACTS.values()))
        self.config = config
        self.hidden_size, self.intermediate_size = config.hidden_size, config.intermediate_size
        self.num_shards = num_shards
        self.gate_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.up_proj = nn.Linear(self.hidden_size, self.intermediate_size, bias=False)
        self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return TF.tiled_mlp(x, self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight,
                            activation=self.activation, num_shards=self.num_shards)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
                f"activation={self.activation!r}, num_shards={self.num_shards}")


class TiledSwiGLUMLP(_TiledGatedMLP):
    """HF LlamaMLP (``down_proj(silu(gate_proj(x)) * up_proj(x))``, no bias) computed over token tiles and recomputed
    in the backward: :func:`tigon.functional.tiled_mlp`. Drop-in for Liger-Kernel's ``LigerTiledSwiGLUMLP``.

    Args:
        config: has ``hidden_size``, ``intermediate_size`` and optionally ``hidden_act`` (``"silu"`` / ``"swish"``).
        num_shards: token tiles, an int >= 1, or None for ``ceil(seq / hidden_size)`` per call (Liger's default).

    Shapes and dtypes:
        input (..., hidden_size) (2-D (tokens, H) or 3-D (batch, seq, H)) in the parameters' dtype (or under
        autocast); output the same shape.

    Raises:
        ValueError: another ``hidden_act``, or a bad ``num_shards`` (at construction).
    """

    _ACTS = {"silu": "silu", "swish": "silu"}


class TiledGEGLUMLP(_TiledGatedMLP):
    """HF GemmaMLP (``down_proj(gelu(gate_proj(x)) * up_proj(x))``, no bias) over token tiles:
    :func:`tigon.functional.tiled_mlp`. Drop-in for Liger-Kernel's ``LigerTiledGEGLUMLP``.

    Args:
        config: as :class:`TiledSwiGLUMLP`'s, ``hidden_act`` one of ``"gelu_pytorch_tanh"`` / ``"gelu_new"`` (tanh
            GELU, the default) or ``"gelu"`` (exact erf GELU, as HF's; Liger runs the tanh GELU for all three).
        num_shards: as :class:`TiledSwiGLUMLP`'s.

    Raises:
        ValueError: another ``hidden_act``, or a bad ``num_shards`` (at construction).
    """

    _ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
