"""`loopdsl init`: scaffold a loop project from a bundled pattern."""
from __future__ import annotations

from pathlib import Path

import click

from ..project.init import find_pattern, list_patterns, scaffold
from ..project.install_source import resolve as resolve_install_source
from .output import fail


@click.command()
@click.argument("directory", default=".", type=click.Path(file_okay=False))
@click.option("--pattern", "-p", metavar="NAME", help="The bundled pattern to start from (see --list).")
@click.option("--list", "list_only", is_flag=True, help="List the bundled patterns and exit.")
@click.option("--name", "loop_name", metavar="NAME",
              help="Name the scaffolded loop (its `name:` and file loops/NAME.yaml; default: the pattern's name).")
@click.option("--pip-spec", metavar="SPEC",
              help="What the pre-commit hook installs (default: this loopdsl, pinned from how pip installed it; "
                   "required for an editable or local-folder install).")
@click.option("--force", is_flag=True, help="Overwrite files that already exist.")
def init(directory: str, pattern: str | None, list_only: bool, loop_name: str | None, pip_spec: str | None,
         force: bool) -> None:
    """Scaffold a loop project in DIRECTORY from a bundled pattern: loop, skill, replies, test, hooks."""
    patterns = list_patterns()
    if list_only:
        for item in patterns:
            click.echo(f"{item.name:<22} {item.summary}")
        return
    if not pattern:
        fail("choose a pattern with --pattern NAME", "patterns: " + ", ".join(p.name for p in patterns))
    find_pattern(pattern)  # a mistyped pattern first: the install source may need a flag it would not
    source = resolve_install_source(pip_spec)
    written = scaffold(Path(directory), pattern, force=force, loop_name=loop_name, install=source)
    if source.warning:
        click.echo(f"loopdsl: warning: {source.warning}", err=True)
    for file in written:
        click.echo(f"  wrote {file}")
    click.echo(f"next: cd {directory} && loopdsl lint loops/ && loopdsl test  (see README.md)")
