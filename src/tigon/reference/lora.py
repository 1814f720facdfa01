"""A linear layer with a low-rank adapter (LoRA, Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models"): ``y = x W^T + b + s (x A^T) B^T``.

What PEFT's ``lora.Linear`` computes for one active adapter without dropout and without DoRA:
``base_layer(x) + lora_B(lora_A(x)) * scaling``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import _checks
from .glu import GLU_ACTIVATIONS, glu_product


def check_inputs(x, weight, lora_a, lora_b, bias, scaling) -> float:
    """Validate :func:`lora_linear`'s arguments; returns ``scaling`` as a float.

    Raises:
        TypeError: a non-floating tensor, or scaling not a real number.
        ValueError: x is 0-d; weight, lora_a, lora_b, bias of shapes that do not fit (named in the message);
            tensors on different devices; scaling not finite.
    """
    _checks.tensor("x", x, floating=True)
    _checks.tensor("weight", weight, floating=True, ndim=2)
    _checks.tensor("lora_a", lora_a, floating=True, ndim=2)
    _checks.tensor("lora_b", lora_b, floating=True, ndim=2)
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (..., in_features), got a 0-d tensor")
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension must be weight's in_features {k}, got x of shape {tuple(x.shape)}")
    r = lora_a.shape[0]
    if lora_a.shape[1] != k:
        raise ValueError(f"lora_a must have shape (rank, {k}), got {tuple(lora_a.shape)}")
    if tuple(lora_b.shape) != (n, r):
        raise ValueError(f"lora_b must have shape ({n}, {r}) (out_features, rank), got {tuple(lora_b.shape)}")
    if bias is not None:
        _checks.tensor("bias", bias, floating=True, ndim=1)
        if bias.shape[0] != n:
            raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    _checks.same_device(x=x, weight=weight, lora_a=lora_a, lora_b=lora_b, bias=bias)
    return _checks.number("scaling", scaling)


def lora_linear(x: torch.Tensor, weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor,
                bias: torch.Tensor | None = None, *, scaling: float = 1.0) -> torch.Tensor:
    """``linear(x, weight, bias) + scaling * linear(linear(x, lora_a), lora_b)``, as PEFT's LoRA layer forms it.

    Args:
        x: (..., K) float tensor.
        weight: (N, K) frozen base weight (``nn.Linear`` layout); bias: (N,) or None.
        lora_a: (r, K) down-projection A; lora_b: (N, r) up-projection B.
        scaling: s = lora_alpha / r (or lora_alpha / sqrt(r) with rsLoRA).

    Returns:
        (..., N) in the dtype torch's linear gives (x's, or the autocast dtype under autocast).

    Raises:
        TypeError, ValueError: see :func:`check_inputs`.
    """
    s = check_inputs(x, weight, lora_a, lora_b, bias, scaling)
    return F.linear(x, weight, bias) + F.linear(F.linear(x, lora_a), lora_b) * s


def _check_down(x, i: int, down_weight, down_a, down_b, down_bias, down_scaling) -> float:
    """Validate the down projection of a LoRA MLP of intermediate size ``i`` on x (..., H); returns its scaling."""
    _checks.tensor("down_weight", down_weight, floating=True, ndim=2)
    if down_weight.shape != (x.shape[-1], i):
        raise ValueError(f"down_weight must have shape ({x.shape[-1]}, {i}) (hidden, intermediate), got "
                         f"{tuple(down_weight.shape)}")
    for name, t in (("down_a", down_a), ("down_b", down_b)):
        _checks.tensor(name, t, floating=True, ndim=2)
    r = down_a.shape[0]
    if down_a.shape[1] != i:
        raise ValueError(f"down_a must have shape (rank, {i}) (rank, intermediate), got {tuple(down_a.shape)}")
    if tuple(down_b.shape) != (x.shape[-1], r):
        raise ValueError(f"down_b must have shape ({x.shape[-1]}, {r}) (hidden, rank), got {tuple(down_b.shape)}")
    if down_bias is not None:
        _checks.tensor("down_bias", down_bias, floating=True, ndim=1)
        if down_bias.shape[0] != x.shape[-1]:
            raise ValueError(f"down_bias must have shape ({x.shape[-1]},), got {tuple(down_bias.shape)}")
    _checks.same_device(x=x, down_weight=down_weight, down_a=down_a, down_b=down_b, down_bias=down_bias)
    return _checks.number("down_scaling", down_scaling)


def check_mlp_inputs(x, gate_weight, gate_a, gate_b, up_weight, up_a, up_b, down_weight, down_a, down_b,
                     gate_bias, up_bias, down_bias, gate_scaling, up_scaling, down_scaling,
                     activation) -> tuple[float, float, float]:
    """Validate :func:`lora_glu_mlp`'s arguments; returns the three scalings as floats.

    Raises:
        TypeError: a non-floating tensor, or a scaling that is not a real number.
        ValueError: shapes that do not fit (the message names the argument), tensors on different devices, a scaling
            that is not finite, or an unknown activation.
    """
    _checks.choice("activation", activation, GLU_ACTIVATIONS)
    try:
        s_g = check_inputs(x, gate_weight, gate_a, gate_b, gate_bias, gate_scaling)
    except ValueError as e:
        raise ValueError(f"gate projection: {e} (gate_weight, gate_a, gate_b, gate_bias)") from None
    try:
        s_u = check_inputs(x, up_weight, up_a, up_b, up_bias, up_scaling)
    except ValueError as e:
        raise ValueError(f"up projection: {e} (up_weight, up_a, up_b, up_bias)") from None
    if up_weight.shape != gate_weight.shape:
        raise ValueError(f"up_weight must have gate_weight's shape {tuple(gate_weight.shape)}, got "
                         f"{tuple(up_weight.shape)}")
    s_d = _check_down(x, gate_weight.shape[0], down_weight, down_a, down_b, down_bias, down_scaling)
    return s_g, s_u, s_d


def lora_glu_mlp(x: torch.Tensor, gate_weight: torch.Tensor, gate_a: torch.Tensor, gate_b: torch.Tensor,
                 up_weight: torch.Tensor, up_a: torch.Tensor, up_b: torch.Tensor, down_weight: torch.Tensor,
                 down_a: torch.Tensor, down_b: torch.Tensor, *, gate_bias: torch.Tensor | None = None,
                 up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                 gate_scaling: float = 1.0, up_scaling: float = 1.0, down_scaling: float = 1.0,
                 activation: str = "silu") -> torch.Tensor:
    """A gated MLP whose three projections carry LoRA adapters: ``down(act(gate(x)) * up(x))`` with each projection
    ``lora_linear`` (GLU variants, Shazeer 2020; LoRA, Hu et al. 2021).

    What HF LlamaMLP (GemmaMLP with a GELU) computes after PEFT wraps gate_proj, up_proj and down_proj in
    ``lora.Linear`` layers with one active adapter, no dropout and no DoRA.

    Args:
        x: (..., H) float tensor.
        gate_weight, up_weight: (I, H) base weights; down_weight: (H, I).
        gate_a, up_a: (r_g, H), (r_u, H); gate_b, up_b: (I, r_g), (I, r_u); down_a: (r_d, I); down_b: (H, r_d).
        gate_bias, up_bias: (I,) or None; down_bias: (H,) or None.
        gate_scaling, up_scaling, down_scaling: each adapter's s (PEFT's ``scaling[adapter]``).
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh-approximate GELU).

    Returns:
        (..., H) in the dtype torch's linear gives.

    Raises:
        TypeError, ValueError: see :func:`check_mlp_inputs`.
    """
    s_g, s_u, s_d = check_mlp_inputs(x, gate_weight, gate_a, gate_b, up_weight, up_a, up_b, down_weight, down_a,
                                     down_b, gate_bias, up_bias, down_bias, gate_scaling, up_scaling, down_scaling,
                                     activation)
    gate = lora_linear(x, gate_weight, gate_a, gate_b, gate_bias, scaling=s_g)
    up = lora_linear(x, up_weight, up_a, up_b, up_bias, scaling=s_u)
    product = glu_product(gate, up, activation)
    return lora_linear(product, down_weight, down_a, down_b, down_bias, scaling=s_d)


def check_gate_up_mlp_inputs(x, gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b, gate_up_bias,
                             down_bias, gate_up_scaling, down_scaling, activation) -> tuple[float, float]:
    """Validate :func:`lora_gate_up_mlp`'s arguments; returns the two scalings as floats.

    Raises:
        TypeError: a non-floating tensor, or a scaling that is not a real number.
        ValueError: shapes that do not fit (the message names the argument; gate_up_weight's out_features must be
            even), tensors on different devices, a scaling that is not finite, or an unknown activation.
    """
    _checks.choice("activation", activation, GLU_ACTIVATIONS)
    try:
        s_gu = check_inputs(x, gate_up_weight, gate_up_a, gate_up_b, gate_up_bias, gate_up_scaling)
    except ValueError as e:
        raise ValueError(f"gate-up projection: {e} (gate_up_weight, gate_up_a, gate_up_b, gate_up_bias)") from None
    if gate_up_weight.shape[0] % 2:
        raise ValueError("gate_up_weight must have an even number of rows (2 x intermediate: gate's rows, then up's), "
                         f"got {tuple(gate_up_weight.shape)}")
    s_d = _check_down(x, gate_up_weight.shape[0] // 2, down_weight, down_a, down_b, down_bias, down_scaling)
    return s_gu, s_d


def lora_gate_up_mlp(x: torch.Tensor, gate_up_weight: torch.Tensor, gate_up_a: torch.Tensor,
                     gate_up_b: torch.Tensor, down_weight: torch.Tensor, down_a: torch.Tensor, down_b: torch.Tensor,
                     *, gate_up_bias: torch.Tensor | None = None, down_bias: torch.Tensor | None = None,
                     gate_up_scaling: float = 1.0, down_scaling: float = 1.0, activation: str = "silu") -> torch.Tensor:
    """A gated MLP with one fused gate-up projection, both projections carrying LoRA adapters:
    ``gate, up = gate_up(x).chunk(2, -1)``, ``down(act(gate) * up)``, each projection ``lora_linear``.

    What HF Phi3MLP (and Glm4MLP) computes after PEFT wraps gate_up_proj and down_proj in ``lora.Linear`` layers with
    one active adapter, no dropout and no DoRA (``up_states * activation_fn(gate)``, the same product).

    Args:
        x: (..., H) float tensor.
        gate_up_weight: (2 I, H) base weight, gate's I rows then up's; down_weight: (H, I).
        gate_up_a: (r_gu, H); gate_up_b: (2 I, r_gu); down_a: (r_d, I); down_b: (H, r_d).
        gate_up_bias: (2 I,) or None; down_bias: (H,) or None.
        gate_up_scaling, down_scaling: each adapter's s (PEFT's ``scaling[adapter]``).
        activation: ``"silu"`` (SwiGLU), ``"gelu"`` (exact GELU) or ``"gelu_tanh"`` (tanh-approximate GELU).

    Returns:
        (..., H) in the dtype torch's linear gives.

    Raises:
        TypeError, ValueError: see :func:`check_gate_up_mlp_inputs`.
    """
    s_gu, s_d = check_gate_up_mlp_inputs(x, gate_up_weight, gate_up_a, gate_up_b, down_weight, down_a, down_b,
                                         gate_up_bias, down_bias, gate_up_scaling, down_scaling, activation)
    gate, up = lora_linear(x, gate_up_weight, gate_up_a, gate_up_b, gate_up_bias, scaling=s_gu).chunk(2, dim=-1)
    return lora_linear(glu_product(gate, up, activation), down_weight, down_a, down_b, down_bias, scaling=s_d)
