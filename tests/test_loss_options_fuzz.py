"""The loss ops' options against float64 formulas written here (torch's cross-entropy in float64 plus the z-loss and
soft-cap formulas), at small odd sizes: the cases a numerics sweep over cross_entropy / fused_linear_cross_entropy /
fused_linear_logprobs / fused_linear_jsd found wrong, and a seeded sweep of option combinations that keeps them so.
"""

import math
import random

import pytest
import torch
import torch.nn.functional as TF

import tigon.kernels.loss_rows as loss_rows
from tigon import functional as F
from tigon.numerics import rel_l2


@pytest.fixture(autouse=True)
def small_vocab_block(monkeypatch):
    # vocabulary blocks of 64 columns: every row below is walked in several blocks
    monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 64)


def _capped(x, cap):
    return x if cap is None else cap * torch.tanh(x / cap)


def _ce64(x, target, *, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, z=0.0, cap=None,
          items=None):
    """The float64 truth: torch's cross-entropy of the soft-capped logits plus the PaLM z-loss ``z * lse**2`` per
    non-ignored token, averaged over those tokens for "mean" (unweighted); 0 for an all-ignored "mean"."""
    x = _capped(x, cap)
    valid = target != ignore_index
    lse = torch.logsumexp(x, -1)
    zt = torch.where(valid, z * lse * lse, torch.zeros_like(lse))
    ce = TF.cross_entropy(x, target.long(), weight=weight, ignore_index=ignore_index, reduction="none",
                          label_smoothing=label_smoothing)
    if items is not None:
        return (ce.sum() + zt.sum()) / float(items)
    if reduction == "none":
        return ce + zt
    if reduction == "sum":
        return ce.sum() + zt.sum()
    if not bool(valid.any()):
        return (x * 0).sum()
    safe = torch.where(valid, target.long(), 0)
    den = (weight[safe] * valid).sum() if weight is not None else valid.sum()
    return ce.sum() / den + zt.sum() / valid.sum()


# ---- the soft-cap's derivative where tanh saturates ---------------------------------------------------------------
# 1 - t*t from a rounded t = tanh(u) loses its digits where |u| is a few units (1 - t*t ~ 1e-4 at u = 5, against
# t's rounding of 6e-8): the fp32 gradient of logits 4-6 soft-caps out was 1e-3 off relative (torch's fp32
# autograd, whose tanh backward is 1 - y*y too, as far); formed from exp(-2|u|) it is 1e-7.
CAP = 3.0


def _saturated(seed, n=5, v=150, lo=4.0, hi=6.0):
    """(n, v) fp32 logits uniform in CAP * [lo, hi) with random signs (so that tanh saturates), targets."""
    g = torch.Generator().manual_seed(seed)
    x = CAP * (lo + (hi - lo) * torch.rand(n, v, generator=g))
    x = x * torch.where(torch.rand(n, v, generator=g) < 0.5, -1.0, 1.0)
    return x, torch.randint(0, v, (n,), generator=g)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_cross_entropy_softcap_gradient_where_tanh_saturates_fp32(reduction):
    x, t = _saturated(0)
    a = x.clone().requires_grad_()
    loss = F.cross_entropy(a, t, softcap=CAP, lse_square_scale=1e-3, label_smoothing=0.1, reduction=reduction)
    up = torch.linspace(0.5, 2.0, loss.numel()).reshape(loss.shape)
    loss.backward(up)
    c = x.double().requires_grad_()
    _ce64(c, t, z=1e-3, cap=CAP, label_smoothing=0.1, reduction=reduction).backward(up.double())
    assert rel_l2(a.grad, c.grad) < 1e-5


def test_fused_linear_cross_entropy_softcap_gradient_where_tanh_saturates_fp32():
    x, t = _saturated(1, n=7, v=90)
    h = torch.eye(7)  # hidden @ weight.T = x: the logits as chosen
    w = x.T.contiguous()
    hk, wk = h.clone().requires_grad_(), w.clone().requires_grad_()
    F.fused_linear_cross_entropy(hk, wk, t, softcap=CAP).backward()
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    _ce64(h64 @ w64.T, t, cap=CAP).backward()
    assert rel_l2(hk.grad, h64.grad) < 1e-5 and rel_l2(wk.grad, w64.grad) < 1e-5


def test_fused_linear_logprobs_softcap_gradient_where_tanh_saturates_fp32():
    x, t = _saturated(2, n=7, v=90)
    h, w = torch.eye(7), x.T.contiguous()
    hk = h.clone().requires_grad_()
    F.fused_linear_logprobs(hk, w, t, softcap=CAP).sum().backward()
    h64 = h.double().requires_grad_()
    torch.log_softmax(_capped(h64 @ w.double().T, CAP), -1).gather(1, t[:, None]).sum().backward()
    assert rel_l2(hk.grad, h64.grad) < 1e-5


