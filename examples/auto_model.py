"""tigon.AutoModelForCausalLM on a mini model of any family, trained next to the original for a few steps.

    python examples/auto_model.py --family qwen3 --steps 5
    python examples/auto_model.py --family ministral      # no family spec: the generic matcher

Builds the same random model twice (transformers and tigon.AutoModelForCausalLM.from_config), prints what Tigon
replaced and why anything was skipped, then trains both on the same text and prints the two loss curves.
"""

from __future__ import annotations

import argparse

import _tiny  # noqa: F401  (sets TRITON_INTERPRET on CPU before tigon is imported)
import torch
import transformers

import tigon


def train(model, batches, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="llama", help="transformers model_type (llama, qwen3, gemma3_text, phi3 ...)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    cfg = _tiny.tiny_config(args.family)
    torch.manual_seed(0)
    original = transformers.AutoModelForCausalLM.from_config(cfg).to(_tiny.DEVICE).train()
    torch.manual_seed(0)
    model = tigon.AutoModelForCausalLM.from_config(cfg).to(_tiny.DEVICE).train()
    print(model.tigon_report)

    batches = _tiny.byte_batches(args.steps)
    ref, got = train(original, batches, args.lr), train(model, batches, args.lr)
    print(f"{'step':>4}  {'original':>10}  {'tigon':>10}  {'rel diff':>9}")
    for i, (a, b) in enumerate(zip(ref, got)):
        print(f"{i:>4}  {a:>10.6f}  {b:>10.6f}  {abs(a - b) / abs(a):>9.1e}")


if __name__ == "__main__":
    main()
