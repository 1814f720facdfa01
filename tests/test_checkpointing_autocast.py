"""Tigon's selective checkpointing (:mod:`tigon.checkpointing`) under ``torch.autocast`` over fp32 weights, the mixed
precision of Hugging Face's Trainer with ``bf16=True``.

Autocast multiplies by a lower-precision copy of each weight (``aten._to_copy``, cached for the autocast region), not
by the weight itself: a policy that recognised the kept projections by their weights' storage kept none of them (the
plan said it kept them and that their recompute was avoided; the backward ran every matmul again, silently). The
plan made under the autocast context states the bytes at its dtype.
"""

from __future__ import annotations

import pytest
import torch

import tigon
from test_checkpointing import CountOps, check_kept, sdpa_llama
from model_matrix import DEVICE
from tigon import checkpointing, data

T = 12


def autocast():
    return torch.autocast(DEVICE, dtype=torch.bfloat16)


def autocast_step(model, ids):
    """One forward under bf16 autocast and its backward: the backward's op counts, the loss and every gradient."""
    model.zero_grad(set_to_none=True)
    with autocast():
        out = model(input_ids=ids, labels=ids)
    with CountOps() as c:
        out.loss.backward()
    return c, out.loss.item(), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("patched", [False, True])
@pytest.mark.parametrize("planned_under_autocast", [False, True])
def test_selective_checkpointing_keeps_its_projections_under_autocast(patched, planned_under_autocast):
    """A plan keeping everything offered removes one matmul per kept projection and one attention kernel per kept
    attention from the backward against plain checkpointing, under autocast as without it, with the same loss and
    gradients; planned under the autocast context its bytes are at the autocast dtype (outside it at the weights')."""
    model = sdpa_llama()
    if patched:
        tigon.patch(model)
    ids = data.fixed_batches(data.byte_tokens(data.corpus_text()), 1, 1, T, seed=0)[0].to(DEVICE)
    checkpointing.hf_enable(model, False)
    plain, ref_loss, ref_grads = autocast_step(model, ids)
    if planned_under_autocast:
        with autocast():
            p = checkpointing.enable(model, "selective", batch=(1, T), budget_bytes=2**40)
    else:
        p = checkpointing.enable(model, "selective", batch=(1, T), budget_bytes=2**40)
    kept = [k for lp in p.layers for k in lp.kept]
    assert all(lp.kept == lp.offered for lp in p.layers) and "self_attn.q_proj" in [k.name for k in kept], p.describe()
    size = 2 if planned_under_autocast else 4
    q = kept[0]
    assert q.name == "self_attn.q_proj" and q.bytes == T * model.config.num_attention_heads * 16 * size, q
    check_kept(p, kept, plain, ref_loss, ref_grads, *autocast_step(model, ids))


def test_weight_match_follows_autocasts_copies_and_the_recomputation_replays_the_forward():
    """:class:`tigon.recompute.WeightMatch` tells a kept weight's autocast copy from another weight's of the same shape
    and dtype, on the call that casts it and on a later call that reuses autocast's cached copy; older torch asks the
    policy again in the recomputation (``ctx.is_recompute``), where it gets the forward's answers in order."""
    from types import SimpleNamespace

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.checkpoint import CheckpointPolicy

    from tigon import recompute

    kept, other = torch.nn.Linear(8, 4, bias=False), torch.nn.Linear(8, 4, bias=False)
    match = recompute.WeightMatch((kept.weight,))
    seen = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.mm.default, torch.ops.aten._to_copy.default):
                seen.append((func is torch.ops.aten.mm.default, match(func, args, kwargs)))
            else:
                match(func, args, kwargs)
            return out

    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16), Watch():
        other(x), kept(x), other(x), kept(x)  # the second calls reuse autocast's cached copies
    assert [hit for is_mm, hit in seen if is_mm] == [None, 0, None, 0], seen

    policy = checkpointing._policy((kept,), frozenset())
    mm, fwd, rec = torch.ops.aten.mm.default, SimpleNamespace(is_recompute=False), SimpleNamespace(is_recompute=True)
    first = [policy(fwd, mm, x, kept.weight.t()), policy(fwd, mm, x, other.weight.t())]
    assert first == [CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_RECOMPUTE]
    # the recomputation's operands are new copies (no cast seen): the forward's answers, in order
    again = [policy(rec, mm, x, kept.weight.t().to(torch.bfloat16)), policy(rec, mm, x, other.weight.t())]
    assert again == first
