"""Memory measurements of the tests: the CUDA peak shared by the ``in_place`` tests (fused add + RMSNorm, PolyNorm);
the CPU tensor bytes of a block of code (:class:`CpuTensorBytes`: the generic matcher's probes of a weightless
model)."""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tigon.workflows.timing import peak_extra_bytes


def in_place_saving(loss_of) -> int:
    """Bytes by which the backward's peak allocation is lower with ``in_place`` than without (CUDA only).

    ``loss_of(in_place)`` runs the op's forward on fresh leaves and returns a scalar loss; each backward's peak is
    measured above what is allocated before it (:func:`tigon.workflows.timing.peak_extra_bytes`). One backward with
    ``in_place`` runs first: it calibrates :mod:`tigon.kernels.grad_ownership` and warms the kernels.
    """
    loss_of(True).backward()
    cuda = torch.device("cuda")

    def peak(in_place):
        loss = loss_of(in_place)
        return peak_extra_bytes(loss.backward, [], cuda)

    return peak(False) - peak(True)


class CpuTensorBytes(TorchDispatchMode):
    """``with CpuTensorBytes() as m:`` the bytes of the CPU tensor storages that the ops run in the block create:
    ``m.peak`` (the most alive at once; a storage counts from the op that returns it first until it is freed) and
    ``m.total`` (all of them). PyTorch has no allocator statistics on the CPU, and the process's RSS moves with the
    Python objects and the allocator's caching; the ops' outputs are exact. Views count once (their storage)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = self.total = 0
        self._seen: set[int] = set()

    def _freed(self, key: int, n: int) -> None:
        self.live -= n
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and id(t.untyped_storage()) not in self._seen:
                st = t.untyped_storage()
                n = st.nbytes()
                self._seen.add(id(st))
                self.live, self.total = self.live + n, self.total + n
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self._freed, id(st), n)
        return out
