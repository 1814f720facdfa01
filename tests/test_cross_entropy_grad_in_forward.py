"""Cross-entropy with its gradient formed in the forward (``grad_in_forward=True``, written over the logits): values
against float64, where and when it writes, the upstream gradient's scaling, and the cases it refuses or runs lazily.
The default (formed into its own buffer) and the lazy path: tests/test_cross_entropy.py, whose helpers and 128-column
vocabulary block this file shares."""

import pytest
import torch

import tigon.kernels.cross_entropy as ce_ops
from tigon import functional as F
from tigon.numerics import FLOOR, assert_close_to_truth, compare, rel_l2
from tigon.reference.cross_entropy import cross_entropy as ref_ce

from test_cross_entropy import CASES, FACTOR, _case_inputs, _targets, small_vocab_block  # noqa: F401 (the fixture)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [c for c in CASES if CASES[c].get("reduction") != "none"])
def test_grad_in_forward_matches_float64(device, dtype, case):
    def tigon_fwdgrad(logits, target, **kw):
        return F.cross_entropy(logits * 1, target, grad_in_forward=True, **kw)  # an intermediate, as in a model

    # compare() draws a random upstream gradient: in bf16 the gradient is then rounded twice (in the forward, and
    # after the backward's scaling), so its bound is 2x the original's (see test_grad_in_forward_bf16_against_truth,
    # which checks the single rounding of upstream 1 at 1.01x).
    factor = FACTOR if dtype == torch.float32 else 2.0
    checks = compare(tigon_fwdgrad, ref_ce, _case_inputs(case, dtype, device), ["logits"], factor=factor)
    assert {c.tensor for c in checks} == {"out", "grad_logits"}
    assert_close_to_truth(checks)


GRAD_BLOCKS = dict(default=None, wide=(128, 4, False), wide_reverse=(128, 4, True), narrow_reverse=(8192, 4, True),
                   # L2 hints 3 (a no-op under the interpreter) on a grid capped at 2 programs per SM (2 in all under
                   # the interpreter): each program takes every other row
                   hints_capped=(128, 4, True, 3, 2))


@pytest.mark.parametrize("block", list(GRAD_BLOCKS.values()), ids=list(GRAD_BLOCKS))
def test_grad_in_forward_writes_the_gradient_in_the_forward(device, monkeypatch, block):
    # grad_in_forward's blocks (GRAD_IN_FORWARD_BLOCK on CUDA; the default, None, under the interpreter): "wide":
    # one row per program in vocabulary blocks of 128, 3 steps, the gradient's pass first block first or last block
    # first; "narrow_reverse": rows narrower than the block take the default blocks (MAX_BLOCK_V, 128 here), last
    # block first
    monkeypatch.setattr(ce_ops, "grad_in_forward_block", lambda device: block)
    n, v = 23, 300
    x = torch.randn(n, v, device=device)
    target = _targets(n, v, device, ignore_every=4)
    expected = x.clone().requires_grad_()
    ref_ce(expected, target, lse_square_scale=1e-3).backward()
    leaf = x.clone().requires_grad_()
    logits = leaf * 1.0
    loss = F.cross_entropy(logits, target, lse_square_scale=1e-3, grad_in_forward=True)
    torch.testing.assert_close(logits.detach(), expected.grad, rtol=1e-5, atol=1e-7)  # before any backward
    torch.testing.assert_close(loss, ref_ce(x, target, lse_square_scale=1e-3), rtol=1e-6, atol=1e-6)
    loss.backward(retain_graph=True)  # upstream 1: the kernel leaves the buffer as it is
    torch.testing.assert_close(leaf.grad, expected.grad, rtol=1e-5, atol=1e-7)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


