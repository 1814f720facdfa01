"""The README's usage blocks of the ``tigon`` commands against the parser: every flag a block shows exists, takes
the choices it shows, and every flag of the command appears in its block (a user copies these lines)."""

from __future__ import annotations

import argparse
import pathlib
import re

import pytest

from tigon.cli import build_parser

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _synopses() -> dict[str, str]:
    """``{command: its usage text}`` from the README's fenced blocks whose first line is ``tigon COMMAND [``."""
    blocks = re.findall(r"^```\n(tigon [a-z]+ .*?)^```", README.read_text(), flags=re.M | re.S)
    out: dict[str, str] = {}
    for block in blocks:
        if "[" not in block.splitlines()[0]:
            continue
        command = block.split()[1]
        out[command] = out.get(command, "") + block
    return out


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _flags(parser: argparse.ArgumentParser) -> dict[str, tuple | None]:
    """``{--flag: its choices or None}`` of a subcommand (``--help`` left out)."""
    out = {}
    for action in parser._actions:
        for opt in action.option_strings:
            if opt.startswith("--") and opt != "--help":
                out[opt] = tuple(action.choices) if action.choices is not None else None
    return out


SYNOPSES = _synopses()


def test_every_command_has_a_readme_synopsis():
    assert sorted(SYNOPSES) == sorted(_subparsers())


@pytest.mark.parametrize("command", sorted(SYNOPSES))
def test_readme_synopsis_matches_the_parser(command):
    text = SYNOPSES[command]
    flags = _flags(_subparsers()[command])
    shown = re.findall(r"(--[a-z0-9-]+)(?: \{([^}]*)\})?", text)
    unknown = sorted({f for f, _ in shown if f not in flags})
    assert unknown == [], f"README's `tigon {command}` shows flags the command does not take: {unknown}"
    missing = sorted(f for f in flags if f not in {f for f, _ in shown})
    assert missing == [], f"README's `tigon {command}` synopsis leaves out {missing}"
    for flag, choices in shown:
        if choices and flags[flag] is not None:
            assert set(choices.split(",")) <= set(flags[flag]), (
                f"README's `tigon {command}` shows {flag} {{{choices}}}; the parser takes {flags[flag]}")
