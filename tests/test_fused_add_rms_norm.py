"""fused_add_rms_norm: s = x + residual, y = rms_norm(s), against a float64 evaluation of the reference; autograd
of the one gradient shared by x and residual; in_place; errors; the fallback."""

import pytest
import torch

from tigon import functional as F
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.fused_add_rms_norm import fused_add_rms_norm as ref_fadd

from _memory import in_place_saving

# As tests/test_rms_norm.py: bf16/fp16 errors are dominated by the final rounding, which Tigon shares with the
# original; 1.1 absorbs the sampling noise of a relative-L2 estimate.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}
GRADS = ["x", "residual", "weight"]


def _inputs(shape, device, dtype=torch.float32, offset=0.0, casting_mode="llama", w_dtype=None):
    hidden = shape[-1]
    return dict(x=torch.randn(shape, device=device).to(dtype),
                residual=(torch.randn(shape, device=device) * 3 + 0.5).to(dtype),
                weight=(torch.rand(hidden, device=device) + 0.5).to(w_dtype or dtype), eps=1e-6, offset=offset,
                casting_mode=casting_mode)


def _check(inputs, factor=1.0, grads=GRADS, s_upstream=True):
    """Outputs y, s and the gradients in ``grads`` within the original's own error (s's upstream random, or absent)."""
    checks = compare(F.fused_add_rms_norm, ref_fadd, inputs, grads, factor=factor,
                     differentiable_outputs=None if s_upstream else [0])
    assert {c.tensor for c in checks} == {"out", "out1", *(f"grad_{g}" for g in grads)}
    assert_close_to_truth(checks)
    return checks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("casting_mode,offset", [("llama", 0.0), ("gemma", 1.0), ("none", 0.0)])
@pytest.mark.parametrize("shape", [(2, 5, 96), (9, 1000)])
def test_matches_float64(device, dtype, casting_mode, offset, shape):
    inputs = _inputs(shape, device, dtype, offset, casting_mode)
    for s_upstream in (True, False):
        checks = _check(inputs, FACTOR[dtype], s_upstream=s_upstream)
        if dtype == torch.float32:
            assert max(c.tigon_err for c in checks) < 1e-5


def test_odd_hidden_4099_and_fp32_weight(device):
    # 4099 columns: an 8192-wide block, mostly masked; fp32 weight with bf16 activations: y promotes to fp32 (llama).
    _check(_inputs((3, 4099), device, torch.bfloat16, w_dtype=torch.float32), 1.1)
    y, s = F.fused_add_rms_norm(**_inputs((3, 4099), device, torch.bfloat16, w_dtype=torch.float32))
    assert (y.dtype, s.dtype) == (torch.float32, torch.bfloat16)
    y, _ = F.fused_add_rms_norm(**_inputs((3, 40), device, torch.bfloat16, casting_mode="gemma",
                                          w_dtype=torch.float32))
    assert y.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_exactly_rms_norm_of_the_sum(device, dtype):
    # s is torch's x + residual bit for bit; y, and (without s's gradient) the gradients, are tigon's rms_norm of s.
    inputs = _inputs((4, 3, 200), device, dtype, 1.0, "gemma")
    x, r, w = (inputs[k].clone().requires_grad_(True) for k in ("x", "residual", "weight"))
    y, s = F.fused_add_rms_norm(x, r, w, 1e-6, 1.0, "gemma")
    assert torch.equal(s, inputs["x"] + inputs["residual"]) and s.dtype == dtype
    s0 = (inputs["x"] + inputs["residual"]).requires_grad_(True)
    w0 = inputs["weight"].clone().requires_grad_(True)
    y0 = F.rms_norm(s0, w0, 1e-6, 1.0, "gemma")
    assert torch.equal(y, y0)
    dy = torch.randn_like(y)
    y.backward(dy)
    y0.backward(dy)
    assert torch.equal(x.grad, s0.grad) and torch.equal(r.grad, s0.grad) and torch.equal(w.grad, w0.grad)


