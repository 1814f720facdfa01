"""Vocabulary-parallel cross-entropy (tigon.ops.vocab_parallel), shards simulated in one process: the logits (or the
LM head's rows) split into unequal shards passed as a list, so the all-reduces are local reductions over the list
(the same code path as across ranks otherwise). Loss and every gradient against the plain float64 reference on the
concatenated logits, fp32 within 1e-5. Runs compiled on CUDA (the single-GPU part of issue 22) and interpreted on the
CPU; the two-rank gloo run is in tests/test_distributed.py (scenario ``vocab_parallel``)."""

import pytest
import torch

from tigon import functional as F
from tigon import nn as tnn
from tigon.kernels import fused_linear_cross_entropy as kflce
from tigon.reference.cross_entropy import cross_entropy as ref_ce
from tigon.reference.fused_linear_cross_entropy import fused_linear_cross_entropy as ref_flce
from tigon.support import force_reference

N, V, H = 9, 37, 8
CUTS = (0, 16, 29, V)  # three shards of 16, 13 and 8 classes (unequal, none a power of two)

OPTIONS = {
    "mean": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "z_loss": {"lse_square_scale": 1e-3},
    "softcap": {"softcap": 4.0},
    "none": {"reduction": "none"},
    "sum_all": {"reduction": "sum", "label_smoothing": 0.2, "lse_square_scale": 1e-2, "softcap": 3.0},
    "num_items": {"num_items_in_batch": 5},
}


def _targets(device):
    t = torch.randint(0, V, (N,), device=device)
    t[[1, 4]] = -100
    t[2], t[3] = CUTS[1] - 1, CUTS[1]  # the last class of one shard, the first of the next
    return t


def _split(x, dim):
    return [x.narrow(dim, a, b - a) for a, b in zip(CUTS, CUTS[1:])]


def _upstream(ref):
    return torch.randn_like(ref) if ref.dim() else torch.tensor(1.5, dtype=ref.dtype, device=ref.device)


def _close(got, want, what):
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", list(OPTIONS))
def test_cross_entropy_on_shards_equals_the_plain_loss(name, device):
    kw = OPTIONS[name]
    x = (torch.randn(N, V, device=device) * 3).requires_grad_()
    t = _targets(device)
    loss = F.vocab_parallel_cross_entropy(_split(x, 1), t, **kw)
    x64 = x.detach().double().requires_grad_()
    want = ref_ce(x64, t, **kw)
    up = _upstream(want)
    _close(loss, want.detach(), "loss")
    (loss * up.float()).sum().backward()
    (want * up).sum().backward()
    _close(x.grad, x64.grad, "grad logits")


@pytest.mark.parametrize("name", list(OPTIONS))
def test_fused_linear_on_shards_equals_the_plain_loss(name, device, monkeypatch):
    monkeypatch.setattr(kflce, "MAX_CHUNK_ELEMS_CPU", 4 * 16)  # several token chunks on the CPU
    kw = dict(OPTIONS[name], logit_scale=0.8)
    h = torch.randn(N, H, device=device, requires_grad=True)
    w = (torch.randn(V, H, device=device) / 2).requires_grad_()
    b = torch.randn(V, device=device, requires_grad=True)
    t = _targets(device)
    out = F.vocab_parallel_fused_linear_cross_entropy(h, _split(w, 0), t, _split(b, 0), return_z_loss=True, **kw)
    h64, w64, b64 = (p.detach().double().requires_grad_() for p in (h, w, b))
    want = ref_flce(h64, w64, t, b64, return_z_loss=True, **kw)
    _close(out.loss, want.loss.detach(), "loss")
    _close(out.z_loss, want.z_loss, "z_loss")
    up = _upstream(want.loss)
    (out.loss * up.float()).sum().backward()
    (want.loss * up).sum().backward()
    for got, ref, what in ((h.grad, h64.grad, "hidden"), (w.grad, w64.grad, "weight"), (b.grad, b64.grad, "bias")):
        _close(got, ref, f"grad {what}")


