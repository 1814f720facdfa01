"""Paired preference losses (DPO and TRL's variants, SimPO, CPO, ORPO): the formulas against TRL 1.16's own code
(DPOTrainer._compute_loss, CPOTrainer.cpo_loss, ORPOTrainer.odds_ratio_loss, run on stand-ins for the trainer and the
model), the fused path against float64 (loss and every gradient), bf16 against the plain PyTorch computation, the nn
modules' Liger-Kernel call signatures (and Liger itself when installed), and the errors."""

import collections
import functools
import importlib.util
import math
import types

import pytest
import torch

from tigon import functional as TF
from tigon import nn as tnn
from tigon.numerics import assert_close_to_truth, compare, rel_l2
from tigon.ops import preference as P
from tigon.reference import kto as ref_kto
from tigon.reference import preference as ref
from tigon.reference.fused_linear_logprobs import fused_linear_logprobs as ref_token_logps
from tigon.reference.pairs import PreferenceOutput

H, V = 16, 40


def _batch(pairs=2, t=5, h=H, v=V, dtype=torch.float32, bias=False, reference="model", seed=0, prompt=2,
           labels=False):
    """A batch of ``pairs`` chosen then rejected sequences: the first ``prompt`` positions and some padding ignored;
    with ``labels``, KTO's preference labels (desirable: rows 0, 2, 3)."""
    gen = torch.Generator().manual_seed(seed)
    s = {"tokens": 2 * pairs * t, "hidden": h, "vocab": v}
    inp = P._inputs(s, dtype, "cpu", gen, pairs=pairs, bias=bias, reference=reference)
    target = inp["target"].clone()
    target[:, :prompt] = -100
    target[1, -1] = -100  # a shorter completion
    inp["target"] = target
    if labels:
        inp["preference_labels"] = torch.tensor([True, False, True, True] * pairs)[: 2 * pairs]
    return inp


def _leaves(inp: dict, dtype=None, grads=("hidden", "weight", "bias")) -> dict:
    return {k: (v.detach().to(dtype or v.dtype).requires_grad_(k in grads) if v.is_floating_point() else v)
            for k, v in inp.items()}


# ---- the formulas against TRL's code -------------------------------------------------------------------------------
def _trl_dpo_loss(inp: dict, loss_types, weights=None, beta=0.1, label_smoothing=0.0,
                  f_divergence_type="reverse_kl", f_alpha=0.5, dtype=torch.float64):
    """TRL 1.16's DPOTrainer._compute_loss on float64 copies, with a stand-in model whose fused LM head returns the
    per-token log-probabilities of ``inp``'s hidden states, and the reference log-probabilities precomputed."""
    DPOTrainer = pytest.importorskip("trl.trainer.dpo_trainer").DPOTrainer

    x = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inp.items()}
    target = x["target"]
    b, t = target.shape

    def per_token(hidden, weight, bias=None):
        lp = ref_token_logps(hidden.reshape(b * t, -1), weight, target.reshape(-1), bias)
        return lp.reshape(b, t)

    ref_lp = per_token(x["ref_hidden"], x["ref_weight"]).sum(1)
    zeros = torch.zeros(b, t, dtype=dtype)

    def model(**kw):  # TRL shifts: labels[:, 1:] are the targets of positions 0..T-1
        assert torch.equal(kw["labels"][:, 1:], target)
        return types.SimpleNamespace(log_probs=per_token(x["hidden"], x["weight"], x.get("bias")), entropy=zeros,
                                     mean_logits=zeros, is_top1=zeros.bool(), aux_loss=None)

    ids = torch.cat([torch.zeros(b, 1, dtype=torch.long), target.clamp(min=0)], 1)
    completion = torch.cat([torch.zeros(b, 1, dtype=torch.long), (target != -100).long()], 1)
    fake = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True), ld_alpha=None, precompute_ref_logps=True,
        accelerator=types.SimpleNamespace(device="cpu", gather=lambda v: v, gather_for_metrics=lambda v: v),
        f_divergence_type=f_divergence_type, f_alpha_divergence_coef=f_alpha, loss_types=list(loss_types),
        loss_weights=list(weights or [1.0] * len(loss_types)), beta=beta, label_smoothing=label_smoothing,
        args=types.SimpleNamespace(discopop_tau=0.05), use_weighting=False, aux_loss_enabled=False,
        _metrics=collections.defaultdict(lambda: collections.defaultdict(list)), _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": completion,
              "ref_chosen_logps": ref_lp[: b // 2], "ref_rejected_logps": ref_lp[b // 2:]}
    loss = DPOTrainer._compute_loss(fake, model, inputs, False)
    return loss, fake._metrics["train"]


DPO_CASES = [([t], None, {"label_smoothing": 0.1} if t in ("exo_pair", "robust", "aot", "aot_unpaired") else {})
             for t in ref.DPO_LOSS_TYPES]
DPO_CASES += [(["sigmoid", "bco_pair", "sft"], [0.8, 0.2, 1.0], {}),  # MPO-style combination
              (["sigmoid"], None, {"f_divergence_type": "forward_kl"}),
              (["ipo"], None, {"f_divergence_type": "js_divergence"}),
              (["hinge"], None, {"f_divergence_type": "alpha_divergence", "f_alpha": 0.3})]


@pytest.mark.parametrize("loss_types, weights, extra", DPO_CASES,
                         ids=[" + ".join(c[0]) + (f" {c[2]}" if c[2] else "") for c in DPO_CASES])
def test_dpo_reference_is_trl_dpo_trainer(loss_types, weights, extra):
    inp = _batch()
    # TRL's alpha-divergence clamp has no float64 entry: compare that one in float32
    dtype = torch.float32 if "f_alpha" in extra else torch.float64
    want, metrics = _trl_dpo_loss(inp, loss_types, weights, beta=0.3, **extra, dtype=dtype)
    opts = {"f_alpha_divergence_coef": extra.pop("f_alpha")} if "f_alpha" in extra else {}
    x = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in inp.items()}
    got = ref.fused_linear_dpo_loss(**x, beta=0.3, loss_type=loss_types, loss_weights=weights, **extra, **opts)
    # TRL holds exo's epsilon as a float32 tensor
    rel = 1e-6 if "exo_pair" in loss_types or dtype == torch.float32 else 1e-12
    assert got.loss.item() == pytest.approx(want.item(), rel=rel, abs=1e-14)
    assert got.chosen_rewards.mean().item() == pytest.approx(metrics["rewards/chosen"][0], rel=rel)
    assert got.rejected_rewards.mean().item() == pytest.approx(metrics["rewards/rejected"][0], rel=rel)
    assert got.chosen_logps.mean().item() == pytest.approx(metrics["logps/chosen"][0], rel=rel)


