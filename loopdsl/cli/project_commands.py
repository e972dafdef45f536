"""Project commands (init, test, audit, cost, schedule), registered on the main CLI group.

Each command only parses flags, calls `loopdsl.project.*` and prints; imports stay inside
the command functions so that `loopdsl lint` does not pay for them.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import click

from ..adapters.terminal_safe import visible

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _fail(message: str, hint: str = "", code: int = EXIT_USAGE) -> None:
    click.echo(visible(f"loopdsl: error: {message}"), err=True)
    if hint:
        click.echo(visible(f"  hint: {hint}"), err=True)
    sys.exit(code)


def _load(loop: str) -> Any:
    """The loop named on the command line, or a clear message and exit 2."""
    from ..api.runs import _resolve_loop
    from ..language.diagnostics import LoopError, format_text
    from ..language.packaged_loops import PackageError

    try:
        return _resolve_loop(loop)
    except LoopError as exc:
        click.echo(format_text(exc.diagnostics), err=True)
        _fail(f"{loop} has lint errors", f"fix them first: `loopdsl lint {loop}`")
    except PackageError as exc:
        _fail(exc.message, exc.hint)
    except OSError as exc:
        _fail(f"cannot read {loop}: {exc.strerror or exc}")


def _write(text: str, output: str | None) -> None:
    if output:
        from pathlib import Path

        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as exc:
            _fail(f"cannot write {output}: {exc.strerror or exc}")
    else:
        click.echo(text, nl=not text.endswith("\n"))


# ---------------------------------------------------------------- test


@click.command("test")
@click.argument("paths", nargs=-1)
@click.option("--format", "fmt", type=click.Choice(["text", "junit"]), default="text", show_default=True,
              help="junit: JUnit XML for CI (to stdout, or to --output).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the JUnit XML here instead of stdout.")
@click.option("--keep", is_flag=True, help="Keep each test's temporary workspace and say where it is.")
def test_command(paths: Sequence[str], fmt: str, output: str | None, keep: bool) -> None:
    """Run loop tests (*.test.yaml) under PATHS (default: the current folder), offline."""
    from ..project.looptest import collect, junit_xml, result_lines, run_tests, tally

    tests, broken = collect(list(paths) or ["."])
    if not tests and not broken:
        _fail(f"no loop tests (*.test.yaml) under {', '.join(paths) or '.'}",
              "a loop test names a loop, its replies and what to expect; see docs/cli.md, 'loopdsl test'")
    # With JUnit on stdout, the human report goes to stderr so the XML stays parseable.
    to_stderr = fmt == "junit" and not output

    def show(outcome: Any) -> None:
        for line in result_lines(outcome):
            click.echo(visible(line), err=to_stderr)

    for outcome in broken:
        show(outcome)
    outcomes = broken + run_tests(tests, on_result=show, keep=keep)
    if fmt == "junit":
        _write(junit_xml(outcomes), output)
    click.echo(tally(outcomes), err=to_stderr)
    sys.exit(EXIT_OK if all(o.passed for o in outcomes) else EXIT_FINDINGS)


# ---------------------------------------------------------------- audit


@click.command()
@click.argument("directory", default=".", type=click.Path(exists=True, file_okay=False))
@click.option("--suggest", is_flag=True, help="Print the fix for each lost point.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--threshold", type=click.IntRange(0, 100), help="Exit 1 when a loop scores below N.")
@click.option("--days", type=click.IntRange(1, 3650), default=7, show_default=True,
              help="How recent a completed run must be for the recent-runs check.")
@click.option("--store", type=click.Path(file_okay=False), envvar="LOOPDSL_STORE",
              help="Run store to look for recent runs (default: .loopdsl/ at the repository root).")
def audit(directory: str, suggest: bool, fmt: str, threshold: int | None, days: int, store: str | None) -> None:
    """Score each loop under DIRECTORY for readiness (rubric: docs/audit.md)."""
    import json
    from pathlib import Path

    from ..project.audit import audit_project, format_text

    report = audit_project(Path(directory), store=Path(store) if store else None, days=days,
                           on_progress=lambda m: click.echo(m, err=True) if fmt == "text" else None)
    if not report.loops:
        _fail(f"no loop files under {directory}", "a loop file has a top-level `loopdsl: 1`; `loopdsl init` scaffolds one")
    if fmt == "json":
        click.echo(json.dumps(report.to_json(threshold), indent=2))
    else:
        click.echo(format_text(report, suggest))
    low = [a for a in report.loops if threshold is not None and a.score < threshold]
    below = bool(low)
    if below and fmt == "text":
        click.echo(f"below the threshold {threshold}: " + ", ".join(f"{a.name} ({a.score})" for a in low), err=True)
    sys.exit(EXIT_FINDINGS if below else EXIT_OK)


# ---------------------------------------------------------------- cost


def _parse_when(value: str | None, option: str) -> Any:
    if value is None:
        return None
    from datetime import datetime, timezone

    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        _fail(f"{option} {value!r} is not an ISO date or date-time", f"e.g. {option} 2024-03-01T00:00:00+00:00")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _pattern_file(name: str) -> str:
    """The bundled pattern's loop file, or a clear message and exit 2."""
    from ..project.init import InitError, find_pattern

    try:
        return str(find_pattern(name).path)
    except InitError as exc:
        _fail(exc.message, exc.hint)
        raise


