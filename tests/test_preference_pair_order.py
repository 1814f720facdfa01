"""The paired preference losses' formed pass runs the rows pair by pair by index (issue 29: each chunk gathers its
rows from the caller's (B T, H) layout, tigon.ops.preference_formed._pair_order / _formed_pass' ``order``), where it
took a reordered copy of the hidden states before: the loss, every output and every gradient bit for bit as that copy
gave, for odd shapes, ignored rows skipped or not, a pair with no kept row, strided and sequence-first hidden states,
the CPU and CUDA chunk rules (memory="low"'s split pairs included); the caller's tensors untouched. Also the formed
passes' bf16 grad_hidden buffer (tigon.kernels.head_grads.grad_buffers' formed)."""

import pytest
import torch

import tigon.kernels.fused_linear_cross_entropy as flce_ops
import tigon.kernels.ignored_rows as ignored_rows
import tigon.ops.preference_formed as pf
from tigon import functional as TF
from tigon.ops import preference as P

PAIRS, T, H, V = 3, 7, 24, 37  # odd sizes: no chunk or pair is a multiple of 16
NEVER = 1 << 62  # SKIP_MIN_MACS that no head reaches: every row computed

PLANS = {
    # CPU's rule, chunks of one pair
    "cpu, one pair a chunk": dict(rules=dict(MAX_CHUNK_ELEMS_CPU=2 * T * V)),
    # CUDA's default rule (simulated on CPU tensors): PAIR_CHUNK_LOGITS_CUDA lowered to one pair and its gathered rows
    "cuda, one pair a chunk": dict(cuda=True, formed=dict(PAIR_CHUNK_LOGITS_CUDA=2 * T * (V + 3 * H))),
    # CUDA's rule for the whole batch in one chunk (a single gather of every row)
    "cuda, one chunk": dict(cuda=True),
    # memory="low" on CUDA's rules: pairs of 2 x 12 rows split over sub-chunks of at most 16 (the first formed again)
    "cuda, memory low, split pairs": dict(cuda=True, t=12, v=200, opts=dict(memory="low"),
                                          rules=dict(LEAN_CHUNK_ELEMS=6 * 200, LEAN_MIN_ROWS=6)),
}


def _batch(t, v, dtype, layout, dead_pair, seed=0):
    """Chosen then rejected sequences with prompts of varying length (every row a different one), a padded position,
    optionally pair 1 wholly ignored; ``layout``: the hidden states (policy's and reference's) contiguous, a slice of
    wider rows (a (B T, H) view with a row stride), or sequence-first ((T, B, H) transposed: no (B T, H) view)."""
    gen = torch.Generator().manual_seed(seed)
    inp = P._inputs({"tokens": 2 * PAIRS * t, "hidden": H, "vocab": v}, dtype, "cpu", gen, pairs=PAIRS,
                    reference="model", bias=True)
    target = inp["target"].clone()
    for row in range(2 * PAIRS):
        target[row, : (2 + row) % (t - 1)] = -100
    target[1, -1] = -100
    if dead_pair:
        target[1] = target[PAIRS + 1] = -100
    inp["target"] = target
    for name in ("hidden", "ref_hidden"):
        x = inp[name]
        if layout == "wide":
            wide = torch.zeros(*x.shape[:2], H + 5, dtype=dtype)
            wide[..., 3:3 + H] = x
            inp[name] = wide[..., 3:3 + H]
        elif layout == "sequence-first":
            inp[name] = x.transpose(0, 1).contiguous().transpose(0, 1)
    return inp


def _reordered_copy(real):
    """_formed_pass as it was: the rows copied pair by pair (contiguous), the kept rows indexing that copy, the
    reference model's rows taken pair by pair; its outputs back in the batch's layout."""

    def run(hidden2d, weight, target2d, bias, plan, unit, align, chunk_loss, ref=None, halves=True, order=None):
        if order is None:
            return real(hidden2d, weight, target2d, bias, plan, unit, align, chunk_loss, ref, halves)
        if ref is not None:
            rows, w, b = ref
            ref = (lambda s, e, idx: rows(0, 0, order[s:e] if idx is None else order[idx])), w, b
        logp, ref_lp, (gh, gw, gb) = real(hidden2d.index_select(0, order), weight, target2d.index_select(0, order),
                                          bias, plan, unit, align, chunk_loss, ref, halves)

        def back(x):
            return None if x is None else torch.empty_like(x).index_copy_(0, order, x)

        return back(logp), back(ref_lp), (back(gh), gw, gb)

    return run


def _run(inp, opts):
    """Outputs and gradients (hidden, weight, bias) of a DPO loss on fresh leaves, the inputs checked unchanged."""
    before = {k: v.clone() for k, v in inp.items() if isinstance(v, torch.Tensor)}
    leaves = {k: (v.detach().requires_grad_() if k in ("hidden", "weight", "bias") else v) for k, v in inp.items()}
    out = TF.fused_linear_dpo_loss(**leaves, beta=0.3, compute_nll_loss=True, **opts)
    out.loss.backward()
    for k, v in before.items():
        assert torch.equal(inp[k], v), f"the caller's {k} was written"
    return [*out, *(leaves[k].grad for k in ("hidden", "weight", "bias"))]


CPU_RULES = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU tensors through Triton's interpreter, the CUDA "
                               "chunk rules simulated there (CI runs it)")


