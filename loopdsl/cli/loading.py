"""Loading the loop a command names (a file, or pkg:NAME) for the commands that need one."""
from __future__ import annotations

import click

from ..api.runs import resolve_loop
from ..language.diagnostics import LoopError, format_text
from ..language.files import read_head
from ..language.model import Loop
from ..lint.report import is_loop_text
from .output import fail


def load_named(loop: str) -> Loop:
    """The loop named on the command line (file or pkg:NAME), or a clear message and exit 2."""
    try:
        return resolve_loop(loop)
    except LoopError as exc:
        click.echo(format_text(exc.diagnostics), err=True)
        if not _meant_as_loop(loop):  # `loopdsl lint` passes over it: hinting at it would show nothing
            fail(f"{loop} is not a loop file: it has no `loopdsl:` or `states:` key",
                 "is this the right path? a loop file starts with `loopdsl: 1`")
        fail(f"{loop} has lint errors", f"fix them first: `loopdsl lint {loop}`")
    except OSError as exc:
        fail(f"cannot read {loop}: {exc.strerror or exc}")


def _meant_as_loop(loop: str) -> bool:
    """Whether lint takes the named file as a loop (a pkg:NAME or an unreadable one: yes)."""
    try:
        return is_loop_text(read_head(loop), explicit=True)
    except (OSError, ValueError):
        return True
