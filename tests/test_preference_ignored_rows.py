"""The preference losses' formed passes leave ignored tokens out of their head matmuls
(tigon.ops.preference_formed._kept_chunks, tigon.kernels.ignored_rows): with prompt-style masks, the loss, every
metric, every gradient and the per-token log-probabilities as computing every row (fp32, 1e-5) and as float64, in
fewer head-matmul rows; eager and under torch.compile. Also memory="low" on the formed path (chunks of one unit)."""

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import tigon.kernels.fused_linear_cross_entropy as flce_ops
import tigon.kernels.fused_linear_logprobs as klp
import tigon.kernels.ignored_rows as ignored_rows
import tigon.kernels.loss_rows as loss_rows
import tigon.ops.preference_formed as pf
from tigon import functional as TF
from tigon.numerics import FLOOR, rel_l2
from tigon.ops import preference as P
from tigon.reference import kto as ref_kto
from tigon.reference import preference as ref
from tigon.workflows.matmul_count import head_matmuls

H, V, PAIRS, T = 16, 40, 3, 6
N = 2 * PAIRS * T
NEVER = 1 << 62  # SKIP_MIN_MACS that no head reaches: every row computed

MASKS = {
    # leading ignored positions (a prompt) of each sequence: chosen 0 .. 2, then rejected 3 .. 5 (pair i: i, 3 + i)
    "prompts": [2, 3, 1, 4, 0, T],  # different lengths, one sequence fully ignored, one with none ignored
    "first pair ignored": [T, 2, 1, T, 3, 0],  # a unit with no kept row (an empty group, at the start)
}

CASES = {
    # fn, batch options, loss options, extra head matmuls of a reference model in the chunk loop
    "dpo sigmoid, reference model": (TF.fused_linear_dpo_loss, dict(reference="model"), {}, 1),
    "dpo sigmoid, given reference logps": (TF.fused_linear_dpo_loss, dict(reference="logps"), {}, 0),
    "dpo ipo, reference model, averaged, bias": (TF.fused_linear_dpo_loss, dict(reference="model", bias=True),
                                                dict(loss_type="ipo", average_log_prob=True), 1),
    "dpo sigmoid + nll, given logps, averaged": (TF.fused_linear_dpo_loss, dict(reference="logps"),
                                                 dict(compute_nll_loss=True, average_log_prob=True), 0),
    "dpo aot (couples pairs: one chunk), reference model": (TF.fused_linear_dpo_loss, dict(reference="model"),
                                                            dict(loss_type="aot"), 1),
    "dpo sigmoid, reference model, byte budget": (TF.fused_linear_dpo_loss, dict(reference="model"),
                                                  dict(memory=4 * V * H + 16 * V * 4), 1),
    "dpo sigmoid, reference model, memory low": (TF.fused_linear_dpo_loss, dict(reference="model"),
                                                 dict(memory="low"), 1),
    "simpo": (P.fused_linear_simpo_loss, dict(reference="none", bias=True), {}, 0),
    "cpo hinge": (P.fused_linear_cpo_loss, dict(reference="none"), dict(loss_type="hinge"), 0),
    "orpo": (P.fused_linear_orpo_loss, dict(reference="none", whole=False), {}, 0),
    "kto, reference model, bias": (P.fused_linear_kto_loss, dict(reference="model", bias=True, labels=True),
                                   dict(kl=torch.tensor(0.3)), 1),
    "kto, given reference logps, averaged": (P.fused_linear_kto_loss,
                                             dict(reference="none", labels=True, ref_logps=True),
                                             dict(average_log_prob=True, loss_type="apo_zero_unpaired"), 0),
}


