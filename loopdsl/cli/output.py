"""What every command shares: exit codes, the error line, common options, loading a loop by name.

Exit codes (documented in docs/cli.md): 0 completed / clean, 1 findings or a run
that ended other than completed, 2 usage or lint error, 3 internal error, 4 waiting
for a person, 5 another process changed the run first (took it over, or decided).
"""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import NoReturn

import click

from ..language.terminal_safe import visible
from ..runtime.redaction import redact_printed

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_WAITING, EXIT_CHANGED = 0, 1, 2, 3, 4, 5

FORMATS = click.Choice(["text", "json", "github"])

store_option = click.option("--store", type=click.Path(file_okay=False), envvar="LOOPDSL_STORE",
                            help="Run store directory (default: .loopdsl/ at the repository root).")
script_option = click.option("--script", type=click.Path(exists=True, dir_okay=False),
                             help="Scripted replies (offline, no API key): state -> replies, checkpoint decisions.")


def print_error(message: str, hint: str = "") -> None:
    """The user's mistake (and how to fix it) on stderr, redacted and terminal-safe."""
    click.echo(visible(redact_printed(f"loopdsl: error: {message}")), err=True)
    if hint:
        click.echo(visible(redact_printed(f"  hint: {hint}")), err=True)


def fail(message: str, hint: str = "", code: int = EXIT_USAGE) -> NoReturn:
    """Print the user's mistake (and how to fix it) and exit with `code`."""
    print_error(message, hint)
    sys.exit(code)


def write_text(text: str, output: str | None) -> None:
    """`text` to the file `output`, or to stdout."""
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            fail(f"cannot write {output}: {exc.strerror or exc}")
    else:
        click.echo(text, nl=not text.endswith("\n"))


def made_folder(path: str, what: str) -> Path:
    """The folder `path` (made if missing) a command will write into, checked before it does
    any work: a file, a device or a path under a file there is the user's to change."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"{what} {path}: cannot be a folder to write into ({exc.strerror or exc})",
             "name a folder, or a path where one can be made")
    return folder


def parse_when(value: str | None, option: str) -> datetime | None:
    """An ISO date or date-time flag (UTC when it names no zone)."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option} {value!r} is not an ISO date or date-time", f"e.g. {option} 2024-03-01T00:00:00+00:00")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
