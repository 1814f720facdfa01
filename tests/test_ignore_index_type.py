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


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_narrow_targets_with_a_vocabulary_beyond_their_range(dtype):
    """The host-side range check compared ``target >= V`` with V cast to the targets' dtype (torch casts a Python
    int to the tensor's): int8 targets with V = 131 compared with -125, int16 ones with a 32768-word vocabulary
    (Mistral v0.3's) with -32768, and every valid target was reported "outside [0, V)". Narrow targets now give
    the int64 targets' results (cross-entropy, the fused head, DPO, GRPO), and a real bad target still raises."""
    from tigon import nn as tnn

    gen = torch.Generator().manual_seed(0)
    v = 131 if dtype == torch.int8 else 32768
    h = 8
    x, w = torch.randn(6, h, generator=gen), torch.randn(v, h, generator=gen) * 0.3
    t = torch.tensor([127, 3, -100, 0, 100, 64])
    narrow = t.to(dtype)
    torch.testing.assert_close(F.cross_entropy(x @ w.T, narrow), F.cross_entropy(x @ w.T, t))
    torch.testing.assert_close(F.fused_linear_cross_entropy(x, w, narrow), F.fused_linear_cross_entropy(x, w, t))
    dpo = tnn.FusedLinearDPOLoss(use_ref_model=False)
    torch.testing.assert_close(dpo(w, x.reshape(2, 3, h), narrow.reshape(2, 3))[0],
                               dpo(w, x.reshape(2, 3, h), t.reshape(2, 3))[0])
    grpo = tnn.FusedLinearGRPOLoss(beta=0.0)
    mask, adv = (t != -100).reshape(2, 3), torch.tensor([0.5, -1.0])
    ids = t.clamp(min=0).reshape(2, 3)
    torch.testing.assert_close(grpo(x.reshape(2, 3, h), w, ids.to(dtype), mask, adv)[0],
                               grpo(x.reshape(2, 3, h), w, ids, mask, adv)[0])
    with pytest.raises(ValueError, match="found -7"):
        F.cross_entropy(x @ w.T, torch.tensor([1, -7, 2, 3, 4, 5], dtype=dtype))