def test_non_contiguous_inputs_are_not_mutated(device):
    base = torch.randn(6, 4, 200, device=device)
    x = base[..., :130]  # rows with a row stride of 200: read in place
    residual = torch.randn(4, 6, 130, device=device).transpose(0, 1)  # (6, 4, 130), rows not evenly strided
    w = torch.randn(130, device=device)
    before = (x.clone(), residual.clone(), w.clone())
    _check(dict(x=x, residual=residual, weight=w))
    y, s = F.fused_add_rms_norm(x, residual, w)
    assert y.is_contiguous() and s.is_contiguous() and y.shape == s.shape == (6, 4, 130)
    assert all(torch.equal(a, b) for a, b in zip((x, residual, w), before))


def test_some_gradients_only(device):
    inputs = _inputs((7, 64), device)
    _check(inputs, grads=["x"])
    _check(inputs, grads=["residual", "weight"], s_upstream=False)
    _check(inputs, grads=["weight"])


@pytest.mark.parametrize("wide", ["registers", "chunked"])
@pytest.mark.parametrize("casting_mode,offset", [("llama", 0.0), ("gemma", 1.0)])
def test_wide_row_and_many_programs(device, monkeypatch, casting_mode, offset, wide):
    # The backward variants of the shared kernels (tigon.kernels.norm), forced as in tests/test_rms_norm.py: whole
    # rows without the prefetch, column chunks, then several persistent programs with a partial last one; each
    # with s's gradient present (HAS_DS) and absent, and writing in place into dy.
    from tigon.kernels import norm

    inputs = _inputs((5, 3, 300), device, offset=offset, casting_mode=casting_mode)

    def checks():
        for s_upstream in (True, False):
            _check(inputs, s_upstream=s_upstream)
        _check(dict(inputs, in_place=True))

    monkeypatch.setattr(norm, "WIDE_ROW", 64)
    monkeypatch.setattr(norm, "REGISTER_ROW", 64 if wide == "chunked" else 1 << 20)
    checks()
    monkeypatch.setattr(norm, "WIDE_ROW", 1 << 20)
    monkeypatch.setattr(norm, "REGISTER_ROW", 1 << 20)
    monkeypatch.setattr(norm, "rows_per_program", lambda n, dev, target_elems=0: 4)
    monkeypatch.setattr(norm, "num_programs_hint", lambda dev: 3)
    checks()


# ---- autograd: one gradient tensor for x and residual ---------------------------------------------------------
def test_shared_gradient_is_safe_for_autograd(device):
    inputs = _inputs((6, 48), device)
    x, r, w = (inputs[k].clone().requires_grad_(True) for k in ("x", "residual", "weight"))
    y, s = F.fused_add_rms_norm(x, r, w)
    dy, ds = torch.randn_like(y), torch.randn_like(s)
    torch.autograd.backward([y, s], [dy, ds], retain_graph=True)
    first = x.grad.clone()
    assert torch.equal(x.grad, r.grad)
    # the leaves' .grad never alias one another, so accumulating a second backward adds to each exactly once
    assert x.grad.data_ptr() != r.grad.data_ptr()
    torch.autograd.backward([y, s], [dy, ds])
    assert torch.equal(x.grad, 2 * first) and torch.equal(r.grad, 2 * first)
    # one tensor as both x and residual: autograd sums the two (equal) gradients out of place
    h = inputs["x"].clone().requires_grad_(True)
    h0 = inputs["x"].double().requires_grad_(True)
    torch.autograd.backward(F.fused_add_rms_norm(h, h, w.detach()), [dy, ds])
    torch.autograd.backward(ref_fadd(h0, h0, w.detach().double()), [dy.double(), ds.double()])
    torch.testing.assert_close(h.grad, h0.grad.float(), rtol=1e-5, atol=1e-5)
    # non-leaf inputs and a gradient only through s (y unused): s's gradient passes to both, no weight gradient
    a = inputs["x"].clone().requires_grad_(True)
    b = inputs["residual"].clone().requires_grad_(True)
    w2 = inputs["weight"].clone().requires_grad_(True)
    _, s = F.fused_add_rms_norm(a * 2, b * 3, w2)
    s.backward(ds)
    assert torch.equal(a.grad, ds * 2) and torch.equal(b.grad, ds * 3) and w2.grad is None


