"""Liger-Kernel's cross-entropy names called positionally (issue 21): ``liger_cross_entropy``,
``liger_fused_linear_cross_entropy``, ``LigerCrossEntropyLoss`` and ``LigerFusedLinearCrossEntropyLoss`` take every
option positionally, and Tigon's drop-ins take them in the same order: each is called here with all of Liger's
arguments positionally and compared with the keyword call. Calls in Tigon's former order are refused, naming it."""

import importlib.util
import inspect

import pytest
import torch

from tigon import functional as F
from tigon import nn as tnn

LIGER = importlib.util.find_spec("liger_kernel") is not None

# Liger-Kernel 0.8.x's positional parameters, (name, default) in order (src/liger_kernel/transformers/functional.py,
# cross_entropy.py, fused_linear_cross_entropy.py); Tigon calls the first input logits / hidden.
LIGER_CE = [("input", None), ("target", None), ("weight", None), ("size_average", None), ("ignore_index", -100),
            ("reduce", None), ("reduction", "mean"), ("label_smoothing", 0.0), ("lse_square_scale", 0.0),
            ("softcap", None), ("return_z_loss", False), ("return_token_accuracy", False),
            ("return_predicted_tokens", False)]
LIGER_FLCE = [("input", None), ("weight", None), ("target", None), ("bias", None), ("ce_weight", None),
              ("ignore_index", -100), ("lse_square_scale", 0.0), ("label_smoothing", 0.0), ("reduction", "mean"),
              ("softcap", None), ("return_z_loss", False), ("accum_dtype", None), ("use_token_scaling", False),
              ("return_token_accuracy", False), ("return_predicted_tokens", False)]
LIGER_CE_MODULE = [("weight", None), ("ignore_index", -100), ("lse_square_scale", 0.0), ("label_smoothing", 0.0),
                   ("reduction", "mean"), ("softcap", None), ("return_z_loss", False),
                   ("return_token_accuracy", False), ("return_predicted_tokens", False)]
LIGER_FLCE_MODULE = [("ce_weight", None), *LIGER_CE_MODULE[1:7], ("accum_dtype", None), ("use_token_scaling", False),
                     ("return_token_accuracy", False), ("return_predicted_tokens", False)]
RENAMED = {"input": ("logits", "hidden")}


def _positional(fn, skip_self=False):
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    return [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params[skip_self:]]


def _same_order(tigon, liger):
    assert len(tigon) >= len(liger)
    for (name, default), (lname, ldefault) in zip(tigon, liger):
        assert name == lname or name in RENAMED.get(lname, ()), (name, lname)
        assert default == ldefault, (name, default, ldefault)


def test_positional_order_and_defaults_are_ligers():
    _same_order(_positional(F.cross_entropy), LIGER_CE)
    _same_order(_positional(F.fused_linear_cross_entropy), LIGER_FLCE)
    _same_order(_positional(tnn.CrossEntropyLoss.__init__, True), LIGER_CE_MODULE)
    _same_order(_positional(tnn.FusedLinearCrossEntropyLoss.__init__, True), LIGER_FLCE_MODULE)


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
def test_positional_order_matches_the_installed_liger():
    from liger_kernel.transformers import LigerCrossEntropyLoss, LigerFusedLinearCrossEntropyLoss
    from liger_kernel.transformers import functional as LF

    _same_order(_positional(F.cross_entropy), _positional(LF.liger_cross_entropy))
    _same_order(_positional(F.fused_linear_cross_entropy), _positional(LF.liger_fused_linear_cross_entropy))
    _same_order(_positional(tnn.CrossEntropyLoss.__init__, True), _positional(LigerCrossEntropyLoss.__init__, True))
    _same_order(_positional(tnn.FusedLinearCrossEntropyLoss.__init__, True),
                _positional(LigerFusedLinearCrossEntropyLoss.__init__, True))


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    assert type(a) is type(b)
    return all(x is None and y is None or torch.equal(x, y) for x, y in zip(a, b))


def _case(device):
    h = torch.randn(7, 16, device=device)
    w = torch.randn(30, 16, device=device) / 2
    b = torch.randn(30, device=device)
    t = torch.randint(0, 30, (7,), device=device)
    t[2] = 0  # ignore_index=0 below: a real class id, so this token is ignored
    return h, w, b, t, torch.rand(30, device=device) + 0.5


