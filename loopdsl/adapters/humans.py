"""Ways a checkpoint gets a person's decision: a terminal, a script, or nobody (wait)."""
from __future__ import annotations

import contextlib
import getpass
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any, Callable

from .terminal_safe import visible


def who() -> str:
    """Who is deciding: LOOPDSL_USER, else git's user.name <user.email>, else the login name."""
    configured = os.environ.get("LOOPDSL_USER")
    if configured:
        return configured
    try:
        name = subprocess.run(["git", "config", "user.name"], capture_output=True, text=True, timeout=5).stdout.strip()
        email = subprocess.run(["git", "config", "user.email"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = email = ""
    if name or email:
        return f"{name} <{email}>".strip() if email else name
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return "unknown"


def decision(choice: str, comment: str = "", by: str | None = None) -> dict[str, Any]:
    return {
        "decision": choice,
        "comment": comment,
        "by": by or who(),
        "at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
    }


class ScriptedHuman:
    """Decisions from the reply script (`<state>: [{decision: approve, comment: ...}]`).

    A checkpoint with no scripted decision makes the run wait, as it would unattended.
    """

    def __init__(self, pop: Callable[[str], dict[str, Any] | None]):
        self._pop = pop

    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> dict[str, Any] | None:
        scripted = self._pop(state)
        if scripted is None:
            return None
        return decision(str(scripted.get("decision")), str(scripted.get("comment", "")), by="script")


class TerminalHuman:
    """Asks on the terminal when stdin is one; otherwise the run waits."""

    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> dict[str, Any] | None:
        if not sys.stdin.isatty():
            return None
        import click

        click.echo(visible(f"\n[{state}] {message}"), err=True)
        with _interruptible():
            try:
                choice = click.prompt("decision", type=click.Choice([*choices, "later"]), default="later", err=True)
                if choice == "later":
                    return None
                comment = click.prompt("comment", default="", show_default=False, err=True)
            except click.exceptions.Abort:  # Ctrl-C or Ctrl-D at the prompt: the run is interrupted
                raise KeyboardInterrupt from None
        return decision(choice, comment)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """Let Ctrl-C stop a blocking prompt at once. asyncio's own SIGINT handler only cancels the
    main task, which cannot happen while the event loop's thread waits in input()."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
