"""Gated RMSNorm (tigon.functional.rms_norm_gated) against transformers' Qwen3NextRMSNormGated ("llama" casting) and
FalconH1RMSNormGated ("gemma"): output and every gradient (x, gate, weight) in fp32 and bf16, error no worse than
HF's own against float64; odd width, non-contiguous x and gate, bad input. Grouped statistics (``group_size``): 1, 2,
4 groups of odd sizes against FalconH1RMSNormGated with ``n_groups`` in both gate orders (``norm_before_gate``),
Mamba2RMSNormGated (gate first, "llama") and the reference ("llama"), the grouped backward's raised row tiles and
several programs' dW partials, group counts that run the reference."""

import pytest
import torch

from tigon import functional as F
from tigon import support
from tigon.numerics import assert_close_to_truth, compare


def hf_norm(module: str, cls: str, weight: torch.Tensor, **kwargs):
    """``original(x, gate, weight, ...)`` running the HF module (built with ``kwargs``) with ``weight`` as its
    parameter (a float64 copy for the truth), so compare() gets HF's gradient of the weight too."""
    mod = pytest.importorskip(f"transformers.models.{module}.modeling_{module}")
    norm = getattr(mod, cls)(weight.shape[0], eps=1e-6, **kwargs)

    def original(x, gate, weight, eps, offset, casting_mode, group_size=None, norm_before_gate=True):
        norm.weight = weight if isinstance(weight, torch.nn.Parameter) else None
        if norm.weight is None:  # a plain tensor (requires grad): keep its graph
            del norm.weight
            norm.weight = weight
        return norm(x, gate)

    return original


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("module, cls, mode", [("qwen3_next", "Qwen3NextRMSNormGated", "llama"),
                                               ("falcon_h1", "FalconH1RMSNormGated", "gemma")],
                         ids=["qwen3_next", "falcon_h1"])
def test_rms_norm_gated_matches_hf(device, dtype, module, cls, mode):
    x = (torch.randn(5, 3, 41, device=device) * 3 + 0.5).to(dtype).transpose(0, 1)  # (3, 5, 41), non-contiguous
    gate = (torch.randn(3, 5, 41, device=device) * 2).to(dtype)
    weight = (torch.rand(41, device=device) + 0.5).to(dtype)
    inputs = dict(x=x, gate=gate, weight=weight, eps=1e-6, offset=0.0, casting_mode=mode)
    # verify's rule (factor 2): the weight gradient's error over 15 rows of 41 is a noisy estimate (on 256 x 64 rows
    # Tigon's bf16 errors are 0.6-0.8x HF's for every tensor, dW included)
    checks = compare(F.rms_norm_gated, hf_norm(module, cls, weight), inputs, ["x", "gate", "weight"],
                     factor=1.0 if dtype == torch.float32 else 2.0)
    assert {c.tensor for c in checks} == {"out", "grad_x", "grad_gate", "grad_weight"}
    assert_close_to_truth(checks)


def test_rms_norm_gated_empty_last_dimension_raises_on_every_path():
    with pytest.raises(ValueError, match="x must have a non-empty last"):
        F.rms_norm_gated(torch.randn(2, 0), torch.randn(2, 0), torch.ones(0))
    with support.force_reference(), pytest.raises(ValueError, match="x must have a non-empty last"):
        F.rms_norm_gated(torch.randn(2, 0), torch.randn(2, 0), torch.ones(0))


def test_rms_norm_gated_bad_input(device):
    x, w = torch.randn(4, 8, device=device), torch.ones(8, device=device)
    with pytest.raises(ValueError, match="gate must have x's shape"):
        F.rms_norm_gated(x, torch.randn(4, 7, device=device), w)
    with pytest.raises(TypeError, match="gate"):
        F.rms_norm_gated(x, torch.ones(4, 8, dtype=torch.int32, device=device), w)
    with pytest.raises(ValueError, match="weight's size"):
        F.rms_norm_gated(x, x, torch.ones(7, device=device))
    with pytest.raises(ValueError, match="casting_mode"):
        F.rms_norm_gated(x, x, w, casting_mode="fp8")


