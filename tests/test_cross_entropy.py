import pytest
import torch

import tigon.kernels.cross_entropy as ce_ops
import tigon.kernels.loss_rows as loss_rows
from tigon import functional as F
from tigon import nn as tigon_nn
from tigon import support
from tigon.numerics import FLOOR, assert_close_to_truth, compare, rel_l2
from tigon.reference.cross_entropy import cross_entropy as ref_ce

KERNEL_BACKEND = "triton" if torch.cuda.is_available() else "interpreter"

# The candidate and the original (the reference evaluated at the input dtype) share every rounding step that
# matters: logits are read once, all math is fp32, and the gradient is rounded once to the logits' dtype. In
# bf16/fp16 the two gradients are the same rounding of fp32 values that differ by an fp32 ulp, so a few
# elements sitting on a rounding boundary flip either way: the two errors agree to ~1e-9 relative (measured over
# 40 seeds: ratio 1 +- 4e-10), in either direction. Factor 1.001 absorbs only that tie noise.
FACTOR = 1.001


@pytest.fixture(autouse=True)
def small_vocab_block(monkeypatch):
    # A 128-column vocabulary block makes every test below walk the vocabulary loop several times.
    monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 128)


def _targets(n, v, device, ignore_every=0, ignore_index=-100):
    t = torch.randint(0, v, (n,), device=device)
    if ignore_every:
        t[::ignore_every] = ignore_index
    return t


CASES = {
    "mean": dict(),
    "ignore_weights_smoothing": dict(weight=True, ignore_every=3, label_smoothing=0.1),
    "smoothing_ignore_index_0": dict(ignore_every=4, ignore_index=0, label_smoothing=0.25),
    "softcap_zloss_sum": dict(softcap=4.0, lse_square_scale=1e-3, reduction="sum", ignore_every=5),
    "none_weights_softcap": dict(weight=True, softcap=2.5, reduction="none", ignore_every=4),
    "num_items": dict(num_items_in_batch=17, ignore_every=3, lse_square_scale=1e-4),
    "mean_weights_zloss": dict(weight=True, ignore_every=3, lse_square_scale=1e-2, label_smoothing=0.1),
}


