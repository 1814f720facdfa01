"""DTensor inputs (tigon.ops._dtensor): row-wise ops run on local shards and agree with the whole-tensor op; an
AsyncCollectiveTensor (a collective's result not waited for, as torch's tensor-parallel styles return) is waited for
and differentiated through; other tensor subclasses are refused before any kernel sees them; meta / fake tensors
pass through with their shapes."""

import os

import pytest
import torch

from ranks import run_ranks
from tigon import functional as F

WORKER = os.path.join(os.path.dirname(__file__), "dtensor_worker.py")


def _run_ranks(world: int, device: str) -> None:
    outs = run_ranks(WORKER, world, env={"TIGON_TEST_DEVICE": device})
    for rank, out in enumerate(outs):
        assert "OK" in out, f"rank {rank}:\n{out[-4000:]}"


def test_dtensor_row_wise_ops_two_cpu_ranks():
    _run_ranks(2, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dtensor_row_wise_ops_on_cuda():
    # The original report: a DTensor's pointer reached the kernel (illegal memory access, a dead CUDA context).
    _run_ranks(1, "cuda")
    x = torch.randn(4, 8, device="cuda")
    assert torch.isfinite(F.rms_norm(x, torch.ones(8, device="cuda"))).all()  # this process's context is fine


class _Wrapper(torch.Tensor):
    """A wrapper subclass whose memory is not its data (like DTensor, Float8 or NestedTensor)."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda a: a.inner if isinstance(a, _Wrapper) else a  # noqa: E731
        return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})


@pytest.mark.parametrize("op", ["rms_norm", "swiglu", "cross_entropy"])
def test_unknown_tensor_subclass_is_refused(op):
    x = _Wrapper(torch.randn(4, 8))
    call = {"rms_norm": lambda: F.rms_norm(x, torch.ones(8)),
            "swiglu": lambda: F.swiglu(x, torch.randn(4, 8)),
            "cross_entropy": lambda: F.cross_entropy(x, torch.zeros(4, dtype=torch.long))}[op]
    with pytest.raises(TypeError, match="(x|gate|logits) is a .*_Wrapper.*tensor subclass"):
        call()


def test_meta_and_fake_tensors_carry_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, w = torch.randn(3, 5, 8), torch.ones(8)
        assert F.rms_norm(x, w).shape == (3, 5, 8)
        loss = F.cross_entropy(torch.randn(6, 11), torch.zeros(6, dtype=torch.long))
        assert loss.shape == ()
    x = torch.randn(3, 5, 8, device="meta", requires_grad=True)
    y = F.rms_norm(x, torch.ones(8, device="meta"))
    assert y.device.type == "meta" and y.shape == x.shape
    loss = F.fused_linear_cross_entropy(torch.randn(6, 8, device="meta"), torch.randn(11, 8, device="meta"),
                                        torch.zeros(6, dtype=torch.long, device="meta"))
    assert loss.shape == () and loss.device.type == "meta"


def test_patched_model_trains_on_the_meta_device():
    # Item 6 of issue 17: the fused loss asked autocast about the meta device and crashed.
    import tigon
    from transformers import AutoModelForCausalLM

    from tigon.presets import build_config

    cfg = build_config("llama3-8b", 1)
    cfg.update(dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, vocab_size=256))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    tigon.patch(model)
    model.train()
    ids = torch.randint(0, 256, (2, 8), device="meta")
    out = model(input_ids=ids, labels=ids)
    assert out.loss.shape == () and out.loss.device.type == "meta"
    out.loss.backward()
    assert model.model.norm.weight.grad.shape == (64,)