def _batch(reference="model", bias=False, labels=False, ref_logps=False, mask="prompts", dtype=torch.float32, t=T,
           seed=0, whole=True, v=V, device="cpu"):
    """Prompt-style masks (:data:`MASKS`); ``whole=False``: one kept token at least in each sequence (ORPO's odds of
    an empty sequence, log-probability 0, are infinite). Built on the CPU, moved to ``device``."""
    gen = torch.Generator().manual_seed(seed)
    inp = P._inputs({"tokens": 2 * PAIRS * t, "hidden": H, "vocab": v}, dtype, "cpu", gen, pairs=PAIRS, bias=bias,
                    reference=reference)
    target = inp["target"].clone()
    for row, k in enumerate(MASKS[mask]):
        target[row, :k if whole else min(k, t - 1)] = -100
    target[1, -1] = -100  # and a padded position
    inp["target"] = target
    if labels:  # KTO's (unpaired) desirable / undesirable labels
        inp["preference_labels"] = torch.tensor([True, False, True, True, False, True])
    if ref_logps:
        inp["ref_logps"] = torch.randn(2 * PAIRS, generator=gen) - 2.0 * t
    return {k: x.to(device) if isinstance(x, torch.Tensor) else x for k, x in inp.items()}


CPU_RULES = pytest.mark.skipif(torch.cuda.is_available(), reason="simulates the CUDA chunk rules through the "
                               "interpreter on CPU tensors (CI runs it); the GPU runs the main test on CUDA")


def _leaves(inp: dict, dtype=None, grads=("hidden", "weight", "bias")) -> dict:
    return {k: (v.detach().to(dtype or v.dtype).requires_grad_(k in grads) if v.is_floating_point() else v)
            for k, v in inp.items()}


def _run(fn, inp, opts, min_macs, monkeypatch):
    """(outputs, grads by name, head matmuls, per-token (logp, ref_logp) of the formed pass) at SKIP_MIN_MACS
    ``min_macs``."""
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", min_macs)
    passes = []
    real = pf._formed_pass
    monkeypatch.setattr(pf, "_formed_pass", lambda *a, **k: passes.append(r := real(*a, **k)) or r)
    got = _leaves(inp)
    out = []
    count = head_matmuls(lambda: out.append(fn(**got, **opts)) or out[0].loss.backward(), N, H, V)
    grads = {k: got[k].grad for k in ("hidden", "weight", "bias") if k in got}
    assert len(passes) == 1, "the formed path did not run"
    return out[0], grads, count, passes[0][:2]


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("label", list(CASES))
def test_skipping_ignored_rows_changes_nothing_but_the_matmuls(label, mask, monkeypatch, device):
    fn, batch, opts, ref_mm = CASES[label]
    # chunks of at most one pair's rows (12; the whole batch for AOT): several chunks, of 1 or 2 pairs' kept rows
    # (on CPU; CUDA's chunk rule takes the tiny batch in one chunk)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", (N if "aot" in label else 2 * T) * V)
    opts = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in opts.items()}
    inp = _batch(**batch, mask=mask, device=device)
    every, g_every, n_every, (lp_every, ref_every) = _run(fn, inp, opts, NEVER, monkeypatch)
    kept, g_kept, n_kept, (lp_kept, ref_kept) = _run(fn, inp, opts, 0, monkeypatch)
    ignored = (inp["target"] == -100).reshape(-1)
    k = int((~ignored).sum())
    assert n_every == 3 + ref_mm
    assert n_kept == pytest.approx((3 + ref_mm) * k / N, rel=1e-12)  # the policy's 3 and the reference's 1: K rows
    tol = dict(rtol=1e-5, atol=1e-6)
    for name, a, b in zip(type(every)._fields, every, kept):
        torch.testing.assert_close(b, a, **tol, msg=name)
    for name in g_every:
        torch.testing.assert_close(g_kept[name], g_every[name], **tol, msg=name)
    assert (g_kept["hidden"].reshape(N, H)[ignored] == 0).all()
    # the formed pass's per-token log-probabilities (in the batch's (B T) layout: the pass runs the rows pair by pair
    # by index): 0 at the ignored rows, as the kernels give them when every row is computed
    torch.testing.assert_close(lp_kept, lp_every, **tol)
    assert (lp_every == 0).sum() == (lp_kept == 0).sum() == int(ignored.sum())
    assert (ref_every is None) == (ref_kept is None) == (ref_mm == 0)
    if ref_mm:
        torch.testing.assert_close(ref_kept, ref_every, **tol)
        assert (ref_kept == 0).sum() == int(ignored.sum())
    # and both within 1e-5 of float64
    truth = _leaves(inp, torch.float64)
    spec = ref_kto if fn is P.fused_linear_kto_loss else ref
    want = getattr(spec, fn.__name__)(**truth, **{k: v for k, v in opts.items() if k != "memory"})
    want.loss.backward()
    for name, a, b in zip(type(want)._fields, kept, want):
        assert rel_l2(a.double(), b) < 1e-5, (name, rel_l2(a.double(), b))
    for name in g_kept:
        assert rel_l2(g_kept[name].double(), truth[name].grad) < 1e-5, name


