"""Training text that ships with Python, and fixed batches drawn from it.

The corpus is the documentation topics in the standard library's ``pydoc_data.topics`` (the text behind
``help("assert")`` etc.; about 465 KB of English prose and code), concatenated in sorted topic order. Without a
tokenizer, token ids are the UTF-8 bytes (0..255), valid for any vocabulary of >= 256 entries; :func:`byte_tokenizer`
is a Hugging Face tokenizer of the same ids, for trainers that need one (TRL).
"""

from __future__ import annotations

import torch

CORPUS_NAME = "pydoc_data.topics"


def corpus_text() -> str:
    """The corpus: every ``pydoc_data.topics.topics`` entry, in sorted key order, separated by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def byte_tokens(text: str) -> torch.Tensor:
    """UTF-8 bytes of ``text`` as token ids: (len(text.encode()),) int64 in [0, 256)."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).to(torch.int64)


BYTE_PAD_ID = 254
"""The pad token of :func:`byte_tokenizer`: byte 0xFE, which never occurs in UTF-8 text."""
BYTE_EOS_ID = 255
"""The end-of-sequence token of :func:`byte_tokenizer`: byte 0xFF, which never occurs in UTF-8 text."""


def byte_tokenizer():
    """A Hugging Face tokenizer whose ids are the UTF-8 bytes of the text, as :func:`byte_tokens`, built in memory.

    Byte-level BPE without merges (GPT-2's byte-to-character table, no pre-tokenizer split): ``"é"`` is two tokens,
    ``[0xC3, 0xA9]``. Ids 254 and 255, bytes that never occur in UTF-8, are ``<pad>`` (:data:`BYTE_PAD_ID`) and
    ``<eos>`` (:data:`BYTE_EOS_ID`), so the 256 ids fit every preset's vocabulary. No BOS, no special tokens added when
    encoding.

    Returns:
        a ``transformers.PreTrainedTokenizerFast``.

    Raises:
        ImportError: ``transformers`` (and its ``tokenizers``) not installed.
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0  # byte -> GPT-2's printable stand-in character (the ByteLevel pre-tokenizer's table)
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    vocab = {chars[b]: b for b in range(256) if b not in (BYTE_PAD_ID, BYTE_EOS_ID)}
    vocab["<pad>"], vocab["<eos>"] = BYTE_PAD_ID, BYTE_EOS_ID
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tokenizer_tokens(text: str, tokenizer) -> torch.Tensor:
    """``text`` tokenized by a Hugging Face tokenizer without special tokens: (n,) int64."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.int64)


def fixed_batches(tokens: torch.Tensor, steps: int, batch_size: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """``steps`` batches of random windows of ``tokens``, the same for the same arguments.

    Returns:
        a list of ``steps`` int64 CPU tensors of shape (batch_size, seq_len).

    Raises:
        ValueError: the token stream is not longer than ``seq_len``.
    """
    n = tokens.numel()
    if n <= seq_len:
        raise ValueError(f"the corpus has {n} tokens, fewer than --seq-len {seq_len} + 1")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, n - seq_len + 1, (steps, batch_size), generator=gen)
    offsets = torch.arange(seq_len)
    return [tokens[s[:, None] + offsets] for s in starts]
