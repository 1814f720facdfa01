"""The non-gated MLP's down projection of its activation, ``linear(act(h), weight, bias)``.

Hugging Face's non-gated MLPs compute ``down(act(up(x)))``: GPT-NeoX / Pythia's
``dense_4h_to_h(act(dense_h_to_4h(x)))``, phi's and the CLIP / SigLIP vision towers' ``fc2(activation_fn(fc1(x)))``,
Falcon's, Nemotron's ``down_proj(relu2(up_proj(x)))``. This is that computation from the up projection's output ``h``
on, in h's dtype as HF runs it (GELU: Hendrycks & Gimpel 2016, "Gaussian Error Linear Units"; relu2: So et al. 2021,
"Primer").
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = ("gelu", "gelu_tanh", "relu2", "relu", "silu", "quick_gelu")
"""The activations of :func:`act_linear`: exact GELU (``x * Phi(x)``, HF ``gelu``), the tanh-approximate GELU (HF
``gelu_new`` / ``gelu_fast`` / ``gelu_pytorch_tanh``), squared ReLU (HF ``relu2``), ReLU, SiLU, and CLIP's
``quick_gelu`` (``x * sigmoid(1.702 x)``)."""


def activate(h: torch.Tensor, activation: str = "gelu") -> torch.Tensor:
    """``act(h)`` elementwise in h's dtype, for an activation of :data:`ACTIVATIONS` (torch's functions, as HF's
    activation modules call them; quick_gelu as HF's ``QuickGELUActivation``).

    Raises:
        ValueError: unknown ``activation``.
    """
    if activation == "gelu":
        return F.gelu(h)
    if activation == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    if activation == "relu2":
        return torch.square(F.relu(h))
    if activation == "relu":
        return F.relu(h)
    if activation == "silu":
        return F.silu(h)
    if activation == "quick_gelu":
        return h * torch.sigmoid(1.702 * h)
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def act_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               activation: str = "gelu") -> torch.Tensor:
    """``F.linear(act(h), weight, bias)``: a non-gated MLP's ``down(act(h))`` with ``h = up(x)``.

    Args:
        h: (..., I) float tensor, the up projection's output.
        weight: (H, I) (``nn.Linear`` layout); bias: (H,) or None.
        activation: one of :data:`ACTIVATIONS`.

    Returns:
        (..., H) in torch's type-promotion result of act(h) and the weight (under autocast, its dtype).

    Raises:
        ValueError: unknown ``activation``.
    """
    return F.linear(activate(h, activation), weight, bias)