def gated_inputs(device, dtype, tokens: int, n: int, mode: str, group_size: int, norm_before_gate=True) -> dict:
    """x (3, tokens, n) non-contiguous (a transpose), gate a column slice (rows of stride 2n), weight (n,)."""
    x = (torch.randn(tokens, 3, n, device=device) * 3 + 0.5).to(dtype).transpose(0, 1)
    gate = (torch.randn(3, tokens, 2 * n, device=device) * 2).to(dtype)[..., n:]
    weight = (torch.rand(n, device=device) + 0.5).to(dtype)
    return dict(x=x, gate=gate, weight=weight, eps=1e-6, offset=0.0, casting_mode=mode, group_size=group_size,
                norm_before_gate=norm_before_gate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_groups, group_size", [(1, 13), (2, 9), (4, 7)])
@pytest.mark.parametrize("norm_before_gate", [True, False], ids=["norm_first", "gate_first"])
def test_rms_norm_gated_groups_match_falcon_h1(device, dtype, n_groups, group_size, norm_before_gate):
    """FalconH1RMSNormGated(n_groups=G, norm_before_gate) ("gemma" casting): the statistics of each group of
    ``group_size`` channels, of x or of ``x * silu(gate)``; strided x and gate."""
    n = n_groups * group_size
    inputs = gated_inputs(device, dtype, 5, n, "gemma", group_size, norm_before_gate)
    original = hf_norm("falcon_h1", "FalconH1RMSNormGated", inputs["weight"], n_groups=n_groups,
                       norm_before_gate=norm_before_gate)
    # factor 2 in bf16: verify's rule, the weight gradient over 15 rows being a noisy estimate (as above)
    checks = compare(F.rms_norm_gated, original, inputs, ["x", "gate", "weight"],
                     factor=1.0 if dtype == torch.float32 else 2.0)
    assert {c.tensor for c in checks} == {"out", "grad_x", "grad_gate", "grad_weight"}
    assert_close_to_truth(checks)


_CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason=(
    "CI time on CPU (~3.5 s a case): the CPU keeps both dtypes and both gate orders, at 2 groups of 7"))


@pytest.mark.parametrize("dtype, n_groups, group_size, norm_before_gate", [
    (torch.float32, 2, 7, True), pytest.param(torch.bfloat16, 4, 5, True, marks=_CUDA_ONLY),
    pytest.param(torch.float32, 4, 5, False, marks=_CUDA_ONLY),
    (torch.bfloat16, 2, 7, False)])  # a few of the product: interpreted, the one-row tiles cost ~3 s a case on CPU
def test_rms_norm_gated_groups_llama_several_programs(device, dtype, n_groups, group_size, norm_before_gate,
                                                      monkeypatch):
    """"llama" casting (the reference as the original); 3 x 43 tokens, so the backward runs several programs whose
    dW partials hold whole tiles of groups, and with the backward's row tiles cut to one row (rows_per_program), the
    raise of BLOCK_M to n_groups that keeps a tile's rows on fixed groups."""
    from tigon.kernels import norm
    from tigon.reference import rms_norm as ref

    n = n_groups * group_size
    inputs = gated_inputs(device, dtype, 43, n, "llama", group_size, norm_before_gate)
    for one_row in (False, True):
        if one_row:
            monkeypatch.setattr(norm, "rows_per_program", lambda *a, **k: 1)
        checks = compare(F.rms_norm_gated, ref.rms_norm_gated, inputs, ["x", "gate", "weight"])
        assert_close_to_truth(checks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_groups, group_size", [(1, 11), (4, 5)])
def test_rms_norm_gated_gate_first_matches_mamba2(device, dtype, n_groups, group_size):
    """Mamba2RMSNormGated (Bamba's, NemotronH's, Zamba2's, GraniteMoeHybrid's copies): ``rmsnorm(x * silu(gate))``
    per group, ``w * xhat.to(dtype)``, i.e. group_size, norm_before_gate=False, "llama" casting."""
    n = n_groups * group_size
    inputs = gated_inputs(device, dtype, 5, n, "llama", group_size, norm_before_gate=False)
    original = hf_norm("mamba2", "Mamba2RMSNormGated", inputs["weight"], group_size=group_size)
    # factor 2 in bf16: verify's rule, the weight gradient over 15 rows being a noisy estimate (as above)
    checks = compare(F.rms_norm_gated, original, inputs, ["x", "gate", "weight"],
                     factor=1.0 if dtype == torch.float32 else 2.0)
    assert_close_to_truth(checks)


def test_rms_norm_gated_groups_not_a_power_of_two(device):
    """3 groups (not a power of two: the grouped backward's tiles cannot hold whole rows of them): the reference
    runs, with the same values as the kernels' float64 truth."""
    from tigon.reference import rms_norm as ref

    inputs = gated_inputs(device, torch.float32, 4, 15, "gemma", 5, norm_before_gate=False)
    checks = compare(F.rms_norm_gated, ref.rms_norm_gated, inputs, ["x", "gate", "weight"])
    assert_close_to_truth(checks)


def test_rms_norm_gated_group_size_bad_input(device):
    x, w = torch.randn(4, 12, device=device), torch.ones(12, device=device)
    for bad in (5, 0, -3, 24):
        with pytest.raises(ValueError, match="group_size must be a positive divisor of x's last dimension"):
            F.rms_norm_gated(x, x, w, group_size=bad)
    for bad in (4.0, True, "4"):
        with pytest.raises(TypeError, match="group_size must be an int"):
            F.rms_norm_gated(x, x, w, group_size=bad)
    with pytest.raises(TypeError, match="norm_before_gate must be a bool"):
        F.rms_norm_gated(x, x, w, norm_before_gate=0)
    y = F.rms_norm_gated(x, x, w, group_size=12)  # one group: the ungrouped op
    assert torch.equal(y, F.rms_norm_gated(x, x, w))
