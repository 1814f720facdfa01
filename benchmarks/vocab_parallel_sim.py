"""The vocabulary-parallel fused LM-head loss on one device (shards simulated: a list of the head's row blocks, the
all-reduces local) against the plain fused loss: loss, forward + backward time and peak CUDA memory.

    PYTHONPATH=src python benchmarks/vocab_parallel_sim.py          # CUDA: Llama-3-8B head, 8192 tokens, bf16

On one device the shards run one after the other, so the time is the plain loss's plus the overhead of the split
(per-chunk partials and reductions, a second chunk buffer); it says nothing about communication across GPUs. On the
CPU (interpreted kernels) a tiny shape checks that it runs.
"""

import time

import torch

from tigon import functional as F


def main() -> None:
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    n, hdim, vocab, shards = (8192, 4096, 128256, 2) if cuda else (64, 32, 1000, 2)
    dtype = torch.bfloat16 if cuda else torch.float32
    g = torch.Generator(device=dev).manual_seed(0)
    h = torch.randn(n, hdim, device=dev, dtype=dtype, generator=g).requires_grad_()
    w = (torch.randn(vocab, hdim, device=dev, generator=g) / hdim**0.5).to(dtype).requires_grad_()
    t = torch.randint(0, vocab, (n,), device=dev, generator=g)
    cuts = [int(c[0]) for c in torch.arange(vocab).tensor_split(shards)] + [vocab]

    def plain():
        return F.fused_linear_cross_entropy(h, w, t)

    def split():
        return F.vocab_parallel_fused_linear_cross_entropy(h, [w[a:b] for a, b in zip(cuts, cuts[1:])], t)

    for name, fn in (("plain", plain), (f"vocab-parallel, {shards} shards on one device", split)):
        for _ in range(2):  # warm-up (compilation, allocator)
            fn().backward()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        h.grad = w.grad = None
        start = time.perf_counter()
        for _ in range(5):
            loss = fn()
            loss.backward()
        if cuda:
            torch.cuda.synchronize()
        ms = (time.perf_counter() - start) / 5 * 1e3
        peak = f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB" if cuda else "n/a"
        print(f"{name}: loss {loss.item():.6f}, forward + backward {ms:.2f} ms, peak {peak}")


if __name__ == "__main__":
    main()
