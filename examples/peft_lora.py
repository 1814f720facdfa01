"""PEFT LoRA on a Tigon-patched model, with a trainable LM head (modules_to_save) and gradient checkpointing.

    python examples/peft_lora.py --steps 5

Patch first and let PEFT wrap the patched model (as here), or wrap first and call ``tigon.patch(peft_model)``; the
latter also fuses each LoRA layer's base projection and adapter (report kind ``lora``; after patching first, call
``tigon.patch(peft_model)`` once more for that). The fused LM-head loss uses the weight PEFT actually trains: for
``modules_to_save`` that is the active adapter's copy of ``lm_head``. A LoRA adapter *on* ``lm_head`` cannot be
expressed as one weight; then the original head runs (materialised logits) and Tigon says so once.
"""

from __future__ import annotations

import argparse

import _tiny  # noqa: F401  (sets TRITON_INTERPRET on CPU before tigon is imported)
import peft
import torch

import tigon


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", default="llama")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--no-checkpointing", action="store_true")
    args = p.parse_args()

    torch.manual_seed(0)
    model = tigon.AutoModelForCausalLM.from_config(_tiny.tiny_config(args.family)).to(_tiny.DEVICE)
    print(model.tigon_report)
    if not args.no_checkpointing:
        kwargs = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # newer transformers
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    lora = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, modules_to_save=["lm_head"],
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                           "down_proj"])
    model = peft.get_peft_model(model, lora)
    model.print_trainable_parameters()
    print(tigon.patch(model))  # the LoRA layers now exist: fuse them (the rest is already patched)
    model.train()

    opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=args.lr)
    for step, ids in enumerate(_tiny.byte_batches(args.steps)):
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        fused = "fused head (no logits)" if out.logits is None else "materialised logits"
        print(f"step {step}: loss {out.loss.item():.4f}  [{fused}]")


if __name__ == "__main__":
    main()
