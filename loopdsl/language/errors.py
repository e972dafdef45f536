"""The one family of user mistakes: every error a person can fix derives from `LoopdslError`.

The CLI catches this base once (in `loopdsl.cli.main`) and prints `message` and `hint`, then
exits with `exit_code` (the codes are documented in docs/cli.md). It lives in the lowest
layer so that every layer's user errors can derive from it.
"""
from __future__ import annotations

EXIT_USAGE = 2
EXIT_CHANGED = 5


class LoopdslError(Exception):
    """A user mistake: what happened (`message`), how to fix it (`hint`), and the exit code."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, hint: str = "", exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code