@pytest.mark.parametrize("block", list(GRAD_BLOCKS.values()), ids=list(GRAD_BLOCKS))
def test_masked_vocabulary_blocks_and_argmax_ties(device, monkeypatch, block):
    # -inf logits filling whole vocabulary blocks (the first one, and a masked tail), and a tie for the maximum
    # across blocks (torch.argmax takes the first), on the lazy path and on grad_in_forward's
    monkeypatch.setattr(ce_ops, "grad_in_forward_block", lambda device: block)
    n, v = 31, 300
    x = torch.randn(n, v, device=device) * 2
    x[:, 260:] = float("-inf")
    x[3, :128] = float("-inf")
    target = _targets(n, v, device) % 260
    target[3] %= 128
    target[3] += 128
    target[::5] = -100
    x[2, 7] = x[2, 200] = x[2].max() + 1
    target[2] = 200
    kw = dict(lse_square_scale=1e-3, return_accuracy=True)  # (label smoothing's loss is inf on -inf logits)
    expected = x.clone().requires_grad_()
    ref = ref_ce(expected, target, **kw)
    ref.loss.backward()
    for flag in (False, True):
        leaf = x.clone().requires_grad_()
        out = F.cross_entropy(leaf * 1.0, target, grad_in_forward=flag, **kw)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
        assert out.accuracy.item() == ref.accuracy.item()
        out.loss.backward()
        torch.testing.assert_close(leaf.grad, expected.grad, rtol=1e-5, atol=1e-7)


