"""A patched gated MLP and hooks on its children: a hooked down projection is called on the product instead of folded
in, an instance-level forward runs, a hooked activation module makes the MLP run its own forward."""

from __future__ import annotations

import pytest
import torch

from _tiny_llama import _clean_state, assert_same_training_step, batch, build  # noqa: F401 (the autouse fixture)
from tigon import support


@pytest.mark.parametrize("hook", ["forward", "full_backward", "none"])
def test_mlp_folds_down_proj_only_when_nothing_would_be_skipped(hook):
    # A plain nn.Linear down_proj runs inside tigon.functional.glu_linear; with a hook on it (FSDP2 sharding the
    # layer, user hooks) the module is called on the product so that the hook still fires; the step matches either way.
    model = build()
    calls = []
    down = model.model.layers[0].mlp.down_proj
    if hook == "forward":
        down.register_forward_hook(lambda m, i, o: calls.append("f"))
    elif hook == "full_backward":
        down.register_full_backward_hook(lambda m, gi, go: calls.append("b"))
    ids, labels = batch()
    support.backend_usage(reset=True)
    report = assert_same_training_step(model, input_ids=ids, labels=labels)
    detail = {e.target: e.detail for e in report.replaced}
    assert "down_proj is folded in" in detail["model.layers.1.mlp"]
    used = support.backend_usage()
    if hook == "none":
        assert "glu_linear" in used and "swiglu" not in used and not calls
        assert "down_proj is folded in" in detail["model.layers.0.mlp"]
    else:
        assert "glu_linear" in used and "swiglu" in used  # layer 1 folds, layer 0 calls its hooked down_proj
        assert "down_proj is called on the product (it has hooks)" in detail["model.layers.0.mlp"]
        assert calls == (["f", "f"] if hook == "forward" else ["b", "b"])  # the reference step and the patched one


def test_mlp_respects_instance_forward_and_projection_hooks():
    # accelerate's offloading replaces down_proj.forward on the instance: not folded (the wrapper runs). A forward
    # hook that keeps gate_proj's output must see the output, not the gradient the in-place backward would write.
    model = build()
    mlp0, mlp1 = model.model.layers[0].mlp, model.model.layers[1].mlp
    seen = []
    original_forward = mlp0.down_proj.forward
    mlp0.down_proj.forward = lambda x: seen.append("down") or original_forward(x)
    kept = []
    mlp1.gate_proj.register_forward_hook(lambda m, i, o: kept.append((o, o.detach().clone())))
    ids, labels = batch()
    report = assert_same_training_step(model, input_ids=ids, labels=labels)
    detail = {e.target: e.detail for e in report.replaced}
    assert "its forward is replaced on the instance" in detail["model.layers.0.mlp"]
    assert seen == ["down", "down"]  # the reference step and the patched one
    for out, snapshot in kept:
        torch.testing.assert_close(out, snapshot, rtol=0, atol=0)


def test_a_hook_on_the_mlp_activation_runs():
    # The fused MLP computes act_fn(gate) inside its kernel and never calls the module, so a hook on act_fn (activation
    # statistics, steering) was skipped silently; that MLP now runs its own forward (the step matches the original's
    # with the hook, which fires in both).
    model = build()
    seen = []
    model.model.layers[0].mlp.act_fn.register_forward_hook(lambda m, i, o: (seen.append(1), o * 1.5)[1])
    ids, labels = batch()
    support.backend_usage(reset=True)
    assert_same_training_step(model, input_ids=ids, labels=labels)
    assert seen == [1, 1]  # the reference step and the patched one
    assert "glu_linear" in support.backend_usage()  # layer 1 (no hook) still runs fused
