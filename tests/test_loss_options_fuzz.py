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