@CPU_RULES
# each layout at one dtype (the dtype matters to grad_hidden's buffer, the layout to the gathers: both are crossed
# with every plan and skip setting; all six pairs took 53 s of CI's time)
@pytest.mark.parametrize("layout,dead_pair,dtype", [("contiguous", False, torch.float32),
                                                    ("wide", True, torch.bfloat16),
                                                    ("sequence-first", False, torch.bfloat16)])
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("plan", list(PLANS))
def test_pair_order_gives_what_a_reordered_copy_gave(plan, dtype, skip, layout, dead_pair, monkeypatch):
    cfg = PLANS[plan]
    if cfg.get("cuda"):
        monkeypatch.setattr(flce_ops, "compiled_cuda", lambda device: True)
    for name, value in cfg.get("rules", {}).items():
        monkeypatch.setattr(flce_ops, name, value)
    for name, value in cfg.get("formed", {}).items():
        monkeypatch.setattr(pf, name, value)
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", 0 if skip else NEVER)
    inp = _batch(cfg.get("t", T), cfg.get("v", V), dtype, layout, dead_pair)
    passes = []
    real = pf._formed_pass

    def watched(hidden2d, *args, **kwargs):
        passes.append(hidden2d)
        return real(hidden2d, *args, **kwargs)

    monkeypatch.setattr(pf, "_formed_pass", watched)
    by_index = _run(inp, cfg.get("opts", {}))
    assert len(passes) == 1, "the formed path did not run"
    if layout != "sequence-first":  # the pass reads the caller's hidden states themselves: no copy of them
        assert passes[0].untyped_storage().data_ptr() == inp["hidden"].untyped_storage().data_ptr()
    monkeypatch.setattr(pf, "_formed_pass", _reordered_copy(real))
    copied = _run(inp, cfg.get("opts", {}))
    assert len(by_index) == len(copied)
    for i, (a, b) in enumerate(zip(by_index, copied)):
        assert torch.equal(a, b), i
    if layout != "contiguous":  # and as contiguous hidden states give
        contiguous = _run({k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in inp.items()},
                          cfg.get("opts", {}))
        # (but the logits means: plain torch reductions of the caller's hidden states outside the pass, summed in
        # the order of their layout)
        means = {P.PreferenceOutput._fields.index(f) for f in ("chosen_logits_mean", "rejected_logits_mean")}
        for i, (a, c) in enumerate(zip(by_index, contiguous)):
            assert i in means or torch.equal(a, c), i
    if dead_pair:  # no gradient reaches a pair with no kept token
        gh = by_index[-3].reshape(2 * PAIRS, -1)
        assert (gh[1] == 0).all() and (gh[PAIRS + 1] == 0).all()


@CPU_RULES
@pytest.mark.parametrize("skip", [False, True])
def test_compiled_bf16_formed_pass_equals_eager(skip, monkeypatch):
    # torch.compile (fullgraph, aot_eager): the custom op's fake gives grad_hidden the dtype the pass forms it in
    # (bf16), and its backward scales it as eager does (an upstream gradient of 0.3: the same rounding)
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", 0 if skip else NEVER)
    inp = _batch(T, V, torch.bfloat16, "wide", False)
    torch._dynamo.reset()
    try:
        runs = []
        for compiled in (False, True):
            call = lambda **kw: tuple(TF.fused_linear_dpo_loss(**kw))  # noqa: E731
            call = torch.compile(call, backend="aot_eager", fullgraph=True) if compiled else call
            got = {k: (v.detach().requires_grad_() if k in ("hidden", "weight") else v) for k, v in inp.items()}
            out = call(**got)
            (out[0] * 0.3).backward()
            runs.append([*out, got["hidden"].grad, got["weight"].grad])
        assert runs[1][-2].dtype == torch.bfloat16
        for a, b in zip(*runs):
            assert torch.equal(a, b)
    finally:
        torch._dynamo.reset()


def test_the_pair_order():
    assert pf._pair_order(1, 5, "cpu") is None  # one pair: the batch's own order
    # 2 pairs of 3 tokens: chosen 0 (rows 0-2), rejected 0 (6-8), chosen 1 (3-5), rejected 1 (9-11)
    assert pf._pair_order(2, 3, "cpu").tolist() == [0, 1, 2, 6, 7, 8, 3, 4, 5, 9, 10, 11]


@pytest.mark.parametrize("dtype,cd,want", [(torch.bfloat16, torch.bfloat16, torch.bfloat16),
                                           (torch.float16, torch.float16, torch.float32),
                                           (torch.float32, torch.bfloat16, torch.float32),
                                           (torch.float32, torch.float32, torch.float32)])
def test_formed_grad_hidden_buffer_dtype(dtype, cd, want):
    # the formed passes write each grad_hidden row once and scale it once in the backward: bf16 takes the rounding of
    # that scale (fp32's exponent range); fp16 keeps fp32 (its unscaled small rows would underflow); other scalar
    # passes keep fp32 too
    from tigon.kernels.head_grads import grad_buffers

    hidden, weight = torch.zeros(6, 4, dtype=dtype), torch.zeros(10, 4, dtype=dtype)
    gh, _, _ = grad_buffers(6, hidden, weight, cd, (True, True, False), False, True, formed=True, gh_rows=5)
    assert gh.dtype == want and gh.shape == (5, 4)
    gh, _, _ = grad_buffers(6, hidden, weight, cd, (True, True, False), False, True)
    assert gh.dtype == torch.float32 and gh.shape == (6, 4)
