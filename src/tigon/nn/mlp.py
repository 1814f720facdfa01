"""Gated MLPs with HF ``LlamaMLP`` parameter names: ``down_proj(act(gate_proj(x)) * up_proj(x))``."""

from __future__ import annotations

import torch
from torch import nn

from .. import _checks
from .. import functional as TF


def _is_config(obj) -> bool:
    """Whether ``obj`` is a model config (it has ``hidden_size``), as Liger's MLPs take, rather than a width."""
    return not isinstance(obj, (int, torch.Tensor)) and hasattr(obj, "hidden_size")


class _GatedMLP(nn.Module):
    """The shared constructor: ``(config, intermediate_size=None, bias=False, *, hidden_size=None, ...)`` where
    ``config`` is a model config (Liger's form) or the hidden size itself (Tigon's ``(hidden_size,
    intermediate_size)`` form); the two are told apart by type."""

    def __init__(self, config=None, intermediate_size: int | None = None, bias: bool = False, *,
                 hidden_size: int | None = None, device=None, dtype=None):
        super().__init__()
        if _is_config(config):
            if hidden_size is not None:
                raise TypeError(f"{type(self).__name__}: give a config or hidden_size, not both (the config's "
                                f"hidden_size is {config.hidden_size!r})")
            hidden_size = _checks.size("config.hidden_size", config.hidden_size)
            if intermediate_size is None:
                intermediate_size = _checks.size("config.intermediate_size",
                                                 getattr(config, "intermediate_size", None))
            self.config = config
        else:
            if config is not None and hidden_size is not None:
                raise TypeError(f"{type(self).__name__}: hidden_size given twice ({config!r} positionally and "
                                f"{hidden_size!r} by keyword)")
            if config is None and hidden_size is None:
                raise TypeError(f"{type(self).__name__} needs a model config (with hidden_size and "
                                "intermediate_size) or hidden_size and intermediate_size")
            hidden_size = _checks.size("hidden_size", hidden_size if config is None else config)
            if intermediate_size is None:
                raise TypeError(f"{type(self).__name__}(hidden_size, intermediate_size) needs intermediate_size (or "
                                "pass a model config, as Liger's module takes)")
            self.config = None
        intermediate_size = _checks.size("intermediate_size", intermediate_size)
        _checks.flag("bias", bias)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        kw = {"bias": bias, "device": device, "dtype": dtype}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}"


def _activation(config) -> str | None:
    """The config's activation name: Gemma 2+'s ``hidden_activation``, else ``hidden_act`` (None when neither)."""
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)


