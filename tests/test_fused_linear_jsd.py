"""fused_linear_jsd / nn.FusedLinearJSD / nn.FusedLinearJSDLoss: the distillation loss of two LM heads in chunks,
against TRL's GKD loss (``GKDTrainer.generalized_jsd_loss``) on float64 logits, the float64 reference and the plain
computation's own bf16 error."""

import os
import warnings

import numpy as np
import pytest
import torch

import tigon.kernels.divergence as divergence
import tigon.kernels.fused_linear_cross_entropy as flce_ops
from tigon import functional as F
from tigon import nn as tnn
from tigon import support
from tigon.numerics import rel_l2
from tigon.ops.fused_linear_jsd import plain_linear_jsd
from tigon.reference.fused_linear_jsd import fused_linear_jsd as ref_jsd

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _gkd():
    """TRL's GKD trainer module (the tests that compare with TRL skip without it; the others run, on the GPU image
    too, which has no TRL)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("trl.experimental.gkd.gkd_trainer")

N, H, HT, V = 13, 16, 24, 37


KERNEL_BACKEND = "triton" if torch.cuda.is_available() else "interpreter"


@pytest.fixture(autouse=True)
def small_chunks(request, monkeypatch):
    # chunks of 4 rows and vocabulary blocks of 16 columns: both loops run several times (not at the GPU sizes, where
    # the chunk rule itself makes several)
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 4 * V)
        monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CUDA", 4 * V)
        monkeypatch.setattr(divergence, "MAX_BLOCK_V", 16)


@pytest.fixture(params=["stacked rows", "one row per program"])
def layout(request, monkeypatch, small_chunks):
    # the row kernel's two paths: rows stacked in a program (narrow rows) or one row per program (wide rows, the GPU
    # sizes: a skipped row writes its zeros without reading, a kept one is read with no row mask)
    if request.param == "one row per program":
        monkeypatch.setattr(divergence, "TILE", divergence.MAX_BLOCK_V)
        monkeypatch.setattr(divergence, "INTERPRETER_TILE", divergence.MAX_BLOCK_V)
    return request.param


def _problem(dtype, ignore_every=3, labels=True, bias=False, seed=0, device="cpu", n=N, h=H, ht=HT, v=V):
    """Student (n, h), (v, h) and teacher (n, ht), (v, ht) hidden states and heads (logits of std ~2), labels with
    every ``ignore_every``-th ignored, optional biases; built on the CPU from ``seed``, moved to ``device``."""
    g = torch.Generator().manual_seed(seed)
    out = dict(student_input=torch.randn(n, h, generator=g), student_weight=torch.randn(v, h, generator=g) * 2 / h**0.5,
               teacher_input=torch.randn(n, ht, generator=g),
               teacher_weight=torch.randn(v, ht, generator=g) * 2 / ht**0.5)
    if bias:
        out["student_bias"] = torch.randn(v, generator=g) * 0.5
        out["teacher_bias"] = torch.randn(v, generator=g) * 0.5
    out = {k: t.to(dtype) for k, t in out.items()}
    if labels:
        lab = torch.randint(0, v, (n,), generator=g)
        if ignore_every:
            lab[::ignore_every] = -100
        out["shift_labels"] = lab
    return {k: t.to(device) for k, t in out.items()}


def _run(fn, p, dtype=None, upstream=1.0, **kw):
    """(loss, grads of student_input / student_weight (/ student_bias)) of ``fn`` on leaf copies cast to ``dtype``."""
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    p = {k: cast(v) if v.is_floating_point() else v for k, v in p.items()}
    grads_of = [k for k in ("student_input", "student_weight", "student_bias") if k in p]
    for k in grads_of:
        p[k] = p[k].detach().clone().requires_grad_()
    loss = fn(**p, **kw)
    grads = torch.autograd.grad(loss * upstream, [p[k] for k in grads_of])
    return loss.detach(), grads


def _trl(student_input, student_weight, teacher_input, teacher_weight, shift_labels=None, jsd_beta=0.5,
         temperature=1.0, student_bias=None, teacher_bias=None, student_softcap=None, teacher_softcap=None, **_):
    # the models' logits (soft-capped by a Gemma 2 forward: c tanh(z / c)), then TRL's GKD loss on them
    zs = torch.nn.functional.linear(student_input, student_weight, student_bias)
    zt = torch.nn.functional.linear(teacher_input, teacher_weight, teacher_bias)
    zs, zt = (z if c is None else c * torch.tanh(z / c) for z, c in ((zs, student_softcap), (zt, teacher_softcap)))
    return _gkd().GKDTrainer.generalized_jsd_loss(zs, zt, shift_labels, beta=jsd_beta, temperature=temperature)


CASES = {
    "beta=0.5, ignored rows": (dict(), dict()),
    "beta=0, temperature=2": (dict(jsd_beta=0.0, temperature=2.0), dict()),
    "beta=1, temperature=0.7": (dict(jsd_beta=1.0, temperature=0.7), dict(ignore_every=4)),
    "beta=0.1, no labels, biases": (dict(jsd_beta=0.1), dict(labels=False, bias=True)),
    "beta=0.3, soft-caps 2 / 1.5, biases": (dict(jsd_beta=0.3, temperature=0.8, student_softcap=2.0,
                                                 teacher_softcap=1.5), dict(bias=True)),
    "beta=1, student soft-cap 3": (dict(jsd_beta=1.0, student_softcap=3.0), dict(ignore_every=4)),
    "beta=0, teacher soft-cap 3": (dict(jsd_beta=0.0, teacher_softcap=3.0), dict()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_trl_gkd_loss_and_float64_reference_in_fp32(case, device, layout):
    # loss and gradients within 1e-5 of TRL's GKD loss on float64 logits; the float64 reference is that same value
    kw, build = CASES[case]
    p = _problem(torch.float32, device=device, **build)
    support.backend_usage(reset=True)
    loss, grads = _run(F.fused_linear_jsd, p, **kw)
    assert support.backend_usage()["fused_linear_jsd"] == {KERNEL_BACKEND: 1}
    want, want_grads = _run(_trl, p, torch.float64, **kw)
    ref, ref_grads = _run(ref_jsd, p, torch.float64, **kw)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert rel_l2(ref, want) <= 1e-12 and rel_l2(loss, want) <= 1e-5, (rel_l2(loss, want))
    for g, w, r in zip(grads, want_grads, ref_grads):
        assert g.dtype == torch.float32 and rel_l2(g, w) <= 1e-5, rel_l2(g, w)
        assert rel_l2(r, w) <= 1e-12


@pytest.mark.parametrize("case", ["beta=0.5, ignored rows", "beta=1, temperature=0.7",
                                  "beta=0.3, soft-caps 2 / 1.5, biases"])
def test_bf16_no_worse_than_the_plain_computation(case, device):
    # bf16 heads: error against float64 at most the plain computation's (LM heads in bf16, fp32 log-softmax and
    # JSD), up to rounding ties (1.05)
    kw, build = CASES[case]
    p = _problem(torch.bfloat16, seed=1, device=device, **build)
    loss, grads = _run(F.fused_linear_jsd, p, **kw)
    plain, plain_grads = _run(plain_linear_jsd, p, **kw)
    truth, truth_grads = _run(ref_jsd, p, torch.float64, **kw)
    for name, a, b, t in [("loss", loss, plain, truth), *zip(("input", "weight"), grads, plain_grads, truth_grads)]:
        assert rel_l2(a, t) <= max(1.05 * rel_l2(b, t), 1e-6), (name, rel_l2(a, t), rel_l2(b, t))
    assert [g.dtype for g in grads] == [torch.bfloat16] * (3 if build.get("bias") else 2)


def test_upstream_scaling_memory_budget_and_a_second_backward(device):
    # also: a forward and backward runs the student's logits and two gradients (3 head matmuls) and the teacher's
    # logits (HT / H of one: its head is wider)
    from tigon.workflows.matmul_count import head_matmuls

    p = _problem(torch.float32, device=device)
    out = []
    assert head_matmuls(lambda: out.append(_run(F.fused_linear_jsd, p)), N, H, V) == 3 + HT / H
    loss, grads = out[0]
    _, grads3 = _run(F.fused_linear_jsd, p, upstream=3.0)
    _, grads_small = _run(F.fused_linear_jsd, p, memory=16 * V * 40)  # a budget under the 16-row floor
    _, grads_lean = _run(F.fused_linear_jsd, p, memory="low")
    for g, g3, gs, gl in zip(grads, grads3, grads_small, grads_lean):
        assert torch.allclose(3 * g, g3, rtol=1e-6, atol=0)
        assert torch.allclose(g, gs, rtol=1e-5, atol=1e-7) and torch.allclose(g, gl, rtol=1e-5, atol=1e-7)
    x = p["student_input"].clone().requires_grad_()
    loss = F.fused_linear_jsd(x, p["student_weight"], p["teacher_input"], p["teacher_weight"], p["shift_labels"])
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()


def test_teacher_gets_no_gradient_and_inputs_are_not_written(device):
    p = _problem(torch.float32, bias=True, device=device)
    before = {k: v.clone() for k, v in p.items()}
    t_in = p["teacher_input"].requires_grad_()
    x = p["student_input"].requires_grad_()
    F.fused_linear_jsd(x, p["student_weight"], t_in, p["teacher_weight"], p["shift_labels"],
                       student_bias=p["student_bias"], teacher_bias=p["teacher_bias"]).backward()
    assert t_in.grad is None and x.grad is not None
    assert all(torch.equal(p[k].detach(), v) for k, v in before.items())


@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_near_identical_student_and_teacher(device, beta):
    """Late distillation: the divergence is second order in the gap between the two while the direct form's terms
    are first order, so that form cancels (5e-2 relative at a 1e-3 gap under the interpreter, before the series of
    kernels.divergence_terms._jsd_parts). Bound 1e-3 relative (measured <= 7e-5: the fp32 log-softmax of the logits,
    not the divergence, is what remains; plain fp32 PyTorch is off by up to 5e-2 here)."""
    g = torch.Generator().manual_seed(3)
    # 8 rows on CPU (CI time: interpreted, a row costs ~0.25 s a beta); rows are independent problems
    n, h, v = 24 if device == "cuda" else 8, 16, 301
    w = torch.randn(v, h, generator=g).to(device)
    hs = torch.randn(n, h, generator=g).to(device)
    ht = hs + 1e-3 * torch.randn(n, h, generator=g).to(device)
    got = F.fused_linear_jsd(hs, w, ht, w, jsd_beta=beta).double()
    truth = ref_jsd(hs.double(), w.double(), ht.double(), w.double(), jsd_beta=beta)
    torch.testing.assert_close(got, truth, rtol=1e-3, atol=0)


# (the interpreter's discarded -inf - -inf is silenced at its launch)
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_extreme_logits_and_a_masked_vocabulary(device, layout, beta):
    # logits of std ~30 (gaps of hundreds of nats: most probabilities underflow in fp32) and -inf biases (a masked
    # vocabulary: the same entries for both models at beta 0 and 1, where a -inf against a positive probability is an
    # infinite KL; different ones for 0 < beta < 1), ignored rows, temperature 0.8. The loss within 1e-5 of the
    # float64 reference; the student's gradients within 1e-5 or 2x the plain fp32 computation's error: at
    # 0 < beta < 1 the logits' gradient (g - Q sum g) cancels to about 2% in any fp32 evaluation here (plain PyTorch
    # 1.7e-2 .. 4.4e-2, measured; the kernel, on the CPU, 0.8e-2 .. 4.3e-2), at beta 0 and 1 about 1e-6
    p = _problem(torch.float32, bias=True, seed=5, device=device)
    p["student_weight"] = p["student_weight"] * 15
    p["teacher_weight"] = p["teacher_weight"] * 15
    g = torch.Generator().manual_seed(7)
    mask = torch.rand(V, generator=g) < 0.2
    for key in ("teacher_bias", "student_bias"):
        if 0.0 < beta < 1.0:
            mask = torch.rand(V, generator=g) < 0.2
        p[key] = p[key].masked_fill(mask.to(p[key].device), float("-inf"))
    kw = dict(jsd_beta=beta, temperature=0.8)
    loss, grads = _run(F.fused_linear_jsd, p, **kw)
    _, plain_grads = _run(plain_linear_jsd, p, **kw)
    ref, ref_grads = _run(ref_jsd, p, torch.float64, **kw)
    assert torch.isfinite(loss) and rel_l2(loss, ref) <= 1e-5, (float(loss), float(ref))
    for name, a, b, r in zip(("input", "weight", "bias"), grads, plain_grads, ref_grads):
        assert torch.isfinite(a).all() and rel_l2(a, r) <= max(2 * rel_l2(b, r), 1e-5), (name, rel_l2(a, r),
                                                                                          rel_l2(b, r))


# (the interpreter's discarded -inf - -inf is silenced at its launch)
@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("v", [2, 16, 48])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_vocabularies_of_whole_blocks(device, layout, v, beta):
    # V a multiple of the (16-column) block: every pass walks whole blocks only, no ragged one; V = 2 one block
    p = _problem(torch.float32, v=v, device=device)
    kw = dict(jsd_beta=beta, temperature=1.5)
    loss, grads = _run(F.fused_linear_jsd, p, **kw)
    ref, ref_grads = _run(ref_jsd, p, torch.float64, **kw)
    assert rel_l2(loss, ref) <= 1e-5 and all(rel_l2(a, r) <= 1e-5 for a, r in zip(grads, ref_grads))


def test_all_rows_ignored_gives_zero_loss_and_gradients(device, layout):
    p = _problem(torch.float32, ignore_every=1, device=device)
    loss, grads = _run(F.fused_linear_jsd, p)
    assert float(loss) == 0.0 and all(float(g.abs().max()) == 0.0 for g in grads)


def test_modules_are_liger_drop_ins(device):
    # LigerFusedLinearJSD's arguments; LigerFusedLinearJSDLoss's hard (CE on raw logits) + soft (JSD / T) mix
    p = _problem(torch.float32, bias=True, device=device)
    args = [p[k] for k in ("student_input", "student_weight", "teacher_input", "teacher_weight")]
    module = tnn.FusedLinearJSD(jsd_beta=0.2, temperature=1.5)
    assert torch.equal(module(*args, p["shift_labels"]), F.fused_linear_jsd(*args, p["shift_labels"], 0.2,
                                                                          temperature=1.5))
    loss_fn = tnn.FusedLinearJSDLoss(weight_hard_loss=0.3, weight_soft_loss=0.7, beta=0.2, temperature=1.5,
                                     return_soft_hard_loss=True)
    loss, soft, hard = loss_fn(*args, p["shift_labels"], p["student_bias"], p["teacher_bias"])
    with torch.no_grad():
        want_soft = _trl(*[a.double() for a in args], p["shift_labels"], 0.2, 1.5, p["student_bias"].double(),
                         p["teacher_bias"].double())
        logits = torch.nn.functional.linear(args[0].double(), args[1].double(), p["student_bias"].double())
        want_hard = torch.nn.functional.cross_entropy(logits, p["shift_labels"])
    assert rel_l2(soft, want_soft) <= 1e-5 and rel_l2(hard, want_hard) <= 1e-5
    assert rel_l2(loss, 0.3 * want_hard + 0.7 * want_soft) <= 1e-5


def test_loss_module_takes_ligers_batch_by_sequence_layout(device):
    # TRL's GKD trainer hands LigerFusedLinearJSDLoss (B, T, H) hidden states and (B, T) labels (its chunks run over
    # dim 0, so Liger takes them): the same loss as the flattened rows, gradients in the caller's shape
    p = _problem(torch.float32, bias=True, device=device, n=12)
    args = [p[k] for k in ("student_input", "student_weight", "teacher_input", "teacher_weight")]
    loss_fn = tnn.FusedLinearJSDLoss(weight_hard_loss=0.3, weight_soft_loss=0.7, return_soft_hard_loss=True)
    flat = [a.detach().requires_grad_() for a in args]
    want = loss_fn(*flat, p["shift_labels"], p["student_bias"], p["teacher_bias"])
    want[0].backward()
    seq = [a.detach().view(3, 4, -1).requires_grad_() if a.shape[0] == 12 else a.detach().requires_grad_()
           for a in args]
    got = loss_fn(*seq, p["shift_labels"].view(3, 4), p["student_bias"], p["teacher_bias"])
    got[0].backward()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    assert seq[0].grad.shape == (3, 4, H)
    torch.testing.assert_close(seq[0].grad.view(12, H), flat[0].grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(seq[1].grad, flat[1].grad, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="true_labels must have shape"):
        loss_fn(*seq, p["shift_labels"], p["student_bias"], p["teacher_bias"])


def test_modules_take_the_soft_caps(device):
    # Tigon's keywords on the Liger drop-ins (Gemma 2 distillation): the student's cap in both losses (its logits
    # are capped), the teacher's in the soft one; TRL's GKD loss and the cross-entropy on capped float64 logits
    p = _problem(torch.float32, bias=True, device=device)
    args = [p[k] for k in ("student_input", "student_weight", "teacher_input", "teacher_weight")]
    caps = dict(student_softcap=2.0, teacher_softcap=1.5)
    module = tnn.FusedLinearJSD(jsd_beta=0.3, temperature=0.8, **caps)
    assert "student_softcap=2.0, teacher_softcap=1.5" in repr(module)
    assert torch.equal(module(*args, p["shift_labels"]),
                       F.fused_linear_jsd(*args, p["shift_labels"], 0.3, temperature=0.8, **caps))
    loss_fn = tnn.FusedLinearJSDLoss(weight_hard_loss=0.3, weight_soft_loss=0.7, beta=0.3, temperature=0.8,
                                     return_soft_hard_loss=True, **caps)
    loss, soft, hard = loss_fn(*args, p["shift_labels"], p["student_bias"], p["teacher_bias"])
    with torch.no_grad():
        want_soft = _trl(*[a.double() for a in args], p["shift_labels"], 0.3, 0.8, p["student_bias"].double(),
                         p["teacher_bias"].double(), **caps)
        logits = torch.nn.functional.linear(args[0].double(), args[1].double(), p["student_bias"].double())
        want_hard = torch.nn.functional.cross_entropy(2.0 * torch.tanh(logits / 2.0), p["shift_labels"])
    assert rel_l2(soft, want_soft) <= 1e-5 and rel_l2(hard, want_hard) <= 1e-5
    assert rel_l2(loss, 0.3 * want_hard + 0.7 * want_soft) <= 1e-5


def test_bad_input_is_refused_with_a_clear_error(device):
    p = _problem(torch.float32, device=device)
    args = [p[k] for k in ("student_input", "student_weight", "teacher_input", "teacher_weight")]
    with pytest.raises(ValueError, match="jsd_beta must be in"):
        F.fused_linear_jsd(*args, jsd_beta=1.5)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        F.fused_linear_jsd(*args, temperature=0.0)
    with pytest.raises(ValueError, match="one vocabulary size"):
        F.fused_linear_jsd(*args[:3], args[3][:-1])
    with pytest.raises(ValueError, match="teacher_weight must have shape"):
        F.fused_linear_jsd(*args[:3], args[1])
    with pytest.raises(ValueError, match="shift_labels must have shape"):
        F.fused_linear_jsd(*args, p["shift_labels"][:-1])
    with pytest.raises(TypeError, match="true_labels must be a tensor .* for the hard loss"):
        tnn.FusedLinearJSDLoss(weight_hard_loss=0.5)(*args, None)
    assert torch.isfinite(tnn.FusedLinearJSDLoss(weight_hard_loss=0.0)(*args, None))  # (the soft loss alone)
    # the weights were not checked: None said "unsupported operand type(s) for *", a str "only integer tensors of a
    # single element can be converted to an index", naming neither
    for name, bad, error in (("weight_hard_loss", None, TypeError), ("weight_soft_loss", "0.5", TypeError),
                             ("weight_hard_loss", float("nan"), ValueError)):
        with pytest.raises(error, match=name):
            tnn.FusedLinearJSDLoss(**{name: bad})(*args, p["shift_labels"])
    # what Liger-Kernel takes stays taken: a numpy scalar, a 0-d tensor (multiplied as it is)
    want = tnn.FusedLinearJSDLoss(weight_hard_loss=0.25, weight_soft_loss=0.75)(*args, p["shift_labels"])
    for hard, soft in ((np.float32(0.25), np.float32(0.75)), (torch.tensor(0.25), torch.tensor(0.75))):
        got = tnn.FusedLinearJSDLoss(weight_hard_loss=hard, weight_soft_loss=soft)(*args, p["shift_labels"])
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-6, atol=0)
    with pytest.raises(TypeError, match="weight_soft_loss must be a real number or a 0-d floating tensor"):
        tnn.FusedLinearJSDLoss(weight_soft_loss=torch.ones(2))(*args, p["shift_labels"])
    with pytest.raises(ValueError, match="accum_dtype must be"):
        F.fused_linear_jsd(*args, accum_dtype=torch.float16)
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ValueError, match="student_softcap must be None or a finite float > 0"):
            F.fused_linear_jsd(*args, student_softcap=bad)
        with pytest.raises(ValueError, match="teacher_softcap must be None or a finite float > 0"):
            ref_jsd(*args, teacher_softcap=bad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="LM-head sizes need a GPU (compiled kernels)")
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_gpu_llm_head_sizes_bf16_no_worse_than_plain_and_less_memory(beta):
    # 4096 tokens (2048 under 120 GiB), student hidden 1024, teacher hidden 2048, vocabulary 128256, bf16, 10% of
    # the rows ignored, a 1 GiB budget (several chunks): error against float64 at most the plain computation's; peak
    # extra memory under the plain computation's (which holds both models' (N, V) logits)
    # 2048 tokens on a card under 120 GiB: the float64 truth and the plain computation's logits of 4096 tokens took
    # more than an H100's 79 GiB (out of memory at beta = 0)
    n = 4096 if torch.cuda.get_device_properties(0).total_memory >= 120 * 2**30 else 2048
    p = _problem(torch.bfloat16, ignore_every=10, seed=3, device="cuda", n=n, h=1024, ht=2048, v=128256)
    kw = dict(jsd_beta=beta, temperature=2.0)

    def peak(fn, **extra):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = _run(fn, p, **kw, **extra)
        torch.cuda.synchronize()
        return out, torch.cuda.max_memory_allocated() - base

    (loss, grads), mem = peak(F.fused_linear_jsd, memory=1 << 30)
    (plain, plain_grads), plain_mem = peak(plain_linear_jsd)
    truth, truth_grads = _run(ref_jsd, p, torch.float64, **kw)
    # floor 2e-6: the scalar loss is an fp32 sum over 4096 rows in another order than the plain computation's (a few
    # fp32 ulps of 1.2e-7; an H100 measured 1.09e-6 against the plain 8.6e-7 at beta = 1, where both are exact to fp32)
    for name, a, b, t in [("loss", loss, plain, truth), *zip(("input", "weight"), grads, plain_grads, truth_grads)]:
        assert rel_l2(a, t) <= max(1.05 * rel_l2(b, t), 2e-6), (name, rel_l2(a, t), rel_l2(b, t))
    assert mem < plain_mem, (mem, plain_mem)


@pytest.mark.parametrize("caps", [(None, None), (2.0, 3.0)], ids=["no soft-cap", "soft-caps"])
def test_custom_op_and_compile(device, caps):
    # the custom op's schema, fake and autograd registration; a compiled call equals the eager one
    import tigon.kernels.fused_linear_jsd  # noqa: F401 (registers the custom op)

    p = _problem(torch.float32, bias=True, device=device)
    args = [p[k].clone().requires_grad_(k.startswith("student")) for k in
            ("student_input", "student_weight", "teacher_input", "teacher_weight")]
    torch.library.opcheck(torch.ops.tigon.fused_linear_jsd,
                          (*args, p["shift_labels"], p["student_bias"].clone().requires_grad_(), p["teacher_bias"],
                           0.3, -100, 1.5, torch.float32, True, True, True, False, -1, *caps),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))

    def fn(x, w):
        return F.fused_linear_jsd(x, w, p["teacher_input"], p["teacher_weight"], p["shift_labels"], 0.3,
                                  temperature=1.5, student_softcap=caps[0], teacher_softcap=caps[1])

    x, w = p["student_input"].clone().requires_grad_(), p["student_weight"].clone().requires_grad_()
    want = fn(x, w)
    want_grads = torch.autograd.grad(want * 2.0, (x, w))
    support.backend_usage(reset=True)
    got = torch.compile(fn, backend="aot_eager", fullgraph=True)(x, w)
    assert support.backend_usage()["fused_linear_jsd"] == {KERNEL_BACKEND: 1}  # the custom op, not the reference
    got_grads = torch.autograd.grad(got * 2.0, (x, w))
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-8) for a, b in zip(got_grads, want_grads))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_skipping_ignored_rows_changes_nothing(device, dtype, beta, monkeypatch):
    # ignored tokens (a masked prompt: the first 7 rows, and every third after) are left out of the four head matmuls
    # (tigon.kernels.ignored_rows): the same loss and gradients as computing every row; grad_input's ignored rows 0
    import tigon.kernels.ignored_rows as ignored_rows

    p = _problem(dtype, ignore_every=3, bias=True, device=device)
    p["shift_labels"][:7] = -100
    seen = []
    real = ignored_rows.kept_rows
    monkeypatch.setattr(ignored_rows, "kept_rows", lambda *a, **k: seen.append(r := real(*a, **k)) or r)
    every = _run(F.fused_linear_jsd, p, upstream=0.7, jsd_beta=beta)
    assert all(r is None for r in seen)  # the test head is far below SKIP_MIN_MACS
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", 0)
    kept = _run(F.fused_linear_jsd, p, upstream=0.7, jsd_beta=beta)
    assert seen[-1] is not None and seen[-1].numel() == int((p["shift_labels"] != -100).sum())
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-4)
    for a, b in zip((every[0], *every[1]), (kept[0], *kept[1])):
        torch.testing.assert_close(a, b, **tol)
    assert (kept[1][0][p["shift_labels"] == -100] == 0).all()
    # under a byte budget (which does not count the gathered rows) or the lean plan: every row
    import tigon.kernels.fused_linear_jsd as kjsd

    decided = []
    real_chunks = kjsd.kept_for_chunks
    monkeypatch.setattr(kjsd, "kept_for_chunks", lambda *a: decided.append(r := real_chunks(*a)) or r)
    _run(F.fused_linear_jsd, p, jsd_beta=beta)
    _run(F.fused_linear_jsd, p, jsd_beta=beta, memory=1 << 20)
    _run(F.fused_linear_jsd, p, jsd_beta=beta, memory="low")
    assert len(decided) == 3 and decided[0] is not None and decided[1] is None and decided[2] is None