def _trainer_stub(**attrs):
    return types.SimpleNamespace(accelerator=types.SimpleNamespace(device="cpu"), **attrs)


@pytest.mark.parametrize("loss_type", ref.CPO_LOSS_TYPES)
def test_cpo_and_simpo_references_are_trl_cpo_trainer(loss_type):
    CPOTrainer = pytest.importorskip("trl.experimental.cpo.cpo_trainer").CPOTrainer

    inp = _batch(reference="none")
    x = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items()}
    averaged = loss_type in ("ipo", "simpo")  # TRL's CPOTrainer averages for these
    got = ref.fused_linear_cpo_loss(**x, beta=0.2, loss_type=loss_type, label_smoothing=0.1, gamma=0.7, alpha=0.5,
                                    average_log_prob=averaged)
    stub = _trainer_stub(alpha=0.0, beta=0.2, loss_type=loss_type, simpo_gamma=0.7, label_smoothing=0.1)
    losses, chosen_rewards, _ = CPOTrainer.cpo_loss(stub, got.chosen_logps, got.rejected_logps)
    assert got.loss.item() == pytest.approx((losses.mean() + 0.5 * got.nll_loss).item(), rel=1e-12)
    torch.testing.assert_close(got.chosen_rewards, chosen_rewards)
    if loss_type == "simpo":
        simpo = ref.fused_linear_simpo_loss(**x, beta=0.2, gamma=0.7, label_smoothing=0.1, alpha=0.5)
        assert simpo.loss.item() == got.loss.item()


def test_orpo_reference_is_trl_orpo_trainer():
    ORPOTrainer = pytest.importorskip("trl.experimental.orpo.orpo_trainer").ORPOTrainer

    inp = _batch(reference="none", t=4)
    x = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items()}
    got = ref.fused_linear_orpo_loss(**x, beta=0.25)
    losses, _, _, ratio, log_odds = ORPOTrainer.odds_ratio_loss(_trainer_stub(beta=0.25), got.chosen_logps,
                                                                got.rejected_logps)
    # (TRL casts the log-probabilities to float32 first)
    assert got.loss.item() == pytest.approx((got.nll_loss - losses.mean()).item(), rel=1e-6)
    assert (got.log_odds_ratio.item(), got.log_odds_chosen.item()) == pytest.approx((ratio.item(), log_odds.item()),
                                                                                   rel=1e-6)


