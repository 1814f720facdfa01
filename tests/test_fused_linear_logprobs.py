"""fused_linear_logprobs: per-token log-probabilities (entropy, lse) of the LM head, against float64 and against the
plain PyTorch computation TRL runs (its error measured on the same inputs)."""

import pytest
import torch

import tigon.kernels.fused_linear_cross_entropy as flce_ops
import tigon.kernels.head_grads as head_grads
import tigon.kernels.loss_rows as loss_rows
from tigon import functional as F
from tigon import support
from tigon.numerics import rel_l2
from tigon.ops.fused_linear_logprobs import trl_linear_logprobs
from tigon.reference.fused_linear_logprobs import LogProbsOutput
from tigon.reference.fused_linear_logprobs import fused_linear_logprobs as ref_logprobs

H = 24


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    # 32-column vocabulary blocks and chunks of at most 8 tokens: the vocabulary loop and the chunk loop both run
    # several times in every test below.
    monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 32)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 8 * 101)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CUDA", 8 * 101)
    monkeypatch.setattr(head_grads.RowHalves, "FIRST", 64)


@pytest.fixture
def bf16_full_reductions(device, monkeypatch):
    # For the bf16 comparisons with the plain computation: cuBLAS reduces in bf16 where torch allows it
    # (allow_bf16_reduced_precision_reduction, on by default) at the 16-row chunks the fixture above leaves on CUDA,
    # and not at the plain computation's 33 rows. Measured on an H100 (session 32, results/h200/session31/
    # diag_s31.py): with the flag on, Tigon's log-probs at those chunks are 1.3-1.6x the plain error and a plain
    # F.linear of 16-row slices shows the same error; with it off both are equal to 2e-8. Off here, so that the
    # comparison measures Tigon's kernels, not cuBLAS's choice at a chunk size the real op never takes.
    if torch.device(device).type == "cuda":
        monkeypatch.setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", False)


def _problem(device, dtype, n=21, v=101, bias=False, ignore_every=0, std=2.0):
    hidden = torch.randn(n, H, device=device).to(dtype)
    weight = (torch.randn(v, H, device=device) / H**0.5 * std).to(dtype)
    target = torch.randint(0, v, (n,), device=device)
    if ignore_every:
        target[::ignore_every] = -100
    b = (torch.randn(v, device=device) * 0.5).to(dtype) if bias else None
    return hidden, weight, target, b


def _outputs(out) -> list:
    return [o for o in (out if isinstance(out, tuple) else (out,))]


