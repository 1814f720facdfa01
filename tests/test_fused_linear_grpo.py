"""fused_linear_grpo / nn.FusedLinearGRPOLoss: loss, gradients (hidden, weight, bias) and logged metrics against TRL
1.16's own ``GRPOTrainer._compute_loss``, run on log-probabilities from plain logits (float64 for the truth, the
input dtype for the plain computation's own error)."""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

import tigon.kernels.fused_linear_cross_entropy as flce_ops
import tigon.kernels.loss_rows as loss_rows
from tigon import functional as F
from tigon import nn as tnn
from tigon.reference.grpo import GRPOOptions
from tigon.numerics import rel_l2
from tigon.ops.fused_linear_grpo import RECORDS
from tigon.workflows.matmul_count import head_matmuls



def _trl():
    """TRL's GRPO trainer and utils modules; the tests that compare with TRL skip without TRL 1.16 (the others run,
    on the GPU image too, which has no TRL)."""
    trl = pytest.importorskip("trl")
    if tuple(int(x) for x in trl.__version__.split(".")[:2]) < (1, 16):
        pytest.skip("the tests reproduce TRL 1.16's GRPOTrainer._compute_loss")
    return pytest.importorskip("trl.trainer.grpo_trainer"), pytest.importorskip("trl.trainer.utils")

SHAPE = {"tokens": 12, "batch": 3, "hidden": 16, "vocab": 37}
BUILD = RECORDS[0].make_inputs


@pytest.fixture(autouse=True)
def small_blocks(request, monkeypatch):
    # vocabulary blocks of 16 and chunks of 8 tokens: the kernels' loops run several times (not for the GPU sizes)
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 16)
        monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 8 * 37)
        monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CUDA", 8 * 37)


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def _trl_loss(inputs, opts: dict, dtype):
    """(loss, grads of _input / weight / bias, metrics) of TRL's ``_compute_loss`` on leaf copies of the inputs in
    ``dtype``, its log-probabilities and entropies from the plain logits (TRL's selective_log_softmax and
    entropy_from_logits)."""
    trl_grpo, trl_utils = _trl()
    o = GRPOOptions(**{k: v for k, v in opts.items() if k in GRPOOptions.__dataclass_fields__})
    temp = opts.get("temperature", 1.0)
    leaves = {k: inputs[k].detach().to(dtype).requires_grad_() for k in ("_input", "weight", "bias") if k in inputs}
    b, t = inputs["selected_token_ids"].shape

    def logps(h, w, bias, grad=True):
        with torch.set_grad_enabled(grad):
            logits = torch.nn.functional.linear(h.reshape(b * t, -1), w, bias)
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temp  # TRL: fp32 logits
            lp = trl_utils.selective_log_softmax(logits, inputs["selected_token_ids"].reshape(-1))
            return lp.reshape(b, t), trl_utils.entropy_from_logits(logits).reshape(b, t)

    lp, ent = logps(leaves["_input"], leaves["weight"], leaves.get("bias"))
    dev = inputs["selected_token_ids"].device
    batch = {"prompt_ids": torch.zeros(b, 0, dtype=torch.long, device=dev),
             "prompt_mask": torch.zeros(b, 0, dtype=torch.long, device=dev),
             "completion_ids": inputs["selected_token_ids"], "completion_mask": inputs["attention_mask"],
             "advantages": inputs["advantages"], "num_items_in_batch": inputs["attention_mask"].sum()}
    for k in ("old_per_token_logps", "ref_per_token_logps"):
        if k in inputs:
            batch[k] = inputs[k].to(lp.dtype)
    if "ref_input" in inputs:
        batch["ref_per_token_logps"] = logps(inputs["ref_input"].to(dtype), inputs["ref_weight"].to(dtype), None,
                                             False)[0]
    ratio = inputs.get("vllm_is_ratio")
    if ratio is not None:
        batch["importance_sampling_ratio"] = ratio.to(lp.dtype)
    args = SimpleNamespace(delta=o.delta, use_bias_correction_kl=o.use_bias_correction_kl,
                           sapo_temperature_pos=o.sapo_temperature_pos, sapo_temperature_neg=o.sapo_temperature_neg,
                           vespo_k_pos=o.vespo_k_pos, vespo_lambda_pos=o.vespo_lambda_pos,
                           vespo_k_neg=o.vespo_k_neg, vespo_lambda_neg=o.vespo_lambda_neg, steps_per_generation=1)
    trainer = SimpleNamespace(
        beta=o.beta, loss_type=o.loss_type, epsilon_low=o.epsilon_low, epsilon_high=o.epsilon_high,
        importance_sampling_level=o.importance_sampling_level, max_completion_length=o.max_completion_length,
        args=args, top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_vllm=ratio is not None,
        vllm_importance_sampling_correction=True, _entropy_bonus_enabled=o.entropy_coef != 0.0,
        entropy_coef=o.entropy_coef, use_adaptive_entropy=False, aux_loss_enabled=False,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, accelerator=_Accelerator(),
        _metrics={"train": defaultdict(list)}, _get_per_token_logps_and_entropies=lambda *a, **k: (lp, ent, None),
        get_gamma_weights=trl_grpo.GRPOTrainer.get_gamma_weights)
    loss = trl_grpo.GRPOTrainer._compute_loss(trainer, None, batch)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    metrics = {k: v[0] for k, v in trainer._metrics["train"].items() if k not in ("policy_loss", "entropy_coef")}
    return loss.detach(), grads, metrics


