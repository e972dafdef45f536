"""What the libraries loopdsl runs log, in a process loopdsl owns (the CLI, a worker).

Some log what a hostile peer sent them: the `mcp` SDK warns on the root logger, with the
offending message's content, for every message a server sends that fails validation. With no
handler on the root logger, `logging.warning` installs one that prints to stderr, so an MCP
server could print a secret it was given (unredacted) and flood loopdsl's output. Here the
root logger gets one handler that prints each warning or error on one line, redacted of
every secret this process read, with control characters shown as escapes, cut at
`LINE_LIMIT`, and at most `MAX_LINES` of them per process; what the peer did wrong is
reported where it matters (the tool call's error, the run's events).
"""
from __future__ import annotations

import logging
import sys

from ..language.terminal_safe import visible
from ..runtime.redaction import redact_printed
from .litellm_loading import owns_process

LINE_LIMIT = 500
MAX_LINES = 20


class _GuardedHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.printed = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.printed > MAX_LINES or _printed_by_its_own(record.name):
            return
        self.printed += 1
        try:
            if self.printed > MAX_LINES:
                line = f"loopdsl: more than {MAX_LINES} warnings from libraries; the rest are not shown"
            else:
                # Redacted whole, then cut: a secret cut in two would escape the redaction.
                text = " ".join(visible(redact_printed(record.getMessage())).split())
                line = f"{record.levelname.lower()}: {record.name}: {text[:LINE_LIMIT]}"
            sys.stderr.write(line + "\n")
        except Exception:  # a warning that cannot be printed must never stop the run
            pass


def _printed_by_its_own(name: str) -> bool:
    """Whether a logger on the record's way up has a handler of its own (LiteLLM's does):
    the record was printed there, and would be printed twice."""
    logger: logging.Logger | None = logging.getLogger(name) if name != "root" else None
    while logger is not None and logger is not logging.getLogger():
        if logger.handlers:
            return True
        logger = logger.parent if logger.propagate else None
    return False


def guard_library_logs() -> None:
    """Give the root logger loopdsl's handler, in a process loopdsl owns, unless one is there
    already. Called where a library that logs what a peer sent is first used (importing
    `logging` costs the CLI's start ~18 ms, which `loopdsl lint` need not pay)."""
    root = logging.getLogger()
    if owns_process() and not root.handlers:
        root.addHandler(_GuardedHandler())