def _run(fn, hidden, weight, target, bias, upstream, dtype=None, **kw):
    """(outputs, grads of hidden / weight / bias) of ``fn`` on leaf copies (cast to ``dtype``), for the upstream
    gradients ``upstream`` (one per output; None: that output gets none)."""
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    leaves = [cast(t).detach().clone().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    outs = _outputs(fn(leaves[0], leaves[1], target, leaves[2], **kw))
    pairs = [(o, u) for o, u in zip(outs, upstream) if o is not None and u is not None]
    grads = torch.autograd.grad([o for o, _ in pairs], [t for t in leaves if t is not None],
                                [u.to(o.dtype) for o, u in pairs])
    return [o.detach() if o is not None else None for o in outs], list(grads)


CASES = {
    "default": dict(),
    "temperature": dict(temperature=0.7),
    "softcap+temperature": dict(softcap=3.0, temperature=0.6),
    "bias": dict(bias=True),
    "ignored": dict(ignore_every=3),
    "entropy": dict(return_entropy=True, temperature=1.3, ignore_every=4),
    "lse": dict(return_lse=True, bias=True),
    "entropy+lse+softcap": dict(return_entropy=True, return_lse=True, softcap=2.0, temperature=0.8, ignore_every=5),
}


def _split(case):
    kw = dict(CASES[case])
    build = {k: kw.pop(k) for k in ("bias", "ignore_every") if k in kw}
    return kw, build


def _upstream(n, count, device):
    gen = torch.Generator().manual_seed(7)
    return [torch.randn(n, generator=gen, dtype=torch.float64).to(device) for _ in range(count)]


@pytest.mark.parametrize("case", list(CASES))
def test_matches_float64_in_fp32(device, case):
    # fp32: every output and every gradient within 1e-5 (relative L2) of the float64 reference, for random upstream
    # gradients on every returned output
    kw, build = _split(case)
    hidden, weight, target, bias = _problem(device, torch.float32, **build)
    n_out = 1 + kw.get("return_entropy", False) + kw.get("return_lse", False)
    up = _upstream(hidden.shape[0], 3, device)
    up = [up[0], up[1] if kw.get("return_entropy") else None, up[2] if kw.get("return_lse") else None]
    got, g_got = _run(F.fused_linear_logprobs, hidden, weight, target, bias, up, **kw)
    want, g_want = _run(ref_logprobs, hidden, weight, target, bias, up, dtype=torch.float64, **kw)
    assert len([o for o in got if o is not None]) == n_out
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == torch.float32 and a.shape == (hidden.shape[0],)
            assert rel_l2(a, b) <= 1e-5, (case, rel_l2(a, b))
    for a, b in zip(g_got, g_want):
        assert a.dtype == torch.float32
        assert rel_l2(a, b) <= 1e-5, (case, rel_l2(a, b))


@pytest.mark.parametrize("case", ["default", "softcap+temperature", "entropy+lse+softcap", "bias"])
def test_bf16_no_worse_than_the_plain_computation(device, case, bf16_full_reductions):
    # bf16 inputs: Tigon's error against float64 at most the error of TRL's plain computation (LM head in bf16,
    # fp32 logits, log-softmax) on the same inputs and upstream gradients, up to rounding-tie flips (1.05; both
    # round the logits and their gradient to bf16 at the same places), measured for outputs and gradients
    kw, build = _split(case)
    hidden, weight, target, bias = _problem(device, torch.bfloat16, n=33, v=157, **build)
    up = _upstream(hidden.shape[0], 3, device)
    up = [up[0], up[1] if kw.get("return_entropy") else None, up[2] if kw.get("return_lse") else None]
    got, g_got = _run(F.fused_linear_logprobs, hidden, weight, target, bias, up, **kw)
    plain, g_plain = _run(trl_linear_logprobs, hidden, weight, target, bias, up, **kw)
    truth, g_truth = _run(ref_logprobs, hidden, weight, target, bias, up, dtype=torch.float64, **kw)
    for name, a, p, t in [*zip(("logp", "entropy", "lse"), got, plain, truth),
                          *zip(("grad_hidden", "grad_weight", "grad_bias"), g_got, g_plain, g_truth)]:
        if t is None:
            continue
        e_tigon, e_plain = rel_l2(a, t), rel_l2(p, t)
        assert e_tigon <= max(1.05 * e_plain, 1e-6), (case, name, e_tigon, e_plain)


def test_is_minus_the_fused_cross_entropy_per_token(device):
    hidden, weight, target, bias = _problem(device, torch.float32, bias=True, ignore_every=3)
    lp = F.fused_linear_logprobs(hidden, weight, target, bias, temperature=0.5, softcap=4.0)
    ce = F.fused_linear_cross_entropy(hidden, weight, target, bias, reduction="none", softcap=4.0 / 0.5,
                                      logit_scale=1 / 0.5)
    torch.testing.assert_close(lp, -ce, rtol=1e-6, atol=1e-6)


def test_matches_trl_selective_log_softmax_and_entropy(device):
    # the semantics TRL's trainers use: logits / temperature, log-softmax gathered, entropy from the same logits
    utils = pytest.importorskip("trl.trainer.utils")
    hidden, weight, target, _ = _problem(device, torch.float64)
    logits = hidden @ weight.T
    want = utils.selective_log_softmax(logits, target, temperature=0.7)
    ent = utils.entropy_from_logits(logits / 0.7)
    got = F.fused_linear_logprobs(hidden.float(), weight.float(), target, temperature=0.7, return_entropy=True)
    assert isinstance(got, LogProbsOutput) and got.lse is None
    torch.testing.assert_close(got.logprobs.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.entropy.double(), ent, rtol=1e-5, atol=1e-5)


def test_ignored_and_all_ignored_tokens(device):
    hidden, weight, target, bias = _problem(device, torch.float32, bias=True, ignore_every=2)
    for t in (target, torch.full_like(target, -100)):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        b = bias.clone().requires_grad_()
        out = F.fused_linear_logprobs(h, w, t, b, return_entropy=True, return_lse=True)
        ignored = t == -100
        for o in out[:3]:
            assert torch.isfinite(o).all() and (o[ignored] == 0).all() and not torch.signbit(o[ignored]).any()
        (out.logprobs.sum() + out.entropy.sum() + out.lse.sum()).backward()
        assert (h.grad[ignored] == 0).all()
        if ignored.all():
            assert (h.grad == 0).all() and (w.grad == 0).all() and (b.grad == 0).all()


def test_other_ignore_index_and_empty_batch(device):
    hidden, weight, target, _ = _problem(device, torch.float32)
    target[::3] = 0
    got = F.fused_linear_logprobs(hidden, weight, target, ignore_index=0)
    want = ref_logprobs(hidden.double(), weight.double(), target, ignore_index=0)
    assert rel_l2(got, want) <= 1e-5 and (got[target == 0] == 0).all()
    h0 = hidden[:0].clone().requires_grad_()
    w = weight.clone().requires_grad_()
    out = F.fused_linear_logprobs(h0, w, target[:0], return_entropy=True)
    assert out.logprobs.shape == (0,) and out.entropy.shape == (0,)
    out.logprobs.sum().backward()
    assert h0.grad.shape == (0, H) and (w.grad == 0).all()


def test_non_contiguous_inputs_and_callers_tensors_untouched(device):
    hidden, weight, target, bias = _problem(device, torch.float32, bias=True, ignore_every=4)
    wide = torch.randn(hidden.shape[0], 2 * H, device=device)
    wide[:, 1::2] = hidden
    strided_h = wide[:, 1::2]  # every other column of a wider buffer
    weight_t = weight.T.contiguous().T  # column-major
    target_s = torch.stack((target, target), 1)[:, 1]
    before = [t.clone() for t in (wide, weight_t, target_s, bias)]
    up = _upstream(hidden.shape[0], 2, device)
    kw = dict(return_entropy=True, temperature=0.9)
    got, g_got = _run(F.fused_linear_logprobs, strided_h, weight_t, target_s, bias, up, **kw)
    want, g_want = _run(F.fused_linear_logprobs, hidden, weight, target, bias, up, **kw)
    for a, b in zip([*got[:2], *g_got], [*want[:2], *g_want]):  # (BLAS may order sums differently by layout)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for a, b in zip((wide, weight_t, target_s, bias), before):
        assert torch.equal(a, b)


@pytest.mark.parametrize("which", ["entropy only", "lse only"])
def test_gradient_through_one_extra_output(device, which):
    # the log-probabilities unused: the gradient flows from the entropy (or the lse) alone
    hidden, weight, target, _ = _problem(device, torch.float32, ignore_every=5)
    idx = 1 if which == "entropy only" else 2
    up = [None, None, None]
    up[idx] = _upstream(hidden.shape[0], 1, device)[0]
    kw = dict(return_entropy=True, return_lse=True, softcap=3.0)
    _, g_got = _run(F.fused_linear_logprobs, hidden, weight, target, None, up, **kw)
    _, g_want = _run(ref_logprobs, hidden, weight, target, None, up, dtype=torch.float64, **kw)
    for a, b in zip(g_got, g_want):
        assert rel_l2(a, b) <= 1e-5


def test_confident_token_is_accurate_in_fp32(device):
    # a token whose logit stands 8 above the others' (logits 30 and 38, as the cross-entropy's confident-token test):
    # log p ~ -1e-2 (-0.14 with a runner-up at 36) and a small entropy. Tigon forms log p as (x_t - m) - log s and the
    # entropy as u / s + log s (no lse subtracted); its fp32 error is at most the plain fp32 computation's, which loses
    # digits to ulps of lse ~ 38
    v = 37
    logits = torch.full((4, v), 30.0, device=device)
    target = torch.tensor([0, 5, 17, 36], device=device)
    logits[torch.arange(4), target] = 38.0
    logits[1, 3] = 36.0  # a runner-up
    hidden, weight = logits, torch.eye(v, device=device)  # hidden @ weight.T == logits exactly
    up = [torch.ones(4, dtype=torch.float64, device=device)] * 2
    got, g_got = _run(F.fused_linear_logprobs, hidden, weight, target, None, up, return_entropy=True)
    plain, g_plain = _run(trl_linear_logprobs, hidden, weight, target, None, up, return_entropy=True)
    truth, g_truth = _run(ref_logprobs, hidden, weight, target, None, up, dtype=torch.float64, return_entropy=True)
    assert (truth[0].abs() < 0.2).all() and (truth[1] < 0.5).all()
    for a, p, t in zip([*got[:2], *g_got], [*plain[:2], *g_plain], [*truth[:2], *g_truth]):
        assert rel_l2(a, t) <= max(rel_l2(p, t), 1e-5), (rel_l2(a, t), rel_l2(p, t))


def test_no_grad_and_frozen_weight(device):
    hidden, weight, target, _ = _problem(device, torch.float32)
    with torch.no_grad():
        lp = F.fused_linear_logprobs(hidden.requires_grad_(), weight, target)
    assert not lp.requires_grad
    h = hidden.detach().clone().requires_grad_()
    F.fused_linear_logprobs(h, weight, target).sum().backward()  # a frozen LM head (LoRA): no grad_weight formed
    h64 = hidden.detach().double().requires_grad_()
    ref_logprobs(h64, weight.double(), target).sum().backward()
    assert weight.grad is None and rel_l2(h.grad, h64.grad) <= 1e-5


def test_the_fallback_is_the_reference_exactly(device):
    hidden, weight, target, bias = _problem(device, torch.float32, bias=True, ignore_every=3)
    kw = dict(temperature=0.8, softcap=5.0, return_entropy=True, return_lse=True, return_is_top1=True,
              return_log_sum_sq_probs=True, return_mean_logits=True)
    with support.force_reference():
        got = F.fused_linear_logprobs(hidden, weight, target, bias, **kw)
    want = ref_logprobs(hidden, weight, target, bias, **kw)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("kw", [dict(), dict(return_entropy=True), dict(temperature=0.7, softcap=5.0),
                                dict(return_entropy=True, return_lse=True, temperature=1.3, softcap=4.0)])
def test_is_top1_is_the_first_argmax_of_float64_logits(device, kw):
    # integer-valued hidden states and weights: exact logits, so rows have exact ties (also across the 32-column
    # vocabulary blocks), which follow torch.argmax's first-maximum rule; targets are the first maximum, the last one
    # (False where tied), random, or ignored (False)
    gen = torch.Generator().manual_seed(3)
    n, v = 40, 101
    hidden = torch.randint(-1, 2, (n, H), generator=gen).float().to(device)
    weight = torch.randint(-1, 2, (v, H), generator=gen).float().to(device)
    weight[70] = weight[5]  # a tie across blocks in every row
    logits = hidden.double() @ weight.double().T
    top = logits == logits.max(-1, keepdim=True).values
    cols = torch.arange(v, device=device)
    target = torch.randint(0, v, (n,), generator=gen).to(device)
    target[1::4] = logits.argmax(-1)[1::4]
    target[2::4] = torch.where(top, cols, -1).max(-1).values[2::4]
    target[::4] = -100
    assert (top.sum(-1)[2::4] > 1).any()  # some targets are a later tied maximum
    got = F.fused_linear_logprobs(hidden.requires_grad_(), weight, target, return_is_top1=True, **kw)
    want = ref_logprobs(hidden.double(), weight.double(), target, return_is_top1=True, **kw)
    assert got.is_top1.dtype == torch.bool and not got.is_top1.requires_grad
    assert torch.equal(got.is_top1, want.is_top1)
    assert torch.equal(want.is_top1, (target >= 0) & (logits.argmax(-1) == target))
    assert want.is_top1[1::4].all() and not want.is_top1[::4].any() and want.is_top1.sum() < n
    got.logprobs.sum().backward()  # the log-probabilities stay differentiable beside it
    assert hidden.grad is not None


SQ_CASES = {
    "temperature": dict(temperature=0.7),
    "softcap+temperature+bias": dict(softcap=3.0, temperature=1.4, bias=True),
    "entropy+top1": dict(return_entropy=True, return_is_top1=True, temperature=0.6),
    "entropy+lse+softcap": dict(return_entropy=True, return_lse=True, softcap=2.0, temperature=0.8),
}


@pytest.mark.parametrize("v", [101, pytest.param(157, marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CI time on CPU: 101 runs the same loop (a partial last block)"))])
@pytest.mark.parametrize("case", list(SQ_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("stat", ["log_sum_sq_probs", "mean_logits"])
def test_detached_row_statistics_match_float64(device, dtype, case, v, stat, bf16_full_reductions):
    # log sum_v p_v^2 and the mean scaled logit, from the same pass as the log-probabilities (the vocabulary in
    # 32-column blocks: 4 or 5 of them, the last one partial; 21 tokens in chunks of 8), against the float64 reference
    # (lse(2x) - 2 lse(x); mean_v x_v): fp32 within 1e-5, bf16 no worse than TRL's plain computation (the same of its
    # fp32 logits) up to rounding-tie flips (1.05), every 3rd token ignored (0 there); detached; the other outputs and
    # the gradient of the log-probabilities as without it
    kw = dict(SQ_CASES[case])
    build = {"bias": kw.pop("bias", False)}
    hidden, weight, target, bias = _problem(device, dtype, v=v, ignore_every=3, **build)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (hidden, weight, bias)]
    got = F.fused_linear_logprobs(*leaves[:2], target, leaves[2], **{f"return_{stat}": True}, **kw)
    f64 = [t.double() if t is not None else None for t in (hidden, weight, bias)]
    want = ref_logprobs(f64[0], f64[1], target, f64[2], **{f"return_{stat}": True}, **kw)
    sq = getattr(got, stat)
    assert sq.dtype == torch.float32 and sq.shape == target.shape and not sq.requires_grad
    assert sum(o is not None for o in got) == 1 + sum(k.startswith("return_") for k in kw) + 1
    ignored = target == -100
    assert (sq[ignored] == 0).all() and not torch.signbit(sq[ignored]).any()
    if stat == "log_sum_sq_probs":
        assert (sq[~ignored] <= 0).all() and (sq[~ignored] >= -torch.log(torch.tensor(float(v))) - 1e-5).all()
    err = rel_l2(sq, getattr(want, stat))
    if dtype == torch.float32:
        assert err <= 1e-5, err
    else:
        plain = trl_linear_logprobs(hidden, weight, target, bias, temperature=kw.get("temperature", 1.0),
                                    softcap=kw.get("softcap"), **{f"return_{stat}": True})
        assert err <= max(1.05 * rel_l2(getattr(plain, stat), getattr(want, stat)), 1e-6), err
    base = F.fused_linear_logprobs(*leaves[:2], target, leaves[2], **kw)
    base = base if isinstance(base, tuple) else LogProbsOutput(base)
    for a, b in zip(got[:4], base):
        assert (a is None) == (b is None)
        if a is not None:  # entropy off: the entropy kernel without its sum against the cross-entropy kernel
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    up = torch.randn_like(got.logprobs)
    g_got = torch.autograd.grad(got.logprobs, leaves[:2], up)
    g_base = torch.autograd.grad(base.logprobs, leaves[:2], up)
    for a, b in zip(g_got, g_base):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_log_sum_sq_probs_of_all_ignored_empty_and_one_hot_rows(device):
    hidden, weight, target, _ = _problem(device, torch.float32)
    both = dict(return_log_sum_sq_probs=True, return_mean_logits=True)
    out = F.fused_linear_logprobs(hidden, weight, torch.full_like(target, -100), **both)
    assert (out.log_sum_sq_probs == 0).all() and (out.logprobs == 0).all() and (out.mean_logits == 0).all()
    out = F.fused_linear_logprobs(hidden[:0], weight, target[:0], **both)
    assert out.log_sum_sq_probs.shape == out.mean_logits.shape == (0,)
    # a near one-hot row (log sum p^2 ~ 0) and a uniform one (-log V): the running max moving across blocks
    v = 70
    logits = torch.zeros(3, v, device=device)
    logits[0, 65] = 40.0
    logits[1, 3], logits[1, 40] = 5.0, 9.0
    hidden, weight = logits, torch.eye(v, device=device)
    target = torch.tensor([65, 3, 0], device=device)
    got = F.fused_linear_logprobs(hidden, weight, target, return_log_sum_sq_probs=True).log_sum_sq_probs
    want = ref_logprobs(hidden.double(), weight.double(), target, return_log_sum_sq_probs=True).log_sum_sq_probs
    assert rel_l2(got, want) <= 1e-6 and abs(float(got[2]) + torch.log(torch.tensor(70.0))) <= 1e-6
    assert -1e-6 <= float(got[0]) <= 0


def test_runs_a_kernel(device, monkeypatch):
    import tigon.kernels.fused_linear_logprobs as k

    calls = []
    real = k.rows_forward_entropy
    monkeypatch.setattr(k, "rows_forward_entropy", lambda *a, **kw: (calls.append(1), real(*a, **kw)))
    hidden, weight, target, _ = _problem(device, torch.float32)
    F.fused_linear_logprobs(hidden, weight, target, return_entropy=True)
    # 21 tokens: chunks of 8 on the CPU (the interpreter's rule); on CUDA the rule's 16-row floor makes 2 chunks
    assert len(calls) == (3 if torch.device(device).type == "cpu" else 2)


@pytest.mark.parametrize("bad, error, match", [
    (dict(hidden=torch.randn(4, H + 1)), ValueError, "weight must have shape"),
    (dict(target=torch.zeros(5, dtype=torch.long)), ValueError, "target must have shape"),
    (dict(target=torch.zeros(4)), TypeError, "target"),
    (dict(bias=torch.zeros(7)), ValueError, "bias must have shape"),
    (dict(hidden=torch.randn(4)), ValueError, "hidden"),
    (dict(temperature=0.0), ValueError, "temperature"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(softcap=0.0), ValueError, "softcap"),
    (dict(ignore_index=1.5), TypeError, "ignore_index"),
    (dict(target=torch.tensor([0, 1, 11, -100])), ValueError, "target values must be in"),
    (dict(target=torch.tensor([0, 1, -3, -100])), ValueError, "target values must be in"),
])
def test_bad_input(bad, error, match):
    args = dict(hidden=torch.randn(4, H), weight=torch.randn(11, H), target=torch.tensor([0, 1, 2, -100]),
                bias=None)
    args.update(bad)
    for fn in (F.fused_linear_logprobs, ref_logprobs):
        with pytest.raises(error, match=match):
            fn(**args)


# ---- torch.compile: the custom ops ---------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["forward", "forward_entropy", "forward_top1", "forward_sq", "forward_mean",
                                  "backward", "backward_entropy"])
def test_custom_op_opcheck(device, case):
    import tigon.kernels.fused_linear_logprobs as k  # registers the custom ops

    hidden, weight, target, bias = _problem(device, torch.float32, n=7, v=50, bias=True, ignore_every=3)
    opts = (-100, 3.0, 0.5, torch.float32)
    if case.startswith("forward"):
        args = (hidden.requires_grad_(), weight.requires_grad_(), target, bias.requires_grad_(), *opts,
                case == "forward_entropy", True, True, True, False, -1, case == "forward_top1", case == "forward_sq",
                case == "forward_mean")
        op = torch.ops.tigon.fused_linear_logprobs
    else:
        ent = case == "backward_entropy"
        _, e, _, stats, _, _, _ = k._flp(hidden, weight, target, bias, *opts, ent, True, True, True, True, 4096)
        n = hidden.shape[0]
        args = (torch.randn(n, device=device), torch.randn(n, device=device) if ent else None,
                torch.randn(n, device=device), hidden, weight, target, bias, stats, e, *opts, True, True, False,
                ent, 4096)
        op = torch.ops.tigon.fused_linear_logprobs_backward
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                                "test_aot_dispatch_dynamic"))


@pytest.mark.parametrize("kw", [dict(), dict(return_entropy=True, return_lse=True, return_is_top1=True, softcap=3.0,
                                     temperature=0.7, return_log_sum_sq_probs=True, return_mean_logits=True)])
def test_fullgraph_compile_matches_eager(device, kw, monkeypatch):
    # the compiled graph calls the custom op (the kernels), one node, and gives the eager results
    import tigon.kernels.fused_linear_logprobs as k

    calls = []
    real = k.compiled_fused_linear_logprobs
    monkeypatch.setattr(k, "compiled_fused_linear_logprobs", lambda *a: (calls.append(1), real(*a))[1])
    hidden, weight, target, bias = _problem(device, torch.float32, bias=True, ignore_every=4)

    def fn(h, w, b):
        out = F.fused_linear_logprobs(h, w, target, b, **kw)
        return tuple(o for o in out if o is not None) if isinstance(out, tuple) else (out,)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
        up = _upstream(hidden.shape[0], 3, device)
        results = []
        for f in (fn, compiled):
            leaves = [t.detach().clone().requires_grad_() for t in (hidden, weight, bias)]
            outs = f(*leaves)
            sum((o * u.float()).sum() for o, u in zip(outs, up)).backward()
            results.append([o.detach() for o in outs] + [t.grad for t in leaves])
    finally:
        torch._dynamo.reset()
    assert calls  # traced through the custom op
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_autocast_bf16_with_fp32_parameters(device):
    # under autocast the matmuls run in bf16 (as F.linear would) and the gradients come back in fp32
    hidden, weight, target, bias = _problem(device, torch.float32, bias=True, ignore_every=3)
    up = _upstream(hidden.shape[0], 2, device)
    kw = dict(return_entropy=True, temperature=0.8)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        got, g_got = _run(F.fused_linear_logprobs, hidden, weight, target, bias, up, **kw)
        plain, g_plain = _run(trl_linear_logprobs, hidden, weight, target, bias, up, **kw)
    truth, g_truth = _run(ref_logprobs, hidden, weight, target, bias, up, dtype=torch.float64, **kw)
    assert all(g.dtype == torch.float32 for g in g_got) and got[0].dtype == torch.float32
    for a, p, t in zip([*got[:2], *g_got], [*plain[:2], *g_plain], [*truth[:2], *g_truth]):
        assert rel_l2(a, t) <= max(1.05 * rel_l2(p, t), 1e-6), (rel_l2(a, t), rel_l2(p, t))


@pytest.mark.parametrize("memory", ["low", 0, 1 << 30])
def test_memory_option(device, memory, monkeypatch):
    # fp32: "low" (grad_weight accumulated in the weight's dtype, fp32 here) and byte budgets give the default
    # results; the budget sets the chunks (0: the 16-row floor)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 1 << 18)
    hidden, weight, target, bias = _problem(device, torch.float32, n=40, bias=True, ignore_every=3)
    up = _upstream(hidden.shape[0], 2, device)
    for kw in (dict(), dict(return_entropy=True)):
        got, g_got = _run(F.fused_linear_logprobs, hidden, weight, target, bias, up, memory=memory, **kw)
        want, g_want = _run(F.fused_linear_logprobs, hidden, weight, target, bias, up, **kw)
        for a, b in zip([*got[:2], *g_got], [*want[:2], *g_want]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="memory"):
        F.fused_linear_logprobs(hidden, weight, target, memory="lots")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scaled", [False, True])
def test_row_halves_cast_through_the_scaled_cast_kernel(device, monkeypatch, dtype, scaled):
    # RowHalves.finish's compiled-CUDA path (head_grads.scaled_cast_: one Triton launch per doubling range), on the
    # CPU through the interpreter: bitwise torch's cast (ties to even included), in the accumulator's own memory
    dev = torch.device(device)
    if dev.type == "cpu":
        monkeypatch.setattr(head_grads, "compiled_cuda", lambda device: True)
    acc = head_grads.RowHalves(389, 48, dev)
    acc.a.normal_()
    acc.b.normal_()
    acc.a.view(-1)[:4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, -(1 + 3 * 2**-11)])  # halfway values
    whole, first = torch.cat((acc.a, acc.b)), acc.a.data_ptr()
    scale = torch.tensor(0.37, device=dev) if scaled else None
    got = acc.finish(scale, dtype)
    want = (whole * scale if scaled else whole).to(dtype)
    assert got.shape == (389, 48) and torch.equal(got, want) and got.data_ptr() == first


@pytest.mark.parametrize("flag", ["return_entropy", "return_lse", "return_is_top1", "return_log_sum_sq_probs",
                                  "return_mean_logits"])
@pytest.mark.parametrize("value", [1, None, "yes"])
def test_return_flags_must_be_bools(flag, value):
    """A truthy stand-in (1, "yes") would pick a path silently: each return_* flag must be a bool."""
    h, w, t = torch.randn(3, 8), torch.randn(5, 8), torch.tensor([0, 4, 2])
    with pytest.raises(TypeError, match=f"{flag} must be a bool, got"):
        F.fused_linear_logprobs(h, w, t, **{flag: value})
