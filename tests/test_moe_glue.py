"""The MoE glue ops (tigon.functional.moe_gather, moe_expert_gate, moe_combine) against float64 evaluations of
transformers' grouped_mm experts code (tigon.reference.moe_glue): fp32 near 1e-5 and bf16 no worse than that code at
bf16 (verify's rule, factor 2), every gradient; odd sizes, experts with no rows, every row to one expert, k = 1, rows
past the last offset (no bias), non-contiguous inputs, several tiles / column blocks / row chunks per program, bad
input."""

import pytest
import torch

from tigon import functional as F
from tigon.numerics import assert_close_to_truth, compare
from tigon.ops.moe_glue import routing
from tigon.reference import moe_glue as ref


def route(ids: torch.Tensor, experts: int, device):
    """positions (T, k) and offsets (E,) of a given (T, k) expert choice, as grouped_mm_experts_forward sorts it."""
    perm = torch.sort(ids.reshape(-1), stable=True).indices
    positions = torch.empty_like(perm)
    positions[perm] = torch.arange(perm.numel())
    offsets = torch.cumsum(torch.bincount(ids.reshape(-1), minlength=experts), 0).to(torch.int32)
    return positions.view(ids.shape).to(device), offsets.to(device)


def inputs(tokens, k, experts, hidden, inter, dtype, device, seed=0, ids=None):
    gen = torch.Generator().manual_seed(seed)
    if ids is None:
        r = routing(gen, tokens, experts, k, "cpu")
        positions, offsets = r["positions"].to(device), r["offsets"].to(device)
        k = positions.shape[1]
    else:
        positions, offsets = route(ids, experts, device)
    S = tokens * k

    def rnd(*shape, std=1.0):
        return (torch.randn(shape, generator=gen) * std).to(device=device, dtype=dtype)

    return dict(positions=positions, offsets=offsets, x=rnd(tokens, hidden), gate_up=rnd(S, 2 * inter, std=3.0),
                gate_bias=rnd(experts, 2 * inter, std=0.5), y=rnd(S, hidden), down_bias=rnd(experts, hidden, std=0.5),
                weights=(torch.rand((tokens, k), generator=gen) + 0.05).to(device=device, dtype=dtype))