@pytest.mark.parametrize("empty", ["one chosen", "all"])
def test_orpo_pair_with_an_empty_completion_adds_nothing(empty):
    # an all-ignored completion has no odds (log-probability 0, odds 1 / 0): the pair adds 0 to the odds-ratio term,
    # every value and gradient stays finite (the all-ignored batch returned NaN before), and the other pairs' terms
    # are TRL's
    inp = _batch(pairs=3, reference="none", t=4)
    inp["target"][0 if empty == "one chosen" else slice(None)] = -100
    x = _leaves(inp)
    got = P.fused_linear_orpo_loss(**{k: v for k, v in x.items() if k in ("hidden", "weight", "target")}, beta=0.25)
    got.loss.backward()
    assert torch.isfinite(got.loss) and all(torch.isfinite(x[k].grad).all() for k in ("hidden", "weight"))
    assert all(torch.isfinite(v).all() for v in got if isinstance(v, torch.Tensor))
    if empty == "all":
        assert got.loss.item() == 0 and got.log_odds_ratio.item() == 0
        return
    ORPOTrainer = pytest.importorskip("trl.experimental.orpo.orpo_trainer").ORPOTrainer
    _, _, _, ratio, _ = ORPOTrainer.odds_ratio_loss(_trainer_stub(beta=0.25), got.chosen_logps[1:].detach(),
                                                    got.rejected_logps[1:].detach())
    assert got.log_odds_ratio.item() == pytest.approx(ratio.item() * 2 / 3, rel=1e-5)  # (the mean over all 3 pairs)


def test_orpo_with_a_certain_chosen_completion_has_finite_gradients():
    """A chosen completion whose log-probability rounds to 0 (every token certain: a short memorised answer; in float32
    from a margin of about 17 + log V nats) has infinite odds. The odds-ratio term is then 0, as in TRL, but the
    gradients were NaN for the whole step: log1mexp's branch not taken (``log1p(-exp(x))``, -inf where exp(x) rounds
    to 1, float32 x > -6e-8) put 0 * inf into its backward, and at 0 the loss's backward multiplied the log-odds'
    infinite slope by the sigmoid's 0. Now every gradient is finite and the other pair's are float64's."""
    x = torch.tensor([-1e-9, -1e-7, -0.5, -30.0], requires_grad=True)
    ref.log1mexp(x).sum().backward()
    torch.testing.assert_close(x.grad.double(), -1 / torch.expm1(-x.detach().double()), rtol=1e-5, atol=0)
    v, h, t = 5, 4, 2
    weight = torch.eye(v, h)
    hidden = torch.zeros(4, t, h)
    hidden[0, 0, 0] = hidden[0, 1, 1] = 200.0  # pair 0's chosen: both tokens certain (log-probability exactly 0)
    hidden[1, :, 2] = hidden[3, :, 3] = 1.0
    hidden[2, 0, 1] = 0.5
    target = torch.tensor([[0, 1], [2, 1], [2, 3], [3, 3]])
    want = None
    for dtype in (torch.float64, torch.float32):
        x, w = hidden.to(dtype).requires_grad_(), weight.to(dtype).requires_grad_()
        got = P.fused_linear_orpo_loss(x, w, target, beta=0.25)
        assert got.chosen_logps[0].item() == 0 and got.log_odds_chosen.item() == math.inf  # (TRL's values)
        got.loss.backward()
        assert torch.isfinite(got.loss) and torch.isfinite(x.grad).all() and torch.isfinite(w.grad).all()
        if want is None:
            want = (got.loss, x.grad, w.grad)
        else:
            for a, b in zip((got.loss, x.grad, w.grad), want):
                assert rel_l2(a.double(), b) < 1e-5


def test_discopop_far_from_the_reference_is_finite():
    """DiscoPOP's ``exp(-x) sigmoid(x / tau)`` was inf * 0 = NaN in float32 once x = beta d < -88.7 (here a pair whose
    log-ratios are 1000 apart, beta 0.1): loss and gradients NaN, where float64 gives about 100 for that pair."""
    inp = _batch(reference="none", t=3)
    given = dict(ref_chosen_logps=torch.tensor([1000.0, 0.0]), ref_rejected_logps=torch.zeros(2))
    want = None
    for dtype in (torch.float64, torch.float32):
        x = _leaves(inp, dtype, grads=("hidden", "weight"))
        out = TF.fused_linear_dpo_loss(**x, **{k: v.to(dtype) for k, v in given.items()}, loss_type="discopop")
        out.loss.backward()
        got = (out.loss, x["hidden"].grad, x["weight"].grad)
        assert all(torch.isfinite(v).all() for v in got)
        want = got if want is None else want
        assert all(rel_l2(a.double(), b) < 1e-5 for a, b in zip(got, want))


