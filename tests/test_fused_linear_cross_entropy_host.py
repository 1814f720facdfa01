"""The fused linear cross-entropy's host path (issue 28: host-bound small models): the backward's scaled casts in one
launch, the options' cache, and only the outputs asked for allocated. Numerics:
tests/test_fused_linear_cross_entropy.py."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tigon.kernels.fused_linear_cross_entropy as flce_kernels
import tigon.kernels.head_grads as head_grads
from tigon import functional as F
from tigon.ops import fused_linear_cross_entropy as flce_op


class _CountLaunches:
    """Wraps a Triton kernel: counts the launches, then runs it (with ``ops``' counting paused: the interpreter's
    own copies are not the launch's host ops on a GPU)."""

    def __init__(self, kernel, ops=None):
        self.kernel, self.calls, self.ops = kernel, 0, ops

    def __getitem__(self, grid):
        self.calls += 1

        def run(*args, **kwargs):
            if self.ops is not None:
                self.ops.on = False
            try:
                return self.kernel[grid](*args, **kwargs)
            finally:
                if self.ops is not None:
                    self.ops.on = True

        return run


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names, self.on = [], True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.on:
            self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scale_dtype", [None, torch.float32, torch.bfloat16])
def test_scaled_casts_three_pairs_in_one_launch_bitwise_torch(device, monkeypatch, scale_dtype):
    # fp32 -> bf16 (halfway values: ties to even), fp32 -> fp16, fp32 in place, odd sizes; the scale read on the
    # device as torch's mul of the fp32 product would use it
    counter = _CountLaunches(head_grads._scaled_casts_kernel)
    monkeypatch.setattr(head_grads, "_scaled_casts_kernel", counter)
    monkeypatch.setattr(head_grads, "CAST_BLOCK_INTERPRETED", 64)  # several programs per pair
    a, b, c = (torch.randn(n, device=device) for n in (389, 7 * 13, 130))
    a[:4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, -(1 + 3 * 2**-11)])
    scale = None if scale_dtype is None else torch.tensor(0.37, device=device).to(scale_dtype)
    s = 1.0 if scale is None else scale.float()
    want = ((a * s).to(torch.bfloat16), (b * s).to(torch.float16), c * s)
    da, db = torch.empty_like(a, dtype=torch.bfloat16), torch.empty(7, 13, device=device, dtype=torch.float16)
    head_grads.scaled_casts_([(da, a), (db, b.view(7, 13)), (c, c)], scale)
    assert counter.calls == (1 if head_grads._triton_casts(a.device) else 0)
    for got, w in zip((da, db.view(-1), c), want):
        assert got.dtype == w.dtype and torch.equal(got, w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_flce_backward_is_one_cast_launch(device, monkeypatch, dtype, bias):
    # mean loss, the gradients formed in the forward: the backward scales and casts grad_hidden, grad_weight (a
    # plain accumulator: one chunk) and grad_bias in one launch, with no ATen arithmetic, and gives what the
    # per-gradient torch ops gave (torch's scaled cast, as head_grads.finish_grad does it)
    ops = _Ops()
    counter = _CountLaunches(head_grads._scaled_casts_kernel, ops)
    monkeypatch.setattr(head_grads, "_scaled_casts_kernel", counter)
    torch.manual_seed(0)
    h = torch.randn(64, 16, device=device).to(dtype).requires_grad_()  # one chunk larger than 2VH + 2NH bytes
    w = (torch.randn(77, 16, device=device) / 4).to(dtype).requires_grad_()
    b = (torch.randn(77, device=device) / 4).to(dtype).requires_grad_() if bias else None
    t = torch.randint(0, 77, (64,), device=device)
    t[::5] = -100
    captured = {}
    real = head_grads.finish_grads

    def keep(grads, scale, dtypes):  # the accumulators and the upstream, before they are consumed (not counted)
        ops.on = False
        captured["want"] = [None if g is None else head_grads.finish_grad(g.clone(), scale.float(), dt, False)
                            for g, dt in zip(grads, dtypes)]
        ops.on = True
        return real(grads, scale, dtypes)

    monkeypatch.setattr(flce_kernels, "finish_grads", keep)
    loss = F.fused_linear_cross_entropy(h, w, t, b)
    upstream = torch.tensor(3.0, device=device)
    with ops:
        loss.backward(upstream)
    assert counter.calls == (1 if head_grads._triton_casts(h.device) else 0)
    assert set(ops.names) <= {"empty", "detach"}, ops.names  # the new gradients' tensors, autograd's detach
    for got, want in zip((h.grad, w.grad, b.grad if bias else None), captured["want"]):
        if want is not None:
            assert got.dtype == dtype and torch.equal(got, want)


def test_flce_outputs_only_what_is_asked(device):
    # no accuracy / predicted-token tensors are allocated unless asked for; the LossOutput fields follow the flags
    h = torch.randn(12, 16, device=device, requires_grad=True)
    w = torch.randn(33, 16, device=device, requires_grad=True)
    t = torch.randint(0, 33, (12,), device=device)
    loss = F.fused_linear_cross_entropy(h, w, t)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0
    out = F.fused_linear_cross_entropy(h, w, t, return_z_loss=True)
    assert out.z_loss is not None and out.accuracy is None and out.predicted_tokens is None
    out = F.fused_linear_cross_entropy(h, w, t, return_accuracy=True, return_predicted_tokens=True)
    assert out.z_loss is None and out.accuracy.dim() == 0 and out.predicted_tokens.shape == (12,)
    assert torch.equal(out.predicted_tokens, (h @ w.T).argmax(-1))
    out.loss.backward()
    assert h.grad is not None and w.grad is not None
    out = F.fused_linear_cross_entropy(h, w, t, reduction="none", return_predicted_tokens=True)
    assert out.accuracy is None and out.loss.shape == (12,) and out.predicted_tokens.shape == (12,)


def test_flce_cached_options_still_refuse_bad_values(device):
    # the options' checks run once per set of options, keyed by value and type: a value equal to a cached one but
    # of another type (True == 1 == 1.0) is checked afresh, and both names of one option still raise
    h = torch.randn(6, 8, device=device)
    w = torch.randn(11, 8, device=device)
    t = torch.randint(0, 11, (6,), device=device)
    cw = torch.ones(11, device=device)
    F.fused_linear_cross_entropy(h, w, t, logit_scale=1.0, use_token_scaling=False, chunk_mem_const=1)
    F.fused_linear_cross_entropy(h, w, t, class_weight=cw)
    assert len(flce_op._CALLS) >= 1
    with pytest.raises(ValueError, match="logit_scale"):
        F.fused_linear_cross_entropy(h, w, t, logit_scale=True)
    with pytest.raises(TypeError, match="use_token_scaling"):
        F.fused_linear_cross_entropy(h, w, t, use_token_scaling=0)
    with pytest.raises(ValueError, match="chunk_mem_const"):
        F.fused_linear_cross_entropy(h, w, t, chunk_mem_const=True)
    with pytest.raises(TypeError, match="ce_weight"):
        F.fused_linear_cross_entropy(h, w, t, class_weight=cw, ce_weight=cw)
    with pytest.raises(ValueError, match="memory"):
        F.fused_linear_cross_entropy(h, w, t, memory=[1])  # unhashable: checked, not cached
    with pytest.raises(ValueError, match="weight must have shape"):  # tensors are checked on every call
        F.fused_linear_cross_entropy(h, w[:, :4], t)
    # ce_weight (Liger's name) on a cached call is the class weight
    a = F.fused_linear_cross_entropy(h, w, t, ce_weight=cw * 2)
    b = F.fused_linear_cross_entropy(h, w, t, ce_weight=cw * 2)
    c = F.fused_linear_cross_entropy(h, w, t, class_weight=cw * 2)
    assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("order", ["forward", "reversed"])
@pytest.mark.parametrize("vh", [(7, 3), (389, 48), (4097, 30)])
@pytest.mark.parametrize("blocks", ["interpreter", "cuda"])
def test_row_halves_cast_in_one_launch(monkeypatch, order, vh, blocks):
    # RowHalves.finish on the Triton path: one copy of the first elements and ONE launch of the in-place kernel,
    # bitwise torch's scaled cast, in the accumulator's own memory. Programs run one after another here, so a
    # program that wrote over elements another still had to read shows in one of the two orders.
    from triton.runtime import interpreter

    if not head_grads._triton_casts(torch.device("cpu")):
        pytest.skip("the interpreter runs the kernel on CPU tensors")
    builder = interpreter.interpreter_builder
    if order == "reversed":
        real_idx = builder.set_grid_idx
        monkeypatch.setattr(builder, "set_grid_idx", lambda x, y, z: real_idx(builder.grid_dim[0] - 1 - x, y, z))
    if blocks == "cuda":  # CUDA's block of 2048, 4 programs
        monkeypatch.setattr(head_grads, "compiled_cuda", lambda device: True)
        monkeypatch.setattr(head_grads.RowHalves, "FIRST", 4 * head_grads.CAST_BLOCK)
    else:  # the interpreter's: 4 programs of 256
        monkeypatch.setattr(head_grads.RowHalves, "FIRST", 1024)
    counter = _CountLaunches(head_grads._halves_cast_kernel)
    monkeypatch.setattr(head_grads, "_halves_cast_kernel", counter)
    v, h = vh
    for dtype, scale in ((torch.bfloat16, torch.tensor(0.37)), (torch.float16, None)):
        acc = head_grads.RowHalves(v, h, torch.device("cpu"))
        acc.a.normal_()
        acc.b.normal_()
        whole, first = torch.cat((acc.a, acc.b)), acc.a.data_ptr()
        got = acc.finish(scale, dtype)
        want = (whole * scale if scale is not None else whole).to(dtype)
        assert got.shape == (v, h) and got.data_ptr() == first and torch.equal(got, want)
    assert counter.calls == 2