def _case_inputs(case, dtype, device, n=37, v=531):
    """compare()'s inputs for CASES[case]: (n, v) logits of ``dtype``, targets and the options."""
    opts = dict(CASES[case])
    ignore_every = opts.pop("ignore_every", 0)
    ignore_index = opts.get("ignore_index", -100)
    logits = (torch.randn(n, v, device=device) * 3 + 1).to(dtype)
    target = _targets(n, v, device, ignore_every, ignore_index)
    if opts.pop("weight", False):
        opts["weight"] = torch.rand(v, device=device) + 0.5
    return dict(logits=logits, target=target, **opts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_cross_entropy_matches_float64(device, dtype, case):
    checks = compare(F.cross_entropy, ref_ce, _case_inputs(case, dtype, device), ["logits"], factor=FACTOR)
    assert {c.tensor for c in checks} == {"out", "grad_logits"}
    assert_close_to_truth(checks)


def test_cross_entropy_fp16(device):
    logits = (torch.randn(20, 301, device=device) * 2).half()
    target = _targets(20, 301, device, ignore_every=6)
    assert_close_to_truth(compare(F.cross_entropy, ref_ce, dict(logits=logits, target=target, label_smoothing=0.05),
                                  ["logits"], factor=FACTOR))


def test_reference_matches_torch(device):
    n, v = 23, 97
    x = torch.randn(n, v, device=device, dtype=torch.float64) * 2
    t = _targets(n, v, device, ignore_every=3)
    w = torch.rand(v, device=device, dtype=torch.float64) + 0.1
    for kw in (dict(), dict(weight=w), dict(label_smoothing=0.2), dict(weight=w, label_smoothing=0.3)):
        for reduction in ("mean", "sum", "none"):
            a = x.clone().requires_grad_()
            b = x.clone().requires_grad_()
            ours = ref_ce(a, t, reduction=reduction, **kw)
            theirs = torch.nn.functional.cross_entropy(b, t, reduction=reduction, **kw)
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
            g = torch.randn_like(ours)
            ours.backward(g)
            theirs.backward(g)
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


def test_z_loss_and_accuracy_outputs(device):
    n, v = 29, 403
    logits = torch.randn(n, v, device=device) * 2
    target = _targets(n, v, device, ignore_every=5)
    target[1:8] = logits[1:8].argmax(-1)  # some hits, so the accuracy is not trivially 0
    inputs = dict(logits=logits, target=target, lse_square_scale=1e-2, softcap=3.0,
                  return_z_loss=True, return_accuracy=True)
    checks = compare(F.cross_entropy, ref_ce, inputs, ["logits"])
    assert {c.tensor for c in checks} == {"out", "out1", "out2", "grad_logits"}
    assert_close_to_truth(checks)
    out = F.cross_entropy(logits, target, lse_square_scale=1e-2, return_z_loss=True, return_accuracy=True)
    ref = ref_ce(logits, target, lse_square_scale=1e-2, return_z_loss=True, return_accuracy=True)
    assert isinstance(out, F.LossOutput) and out.loss.dtype == torch.float32
    assert out.accuracy.item() == ref.accuracy.item() > 0
    assert not out.z_loss.requires_grad
    only_acc = F.cross_entropy(logits, target, return_accuracy=True)
    assert only_acc.z_loss is None and only_acc.accuracy is not None


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_all_ignored_batch(device, reduction):
    logits = torch.randn(9, 211, device=device, requires_grad=True)
    target = torch.full((9,), -100, device=device)
    loss = F.cross_entropy(logits, target, reduction=reduction, label_smoothing=0.1, lse_square_scale=1e-3)
    assert torch.isfinite(loss).all() and (loss == 0).all()
    loss.sum().backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))
    acc = F.cross_entropy(logits, target, return_accuracy=True).accuracy
    assert acc.item() == 0.0


@pytest.mark.parametrize("grad_in_forward", [False, None, True])
def test_ignored_rows_are_never_read(device, grad_in_forward):
    # NaN logits in rows whose target is ignored: the kernels skip those rows, so loss and gradients stay finite
    n, v = 12, 300
    x = torch.randn(n, v, device=device)
    target = _targets(n, v, device, ignore_every=3)
    x[target == -100] = float("nan")
    expected = x.clone().requires_grad_()
    ref_ce(expected[target != -100], target[target != -100], reduction="sum").backward()
    leaf = x.clone().requires_grad_()
    loss = F.cross_entropy(leaf * 1.0, target, reduction="sum", grad_in_forward=grad_in_forward)
    loss.backward()
    torch.testing.assert_close(loss, ref_ce(x[target != -100], target[target != -100], reduction="sum"))
    assert torch.equal(leaf.grad[target == -100], torch.zeros_like(leaf.grad[target == -100]))
    torch.testing.assert_close(leaf.grad[target != -100], expected.grad[target != -100], rtol=1e-5, atol=1e-7)


def test_non_contiguous_logits_not_mutated(device):
    base = torch.randn(300, 31, device=device)
    logits = base.t()  # (31, 300), column-major
    target = _targets(31, 300, device, ignore_every=4)
    before = logits.clone()
    assert_close_to_truth(compare(F.cross_entropy, ref_ce, dict(logits=logits, target=target), ["logits"]))
    sliced = torch.randn(20, 520, device=device)[:, 7:507]  # row stride 520, unit column stride
    t2 = _targets(20, 500, device)
    assert_close_to_truth(compare(F.cross_entropy, ref_ce, dict(logits=sliced, target=t2, reduction="none"),
                                  ["logits"]))
    # default inplace_backward=False: an intermediate's values survive the backward
    x = before.clone().requires_grad_()
    y = x * 1.0
    F.cross_entropy(y, target).backward()
    assert torch.equal(y.detach(), before)
    assert torch.equal(logits, before)