def _tigon_loss(inputs, opts: dict, dtype, upstream=1.0, entropy=True):
    leaves = {k: inputs[k].detach().to(dtype).requires_grad_() for k in ("_input", "weight", "bias") if k in inputs}
    rest = {k: (v.to(dtype) if k in ("ref_input", "ref_weight") else v) for k, v in inputs.items() if k not in leaves}
    module_opts = {k: v for k, v in opts.items() if k != "num_items"}
    loss_fn = tnn.FusedLinearGRPOLoss(**module_opts, compute_entropy=entropy)
    loss, metrics = loss_fn(leaves["_input"], leaves["weight"], rest.pop("selected_token_ids"),
                            rest.pop("attention_mask"), rest.pop("advantages"), leaves.get("bias"), **rest,
                            num_items_in_batch=inputs["attention_mask"].sum())
    grads = torch.autograd.grad(loss * upstream, list(leaves.values()))
    return loss.detach(), grads, metrics


CASES = {
    "dapo": (dict(), dict()),
    "grpo clipped": (dict(loss_type="grpo"), dict(old=True)),
    "bnpo ref_input temperature": (dict(loss_type="bnpo", temperature=0.7), dict(ref="input")),
    "dr_grpo sequence": (dict(loss_type="dr_grpo", max_completion_length=6, importance_sampling_level="sequence"),
                         dict(old=True)),
    "gspo (grpo, sequence)": (dict(loss_type="grpo", importance_sampling_level="sequence"), dict(old=True)),
    "cispo": (dict(loss_type="cispo", epsilon_high=1.3), dict(old=True)),
    "sapo beta=0": (dict(loss_type="sapo", beta=0.0), dict(old=True, ref="none")),
    "vespo vllm ratio": (dict(loss_type="vespo"), dict(old=True, ratio=True)),
    "luspo sequence": (dict(loss_type="luspo", importance_sampling_level="sequence"), dict(old=True)),
    "gspo beta=0": (dict(loss_type="grpo", importance_sampling_level="sequence", beta=0.0), dict(old=True, ref="none")),
    "delta, bias-corrected KL, bias": (dict(delta=1.7, use_bias_correction_kl=True, epsilon_high=0.28),
                                       dict(old=True, bias=True)),
    "vllm ratio, entropy bonus": (dict(entropy_coef=0.05), dict(old=True, ratio=True)),
}


def _inputs(dtype, build: dict, seed=0, device="cpu", shape=SHAPE):
    build = dict(build)
    ratio = build.pop("ratio", False)
    gen = torch.Generator().manual_seed(seed)
    out = BUILD(shape, dtype, torch.device(device), gen, **build)
    if ratio:
        out["vllm_is_ratio"] = (torch.rand(out["selected_token_ids"].shape, generator=gen) + 0.5).to(device)
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_loss_grads_and_metrics_match_trl_in_fp32(case, device):
    # loss and the gradients of hidden, weight (and bias) within 1e-5 of TRL's computation in float64; every metric
    # TRL logs equal to its value (fp32) within 1e-5
    opts, build = CASES[case]
    inputs = _inputs(torch.float32, build, device=device)
    loss, grads, metrics = _tigon_loss(inputs, opts, torch.float32)
    want, want_grads, want_metrics = _trl_loss(inputs, opts, torch.float64)
    assert loss.dtype == torch.float32 and loss.shape == ()
    assert rel_l2(loss, want) <= 1e-5, (rel_l2(loss, want))
    for g, w in zip(grads, want_grads):
        assert g.dtype == torch.float32 and rel_l2(g, w) <= 1e-5, rel_l2(g, w)
    _, _, metrics32 = _trl_loss(inputs, opts, torch.float32)
    assert set(metrics.trl) == set(metrics32), (sorted(metrics.trl), sorted(metrics32))
    for k, v in metrics32.items():
        assert abs(float(metrics.trl[k]) - v) <= 1e-5 * max(1.0, abs(v)), (k, float(metrics.trl[k]), v)