def test_reference_backend_gives_the_kernels_result(device):
    x = torch.randn(N, V, device=device) * 3
    t = _targets(device)
    kw = OPTIONS["sum_all"]
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    got = F.vocab_parallel_cross_entropy(_split(xa, 1), t, **kw)
    with force_reference():
        ref = F.vocab_parallel_cross_entropy(_split(xb, 1), t, **kw)
    got.backward()
    ref.backward()
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bf16_head_shards_match_the_plain_fused_loss(reduction, device):
    # bf16 parameters: the weight gradient is cast in its fp32 accumulator's memory (RowHalves) on both paths
    h = torch.randn(20, 16, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(50, 16, device=device) / 4).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, 50, (20,), device=device)
    loss = F.vocab_parallel_fused_linear_cross_entropy(h, [w[:30], w[30:]], t, reduction=reduction)
    loss.sum().backward()
    gh, gw = h.grad, w.grad
    h.grad = w.grad = None
    F.fused_linear_cross_entropy(h, w, t, reduction=reduction).sum().backward()
    assert gh.dtype == gw.dtype == torch.bfloat16
    torch.testing.assert_close(gh, h.grad, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(gw, w.grad, rtol=2e-2, atol=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on shards: compiled kernels only")
@pytest.mark.gpu
def test_bf16_head_on_shards_matches_the_unsharded_fused_loss():
    h = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(1000, 256, device="cuda") / 16).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, 1000, (64,), device="cuda")
    cuts = (0, 500, 1000)
    loss = F.vocab_parallel_fused_linear_cross_entropy(h, [w[a:b] for a, b in zip(cuts, cuts[1:])], t)
    loss.backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    ref = F.fused_linear_cross_entropy(h, w, t)
    ref.backward()
    # bf16 logits from matmuls of other shapes (cuBLAS may round them differently): bf16-level agreement
    torch.testing.assert_close(loss, ref, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(gh.float(), h.grad.float(), rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(gw.float(), w.grad.float(), rtol=2e-2, atol=2e-3)


def test_bad_arguments_name_the_argument():
    x, t = torch.randn(4, 10), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="vocab_start"):
        F.vocab_parallel_cross_entropy(x, t)
    with pytest.raises(ValueError, match="vocab_start must be an int >= 0"):
        F.vocab_parallel_cross_entropy(x, t, vocab_start=-1)
    with pytest.raises(ValueError, match="group and vocab_start must be None"):
        F.vocab_parallel_cross_entropy([x], t, vocab_start=0)
    with pytest.raises(ValueError, match=r"target values must be in \[0, 15\)"):
        F.vocab_parallel_cross_entropy([x, torch.randn(4, 5)], torch.tensor([0, 1, 15, 2]))
    with pytest.raises(ValueError, match="vocab_size=12 but the shards of logits hold 10"):
        F.vocab_parallel_cross_entropy([x], t, vocab_size=12)
    with pytest.raises(ValueError, match="target must have shape"):
        F.vocab_parallel_cross_entropy([x], t[:3])
    with pytest.raises(ValueError, match="bias must have one shard per weight shard"):
        F.vocab_parallel_fused_linear_cross_entropy(torch.randn(4, 3), [torch.randn(5, 3), torch.randn(5, 3)], t,
                                                    [torch.randn(10)])


# ---- tigon.nn.VocabParallelCrossEntropy: Liger-Kernel's LigerVocabParallelCrossEntropy module --------------------
def _seq_batch(device, s=3, b=4, v=V):
    # Liger's (S, B, V_local) logits and (S, B) global targets, two ignored
    g = torch.Generator().manual_seed(3)
    x = (2 * torch.randn(s, b, v, generator=g)).to(device)
    t = torch.randint(0, v, (s, b), generator=g).to(device)
    t[0, 1] = t[2, 3] = -100
    return x, t


@pytest.mark.parametrize("formula", ["pytorch", "megatron"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_liger_vocab_parallel_module_at_one_rank(formula, smoothing, device):
    # tp_group=None (Liger: TP=1): per-token losses (S, B) float32, 0 where ignored; "pytorch" smoothing is torch's,
    # "megatron" torch's with alpha * V / (V - 1); "partition" equals "global" at one rank
    x, t = _seq_batch(device)
    want_ls = smoothing * V / (V - 1) if formula == "megatron" else smoothing
    x64 = x.double().requires_grad_()
    want = torch.nn.functional.cross_entropy(x64.view(-1, V), t.view(-1), reduction="none",
                                             label_smoothing=want_ls).view(t.shape)
    for mode in ("global", "partition"):
        module = tnn.VocabParallelCrossEntropy(-100, smoothing, "none", formula, mode)
        xg = x.clone().requires_grad_()
        got = module(xg, t)
        assert got.shape == t.shape and got.dtype == torch.float32
        _close(got, want.detach(), f"loss {formula} {mode}")
        up = torch.randn_like(got)
        got.backward(up)
        (want_grad,) = torch.autograd.grad(want, x64, up.double(), retain_graph=True)
        _close(xg.grad, want_grad, f"grad {formula} {mode}")
    assert "label_smoothing_formula" in repr(module)


def test_liger_vocab_parallel_module_passes_the_rank_shard(monkeypatch):
    # at TP > 1 the shard of rank r holds classes [r * V_local, (r + 1) * V_local) (Liger's, Megatron's layout)
    import tigon.nn.vocab_parallel as vp

    seen = {}

    def fake(logits, target, **kw):
        seen.update(kw, logits_shape=tuple(logits.shape), target_shape=tuple(target.shape))
        return torch.zeros(target.shape)

    group = object()
    monkeypatch.setattr(vp, "_rank_and_world", lambda g: (1, 2) if g is group else (0, 1))
    monkeypatch.setattr(vp.TF, "vocab_parallel_cross_entropy", fake)
    x, t = torch.randn(3, 4, 10), torch.zeros(3, 4, dtype=torch.long)
    out = tnn.VocabParallelCrossEntropy(label_smoothing=0.1, label_smoothing_formula="megatron")(x, t, group)
    assert out.shape == (3, 4)
    assert seen["group"] is group and seen["vocab_start"] == 10 and seen["vocab_size"] == 20
    assert seen["reduction"] == "none" and seen["logits_shape"] == (12, 10) and seen["target_shape"] == (12,)
    assert seen["label_smoothing"] == pytest.approx(0.1 * 20 / 19)
    with pytest.raises(ValueError, match="label_smoothing_mode='partition'"):
        tnn.VocabParallelCrossEntropy(label_smoothing=0.1, label_smoothing_mode="partition")(x, t, group)


def test_liger_vocab_parallel_module_errors_name_the_argument():
    for kw, match in ((dict(reduction="mean"), "reduction must be 'none'"),
                      (dict(label_smoothing=1.0), r"label_smoothing must be in \[0, 1\)"),
                      (dict(label_smoothing_formula="x"), "label_smoothing_formula must be one of"),
                      (dict(label_smoothing_mode="x"), "label_smoothing_mode must be one of")):
        with pytest.raises(ValueError, match=match):
            tnn.VocabParallelCrossEntropy(**kw)
    with pytest.raises(ValueError, match=r"vocab_parallel_logits must be 3-D \(\[seq, batch, vocab\]\)"):
        tnn.VocabParallelCrossEntropy()(torch.randn(4, 10), torch.zeros(4, dtype=torch.long))


@pytest.mark.parametrize("op", ["ce", "flce"])
def test_ignore_index_and_return_z_loss_are_checked(op):
    # ignore_index=True was taken for 1 (tokens of class 1 silently ignored) and -100.5 for -100; return_z_loss=1 for
    # True (cross_entropy refuses all three)
    x, t = torch.randn(4, 10), torch.tensor([0, 1, 1, 3])

    def call(**kw):
        if op == "ce":
            return F.vocab_parallel_cross_entropy([x], t, **kw)
        return F.vocab_parallel_fused_linear_cross_entropy(x, [torch.randn(7, 10)], torch.tensor([0, 1, 1, 3]), **kw)

    for bad in (True, -100.5, "-100", None):
        with pytest.raises(TypeError, match="ignore_index must be an int"):
            call(ignore_index=bad)
    with pytest.raises(TypeError, match="return_z_loss must be a bool"):
        call(return_z_loss=1)
    assert call(ignore_index=torch.tensor(1)).shape == ()  # (a one-element integer tensor is an int, as elsewhere)


def test_liger_vocab_parallel_module_checks_the_target_against_the_logits():
    # (S, B, V) logits with (B, S) targets: each was paired with another token's logits (the same number of
    # elements), a silently wrong (B, S) loss; a list target failed with "'list' object has no attribute 'shape'"
    x, t = _seq_batch("cpu", s=3, b=4)
    module = tnn.VocabParallelCrossEntropy()
    for bad in (t.t().contiguous(), t.reshape(-1), t.reshape(2, 6)):
        with pytest.raises(ValueError, match=r"target must have shape \(3, 4\)"):
            module(x, bad)
    with pytest.raises(TypeError, match="target must be a torch.Tensor"):
        module(x, t.tolist())


def test_liger_vocab_parallel_module_megatron_smoothing_needs_two_classes_and_stays_below_one():
    # Megatron's alpha * V / (V - 1): V = 1 was a ZeroDivisionError; alpha = 0.6 at V = 2 is 1.2, refused by the
    # functional op as "label_smoothing ... got 1.2", a value the caller never gave
    module = tnn.VocabParallelCrossEntropy(label_smoothing=0.6, label_smoothing_formula="megatron")
    for v in (1, 2):
        x, t = torch.randn(3, 4, v), torch.zeros(3, 4, dtype=torch.long)
        with pytest.raises(ValueError, match=r"label_smoothing=0.6 with label_smoothing_formula='megatron'"):
            module(x, t)
    assert tnn.VocabParallelCrossEntropy(label_smoothing_formula="megatron")(x, t).shape == (3, 4)  # (0: no scaling)
