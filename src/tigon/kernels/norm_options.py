"""The grouped / gated options of the norm kernels (:mod:`tigon.kernels.norm`): their checks and the launch keywords
they add (the gated RMSNorm's groups and gate-first order; the other norms' launches keep their arguments)."""

from __future__ import annotations


NO_FLAGS: dict = {}
"""No option keywords (an ungrouped, ungated launch)."""


def gated_flags(gate, is_rms: bool, n_groups: int, gate_first: bool) -> dict:
    """The kernels' GROUPED / GATE_FIRST keywords, only those set (the other norms' launches keep their arguments);
    ValueError for gate_first without a gate or for LayerNorm."""
    if gate_first and (gate is None or not is_rms):
        raise ValueError("gate_first is for the gated RMSNorm only (a gate, is_rms)")
    return {**(dict(n_groups=n_groups, GROUPED=True) if n_groups != 1 else {}),
            **(dict(GATE_FIRST=True) if gate_first else {})}


def check_groups(n: int, n_groups: int, supported: bool) -> None:
    """Raise ValueError unless rows of ``n`` elements split into ``n_groups`` groups the kernels can normalise."""
    if not supported:
        raise ValueError("grouped statistics (n_groups != 1) are for the RMSNorm without residual or bias only")
    if n_groups < 1 or n % n_groups:
        raise ValueError(f"n_groups must be a positive divisor of the last dimension ({n}), got {n_groups}")
