"""Counting the matmul work of a call (the fused LM-head losses' tests: how many head matmuls a forward and backward
runs). CPU-only friendly: a TorchDispatchMode sees every aten matmul, whatever runs it (autograd's backward included).
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_MATMULS = (torch.ops.aten.mm.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.default, torch.ops.aten.addmm.out,
            torch.ops.aten.addmm_.default)


class MatmulFlops(TorchDispatchMode):
    """``with MatmulFlops() as count: ...``; then ``count.flops``: 2 m n k summed over the 2-D matmuls (mm, addmm,
    in place or not) run inside (bmm / matmul decompose to these for 2-D operands)."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _MATMULS:
            a, b = args[-2], args[-1]
            self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return func(*args, **(kwargs or {}))


def head_matmuls(fn, tokens: int, hidden: int, vocab: int) -> float:
    """The matmul work of ``fn()`` in units of one LM-head matmul, 2 * tokens * hidden * vocab FLOPs."""
    with MatmulFlops() as count:
        fn()
    return count.flops / (2 * tokens * hidden * vocab)