def test_not_differentiable_twice(device):
    x = torch.randn(3, 16, device=device, requires_grad=True)
    y, _ = F.fused_add_rms_norm(x, torch.randn(3, 16, device=device), torch.ones(16, device=device))
    (g,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


# ---- in_place ---------------------------------------------------------------------------------------------------
def _run(inputs, in_place, dy, ds=None):
    x, r, w = (inputs[k].clone().requires_grad_(True) for k in ("x", "residual", "weight"))
    y, s = F.fused_add_rms_norm(x, r, w, inputs["eps"], inputs["offset"], inputs["casting_mode"], in_place)
    torch.autograd.backward([y, s] if ds is not None else [y], [dy, ds] if ds is not None else [dy])
    return (x, r, w), (y, s)


@pytest.mark.parametrize("with_ds", [True, False])
def test_in_place_never_writes_the_callers_gradients(device, with_ds):
    inputs = _inputs((2, 7, 96), device, torch.bfloat16)
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    dy0 = torch.randn(2, 7, 96, device=device, dtype=torch.bfloat16)
    ds0 = torch.randn_like(dy0)
    grads = []
    for in_place in (False, True):
        dy, ds = dy0.clone(), ds0.clone() if with_ds else None
        (x, r, w), _ = _run(inputs, in_place, dy, ds)
        grads.append((x.grad, r.grad, w.grad))
        assert torch.equal(dy, dy0) and (ds is None or torch.equal(ds, ds0))  # only read, in either mode
    assert all(torch.equal(a, b) for a, b in zip(*grads))
    assert all(torch.equal(inputs[k], before[k]) for k in before)  # the forward writes no input, either way


def _grads(inputs, in_place, tail):
    """x's, residual's and weight's gradients of ``tail(y, s)``, and whether their gradient is the memory of y's
    incoming one (written over it: the (..., hidden) buffer in_place saves)."""
    x, r, w = (inputs[k].clone().requires_grad_(True) for k in ("x", "residual", "weight"))
    seen, given = [], []
    y, s = F.fused_add_rms_norm(x, r, w, inputs["eps"], inputs["offset"], inputs["casting_mode"], in_place)
    y.register_hook(lambda g: seen.append(g.data_ptr()))  # keeps no reference to g
    # x's gradient as the op's backward returns it, read while y's gradient is still alive (x and residual get one
    # tensor, which autograd copies for one of them after y's gradient is freed: on CUDA the caching allocator may
    # hand that copy y's gradient's block, so the leaves' .grad addresses say nothing)
    x.register_hook(lambda g: given.append(g.data_ptr()))
    tail(y, s).backward()
    return [x.grad, r.grad, w.grad], seen[0] == given[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_in_place_only_over_an_owned_gradient(device, dtype):
    # Liger's in_place (its functional's default, and Tigon's): written over y's gradient only where nothing else
    # reads it; values never depend on it
    inputs = _inputs((3, 5, 64), device, dtype)
    c, d = torch.randn(2, 3, 5, 64, device=device, dtype=dtype)
    for tail in (lambda y, s: (y * c).sum(), lambda y, s: (y * c).sum() + (s * d).sum()):
        want, over = _grads(inputs, False, tail)
        got, over_in_place = _grads(inputs, True, tail)  # y's gradient: MulBackward's fresh tensor, owned
        assert over_in_place and not over
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    # y's gradient shared with t's branch, which runs after this op's backward, or also s's: never written
    t = torch.randn_like(c, requires_grad=True)
    t2 = t * 1.0
    shared, over_shared = _grads(inputs, True, lambda y, s: ((y + t2) * c).sum())
    want, _ = _grads(inputs, False, lambda y, s: (y * c).sum())
    assert not over_shared and all(torch.equal(a, b) for a, b in zip(shared, want)) and torch.equal(t.grad, c)
    both, over_both = _grads(inputs, True, lambda y, s: ((y + s) * c).sum())
    want, _ = _grads(inputs, False, lambda y, s: ((y + s) * c).sum())
    assert not over_both and all(torch.equal(a, b) for a, b in zip(both, want))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="peak memory is measured with the CUDA allocator's stats")
def test_in_place_saves_one_buffer():
    # the backward's peak is one (M, hidden) buffer lower with in_place (CPU: the data_ptr checks above show it)
    inputs = _inputs((4096, 1024), "cuda", torch.bfloat16)
    c = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)

    def loss_of(in_place):
        x = inputs["x"].clone().requires_grad_()
        y, _ = F.fused_add_rms_norm(x, inputs["residual"], inputs["weight"], in_place=in_place)
        return (y * c).sum()

    saved = in_place_saving(loss_of)
    buffer = inputs["x"].numel() * inputs["x"].element_size()
    assert buffer * 0.9 <= saved <= buffer * 1.1, (saved, buffer)


