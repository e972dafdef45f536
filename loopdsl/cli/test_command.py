"""`loopdsl test`: run loop tests (*.test.yaml) offline."""
from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from ..language.files import exists
from ..language.terminal_safe import visible
from ..project.looptest import TestOutcome, collect, junit_xml, result_lines, run_tests, tally
from .output import EXIT_FINDINGS, EXIT_OK, fail, write_text


@click.command("test")
@click.argument("paths", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["text", "junit"]), default="text", show_default=True,
              help="junit: JUnit XML for CI (to stdout, or to --output).")
@click.option("--output", "-o", type=click.Path(dir_okay=False),
              help="Write the JUnit XML here instead of stdout (implies --format junit).")
@click.option("--keep", is_flag=True, help="Keep each test's temporary workspace and say where it is.")
def test_command(paths: Sequence[str], fmt: str, output: str | None, keep: bool) -> None:
    """Run loop tests (*.test.yaml) under PATHS (default: the current folder), offline."""
    if output and fmt != "junit":  # the only thing --output writes: it wrote nothing before
        fmt = "junit"
    missing = [given for given in paths if not exists(Path(given))]
    if missing:  # a usage error, as `loopdsl lint` says it (it was a failed test named after the path)
        fail(f"no such file or folder: {missing[0]}", "name *.test.yaml files or folders that hold them")
    tests, broken = collect(list(paths) or ["."])
    if not tests and not broken:
        fail(f"no loop tests (*.test.yaml) under {', '.join(paths) or '.'}",
             "a loop test names a loop, its replies and what to expect; see docs/cli.md, 'loopdsl test'")
    # With JUnit on stdout, the human report goes to stderr so the XML stays parseable.
    to_stderr = fmt == "junit" and not output

    def show(outcome: TestOutcome) -> None:
        for line in result_lines(outcome):
            click.echo(visible(line), err=to_stderr)

    for outcome in broken:
        show(outcome)
    outcomes = broken + run_tests(tests, on_result=show, keep=keep)
    if fmt == "junit":
        write_text(junit_xml(outcomes), output)
    click.echo(tally(outcomes), err=to_stderr)
    sys.exit(EXIT_OK if all(o.passed for o in outcomes) else EXIT_FINDINGS)
