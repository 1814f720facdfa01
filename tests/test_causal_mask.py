"""A patched model under torch.compile lets sdpa take ``is_causal`` where there is no padding and no packing
(:mod:`tigon.integrations.causal_mask`): transformers turns that skip off while Dynamo traces (with a KV cache on
torch < 2.14, without one on every torch: the packed-sequence check) and materialises a (batch, 1, T, T) mask, which
made the compiled attention 2.6x slower on an H100."""

from __future__ import annotations

import pytest
import torch

import tigon
from tigon.integrations import causal_mask

masking_utils = pytest.importorskip("transformers.masking_utils")
old_torch = pytest.mark.skipif(causal_mask._torch_version() >= causal_mask.FIXED_IN,
                               reason="torch >= 2.14: transformers takes the KV-cache skip under torch.compile itself")


@pytest.fixture(autouse=True)
def old_transformers(monkeypatch):
    """transformers' check as 5.17 has it on torch < 2.14 (no skip while Dynamo traces), where this transformers
    takes the skip already (5.25 on torch 2.13): the wrapper is then tested against what the GPU image runs."""
    real = masking_utils._ignore_causal_mask_sdpa
    if causal_mask._materialises(real):
        yield
        return

    def check_5_17(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size=None):
        if torch.compiler.is_compiling():
            return False
        return real(padding_mask, q_length, kv_length, q_offset, kv_offset, local_attention_size)

    monkeypatch.setattr(masking_utils, "_ignore_causal_mask_sdpa", check_5_17)
    yield


def tiny_llama(attn="sdpa"):
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=4, vocab_size=64, max_position_embeddings=32)
    cfg._attn_implementation = attn
    return transformers.LlamaForCausalLM(cfg)


def skip_compiled(*args):
    """transformers' check (through the module global, as its callers look it up) inside a Dynamo-traced function."""
    out = {}

    def f(x):
        out["skip"] = masking_utils._ignore_causal_mask_sdpa(*args)
        return x + 1

    torch.compile(f, backend="eager", fullgraph=True)(torch.zeros(2))
    return out["skip"]


@old_torch
def test_compiled_check_skips_only_while_a_patched_model_lives():
    original = masking_utils._ignore_causal_mask_sdpa
    assert skip_compiled(None, 8, 8, 0, 0) is False  # transformers' own answer while tracing on torch < 2.14
    model = tiny_llama()
    report = tigon.patch(model)
    assert any(n.startswith("causal mask under torch.compile: sdpa's is_causal") for n in report.notes), report.notes
    assert causal_mask.installed()
    assert skip_compiled(None, 8, 8, 0, 0) is True
    # what still needs the mask: a padding mask (its values cannot be read in the graph), a query shorter than the
    # keys, a tensor offset, a sliding window reached
    pad = torch.ones(2, 8, dtype=torch.bool)
    assert skip_compiled(pad, 8, 8, 0, 0) is False
    assert skip_compiled(None, 4, 8, 0, 0) is False
    assert skip_compiled(None, 8, 8, 0, 0, 4) is False
    # eager calls are transformers' own
    assert masking_utils._ignore_causal_mask_sdpa(None, 8, 8, 0, 0) == original(None, 8, 8, 0, 0)
    second = tiny_llama()
    tigon.patch(second)
    un = tigon.unpatch(model)
    assert causal_mask.installed() and not any("restored" in n for n in un.notes)  # the second model holds it
    un = tigon.unpatch(second)
    assert any(n == "causal mask under torch.compile: transformers' own check restored" for n in un.notes)
    assert masking_utils._ignore_causal_mask_sdpa is original and not causal_mask.installed()


@old_torch
def test_freed_model_releases_it_and_eager_attention_does_not_take_it():
    import gc

    original = masking_utils._ignore_causal_mask_sdpa
    tigon.patch(tiny_llama())  # freed without unpatch
    gc.collect()
    from tigon.integrations.engine import release_unused

    release_unused()
    assert masking_utils._ignore_causal_mask_sdpa is original
    model = tiny_llama("eager")
    report = tigon.patch(model)
    assert not causal_mask.installed() and not any("causal mask" in n for n in report.notes)
    tigon.unpatch(model)