@pytest.mark.parametrize("loss_type", ref_kto.KTO_LOSS_TYPES)
def test_kto_reference_is_trl_kto_formula(loss_type):
    # TRL 1.16 KTOTrainer._compute_loss (inline there): losses of the desirable then the undesirable sequences,
    # weighted, concatenated, averaged; rewards beta * log-ratio
    inp = _batch(labels=True, bias=True)
    x = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items()}
    got = ref_kto.fused_linear_kto_loss(**x, kl=torch.tensor(0.2, dtype=torch.float64), beta=0.3, loss_type=loss_type,
                                        desirable_weight=0.7, undesirable_weight=1.3)
    b, t = x["target"].shape

    def logps(hidden, weight, bias=None):
        return ref_token_logps(hidden.reshape(b * t, -1), weight, x["target"].reshape(-1), bias).reshape(b, t).sum(1)

    u = logps(x["hidden"], x["weight"], x["bias"]) - logps(x["ref_hidden"], x["ref_weight"])
    good = x["preference_labels"]
    if loss_type == "kto":
        chosen, rejected = 1 - torch.sigmoid(0.3 * (u[good] - 0.2)), 1 - torch.sigmoid(0.3 * (0.2 - u[~good]))
    else:
        chosen, rejected = 1 - torch.sigmoid(0.3 * u[good]), torch.sigmoid(0.3 * u[~good])
    want = torch.cat([0.7 * chosen, 1.3 * rejected]).mean()
    assert got.loss.item() == pytest.approx(want.item(), rel=1e-12)
    assert got.chosen_rewards_sum.item() == pytest.approx((0.3 * u[good]).sum().item(), rel=1e-12)
    logits = x["hidden"] @ x["weight"].T + x["bias"]
    assert got.rejected_logits_sum.item() == pytest.approx(logits[~good].sum().item(), rel=1e-12)


def test_sequence_logps_nll_and_logits_means_are_liger_s_definitions():
    inp = _batch(bias=True, reference="none")
    x = {k: (v.double() if v.is_floating_point() else v) for k, v in inp.items()}
    out = ref.fused_linear_dpo_loss(**x, average_log_prob=True, compute_nll_loss=True)
    logits = x["hidden"] @ x["weight"].T + x["bias"]
    logp = torch.log_softmax(logits, -1)
    mask = x["target"] != -100
    tok = logp.gather(-1, x["target"].clamp(min=0)[..., None])[..., 0] * mask
    torch.testing.assert_close(out.chosen_logps, (tok.sum(1) / mask.sum(1))[:2])
    assert out.nll_loss.item() == pytest.approx((-tok[:2].sum() / mask[:2].sum()).item(), rel=1e-12)
    assert out.chosen_logits_mean.item() == pytest.approx(logits[:2].mean().item(), rel=1e-12)
    assert out.rejected_logits_mean.item() == pytest.approx(logits[2:].mean().item(), rel=1e-12)


# ---- the fused path against float64 --------------------------------------------------------------------------------
FUSED = {
    "dpo sigmoid, reference model, bias": (TF.fused_linear_dpo_loss, dict(bias=True), {}),
    "dpo ipo + nll, averaged, given ref logps": (
        TF.fused_linear_dpo_loss, dict(reference="logps"),
        dict(loss_type=["ipo", "sigmoid"], compute_nll_loss=True, average_log_prob=True, memory="low")),
    "simpo": (P.fused_linear_simpo_loss, dict(reference="none", bias=True), {}),
    "cpo hinge": (P.fused_linear_cpo_loss, dict(reference="none"), dict(loss_type="hinge")),
    "orpo": (P.fused_linear_orpo_loss, dict(reference="none", t=4), {}),
    "kto, reference model, bias": (P.fused_linear_kto_loss, dict(labels=True, bias=True), dict(kl=torch.tensor(0.3))),
}


@pytest.mark.parametrize("label", list(FUSED))
def test_fused_loss_and_gradients_match_float64(label):
    fn, batch, opts = FUSED[label]
    inp = _batch(**batch)
    truth = _leaves(inp, torch.float64)
    spec = ref_kto if fn is P.fused_linear_kto_loss else ref
    want = getattr(spec, fn.__name__)(**truth, **{k: v for k, v in opts.items() if k != "memory"})
    want.loss.backward()
    got_in = _leaves(inp)
    got = fn(**got_in, **opts)
    got.loss.backward()
    assert got.loss.dtype == torch.float32 and type(got).__name__ == type(want).__name__
    for i, (a, b) in enumerate(zip(got, want)):
        assert rel_l2(a.double(), b) < 1e-5, (type(got)._fields[i], rel_l2(a.double(), b))
    for k in ("hidden", "weight", "bias"):
        if k in got_in:
            assert rel_l2(got_in[k].grad.double(), truth[k].grad) < 1e-5, k
    assert "ref_hidden" not in got_in or got_in["ref_hidden"].grad is None


PAIRWISE = {
    "dpo sigmoid, reference model": (TF.fused_linear_dpo_loss, dict(), {}, 4),
    "dpo ipo + sft, averaged, nll": (TF.fused_linear_dpo_loss, dict(reference="logps", bias=True),
                                     dict(loss_type=["ipo", "sft"], compute_nll_loss=True, average_log_prob=True), 3),
    "dpo aot (couples pairs), reference model": (TF.fused_linear_dpo_loss, dict(),
                                                 dict(loss_type="aot", label_smoothing=0.1), 5),
    "orpo": (P.fused_linear_orpo_loss, dict(reference="none"), {}, 3),
    "kto, reference model, bias (unpaired: chunks of one sequence)": (
        P.fused_linear_kto_loss, dict(labels=True, bias=True), dict(kl=torch.tensor(0.3), average_log_prob=True), 4),
}


