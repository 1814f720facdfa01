"""The fused linear cross-entropy in float16 under a GradScaler-sized upstream gradient: the formed gradient keeps the
unfused computation's accuracy (tigon.kernels.fused_linear_cross_entropy.flce_forward's float16 rule)."""

import pytest
import torch

from tigon import functional as F
from tigon.numerics import rel_l2
from tigon.reference.cross_entropy import cross_entropy as ref_ce

from test_fused_linear_cross_entropy import _problem  # noqa: E402  (hidden 48)


def unfused(hidden, weight, target, bias, class_weight=None, **kw):
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return ref_ce(logits.to(torch.promote_types(logits.dtype, torch.float32)), target, class_weight, **kw)


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


@pytest.mark.parametrize("weight_size", [1e-5, 1.0, 1e5])
def test_fp16_class_weights_of_any_size(device, weight_size):
    # the chunk holds (count / sum of weights) * w_t: O(1) whatever the weights' size (a fold of the weights' sum
    # overflowed at 1e5 and lost digits at 1e-5)
    hidden, weight, target, bias = _problem(device, torch.float16, n=48, v=211, ignore_every=3)
    cw = (torch.rand(211, device=device) + 0.5) * weight_size
    grads = {}
    for name, fn, dtype in (("tigon", F.fused_linear_cross_entropy, None), ("unfused", unfused, None),
                            ("truth", unfused, torch.float64)):
        leaves = [t.to(dtype or t.dtype).clone().requires_grad_() for t in (hidden, weight, bias)]
        w = cw.to(dtype) if dtype else cw
        (fn(*leaves[:2], target, leaves[2], class_weight=w) * 2.0 ** 16).backward()
        grads[name] = [t.grad for t in leaves]
    for ours, theirs, truth in zip(*grads.values()):
        assert torch.isfinite(ours).all()
        assert rel_l2(ours, truth) <= max(1.5 * rel_l2(theirs, truth), 2e-5)


def test_fp16_z_loss_survives_class_weights_summing_to_zero(device):
    # every kept target has class weight 0: the cross-entropy part has no gradient, the z-loss (per token, unweighted)
    # still has one
    hidden, weight, target, bias = _problem(device, torch.float16, n=16, v=37)
    cw = torch.rand(37, device=device) + 0.5
    cw[target] = 0.0
    grads = []
    for fn, dtype in ((F.fused_linear_cross_entropy, None), (unfused, torch.float64)):
        leaves = [t.to(dtype or t.dtype).clone().requires_grad_() for t in (hidden, weight, bias)]
        w = cw.to(dtype) if dtype else cw
        fn(*leaves[:2], target, leaves[2], class_weight=w, lse_square_scale=1e-2).backward()
        grads.append([t.grad for t in leaves])
    for ours, truth in zip(*grads):
        assert truth.norm() > 0 and rel_l2(ours, truth) < 1e-2