@old_torch
def test_compiled_patched_model_runs_sdpa_without_a_mask(monkeypatch):
    """The whole model compiled (Dynamo only), KV cache on (the config's use_cache): its attention gets no mask, and
    the loss equals eager's."""
    import transformers.integrations.sdpa_attention as sdpa

    seen = []
    real = sdpa.sdpa_attention_forward

    def spy(module, query, key, value, attention_mask, *args, **kwargs):
        seen.append(attention_mask is None)
        return real(module, query, key, value, attention_mask, *args, **kwargs)

    model = tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    eager = model(input_ids=ids, labels=ids).loss
    tigon.patch(model)
    monkeypatch.setitem(transformers_attention_functions(), "sdpa", spy)
    compiled = torch.compile(model, backend="eager")
    loss = compiled(input_ids=ids, labels=ids).loss
    tigon.unpatch(model)
    assert seen and all(seen), seen
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)


def transformers_attention_functions():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS._global_mapping


def spied_losses(monkeypatch, model, ids, compile_patched=True, **kwargs):
    """(mask seen per sdpa call, compiled loss, eager loss) of ``model`` on ``ids`` with ``kwargs``, compiled by
    Dynamo only (``backend="eager"``), patched by Tigon first when ``compile_patched``."""
    import transformers.integrations.sdpa_attention as sdpa

    seen = []
    real = sdpa.sdpa_attention_forward

    def spy(module, query, key, value, attention_mask, *args, **kw):
        seen.append(attention_mask is not None)
        return real(module, query, key, value, attention_mask, *args, **kw)

    eager = model(input_ids=ids, labels=ids, **kwargs).loss
    if compile_patched:
        tigon.patch(model)
    try:
        monkeypatch.setitem(transformers_attention_functions(), "sdpa", spy)
        torch._dynamo.reset()
        loss = torch.compile(model, backend="eager")(input_ids=ids, labels=ids, **kwargs).loss
        monkeypatch.undo()
    finally:
        if compile_patched:
            tigon.unpatch(model)
    return seen, loss, eager


def test_compiled_patched_model_without_a_cache_runs_sdpa_without_a_mask(monkeypatch):
    """``use_cache=False`` (training steps, gradient checkpointing, Tigon's benchmarks): transformers' packed-sequence
    check cannot read the decoder's own ``arange`` positions under Dynamo and builds a mask on every torch; a patched
    model's decoder says the positions are its own, so sdpa gets no mask. Unpatched, the mask is built."""
    if causal_mask.packed_problem() is not None:
        pytest.skip(f"no packed-sequence wrapper here: {causal_mask.packed_problem()}")
    model = tiny_llama()
    ids = torch.randint(0, 64, (2, 8))
    seen, loss, eager = spied_losses(monkeypatch, model, ids, compile_patched=False, use_cache=False)
    assert seen and all(seen), seen  # transformers' own: a mask
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)
    seen, loss, eager = spied_losses(monkeypatch, model, ids, use_cache=False)
    assert seen and not any(seen), seen
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)
    assert not causal_mask.installed() and causal_mask.CALLS.own_positions is False
    assert not model.model._forward_pre_hooks and not model.model._forward_hooks  # unpatch removed the hooks


def test_caller_given_packed_positions_keep_the_mask(monkeypatch):
    """Packed sequences (a flattening collator's ``position_ids`` restarting at 0): the compiled patched model keeps
    transformers' packed mask (no attention across the packed sequences) and its loss equals eager's."""
    if causal_mask.packed_problem() is not None:
        pytest.skip(f"no packed-sequence wrapper here: {causal_mask.packed_problem()}")
    model = tiny_llama()
    ids = torch.randint(0, 64, (1, 8))
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    seen, loss, eager = spied_losses(monkeypatch, model, ids, use_cache=False, position_ids=positions)
    assert seen and all(seen), seen
    torch.testing.assert_close(loss, eager, rtol=1e-5, atol=1e-6)


def test_vision_language_decoders_are_not_watched():
    class VLM(torch.nn.Module):
        config = type("C", (), {"vision_config": object()})()

        def get_decoder(self):
            return torch.nn.Linear(1, 1)

    assert causal_mask.decoder(VLM()) is None
    assert isinstance(causal_mask.decoder(tiny_llama()), torch.nn.Module)
