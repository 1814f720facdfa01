"""A patched model keeps its patch through ``copy.deepcopy`` and ``torch.save`` / ``torch.load``; ``save_pretrained``
keeps the plain state dict and ``from_pretrained`` gives the unpatched model (patch it again)."""

from __future__ import annotations

import copy
import gc
import io
import pickle

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon import support  # noqa: E402
from tigon.integrations import patched_state  # noqa: E402
from tigon.integrations.engine import release_unused  # noqa: E402
from tigon.integrations.marks import tigon_mark  # noqa: E402
from tigon.presets import build_config  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KINDS = {"rms_norm", "mlp", "rope", "fused_add_rms_norm", "lm_head_loss"}
OPS = {"rms_norm", "fused_add_rms_norm", "glu_linear", "rope", "fused_linear_cross_entropy"}


def _model():
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(build_config("tiny", num_hidden_layers=1)).to(DEVICE).train()


def _ids():
    return torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(1)).to(DEVICE)


def _patched_kinds(model) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for m in model.modules():
        for attr in ("forward", "_apply_gate"):
            mark = tigon_mark(m.__dict__.get(attr))
            if mark is not None:
                kinds[mark["kind"]] = kinds.get(mark["kind"], 0) + 1
    return kinds


def _step(model) -> tuple[float, dict]:
    """Loss of one forward + backward, and the Tigon ops it called."""
    support.backend_usage(reset=True)
    loss = model(input_ids=_ids(), labels=_ids()).loss
    loss.backward()
    return loss.item(), support.backend_usage(reset=True)


@pytest.fixture(autouse=True)
def _clean_state():
    yield
    gc.collect()
    assert release_unused() is not None and patched_state()["rope_dispatchers"] == {}


def _assert_still_patched(model, expected_kinds: dict, expected_loss: float) -> None:
    assert _patched_kinds(model) == expected_kinds
    loss, ops = _step(model)
    assert set(ops) == OPS, ops  # rope included: the rotary dispatcher serves the copy
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert {e.kind for e in tigon.unpatch(model).replaced} == KINDS
    assert _patched_kinds(model) == {}


def _patched_model():
    """A patched tiny model, its patched kinds, and the loss of one step of a copy (the reference for the copies)."""
    model = _model()
    tigon.patch(model)
    kinds = _patched_kinds(model)
    assert set(kinds) == KINDS
    loss, _ = _step(copy.deepcopy(model))
    return model, kinds, loss


def _unpatch_original(model) -> None:
    """Unpatch ``model``: with no patched model registered, the rotary global is transformers' function again."""
    gc.collect()  # the copy _patched_model stepped registered itself; it is garbage now
    tigon.unpatch(model)
    assert patched_state()["rope_dispatchers"] == {}


def test_deepcopy_keeps_the_patch_after_the_original_is_gone():
    model, kinds, loss = _patched_model()
    twin = copy.deepcopy(model)
    _unpatch_original(model)
    _assert_still_patched(twin, kinds, loss)  # the copy installs the rotary dispatcher again on its first forward


def _kernel_funcs(model) -> list:
    """The private rotary function objects transformers 5.2x's attention modules hold with ``kernels`` installed
    (``use_kernelized_func``; none without it)."""
    return [f for m in model.modules() for f in m.__dict__.get("_kernel_funcs", {}).values()]


def test_torch_save_and_load_keep_the_patch():
    model, kinds, loss = _patched_model()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)  # while the original is patched: the dispatcher is the global
    assert [type(f) for f in _kernel_funcs(loaded)] == [type(f) for f in _kernel_funcs(model)]  # (not Tigon's)
    twin = copy.deepcopy(model)
    assert [type(f) for f in _kernel_funcs(twin)] == [type(f) for f in _kernel_funcs(model)]
    del twin
    _unpatch_original(model)
    _assert_still_patched(loaded, kinds, loss)
    assert set(tigon.patch(loaded).counts) == KINDS  # unpatched for real: patching again replaces everything


class _Plain:
    def method(self):
        return 42


def test_other_bound_methods_pickle_as_before():
    again = pickle.loads(pickle.dumps(_Plain().method))
    assert again() == 42 and again.__func__ is _Plain.method


