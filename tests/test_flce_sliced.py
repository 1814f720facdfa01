"""memory="low" of the fused linear cross-entropy: the exact sliced plan (tigon.kernels.flce_sliced),
issue 28 goal 4."""

import pytest
import torch

import tigon.kernels.flce_sliced as sliced
import tigon.kernels.fused_linear_cross_entropy as flce_ops
import tigon.kernels.loss_rows as loss_rows
from tigon import functional as F
from tigon.numerics import assert_close_to_truth, compare, rel_l2
from tigon.reference.cross_entropy import cross_entropy as ref_ce

from test_fused_linear_cross_entropy import _problem as flce_problem  # noqa: E402  (hidden 48)



@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 128)  # the vocabulary loop runs several times per row


def hf_original(hidden, weight, target, bias=None, *, logit_scale=1.0, **kw):
    """The unfused computation Tigon replaces: the LM head in the input dtype, the loss on fp32 logits."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) * logit_scale
    return ref_ce(logits, target, **kw)


def low(hidden, weight, target, bias=None, **kw):
    return F.fused_linear_cross_entropy(hidden, weight, target, bias, memory="low", **kw)


def _problem(device, dtype, n=52, v=397, ignore_every=5, bias=True):
    return flce_problem(device, dtype, n=n, v=v, bias=bias, ignore_every=ignore_every)


@pytest.mark.parametrize("n,vocab,hidden,spare", [(8192, 128256, 4096, 3 * 8192 * 4096 // 4),
                                                  (8192, 256000, 3584, 3 * 8192 * 3584 // 4),
                                                  (52, 397, 40, 0), (3, 1000, 7, 10), (1000, 50, 4096, 0)])
def test_slice_plan_covers_the_vocabulary_and_never_overlaps(n, vocab, hidden, spare):
    plan = sliced.slice_plan(n, vocab, hidden, spare)
    assert plan[0][0] == 0 and plan[-1][1] == vocab
    for (a0, a1, _), (b0, _, _) in zip(plan, plan[1:]):
        assert a1 == b0
    for v0, v1, in_tail in plan:
        cols = v1 - v0
        assert cols >= min(16, vocab - v0)
        if in_tail:  # the slice's logits fit in grad_weight's rows after it, which are not written yet
            assert n * cols <= (vocab - v1) * hidden
        else:
            assert n * cols <= max(spare, 16 * n) or cols == vocab - v0
        if v1 < vocab and cols >= sliced.SLICE_ALIGN:
            assert cols % sliced.SLICE_ALIGN == 0
    if (n, vocab) == (8192, 128256):
        assert len(plan) == 10  # Llama-3-8B's head: 7 slices in grad_weight's memory, 3 in the 48 MiB spare
    kept = n * 9 // 10  # every tenth token ignored: a slice in grad_weight's memory holds its logits and the kept rows
    for v0, v1, in_tail in sliced.slice_plan(n, vocab, hidden, spare, kept):
        if in_tail:
            assert kept * (v1 - v0) + kept * hidden <= (vocab - v1) * hidden


def test_local_targets_never_collide_with_ignore_index():
    # ignore_index 7 inside the vocabulary: on the slice [100, 200) the kept target 107 is local class 7 and must not
    # read as ignored (pass 2 launches with its own ignore value)
    t = torch.tensor([107, 7, 3, 202, 100, 199])
    local = sliced._local_targets(t, 100, 200, 7)
    assert local.tolist() == [7, sliced.LOCAL_IGNORE, sliced.LOCAL_OTHER, sliced.LOCAL_OTHER, 0, 99]
    assert sliced.LOCAL_IGNORE != sliced.LOCAL_OTHER and min(sliced.LOCAL_IGNORE, sliced.LOCAL_OTHER) < 0


CASES = {
    "mean_bias": dict(),
    "smoothing_zloss_softcap": dict(label_smoothing=0.1, lse_square_scale=1e-3, softcap=4.0),
    "scale_sum_nobias": dict(logit_scale=0.7, reduction="sum", bias=False),
    "num_items": dict(num_items_in_batch=29),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_low_is_as_accurate_as_the_original(device, dtype, case, monkeypatch):
    opts = dict(CASES[case])
    hidden, weight, target, bias = _problem(device, dtype, bias=opts.pop("bias", True))
    calls = []
    real = sliced.sliced_forward
    monkeypatch.setattr(flce_ops, "sliced_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    inputs = dict(hidden=hidden, weight=weight, target=target, bias=bias, **opts)
    grads = ["hidden", "weight"] + (["bias"] if bias is not None else [])
    # upstream 1 (loss.backward(), as training calls it): the gradients are rounded once, as the original's. The
    # floor 2e-5 is for the fp32 loss of bf16 inputs: both sum fp32 terms in different orders (errors about 1.1e-5
    # each, either one ahead); the bf16 gradients' errors are about 3e-3, far above it
    factor = 1.0 if dtype == torch.float32 else 1.01
    floor = None if dtype == torch.float32 else 2e-5
    assert_close_to_truth(compare(low, hf_original, inputs, grads, factor=factor, floor=floor, unit_upstream=True))
    assert calls, "memory='low' did not take the sliced plan"
    if dtype == torch.bfloat16:
        # a random upstream g scales the bf16 gradients formed for g = 1 (a second rounding; Liger's and the lean
        # plan's too): the factor of test_fused_linear_cross_entropy's scaled-upstream cases
        assert_close_to_truth(compare(low, hf_original, inputs, grads, factor=1.5, floor=floor))


def test_low_matches_the_default_plan_in_fp32_and_holds_less(device):
    hidden, weight, target, bias = _problem(device, torch.float32, n=61, v=509)
    runs = []
    for memory in ("auto", "low", 0, 10**9):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        loss = F.fused_linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], memory=memory,
                                            lse_square_scale=1e-3)
        loss.backward()
        runs.append([loss.detach()] + [t.grad for t in leaves])
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_low_edge_cases(device):
    hidden, weight, target, bias = _problem(device, torch.bfloat16, n=23, v=300, ignore_every=0)
    # an ignore_index inside the vocabulary range: on a slice past 0, (t - v0) of another class must not read as it
    target[::4] = 7
    for kw in (dict(ignore_index=7), dict(ignore_index=-1), dict(ignore_index=7, reduction="sum")):
        want = hf_original(hidden.double(), weight.double(), target, bias.double(), **kw)
        h, w, b = (t.clone().requires_grad_() for t in (hidden, weight, bias))
        got = low(h, w, target, b, **kw)
        got.backward()
        assert abs(float(got.detach()) - float(want)) <= 2e-2 * abs(float(want))
        hd, wd, bd = (t.detach().double().requires_grad_() for t in (hidden, weight, bias))
        hf_original(hd, wd, target, bd, **kw).backward()
        for ours, truth in ((h.grad, hd.grad), (w.grad, wd.grad), (b.grad, bd.grad)):
            assert rel_l2(ours, truth) < 2e-2, kw
    # every token ignored: zero loss and zero gradients; no tokens at all: zero gradients
    for n in (23, 0):
        h, w, b = (t[:n].clone().requires_grad_() if t is hidden else t.clone().requires_grad_()
                   for t in (hidden, weight, bias))
        loss = low(h, w, torch.full((n,), -100, device=device), b, reduction="sum")
        loss.backward()
        assert float(loss) == 0
        for t in (h, w, b):
            assert torch.equal(t.grad, torch.zeros_like(t))
    # the caller's tensors are untouched
    before = [t.clone() for t in (hidden, weight, bias, target)]
    low(hidden.requires_grad_(), weight, target, bias).backward()
    assert all(torch.equal(a, b) for a, b in zip(before, (hidden.detach(), weight, bias, target)))


@pytest.mark.parametrize("extra", ["class_weight", "use_token_scaling", "fp32_weight", "accum_dtype", "frozen"])
def test_low_falls_back_to_the_lean_plan_where_it_does_not_apply(device, extra, monkeypatch):
    hidden, weight, target, bias = _problem(device, torch.bfloat16, n=30, v=200)
    kw = {}
    if extra == "class_weight":
        kw["class_weight"] = torch.rand(200, device=device) + 0.5
    elif extra == "use_token_scaling":
        kw["use_token_scaling"] = True
    elif extra == "fp32_weight":  # mixed dtypes: the compute dtype differs from the weight's
        weight = weight.float()
    elif extra == "accum_dtype":  # asked for explicitly: the approximation, as documented
        kw["accum_dtype"] = torch.bfloat16
    calls = []
    monkeypatch.setattr(flce_ops, "sliced_forward", lambda *a, **k: calls.append(1))
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_(extra != "frozen")
    memory = {} if extra == "accum_dtype" else {"memory": "low"}
    loss = F.fused_linear_cross_entropy(h, w, target, bias, **memory, **kw)
    loss.backward()
    assert not calls and torch.isfinite(h.grad).all()


def test_low_under_torch_compile(device):
    hidden, weight, target, bias = _problem(device, torch.float32, n=20, v=150)
    fn = torch.compile(low, backend="aot_eager", fullgraph=True)
    outs = []
    for f in (low, fn):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = f(h, w, target, bias, lse_square_scale=1e-3)
        (loss * 0.5).backward()
        outs.append((loss.detach(), h.grad, w.grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_per_token_losses(device, dtype, monkeypatch):
    # reduction="none": both passes run in the backward, with each token's upstream gradient (random here)
    hidden, weight, target, bias = _problem(device, dtype)
    calls = []
    real = sliced.sliced_backward_rows
    monkeypatch.setattr(flce_ops, "sliced_backward_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    inputs = dict(hidden=hidden, weight=weight, target=target, bias=bias, reduction="none", softcap=6.0,
                  lse_square_scale=1e-3)
    factor = 1.0 if dtype == torch.float32 else 1.01
    assert_close_to_truth(compare(low, hf_original, inputs, ["hidden", "weight", "bias"], factor=factor))
    assert calls


def test_low_per_token_losses_under_torch_compile(device):
    hidden, weight, target, bias = _problem(device, torch.float32, n=20, v=150)
    fn = torch.compile(low, backend="aot_eager", fullgraph=True)
    outs = []
    for f in (low, fn):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = f(h, w, target, bias, reduction="none")
        loss.backward(torch.linspace(0.1, 2.0, 20, device=device))
        outs.append((loss.detach(), h.grad, w.grad))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_low_skips_ignored_rows_and_gives_the_same_results(device, reduction, monkeypatch):
    # half the tokens ignored (masked prompts): both passes run on the kept rows only, with the same results as the
    # default plan in fp32, the outputs of ignored rows included (loss 0, accuracy, predicted class -1)
    hidden, weight, target, bias = _problem(device, torch.float32, n=40, v=311, ignore_every=0)
    target[torch.randperm(40, device=device)[:20]] = -100
    seen = []
    real = sliced.kept_rows
    monkeypatch.setattr(sliced, "kept_rows", lambda *a, **k: seen.append(r := real(*a, **k)) or r)
    runs = []
    for memory in ("auto", "low"):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        out = F.fused_linear_cross_entropy(leaves[0], leaves[1], target, leaves[2], memory=memory, reduction=reduction,
                                           lse_square_scale=1e-3, return_z_loss=True, return_accuracy=True,
                                           return_predicted_tokens=True)
        out.loss.sum().backward()
        runs.append([out.loss.detach(), out.z_loss, out.accuracy, out.predicted_tokens] + [t.grad for t in leaves])
    assert seen and seen[0] is not None and seen[0].numel() == 20
    for a, b in zip(*runs):
        if a.dtype == torch.int64:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert (runs[1][3][target == -100] == -1).all()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_low_on_heads_too_small_to_gather_rows(device, reduction):
    # two classes (a token classifier with -100 padding): grad_weight's 2 x H memory cannot hold a gathered row beside
    # its logits and grad_hidden row, so every row is computed (no crash; the default plan's results)
    h = torch.randn(8, 16, device=device, requires_grad=True)
    w = torch.randn(2, 16, device=device, requires_grad=True)
    t = torch.tensor([0, 1, -100, 1, 0, 0, 1, 1], device=device)
    runs = []
    for memory in ("auto", "low"):
        hh, ww = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        F.fused_linear_cross_entropy(hh, ww, t, memory=memory, reduction=reduction).sum().backward()
        runs.append((hh.grad, ww.grad))
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_low_keeps_the_lean_chunks_for_the_loss_alone(monkeypatch, device):
    # reduction="none" and no-grad calls form no gradient in the forward: "low" still sizes their chunks by Liger's
    # rule, not the default's 3 GiB budget
    seen, real = [], flce_ops.chunk_rows

    def spy(n, vocab, hidden, dev, lean=False, *a, **k):
        seen.append(lean)
        return real(n, vocab, hidden, dev, lean, *a, **k)

    monkeypatch.setattr(flce_ops, "chunk_rows", spy)
    hidden, weight, target, _ = _problem(device, torch.bfloat16, n=20, v=150)
    F.fused_linear_cross_entropy(hidden, weight.requires_grad_(), target, memory="low", reduction="none")
    with torch.no_grad():
        F.fused_linear_cross_entropy(hidden, weight, target, memory="low")
    assert seen == [True, True]