@pytest.mark.parametrize("label", list(PAIRWISE))
def test_gradients_formed_pair_by_pair_match_float64_in_three_policy_matmuls(label, monkeypatch):
    # chunks of one pair (2 x 5 tokens of 3 pairs; KTO: of whole sequences): the policy's gradients are formed in the
    # forward, pair by pair,
    # 3 head matmuls (+1 for a reference model); AOT sorts the batch, so with the batch over several chunks it takes
    # the recomputing path (4 + 1); loss, metrics and gradients within 1e-5 of float64 either way
    import tigon.kernels.fused_linear_cross_entropy as flce_ops
    from tigon.workflows.matmul_count import head_matmuls

    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 10 * V)
    fn, batch, opts, matmuls = PAIRWISE[label]
    inp = _batch(pairs=3, **batch)
    truth = _leaves(inp, torch.float64)
    want = getattr(ref_kto if fn is P.fused_linear_kto_loss else ref, fn.__name__)(**truth, **opts)
    want.loss.backward()
    got_in = _leaves(inp)
    out = []
    if inp["hidden"].is_cuda and opts.get("loss_type") == "aot":
        matmuls = 4  # the CPU chunk cap above does not reach CUDA's rule: one chunk holds the batch, no recompute
    assert head_matmuls(lambda: out.append(fn(**got_in, **opts)) or out[0].loss.backward(), 30, H, V) == matmuls
    for i, (a, b) in enumerate(zip(out[0], want)):
        assert rel_l2(a.double(), b) < 1e-5, (type(want)._fields[i], rel_l2(a.double(), b))
    for k in ("hidden", "weight", "bias"):
        if k in got_in:
            assert rel_l2(got_in[k].grad.double(), truth[k].grad) < 1e-5, k


@pytest.mark.parametrize("label", ["dpo sigmoid, reference model", "dpo aot (couples pairs), reference model",
                                   "kto, reference model, bias (unpaired: chunks of one sequence)"])
def test_reference_model_runs_in_the_policy_s_chunk_loop(label, monkeypatch):
    # the reference model's logits of a chunk's rows go into the policy's chunk buffer before the policy's (issue
    # 29): no forward pass of its own (the log-probabilities' forward never runs), chunks of one pair (AOT: the batch)
    import tigon.kernels.fused_linear_cross_entropy as flce_ops
    import tigon.kernels.fused_linear_logprobs as klp

    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 10 * V if "aot" not in label else 40 * V)

    def no_pass(*args, **kwargs):
        raise AssertionError("the reference model ran a pass of its own")

    monkeypatch.setattr(klp, "logprobs_forward", no_pass)
    fn, batch, opts, _ = PAIRWISE[label]
    inp = _batch(pairs=3, **batch)
    truth = _leaves(inp, torch.float64)
    want = getattr(ref_kto if fn is P.fused_linear_kto_loss else ref, fn.__name__)(**truth, **opts)
    got = fn(**_leaves(inp), **opts)
    for i, (a, b) in enumerate(zip(got, want)):
        assert rel_l2(a.double(), b) < 1e-5, (type(want)._fields[i], rel_l2(a.double(), b))