def test_inplace_backward(device):
    n, v = 17, 333
    x = torch.randn(n, v, device=device)
    target = _targets(n, v, device, ignore_every=5)
    expected_leaf = x.clone().requires_grad_()
    ref_ce(expected_leaf, target, label_smoothing=0.1).backward()
    leaf = x.clone().requires_grad_()
    logits = leaf * 1.0  # an intermediate that nothing else saved for backward
    loss = F.cross_entropy(logits, target, label_smoothing=0.1, inplace_backward=True)
    loss.backward(retain_graph=True)
    torch.testing.assert_close(leaf.grad, expected_leaf.grad, rtol=1e-5, atol=1e-7)
    assert not torch.equal(logits.detach(), x)  # the buffer now holds the gradient
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_inplace_backward_over_logits_another_node_saved_raises(device):
    # softmax keeps its output for its backward: the gradient written over it would corrupt that backward
    # (dz relative error ~2 before the fix); the version bump makes autograd raise instead.
    n, v = 9, 70
    z = torch.randn(n, v, device=device, requires_grad=True)
    probs = torch.softmax(z, dim=-1)
    loss = F.cross_entropy(probs, _targets(n, v, device), inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_z_loss_is_averaged_per_token_unweighted(device):
    # mean with class weights: the cross-entropy part divides by the target weights' sum (torch), the z-loss by the
    # number of non-ignored tokens and is not class-weighted (Liger-Kernel's rule); kernels and reference agree.
    n, v, s = 23, 200, 1e-2
    logits = torch.randn(n, v, device=device, dtype=torch.float64) * 2
    target = _targets(n, v, device, ignore_every=4)
    w = torch.rand(v, device=device, dtype=torch.float64) + 0.5
    valid = target != -100
    lse = torch.logsumexp(logits, -1)[valid]
    expected = torch.nn.functional.cross_entropy(logits, target, weight=w) + s * (lse * lse).mean()
    out = ref_ce(logits, target, w, lse_square_scale=s, return_z_loss=True)
    torch.testing.assert_close(out.loss, expected)
    torch.testing.assert_close(out.z_loss, s * (lse * lse).mean())
    got = F.cross_entropy(logits.float(), target, w.float(), lse_square_scale=s, return_z_loss=True)
    torch.testing.assert_close(got.loss.double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.z_loss.double(), out.z_loss, rtol=1e-5, atol=1e-7)


def test_out_of_range_target_recorded_by_the_kernel_raises_at_the_next_launch(device):
    # the check that costs no sync: the forward kernel records the bad target, the next launch raises naming it
    from tigon.kernels import target_check

    n, v = 5, 40
    x = torch.randn(n, v, device=device)
    target = torch.tensor([1, 2, 57, -100, 3], device=device)
    f32 = dict(dtype=torch.float32, device=device)
    out = [torch.empty(n, **f32), torch.empty(n, **f32), loss_rows.row_stats(n, torch.device(device))]
    loss_rows.ce_rows_forward(x, target, None, None, loss_rows.LossOptions(), *out, None)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    assert torch.isnan(out[0][2]) and not torch.isnan(out[0][[0, 1, 3, 4]]).any()
    with pytest.raises(ValueError, match="target 57 is outside"):
        target_check.raise_if_seen()
    target_check.raise_if_seen()  # reported once
    good = torch.tensor([1, 2, 3, -100, 3], device=device)
    assert torch.isfinite(F.cross_entropy(x, good))  # and the device still works


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: the targets are checked up front on the CPU")
@pytest.mark.parametrize("compiled", [False, True])
def test_out_of_range_target_on_cuda_raises_by_the_backward(compiled):
    n, v = 64, 1000
    x = torch.randn(n, v, device="cuda", requires_grad=True)
    target = torch.randint(0, v, (n,), device="cuda")
    target[10] = v + 7
    fn = torch.compile(F.cross_entropy, fullgraph=True) if compiled else F.cross_entropy
    loss = fn(x * 1, target)
    torch.cuda.synchronize()  # the GPU has run the forward: its backward's launch raises
    assert torch.isnan(loss)
    with pytest.raises(ValueError, match=f"target {v + 7} is outside"):
        loss.backward()
    target[10] = 3
    fn(x * 1, target).backward()  # the CUDA context still works
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_inplace_bf16_against_truth(device, reduction):
    """In place, bf16, upstream 1 and a random upstream scalar: the gradient written over the logits is as accurate
    as the original's (the same single rounding of upstream * d loss / d logits)."""
    n, v = 40, 777
    base = (torch.randn(n, v, device=device) * 3).to(torch.bfloat16)
    target = _targets(n, v, device, ignore_every=6)
    for upstream in (1.0, 0.3):
        grads = {}
        for name, fn, dtype in (("tigon", lambda x: F.cross_entropy(x, target, reduction=reduction,
                                                                    inplace_backward=True), torch.bfloat16),
                                ("original", lambda x: ref_ce(x.float(), target, reduction=reduction), torch.bfloat16),
                                ("truth", lambda x: ref_ce(x, target, reduction=reduction), torch.float64)):
            leaf = base.to(dtype).clone().requires_grad_()
            logits = leaf * 1.0
            loss = fn(logits)
            (loss.sum() if loss.dim() else loss).mul(upstream).backward()
            if name == "tigon":
                assert not torch.equal(logits.detach(), base)  # the backward wrote the gradient over the logits
            grads[name] = leaf.grad
        err, orig = rel_l2(grads["tigon"], grads["truth"]), rel_l2(grads["original"], grads["truth"])
        assert err <= max(1.01 * orig, FLOOR[torch.bfloat16]), (upstream, err, orig)


def test_large_vocab_loop(device, monkeypatch):
    monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 8192)
    v = 262_144
    logits = torch.randn(3, v, device=device) * 4
    target = torch.tensor([5, v - 1, -100], device=device)
    assert_close_to_truth(compare(F.cross_entropy, ref_ce, dict(logits=logits, target=target, label_smoothing=0.1),
                                  ["logits"]))