@click.command()
@click.argument("loop", required=False)
@click.option("--pattern", "-p", metavar="NAME", help="Cost a bundled pattern (see `loopdsl init --list`) instead of LOOP.")
@click.option("--cadence", type=click.Choice(["hourly", "daily", "weekly", "per-pr"]),
              help="Runs per month from a cadence instead of schedule.cron (720, 30, 30/7, or --prs-per-month).")
@click.option("--prs-per-month", type=click.FloatRange(0, 100000), metavar="N",
              help="With --cadence per-pr: how many pull requests a month (one run each).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--window-start", metavar="ISO", help="Start of the 30-day window for counting cron runs (default: now).")
@click.option("--store", type=click.Path(file_okay=False), envvar="LOOPDSL_STORE",
              help="Run store with past runs to compare with (default: .loopdsl/ at the repository root).")
def cost(loop: str | None, pattern: str | None, cadence: str | None, prs_per_month: float | None, fmt: str,
         window_start: str | None, store: str | None) -> None:
    """Worst-case and typical cost of one run of LOOP (or of a bundled --pattern), and per month
    (definitions: docs/cost.md)."""
    import json
    from pathlib import Path

    from ..project.cost import estimate, format_text
    from ..project.schedule import ScheduleError
    from ..adapters.store.run_store import default_store_dir

    if (loop is None) == (pattern is None):
        _fail("give a loop file or --pattern NAME (one of them)",
              "e.g. `loopdsl cost loops/daily-triage.yaml` or `loopdsl cost --pattern daily-triage --cadence daily`")
    if (cadence == "per-pr") != (prs_per_month is not None):
        _fail("--cadence per-pr and --prs-per-month N go together",
              "say how many pull requests a month the loop runs for, e.g. --cadence per-pr --prs-per-month 40")
    model = _load(loop if loop is not None else _pattern_file(pattern or ""))
    where = Path(store) if store else default_store_dir(model.base_dir)
    try:
        report = estimate(model, cadence=cadence, window_start=_parse_when(window_start, "--window-start"),
                          store_dir=where, prs_per_month=prs_per_month)
    except ScheduleError as exc:
        _fail(exc.message, exc.hint)
    click.echo(json.dumps(report.to_json(), indent=2) if fmt == "json" else format_text(report))


# ---------------------------------------------------------------- schedule


@click.command()
@click.argument("loop")
@click.option("-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True, help="How many run times.")
@click.option("--after", metavar="ISO", help="List the runs after this time (default: now).")
@click.option("--export", "export", type=click.Choice(["github-actions", "crontab"]),
              help="Print a scheduled GitHub Actions workflow or a crontab entry instead.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the export to this file.")
@click.option("--no-store-cache", is_flag=True,
              help="github-actions: do not keep the run store between runs (only for `unattended: true` loops).")
@click.option("--pip-spec", metavar="SPEC",
              help="github-actions: what the workflow's `pip install` installs (default: this loopdsl, pinned "
                   "from how pip installed it; required for an editable or local-folder install).")
def schedule(loop: str, count: int, after: str | None, export: str | None, output: str | None,
             no_store_cache: bool, pip_spec: str | None) -> None:
    """The next run times of LOOP (schedule.cron in schedule.timezone), or a scheduler export."""
    from datetime import timezone
    from pathlib import Path

    from ..project.schedule import ScheduleError, next_runs, require_schedule

    model = _load(loop)
    try:
        if export:
            from ..project import export as exporters

            path, root = exporters.project_relative(Path(loop))
            if export == "github-actions":
                from ..project.install_source import resolve

                source = resolve(pip_spec)
                text, warnings = exporters.github_actions(model, path, keep_store=not no_store_cache,
                                                          pip_spec=source.pip_spec)
                warnings += [source.warning] if source.warning else []
            else:
                text, warnings = exporters.crontab(model, path, root)
            for warning in warnings:
                click.echo(f"loopdsl: warning: {warning}", err=True)
            _write(text, output)
            if output:
                click.echo(f"wrote {output}", err=True)
            return
        cron, tz = require_schedule(model)
        times = next_runs(cron, tz, count, _parse_when(after, "--after"))
    except ScheduleError as exc:
        _fail(exc.message, exc.hint)
    click.echo(f"{model.name}: {cron!r} in {model.schedule.timezone}")
    for when in times:
        utc = when.astimezone(timezone.utc)
        click.echo(f"  {when.isoformat()}  ({utc.strftime('%Y-%m-%d %H:%M')} UTC)")


# ---------------------------------------------------------------- init


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
    from pathlib import Path

    from ..project.init import InitError, list_patterns, scaffold

    patterns = list_patterns()
    if list_only:
        for item in patterns:
            click.echo(f"{item.name:<22} {item.summary}")
        return
    if not pattern:
        _fail("choose a pattern with --pattern NAME", "patterns: " + ", ".join(p.name for p in patterns))
        return
    from ..project.install_source import InstallSourceError, resolve

    try:
        source = resolve(pip_spec)
        written = scaffold(Path(directory), pattern, force=force, loop_name=loop_name, install=source)
    except (InitError, InstallSourceError) as exc:
        _fail(exc.message, exc.hint)
    if source.warning:
        click.echo(f"loopdsl: warning: {source.warning}", err=True)
    for file in written:
        click.echo(f"  wrote {file}")
    click.echo(f"next: cd {directory} && loopdsl lint loops/ && loopdsl test  (see README.md)")


def register(group: click.Group) -> None:
    """Add the project commands to `group`."""
    for command in (init, test_command, audit, cost, schedule):
        group.add_command(command)