def test_save_pretrained_keeps_the_state_dict_and_from_pretrained_is_unpatched(tmp_path):
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tigon.patch(model)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    model.save_pretrained(tmp_path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert _patched_kinds(plain) == {}  # the patch is not saved: re-apply it after from_pretrained
    again = tigon.AutoModelForCausalLM.from_pretrained(tmp_path)
    assert set(_patched_kinds(again)) == KINDS and set(again.tigon_report.counts) == KINDS
    tigon.unpatch(model)
    tigon.unpatch(again)


def _replicate(root):
    """What ``torch.nn.parallel.replicate`` does for one replica (``nn.DataParallel``, which the HF Trainer uses with
    several GPUs and no distributed launch), without CUDA: each module's ``_replicate_for_data_parallel()`` (a shallow
    copy of its ``__dict__``) with the children replaced by their replicas and the parameters by copies of them."""
    replicas = {m: m._replicate_for_data_parallel() for m in root.modules()}
    for m, r in replicas.items():
        r._modules = {k: replicas[c] if c is not None else None for k, c in m._modules.items()}
        r._parameters = {k: torch.nn.Parameter(p.detach().clone(), p.requires_grad) if p is not None else None
                         for k, p in m._parameters.items()}
    return replicas[root]


@pytest.mark.parametrize("lora", [False, True])
def test_data_parallel_replicas_run_the_patch_on_their_own_parameters(lora):
    # an instance-level patch is a method bound to its module: DataParallel's replicas copy the module's __dict__,
    # so each replica ran Tigon's forward on the original module (its parameters, on the first GPU) and the
    # replica's own parameters got no gradient
    model = _model()
    if lora:
        peft = pytest.importorskip("peft")
        model = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "gate_proj", "down_proj"],
                                                           init_lora_weights=False))
    ids = _ids()
    ref = _replicate(model)
    want = ref(input_ids=ids, labels=ids).loss
    want.backward()
    tigon.patch(model)
    replica = _replicate(model)
    support.backend_usage(reset=True)
    got = replica(input_ids=ids, labels=ids).loss
    got.backward()
    assert OPS <= set(support.backend_usage()) | ({"glu_linear"} if lora else set())
    assert all(p.grad is None for p in model.parameters())
    grads = {n: p.grad for n, p in replica.named_parameters() if p.grad is not None}
    assert grads.keys() == {n for n, p in ref.named_parameters() if p.grad is not None}
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    for n, p in ref.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-6, msg=n)
    tigon.unpatch(model)
    assert not any("_replicate_for_data_parallel" in vars(m) for m in model.modules())


def test_replicas_rebind_every_method_bound_to_the_module():
    # TRL's switch (and accelerate's mixed-precision wrapper) bind a forward to the model instance: a replica must run
    # it on itself; the hook stays while such a method is left, and goes with the last one
    import types

    from tigon.integrations import persist

    lin = torch.nn.Linear(3, 2)
    lin.forward = types.MethodType(lambda self, x: x @ self.weight.T, lin)
    persist.keep_on_replicas(lin)
    replica = _replicate(lin)
    assert replica.forward.__self__ is replica and replica._replicate_for_data_parallel.__self__ is replica
    x = torch.randn(4, 3)
    replica(x).sum().backward()
    assert lin.weight.grad is None and replica.weight.grad is not None
    persist.forget_replicas(lin)
    assert "_replicate_for_data_parallel" in vars(lin)  # (the bound forward is still there)
    del lin.forward
    persist.forget_replicas(lin)
    assert "_replicate_for_data_parallel" not in vars(lin)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="nn.DataParallel replicates only over 2+ CUDA devices")
def test_data_parallel_on_two_gpus_matches_the_unpatched_model():
    # the real nn.DataParallel (the HF Trainer's wrapper with 2+ GPUs and no distributed launch): each replica's
    # batch half runs on its own device and parameters; loss and gradients equal the unpatched model's
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(2)).cuda()
    grads, losses = [], []
    for patched in (False, True):
        model = _model()
        if patched:
            tigon.patch(model)
        dp = torch.nn.DataParallel(model, device_ids=[0, 1])
        loss = dp(input_ids=ids, labels=ids).loss.mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        if patched:
            tigon.unpatch(model)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    assert grads[1].keys() == grads[0].keys()
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6, msg=n)
