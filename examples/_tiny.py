"""Shared helpers for the examples: a tiny model of any family built from a config, and text that ships with Python.

Nothing is downloaded. On a machine without CUDA the Triton kernels run in Triton's interpreter (slow, but the real
kernels); that has to be switched on before tigon is imported, which importing this module does.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import transformers  # noqa: E402

from tigon import data  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# a mini model: 2 layers, hidden 64, vocabulary 300 (bytes are ids 0..255)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, vocab_size=300, max_position_embeddings=256, pad_token_id=256, bos_token_id=None,
            eos_token_id=257)
# what some families need on top (model_type -> config overrides)
EXTRA = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "gemma2": dict(final_logit_softcapping=30.0),
    "gemma3_text": dict(final_logit_softcapping=30.0),
    "granite": dict(logits_scaling=4.0),
    "smollm3": dict(no_rope_layers=[1, 0]),
}


def tiny_config(model_type: str = "llama", **overrides):
    """A transformers config of ``model_type`` (``"llama"``, ``"qwen3"``, ``"gemma3_text"`` ...) with mini sizes."""
    cfg = transformers.AutoConfig.for_model(model_type, **{**TINY, **EXTRA.get(model_type, {}), **overrides})
    cfg._attn_implementation = "eager" if DEVICE == "cpu" else "sdpa"
    if model_type in ("mixtral", "qwen3_moe"):  # experts via torch.bmm (any dtype); they call the _apply_gate hook
        cfg._experts_implementation = "batched_mm"
    return cfg


def byte_batches(steps: int, batch_size: int = 2, seq_len: int = 32, seed: int = 0) -> list[torch.Tensor]:
    """``steps`` (batch_size, seq_len) batches of UTF-8 byte ids of ``pydoc_data.topics``, on DEVICE."""
    tokens = data.byte_tokens(data.corpus_text())
    return [b.to(DEVICE) for b in data.fixed_batches(tokens, steps, batch_size, seq_len, seed)]


def byte_tokenizer():
    """A byte-level tokenizer built in memory (ids 0..255 are bytes, 256 ``<pad>``, 257 ``<eos>``), for TRL."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    # ByteLevel maps byte b to a printable character; order the vocabulary by byte value
    byte_chars = set(pre_tokenizers.ByteLevel.alphabet())
    table = {c: i for i, c in enumerate(_bytes_to_unicode())}
    assert set(table) == byte_chars
    vocab = dict(table)
    vocab["<pad>"], vocab["<eos>"] = 256, 257
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, in byte order (what ByteLevel pre-tokenization produces)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]
