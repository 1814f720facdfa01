"""The glue around a mixture-of-experts layer's grouped matmuls, as transformers computes it (``integrations/moe.py``,
``grouped_mm_experts_forward``, v5): the gather of the routed tokens, the per-expert bias and gate between the two
matmuls, and the weighted combine after them.

Notation: T tokens routed to k experts each, S = T k (token, slot) pairs sorted by expert into rows 0..S-1.
``positions`` (T, k): the sorted row of pair (t, j), i.e. HF's ``inv_perm`` viewed (T, k) (``perm`` being
``torch.sort(top_k_index.reshape(-1))``'s indices); it must be a permutation of 0..S-1. ``offsets`` (E,): grouped_mm's
``offs``, the cumulative rows per expert (nondecreasing): row s belongs to expert ``#{e: offsets[e] <= s}``; rows at
or past ``offsets[-1]`` (expert-parallel sentinel rows) belong to none and get no bias.

These functions check both on the host (a sort; not under torch.compile): they are the specification and the CPU
fallback, not the fast path.
"""

from __future__ import annotations

import torch

from .._checks import has_data
from . import glu

GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "clamped_swiglu")


def check_positions(positions: torch.Tensor) -> None:
    """Raise ValueError unless ``positions`` (T, k) holds each of 0..T*k-1 once (skipped for meta / fake tensors and
    under torch.compile, where a host check would split the graph)."""
    if torch.compiler.is_compiling() or not has_data(positions):
        return
    flat = positions.reshape(-1)
    if not torch.equal(torch.sort(flat).values, torch.arange(flat.numel(), device=flat.device, dtype=flat.dtype)):
        raise ValueError("positions must hold each sorted row 0 .. T*k-1 exactly once (the inverse of the sort of the "
                         "routed (token, slot) pairs by expert)")


def check_offsets(offsets: torch.Tensor) -> None:
    """Raise ValueError unless ``offsets`` (E,) is nondecreasing and nonnegative (skipped as :func:`check_positions`
    is)."""
    if torch.compiler.is_compiling() or not has_data(offsets) or offsets.numel() == 0:
        return
    if bool((offsets[1:] < offsets[:-1]).any()) or int(offsets[0]) < 0:
        raise ValueError("offsets must be nonnegative and nondecreasing (cumulative rows per expert, as grouped_mm's)")


def check_host(positions: torch.Tensor | None, offsets: torch.Tensor | None) -> None:
    """The kernel path's checks of CPU ``positions`` (a permutation) and ``offsets`` (nonnegative, nondecreasing), as
    the reference's: in the eager ops, and inside the ``tigon::moe_*`` custom ops under torch.compile (on the real
    tensors at run time; none while tracing). CUDA ones are not read (a device sync per call): the kernels then read
    and write nothing out of bounds (a position outside [0, T*k) is skipped, the offsets clamped to the rows), but
    such inputs give undefined values.

    Raises:
        ValueError: as :func:`check_positions` / :func:`check_offsets`.
    """
    if positions is not None and positions.is_cpu:
        check_positions(positions)
    if offsets is not None and offsets.is_cpu:
        check_offsets(offsets)


def row_bias(bias: torch.Tensor, offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """(rows, N): each sorted row's expert bias, zero for rows of no expert (HF's ``bias[expert_ids_g]``)."""
    e = torch.searchsorted(offsets.contiguous(), torch.arange(rows, device=offsets.device, dtype=offsets.dtype),
                           right=True)
    return torch.cat([bias, bias.new_zeros((1, bias.shape[1]))])[e]


def moe_gather(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The routed tokens in sorted order: ``out[positions[t, j]] = x[t]``, HF's ``hidden_states[perm // num_top_k]``.

    Args:
        x: (T, H) float. positions: (T, k) integer, a permutation of 0..T*k-1.

    Returns:
        (T*k, H) in x's dtype.
    """
    check_positions(positions)
    k = positions.shape[1]
    flat = positions.reshape(-1)
    perm = torch.empty_like(flat)
    perm[flat] = torch.arange(flat.numel(), device=flat.device, dtype=flat.dtype)
    return x[perm // k]


def moe_expert_gate(gate_up: torch.Tensor, offsets: torch.Tensor, bias: torch.Tensor | None = None,
                    activation: str = "silu", alpha: float = 1.702, limit: float | None = None) -> torch.Tensor:
    """The experts' gate on the up grouped matmul's output: ``act(gate_up[s] + bias[e(s)])``, HF's
    ``_grouped_linear(..., bias=gate_up_proj_bias[expert_ids_g])`` (``out.add_(bias)``) then ``self._apply_gate``.

    Activations: ``"silu"`` / ``"gelu"`` / ``"gelu_tanh"``: transformers' ``_default_apply_gate``, ``act_fn(gate) *
    up`` on the chunked halves [gate; up] (``limit``: DeepSeek-V4's clamps first, SiLU only,
    :func:`tigon.reference.glu.swiglu`); ``"clamped_swiglu"``: GPT-OSS's on interleaved columns with ``alpha`` and
    ``limit`` (:func:`tigon.reference.glu.clamped_swiglu`).

    Args:
        gate_up: (S, 2I) float, rows sorted by expert. offsets: (E,) integer. bias: (E, 2I) or None.

    Returns:
        (S, I) in gate_up's dtype, computed in it as HF does.

    Raises:
        ValueError: unknown activation; ``limit`` None with ``"clamped_swiglu"``, or given with GELU.
    """
    check_offsets(offsets)
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(f"activation must be one of {GATE_ACTIVATIONS}, got {activation!r}")
    if bias is not None:
        gate_up = gate_up + row_bias(bias, offsets, gate_up.shape[0]).to(gate_up.dtype)
    if activation == "clamped_swiglu":
        if limit is None:
            raise ValueError("activation='clamped_swiglu' (GPT-OSS) needs a limit")
        return glu.clamped_swiglu(gate_up, alpha, limit)
    gate, up = gate_up.chunk(2, dim=-1)
    return glu.glu_product(gate, up, activation, limit=limit)


def moe_combine(x: torch.Tensor, weights: torch.Tensor, positions: torch.Tensor, offsets: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """The experts' outputs weighted and summed per token: ``out[t] = sum_j (x[p] + bias[e(p)]) * weights[t, j]``,
    p = positions[t, j]; HF's ``out.add_(down_proj_bias[expert_ids_g])``, ``proj_out * sample_weights_g``,
    ``weighted_out[inv_perm]`` and ``.view(T, k, H).sum(dim=1)`` (in the promoted dtype of x and the weights), cast
    to x's dtype.

    Args:
        x: (T*k, H) float, the down grouped matmul's output in sorted rows. weights: (T, k) float, the routing weights
        in token order (HF's ``top_k_weights``). positions: (T, k) integer. offsets: (E,) integer, needed with bias.
        bias: (E, H) or None.

    Returns:
        (T, H) in x's dtype.
    """
    check_positions(positions)
    T, k = positions.shape
    if bias is not None:
        if offsets is None:
            raise ValueError("bias needs offsets (the rows of each expert)")
        check_offsets(offsets)
        x = x + row_bias(bias, offsets, x.shape[0]).to(x.dtype)
    weighted = x[positions.reshape(-1)] * weights.reshape(-1, 1)
    return weighted.view(T, k, x.shape[-1]).sum(dim=1).to(x.dtype)
