"""``tigon inspect``: what tigon.patch would replace in a model, module by module, from its config alone (the
report comes from :mod:`tigon.workflows.inspect`)."""

from __future__ import annotations

import argparse
from typing import Any

from ._render import _check_output, _console, _dump_report, _fail, _print_footer, _quiet_transformers


def add_parser(sub) -> None:
    """Add the ``inspect`` subcommand to ``sub`` (the subparsers of :func:`tigon.cli.build_parser`)."""
    from ..presets import PRESETS

    p = sub.add_parser(
        "inspect",
        help="what tigon.patch would replace in a model, module by module (config only, no weights)",
        description=(
            "Build MODEL from its config on the meta device (no weights are read or allocated), dry-run tigon.patch "
            "on it and report which family applies, what would be replaced (norms, rotary, MLP activation, LM head "
            "+ loss) with counts, and what would be left alone and why."
        ),
    )
    p.add_argument("model", metavar="MODEL",
                   help=f"a preset ({', '.join(PRESETS)}), a path to a config.json, a checkpoint directory, or a Hub "
                        "id in the local Hugging Face cache (never downloaded)")
    p.add_argument("--lora", type=int, metavar="R",
                   help="wrap the model with PEFT LoRA of rank R first (as bench --e2e --lora): lists the LoRA layers "
                        "and MLPs fused, and those left to PEFT with the reason")
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``tigon inspect`` with the parsed ``args``; returns the exit status."""
    from ..workflows.compare import ConfigError
    from ..workflows.inspect import run_inspect

    prog = "tigon inspect"
    problem = _check_output(args.json, "--json")
    if problem:
        return _fail(prog, problem)
    _quiet_transformers()
    try:
        report = run_inspect(args.model, lora_rank=args.lora).as_dict()
    except (ConfigError, ImportError) as e:
        return _fail(prog, str(e))
    if args.json:
        _dump_report(args.json, report)
    _render_inspect(report, args.json)
    return 0


def _render_inspect(r: dict[str, Any], written: str | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = _console()
    cfg = r["config"]
    head = Table(title=f"tigon inspect {r['model']}", title_justify="left", show_header=False)
    head.add_column(style="bold")
    head.add_column(overflow="fold")
    head.add_row("source", r["source"])
    head.add_row("architecture", f"{r['architecture']} ({r['num_parameters']:,} parameters)")
    head.add_row("family", r["family"])
    shape_keys = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "hidden_act", "hidden_activation",
                  "tie_word_embeddings", "final_logit_softcapping", "vision_model_type", "vision_num_hidden_layers",
                  "vision_hidden_size", "vision_embed_dim")
    head.add_row("config", ", ".join(f"{k}={cfg[k]}" for k in shape_keys if k in cfg))
    cats = r["categories"]
    labels = {"mlp_activation": "MLP activation", "lm_head_loss": "LM head + loss",
              "residual_add_norm": "residual add + norm", "attention_sinks": "attention with sinks",
              "vision_attention": "vision attention batched by length"}
    head.add_row("would replace", ", ".join(f"{labels.get(c, c.replace('_', ' '))} {n}" for c, n in cats.items()))
    console.print(head)

    rep = Table(title="tigon.patch would replace", title_justify="left")
    for col in ("kind", "count", "modules", "runs instead"):
        rep.add_column(col, overflow="fold", no_wrap=col != "runs instead")
    for g in r["replaced"]:
        rep.add_row(f"[green]{g['kind']}[/]", str(g["count"]), escape("\n".join(g["targets"])), escape(g["detail"]))
    if not r["replaced"]:
        rep.add_row("-", "0", "nothing", "")
    console.print(rep)
    if r["skipped"]:
        sk = Table(title="Skipped (recognised, cannot be patched)", title_justify="left")
        for col in ("kind", "count", "modules", "why"):
            sk.add_column(col, overflow="fold", no_wrap=col != "why")
        for g in r["skipped"]:
            sk.add_row(f"[yellow]{g['kind']}[/]", str(g["count"]), escape("\n".join(g["targets"])), escape(g["reason"]))
        console.print(sk)
    left = Table(title="Left alone", title_justify="left")
    for col in ("module", "count", "e.g.", "why"):
        left.add_column(col, overflow="fold", no_wrap=col != "why")
    for g in r["left_alone"]:
        left.add_row(g["module"], str(g["count"]), escape("\n".join(g["examples"])), escape(g["reason"]))
    console.print(left)
    _print_footer(console, r["notes"], written)