@pytest.mark.parametrize("case", ["dapo", "grpo clipped", "gspo (grpo, sequence)", "vespo vllm ratio"])
def test_a_fractional_mask_weighs_its_tokens_as_in_trl(case, device):
    """TRL (and Liger-Kernel) multiply by the completion mask: a value of 0.5 halves its token's part in the loss, the
    sequence means and the metrics. Tigon took every nonzero value as 1 (silently another loss)."""
    opts, build = CASES[case]
    inputs = _inputs(torch.float32, build, device=device)
    gen = torch.Generator().manual_seed(1)
    weights = torch.rand(inputs["attention_mask"].shape, generator=gen).to(device) + 0.25
    inputs["attention_mask"] = inputs["attention_mask"].to(torch.float32) * weights
    loss, grads, metrics = _tigon_loss(inputs, opts, torch.float32)
    want, want_grads, want_metrics = _trl_loss(inputs, opts, torch.float64)
    assert rel_l2(loss, want) <= 1e-5, rel_l2(loss, want)
    for g, w in zip(grads, want_grads):
        assert rel_l2(g, w) <= 1e-5, rel_l2(g, w)
    for k, v in want_metrics.items():
        assert abs(float(metrics.trl[k]) - v) <= 1e-5 * max(1.0, abs(v)), (k, float(metrics.trl[k]), v)


@pytest.mark.parametrize("case", ["dapo", "grpo clipped", "delta, bias-corrected KL, bias"])
def test_bf16_no_worse_than_trl_plain(case, device):
    # bf16 hidden states and heads: Tigon's loss and gradients no further from TRL's float64 value than TRL's own
    # computation in bf16 (LM head in bf16, fp32 log-softmax), up to rounding ties (1.05)
    opts, build = CASES[case]
    inputs = _inputs(torch.bfloat16, build, seed=1, device=device)
    loss, grads, _ = _tigon_loss(inputs, opts, torch.bfloat16)
    plain, plain_grads, _ = _trl_loss(inputs, opts, torch.bfloat16)
    truth, truth_grads, _ = _trl_loss(inputs, opts, torch.float64)
    for name, a, p, t in [("loss", loss, plain, truth), *zip(("_input", "weight", "bias"), grads, plain_grads,
                                                             truth_grads)]:
        assert a.dtype == p.dtype
        assert rel_l2(a, t) <= max(1.05 * rel_l2(p, t), 1e-6), (name, rel_l2(a, t), rel_l2(p, t))


def test_liger_metrics_tuple_and_defaults(device):
    # Liger's return: (loss, (kl, clip_ratio)) with beta != 0, (loss, (clip_ratio,)) with beta = 0; Liger's defaults
    inputs = _inputs(torch.float32, dict(old=True), device=device)
    args = [inputs[k] for k in ("_input", "weight", "selected_token_ids", "attention_mask", "advantages")]
    loss, metrics = tnn.FusedLinearGRPOLoss()(*args, ref_per_token_logps=inputs["ref_per_token_logps"],
                                              old_per_token_logps=inputs["old_per_token_logps"])
    assert len(metrics) == 2 and metrics[0] is metrics.trl["kl"]
    assert metrics[1] is metrics.trl["clip_ratio/region_mean"] and float(metrics[1]) > 0
    loss_fn = tnn.FusedLinearGRPOLoss(beta=0.0, loss_type="sapo")
    assert (loss_fn.beta, loss_fn.loss_type, loss_fn.epsilon_high) == (0.0, "sapo", 0.2)
    _, metrics = loss_fn(*args, old_per_token_logps=inputs["old_per_token_logps"])
    assert len(metrics) == 1 and float(metrics[0]) == 0.0