def test_cross_entropy_all_arguments_positionally(device):
    h, w, _, t, cw = _case(device)
    x = h @ w.T
    # input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing, lse_square_scale,
    # softcap, return_z_loss, return_token_accuracy, return_predicted_tokens
    got = F.cross_entropy(x, t, cw, None, 0, None, "sum", 0.1, 1e-3, 5.0, True, True, True)
    want = F.cross_entropy(x, t, weight=cw, ignore_index=0, reduction="sum", label_smoothing=0.1,
                           lse_square_scale=1e-3, softcap=5.0, return_z_loss=True, return_token_accuracy=True,
                           return_predicted_tokens=True)
    assert got.accuracy is not None and got.predicted_tokens[2] == -1 and _equal(got, want)
    m = tnn.CrossEntropyLoss(cw, 0, 1e-3, 0.1, "sum", 5.0, True, True, True)
    assert _equal(m(x, t), want)
    assert (m.ignore_index, m.lse_square_scale, m.label_smoothing, m.reduction, m.softcap) == (0, 1e-3, 0.1, "sum", 5.0)


def test_cross_entropy_legacy_size_average_and_reduce(device):
    # torch's deprecated options, positional in torch's and Liger's order: torch's meaning (Liger ignores them)
    h, w, _, t, _ = _case(device)
    x = h @ w.T
    for size_average, reduce, reduction in [(False, None, "sum"), (None, False, "none"), (True, True, "mean")]:
        with pytest.warns(UserWarning, match=f"use reduction='{reduction}'"):
            got = F.cross_entropy(x, t, None, size_average, -100, reduce)
        assert torch.equal(got, F.cross_entropy(x, t, reduction=reduction))
        with pytest.warns(UserWarning):
            want = torch.nn.functional.cross_entropy(x.double(), t, None, size_average, -100, reduce)
        torch.testing.assert_close(got.double(), want)


def test_flce_all_arguments_positionally(device):
    h, w, b, t, cw = _case(device)
    # input, weight, target, bias, ce_weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap,
    # return_z_loss, accum_dtype, use_token_scaling, return_token_accuracy, return_predicted_tokens
    got = F.fused_linear_cross_entropy(h, w, t, b, cw, 0, 1e-3, 0.1, "sum", 5.0, True, torch.float32, True, True,
                                       True)
    want = F.fused_linear_cross_entropy(h, w, t, b, class_weight=cw, ignore_index=0, lse_square_scale=1e-3,
                                        label_smoothing=0.1, reduction="sum", softcap=5.0, return_z_loss=True,
                                        accum_dtype=torch.float32, use_token_scaling=True, return_accuracy=True,
                                        return_predicted_tokens=True)
    assert got.z_loss is not None and got.accuracy is not None and _equal(got, want)
    m = tnn.FusedLinearCrossEntropyLoss(cw, 0, 1e-3, 0.1, "sum", 5.0, True, torch.float32, True, True, True)
    assert _equal(m(h, w, t, b), want)
    assert torch.equal(m.class_weight, cw) and m.use_token_scaling and m.accum_dtype == torch.float32


def test_former_positional_order_is_refused_naming_it(device):
    h, w, _, t, _ = _case(device)
    x = h @ w.T
    with pytest.raises(TypeError, match="size_average must be None or a bool.*ignore_index is the 5th"):
        F.cross_entropy(x, t, None, -100, "sum")  # Tigon's former order: ignore_index, reduction
    with pytest.raises(TypeError, match="reduce must be None or a bool.*reduction is the 7th"):
        F.cross_entropy(x, t, None, None, -100, "sum")
    with pytest.raises(TypeError, match="lse_square_scale must be a number.*reduction is the fifth"):
        tnn.CrossEntropyLoss(None, -100, "sum")
    with pytest.raises(TypeError, match="ce_weight must be None or a .V,. tensor.*ignore_index the second"):
        tnn.FusedLinearCrossEntropyLoss(-100, "sum")


def test_chunk_mem_const_is_checked_and_changes_nothing():
    # Liger 0.8.5's 16th positional argument: taken for drop-in calls; Tigon's chunks follow `memory`.
    import torch
    from tigon import functional as TF

    h, w = torch.randn(6, 8, requires_grad=True), torch.randn(11, 8)
    t = torch.tensor([1, 2, -100, 4, 5, 10])
    base = TF.fused_linear_cross_entropy(h, w, t)
    assert torch.equal(TF.fused_linear_cross_entropy(h, w, t, None, None, -100, 0.0, 0.0, "mean", None, False, None,
                                                     False, False, False, 4), base)
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="chunk_mem_const must be a positive int"):
            TF.fused_linear_cross_entropy(h, w, t, chunk_mem_const=bad)
