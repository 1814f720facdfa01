import pytest
import torch

from tigon import functional as F
from tigon import nn as TN
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.relu_squared import relu_squared as ref_relu_squared

# bf16/fp16: the kernel and torch's square(relu(x)) both round once (relu is exact), to the same value but for the
# last ulp of the fp32 product; 1.1 absorbs the sampling noise of a relative-L2 estimate over a few thousand elements.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(4, 7, 96), (33, 301), (1,)])
def test_relu_squared_matches_float64(device, dtype, shape):
    x = torch.randn(shape, device=device, dtype=dtype) * 3
    checks = compare(F.relu_squared, ref_relu_squared, dict(x=x), ["x"], factor=FACTOR[dtype])
    assert {c.tensor for c in checks} == {"out", "grad_x"}
    assert_close_to_truth(checks)
    if dtype == torch.float32:
        assert all(c.tigon_err <= 1e-6 for c in checks)  # one fp32 rounding per element


def test_relu_squared_non_contiguous_and_not_mutated(device):
    base = torch.randn(16, 6, 130, device=device)
    for x in (base.transpose(0, 1), base[..., 3:-2], base[:, ::2]):  # strided rows; sliced columns
        before = x.clone()
        assert_close_to_truth(compare(F.relu_squared, ref_relu_squared, dict(x=x), ["x"]))
        assert torch.equal(x, before)


def test_relu_squared_small_tiles_and_zero_boundary(device, monkeypatch):
    # Several column blocks per row and stacked rows (the interpreter's default tile holds these whole); x = 0 and
    # negative zero give y = 0 and gradient 0, as torch's relu.
    from tigon.kernels import elementwise

    monkeypatch.setattr(elementwise, "tile_elems", lambda dev: 128)
    for shape in [(9, 300), (2, 5, 40)]:
        x = torch.randn(shape, device=device)
        x.view(-1)[:7] = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 2.5, -2.5, 1e18])
        assert_close_to_truth(compare(F.relu_squared, ref_relu_squared, dict(x=x), ["x"]))
        assert_close_to_truth(compare(lambda x: F.relu_squared(x[..., 1:-3]),
                                      lambda x: ref_relu_squared(x[..., 1:-3]), dict(x=x), ["x"]))


def test_relu_squared_empty_and_module(device):
    x = torch.randn(0, 5, device=device, requires_grad=True)
    F.relu_squared(x).sum().backward()
    assert x.grad.shape == (0, 5)
    m = TN.ReLUSquared()
    assert list(m.parameters()) == []
    x = torch.randn(3, 17, device=device, dtype=torch.bfloat16)
    torch.testing.assert_close(m(x), ref_relu_squared(x), rtol=0, atol=0)


def test_relu_squared_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.relu_squared(torch.randn(3, 8, device=device))
    assert set(support.backend_usage()["relu_squared"]) == {"triton" if device == "cuda" else "interpreter"}


def test_relu_squared_bad_input():
    with pytest.raises(TypeError, match="x must be a floating-point"):
        F.relu_squared(torch.ones(2, 8, dtype=torch.long))
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        F.relu_squared([1.0, 2.0])


def test_relu_squared_double_backward_raises(device):
    x = torch.randn(4, 8, device=device, requires_grad=True)
    (dx,) = torch.autograd.grad(F.relu_squared(x).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(dx.sum(), x)
