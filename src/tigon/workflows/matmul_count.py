"""How many LM-head matmuls a loss runs (:func:`head_matmuls`): the fused LM-head losses' tests and
``benchmarks/posttrain_breakdown.py`` check that a loss whose gradient is formed in its forward takes 3 head matmuls,
one that recomputes the logits in its backward 4."""

from __future__ import annotations

from typing import Callable

import torch

_MATMUL_COUNTER: list = []


def _matmul_counter():
    """The counting ``TorchDispatchMode`` class of :func:`head_matmuls`, defined once (per-call classes were seen to
    stop counting after a few uses)."""
    if not _MATMUL_COUNTER:
        from torch.utils._python_dispatch import TorchDispatchMode

        aten = torch.ops.aten
        # every overload: the dtype ones too (``torch.mm(a, b, out_dtype=torch.float32)``, the fused losses' fp32
        # gradient matmuls on CUDA), whose out_dtype argument comes after the operands
        matmuls = (aten.mm, aten.addmm, aten.addmm_)

        class MatmulFlops(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.flops = 0

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.overloadpacket in matmuls:
                    a, b = [t for t in args if isinstance(t, torch.Tensor)][-2:]
                    self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
                return func(*args, **(kwargs or {}))

        _MATMUL_COUNTER.append(MatmulFlops)
    return _MATMUL_COUNTER[0]


def head_matmuls(fn: Callable[[], object], tokens: int, hidden: int, vocab: int, compiled: bool = False) -> float:
    """The matmul work ``fn()`` runs (forward and whatever backward it calls), in units of one LM-head matmul of
    ``2 * tokens * hidden * vocab`` FLOPs: 2 m n k summed over every 2-D aten matmul (mm, addmm, in place or not,
    any overload: ``out_dtype`` too),
    seen by a ``TorchDispatchMode`` below autograd, so the backward's matmuls count too. What the fused LM-head
    losses' tests and ``benchmarks/posttrain_breakdown.py`` use to check how many head matmuls a loss takes (3 for a
    loss whose gradient is formed in its forward, 4 when its backward recomputes the logits).

    ``compiled``: ``fn`` calls a ``torch.compile``'d function. Dynamo does not run compiled frames under a Python
    dispatch mode (and a mode does not see inside a custom op), so the matmuls are read from the ``torch.profiler``
    events instead (their recorded shapes; a matmul inside another one's event is not counted twice)."""
    if compiled:
        return _profiled_matmul_flops(fn) / (2 * tokens * hidden * vocab)
    with _matmul_counter()() as count:
        fn()
    return count.flops / (2 * tokens * hidden * vocab)


def _profiled_matmul_flops(fn: Callable[[], object]) -> int:
    """2 m n k summed over the outermost aten mm / addmm events of a ``torch.profiler`` run of ``fn()``."""
    from torch.profiler import ProfilerActivity, profile

    names = {"aten::mm": 0, "aten::addmm": 1, "aten::addmm_": 1}  # -> index of the first operand in input_shapes
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    flops = 0
    for e in prof.events():
        if e.name not in names:
            continue
        parent = e.cpu_parent
        while parent is not None and parent.name not in names:
            parent = parent.cpu_parent
        if parent is None:
            a, b = e.input_shapes[names[e.name]: names[e.name] + 2]
            flops += 2 * a[0] * a[1] * b[1]
    return flops
