import pytest
import torch

from tigon import functional as F
from tigon import nn as TN
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.group_norm import group_norm as ref_group_norm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # as in conftest
GRADS = ["X", "affine_scaling_weight", "affine_shifting_bias"]


def make(shape, groups, dtype, device, affine=(True, True)):
    c = shape[1]
    return dict(X=torch.randn(shape, device=device, dtype=dtype) * 3 + 0.5,
                affine_scaling_weight=(torch.rand(c, device=device) + 0.5).to(dtype) if affine[0] else None,
                affine_shifting_bias=torch.randn(c, device=device).to(dtype) if affine[1] else None,
                num_channels=c, num_groups=groups, eps=1e-6)


@pytest.fixture(params=[True, False], ids=["one_launch", "two_launches"])
def fused(request, monkeypatch):
    """Both paths: groups that fit a tile in one launch a direction (``_group_fwd`` / ``_group_bwd``), and
    (FUSED_GROUP 0) the split path (tile partials, a reduction a group, the affine pass)."""
    from tigon.kernels import group_norm as k

    if not request.param:
        monkeypatch.setattr(k, "FUSED_GROUP", 0)
        monkeypatch.setattr(k, "INTERPRET_FUSED_GROUP", 0)
    return request.param


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,groups", [((3, 6, 5), 3), ((2, 12), 2), ((2, 4, 3, 7), 1)])
def test_group_norm_matches_float64(device, dtype, shape, groups):
    # (B, C, S), no positions (B, C), two position dimensions
    inputs = make(shape, groups, dtype, device)
    checks = compare(F.group_norm, ref_group_norm, inputs, GRADS, factor=2.0)  # verify's rule
    assert {c.tensor for c in checks} == {"out", *(f"grad_{g}" for g in GRADS)}
    assert_close_to_truth(checks)
    # and no worse than torch's own group_norm at the input dtype
    assert_close_to_truth(compare(F.group_norm, lambda X, affine_scaling_weight, affine_shifting_bias, num_groups,
                                  eps, **_: torch.nn.functional.group_norm(X, num_groups, affine_scaling_weight,
                                                                           affine_shifting_bias, eps),
                                  inputs, GRADS, factor=2.0))


