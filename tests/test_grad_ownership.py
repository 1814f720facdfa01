"""tigon.kernels.grad_ownership: the in_place backwards' check that nothing but autograd holds the incoming gradient,
against counts measured on the same call path (per device type), never assumed."""

import torch

from tigon import functional as F
from tigon.kernels import grad_ownership


def _written_over(device, in_place=True):
    """Whether X's gradient of ``(poly_norm(X) * c).sum()`` is the memory of the output's incoming gradient."""
    x = torch.randn(3, 5, 40, device=device, requires_grad=True)
    w, b = torch.rand(3, device=device) + 0.2, torch.randn((), device=device)
    c = torch.randn(3, 5, 40, device=device)
    seen = []
    y = F.poly_norm(x, w, b, in_place=in_place)
    y.register_hook(lambda g: seen.append(g.data_ptr()))  # keeps no reference to g
    (y * c).sum().backward()
    return x.grad.data_ptr() == seen[0]


def test_counts_are_measured_per_device_type_and_must_match_exactly(device, monkeypatch):
    assert _written_over(device) and not _written_over(device, in_place=False)
    kind = torch.device(device).type
    base = grad_ownership._BASELINES[kind]  # measured by the first in_place forward on this device type
    assert len(base) == 3 and min(base) >= 1, base
    # one owner more or fewer in any count than the probe's (torch 2.11's PyNode::apply keeps a second C++
    # reference that 2.12+ drops: a constant would be wrong on one of them): not owned, a new buffer
    for i in range(3):
        for delta in (-1, 1):
            off = list(base)
            off[i] += delta
            monkeypatch.setitem(grad_ownership._BASELINES, kind, tuple(off))
            assert not _written_over(device)
    monkeypatch.setitem(grad_ownership._BASELINES, kind, grad_ownership._NEVER)  # a probe that failed
    assert not _written_over(device)


def test_not_owned_without_a_baseline_for_the_device_type(monkeypatch):
    monkeypatch.setattr(grad_ownership, "_BASELINES", {})
    assert not grad_ownership.owns_grad(torch.zeros(4), torch.float32)
    with torch.inference_mode():
        grad_ownership.prepare(torch.device("cpu"))  # no autograd to probe: nothing measured
    assert grad_ownership._BASELINES == {}
    grad_ownership.prepare(torch.device("cpu"))
    assert set(grad_ownership._BASELINES) == {"cpu"} and min(grad_ownership._BASELINES["cpu"]) >= 1
