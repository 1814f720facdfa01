"""Error metrics and the comparison harness behind the tests and ``tigon verify``.

The policy (developers' guide): compare both the Tigon op and the original PyTorch implementation, at the
same dtype, against a float64 evaluation of the original. Tigon passes a tensor when its relative L2 error is
at most ``max(factor * original_error, floor[dtype])``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Mapping, Sequence

import torch

# Error floors: only bite when the original is (nearly) exact at that dtype, e.g. an op that only permutes.
FLOOR = {torch.float32: 1e-5, torch.bfloat16: 1e-4, torch.float16: 2e-5, torch.float64: 1e-12}


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref||_2 / ||ref||_2 in float64 (0 when both are zero; inf on NaN/inf in x or a shape mismatch)."""
    if x.shape != ref.shape:
        return float("inf")
    x64, r64 = x.detach().to(torch.float64), ref.detach().to(torch.float64)
    if not torch.isfinite(x64).all():
        return float("inf")
    den = torch.linalg.vector_norm(r64).item()
    num = torch.linalg.vector_norm(x64 - r64).item()
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def max_abs(x: torch.Tensor, ref: torch.Tensor) -> float:
    """max |x - ref| in float64 (inf on a shape mismatch or non-finite values)."""
    if x.shape != ref.shape:
        return float("inf")
    d = (x.detach().to(torch.float64) - ref.detach().to(torch.float64)).abs()
    return float(d.max().item()) if d.numel() else 0.0


@dataclass
class TensorCheck:
    """One compared tensor: the output (``"out"``, ``"out1"``...) or ``"grad_<input>"``; errors are relative L2."""

    tensor: str
    tigon_err: float
    original_err: float
    tigon_max_abs: float
    bound: float
    passed: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _run(fn, inputs, grad_names, upstream):
    leaves = {k: (v.detach().clone().requires_grad_(k in grad_names) if isinstance(v, torch.Tensor) else v)
              for k, v in inputs.items()}
    outs = _as_tuple(fn(**leaves))
    grads: dict[str, torch.Tensor] = {}
    diff = [(o, u) for o, u in zip(outs, upstream) if o is not None and o.requires_grad and u is not None]
    if grad_names and diff:
        wrt = [leaves[k] for k in grad_names]
        gs = torch.autograd.grad([o for o, _ in diff], wrt, [u.to(o.dtype) for o, u in diff], allow_unused=True)
        grads = {k: (g if g is not None else torch.zeros_like(leaves[k])) for k, g in zip(grad_names, gs)}
    return [o.detach() if o is not None else None for o in outs], grads


def compare(
    candidate: Callable,
    original: Callable,
    inputs: Mapping[str, object],
    grad_inputs: Sequence[str] = (),
    *,
    factor: float = 1.0,
    floor: float | None = None,
    upstream_seed: int = 0,
    differentiable_outputs: Sequence[int] | None = None,
    unit_upstream: bool = False,
) -> list[TensorCheck]:
    """Compare ``candidate`` and ``original`` (same keyword signature) against float64 ``original``.

    Args:
        candidate: the op under test, e.g. a Tigon function.
        original: the PyTorch implementation it replaces; also evaluated on float64 copies as the truth.
        inputs: keyword arguments; floating tensors are upcast to float64 for the truth, others passed as-is.
        grad_inputs: names of the inputs whose gradients are compared (every one the op produces).
        factor, floor: the pass rule ``err <= max(factor * original_err, floor)``; floor defaults to
            :data:`FLOOR` for the candidate's output dtype.
        upstream_seed: seed of the random (non-uniform) upstream gradients.
        differentiable_outputs: indices of the outputs that receive an upstream gradient (default: all float).
        unit_upstream: upstream gradients of 1 instead of random ones (``loss.backward()`` on a scalar loss).

    Returns:
        one :class:`TensorCheck` per output and per gradient.
    """
    truth_inputs = {k: (v.detach().to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                    for k, v in inputs.items()}
    with torch.no_grad():
        probe = _as_tuple(original(**truth_inputs))
    gen = torch.Generator(device="cpu").manual_seed(upstream_seed)
    upstream = []
    for i, o in enumerate(probe):
        use = (o is not None and o.is_floating_point()
               and (differentiable_outputs is None or i in differentiable_outputs))
        if not use:
            upstream.append(None)
        elif unit_upstream:
            upstream.append(torch.ones(o.shape, dtype=torch.float64, device=o.device))
        else:
            upstream.append(torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device))
    ref_out, ref_grads = _run(original, truth_inputs, list(grad_inputs), upstream)
    orig_out, orig_grads = _run(original, inputs, list(grad_inputs), upstream)
    cand_out, cand_grads = _run(candidate, inputs, list(grad_inputs), upstream)
    checks: list[TensorCheck] = []
    pairs = [(f"out{i if i else ''}", cand_out[i], orig_out[i], ref_out[i]) for i in range(len(ref_out))]
    pairs += [(f"grad_{k}", cand_grads.get(k), orig_grads.get(k), ref_grads.get(k)) for k in grad_inputs]
    for name, c, o, r in pairs:
        if r is None:
            continue
        if c is None:
            checks.append(TensorCheck(name, float("inf"), rel_l2(o, r), float("inf"), 0.0, False))
            continue
        if not r.is_floating_point():
            ok = torch.equal(c.to(r.dtype), r)
            checks.append(TensorCheck(name, 0.0 if ok else float("inf"), 0.0, 0.0, 0.0, ok))
            continue
        t_err, o_err = rel_l2(c, r), rel_l2(o, r)
        fl = floor if floor is not None else FLOOR.get(c.dtype, 1e-5)
        bound = max(factor * o_err, fl)
        checks.append(TensorCheck(name, t_err, o_err, max_abs(c, r), bound, t_err <= bound))
    return checks


def assert_close_to_truth(checks: list[TensorCheck]) -> None:
    """Raise AssertionError listing every failed :class:`TensorCheck` (used by the tests)."""
    bad = [c for c in checks if not c.passed]
    if bad:
        lines = [f"{c.tensor}: tigon {c.tigon_err:.3e} > bound {c.bound:.3e} (original {c.original_err:.3e})"
                 for c in bad]
        raise AssertionError("; ".join(lines))
