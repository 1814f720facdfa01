"""A patched model under Hugging Face's gradient checkpointing, in both of its modes, trains like the original.

Activation checkpointing runs each decoder layer's forward twice (once without saving, once during the backward) and,
in PyTorch's non-reentrant mode, through saved-tensor hooks; the reentrant mode re-runs the forward inside an
autograd Function's backward. Tigon's ops that save less (in-place backward of the MLP, gradients formed in the
forward of the fused loss, the fused decoder layer's add + norm) must give the same losses, gradients and
parameters in both modes as the unpatched model in the same mode (issue 26: checkpointing as a first-class case).
"""

from __future__ import annotations

import gc

import pytest
import torch

import tigon
from model_matrix import CASES, DEVICE, DTYPE, assert_report_runs, build
from tigon import data, support
from tigon.integrations.engine import release_unused
from tigon.numerics import rel_l2

STEPS = 2 if DEVICE == "cpu" else 5
B, T = 2, 12
RTOL = 1e-4 if DTYPE == torch.float32 else 2e-2


@pytest.fixture(autouse=True)
def _release_rope_dispatchers():
    yield
    gc.collect()
    release_unused()


def checkpointed(model, reentrant: bool):
    """``model`` with HF's gradient checkpointing on, in the given mode (newer transformers renamed the method)."""
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    assert model.is_gradient_checkpointing
    if reentrant:  # the reentrant mode needs an input that requires grad to run the layers' backward at all
        model.enable_input_require_grads()
    return model


def train(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, grads = [], []
    for ids in batches:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
    return losses, grads


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_patched_model_trains_like_the_original_under_checkpointing(reentrant):
    model_type, overrides, *_ = CASES["llama"]
    tokens = data.byte_tokens(data.corpus_text())
    batches = [b.to(DEVICE) for b in data.fixed_batches(tokens, STEPS, B, T, seed=0)]
    ref_model = checkpointed(build(model_type, overrides), reentrant)
    ref_losses, ref_grads = train(ref_model, batches)

    model = build(model_type, overrides)
    report = tigon.patch(model)
    checkpointed(model, reentrant)
    support.backend_usage(reset=True)
    losses, grads = train(model, batches)
    used = support.backend_usage()
    assert_report_runs(report, used, steps=STEPS, checkpointed=not reentrant)
    # the layers ran twice per step (forward, then recomputed in the backward): checkpointing did run
    layers = model.config.num_hidden_layers
    assert sum(used["rope"].values()) == 2 * layers * STEPS, used["rope"]
    # non-reentrant: inside the checkpoint the MLP runs swiglu then the down projection (nn.Linear), so that the
    # recomputation stops before the down projection's matmul (forwards.under_checkpoint); reentrant keeps the fold
    folded = sum(used.get("glu_linear", {}).values())
    assert (folded == 0) if not reentrant else (folded == 2 * layers * STEPS), used

    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= RTOL * abs(b), f"step {step}: {a} vs {b}"
    for step, (g, ref) in enumerate(zip(grads, ref_grads)):
        assert set(g) == set(ref), f"step {step}: parameters with a gradient differ"
        worst = max(ref, key=lambda n: rel_l2(g[n], ref[n]))
        assert rel_l2(g[worst], ref[worst]) <= RTOL, f"step {step}: {worst} {rel_l2(g[worst], ref[worst]):.2e}"
    for (n, p), q in zip(model.named_parameters(), ref_model.parameters()):
        assert rel_l2(p, q) <= RTOL, n