@pytest.mark.parametrize("unit", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_is_no_worse_than_plain_pytorch(dtype, unit):
    # unit: loss.backward(); else a random upstream scalar, which the backward's scale of the formed gradients rounds
    # once more where grad_hidden is formed in bf16 (issue 29: tigon.kernels.head_grads.grad_buffers' formed)
    inp = _batch(dtype=dtype, bias=True, t=6)
    spec = P.RECORDS[0]
    checks = compare(spec.fn, spec.original, inp, ("hidden", "weight", "bias"), factor=2.0, unit_upstream=unit,
                     differentiable_outputs=(0,))
    assert_close_to_truth(checks)


# ---- the nn modules: Liger's signatures ------------------------------------------------------------------------------
def test_dpo_module_has_liger_s_call_and_returns_liger_s_tuple():
    inp = _batch(bias=True)
    before = {k: v.clone() for k, v in inp.items()}
    x = _leaves(inp, grads=("hidden", "weight", "bias", "ref_hidden", "ref_weight"))
    loss_fn = tnn.FusedLinearDPOLoss(beta=0.2, compute_nll_loss=True, loss_type="apo_zero")
    loss, aux = loss_fn(x["weight"], x["hidden"], x["target"], x["bias"], x["ref_hidden"], x["ref_weight"])
    assert len(aux) == 7 and aux[0].shape == (2,) and aux[2].dim() == 0
    want = TF.fused_linear_dpo_loss(**inp, beta=0.2, compute_nll_loss=True, loss_type="apo_zero")
    assert isinstance(want, PreferenceOutput) and torch.equal(loss.detach(), want.loss)
    loss.backward()
    assert x["hidden"].grad is not None and x["bias"].grad is not None
    assert x["ref_hidden"].grad is None and x["ref_weight"].grad is None  # no gradient to the reference model
    assert all(torch.equal(inp[k], before[k]) for k in inp)
    free = tnn.FusedLinearDPOLoss(use_ref_model=False)(inp["weight"], inp["hidden"], inp["target"], inp["bias"],
                                                       inp["ref_hidden"], inp["ref_weight"])  # ignored
    assert free[0].item() == pytest.approx(TF.fused_linear_dpo_loss(**{**inp, "ref_hidden": None,
                                                                         "ref_weight": None}).loss.item())


def test_other_modules_have_liger_s_defaults():
    inp = _batch(reference="none", t=4)
    w, x, t = inp["weight"], inp["hidden"], inp["target"]
    simpo = tnn.FusedLinearSimPOLoss()(w, x, t)
    assert len(simpo[1]) == 7
    assert simpo[0].item() == pytest.approx(P.fused_linear_simpo_loss(x, w, t).loss.item())
    cpo = tnn.FusedLinearCPOLoss(loss_type="ipo")(w, x, t)
    assert cpo[0].item() == pytest.approx(P.fused_linear_cpo_loss(x, w, t, loss_type="ipo").loss.item())
    orpo = tnn.FusedLinearORPOLoss(beta=0.3)(w, x, t)
    assert len(orpo[1]) == 9
    assert orpo[0].item() == pytest.approx(P.fused_linear_orpo_loss(x, w, t, beta=0.3).loss.item())
    labels = torch.tensor([True, False, False, True])
    kto = tnn.FusedLinearKTOLoss(beta=0.3)(x, w, t, preference_labels=labels)  # Liger's order: the input first
    assert len(kto[1]) == 6
    assert kto[0].item() == pytest.approx(P.fused_linear_kto_loss(x, w, t, labels, beta=0.3).loss.item())


LIGER = importlib.util.find_spec("liger_kernel") is not None


@pytest.mark.skipif(not LIGER, reason="liger_kernel is not installed")
@pytest.mark.parametrize("name, opts", [("DPO", dict(loss_type="sigmoid", compute_nll_loss=True)),
                                        ("DPO", dict(loss_type="nca_pair", average_log_prob=True)),
                                        ("SimPO", dict(gamma=0.3)), ("CPO", dict(label_smoothing=0.1)),
                                        ("ORPO", dict(beta=0.2)),
                                        ("KTO", dict(use_ref_model=True, average_log_prob=True))])
def test_modules_match_liger(name, opts):
    import liger_kernel.chunked_loss as lc

    inp = _batch(bias=True, reference="model" if name in ("DPO", "KTO") else "none")
    args = [inp["weight"], inp["hidden"], inp["target"], inp["bias"]]
    args += [inp["ref_hidden"], inp["ref_weight"]] if name == "DPO" else []
    if name == "KTO":
        labels = torch.tensor([True, False, True, True])
        args = [inp["hidden"], inp["weight"], inp["target"], inp["bias"], labels, inp["ref_hidden"],
                inp["ref_weight"], None, torch.tensor(0.1)]
    theirs = getattr(lc, f"LigerFusedLinear{name}Loss")(compiled=False, **opts)(*args)
    ours = getattr(tnn, f"FusedLinear{name}Loss")(**opts)(*args)
    assert ours[0].item() == pytest.approx(theirs[0].item(), rel=1e-5)
    assert len(ours[1]) == len(theirs[1])
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b.float(), rtol=1e-5, atol=1e-6)


# ---- errors --------------------------------------------------------------------------------------------------------
ERRORS = [
    (dict(hidden=lambda i: i["hidden"][:3]), ValueError, "even batch"),
    (dict(target=lambda i: i["target"][:, :-1]), ValueError, "target must have shape"),
    (dict(target=lambda i: i["target"].clamp(min=0).to(torch.uint8)), TypeError, "target must be a signed integer"),
    (dict(ref_weight=lambda i: None), ValueError, "ref_hidden and ref_weight must be given together"),
    (dict(ref_chosen_logps=lambda i: torch.zeros(2)), ValueError, "ref_chosen_logps and ref_rejected_logps"),
    (dict(ref_chosen_logps=lambda i: torch.zeros(2), ref_rejected_logps=lambda i: torch.zeros(2)), ValueError,
     "not both"),
    (dict(loss_type="dpo"), ValueError, "loss_type must be one of"),
    (dict(loss_type="exo_pair"), ValueError, "label_smoothing must be > 0 for loss_type 'exo_pair'"),
    (dict(loss_type="robust", label_smoothing=0.5), ValueError, r"\[0, 0.5\) for loss_type 'robust'"),
    (dict(loss_type="nca_pair", f_divergence_type="forward_kl"), ValueError, "only defined for the loss types"),
    (dict(loss_type=["sigmoid"], loss_weights=[1.0, 2.0]), ValueError, "one weight per loss_type"),
    # (these said "'NoneType' / 'float' object is not iterable", naming no argument)
    (dict(loss_type=None), TypeError, "loss_type must be a loss type's name or a list of them, got NoneType"),
    (dict(loss_weights=0.5), TypeError, "loss_weights must be None or a list of numbers"),
    (dict(beta=-0.1), ValueError, "beta must be a finite number >= 0"),
    (dict(beta=0.0, loss_type="ipo"), ValueError, r"beta must be > 0 for loss_type \['ipo'\]"),
    (dict(memory="lots"), ValueError, "memory must be"),
]


