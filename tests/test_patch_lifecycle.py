"""What users do to a model after ``tigon.patch(model)``, against the same on the unpatched model: mode changes of a
model loaded with ``from_pretrained`` (transformers' hub-kernels integration re-kernelizes it at each one)."""

from __future__ import annotations

import gc
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon import support  # noqa: E402
from tigon.integrations import hub_kernels, patched_state  # noqa: E402
from tigon.integrations.engine import release_unused  # noqa: E402
from tigon.integrations.marks import tigon_mark  # noqa: E402

from _tiny_llama import B, T, V, build  # noqa: E402


def _kinds(model) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for m in model.modules():
        mark = tigon_mark(m.__dict__.get("forward"))
        if mark is not None:
            kinds[mark["kind"]] = kinds.get(mark["kind"], 0) + 1
    return kinds


@pytest.fixture(autouse=True)
def _clean_state():
    yield
    gc.collect()
    assert release_unused() is not None and patched_state()["rope_dispatchers"] == {}
    assert hub_kernels.GUARDS == {}


def test_train_and_eval_after_from_pretrained_keep_the_patch(tmp_path):
    """With ``kernels`` installed, ``from_pretrained`` turns ``use_kernels`` on and ``model.train()`` / ``.eval()``
    kernelize again, which deleted the instance forwards of the hub-kernel layers (the RMSNorms): the patch went
    without a word. Tigon's forwards stay now, and the class's own ``kernel_condition`` is back after unpatch."""
    pytest.importorskip("kernels")
    build("llama").save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    assert model.use_kernels  # the default that re-kernelizes at every mode change
    norm_cls = type(model.model.norm)
    own = norm_cls.__dict__["kernel_condition"]
    tigon.patch(model)
    patched = _kinds(model)
    assert patched["rms_norm"] == 5
    ids = torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    for mode in (True, False, True):
        model.train(mode)
        assert _kinds(model) == patched, mode
    support.backend_usage(reset=True)
    model(input_ids=ids, labels=ids).loss.backward()
    assert "rms_norm" in support.backend_usage(reset=True)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").train()
    assert _kinds(plain) == {}  # an unpatched model of the class is kernelized as before
    tigon.unpatch(model)
    assert norm_cls.__dict__["kernel_condition"] is own


def test_torch_load_of_a_patched_model_keeps_the_patch_through_train(tmp_path):
    """A patched model unpickled (``torch.load``) registers its hub-kernel layers: it keeps its norms through
    ``train()`` after the model it was saved from is unpatched."""
    pytest.importorskip("kernels")
    build("llama").save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    tigon.patch(model)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    tigon.unpatch(model)
    loaded.train()
    assert _kinds(loaded)["rms_norm"] == 5
    tigon.unpatch(loaded)
    assert hub_kernels.release() == [] and hub_kernels.GUARDS == {}


def test_a_hub_kernel_forward_is_skipped_with_the_way_out(tmp_path):
    """A layer kernelized with a hub kernel before patching (``from_pretrained`` on a GPU with the Hub reachable:
    Liger's RMSNorm) is left alone, the reason naming the kernel and the way to Tigon's forward; ``reset_kernels()``
    then ``tigon.patch`` replaces it. (The hub layer is simulated as ``kernels.kernelize`` installs one.)"""
    pytest.importorskip("kernels")
    build("llama").save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    norm = model.model.norm
    norm.forward = types.MethodType(lambda self, x: x, norm)  # what kernels' _replace_forward sets, with the repo
    norm.__dict__["_kernel_repo"] = "kernels-community/liger_kernels"
    skipped = {e.target: e.detail for e in tigon.patch(model).skipped}
    assert "kernels-community/liger_kernels" in skipped["model.norm"] and "reset_kernels()" in skipped["model.norm"]
    tigon.unpatch(model)
    model.reset_kernels()
    assert "model.norm" in {e.target for e in tigon.patch(model).replaced}
    tigon.unpatch(model)