def test_no_grad_matches(device):
    logits = torch.randn(13, 257, device=device)
    target = _targets(13, 257, device, ignore_every=4)
    with torch.no_grad():
        a = F.cross_entropy(logits, target, softcap=5.0)
    b = ref_ce(logits, target, softcap=5.0)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_num_items_tensor_and_sum(device):
    logits = torch.randn(16, 150, device=device)
    target = _targets(16, 150, device, ignore_every=3)
    total = F.cross_entropy(logits, target, reduction="sum")
    by_items = F.cross_entropy(logits, target, num_items_in_batch=torch.tensor(40))
    torch.testing.assert_close(by_items, total / 40)
    torch.testing.assert_close(F.cross_entropy(logits, target, num_items_in_batch=40), total / 40)


@pytest.mark.parametrize("items", [0, -3, 0.0, float("nan")])
def test_num_items_cpu_tensor_not_positive_raises(items):
    # as the int: a CPU tensor's value is read (no sync); a loss divided by 0, -3 or NaN came back as NaN or negative
    x, t = torch.randn(4, 10), torch.tensor([1, 2, 3, -100])
    with pytest.raises(ValueError, match="num_items_in_batch must be > 0"):
        F.cross_entropy(x, t, num_items_in_batch=torch.tensor(items))
    with pytest.raises(ValueError, match="num_items_in_batch must be > 0"):
        F.fused_linear_cross_entropy(x, torch.randn(7, 10), t, num_items_in_batch=torch.tensor(items))


def test_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.cross_entropy(torch.randn(3, 40, device=device), torch.tensor([1, 2, 3], device=device))
    assert set(support.backend_usage()["cross_entropy"]) == {KERNEL_BACKEND}