def test_group_cuts_and_the_cap_with_gathered_rows():
    cuts = ignored_rows.group_cuts
    # the fewest chunks, the largest as small as that allows: 10 + 12 rows, not 15 + 7; 3 chunks under a cap of 11
    assert cuts([4, 6, 5, 0, 7], 16) == [0, 2, 5]
    assert cuts([4, 6, 5, 0, 7], 11) == [0, 2, 4, 5]
    assert cuts([3, 3, 3, 3, 3], 12) == [0, 3, 5]  # balanced: 9 + 6 rows, not 12 + 3 (chunk_rows' rule)
    assert cuts([0, 0, 5, 0], 5) == [0, 4]  # empty groups join a chunk of others
    assert cuts([0, 4, 0, 4, 0], 5) == [0, 3, 5]
    assert cuts([6, 13], 12) is None  # a group over the cap
    # a budget in bytes counts each chunk row's gathered hidden row and grad_hidden row beside its logits: the lean
    # formed plan's one-pair budget at Llama-3-8B's head holds 1856 kept rows of a 2 x 1024-token pair
    cuda = torch.device("cuda")
    budget = 2048 * 128256 * 2
    assert flce_ops.chunk_rows(8192, 128256, 4096, cuda, True, budget=budget, cap=True) == 2048
    assert flce_ops.chunk_rows(8192, 128256, 4096, cuda, True, budget=budget, row_bytes=4096 * 6, cap=True) == 1856


@CPU_RULES
def test_compiled_formed_pass_skips_ignored_rows(monkeypatch):
    # torch.compile (fullgraph, aot_eager): the custom op runs the same pass at the call, its host sync included
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    monkeypatch.setattr(loss_rows, "MAX_BLOCK_V", 16)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 2 * T * V)
    monkeypatch.setattr(flce_ops, "compiled_cuda", lambda device: False)
    inp = _batch(reference="model")
    k = int((inp["target"] != -100).sum())
    torch._dynamo.reset()
    try:
        for fn, extra in ((TF.fused_linear_dpo_loss, {}),
                          (P.fused_linear_kto_loss, dict(preference_labels=torch.tensor([True, False] * PAIRS),
                                                         kl=torch.tensor(0.3)))):
            runs = []
            for min_macs, compiled in ((NEVER, False), (0, True)):
                monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", min_macs)
                call = torch.compile(lambda **kw: tuple(fn(**kw)), backend="aot_eager", fullgraph=True) \
                    if compiled else (lambda **kw: tuple(fn(**kw)))
                got = _leaves(dict(inp, **extra))
                out = []
                count = head_matmuls(lambda: out.append(call(**got)) or out[0][0].backward(), N, H, V,
                                     compiled=compiled)
                runs.append((out[0], [got[n].grad for n in ("hidden", "weight")], count))
            (eager, g_eager, n_eager), (comp, g_comp, n_comp) = runs
            assert n_eager == 4 and n_comp == pytest.approx(4 * k / N, rel=1e-12)
            for a, b in zip([*eager, *g_eager], [*comp, *g_comp]):
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    finally:
        torch._dynamo.reset()