def test_metrics_copy_pickle_and_rebuild_as_liger_s_tuple(device):
    """Liger's metrics are a plain tuple; GRPOMetrics' required ``trl`` argument made ``copy.deepcopy``, ``pickle``
    and accelerate's ``gather`` / ``send_to_device`` (which rebuild a tuple as ``type(obj)(generator)``) raise
    TypeError."""
    import copy
    import pickle

    inputs = _inputs(torch.float32, dict(old=True), device=device)
    args = [inputs[k] for k in ("_input", "weight", "selected_token_ids", "attention_mask", "advantages")]
    _, metrics = tnn.FusedLinearGRPOLoss()(*args, ref_per_token_logps=inputs["ref_per_token_logps"])
    for twin in (copy.deepcopy(metrics), pickle.loads(pickle.dumps(metrics))):
        assert type(twin) is type(metrics) and all(torch.equal(a, b) for a, b in zip(twin, metrics))
        assert twin.trl.keys() == metrics.trl.keys() and torch.equal(twin.trl["kl"], metrics.trl["kl"])
    rebuilt = type(metrics)(m * 2 for m in metrics)  # (accelerate's honor_type)
    assert len(rebuilt) == 2 and torch.equal(rebuilt[0], metrics[0] * 2) and rebuilt.trl == {}


def test_ref_input_is_the_same_as_its_log_probs_and_gets_no_gradient(device):
    inputs = _inputs(torch.float32, dict(ref="input"), device=device)
    ref_in = inputs["ref_input"].clone().requires_grad_()
    inputs["_input"].requires_grad_()
    args = [inputs[k] for k in ("_input", "weight", "selected_token_ids", "attention_mask", "advantages")]
    a = F.fused_linear_grpo(*args, ref_input=ref_in, ref_weight=inputs["ref_weight"])
    ids = torch.where(inputs["attention_mask"] != 0, inputs["selected_token_ids"], -100).reshape(-1)
    ref_lp = F.fused_linear_logprobs(inputs["ref_input"].reshape(-1, 16), inputs["ref_weight"], ids).reshape(3, 4)
    b = F.fused_linear_grpo(*args, ref_per_token_logps=ref_lp)
    flat = F.fused_linear_grpo(args[0].reshape(12, 16), *args[1:], ref_per_token_logps=ref_lp)  # (B * T, H) too
    assert torch.allclose(a, b, rtol=1e-6, atol=0) and torch.equal(b, flat)
    a.backward()
    assert ref_in.grad is None


