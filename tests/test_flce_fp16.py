"""The fused linear cross-entropy in float16 under a GradScaler-sized upstream gradient: the formed gradient keeps the
unfused computation's accuracy (tigon.kernels.fused_linear_cross_entropy.flce_forward's float16 rule)."""

import pytest
import torch

from tigon import functional as F
from tigon.numerics import rel_l2
from tigon.reference.cross_entropy import cross_entropy as ref_ce

from test_fused_linear_cross_entropy import _problem  # noqa: E402  (hidden 48)


def unfused(hidden, weight, target, bias, **kw):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return ref_ce(logits.to(torch.promote_types(logits.dtype, torch.float32)), target, **kw)


@pytest.mark.parametrize("kw", [dict(num_items_in_batch=65536), dict(num_items_in_batch=8192, lse_square_scale=1e-3),
                                dict(reduction="sum")])
def test_fp16_formed_gradients_under_a_grad_scaler_scale(device, kw):
    # a GradScaler multiplies the loss by 2**16; with the gradient divided by 65536 tokens before its float16 rounding
    # (the old rule) grad_hidden's error was 50x the unfused computation's, whose float16 rounding comes after the
    # scale. The bound 1.5x: the two round different products (Tigon g, then times the scale in fp32), as the bf16
    # scaled-upstream tests of test_fused_linear_cross_entropy.py allow
    hidden, weight, target, bias = _problem(device, torch.float16, n=40, v=301, ignore_every=5)
    scale = 2.0 ** 16 if kw.get("reduction") != "sum" else 1.0 / 64
    grads = {}
    for name, fn, dtype in (("tigon", F.fused_linear_cross_entropy, None), ("unfused", unfused, None),
                            ("truth", unfused, torch.float64)):
        leaves = [t.to(dtype or t.dtype).clone().requires_grad_() for t in (hidden, weight, bias)]
        (fn(*leaves[:2], target, leaves[2], **kw) * scale).backward()
        grads[name] = [t.grad for t in leaves]
    for name, ours, theirs, truth in zip(("hidden", "weight", "bias"), *grads.values()):
        assert ours.dtype == torch.float16 and torch.isfinite(ours).all()
        err, orig = rel_l2(ours, truth), rel_l2(theirs, truth)
        assert err <= max(1.5 * orig, 2e-5), (name, err, orig)


def test_fp16_all_ignored_gives_zero_gradients(device):
    hidden, weight, target, bias = _problem(device, torch.float16, n=12, v=101)
    target[:] = -100
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    (F.fused_linear_cross_entropy(*leaves[:2], target, leaves[2]) * 2.0 ** 16).backward()
    for t in leaves:
        assert torch.equal(t.grad, torch.zeros_like(t))