def test_bad_input():
    x = torch.randn(4, 10)
    t = torch.tensor([1, 2, 3, -100])
    with pytest.raises(ValueError, match="logits must have 2 dimensions"):
        F.cross_entropy(torch.randn(2, 3, 10), t)
    with pytest.raises(ValueError, match="target must have shape"):
        F.cross_entropy(x, t[:3])
    with pytest.raises(TypeError, match="target must be an integer tensor"):
        F.cross_entropy(x, t.float())
    with pytest.raises(TypeError, match="target must be a signed integer tensor"):  # was the kernel's own error
        F.cross_entropy(x, t.clamp(min=0).to(torch.uint8))
    with pytest.raises(TypeError, match="target must be a signed integer tensor"):
        F.fused_linear_cross_entropy(torch.randn(4, 8), torch.randn(10, 8), t.clamp(min=0).to(torch.uint8))
    with pytest.raises(TypeError, match="logits must be a floating-point"):
        F.cross_entropy(x.long(), t)
    with pytest.raises(ValueError, match="weight .*shape"):
        F.cross_entropy(x, t, weight=torch.ones(9))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        F.cross_entropy(x, t, label_smoothing=1.5)
    with pytest.raises(ValueError, match="softcap"):
        F.cross_entropy(x, t, softcap=0.0)
    with pytest.raises(ValueError, match="lse_square_scale"):
        F.cross_entropy(x, t, lse_square_scale=-1.0)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        F.cross_entropy(x, t, reduction="none", num_items_in_batch=3)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        F.cross_entropy(x, t, num_items_in_batch=0)
    with pytest.raises(ValueError, match=r"target values must be in \[0, 10\)"):
        F.cross_entropy(x, torch.tensor([1, 2, 10, -100]))
    with pytest.raises(ValueError, match="target values"):
        F.cross_entropy(x, torch.tensor([1, -1, 3, 3]))
    with support.force_reference(), pytest.raises(ValueError, match="target values"):
        F.cross_entropy(x, torch.tensor([1, 2, 10, -100]))


def test_inplace_gradient_becomes_grad_without_copy(device):
    logits = torch.randn(9, 70, device=device, requires_grad=True)
    F.cross_entropy(logits, _targets(9, 70, device), inplace_backward=True).backward()
    assert logits.grad.data_ptr() == logits.data_ptr()