class SwiGLUMLP(_GatedMLP):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020; HF LlamaMLP with ``hidden_act="silu"``).

    The activation-product runs in :func:`tigon.functional.swiglu`; the projections are ``nn.Linear``.

    Drop-in for Liger-Kernel's ``LigerSwiGLUMLP(config, intermediate_size=None)`` (and ``LigerMLP(config)``): a
    model config gives ``hidden_size``, ``intermediate_size`` (unless given) and ``hidden_act``, which must be
    ``"silu"`` or ``"swish"`` (Liger's check; a config without one is taken as SiLU); no bias, as Liger's, unless
    ``bias=True``. Tigon's form ``SwiGLUMLP(hidden_size, intermediate_size, bias=False)`` works too: the first
    argument is a config (an object with ``hidden_size``) or an int, told apart by type. ``self.config`` is the
    config (None in Tigon's form).

    Args:
        config: a model config (``hidden_size``, ``intermediate_size``, ``hidden_act``), or the hidden size (a
            positive int).
        intermediate_size: the MLP width; None: the config's (required in the int form).
        bias: bias on all three projections (HF ``mlp_bias``; Liger's module has none).
        hidden_size: keyword-only, the hidden size when no config is given (``SwiGLUMLP(hidden_size=64,
            intermediate_size=160)``).
        device, dtype: of the parameters (keyword-only).

    Shapes and dtypes:
        input (..., hidden_size) in the parameters' dtype; output (..., hidden_size), same dtype.

    Raises:
        TypeError: a size that is not an int, bias not a bool, or neither a config nor sizes (at construction).
        ValueError: a size < 1, or a config whose ``hidden_act`` is not silu / swish (at construction).
    """

    def __init__(self, config=None, intermediate_size: int | None = None, bias: bool = False, *,
                 hidden_size: int | None = None, device=None, dtype=None):
        super().__init__(config, intermediate_size, bias, hidden_size=hidden_size, device=device, dtype=dtype)
        if self.config is not None and getattr(self.config, "hidden_act", None) not in (None, "silu", "swish"):
            raise ValueError(f"SwiGLUMLP needs config.hidden_act 'silu' or 'swish' (as Liger's LigerSwiGLUMLP), got "
                             f"{getattr(self.config, 'hidden_act', None)!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(TF.swiglu(self.gate_proj(x), self.up_proj(x)))


_GELU_APPROXIMATE = {"gelu_pytorch_tanh": "tanh", "gelu_new": "tanh", "gelu": "none"}


class GeGLUMLP(_GatedMLP):
    """``down_proj(gelu(gate_proj(x)) * up_proj(x))`` (Shazeer 2020; HF GemmaMLP with ``gelu_pytorch_tanh``).

    The activation-product runs in :func:`tigon.functional.geglu`.

    Drop-in for Liger-Kernel's ``LigerGEGLUMLP(config)``: a model config gives ``hidden_size``,
    ``intermediate_size`` and the activation (``hidden_activation``, Gemma 2+'s name, else ``hidden_act``):
    ``"gelu_pytorch_tanh"`` / ``"gelu_new"`` run the tanh GELU (Liger's, whatever the config says), ``"gelu"`` the
    exact one (as HF; Liger runs the tanh GELU there too), None the tanh GELU. Tigon's form
    ``GeGLUMLP(hidden_size, intermediate_size, bias=False, approximate="tanh")`` works too, told apart by type as
    in :class:`SwiGLUMLP`.

    Args:
        config, intermediate_size, bias, hidden_size, device, dtype: as :class:`SwiGLUMLP`.
        approximate: ``"tanh"`` (HF ``gelu_pytorch_tanh`` / ``gelu_new``) or ``"none"`` (exact ``gelu``); None
            (default): the config's activation, else ``"tanh"``.

    Shapes and dtypes:
        input (..., hidden_size) in the parameters' dtype; output (..., hidden_size), same dtype.

    Raises:
        ValueError: unknown ``approximate``, a config's activation that is not a GELU above, or ``approximate``
            other than the config's activation (at construction); as :class:`SwiGLUMLP` for the sizes.
    """

    def __init__(self, config=None, intermediate_size: int | None = None, bias: bool = False,
                 approximate: str | None = None, *, hidden_size: int | None = None, device=None, dtype=None):
        if approximate not in (None, "tanh", "none"):
            raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
        super().__init__(config, intermediate_size, bias, hidden_size=hidden_size, device=device, dtype=dtype)
        act = _activation(self.config) if self.config is not None else None
        if act is not None:
            if act not in _GELU_APPROXIMATE:
                raise ValueError(f"GeGLUMLP needs the config's activation in {sorted(_GELU_APPROXIMATE)}, got "
                                 f"{act!r}")
            if approximate is not None and approximate != _GELU_APPROXIMATE[act]:
                raise ValueError(f"approximate={approximate!r} contradicts the config's activation {act!r} "
                                 f"(approximate={_GELU_APPROXIMATE[act]!r}); leave approximate None")
            approximate = _GELU_APPROXIMATE[act]
        self.approximate = approximate if approximate is not None else "tanh"

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
        # Gemma 2+'s hidden_activation first (what HF's GemmaMLP there reads), as SwiGLUMLP / GeGLUMLP do
        act = _activation(config)
        if act is not None and act not in self._ACTS:
            raise ValueError(f"{type(self).__name__} needs config.hidden_act (or hidden_activation) in "
                             f"{sorted(self._ACTS)}, got {act!r}")
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
        config: as :class:`TiledSwiGLUMLP`'s, ``hidden_activation`` (Gemma 2+'s name, read first) or ``hidden_act``
            one of ``"gelu_pytorch_tanh"`` / ``"gelu_new"`` (tanh GELU, the default) or ``"gelu"`` (exact erf GELU,
            as HF's; Liger reads ``hidden_act`` only and runs the tanh GELU for all three).
        num_shards: as :class:`TiledSwiGLUMLP`'s.

    Raises:
        ValueError: another ``hidden_act``, or a bad ``num_shards`` (at construction).
    """

    _ACTS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}