def test_fused_linear_jsd_student_softcap_gradient_where_tanh_saturates_fp32():
    from tigon.reference.fused_linear_jsd import fused_linear_jsd as ref_jsd

    x, _ = _saturated(3, n=7, v=90)
    xt, _ = _saturated(4, n=7, v=90)
    h, w, wt = torch.eye(7), x.T.contiguous(), (0.3 * xt.T).contiguous()
    hk, wk = h.clone().requires_grad_(), w.clone().requires_grad_()
    F.fused_linear_jsd(hk, wk, h, wt, student_softcap=CAP).backward()
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    ref_jsd(h64, w64, h.double(), wt.double(), student_softcap=CAP).backward()  # (plain torch ops in float64)
    assert rel_l2(hk.grad, h64.grad) < 1e-5 and rel_l2(wk.grad, w64.grad) < 1e-5


# ---- bad options raise, naming the argument -----------------------------------------------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(lse_square_scale=float("inf")), "lse_square_scale"),  # was accepted: a NaN loss
    (dict(label_smoothing=True), "label_smoothing"),  # a bool was taken for 1.0
    (dict(lse_square_scale=True), "lse_square_scale"),
    (dict(softcap=True), "softcap"),
])
@pytest.mark.parametrize("op", ["cross_entropy", "fused_linear_cross_entropy"])
def test_bad_float_options_raise(op, kw, match):
    x, t = torch.randn(4, 10), torch.tensor([0, 9, -100, 3])
    with pytest.raises(ValueError, match=match):
        if op == "cross_entropy":
            F.cross_entropy(x, t, **kw)
        else:
            F.fused_linear_cross_entropy(x, torch.randn(12, 10), t, **kw)


# ---- a seeded sweep of option combinations against the float64 formulas ---------------------------------------
def _layout(g, n, v, layout, scale):
    """(n, v) fp32 values, contiguous, transposed (column-major) or a column slice of a wider tensor."""
    if layout == "t":
        return (torch.randn(v, n, generator=g) * scale).t()
    if layout == "slice":
        return (torch.randn(n, v + 5, generator=g) * scale)[:, 2:2 + v]
    return torch.randn(n, v, generator=g) * scale


def _draw(seed):
    """One random case: sizes, options and targets (0 and V-1 present, some or all ignored)."""
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    n, v = rng.randint(1, 37), rng.randint(1, 300)
    ii = rng.choice([-100, 0, v - 1])
    opts = dict(ignore_index=ii, reduction=rng.choice(["mean", "sum", "none"]),
                label_smoothing=rng.choice([0.0, 0.1, 1.0]), lse_square_scale=rng.choice([0.0, 1e-2]),
                softcap=rng.choice([None, 3.0, 30.0]))
    if opts["reduction"] != "none" and rng.random() < 0.3:
        opts["num_items_in_batch"] = rng.choice([7, torch.tensor(float(n + 3))])
    t = torch.randint(0, v, (n,), generator=g)
    t[0], t[-1] = 0, v - 1
    t[torch.rand(n, generator=g) < rng.choice([0.0, 0.3, 1.0])] = ii
    cw = torch.rand(v, generator=g) + 0.5 if rng.random() < 0.3 else None
    return rng, g, n, v, opts, t.to(rng.choice([torch.int64, torch.int32])), cw


def _ref_kw(opts, cw):
    return dict(weight=None if cw is None else cw.double(), ignore_index=opts["ignore_index"],
                reduction=opts["reduction"], label_smoothing=opts["label_smoothing"], z=opts["lse_square_scale"],
                cap=opts["softcap"], items=opts.get("num_items_in_batch"))


def _upstream(loss, g):
    return torch.full((), 0.75) if loss.dim() == 0 else torch.randn(loss.shape, generator=g)


@pytest.mark.parametrize("seed", range(12))
def test_cross_entropy_option_sweep_fp32(seed):
    rng, g, n, v, opts, t, cw = _draw(seed)
    x = _layout(g, n, v, rng.choice(["c", "t", "slice"]), rng.choice([1.0, 3.0, 20.0]))
    copies = (x.clone(), t.clone(), None if cw is None else cw.clone())
    a = x.clone().requires_grad_() if rng.random() < 0.5 else x.requires_grad_()  # (the caller's own view too)
    # Liger-Kernel's positional order: (input, target, weight, size_average, ignore_index, reduce, reduction,
    # label_smoothing, lse_square_scale, softcap, return_z_loss)
    out = F.cross_entropy(a, t, cw, None, opts["ignore_index"], None, opts["reduction"], opts["label_smoothing"],
                          opts["lse_square_scale"], opts["softcap"], True,
                          num_items_in_batch=opts.get("num_items_in_batch"))
    u = _upstream(out.loss, g)
    out.loss.backward(u, retain_graph=True)
    first = a.grad.clone()
    out.loss.backward(u)  # retain_graph: a second backward gives the same gradient again
    torch.testing.assert_close(a.grad, 2 * first, rtol=0, atol=0)
    c = x.detach().double().requires_grad_()
    ref = _ce64(c, t, **_ref_kw(opts, cw))
    ref.backward(u.double())
    assert rel_l2(out.loss, ref) < 1e-5 or float((out.loss.double() - ref).abs().max()) < 1e-6
    assert rel_l2(first, c.grad) < 1e-5 or float((first.double() - c.grad).abs().max()) < 1e-7
    for before, after in zip(copies, (x, t, cw)):
        assert before is None or torch.equal(before, after.detach())


