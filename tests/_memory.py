"""The CUDA peak-memory measurement shared by the ``in_place`` tests (fused add + RMSNorm, PolyNorm)."""

import torch

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
