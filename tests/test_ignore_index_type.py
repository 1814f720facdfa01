"""``ignore_index`` must be an int on every path (:func:`tigon._checks.integer`): ``int()`` truncated a float on the
kernel path while the reference compared it as given."""

import pytest
import torch

from tigon import functional as F


@pytest.mark.parametrize("bad", [-100.5, True, "-100", None])
@pytest.mark.parametrize("op", ["cross_entropy", "fused_linear_cross_entropy"])
def test_ignore_index_must_be_an_int(op, bad):
    """``ignore_index=-100.5`` was truncated to -100 by ``int()`` on the kernel path (those labels ignored), where the
    reference compared the labels with -100.5 (nothing ignored): now a TypeError naming the argument, on every path.
    A numpy integer or a one-element integer tensor is an int."""
    import numpy as np

    x, t = torch.randn(4, 8, requires_grad=True), torch.tensor([1, -100, 3, 0])
    w = torch.randn(8, 6)
    call = ((lambda ii: F.cross_entropy(x, t, ignore_index=ii)) if op == "cross_entropy" else
            (lambda ii: F.fused_linear_cross_entropy(x[:, :6], w, t, ignore_index=ii)))
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        call(bad)
    want = call(-100)
    for ok in (np.int64(-100), torch.tensor(-100)):
        torch.testing.assert_close(call(ok), want)


@pytest.mark.parametrize("bad", [-100.5, False])
@pytest.mark.parametrize("op", ["jsd", "tvd"])
def test_divergence_ignore_index_must_be_an_int(op, bad):
    """A float ``ignore_index`` was truncated by ``int()`` on the kernel path (-100.5 ignored the label -100) but
    compared as given by the reference: a TypeError naming the argument now."""
    x = torch.randn(3, 7).log_softmax(-1).requires_grad_()
    y = torch.randn(3, 7).log_softmax(-1)
    fn = getattr(F, op)
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        fn(x, y, torch.tensor([0, -100, 2]), ignore_index=bad)
