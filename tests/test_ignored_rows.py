"""Ignored tokens left out of the fused linear cross-entropy's matmuls (tigon.kernels.ignored_rows): the same loss,
outputs and gradients as computing every row."""

import pytest
import torch

import tigon.kernels.ignored_rows as ignored_rows
from tigon import functional as F

from test_fused_linear_cross_entropy import _problem  # noqa: E402  (hidden 48)

OPTIONS = {
    "mean": dict(),
    "sum_smoothing_softcap": dict(reduction="sum", label_smoothing=0.1, softcap=4.0),
    "zloss_items": dict(lse_square_scale=1e-3, num_items_in_batch=77),
    "class_weight": dict(class_weight=True),
    "none": dict(reduction="none", logit_scale=0.8),
    "ignore_inside_vocab": dict(ignore_index=5),
}


def _run(hidden, weight, target, bias, min_macs, monkeypatch, **kw):
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", min_macs)
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    out = F.fused_linear_cross_entropy(*leaves[:2], target, leaves[2], return_z_loss=True, return_accuracy=True,
                                       return_predicted_tokens=True, **kw)
    upstream = torch.linspace(0.5, 1.5, target.numel(), device=target.device) if out.loss.dim() else 1.0
    (out.loss * upstream).sum().backward()
    return [out.loss.detach(), out.z_loss, out.accuracy, out.predicted_tokens] + [t.grad for t in leaves]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(OPTIONS))
def test_skipping_ignored_rows_changes_nothing(device, dtype, case, monkeypatch):
    kw = dict(OPTIONS[case])
    hidden, weight, target, bias = _problem(device, dtype, n=45, v=203)
    ig = kw.get("ignore_index", -100)
    target[torch.randperm(45, device=device)[:18]] = ig
    if kw.pop("class_weight", False):
        kw["class_weight"] = torch.rand(203, device=device) + 0.5
    seen = []
    real = ignored_rows.kept_rows
    monkeypatch.setattr(ignored_rows, "kept_rows", lambda *a, **k: seen.append(r := real(*a, **k)) or r)
    every = _run(hidden, weight, target, bias, 1 << 62, monkeypatch, **kw)
    assert all(r is None for r in seen)  # below the size: nothing gathered (kept_rows returns before its sync)
    kept = _run(hidden, weight, target, bias, 0, monkeypatch, **kw)
    assert seen[-1] is not None and seen[-1].numel() == int((target != ig).sum())
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-4)
    for a, b in zip(every, kept):
        if a.dtype == torch.int64:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, **tol)
    assert (kept[3][target == ig] == -1).all()


def test_kept_rows_rules(monkeypatch):
    t = torch.arange(64)
    t[::2] = -100
    assert ignored_rows.kept_rows(t, -100, 100, 16).tolist() == list(range(1, 64, 2))
    assert ignored_rows.kept_rows(t, -100, 100, 16, min_macs=64 * 100 * 16 + 1) is None  # too small a head
    one = torch.arange(64)
    one[-1] = -100  # a causal LM's shifted labels: one ignored token a sequence is not worth the gathers
    assert ignored_rows.kept_rows(one, -100, 100, 16) is None
    assert ignored_rows.kept_rows(torch.full((8,), -100), -100, 100, 16) is None  # none kept: every row is computed
    assert ignored_rows.kept_rows(torch.arange(8), -100, 100, 16) is None
    assert ignored_rows.kept_rows(t, -100, 2, 1, gather_floor=True) is None  # a 2 x 1 head holds no gathered row
    # the chunk loops' rule: the module's size threshold, read at the call; never for the lean plan or a byte budget
    assert ignored_rows.kept_for_chunks(t, -100, 100, 16, lean=False) is None  # 64 x 100 x 16 is below 2**32
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", 0)
    assert ignored_rows.kept_for_chunks(t, -100, 100, 16, lean=False).numel() == 32
    assert ignored_rows.kept_for_chunks(t, -100, 100, 16, lean=True) is None
    # the formed passes' groups: one sync (the counts), the rows from a stable sort, ascending as nonzero gives them
    g = torch.randint(0, 9, (96,), generator=torch.Generator().manual_seed(3))
    g[g < 3] = -100
    g[:24] = -100  # a fully ignored first group
    idx, sizes = ignored_rows.kept_groups(g, -100, 100, 16, group=24)
    assert torch.equal(idx, (g != -100).nonzero().squeeze(1)) and sizes == [0, *(int(c) for c in
                                                                              (g[24:] != -100).view(3, 24).sum(1))]
    assert ignored_rows.kept_groups(torch.full((48,), -100), -100, 100, 16, group=24) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_token_backwards_skip_ignored_rows(device, dtype, monkeypatch):
    # reduction="none" (the backward recomputes the logits) and the log-probabilities' backward (entropy included):
    # the kept rows only, the same gradients
    hidden, weight, target, bias = _problem(device, dtype, n=40, v=151)
    target[torch.randperm(40, device=device)[:15]] = -100
    up = torch.rand(40, device=device) + 0.5
    import tigon.kernels.fused_linear_logprobs as klp

    runs, decided = [], []
    real = klp.kept_for_chunks
    monkeypatch.setattr(klp, "kept_for_chunks", lambda *a: decided.append(r := real(*a)) or r)
    for min_macs in (1 << 62, 0):
        monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", min_macs)
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        (F.fused_linear_cross_entropy(*leaves[:2], target, leaves[2], reduction="none", softcap=5.0) * up).sum() \
            .backward()
        out = F.fused_linear_logprobs(leaves[0], leaves[1], target, leaves[2], return_entropy=True, return_lse=True,
                                      return_is_top1=True, return_log_sum_sq_probs=True, return_mean_logits=True)
        (out.logprobs * up + 0.1 * out.entropy * up).sum().backward()
        runs.append([t.grad for t in leaves] + [x.detach() for x in out])
    # atol 1e-6 in fp32: grad_bias / grad_weight sum over another set of rows in another order (two backwards' worth
    # of fp32 rounding on elements of about 1e-3)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-4)
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, **tol)
    # the log-probabilities' forward and backward decided to skip in the second run only (kept rows found)
    assert [r is None for r in decided] == [True, True, False, False]
    ignored = target == -100  # the log-probabilities' forward skipped them too: 0 in every output
    assert all((x[ignored] == 0).all() for x in runs[1][3:])


def test_no_skipping_under_a_byte_budget_or_the_lean_plan(device, monkeypatch):
    # the gathered hidden rows are not counted by memory=<bytes> nor by the lean plan's Liger-level memory
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", 0)
    calls = []
    real = ignored_rows.kept_rows
    monkeypatch.setattr(ignored_rows, "kept_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    hidden, weight, target, bias = _problem(device, torch.float32, n=40, v=151)
    target[::2] = -100
    for kw in (dict(memory=1 << 20), dict(accum_dtype=torch.float32, memory=1 << 20),
               dict(reduction="none", memory=1 << 20)):
        h = hidden.clone().requires_grad_()
        F.fused_linear_cross_entropy(h, weight, target, bias, **kw).sum().backward()
    assert not calls
    F.fused_linear_cross_entropy(hidden.clone().requires_grad_(), weight, target, bias).backward()
    assert calls  # the default, for comparison