@pytest.mark.parametrize("change, error, match", ERRORS, ids=[e[2] for e in ERRORS])
def test_bad_input_names_the_argument(change, error, match):
    inp = _batch(t=2)
    kw = {**inp, **{k: (v(inp) if callable(v) else v) for k, v in change.items()}}
    with pytest.raises(error, match=match):
        TF.fused_linear_dpo_loss(**kw)


def test_beta_zero_is_taken_where_no_formula_divides_by_it():
    """beta = 0 is a legitimate ablation (ORPO as plain NLL; DPO's loss then log 2 for every pair) that Liger-Kernel
    takes; it was refused here for every loss ("beta must be > 0"). IPO / SPPO divide by beta and still refuse it."""
    inp = _batch(t=3)
    out = TF.fused_linear_dpo_loss(**inp, beta=0.0)
    torch.testing.assert_close(out[0].double(), torch.tensor(math.log(2.0), dtype=torch.float64), rtol=1e-6, atol=0)
    inp = _batch(t=3, reference="none")
    loss = tnn.FusedLinearORPOLoss(beta=0.0)(inp["weight"], inp["hidden"], inp["target"])[0]
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match="beta must be > 0 for loss_type"):
        P.fused_linear_cpo_loss(inp["hidden"], inp["weight"], inp["target"], beta=0.0, loss_type="ipo")


def test_module_errors():
    with pytest.raises(ValueError, match="loss_type must be one of"):
        tnn.FusedLinearDPOLoss(loss_type="kto")
    inp = _batch(t=2, reference="none")
    with pytest.raises(ValueError, match="use_ref_model=True needs the reference model"):
        tnn.FusedLinearDPOLoss()(inp["weight"], inp["hidden"], inp["target"])
    with pytest.raises(ValueError, match="nll_target"):
        tnn.FusedLinearORPOLoss()(inp["weight"], inp["hidden"], inp["target"], nll_target=inp["target"])


def test_kto_kl_as_a_float_or_per_sequence_and_of_a_wrong_shape():
    """Liger subtracts ``kl`` as given, so a Python float worked there and was refused here ("kl must be a
    torch.Tensor"); a (B',) kl of another length failed inside the formula with torch's broadcast error, naming
    no argument."""
    inp = _batch(t=3, reference="none", labels=True)
    args = (inp["hidden"], inp["weight"], inp["target"], inp["preference_labels"])
    as_tensor = P.fused_linear_kto_loss(*args, kl=torch.tensor(0.3))
    as_float = P.fused_linear_kto_loss(*args, kl=0.3)
    assert torch.equal(as_float.loss, as_tensor.loss)
    module = tnn.FusedLinearKTOLoss()(inp["hidden"], inp["weight"], inp["target"], None, inp["preference_labels"],
                                      kl=0.3)
    assert torch.equal(module[0], as_tensor.loss)
    per_row = P.fused_linear_kto_loss(*args, kl=torch.full((4,), 0.3))
    assert per_row.loss.item() == pytest.approx(as_tensor.loss.item(), rel=1e-6)
    with pytest.raises(ValueError, match=r"kl must be 0-d, \(1,\) or \(4,\) \(one per sequence\), got \(3,\)"):
        P.fused_linear_kto_loss(*args, kl=torch.zeros(3))
    with pytest.raises(ValueError, match="kl must be a finite number"):
        P.fused_linear_kto_loss(*args, kl=float("nan"))


@pytest.mark.parametrize("name", ["FusedLinearDPOLoss", "FusedLinearSimPOLoss", "FusedLinearCPOLoss",
                                  "FusedLinearORPOLoss", "FusedLinearKTOLoss"])
def test_module_call_with_weight_and_hidden_swapped_names_the_order(name):
    """The paired modules take Liger's (lin_weight, _input, ...), KTO (_input, lin_weight, ...), the functional ops
    (hidden, weight, ...): a call in the other order said "hidden must have 3 dimensions, got shape (V, H)", naming
    an argument the module does not have and not the order."""
    inp = _batch(t=2, reference="none", labels=True)
    w, h = inp["weight"], inp["hidden"]
    kto = name == "FusedLinearKTOLoss"
    module = getattr(tnn, name)(**({} if kto else {"use_ref_model": False} if name == "FusedLinearDPOLoss" else {}))
    order = r"\(_input, lin_weight, target" if kto else r"\(lin_weight, _input, target"
    with pytest.raises(ValueError, match=order + r".*got lin_weight of shape \(4, 2, 16\) and _input of shape "
                                                r"\(40, 16\): swapped"):
        if kto:
            module(w, h, inp["target"], None, inp["preference_labels"])
        else:
            module(h, w, inp["target"])


