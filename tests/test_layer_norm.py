import pytest
import torch
import torch.nn.functional as TF

from tigon import functional as F
from tigon import support
from tigon.numerics import assert_close_to_truth, compare
from tigon.reference.layer_norm import layer_norm as ref_layer_norm

# bf16/fp16: torch's layer_norm also computes in fp32 and rounds once to the output dtype, as Tigon does, so
# both errors are the same final rounding (and the shared rounding of the upstream gradient); factor 1.1
# absorbs the sampling noise of a relative-L2 estimate over a few thousand elements.
FACTOR = {torch.float32: 1.0, torch.bfloat16: 1.1, torch.float16: 1.1}
AFFINE = {"weight+bias": (True, True), "weight": (True, False), "bias": (False, True), "none": (False, False)}


def torch_layer_norm(x, weight, bias, eps=1e-5):
    """The original: what nn.LayerNorm calls."""
    return TF.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def make(shape, dtype, device, affine="weight+bias", param_dtype=None):
    hidden = shape[-1]
    x = torch.randn(shape, device=device, dtype=dtype) * 3 + 1.5
    has_w, has_b = AFFINE[affine]
    pd = param_dtype or dtype
    w = torch.rand(hidden, device=device, dtype=pd) + 0.5 if has_w else None
    b = torch.randn(hidden, device=device, dtype=pd) if has_b else None
    grads = ["x"] + (["weight"] if has_w else []) + (["bias"] if has_b else [])
    return dict(x=x, weight=w, bias=b, eps=1e-5), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("affine", list(AFFINE))
@pytest.mark.parametrize("shape", [(4, 7, 96), (33, 300)])
def test_layer_norm_matches_float64(device, dtype, affine, shape):
    inputs, grads = make(shape, dtype, device, affine)
    checks = compare(F.layer_norm, torch_layer_norm, inputs, grads, factor=FACTOR[dtype])
    assert {c.tensor for c in checks} == {"out"} | {f"grad_{g}" for g in grads}
    assert_close_to_truth(checks)


def test_layer_norm_fp16_hidden_1000(device):
    inputs, grads = make((9, 1000), torch.float16, device)
    assert_close_to_truth(compare(F.layer_norm, torch_layer_norm, inputs, grads, factor=FACTOR[torch.float16]))


def test_layer_norm_many_programs_in_weight_grad(device, monkeypatch):
    # Small row blocks make the persistent backward use several programs (the last one partial), so the
    # per-program dW/dB partials and their second reduction are exercised under the interpreter too.
    from tigon.kernels import norm as ln_op

    monkeypatch.setattr(ln_op, "rows_per_program", lambda n, dev, target_elems=0: 4)
    monkeypatch.setattr(ln_op, "num_programs_hint", lambda dev: 3)
    inputs, grads = make((3, 10, 96), torch.float32, device)
    assert_close_to_truth(compare(F.layer_norm, torch_layer_norm, inputs, grads))


def test_layer_norm_reference_matches_torch(device):
    inputs, _ = make((5, 7, 300), torch.float32, device)
    torch.testing.assert_close(ref_layer_norm(**inputs), torch_layer_norm(**inputs), rtol=0, atol=0)


def test_layer_norm_fp32_params_bf16_input(device):
    inputs, grads = make((4, 7, 96), torch.bfloat16, device, param_dtype=torch.float32)
    out = F.layer_norm(**inputs)
    assert out.dtype == torch.bfloat16
    with support.force_reference():
        assert F.layer_norm(**inputs).dtype == torch.bfloat16
    x = inputs["x"]
    w = inputs["weight"].clone().requires_grad_()
    F.layer_norm(x, w, inputs["bias"]).float().sum().backward()
    assert w.grad.dtype == torch.float32
    # torch refuses this mix on CUDA (CPU accepts it), so the reference (fp32 math, one rounding) is the original.
    assert_close_to_truth(compare(F.layer_norm, ref_layer_norm, inputs, grads, factor=FACTOR[torch.bfloat16]))