def test_in_place_only_where_dy_can_hold_the_gradient(device):
    # y in fp32 (llama, fp32 weight, bf16 x): dy cannot hold the bf16 gradient, a new tensor is returned
    inputs = _inputs((5, 64), device, torch.bfloat16, w_dtype=torch.float32)
    dy0 = torch.randn(5, 64, device=device)
    dy = dy0.clone()
    (x, _, _), (y, _) = _run(inputs, True, dy)
    assert y.dtype == torch.float32 and torch.equal(dy, dy0)
    _check(dict(inputs, in_place=True), FACTOR[torch.bfloat16])
    # a non-contiguous dy (the expanded gradient of y.sum()) is never written
    x = inputs["x"].clone().requires_grad_(True)
    y, _ = F.fused_add_rms_norm(x, inputs["residual"], inputs["weight"].to(torch.bfloat16), in_place=True)
    y.sum().backward()
    x0 = inputs["x"].double().requires_grad_(True)
    ref_fadd(x0, inputs["residual"].double(), inputs["weight"].double())[0].sum().backward()
    torch.testing.assert_close(x.grad.double(), x0.grad, rtol=2e-2, atol=2e-2)


def test_in_place_when_y_and_s_get_one_gradient_tensor(device):
    # (y + s) * g: the add hands y and s the same gradient tensor, so dy is ds; written in place, each tile of it is
    # read (as dy and as ds) before it is overwritten.
    inputs = _inputs((9, 300), device)
    g = torch.randn(9, 300, device=device)

    def fn(x, residual, weight, eps, offset, casting_mode, in_place=False):
        y, s = F.fused_add_rms_norm(x, residual, weight, eps, offset, casting_mode, in_place)
        return (y + s) * g

    def original(x, residual, weight, eps, offset, casting_mode, in_place=False):
        y, s = ref_fadd(x, residual, weight, eps, offset, casting_mode)
        return (y + s) * g.to(y.dtype)

    assert_close_to_truth(compare(fn, original, dict(inputs, in_place=True), GRADS))


def test_in_place_is_ignored_by_the_reference():
    inputs = _inputs((4, 32), "cpu")
    dy0 = torch.randn(4, 32)
    dy = dy0.clone()
    with support.force_reference():
        _run(inputs, True, dy)
    assert torch.equal(dy, dy0)


# ---- errors, backend, fallback ------------------------------------------------------------------------------------
def test_empty_last_dimension_raises_on_every_path():
    # documented, but the reference path returned empty results (the kernels raised)
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        F.fused_add_rms_norm(torch.randn(2, 0), torch.randn(2, 0), torch.ones(0))
    with support.force_reference(), pytest.raises(ValueError, match="x must have a non-empty last"):
        F.fused_add_rms_norm(torch.randn(2, 0), torch.randn(2, 0), torch.ones(0))