def test_grad_in_forward_scales_by_the_upstream_gradient(device):
    n, v = 19, 211
    x = torch.randn(n, v, device=device)
    target = _targets(n, v, device, ignore_every=3)
    expected = x.clone().requires_grad_()
    (ref_ce(expected, target, reduction="sum") * -0.37).backward()
    leaf = x.clone().requires_grad_()
    (F.cross_entropy(leaf * 1.0, target, reduction="sum", grad_in_forward=True) * -0.37).backward()
    torch.testing.assert_close(leaf.grad, expected.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("upstream", [1.0, 0.3])
def test_grad_in_forward_bf16_against_truth(device, upstream):
    """bf16. Upstream 1 (loss.backward()): the gradient is the original's single rounding of d loss / d logits, as
    accurate as the original's. Another upstream: rounded to bf16 in the forward and again after the backward's
    scaling (two roundings where the original has one), so its error may reach about twice the original's."""
    n, v = 40, 777
    base = (torch.randn(n, v, device=device) * 3).to(torch.bfloat16)
    target = _targets(n, v, device, ignore_every=6)
    grads = {}
    for name, fn, dtype in (("tigon", lambda x: F.cross_entropy(x, target, grad_in_forward=True), torch.bfloat16),
                            ("original", lambda x: ref_ce(x.float(), target), torch.bfloat16),
                            ("truth", lambda x: ref_ce(x, target), torch.float64)):
        leaf = base.to(dtype).clone().requires_grad_()
        fn(leaf * 1.0).mul(upstream).backward()
        grads[name] = leaf.grad
    err, orig = rel_l2(grads["tigon"], grads["truth"]), rel_l2(grads["original"], grads["truth"])
    assert err <= max((1.01 if upstream == 1.0 else 2.0) * orig, FLOOR[torch.bfloat16]), (err, orig)


def test_grad_in_forward_leaves_logits_alone_without_grad(device):
    n, v = 11, 97
    logits = torch.randn(n, v, device=device)
    target = _targets(n, v, device)
    before = logits.clone()
    loss = F.cross_entropy(logits, target, grad_in_forward=True)  # no gradient needed: nothing written
    assert torch.equal(logits, before)
    leaf = logits.clone().requires_grad_()
    with torch.no_grad():
        loss2 = F.cross_entropy(leaf, target, grad_in_forward=True)
    assert torch.equal(leaf.detach(), before)
    torch.testing.assert_close(loss, loss2)


def test_grad_in_forward_needs_a_scalar_loss(device):
    logits = torch.randn(4, 10, device=device, requires_grad=True)
    with pytest.raises(ValueError, match="grad_in_forward"):
        F.cross_entropy(logits, torch.tensor([1, 2, 3, 4], device=device), reduction="none", grad_in_forward=True)


def test_grad_in_forward_gradient_becomes_grad_without_copy(device):
    # through a view (a non-leaf, as the LM head's output is), the gradient written over the logits reaches the leaf
    # as its .grad without a copy
    logits = torch.randn(9, 70, device=device, requires_grad=True)
    F.cross_entropy(logits.view_as(logits), _targets(9, 70, device), grad_in_forward=True).backward()
    assert logits.grad.data_ptr() == logits.data_ptr()


def test_grad_in_forward_refuses_leaf_logits_that_require_grad(device):
    # a leaf (a Parameter, a tensor made with requires_grad=True) must keep its values: PyTorch's own rule for
    # in-place ops; without grad, or for a non-leaf, the call runs
    leaf = torch.randn(5, 40, device=device, requires_grad=True)
    target = _targets(5, 40, device)
    for logits in (leaf, torch.nn.Parameter(leaf.detach().clone())):
        with pytest.raises(ValueError, match="leaf tensor that requires grad"):
            F.cross_entropy(logits, target, grad_in_forward=True)
    with torch.no_grad():
        F.cross_entropy(leaf, target, grad_in_forward=True)
    F.cross_entropy(leaf * 1, target, grad_in_forward=True).backward()


def test_grad_in_forward_rows_sharing_memory(device):
    # An expanded (N, V) view of one row: written in place, later rows would read gradients as logits; it is copied.
    bias = torch.randn(1, 300, device=device, requires_grad=True)
    target = _targets(200, 300, device)
    expected = bias.detach().clone().requires_grad_()
    ref_loss = ref_ce(expected.expand(200, 300), target)
    ref_loss.backward()
    loss = F.cross_entropy(bias.expand(200, 300), target, grad_in_forward=True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    loss.backward()
    torch.testing.assert_close(bias.grad, expected.grad, rtol=1e-5, atol=1e-7)


def test_grad_in_forward_refuses_float16_and_guards_saved_logits(device):
    logits = torch.randn(6, 50, device=device).half().requires_grad_()
    with pytest.raises(ValueError, match="float16"):
        F.cross_entropy(logits * 1, _targets(6, 50, device), grad_in_forward=True)
    h = torch.randn(6, 50, device=device, requires_grad=True)
    saved = torch.exp(h)  # exp saves its output for the backward
    loss = F.cross_entropy(saved, _targets(6, 50, device), grad_in_forward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_grad_in_forward_nn_module_only_in_training(device):
    from tigon.nn import CrossEntropyLoss

    loss_fn = CrossEntropyLoss(grad_in_forward=True)
    logits = torch.randn(5, 40, device=device, requires_grad=True)
    target = _targets(5, 40, device)
    before = logits.detach().clone()
    loss_fn.eval()
    loss_fn(logits * 1, target)  # grad enabled, but evaluation: the (intermediate) logits stay logits
    inter = logits * 1
    loss_fn(inter, target)
    assert torch.equal(inter.detach(), before)
    loss_fn.train()
    loss_fn(inter, target)
    assert not torch.equal(inter.detach(), before)


def test_grad_in_forward_under_non_reentrant_checkpoint_runs_lazily(device):
    # The region is run again before its backward; written over in that second run, logits another op of the
    # region saved (here pow) would be replaced by the gradient without any version error. So grad_in_forward
    # takes the lazy path while saved-tensor hooks are set, and the gradients match float64.
    from torch.utils.checkpoint import checkpoint

    n, v, h = 6, 50, 8
    target = _targets(n, v, device)
    hid, w = torch.randn(n, h, device=device), torch.randn(v, h, device=device)

    def body(a, weight):
        logits = torch.tanh(a @ weight.t())
        return logits.pow(2).mean() * 1e-2 + F.cross_entropy(logits, target, grad_in_forward=True)

    truth = hid.double().requires_grad_()
    body(truth, w.double()).backward()
    leaf = hid.clone().requires_grad_()
    checkpoint(body, leaf, w, use_reentrant=False).backward()
    torch.testing.assert_close(leaf.grad.double(), truth.grad, rtol=1e-5, atol=1e-6)
    assert ce_ops.saved_tensor_hooks_active() is False  # outside the region
