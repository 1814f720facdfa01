"""End-to-end DPO: TRL's DPOTrainer on a Tigon preset, one provider per process; tokens/s, step time and peak memory.

    eval "$(sh .wheels/trl/install.sh)"     # the GPU machine has no TRL: carried wheels (benchmarks/trl_wheels.py)
    for p in hf liger tigon; do
        PYTHONPATH=src:$PYTHONPATH python3 benchmarks/dpo_e2e.py --provider $p \\
            --out $OUT/dpo-e2e-${p}_llama3-8b-4l_h200_<date>.json
    done
    python3 benchmarks/dpo_e2e.py --table $OUT                # merge the JSON files, print ratios (any machine)

    PYTHONPATH=src python3 benchmarks/dpo_e2e.py --provider hf --model tiny --layers 2 --pairs 2 --prompt-len 12 \\
        --completion-len 11 --steps 3 --warmup 1 --out /tmp/dpo-e2e-hf.json       # CPU, seconds

The run (issue 29's end-to-end row; defaults: Llama-3-8B shapes cut to 4 layers, 4 preference pairs of 1024 tokens a
step, bf16 on CUDA):

* Model: :func:`tigon.presets.build_config` (``--model``, ``--layers``), random weights from ``--seed`` (no download),
  built on the device in ``--dtype`` (the Trainer's ``bf16`` autocast on as well for bfloat16). The reference model
  is a copy of the policy at step 0 (``--ref model``: TRL scores it in the same step, its LM head chunked too), or
  ``--ref precomputed``: TRL's ``precompute_ref_log_probs`` scores the data set once with the policy before training
  (outside the timed steps), no reference model is kept.
* Data: English text of :func:`tigon.data.corpus_text` (kept to ASCII), one token a byte
  (:func:`tigon.data.byte_tokenizer`): each example is a ``--prompt-len`` prompt and two ``--completion-len``
  completions (chosen: the text that follows the prompt; rejected: text from elsewhere), plus the EOS TRL appends, so
  every sequence is ``prompt + completion + 1`` tokens (1024 by default), none padded. The corpus is the running
  Python's, so losses compare across providers of one machine, not across Python versions.
* Providers: ``hf`` is TRL as shipped (its own chunked LM head: ``trl.trainer.utils.add_fused_lm_head``; Hugging
  Face's layers); ``liger`` is ``DPOConfig(use_liger_kernel=True)``, which in TRL 1.16 applies Liger's layer kernels
  (RMSNorm, RoPE, SwiGLU) to the policy and keeps TRL's chunked head (TRL forbids Liger's fused linear CE there), plus
  the same layer kernels on the reference model, applied here (TRL leaves it alone); ``tigon`` is
  ``tigon.patch(model, fused_linear_cross_entropy=False)`` on both models (the head is the trainer's) and
  :func:`tigon.integrations.trl.patch_trainer` (the chunked head of both models -> Tigon's fused linear log-probs).
* Timing: a ``TrainerCallback`` synchronises and times each optimizer step from ``on_step_begin`` to ``on_step_end``
  (forward, backward, optimizer); the first ``--warmup`` steps (compilation, autotuning, allocator growth) are left
  out. ``tokens_per_s`` is the input tokens of a step (chosen and rejected sequences) over the mean timed step;
  ``wall_tokens_per_s`` counts the whole span of the timed steps (data loading and TRL's logging in between too).
  ``peak_memory_bytes`` is ``torch.cuda.max_memory_allocated`` after a reset at the start of training (weights,
  reference model, gradients, AdamW states and activations).

The JSON holds the numbers, the logged losses, what each provider patched, the versions (TRL, datasets, Liger ...),
the device and the exact command. ``--table DIR`` merges every ``dpo-e2e*.json`` of DIR: tokens/s, step ms, peak GiB,
the last logged loss and the ratios to ``hf`` and ``liger``.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import shlex
import sys
import tempfile
import time

PROVIDERS = ("hf", "liger", "tigon")


def _versions() -> dict:
    import importlib.metadata as md

    from tigon.workflows.devices import versions

    out = versions()
    for dist in ("trl", "datasets", "accelerate", "peft", "liger-kernel"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def preference_dataset(n: int, prompt_len: int, completion_len: int, seed: int):
    """``n`` examples {"prompt", "chosen", "rejected"} of ASCII corpus text (``datasets.Dataset``).

    The chosen completion is the text right after the prompt; the rejected one a window from a random place. Every
    string has exactly the asked number of characters, hence of byte tokens.
    """
    import datasets
    import torch

    from tigon import data

    text = data.corpus_text().encode("ascii", "ignore").decode("ascii")
    span = prompt_len + completion_len
    if len(text) <= span + completion_len:
        raise ValueError(f"--prompt-len + --completion-len ({span}) must be shorter than the corpus ({len(text)})")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(text) - span, (n,), generator=gen).tolist()
    others = torch.randint(0, len(text) - completion_len, (n,), generator=gen).tolist()
    return datasets.Dataset.from_dict({
        "prompt": [text[s:s + prompt_len] for s in starts],
        "chosen": [text[s + prompt_len:s + span] for s in starts],
        "rejected": [text[o:o + completion_len] for o in others],
    })


def build_models(args, device):
    """The policy (random weights from ``args.seed``) and, for ``--ref model``, a frozen copy of it."""
    import copy

    import torch
    import transformers

    from tigon import presets

    cfg = presets.build_config(args.model, args.layers)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, args.dtype),
                                                              attn_implementation=args.attn_implementation)
    ref = None
    if args.ref == "model":
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    return model, ref


def _timer_callback(device):
    import torch
    from transformers import TrainerCallback

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    class StepTimer(TrainerCallback):
        """Seconds of each optimizer step (synchronised), and the peak memory since training began."""

        def __init__(self):
            self.spans: list[tuple[float, float]] = []

        def on_train_begin(self, args, state, control, **kw):
            sync()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

        def on_step_begin(self, args, state, control, **kw):
            sync()
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            sync()
            self.spans.append((self._t0, time.perf_counter()))

    return StepTimer()


def run(args) -> dict:
    """Train ``args.steps`` DPO steps with one provider; returns the JSON record."""
    import torch

    try:
        import trl
    except ImportError as e:
        raise SystemExit("dpo_e2e needs TRL (on the GPU machine: eval \"$(sh .wheels/trl/install.sh)\", see "
                         "benchmarks/trl_wheels.py)") from e
    from tigon import data
    from tigon.workflows.devices import device_name

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.provider == "liger" and importlib.util.find_spec("liger_kernel") is None:
        raise SystemExit("--provider liger needs liger-kernel (shipped in .wheels/trl)")
    tok = data.byte_tokenizer()
    model, ref = build_models(args, device)
    patches = []
    if args.provider == "tigon":
        import tigon

        for name, m in (("model", model), ("ref_model", ref)):
            if m is not None:
                patches.append(f"tigon.patch({name}): " + str(tigon.patch(m, fused_linear_cross_entropy=False)))
    n_examples = args.pairs * args.steps
    ds = preference_dataset(n_examples, args.prompt_len, args.completion_len, args.seed)
    bf16 = args.dtype == "bfloat16" and device.type == "cuda"
    out_dir = tempfile.mkdtemp(prefix="dpo-e2e-")
    cfg = trl.DPOConfig(
        output_dir=out_dir, max_steps=args.steps, per_device_train_batch_size=args.pairs,
        max_length=args.prompt_len + args.completion_len + 1, learning_rate=args.lr, beta=args.beta,
        loss_type=[args.loss_type], logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True,
        seed=args.seed, bf16=bf16, use_cpu=device.type == "cpu", gradient_checkpointing=args.gradient_checkpointing,
        use_liger_kernel=args.provider == "liger", precompute_ref_log_probs=args.ref == "precomputed",
        dataloader_num_workers=0)
    timer = _timer_callback(device)
    trainer = trl.DPOTrainer(model=model, ref_model=ref, args=cfg, train_dataset=ds, processing_class=tok,
                             callbacks=[timer])
    if args.provider == "liger" and trainer.ref_model is not None:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=trainer.ref_model, fused_linear_cross_entropy=False)
        patches.append("liger: layer kernels on the policy by the Trainer (use_liger_kernel=True), on the reference "
                       "model by _apply_liger_kernel_to_instance(fused_linear_cross_entropy=False)")
    if args.provider == "tigon":
        from tigon import support
        from tigon.integrations import trl as tigon_trl

        patches.append(str(tigon_trl.patch_trainer(trainer, strict=True)))
        support.backend_usage(reset=True)
    rows = trainer.train_dataset
    lengths = {2 * len(p) + len(c) + len(r) for p, c, r in zip(rows["prompt_ids"], rows["chosen_ids"],
                                                                rows["rejected_ids"])}
    if len(lengths) != 1:
        raise RuntimeError(f"examples of unequal token counts {sorted(lengths)}: the data set should make them equal")
    tokens_per_step = args.pairs * lengths.pop()
    trainer.train()

    spans = timer.spans[args.warmup:]
    if not spans:
        raise SystemExit(f"--steps {args.steps} leaves no timed step after --warmup {args.warmup}")
    step_s = [b - a for a, b in spans]
    mean_s = sum(step_s) / len(step_s)
    wall_s = spans[-1][1] - spans[0][0]
    params = sum(p.numel() for p in model.parameters())
    if args.provider == "tigon":  # which backend each Tigon op ran on (a fallback to the reference shows here)
        from tigon import support

        patches.append(f"tigon backends used: {support.backend_usage()}")
    liger_modules = sum(type(m).__name__.startswith("Liger") for mm in (model, trainer.ref_model) if mm is not None
                        for m in mm.modules())
    if args.provider == "liger":
        patches.append(f"liger: {liger_modules} Liger modules in the policy and reference model after training")
    return {
        "kind": "dpo_e2e",
        "provider": args.provider,
        "model": {"preset": args.model, "layers": args.layers, "params": params, "dtype": args.dtype,
                  "attn_implementation": args.attn_implementation},
        "shape": {"pairs": args.pairs, "prompt_len": args.prompt_len, "completion_len": args.completion_len,
                  "seq_len": args.prompt_len + args.completion_len + 1, "tokens_per_step": tokens_per_step},
        "trainer": {"ref": args.ref, "loss_type": args.loss_type, "beta": args.beta, "lr": args.lr, "bf16": bf16,
                    "gradient_checkpointing": args.gradient_checkpointing, "optim": str(cfg.optim)},
        "steps": args.steps, "warmup": args.warmup, "timed_steps": len(step_s),
        "tokens_per_s": tokens_per_step / mean_s,
        "wall_tokens_per_s": tokens_per_step * len(spans) / wall_s,
        "step_ms": 1e3 * mean_s,
        "step_ms_median": 1e3 * sorted(step_s)[len(step_s) // 2],
        "step_ms_all": [1e3 * (b - a) for a, b in timer.spans],
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h and "train_loss" not in h],
        "patches": patches,
        "device": str(device), "device_name": device_name(device),
        "versions": _versions(),
        "command": shlex.join([os.path.basename(sys.executable), os.path.relpath(__file__), *args.argv]),
    }


def load(directory: str) -> list[dict]:
    """The ``dpo_e2e`` records of ``directory`` (``dpo-e2e*.json``), in provider order hf, liger, tigon, others."""
    recs = []
    for path in sorted(glob.glob(os.path.join(directory, "dpo-e2e*.json"))):
        with open(path) as f:
            rec = json.load(f)
        if rec.get("kind") == "dpo_e2e":
            recs.append(rec)
    order = {p: i for i, p in enumerate(PROVIDERS)}
    return sorted(recs, key=lambda r: order.get(r["provider"], len(order)))


def table(recs: list[dict]) -> str:
    """tokens/s, step ms, peak GiB, last loss, and speed / memory ratios to ``hf`` and ``liger``, one line each."""
    by = {r["provider"]: r for r in recs}
    shapes = {json.dumps([r["model"], r["shape"], r["trainer"]], sort_keys=True) for r in recs}

    def ratio(r, base, key):
        b = by.get(base)
        return f"{r[key] / b[key]:.2f}x" if b and r.get(key) and b.get(key) else "-"

    lines = []
    if recs:
        r0 = recs[0]
        lines.append(f"DPO, {r0['model']['preset']} x {r0['model']['layers']} layers, {r0['shape']['pairs']} pairs x "
                     f"{r0['shape']['seq_len']} tokens, ref {r0['trainer']['ref']}, on {r0['device_name']}")
    if len(shapes) > 1:
        lines.append("WARNING: the files differ in model, shape or trainer settings; ratios compare unlike runs")
    lines.append(f"{'provider':10s} {'tok/s':>9s} {'wall tok/s':>10s} {'step ms':>8s} {'peak GiB':>9s} "
                 f"{'last loss':>10s} {'speed/hf':>9s} {'speed/liger':>11s} {'peak/hf':>8s} {'peak/liger':>10s}")
    for r in recs:
        peak = f"{r['peak_memory_bytes'] / 2**30:9.2f}" if r.get("peak_memory_bytes") else f"{'-':>9s}"
        loss = f"{r['losses'][-1]:10.4f}" if r.get("losses") else f"{'-':>10s}"
        lines.append(f"{r['provider']:10s} {r['tokens_per_s']:9,.0f} {r['wall_tokens_per_s']:10,.0f} "
                     f"{r['step_ms']:8.1f} {peak} {loss} {ratio(r, 'hf', 'tokens_per_s'):>9s} "
                     f"{ratio(r, 'liger', 'tokens_per_s'):>11s} {ratio(r, 'hf', 'peak_memory_bytes'):>8s} "
                     f"{ratio(r, 'liger', 'peak_memory_bytes'):>10s}")
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--provider", choices=PROVIDERS, help="the one provider this process runs")
    ap.add_argument("--table", metavar="DIR", help="merge DIR's dpo-e2e*.json files and print the table instead")
    ap.add_argument("--model", default="llama3-8b", help="a tigon.presets name")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers kept (default 4)")
    ap.add_argument("--pairs", type=int, default=4, help="preference pairs a step (2x as many sequences)")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--completion-len", type=int, default=511, help="chosen and rejected (+ 1 EOS token each)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing")
    ap.add_argument("--ref", choices=("model", "precomputed"), default="model",
                    help="a reference model scored every step, or reference log-probs precomputed before training")
    ap.add_argument("--loss-type", default="sigmoid", help="DPOConfig.loss_type (one)")
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--attn-implementation", default="sdpa")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="TRL's default; off here by default")
    ap.add_argument("--device", help="default: cuda if available, else cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="the JSON file to write")
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.table is None and args.provider is None:
        ap.error("give --provider (one run) or --table DIR (merge)")
    if args.dtype is None:
        import torch

        args.dtype = "bfloat16" if (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cpu" \
            else "float32"
    for name in ("layers", "pairs", "prompt_len", "completion_len", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 0 <= args.warmup < args.steps:
        ap.error(f"--warmup must be in [0, --steps), got {args.warmup} with --steps {args.steps}")
    if args.provider is not None:  # an unknown preset or too many layers: a usage error, not a traceback later
        from tigon import presets

        try:
            presets.build_config(args.model, args.layers)
        except (KeyError, ValueError) as e:
            ap.error(f"--model {args.model} --layers {args.layers}: {e.args[0] if e.args else e}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.table:
        recs = load(args.table)
        if not recs:
            print(f"no dpo-e2e*.json in {args.table}", file=sys.stderr)
            return 1
        print(table(recs))
        return 0
    rec = run(args)
    print(table([rec]))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(rec, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):  # nothing to fetch; the GPU machine has no network
        os.environ.setdefault(var, "1")
    sys.exit(main())
