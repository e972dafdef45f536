"""Loading the loop a command names (a file, or pkg:NAME) for the commands that need one."""
from __future__ import annotations

import click

from ..api.runs import resolve_loop
from ..language.diagnostics import LoopError, format_text
from ..language.model import Loop
from .output import fail


def load_named(loop: str) -> Loop:
    """The loop named on the command line (file or pkg:NAME), or a clear message and exit 2."""
    try:
        return resolve_loop(loop)
    except LoopError as exc:
        click.echo(format_text(exc.diagnostics), err=True)
        fail(f"{loop} has lint errors", f"fix them first: `loopdsl lint {loop}`")
    except OSError as exc:
        fail(f"cannot read {loop}: {exc.strerror or exc}")