def test_bad_input():
    x, r, w = torch.randn(2, 8), torch.randn(2, 8), torch.ones(8)
    cases = [
        (dict(weight=torch.ones(7)), ValueError, r"x.s last dimension \(8\) must equal weight.s size \(7\)"),
        (dict(residual=torch.randn(2, 9)), ValueError, r"residual must have x.s shape \(2, 8\), got \(2, 9\)"),
        (dict(residual=torch.randn(8)), ValueError, r"residual must have x.s shape"),
        (dict(residual=r.double()), TypeError, "residual must have x's dtype torch.float32, got torch.float64"),
        (dict(residual=torch.ones(2, 8, dtype=torch.long)), TypeError, "residual must be a floating-point"),
        (dict(residual=r.numpy()), TypeError, "residual must be a torch.Tensor"),
        (dict(x=torch.ones(2, 8, dtype=torch.long)), TypeError, "x must be a floating-point"),
        (dict(x=torch.tensor(1.0), residual=torch.tensor(1.0)), ValueError, "x must have at least one dimension"),
        (dict(weight=torch.ones(2, 8)), ValueError, "weight must have 1 dimension,"),
        (dict(casting_mode="t5"), ValueError, "casting_mode must be one of"),
        (dict(eps=-1.0), ValueError, "eps must be a finite number >= 0"),
        (dict(eps="a"), TypeError, "eps must be a real number"),
        (dict(offset=float("nan")), ValueError, "offset must be a finite number"),
        (dict(in_place=1), TypeError, "in_place must be a bool, got int"),
        (dict(residual=r.to("meta")), ValueError, "all tensors must be on one device"),
    ]
    for change, error, match in cases:
        args = dict(dict(x=x, residual=r, weight=w), **change)
        with pytest.raises(error, match=match):
            F.fused_add_rms_norm(**args)


def test_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.fused_add_rms_norm(torch.randn(3, 8, device=device), torch.randn(3, 8, device=device),
                         torch.ones(8, device=device))
    assert set(support.backend_usage()["fused_add_rms_norm"]) == {"triton" if device == "cuda" else "interpreter"}


def test_fallback_equals_the_reference_exactly(device):
    inputs = _inputs((3, 5, 40), device, torch.bfloat16, 1.0, "gemma")

    def run(fn):
        leaves = {k: (v.clone().requires_grad_(True) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        y, s = fn(**leaves)
        torch.autograd.backward([y, s], [torch.ones_like(y), torch.full_like(s, 0.5)])
        return y, s, *(leaves[k].grad for k in GRADS)

    with support.force_reference():
        got = run(F.fused_add_rms_norm)
    want = run(ref_fadd)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_empty_rows(device):
    x = torch.randn(0, 16, device=device, requires_grad=True)
    w = torch.ones(16, device=device, requires_grad=True)
    y, s = F.fused_add_rms_norm(x, torch.randn(0, 16, device=device), w)
    assert y.shape == s.shape == (0, 16)
    (y.sum() + s.sum()).backward()
    assert x.grad.shape == (0, 16) and torch.equal(w.grad, torch.zeros(16, device=device))


def test_record():
    from tigon import ops

    spec = ops.get("fused_add_rms_norm")
    assert spec.fn is F.fused_add_rms_norm and spec.reference is ref_fadd
    assert list(ops.registry())[:2] == ["rms_norm", "fused_add_rms_norm"]
    shape = {"tokens": 1000, "hidden": 4096}
    assert spec.bytes_moved(shape, 2, "fwd") == 4 * 1000 * 4096 * 2
    assert spec.bytes_moved(shape, 2, "bwd") == 4 * 1000 * 4096 * 2
    assert spec.bytes_moved(shape, 2, "fwd_bwd") == 8 * 1000 * 4096 * 2
    assert spec.size_format == "tokens x hidden" and spec.grad_inputs == ("x", "residual", "weight")
    inputs = spec.make_inputs(dict(shape, tokens=4, hidden=32), torch.float32, "cpu",
                              torch.Generator().manual_seed(0))
    with support.force_reference():
        y, s = spec.fn(**inputs)
    y0, s0 = spec.original(**inputs)
    assert torch.equal(y, y0) and torch.equal(s, s0)