# ---- GPU: a model-sized batch (compiled kernels) -------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")
def test_dpo_at_model_size_on_gpu():
    # 4 pairs x 512 positions, hidden 2048, vocab 32000, bf16, reference model in the same call: loss and gradients
    # no worse than the plain PyTorch computation (both against float64), and the peak memory the op adds stays
    # below the float32 logits it does not build (memory="low": ~64 MiB chunks).
    gen = torch.Generator(device="cuda").manual_seed(0)
    inp = P._inputs({"tokens": 4096, "hidden": 2048, "vocab": 32000}, torch.bfloat16, "cuda", gen, pairs=4,
                    ignore_every=7, reference="model")
    spec = P.RECORDS[0]
    assert_close_to_truth(compare(spec.fn, spec.original, inp, ("hidden", "weight"), factor=2.0,
                                  unit_upstream=True, differentiable_outputs=(0,)))
    # a budget of one pair per chunk (the fp32 grad_weight accumulator and 2 x 512 rows of logits): the gradients
    # formed pair by pair, 3 policy matmuls + 1 for the reference model
    from tigon.workflows.matmul_count import head_matmuls

    one_pair = functools.partial(spec.fn, memory=4 * 32000 * 2048 + 2 * 1024 * 32000 + (1 << 20))
    assert_close_to_truth(compare(one_pair, spec.original, inp, ("hidden", "weight"), factor=2.0,
                                  unit_upstream=True, differentiable_outputs=(0,)))
    y = _leaves(inp, grads=("hidden", "weight"))
    assert head_matmuls(lambda: one_pair(**y).loss.backward(), 4096, 2048, 32000) == 4
    x = _leaves(inp, grads=("hidden", "weight"))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    TF.fused_linear_dpo_loss(**x, memory="low").loss.backward()
    torch.cuda.synchronize()
    grads = x["hidden"].numel() * 2 + x["weight"].numel() * 2
    extra = torch.cuda.max_memory_allocated() - base - grads
    assert extra < 4096 * 32000 * 4 / 2, f"{extra / 2**20:.0f} MiB beyond the inputs and gradients"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (compiled kernels)")
def test_dpo_compiles_in_one_graph_on_gpu():
    gen = torch.Generator(device="cuda").manual_seed(0)
    inp = P._inputs({"tokens": 512, "hidden": 256, "vocab": 1000}, torch.bfloat16, "cuda", gen, pairs=2,
                    ignore_every=5, reference="model")
    x, y = _leaves(inp, grads=("hidden", "weight")), _leaves(inp, grads=("hidden", "weight"))
    compiled = torch.compile(lambda **kw: TF.fused_linear_dpo_loss(**kw).loss, fullgraph=True)
    compiled(**x).backward()
    TF.fused_linear_dpo_loss(**y).loss.backward()
    for k in ("hidden", "weight"):
        assert rel_l2(x[k].grad.float(), y[k].grad.float()) < 1e-2, k


def test_bad_memory_raises_on_the_reference_path_too():
    """``memory`` was checked only on the kernel path: with the kernels off (CPU tensors on a CUDA machine, or
    force_reference) ``memory="lots"`` ran the reference silently (an H100, session 30)."""
    import tigon

    with tigon.force_reference(), pytest.raises(ValueError, match="memory must be"):
        TF.fused_linear_dpo_loss(**_batch(t=2), memory="lots")


def test_head_matmuls_counts_the_out_dtype_overloads(device):
    """``torch.mm / addmm(..., out_dtype=torch.float32)`` (the fused losses' fp32 gradient matmuls on CUDA) are the
    ``dtype`` overloads, which the counter missed: an H100 counted 2.58 head matmuls for a DPO call that runs 4
    (session 30)."""
    from tigon.workflows.matmul_count import head_matmuls

    a, b = torch.randn(8, 4, device=device).bfloat16(), torch.randn(4, 6, device=device).bfloat16()
    acc = torch.zeros(8, 6, device=device)

    def matmuls():
        for call in (lambda: torch.mm(a, b, out_dtype=torch.float32),
                     lambda: torch.addmm(acc, a, b, out_dtype=torch.float32)):
            try:
                call()
            except NotImplementedError:  # (the CPU has no kernel for these overloads: the mode counted it first)
                pass
        torch.addmm(acc, a.float(), b.float())

    assert head_matmuls(matmuls, 8, 4, 6) == 3
