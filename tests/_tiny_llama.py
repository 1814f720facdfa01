"""Tiny fp32 causal LMs built from configs, their training step, and the state cleanup after each test: shared by
tests/test_patch_llama.py and tests/test_mlp_hooks.py."""

from __future__ import annotations

import gc

import pytest
import torch

transformers = pytest.importorskip("transformers")

import tigon  # noqa: E402
from tigon.integrations import FAMILIES, patched_state  # noqa: E402
from tigon.integrations.engine import release_unused  # noqa: E402
from tigon.numerics import rel_l2  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # as in conftest: kernels compiled or interpreted
B, T, V, LAYERS = 2, 16, 300, 2
TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=LAYERS, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=V, max_position_embeddings=64, head_dim=16)


def build(family: str = "llama", seed: int = 0, **overrides):
    """A tiny fp32 causal LM of ``family`` (eager attention, no dropout), in training mode."""
    cfg_cls = transformers.AutoConfig.for_model(family).__class__
    cfg = cfg_cls(**{**TINY, **overrides})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.float().to(DEVICE).train()


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    labels = ids.clone()
    labels[0, :3] = -100  # some ignored targets
    return ids.to(DEVICE), labels.to(DEVICE)


def loss_and_grads(model, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(**kwargs)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out, grads


def assert_same_training_step(model, **kwargs):
    """Loss (rel 1e-5) and every parameter gradient (rel L2 1e-4) of the patched model match the original."""
    ref, ref_grads = loss_and_grads(model, **kwargs)
    report = tigon.patch(model)
    try:
        out, grads = loss_and_grads(model, **kwargs)
    finally:
        tigon.unpatch(model)
    assert out.logits is None, "the fused path must not materialise logits"
    assert abs(out.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
    assert grads.keys() == ref_grads.keys()
    worst = max(rel_l2(grads[n], ref_grads[n]) for n in ref_grads)
    assert worst < 1e-4, worst
    return report


@pytest.fixture(autouse=True)
def _clean_state():
    yield
    for name in list(FAMILIES):
        tigon.unpatch(name)
    if patched_state()["rope_dispatchers"]:  # models patched by a test and dropped: their rotary dispatcher goes too
        gc.collect()  # (a full collection costs up to ~1 s with many modeling modules imported: only when needed)
        assert release_unused() is not None
    assert patched_state()["rope_dispatchers"] == {}