def test_bad_input_is_refused_with_a_clear_error(device):
    inputs = _inputs(torch.float32, dict(), device=device)
    args = [inputs[k] for k in ("_input", "weight", "selected_token_ids", "attention_mask", "advantages")]
    with pytest.raises(ValueError, match="loss_type must be one of"):
        tnn.FusedLinearGRPOLoss(loss_type="ppo")
    with pytest.raises(ValueError, match="max_completion_length must be given"):
        tnn.FusedLinearGRPOLoss(loss_type="dr_grpo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        F.fused_linear_grpo(*args, importance_sampling_level="batch")
    with pytest.raises(ValueError, match="needs ref_per_token_logps or ref_input"):
        F.fused_linear_grpo(*args)
    with pytest.raises(ValueError, match="attention_mask must have"):
        F.fused_linear_grpo(*args[:3], args[3][:, :2], args[4], beta=0.0)
    with pytest.raises(ValueError, match="ref_input and ref_weight go together"):
        F.fused_linear_grpo(*args, ref_input=inputs["_input"])
    with pytest.raises(ValueError, match="advantages must be"):
        F.fused_linear_grpo(*args[:4], args[4][:2], beta=0.0)
    with pytest.raises(TypeError, match="selected_token_ids must be a signed integer tensor"):
        F.fused_linear_grpo(*args[:2], args[2].to(torch.uint8), *args[3:], beta=0.0)
    for bad in (None, "yes"):  # (None was taken as False; "yes" said "return_entropy must be a bool")
        with pytest.raises(TypeError, match="compute_entropy must be a bool"):
            tnn.FusedLinearGRPOLoss(beta=0.0, compute_entropy=bad)(*args)
    if torch.device(device).type == "cpu":  # (the range is read on the host on a CPU only, as the LM heads' targets)
        ids, mask = args[2].clone(), args[3].clone()
        ids[0, 0], mask[0, 0] = inputs["weight"].shape[0], 1
        with pytest.raises(ValueError, match=r"selected_token_ids must be in \[0, \d+\) where attention_mask is set"):
            F.fused_linear_grpo(*args[:2], ids, mask, args[4], beta=0.0)
        mask[0, 0] = 0  # (a masked-out id is never read)
        out = F.fused_linear_grpo(*args[:2], ids, mask, args[4], beta=0.0)
        assert torch.isfinite(out[0] if isinstance(out, tuple) else out)


def _head_flops(inputs, opts, dtype=torch.float32, upstream=1.0, entropy=True):
    """(matmul work of a forward and backward through the loss in head matmuls (2 N H V FLOPs each), grads)."""
    out = []
    n, h = inputs["_input"].reshape(-1, inputs["_input"].shape[-1]).shape
    count = head_matmuls(lambda: out.append(_tigon_loss(inputs, opts, dtype, upstream, entropy)[1]), n, h,
                         inputs["weight"].shape[0])
    return count, out[0]


@pytest.mark.parametrize("case", ["dapo", "bnpo ref_input temperature", "gspo beta=0", "vespo vllm ratio",
                                  "vllm ratio, entropy bonus"])
def test_gradients_formed_in_the_forward_take_three_head_matmuls(case, device, monkeypatch):
    # the policy's head: 3 matmuls (logits, grad_hidden, grad_weight), plus 1 for a reference model's log-probs; the
    # coupled losses (sequence level, vespo) with sequences longer than a chunk take the recomputing path (4), with
    # the same gradients (also without the entropy kernel); an upstream gradient scales them
    opts, build = CASES[case]
    inputs = _inputs(torch.float32, build, device=device)
    ref = 1 if "ref_input" in inputs else 0
    flops, grads = _head_flops(inputs, opts)
    assert flops == 3 + ref, flops
    _, grads3 = _head_flops(inputs, opts, upstream=3.0)
    assert all(torch.allclose(3 * g, g3, rtol=1e-6, atol=1e-9) for g, g3 in zip(grads, grads3))
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 3 * 37)  # chunks of 3 tokens, sequences of 4
    # on the GPU too: the CUDA rule never goes under 16 rows (tensor-core row counts), so the CPU rule chunks there
    monkeypatch.setattr(flce_ops, "compiled_cuda", lambda device: False)
    flops, grads_small = _head_flops(inputs, opts, entropy=False)
    coupled = opts.get("importance_sampling_level") == "sequence" or opts.get("loss_type") == "vespo"
    assert flops == (4 if coupled else 3) + ref, flops
    # other chunks sum in another order: fp32 rounding, measured on each gradient's norm (elementwise, the
    # smallest entries miss rtol 1e-5 by rounding alone: 2.4e-7 absolute on a gradient of max 0.55, 1 thread)
    assert all((g - gs).norm() <= 1e-5 * g.norm() for g, gs in zip(grads, grads_small)), \
        [((g - gs).norm().item(), g.norm().item()) for g, gs in zip(grads, grads_small)]


def test_a_second_backward_through_formed_gradients_raises(device):
    # (and given log-probabilities that require a gradient get one: then the recomputing path runs)
    inputs = _inputs(torch.float32, dict(), device=device)
    x = inputs["_input"].clone().requires_grad_()
    args = [inputs[k] for k in ("weight", "selected_token_ids", "attention_mask", "advantages")]
    loss = F.fused_linear_grpo(x, *args, ref_per_token_logps=inputs["ref_per_token_logps"])
    loss.backward(retain_graph=True)
    formed = x.grad.clone()
    with pytest.raises(RuntimeError, match="second backward"):
        loss.backward()
    ref = inputs["ref_per_token_logps"].clone().requires_grad_()
    x.grad = None
    F.fused_linear_grpo(x, *args, ref_per_token_logps=ref).backward()
    assert ref.grad is not None and torch.allclose(x.grad, formed, rtol=1e-5, atol=1e-8)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="LM-head sizes need a GPU (compiled kernels)")
@pytest.mark.parametrize("case", ["dapo", "grpo clipped", "bnpo ref_input temperature"])
def test_gpu_llm_head_sizes_bf16_no_worse_than_trl_plain(case):
    # 8 completions x 512 tokens, hidden 1024, vocabulary 128256 (several chunks, 8192-column blocks), bf16
    opts, build = CASES[case]
    inputs = _inputs(torch.bfloat16, build, seed=2, device="cuda",
                     shape={"tokens": 4096, "batch": 8, "hidden": 1024, "vocab": 128256})
    loss, grads, metrics = _tigon_loss(inputs, opts, torch.bfloat16)
    plain, plain_grads, plain_metrics = _trl_loss(inputs, opts, torch.bfloat16)
    truth, truth_grads, _ = _trl_loss(inputs, opts, torch.float64)
    for name, a, p, t in [("loss", loss, plain, truth), *zip(("_input", "weight"), grads, plain_grads, truth_grads)]:
        assert rel_l2(a, t) <= max(1.05 * rel_l2(p, t), 1e-6), (name, rel_l2(a, t), rel_l2(p, t))
    assert set(metrics.trl) == set(plain_metrics)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="LM-head sizes need a GPU (compiled kernels)")