# ---- memory="low": chunks of one unit on the formed path ----------------------------------------------------------
def _formed_twice(monkeypatch) -> list:
    """Records, per formed pass, the rows whose logits it forms twice (the earlier sub-chunks of split units)."""
    twice = []
    real = klp.logprobs_grads_in_forward

    def watched(*a, **kw):
        twice.append(sum(e - s for earlier in (kw.get("pieces") or {}).values() for s, e in earlier))
        return real(*a, **kw)

    monkeypatch.setattr(klp, "logprobs_grads_in_forward", watched)
    return twice


@CPU_RULES
@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("skip", [False, True])
def test_memory_low_forms_the_gradients_in_chunks_of_one_pair(skip, split, monkeypatch):
    # the CUDA chunk rules, on CPU: the lean rule (Liger's, about N / (V / H) rows: 16 here) holds less than a pair of
    # 2 x 10 tokens, so memory="low" took the recomputing path (4 policy matmuls + the reference's own pass); then
    # chunks of one pair (LOW_SPLIT 1: 3 chunks; with ignored rows skipped, the kept rows of whole pairs, at most a
    # pair's rows rounded up to 16), 3 + 1 head matmuls, grad_weight accumulated in bf16; now (LOW_SPLIT 2) a pair's
    # rows over 2 sub-chunks of at most 16 rows, the first one's logits formed again
    monkeypatch.setattr(pf, "LOW_SPLIT", split)
    monkeypatch.setattr(flce_ops, "compiled_cuda", lambda device: True)
    monkeypatch.setattr(flce_ops, "LEAN_CHUNK_ELEMS", 16 * V)
    monkeypatch.setattr(flce_ops, "LEAN_MIN_ROWS", 16)
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", 0 if skip else NEVER)
    t, v = 10, 200  # (a head wider than its hidden size, as LM heads: one pair's budget holds one pair, not two)
    inp = _batch(reference="model", dtype=torch.bfloat16, t=t, v=v)
    n = 2 * PAIRS * t
    k = int((inp["target"] != -100).sum())
    chunks = []
    real_grad, real_loop = klp.rows_grad_, klp.backward_over_chunks
    monkeypatch.setattr(klp, "rows_grad_", lambda *a: chunks[-1].append(a[0].shape[0]) or real_grad(*a))
    monkeypatch.setattr(klp, "backward_over_chunks", lambda *a, **kw: chunks.append([]) or real_loop(*a, **kw))
    twice = _formed_twice(monkeypatch)
    got, low = _leaves(inp, grads=("hidden", "weight")), []
    count = head_matmuls(lambda: low.append(TF.fused_linear_dpo_loss(**got, memory="low")) or low[0].loss.backward(),
                         n, H, v)
    assert got["weight"].grad.dtype == torch.bfloat16
    assert len(chunks) == 1
    assert sum(chunks[0]) == (k if skip else n) and max(chunks[0]) <= (32 if split == 1 else 16)
    if split == 1:
        assert count == pytest.approx(4 * (k / n if skip else 1), rel=1e-12)
        assert skip or chunks[0] == [2 * t] * PAIRS
    else:  # a sub-chunk of each pair formed twice: its rows once more
        assert count == pytest.approx(4 * (k / n if skip else 1) + twice[0] / n, rel=1e-12)
        assert skip or chunks[0] == [16, 4] * PAIRS  # the last sub-chunk (16 rows) first, then the first one (the rest)
    monkeypatch.setattr(pf, "PAIR_CHUNK_LOGITS_CUDA", 0)  # the old rule: a pair exceeds the lean chunk
    old = _leaves(inp, grads=("hidden", "weight"))
    assert head_matmuls(lambda: TF.fused_linear_dpo_loss(**old, memory="low").loss.backward(), n, H, v) >= 5 * k / n
    # against float64, as the plain bf16 computation (TRL's): 2x its error, grad_weight 3x (rounded to bf16 after
    # every chunk: tests/test_fused_linear_cross_entropy.py's LEAN_WEIGHT_FACTOR)
    spec = P.RECORDS[0]
    truth, plain = _leaves(inp, torch.float64, grads=("hidden", "weight")), _leaves(inp, grads=("hidden", "weight"))
    t_loss, p_loss = spec.original(**truth)[0], spec.original(**plain)[0]
    t_loss.backward()
    p_loss.backward()
    for name, ours, theirs, exact, factor in (("loss", low[0].loss, p_loss, t_loss, 2.0),
                                              ("hidden", got["hidden"].grad, plain["hidden"].grad,
                                               truth["hidden"].grad, 2.0),
                                              ("weight", got["weight"].grad, plain["weight"].grad,
                                               truth["weight"].grad, 3.0)):
        err, orig = rel_l2(ours, exact), rel_l2(theirs, exact)
        assert err <= max(factor * orig, FLOOR[torch.bfloat16]), (name, err, orig)