def check_all(d, activation="silu", limit=None, bias=True):
    assert_close_to_truth(compare(F.moe_gather, ref.moe_gather, dict(x=d["x"], positions=d["positions"]), ["x"],
                                  factor=2.0))
    gate = dict(gate_up=d["gate_up"], offsets=d["offsets"], bias=d["gate_bias"] if bias else None,
                activation=activation, limit=limit)
    assert_close_to_truth(compare(F.moe_expert_gate, ref.moe_expert_gate, gate,
                                  ["gate_up", "bias"] if bias else ["gate_up"], factor=2.0))
    comb = dict(x=d["y"], weights=d["weights"], positions=d["positions"], offsets=d["offsets"],
                bias=d["down_bias"] if bias else None)
    assert_close_to_truth(compare(F.moe_combine, ref.moe_combine, comb,
                                  ["x", "weights", "bias"] if bias else ["x", "weights"], factor=2.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("activation, limit", [("silu", None), ("gelu_tanh", None), ("gelu", None),
                                               ("clamped_swiglu", 2.0), ("silu", 2.0)])
def test_ops_match_the_float64_truth(device, dtype, activation, limit):
    # odd sizes; the last expert gets no rows (routing()); bf16 / fp16: no worse than HF's code at that dtype
    d = inputs(tokens=11, k=3, experts=5, hidden=37, inter=13, dtype=dtype, device=device)
    check_all(d, activation, limit)


@pytest.mark.parametrize("case", ["one_expert", "k1", "empty_experts", "no_bias"])
def test_routing_edge_cases(device, case):
    T, E = 9, 6
    if case == "one_expert":  # every row to expert 2 (k = 1): one segment, the other experts' bias gradients zero
        ids = torch.full((T, 1), 2)
    elif case == "k1":
        ids = torch.randint(0, E, (T, 1), generator=torch.Generator().manual_seed(3))
    else:  # experts 0, 1 and 5 with no rows (empty segments at the start and the end)
        ids = torch.randint(2, 5, (T, 2), generator=torch.Generator().manual_seed(4))
    d = inputs(T, ids.shape[1], E, 21, 7, torch.float32, device, ids=ids)
    check_all(d, bias=case != "no_bias")
    if case == "one_expert":
        db = torch.autograd.grad(F.moe_expert_gate(d["gate_up"], d["offsets"],
                                                   d["gate_bias"].requires_grad_()).sum(), d["gate_bias"])[0]
        assert torch.all(db[[0, 1, 3, 4, 5]] == 0) and torch.all(db[2] != 0)


def test_rows_past_the_last_offset_get_no_bias(device):
    # expert-parallel sentinel rows (sorted after every local expert's): no bias, no bias gradient
    d = inputs(7, 2, 4, 10, 5, torch.float32, device)
    offsets = d["offsets"].clamp(max=d["gate_up"].shape[0] - 3)  # the last 3 rows belong to no expert
    gate = dict(gate_up=d["gate_up"], offsets=offsets, bias=d["gate_bias"])
    assert_close_to_truth(compare(F.moe_expert_gate, ref.moe_expert_gate, gate, ["gate_up", "bias"], factor=2.0))
    plain = F.moe_expert_gate(d["gate_up"][-3:], offsets.new_zeros(4) + 0)  # no expert at all: no bias
    torch.testing.assert_close(F.moe_expert_gate(d["gate_up"], offsets, d["gate_bias"])[-3:], plain)
    comb = dict(x=d["y"], weights=d["weights"], positions=d["positions"], offsets=offsets, bias=d["down_bias"])
    assert_close_to_truth(compare(F.moe_combine, ref.moe_combine, comb, ["x", "weights", "bias"], factor=2.0))


def test_non_contiguous_inputs(device):
    d = inputs(8, 2, 4, 12, 6, torch.float32, device)
    x_t = d["x"].t().contiguous().t()  # column-major rows
    gu_wide = torch.zeros(16, 2 * 6 + 5, device=device)
    gu_wide[:, 3:15] = d["gate_up"]
    y_strided = torch.zeros(16, 24, device=device)
    y_strided[:, ::2] = d["y"]
    pos_t = d["positions"].t().contiguous().t()
    w_t = d["weights"].t().contiguous().t()
    bias_t = d["gate_bias"].t().contiguous().t()
    assert_close_to_truth(compare(F.moe_gather, ref.moe_gather, dict(x=x_t, positions=pos_t), ["x"], factor=2.0))
    gate = dict(gate_up=gu_wide[:, 3:15], offsets=d["offsets"], bias=bias_t)
    assert_close_to_truth(compare(F.moe_expert_gate, ref.moe_expert_gate, gate, ["gate_up", "bias"], factor=2.0))
    comb = dict(x=y_strided[:, ::2], weights=w_t, positions=pos_t, offsets=d["offsets"], bias=d["down_bias"])
    assert_close_to_truth(compare(F.moe_combine, ref.moe_combine, comb, ["x", "weights", "bias"], factor=2.0))


def test_several_tiles_and_column_blocks(device, monkeypatch):
    # tiles of 64 elements: several row and column blocks per launch, the combine backward's column loop, and
    # several row chunks per expert in the bias gradients' segment sums
    from tigon.kernels import elementwise, moe_glue

    monkeypatch.setattr(moe_glue, "TILE_ELEMS", {True: 64, False: 64})
    elementwise._launch_shape.cache_clear()
    d = inputs(13, 2, 3, 70, 40, torch.float32, device)
    check_all(d, "clamped_swiglu", 7.0)
    check_all(d, "silu")
    elementwise._launch_shape.cache_clear()


def test_combine_without_weight_gradient(device):
    # routing weights that need no gradient: the backward's tile kernel without the dot products
    d = inputs(10, 2, 4, 33, 5, torch.float32, device)
    y = d["y"].requires_grad_()
    out = F.moe_combine(y, d["weights"], d["positions"])
    want = ref.moe_combine(d["y"].detach().double(), d["weights"].double(), d["positions"])
    torch.testing.assert_close(out.double(), want, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(out)
    (dy,) = torch.autograd.grad(out, y, g)
    (want_dy,) = torch.autograd.grad(ref.moe_combine(y, d["weights"], d["positions"]), y, g)
    torch.testing.assert_close(dy, want_dy, rtol=1e-6, atol=1e-6)


def test_bad_input(device):
    d = inputs(4, 2, 3, 8, 3, torch.float32, device)
    x, pos, offs, gu, y, w = d["x"], d["positions"], d["offsets"], d["gate_up"], d["y"], d["weights"]
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        F.moe_gather(x, pos.float())
    with pytest.raises(ValueError, match="positions must have one row per token"):
        F.moe_gather(x[:3], pos)
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        F.moe_gather(pos, pos)
    with pytest.raises(ValueError, match="gate_up's last dimension must be even"):
        F.moe_expert_gate(gu[:, :5], offs)
    with pytest.raises(ValueError, match="bias must have shape"):
        F.moe_expert_gate(gu, offs, d["gate_bias"][:, :4])
    with pytest.raises(ValueError, match="activation must be one of"):
        F.moe_expert_gate(gu, offs, activation="relu")
    with pytest.raises(ValueError, match="needs a limit"):
        F.moe_expert_gate(gu, offs, activation="clamped_swiglu")
    with pytest.raises(ValueError, match="needs activation 'silu'"):
        F.moe_expert_gate(gu, offs, activation="gelu", limit=1.0)
    with pytest.raises(ValueError, match="limit must be"):
        F.moe_expert_gate(gu, offs, limit=-1.0)
    with pytest.raises(ValueError, match="offsets must have one entry per expert"):
        F.moe_expert_gate(gu, offs[:0])
    with pytest.raises(TypeError, match="offsets must be an integer tensor"):
        F.moe_expert_gate(gu, offs.float())
    with pytest.raises(ValueError, match="x must have T\\*k = 8 rows"):
        F.moe_combine(y[:7], w, pos)
    with pytest.raises(ValueError, match="weights must have positions' shape"):
        F.moe_combine(y, w[:, :1], pos)
    with pytest.raises(ValueError, match="bias needs offsets"):
        F.moe_combine(y, w, pos, bias=d["down_bias"])
    # the reference (the fallback) checks the routing on the host
    with pytest.raises(ValueError, match="positions must hold each sorted row"):
        ref.moe_gather(x, torch.zeros_like(pos))
    with pytest.raises(ValueError, match="offsets must be nonnegative and nondecreasing"):
        ref.moe_expert_gate(gu, offs.flip(0))


def test_bad_routing_raises_on_the_kernel_path_too(device):
    # the public ops check CPU positions / offsets before the kernels run (not only the reference); index dtypes other
    # than int32 / int64 are refused by name (uint8 positions were a boolean mask to the reference's indexing)
    d = inputs(4, 2, 3, 8, 3, torch.float32, device)
    x, pos, offs, gu, y, w = d["x"], d["positions"], d["offsets"], d["gate_up"], d["y"], d["weights"]
    for dtype in (torch.uint8, torch.int16):
        with pytest.raises(TypeError, match="positions must be an int32 or int64 tensor"):
            F.moe_gather(x, pos.to(dtype))
        with pytest.raises(TypeError, match="offsets must be an int32 or int64 tensor"):
            F.moe_expert_gate(gu, offs.to(dtype))
    torch.testing.assert_close(F.moe_gather(x, pos.int()), F.moe_gather(x, pos), rtol=0, atol=0)
    if device != "cpu":
        pytest.skip("CUDA routing is not read on the host (see the kernel-bounds test)")
    for bad in (pos.clamp_max(3), torch.where(pos == 7, 8, pos), torch.where(pos == 0, -1, pos)):
        with pytest.raises(ValueError, match="positions must hold each sorted row"):
            F.moe_gather(x, bad)
        with pytest.raises(ValueError, match="positions must hold each sorted row"):
            F.moe_combine(y, w, bad)
    for bad in (offs.flip(0), offs - 10):
        with pytest.raises(ValueError, match="offsets must be nonnegative and nondecreasing"):
            F.moe_expert_gate(gu, bad, d["gate_bias"])
        with pytest.raises(ValueError, match="offsets must be nonnegative and nondecreasing"):
            F.moe_combine(y, w, pos, bad, d["down_bias"])


def test_kernels_stay_in_bounds_with_unchecked_routing(device):
    # CUDA routing is not read on the host: a position outside [0, T*k) or an offset past the rows reads nothing
    # beyond the tensors. Rows past S of a larger buffer hold NaN: any read of them would show in the results
    from tigon.kernels import moe_glue as k
    from tigon.support import decide

    if decide(torch.device(device), torch.float32).backend not in ("triton", "interpreter"):
        pytest.skip("no kernel backend here")
    d = inputs(5, 2, 3, 8, 3, torch.float32, device)
    pos, offs, w = d["positions"], d["offsets"], d["weights"]
    S = pos.numel()
    big = torch.full((S + 4, 8), float("nan"), device=device)
    big[:S] = d["y"]
    src = big[:S]
    bad = torch.where(pos == 3, S + 1, torch.where(pos == 4, -1, pos))
    out = k.to_tokens(src, bad, w, d["down_bias"], offs)
    assert torch.isfinite(out).all()
    assert torch.isfinite(k.to_rows(d["x"], bad, w, src, d["down_bias"], offs)[1]).all()
    assert torch.isfinite(k.segment_sum(src, offs + 3, torch.float32)).all()
    assert torch.isfinite(k.segment_sum(src, offs - 20, torch.float32)).all()