@pytest.mark.parametrize("case", ["dapo", "gspo (grpo, sequence)"])
def test_gpu_formed_gradients_at_head_size_in_three_matmuls(case):
    # 8 completions x 512 tokens, hidden 1024, vocabulary 128256, bf16 (no TRL needed): the gradients formed in the
    # forward take 3 head matmuls, and loss and gradients are no further from the float64 reference than the plain
    # computation's (RECORDS[0].original: the LM head in bf16, fp32 log-softmax, the same per-token loss)
    from tigon.reference.fused_linear_grpo import fused_linear_grpo as ref_grpo

    opts, build = CASES[case]
    shape = {"tokens": 4096, "batch": 8, "hidden": 1024, "vocab": 128256}
    inputs = _inputs(torch.bfloat16, build, seed=2, device="cuda", shape=shape)

    def run(fn, dtype):
        leaves = {k: inputs[k].detach().to(dtype).requires_grad_() for k in ("_input", "weight")}
        rest = {k: v for k, v in inputs.items() if k not in leaves}
        loss = fn(leaves["_input"], leaves["weight"], **rest, **opts)
        return loss.detach(), torch.autograd.grad(loss, list(leaves.values()))

    out = []
    assert head_matmuls(lambda: out.append(run(F.fused_linear_grpo, torch.bfloat16)), 4096, 1024, 128256) == 3
    (loss, grads), (plain, plain_grads) = out[0], run(RECORDS[0].original, torch.bfloat16)
    truth, truth_grads = run(ref_grpo, torch.float64)
    for name, a, p, t in [("loss", loss, plain, truth), *zip(("_input", "weight"), grads, plain_grads, truth_grads)]:
        assert rel_l2(a, t) <= max(1.05 * rel_l2(p, t), 1e-6), (name, rel_l2(a, t), rel_l2(p, t))


@pytest.mark.parametrize("items, error", [
    (True, TypeError),  # was taken for 1
    ("6", TypeError),  # was "new(): invalid data type 'str'"
    (float("nan"), ValueError), (float("inf"), ValueError), (torch.tensor(float("nan")), ValueError),  # a NaN loss
    (-3, ValueError), (torch.tensor(-3.0), ValueError),  # were clamped to 1 as TRL clamps an empty batch's 0
    (torch.tensor([3.0, 4.0]), ValueError),  # was a (2,) "loss"
    (torch.tensor(True), TypeError),
])
def test_num_items_in_batch_is_checked(device, items, error):
    inputs = _inputs(torch.float32, dict(), device=device)
    args = [inputs[k] for k in ("_input", "weight", "selected_token_ids", "attention_mask", "advantages")]
    if isinstance(items, torch.Tensor) and torch.device(device).type == "cpu" or not isinstance(items, torch.Tensor):
        with pytest.raises(error, match="num_items_in_batch"):
            F.fused_linear_grpo(*args, beta=0.0, num_items_in_batch=items)
    for ok in (0, 7, 7.0, torch.tensor(7), torch.tensor([7.0])):  # (0: an empty batch, clamped to 1 as TRL's)
        loss = F.fused_linear_grpo(*args, beta=0.0, num_items_in_batch=ok)
        assert loss.shape == () and torch.isfinite(loss)


@pytest.mark.parametrize("flag", ["use_ref_model", "use_bias_correction_kl", "return_metrics"])
def test_flags_must_be_bools(device, flag):
    # 1 / None were taken for True / False (compute_entropy was already checked)
    inputs = _inputs(torch.float32, dict(), device=device)
    args = [inputs[k] for k in ("_input", "weight", "selected_token_ids", "attention_mask", "advantages")]
    for bad in (1, None):
        with pytest.raises(TypeError, match=f"{flag} must be a bool"):
            F.fused_linear_grpo(*args, beta=0.0, **{flag: bad})