@pytest.mark.parametrize("seed", range(10))
def test_fused_linear_cross_entropy_option_sweep_fp32(seed):
    rng, g, n, v, opts, t, cw = _draw(seed + 100)
    hdim = rng.randint(1, 48)
    h = _layout(g, n, hdim, rng.choice(["c", "t", "slice"]), 1.0)
    w = _layout(g, v, hdim, rng.choice(["c", "t", "slice"]), 3.0 / math.sqrt(hdim))
    b = torch.randn(v, generator=g) * 0.5 if rng.random() < 0.4 else None
    memory = rng.choice(["auto", "low", 0, 3000])
    scaling = rng.random() < 0.3 and cw is None
    need = [rng.random() < 0.8, rng.random() < 0.7, b is not None and rng.random() < 0.6]
    if not any(need):
        need[0] = True
    leaves = [x.detach().clone().requires_grad_(r) if x is not None else None for x, r in zip((h, w, b), need)]
    copies = [x.clone() for x in (h, w, t) + ((b,) if b is not None else ())]
    call = dict(num_items_in_batch=opts.get("num_items_in_batch"), memory=memory)

    def run():
        return F.fused_linear_cross_entropy(*leaves[:2], t, leaves[2], cw, opts["ignore_index"],
                                            opts["lse_square_scale"], opts["label_smoothing"], opts["reduction"],
                                            opts["softcap"], True, None, scaling, **call)

    out = run()
    u = _upstream(out.loss, g)
    out.loss.backward(u)
    grads = [x.grad.clone() if r else None for x, r in zip(leaves, need)]
    run().loss.backward(u)  # a second call on the same tensors: gradients accumulate to twice the first
    for x, gr in zip(leaves, grads):
        if gr is not None:
            torch.testing.assert_close(x.grad, 2 * gr, rtol=0, atol=0)
    r64 = [x.detach().double().requires_grad_() if x is not None else None for x in (h, w, b)]
    logits = r64[0] @ r64[1].T + (r64[2] if b is not None else 0)
    kw = _ref_kw(opts, cw)
    if scaling:  # Liger's use_token_scaling: each token's loss (z part included) times its target's p, detached
        x = _capped(logits, opts["softcap"])
        valid = t != opts["ignore_index"]
        p = torch.softmax(x.detach(), -1).gather(1, torch.where(valid, t, 0).long()[:, None]).squeeze(1) * valid
        lse = torch.logsumexp(x, -1)
        per = (TF.cross_entropy(x, t.long(), ignore_index=opts["ignore_index"], reduction="none",
                                label_smoothing=opts["label_smoothing"]) + opts["lse_square_scale"] * lse**2 * valid)
        ref = per * p if kw["reduction"] == "none" else (per * p).sum()
        if kw["items"] is not None:
            ref = ref / float(kw["items"])
        elif kw["reduction"] == "mean":
            ref = ref / max(int(valid.sum()), 1)
    else:
        ref = _ce64(logits, t, **kw)
    ref.backward(u.double())
    assert rel_l2(out.loss, ref) < 1e-5 or float((out.loss.double() - ref).abs().max()) < 1e-6
    for gr, r in zip(grads, r64):
        if gr is not None:
            assert rel_l2(gr, r.grad) < 1e-5 or float((gr.double() - r.grad).abs().max()) < 1e-7
    for before, after in zip(copies, (h, w, t) + ((b,) if b is not None else ())):
        assert torch.equal(before, after)


@pytest.mark.parametrize("seed", range(8))
def test_cross_entropy_option_sweep_bf16_no_worse_than_torch(seed):
    """bf16 logits: Tigon's loss and gradient are as close to the float64 truth as torch's own loss on the
    fp32-upcast logits (Hugging Face's computation: one rounding of the gradient to bf16)."""
    rng, g, n, v, opts, t, cw = _draw(seed + 200)
    x = _layout(g, n, v, rng.choice(["c", "t", "slice"]), rng.choice([1.0, 3.0, 20.0])).bfloat16()
    a, p = x.clone().requires_grad_(), x.clone().requires_grad_()
    loss = F.cross_entropy(a, t, cw, None, opts["ignore_index"], None, opts["reduction"], opts["label_smoothing"],
                           opts["lse_square_scale"], opts["softcap"], num_items_in_batch=opts.get("num_items_in_batch"))
    u = _upstream(loss, g)
    loss.backward(u)
    kw = _ref_kw(opts, cw)
    _ce64(p.float(), t, **dict(kw, weight=cw)).backward(u)
    c = x.double().requires_grad_()
    ref = _ce64(c, t, **kw)
    ref.backward(u.double())
    plain = _ce64(x.float(), t, **dict(kw, weight=cw))
    assert rel_l2(loss, ref) <= max(1.01 * rel_l2(plain, ref), 1e-6)
    assert rel_l2(a.grad, c.grad) <= max(1.01 * rel_l2(p.grad, c.grad), 1e-6)
