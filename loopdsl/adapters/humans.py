"""Ways a checkpoint gets a person's decision: a terminal, a script, or nobody (wait)."""
from __future__ import annotations

import asyncio
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

from ..language.terminal_safe import visible


def who() -> str:
    """Who is deciding: LOOPDSL_USER, else git's user.name <user.email>, else the login name.
    One line of at most 200 characters, its control and bidi characters shown as escapes: a
    name with a line break forged a line of `approve`'s and `show`'s output."""
    return " ".join(visible(_who())[:200].split()) or "unknown"


def _who() -> str:
    configured = os.environ.get("LOOPDSL_USER", "").strip()
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

        loop = asyncio.get_running_loop()
        terminal = _TerminalLines(loop, sys.stdin.fileno())
        click.echo(visible(f"\n[{state}] {message}"), err=True)
        with _ctrl_c_interrupts(loop, terminal.interrupt):
            choice = await terminal.choose("decision", [*choices, "later"], default="later")
            if choice == "later":
                return None
            comment = await terminal.ask("comment: ")
        return decision(choice, comment)


class _TerminalLines:
    """Answers typed on the terminal, read through the event loop rather than input().

    Why: Python runs signal handlers between bytecodes, so with a blocking input() a Ctrl-C
    that lands after the prompt is printed but before read() blocks waits for the next key
    press. Here the loop waits for the terminal and for signals alike (its signal wakeup fd),
    so Ctrl-C always ends the wait at once. The terminal stays in its own line mode: the
    kernel does the editing and echo, and hands over whole lines.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int):
        self._loop = loop
        self._fd = fd
        self._unread = b""
        self._interrupted = False
        self._waiting: asyncio.Future[bytes] | None = None

    def interrupt(self) -> None:
        self._interrupted = True
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_exception(KeyboardInterrupt())

    async def choose(self, label: str, options: list[str], default: str) -> str:
        """One of `options`, asking again (as click.prompt does) until the answer is one."""
        import click

        kind = click.Choice(options)
        while True:
            answer = await self.ask(f"{label} ({', '.join(options)}) [{default}]: ") or default
            try:
                return str(kind.convert(answer, None, None))
            except click.BadParameter as exc:
                click.echo(visible(f"Error: {exc.message}"), err=True)  # echoes what was typed

    async def ask(self, prompt: str) -> str:
        """One line, without its end and surrounding blanks. Ctrl-D on an empty line, or a
        terminal that went away, interrupts the run as Ctrl-C does."""
        import click

        click.echo(prompt, nl=False, err=True)
        while b"\n" not in self._unread:
            chunk = await self._chunk()
            if not chunk:
                if self._unread:  # Ctrl-D after some text ends that text, as input() does
                    break
                raise KeyboardInterrupt
            self._unread += chunk
        line, _, self._unread = self._unread.partition(b"\n")
        return line.decode(sys.stdin.encoding or "utf-8", errors="replace").strip()

    async def _chunk(self) -> bytes:
        if self._interrupted:
            raise KeyboardInterrupt
        waiting: asyncio.Future[bytes] = self._loop.create_future()

        def readable() -> None:
            self._loop.remove_reader(self._fd)  # else the loop calls again until this task resumes
            if waiting.done():
                return
            try:
                waiting.set_result(os.read(self._fd, 4096))
            except OSError:  # the terminal hung up
                waiting.set_result(b"")

        self._waiting = waiting
        self._loop.add_reader(self._fd, readable)
        try:
            return await waiting
        finally:
            self._loop.remove_reader(self._fd)
            self._waiting = None


@contextlib.contextmanager
def _ctrl_c_interrupts(loop: asyncio.AbstractEventLoop, interrupt: Callable[[], None]) -> Iterator[None]:
    """Make Ctrl-C call `interrupt` for as long as a prompt is open, then give SIGINT back to
    whoever had it (asyncio.run's handler, which cancels the main task on a first Ctrl-C)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread's handlers: nothing to install
        return
    previous = signal.getsignal(signal.SIGINT)
    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