@pytest.mark.parametrize("fwd_warps", [0, 1], ids=["fwd_warps_default", "fwd_warps_1"])
def test_group_norm_one_launch_matches_two(device, monkeypatch, fwd_warps):
    # the one-launch forward and backward (a group in one tile) against the split path: the same output, group
    # statistics and gradients up to fp32 summation order; the forward also at GROUP_FWD_WARPS 1 (a launch option)
    from tigon.kernels import group_norm as k

    monkeypatch.setattr(k, "GROUP_FWD_WARPS", fwd_warps)

    x = torch.randn(3, 12, 5, 7, device=device) * 2 + 1
    dy = torch.randn(3, 12, 5, 7, device=device)
    w, b = torch.rand(12, device=device) + 0.5, torch.randn(12, device=device)

    def run():
        y, x2, mean_g, rstd_g = k.group_norm_forward(x, w, b, 4, 1e-6)
        return (y, mean_g, rstd_g) + k.group_norm_backward(dy, x2, w, b, mean_g, rstd_g, x.shape, 4, 1e-6, True, True)

    one = run()
    monkeypatch.setattr(k, "FUSED_GROUP", 0)
    monkeypatch.setattr(k, "INTERPRET_FUSED_GROUP", 0)
    for a, c in zip(one, run()):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def test_group_norm_reference_is_torch_group_norm(device):
    x = torch.randn(2, 6, 5, 3, dtype=torch.float64, device=device)
    w, b = torch.rand(6, dtype=torch.float64, device=device), torch.randn(6, dtype=torch.float64, device=device)
    for ww, bb in ((w, b), (None, None), (w, None)):
        torch.testing.assert_close(ref_group_norm(x, ww, bb, 6, 2, 1e-5),
                                   torch.nn.functional.group_norm(x, 2, ww, bb, 1e-5), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
def test_group_norm_without_weight_or_bias(device, fused, affine):
    inputs = make((2, 6, 9), 2, torch.float32, device, affine)
    grads = ["X"] + [g for g, on in zip(GRADS[1:], affine) if on]
    assert_close_to_truth(compare(F.group_norm, ref_group_norm, inputs, grads))


@pytest.mark.parametrize("affine", [(False, False), (True, False), (False, True)])
def test_group_norm_flags_bf16_and_no_positions(device, fused, affine):
    # the kernels' HAS_W / HAS_B flags (w = 1, b = 0 without a materialised tensor) in bf16, against torch's own
    # group_norm at that dtype, and a (B, C) input (one position a channel row, several groups a tile)
    grads = ["X"] + [g for g, on in zip(GRADS[1:], affine) if on]
    for shape, groups in (((3, 8, 10), 4), ((5, 12), 3)):
        inputs = make(shape, groups, torch.bfloat16, device, affine)
        assert_close_to_truth(compare(F.group_norm, ref_group_norm, inputs, grads, factor=2.0))


def test_group_norm_empty_batch(device):
    # B = 0 (torch's group_norm gives an empty result; the reference's reshape with -1 raised on 0 elements)
    X = torch.randn(0, 6, 5, device=device, requires_grad=True)
    w = torch.rand(6, device=device, requires_grad=True)
    y = F.group_norm(X, w, None, 6, 3)
    assert y.shape == (0, 6, 5)
    dX, dw = torch.autograd.grad(y.sum(), (X, w))
    assert dX.shape == (0, 6, 5) and not dw.any()


def _split(monkeypatch, tile, reduce_block=None):
    """The split path with tiles of ``tile`` elements (and reduction steps of ``reduce_block`` partials)."""
    from tigon.kernels import group_norm as k

    monkeypatch.setattr(k, "FUSED_GROUP", 0)
    monkeypatch.setattr(k, "INTERPRET_FUSED_GROUP", 0)
    monkeypatch.setattr(k, "tile_elems", lambda dev: tile)
    if reduce_block:
        monkeypatch.setattr(k, "REDUCE_BLOCK", reduce_block)
    return k


def test_group_norm_many_channels_a_group_few_positions(device, monkeypatch):
    # tiles of many channel rows of few positions, several row tiles a group (and the backward's reduction over a
    # group's channel rows in steps)
    k = _split(monkeypatch, 64, reduce_block=8)
    assert k._tile_shape(32, 3, torch.device(device)) == (16, 4, 1, 2)  # (BLOCK_R, BLOCK_S, n_tc, T)
    inputs = make((2, 96, 3), 3, torch.float32, device)
    assert_close_to_truth(compare(F.group_norm, ref_group_norm, inputs, GRADS))


@pytest.mark.parametrize("dtype,affine", [(torch.float32, (True, True)), (torch.bfloat16, (False, False)), pytest.param(
    torch.float32, (True, False), marks=pytest.mark.skipif(
        DEVICE == "cpu", reason="CI time on CPU: a weight without bias on the split path is also "
                                "test_group_norm_without_weight_or_bias[two_launches]; all three on CUDA"))])
def test_group_norm_large_groups_split_across_programs(device, monkeypatch, dtype, affine):
    # groups larger than a tile (forced to 16 elements): partial moments / gradient sums per tile, reduced a group at
    # a time in steps of 4 partials (several steps), odd sizes (last tiles partly masked), one group of 6 x 37
    # positions (18 tiles of 16), a non-contiguous input, the weight / bias flags; deterministic (two runs bitwise
    # equal)
    k = _split(monkeypatch, 16, reduce_block=4)
    assert k._tile_shape(6, 37, torch.device(device)) == (1, 16, 3, 18)
    grads = ["X"] + [g for g, on in zip(GRADS[1:], affine) if on]
    factor = 2.0 if dtype != torch.float32 else 1.0
    for shape, groups in (((2, 6, 37), 1), ((3, 4, 5, 7), 2), ((5, 12), 3)):
        inputs = make(shape, groups, dtype, device, affine)
        assert_close_to_truth(compare(F.group_norm, ref_group_norm, inputs, grads, factor=factor))
    wide = (torch.randn(6, 8, 19, device=device) * 2 + 1)[::2, :, 1:].to(dtype)  # strided batch and positions
    inputs = dict(make((3, 8, 18), 2, dtype, device, affine), X=wide)
    before = wide.clone()
    assert_close_to_truth(compare(F.group_norm, ref_group_norm, inputs, grads, factor=factor))
    assert torch.equal(wide, before)
    x = torch.randn(2, 6, 37, device=device, requires_grad=True)
    w = torch.rand(6, device=device, requires_grad=True)
    runs = []
    for _ in range(2):
        y = F.group_norm(x, w, None, 6, 1)
        runs.append((y,) + torch.autograd.grad(y, (x, w), torch.ones_like(y) + x.detach()))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_group_norm_chunked_rows_and_strided_input(device, fused, monkeypatch):
    # channel rows wider than a tile (forced small here on the split path: several column tiles a row, the last
    # partly masked); a channels-last view (copied once) and a non-contiguous batch; the caller's tensors are left as
    # they were
    from tigon.kernels import group_norm as k

    monkeypatch.setattr(k, "tile_elems", lambda dev: 8)
    base = torch.randn(2, 5, 5, 6, device=device) * 2 + 3  # (B, H, W, C)
    x = base.permute(0, 3, 1, 2)  # (B, C, H, W) channels-last
    inputs = dict(make((2, 6, 5, 5), 3, torch.float32, device), X=x)
    before = {n: t.clone() for n, t in inputs.items() if isinstance(t, torch.Tensor)}
    support.backend_usage(reset=True)
    assert_close_to_truth(compare(F.group_norm, ref_group_norm, inputs, GRADS))
    assert set(support.backend_usage()["group_norm"]) == {"triton" if device == "cuda" else "interpreter"}
    assert all(torch.equal(inputs[n], t) for n, t in before.items())
    wide = torch.randn(6, 3, 40, device=device)[::2]  # strided batch
    assert_close_to_truth(compare(F.group_norm, ref_group_norm, dict(make((3, 3, 40), 3, torch.float32, device),
                                                                      X=wide), GRADS))


def test_group_norm_module(device):
    m = TN.GroupNorm(6, 3, eps=1e-5).to(device)
    assert set(m.state_dict()) == {"weight", "bias"} and torch.equal(m.bias.detach(), torch.zeros(6, device=device))
    x = torch.randn(2, 6, 4, device=device)
    torch.testing.assert_close(m(x), torch.nn.functional.group_norm(x, 3, m.weight, m.bias, 1e-5))
    assert "num_groups=3" in repr(m) and m.eps == 1e-5
    m.eps = 1e-3  # a plain attribute in Liger's module (and torch's): settable, and the forward uses it
    assert m.variance_epsilon == 1e-3
    torch.testing.assert_close(m(x), torch.nn.functional.group_norm(x, 3, m.weight, m.bias, 1e-3))
    with pytest.raises(ValueError, match="at least 3 dimensions"):
        m(torch.randn(2, 6, device=device))
    with pytest.raises(ValueError, match="positive divisor"):
        TN.GroupNorm(6, 4)
    with pytest.raises(ValueError, match="init_fn"):
        TN.GroupNorm(6, 3, init_fn="randn")


def test_group_norm_bad_input(device):
    x = torch.randn(2, 6, 3, device=device)
    w = torch.ones(6, device=device)
    with pytest.raises(ValueError, match=r"X's dimension 1 \(6\) must equal num_channels \(4\)"):
        F.group_norm(x, None, None, 4, 2)
    with pytest.raises(ValueError, match="positive divisor of num_channels"):
        F.group_norm(x, w, w, 6, 4)
    with pytest.raises(ValueError, match=r"affine_shifting_bias must have shape \(6,\)"):
        F.group_norm(x, w, w[:5], 6, 3)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        F.group_norm(x[0, 0], None, None, 3, 1)
    with pytest.raises(TypeError, match="num_groups must be an int"):
        F.group_norm(x, w, w, 6, 3.0)
    with pytest.raises(TypeError, match="X must be a floating-point tensor"):
        F.group_norm(x.long(), w, w, 6, 3)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        F.group_norm(x, w, w, 6, 3, -1.0)


@pytest.mark.parametrize("affine", [(True, True), (False, False)])
def test_group_norm_issues_only_its_kernels(device, fused, kernel_count, affine):
    # a forward is 1 Triton launch (a group in one tile) or 3 (split: tile moments, their reduction a group, the
    # affine pass), a backward 1 or 3 and the dw / db sum (none without weight and bias), and no ATen operation runs a
    # kernel between them: the group statistics, c1 / c2 and the missing weight / bias (constexpr flags) are formed
    # in the kernels (before: 18 + 26 with ~35 small ATen ops)
    from tigon.kernels import group_norm as k

    kernel_count.stub(k, "_group_fwd", "_group_bwd", "_tile_moments", "_group_moments", "_tile_grad_sums",
                      "_group_grad_sums", "_tile_affine", "_sum_partials")
    inputs = make((2, 8, 16), 4, torch.bfloat16, device, affine)
    leaves = [t.requires_grad_() for t in inputs.values() if isinstance(t, torch.Tensor)]
    with kernel_count as c:
        y = F.group_norm(**inputs)
    assert (c.launches, c.aten) == (["_group_fwd"] if fused else ["_tile_moments", "_group_moments", "_tile_affine"],
                                    [])
    dy = torch.ones_like(y)
    with kernel_count as c:
        torch.autograd.grad(y, leaves, dy)
    assert c.aten == []
    assert c.launches == (["_group_bwd"] if fused else ["_tile_grad_sums", "_group_grad_sums", "_tile_affine"]) + (
        ["_sum_partials"] if affine[0] else [])


def test_group_norm_bench_groups_override(monkeypatch):
    # TIGON_BENCH_GROUP_NORM_GROUPS: the bench's groups (1: groups of 2^19 elements at Llama-3 sizes, the split path)
    from types import SimpleNamespace

    from tigon.ops import group_norm as op

    llama = SimpleNamespace(tokens=16384, hidden=4096)
    assert op._shape(llama)["groups"] == 32
    monkeypatch.setenv(op.GROUPS_ENV, "1")
    assert op._shape(llama) == dict(tokens=16384, batch=128, channels=128, groups=1, hidden=4096)
    for bad in ("3", "0", "x"):
        monkeypatch.setenv(op.GROUPS_ENV, bad)
        with pytest.raises(ValueError, match="TIGON_BENCH_GROUP_NORM_GROUPS must be a positive divisor"):
            op._shape(llama)


@pytest.mark.parametrize("row_sums", [False, True], ids=["accumulators", "row_sums"])
@pytest.mark.parametrize("affine", [(True, True), (False, False)])
def test_group_norm_streamed_backward(device, monkeypatch, affine, row_sums):
    # GROUP_BWD_CHUNK: the one-launch backward streaming each group in chunks, twice (sums, then dx), against the
    # group held in registers and against float64: odd channel counts and positions (partial chunks), a chunk
    # narrower than a row (several a row) and one of several rows, a non-contiguous input; with GROUP_BWD_ROW_SUMS
    # each chunk reduced to row sums at once, and a chunk as large as the (padded) group: 4 x 64 elements
    from tigon.kernels import group_norm as k

    monkeypatch.setattr(k, "GROUP_BWD_ROW_SUMS", row_sums)

    x = torch.randn(3, 12, 5, 7, device=device) * 2 + 1
    dy = torch.randn(3, 12, 5, 7, device=device)
    w, b = (torch.rand(12, device=device) + 0.5, torch.randn(12, device=device)) if affine[0] else (None, None)

    def run():
        y, x2, mean_g, rstd_g = k.group_norm_forward(x, w, b, 4, 1e-6)
        return k.group_norm_backward(dy, x2, w, b, mean_g, rstd_g, x.shape, 4, 1e-6, affine[0], affine[1])

    held = run()
    for chunk in (4, 16, 64) + ((256,) if row_sums else ()):
        monkeypatch.setattr(k, "GROUP_BWD_CHUNK", chunk)
        for a, c in zip(held, run()):
            if a is not None:
                torch.testing.assert_close(c, a, rtol=1e-5, atol=1e-5)
        base = make((2, 6, 5, 7), 3, torch.float32, device, affine)
        inputs = dict(base, X=torch.randn(2, 5, 7, 6, device=device).permute(0, 3, 1, 2) * 2 + 1)
        assert_close_to_truth(compare(F.group_norm, ref_group_norm, inputs,
                                      [g for g, a in zip(GRADS, (True,) + affine) if a]))


def test_group_norm_module_constructor_checks():
    # GroupNorm(-1, 1) failed inside torch ("negative dimension"), GroupNorm(0, 1) built an empty module, a float
    # count or a bool slipped through (1.0 divides 4.0); bias=1 was a truthy stand-in for True
    for args, error, match in (((-1, 1), ValueError, "num_channels must be a positive int"),
                               ((0, 1), ValueError, "num_channels must be a positive int"),
                               ((4.0, 2), TypeError, "num_channels must be a positive int"),
                               ((4, True), TypeError, "num_groups must be a positive int"),
                               ((4, 2.0), TypeError, "num_groups must be a positive int")):
        with pytest.raises(error, match=match):
            TN.GroupNorm(*args)
    with pytest.raises(TypeError, match="bias must be a bool"):
        TN.GroupNorm(4, 2, bias=1)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        TN.GroupNorm(4, 2, eps=float("nan"))
