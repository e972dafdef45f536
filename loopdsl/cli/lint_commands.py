"""`loopdsl lint`, `validate` and `lock`: check loop files, pin what they depend on."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import click

from ..api.locking import check_lock, lock as write_lock
from ..lint.report import run_lint_cli
from .output import FORMATS


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True, help="Output format.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--locked", is_flag=True, help="Also fail when a pinned file changed since `loopdsl lock`.")
def lint(paths: Sequence[str], fmt: str, strict: bool, locked: bool) -> None:
    """Check loop files (and directories of them) for mistakes."""
    # One report: --locked's findings are counted in the summary, and JSON stays one document.
    sys.exit(run_lint_cli(paths, fmt, strict, also=(lambda: check_lock(paths)) if locked else None))


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True, help="Output format.")
@click.option("--strict", is_flag=True, help="Accepted and changes nothing: validate is always strict (warnings fail).")
def validate(paths: Sequence[str], fmt: str, strict: bool) -> None:
    """Same as `lint --strict`: warnings fail too (for users of the older tool; `--strict` is accepted)."""
    sys.exit(run_lint_cli(paths, fmt, True))


@click.command()
@click.argument("paths", nargs=-1)
def lock(paths: Sequence[str]) -> None:
    """Pin every file the loops under PATHS depend on (default: loops/) in loopdsl.lock."""
    written, count = write_lock(list(paths) or ["loops"], Path.cwd())
    click.echo(f"wrote {written} ({count} loop(s))")
