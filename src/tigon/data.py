"""Training text that ships with Python, and fixed batches drawn from it.

The corpus is the documentation topics in the standard library's ``pydoc_data.topics`` (the text behind
``help("assert")`` etc.; about 465 KB of English prose and code), concatenated in sorted topic order. Without a
tokenizer, token ids are the UTF-8 bytes (0..255), valid for any vocabulary of >= 256 entries.
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