def test_layer_norm_non_contiguous_and_not_mutated(device):
    def strided(x, weight, bias, eps=1e-5):
        xs = TF.pad(x, (0, 5))[..., : x.shape[-1]]  # rows with stride hidden + 5, read in place
        assert not xs.is_contiguous()
        return F.layer_norm(xs, weight, bias, eps)

    inputs, grads = make((6, 5, 130), torch.float32, device)
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    assert_close_to_truth(compare(strided, torch_layer_norm, inputs, grads))
    x_t = inputs["x"].transpose(0, 1)  # not viewable as rows: copied once, still correct
    assert_close_to_truth(compare(F.layer_norm, torch_layer_norm, dict(inputs, x=x_t), grads))
    for k, v in before.items():
        assert torch.equal(inputs[k], v)


def test_layer_norm_runs_a_kernel(device):
    support.backend_usage(reset=True)
    F.layer_norm(torch.randn(3, 8, device=device), torch.ones(8, device=device), None)
    assert set(support.backend_usage()["layer_norm"]) == {"triton" if device == "cuda" else "interpreter"}


def test_layer_norm_bad_input():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"weight must have shape \(8,\)"):
        F.layer_norm(x, torch.ones(7), None)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        F.layer_norm(x, None, torch.ones(9))
    with pytest.raises(ValueError, match="bias must have 1 dimension,"):
        F.layer_norm(x, None, torch.ones(1, 8))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        F.layer_norm(x.long(), None, None)
    with pytest.raises(TypeError, match="weight must be a floating-point"):
        F.layer_norm(x, torch.ones(8, dtype=torch.long), None)
    with pytest.raises(ValueError, match="x must have a non-empty last dimension"):
        F.layer_norm(torch.randn(2, 0), None, None)


@pytest.mark.parametrize("wide", ["registers", "chunked"])
@pytest.mark.parametrize("affine", ["weight+bias", "none"])
def test_layer_norm_wide_row_kernel(device, monkeypatch, affine, wide):
    # Rows wider than WIDE_ROW (16384+ on the GPU) drop the prefetch, those wider than REGISTER_ROW take the
    # column-chunked backward; force both on a small row.
    from tigon.kernels import norm as ln_op

    monkeypatch.setattr(ln_op, "WIDE_ROW", 64)  # whole rows without the prefetch
    monkeypatch.setattr(ln_op, "REGISTER_ROW", 64 if wide == "chunked" else 1 << 20)
    inputs, grads = make((5, 6, 300), torch.float32, device, affine)
    assert_close_to_truth(compare(F.layer_norm, torch_layer_norm, inputs, grads))


def test_layer_norm_bias_grad_only_over_many_partials(device, monkeypatch):
    # 200 backward programs: their dW/dB partial rows are summed by _sum_partials in more than one step of its row
    # loop (128 rows a step); a frozen weight leaves only dB to sum.
    from tigon.kernels import norm as ln_op

    base = ln_op.bwd_config
    monkeypatch.setattr(ln_op, "bwd_config",
                        lambda M, block_n, dev, is_rms: (1, 200) + base(M, block_n, dev, is_rms)[2:])
    inputs, _ = make((400, 40), torch.float32, device)
    assert_close_to_truth(compare(F.layer_norm, torch_layer_norm, inputs, ["x", "bias"]))


@pytest.mark.parametrize("affine", ["weight+bias", "bias"])
def test_layer_norm_bias_grad_by_columns(device, monkeypatch, affine):
    # Whole-row backward without the kernel's dB partials: dB is a column sum of dy (rows of 16384+ on the GPU).
    from tigon.kernels import norm as ln_op

    base = ln_op.bwd_config
    monkeypatch.setattr(ln_op, "WIDE_ROW", 64)
    monkeypatch.setattr(ln_op, "bwd_config",
                        lambda M, block_n, dev, is_rms: base(M, block_n, dev, is_rms)[:3] + (True,))
    inputs, grads = make((5, 6, 300), torch.float32, device, affine)
    assert_close_to_truth(compare(F.layer_norm, torch_layer_norm, inputs, grads))