class _Allocated(TorchDispatchMode):
    """The largest tensor an op allocates (its output not sharing an input's storage), in elements."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.most = max(self.most, t.numel())
        return out


@CPU_RULES
def test_kept_reference_rows_copy_only_the_chunk_of_a_sequence_first_reference(monkeypatch):
    # a reference model's hidden states in a sequence-first layout ((T, B, H_ref) transposed: not viewable as
    # (B T, H_ref)): each chunk copies its own reference rows, never all of them (the kept rows' gather copied the
    # whole (B T, H_ref) hidden states at every chunk)
    monkeypatch.setattr(flce_ops, "MAX_CHUNK_ELEMS_CPU", 2 * T * V)  # one pair a chunk
    inp = _batch(reference="model")
    hr = 9
    gen = torch.Generator().manual_seed(1)
    inp["ref_hidden"] = torch.randn(T, 2 * PAIRS, hr, generator=gen).transpose(0, 1)
    inp["ref_weight"] = torch.randn(V, hr, generator=gen) / hr ** 0.5
    real = pf._in_loop
    copied = []

    def in_loop(*args):
        rows, w, b = real(*args)

        def watched(s, e, idx):
            with _Allocated() as seen:
                out = rows(s, e, idx)
            copied.append((e - s, seen.most))
            return out

        return watched, w, b

    monkeypatch.setattr(pf, "_in_loop", in_loop)
    runs = [_run(TF.fused_linear_dpo_loss, inp, {}, min_macs, monkeypatch)[:2] for min_macs in (NEVER, 0)]
    assert len(copied) > PAIRS  # the chunks of both runs
    assert all(most <= rows * hr for rows, most in copied), copied
    (every, g_every), (kept, g_kept) = runs
    for a, b in zip([*every, *g_every.values()], [*kept, *g_kept.values()]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


SPLIT_CASES = ["dpo sigmoid, reference model", "dpo ipo, reference model, averaged, bias",
               "dpo sigmoid + nll, given logps, averaged", "kto, reference model, bias"]


@CPU_RULES
@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("label,split,memory", [(label, split, "low") for label in SPLIT_CASES for split in (2, 3)]
                         + [(label, 2, "budget") for label in SPLIT_CASES[:2]])
def test_memory_low_splits_a_unit_over_sub_chunks(label, split, memory, skip, monkeypatch):
    # the CUDA chunk rules on CPU, memory="low": the lean rule's chunk (16 rows here) holds less than a unit (a pair
    # of 2 x 8k tokens, a KTO sequence of 16k), so each unit takes k = LOW_SPLIT sub-chunks of 16 rows (with ignored
    # rows skipped: of its kept rows, at most 16 each); the loss, every output and every gradient as float64 (fp32:
    # 1e-5), head matmuls 3 + (k - 1) / k a row for the policy (the rows formed twice) + the reference's 1. A budget in
    # bytes (any device) whose chunk holds 16 rows (the fp32 accumulator and 20 rows of logits, in 16-row steps) splits
    # the same way rather than leaving the formed pass
    fn, batch, opts, ref_mm = CASES[label]
    kto = fn is P.fused_linear_kto_loss
    monkeypatch.setattr(pf, "LOW_SPLIT", split)
    monkeypatch.setattr(flce_ops, "compiled_cuda", lambda device: True)
    monkeypatch.setattr(flce_ops, "LEAN_CHUNK_ELEMS", 16 * V)
    monkeypatch.setattr(flce_ops, "LEAN_MIN_ROWS", 16)
    t, v = 16 * split if kto else 8 * split, 200
    n = 2 * PAIRS * t
    inp = _batch(**batch, t=t, v=v)
    opts = dict(opts, memory="low" if memory == "low" else 4 * v * H + 20 * v * 4)
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", 0 if skip else NEVER)
    chunks = []
    real_loop = klp.backward_over_chunks
    monkeypatch.setattr(klp, "backward_over_chunks",
                        lambda *a, **kw: chunks.append(kw["bounds"]) or real_loop(*a, **kw))
    twice = _formed_twice(monkeypatch)
    got = _leaves(inp)
    out = []
    count = head_matmuls(lambda: out.append(fn(**got, **opts)) or out[0].loss.backward(), n, H, v)
    k = int((inp["target"] != -100).sum()) if skip else n
    assert len(chunks) == len(twice) == 1
    sizes = [e - s for s, e in zip(chunks[0], chunks[0][1:])]
    assert sum(sizes) == k and max(sizes) <= 16
    assert count == pytest.approx(((3 + ref_mm) * k + twice[0]) / n, rel=1e-12)
    if not skip:  # every unit in k sub-chunks of 16 rows: 3 + (k - 1) / k policy matmuls
        assert sizes == [16] * (n // 16)
        assert count == pytest.approx(3 + (split - 1) / split + ref_mm, rel=1e-12)
    else:
        assert twice[0] > 0
    truth = _leaves(inp, torch.float64)
    spec = ref_kto if kto else ref
    want = getattr(spec, fn.__name__)(**truth, **{k: x for k, x in opts.items() if k != "memory"})
    want.loss.backward()
    for name, a, b in zip(type(want)._fields, out[0], want):
        assert rel_l2(a.double(), b) < 1e-5, (name, rel_l2(a.double(), b))
    for name in ("hidden", "weight", "bias"):
        if name in got:
            assert rel_l2(got[name].grad.double(), truth[name].grad) < 1e-5, name


@CPU_RULES
def test_memory_low_split_units_under_compile(monkeypatch):
    # torch.compile (fullgraph, aot_eager) of DPO with memory="low" and pairs split in two sub-chunks (the CUDA rules
    # on CPU, as above): the custom op runs the same deferred pass; equal to eager, 3.5 + 1 head matmuls a row
    monkeypatch.setenv("TIGON_COMPILE_OPS", "kernels")
    monkeypatch.setattr(pf, "LOW_SPLIT", 2)
    monkeypatch.setattr(flce_ops, "compiled_cuda", lambda device: True)
    monkeypatch.setattr(flce_ops, "LEAN_CHUNK_ELEMS", 16 * V)
    monkeypatch.setattr(flce_ops, "LEAN_MIN_ROWS", 16)
    monkeypatch.setattr(ignored_rows, "SKIP_MIN_MACS", NEVER)
    t, v = 16, 200
    n = 2 * PAIRS * t
    inp = _batch(reference="model", t=t, v=v)
    torch._dynamo.reset()
    try:
        runs = []
        for compiled in (False, True):
            call = (torch.compile(lambda **kw: tuple(TF.fused_linear_dpo_loss(**kw, memory="low")),
                                  backend="aot_eager", fullgraph=True) if compiled
                    else (lambda **kw: tuple(TF.fused_linear_dpo_loss(**kw, memory="low"))))
            got = _leaves(inp)
            out = []
            count = head_matmuls(lambda: out.append(call(**got)) or out[0][0].backward(), n, H, v, compiled=compiled)
            runs.append((out[0], [got[k].grad for k in ("hidden", "weight")], count))
        (eager, g_eager, n_eager), (comp, g_comp, n_comp) = runs
        assert n_eager == pytest.approx(3.5 + 1, rel=1e-12) and n_comp == pytest.approx(n_eager, rel=1e-12)
        for a, b in zip([*eager, *g_eager], [*comp, *g_comp]):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    finally:
        torch._dynamo.reset()
