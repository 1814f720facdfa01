"""The ``tigon`` command line's options, frozen: every (subcommand, option strings, default, choices) of
``build_parser()`` against a snapshot taken from the parser, so a change to a flag, a default or the allowed values
fails here and has to be made on purpose (update the snapshot in the same change). Also: every ``--help`` renders."""

import argparse

import pytest

from tigon.cli import build_parser, main

SUPPRESS = argparse.SUPPRESS
DEVICES = ("auto", "cpu", "cuda")

COMMANDS = ["compare", "env", "inspect", "verify", "bench", "profile"]

# (subcommand, option strings (the dest for a positional), default, choices); subcommand "" is the top-level parser.
OPTIONS = {
    ("", ("--version",), SUPPRESS, None),
    ("", ("-h", "--help"), SUPPRESS, None),
    ("bench", ("--attn-implementation",), None, None),
    ("bench", ("--batch-size",), None, None),
    ("bench", ("--csv",), None, None),
    ("bench", ("--cuda-graph",), False, None),
    ("bench", ("--device",), "auto", DEVICES),
    ("bench", ("--dtype",), None, ("bfloat16", "float16", "float32")),
    ("bench", ("--e2e",), False, None),
    ("bench", ("--checkpoint-budget-gb",), None, None),
    ("bench", ("--gradient-checkpointing",), None, ("non_reentrant", "reentrant", "selective")),
    ("bench", ("--json",), None, None),
    ("bench", ("--kernel-summary",), False, None),
    ("bench", ("--layers",), None, None),
    ("bench", ("--nproc",), None, None),
    ("bench", ("--parallel",), None, ("ddp", "fsdp2")),
    ("bench", ("--lora",), None, None),
    ("bench", ("--model",), None, None),
    ("bench", ("--op",), None, None),
    ("bench", ("--plot-dir",), None, None),
    ("bench", ("--providers",), None, None),
    ("bench", ("--quiet",), False, None),
    ("bench", ("--seed",), 0, None),
    ("bench", ("--seq-len",), None, None),
    ("bench", ("--image-tokens",), None, None),
    ("bench", ("--steps",), None, None),
    ("bench", ("--sweep",), None, ("tokens", "hidden")),
    ("bench", ("--tokens",), None, None),
    ("bench", ("--warmup",), None, None),
    ("bench", ("-h", "--help"), SUPPRESS, None),
    ("compare", ("--batch-size",), None, None),
    ("compare", ("--device",), "auto", DEVICES),
    ("compare", ("--dtype",), "float32", ("float32", "bfloat16", "float16")),
    ("compare", ("--json",), None, None),
    ("compare", ("--layers",), None, None),
    ("compare", ("--lr",), None, None),
    ("compare", ("--model",), None, None),
    ("compare", ("--nproc",), 1, None),
    ("compare", ("--parallel",), None, ("ddp", "fsdp2", "tp", "fsdp2_tp")),
    ("compare", ("--plot",), None, None),
    ("compare", ("--preset",), None, None),
    ("compare", ("--quiet",), False, None),
    ("compare", ("--seed",), 0, None),
    ("compare", ("--seq-len",), None, None),
    ("compare", ("--steps",), None, None),
    ("compare", ("-h", "--help"), SUPPRESS, None),
    ("env", ("--json",), None, None),
    ("env", ("-h", "--help"), SUPPRESS, None),
    ("inspect", ("--json",), None, None),
    ("inspect", ("--lora",), None, None),
    ("inspect", ("-h", "--help"), SUPPRESS, None),
    ("inspect", ("model",), None, None),
    ("profile", ("--attn-implementation",), None, None),
    ("profile", ("--batch-size",), None, None),
    ("profile", ("--device",), "auto", DEVICES),
    ("profile", ("--dtype",), None, ("bfloat16", "float32")),
    ("profile", ("--json",), None, None),
    ("profile", ("--lora",), None, None),
    ("profile", ("--layers",), None, None),
    ("profile", ("--no-patched",), False, None),
    ("profile", ("--no-predict",), False, None),
    ("profile", ("--quiet",), False, None),
    ("profile", ("--seed",), 0, None),
    ("profile", ("--seq-len",), None, None),
    ("profile", ("--steps",), None, None),
    ("profile", ("--trace",), None, None),
    ("profile", ("--warmup",), None, None),
    ("profile", ("-h", "--help"), SUPPRESS, None),
    ("profile", ("model",), None, None),
    ("verify", ("--device",), "auto", DEVICES),
    ("verify", ("--dtype",), None, None),
    ("verify", ("--json",), None, None),
    ("verify", ("--lora",), None, None),
    ("verify", ("--max-vocab",), None, None),
    ("verify", ("--model",), None, None),
    ("verify", ("--op",), None, None),
    ("verify", ("--quiet",), False, None),
    ("verify", ("--seed",), 0, None),
    ("verify", ("--tokens",), None, None),
    ("verify", ("-h", "--help"), SUPPRESS, None),
}


def _walk(parser: argparse.ArgumentParser) -> tuple[list[str], set[tuple]]:
    """The subcommand names (in order) and the (subcommand, options, default, choices) of every argument."""
    commands: dict[str, argparse.ArgumentParser] = {}
    rows = set()

    def add(command: str, p: argparse.ArgumentParser) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                commands.update(action.choices)
                continue
            choices = tuple(action.choices) if action.choices is not None else None
            rows.add((command, tuple(action.option_strings) or (action.dest,), action.default, choices))

    add("", parser)
    for name, p in list(commands.items()):
        add(name, p)
    return list(commands), rows


def test_options_match_snapshot():
    commands, rows = _walk(build_parser())
    assert commands == COMMANDS
    assert rows - OPTIONS == set(), "new or changed options (update OPTIONS if intended)"
    assert OPTIONS - rows == set(), "removed or changed options (update OPTIONS if intended)"


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_renders(command, capsys):
    argv = [command, "--help"] if command else ["--help"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: tigon {command}".rstrip()), out[:200]


@pytest.mark.parametrize("command, dest", [("compare", "preset"), ("inspect", "model"), ("verify", "model"),
                                           ("bench", "model"), ("profile", "model")])
def test_model_help_lists_the_presets(command, dest):
    """Every command that takes a preset names them all in its help (bench's and profile's said 'preset name' and
    listed none)."""
    from tigon.presets import PRESETS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    text = next(a.help for a in sub._actions if a.dest == dest)
    assert ', '.join(PRESETS) in text, text