@pytest.mark.parametrize("flag", ["inplace_backward"])
def test_in_place_flags_copy_logits_whose_rows_share_memory(device, flag):
    # an expanded bias: every row is the same memory, so writing a row's gradient over it would corrupt the others
    # (grad_in_forward: test_grad_in_forward_rows_sharing_memory)
    n, v = 20, 30
    bias = torch.randn(v, device=device, requires_grad=True)
    target = _targets(n, v, device)
    truth = bias.detach().double().requires_grad_()
    ref_ce(truth.expand(n, v), target).backward()
    F.cross_entropy(bias.expand(n, v), target, **{flag: True}).backward()
    torch.testing.assert_close(bias.grad.double(), truth.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("block", [None, (128, 4, True)], ids=["default_blocks", "row_per_program"])
def test_default_forms_the_gradient_in_its_own_buffer(device, monkeypatch, dtype, block):
    # The default (grad_in_forward=None) forms the gradient in the forward into a buffer of its own: the logits are
    # never written, a leaf may be passed, and the gradient equals the lazy path's bit for bit for an upstream of 1
    # (kept as formed) and of 0.37 (recomputed on the device), also on a second backward (retain_graph)
    monkeypatch.setattr(ce_ops, "grad_in_forward_block", lambda device: block)
    n, v = 37, 300
    x = (torch.randn(n, v, device=device) * 3).to(dtype)
    target = _targets(n, v, device, ignore_every=5)
    formed = []
    monkeypatch.setattr(ce_ops, "ce_forward", _spy(ce_ops.ce_forward, formed))
    for upstream in (1.0, 0.37):
        lazy_leaf = x.clone().requires_grad_()
        F.cross_entropy(lazy_leaf, target, label_smoothing=0.1, grad_in_forward=False).backward(
            torch.tensor(upstream, device=device))
        leaf = x.clone().requires_grad_()
        loss = F.cross_entropy(leaf, target, label_smoothing=0.1)
        assert torch.equal(leaf.detach(), x)  # untouched
        assert formed[-1]
        loss.backward(torch.tensor(upstream, device=device), retain_graph=True)
        assert torch.equal(leaf.grad, lazy_leaf.grad), upstream
        first = leaf.grad.clone()
        leaf.grad = None
        loss.backward(torch.tensor(upstream, device=device))  # the second backward recomputes lazily
        assert torch.equal(leaf.grad, first)
        assert torch.equal(leaf.detach(), x)


def _spy(fn, seen):
    """Wrap ce_forward, recording whether each call formed a gradient (grad_out given)."""
    def wrapped(*args, **kwargs):
        seen.append(kwargs.get("grad_out") is not None)
        return fn(*args, **kwargs)
    return wrapped


def test_default_runs_lazily_where_forming_does_not_pay(device, monkeypatch):
    # per-token losses, logits without a gradient, inplace_backward, saved-tensor hooks (checkpointing), eval mode of
    # the module: no gradient formed in the forward
    formed = []
    monkeypatch.setattr(ce_ops, "ce_forward", _spy(ce_ops.ce_forward, formed))
    n, v = 9, 50
    x = torch.randn(n, v, device=device, requires_grad=True)
    target = _targets(n, v, device)
    F.cross_entropy(x, target, reduction="none").sum().backward()
    F.cross_entropy(x.detach(), target)
    F.cross_entropy(x * 1.0, target, inplace_backward=True).backward()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        F.cross_entropy(x, target).backward()
    module = tigon_nn.CrossEntropyLoss().eval()
    module(x, target).backward()
    assert formed == [False] * 5
    F.cross_entropy(x, target).backward()
    module.train()(x, target).backward()
    assert formed[5:] == [True, True]


@pytest.mark.parametrize("items", [None, 7, 7.0, "cpu_tensor", 0, "zero_tensor"])
def test_causal_lm_loss_from_logits_takes_the_count_inside(device, monkeypatch, items):
    # Hugging Face's loss on logits: sum / num_items_in_batch. A positive count goes into the loss itself, so that the
    # backward sees an upstream of 1 and keeps the gradient the forward formed; a count of 0 keeps HF's NaN.
    from transformers.loss.loss_utils import ForCausalLMLoss

    from tigon.integrations import causal_lm_loss_from_logits

    formed = []
    monkeypatch.setattr(ce_ops, "ce_forward", _spy(ce_ops.ce_forward, formed))
    n_items = {"cpu_tensor": torch.tensor(7), "zero_tensor": torch.tensor(0)}.get(items, items)
    logits = torch.randn(2, 9, 40, device=device, requires_grad=True)
    labels = torch.randint(0, 40, (2, 9), device=device)
    labels[0, :3] = -100
    got = causal_lm_loss_from_logits(logits, labels, num_items_in_batch=n_items)
    want_logits = logits.detach().clone().requires_grad_()
    want = ForCausalLMLoss(want_logits, labels, 40, num_items_in_batch=n_items)
    if items in (0, "zero_tensor"):
        assert not torch.isfinite(got) and not torch.isfinite(want)
        return
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=1e-7)
    got.backward()
    want.backward()
    torch.testing.assert_close(logits.grad, want_logits.grad, rtol=1e-5, atol=1e-7)
    assert formed == [True]


@pytest.mark.parametrize("kw", [dict(grad_in_forward="false"), dict(grad_in_forward=1), dict(inplace_backward="yes"),
                                dict(inplace_backward=None)])
def test_gradient_flags_must_be_bools(device, kw):
    # a truthy string for grad_in_forward would write the gradient over the caller's logits: refused
    x = torch.randn(4, 10, device=device)
    logits = (x * 1.0).requires_grad_()
    with pytest.raises(TypeError, match=next(iter(kw))):
        F.cross_entropy(logits, torch.zeros(4, dtype=torch.long, device=device), **kw)
    assert torch.equal(logits.detach(), x)
