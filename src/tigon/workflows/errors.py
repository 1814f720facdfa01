"""The error every workflow raises for input it cannot use, and the one-line form of an exception's message."""

from __future__ import annotations


class ConfigError(ValueError):
    """A workflow cannot run as configured (bad argument, missing checkpoint, unsupported model family); the message
    names the argument and what was expected. The CLI prints it as one line and exits with status 2."""


def error_text(e: BaseException, limit: int = 300) -> str:
    """``e``'s message on one line: its non-empty lines joined by spaces, cut at ``limit`` characters (or the
    exception's type name when it has no message), for one-line CLI errors that keep the actual reason."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if not text:
        return type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
