"""`loopdsl schedule`: a loop's next run times, or a GitHub Actions / crontab export."""
from __future__ import annotations

import json
from datetime import timezone
from pathlib import Path

import click

from ..language.model import Loop
from ..project import export as exporters
from ..project.install_source import resolve as resolve_install_source
from ..project.schedule import next_runs, require_schedule
from .loading import load_named
from .output import fail, parse_when, write_text
from .temporal_commands import Connection, connection_options, queue_option


def _export(model: Loop, loop: str, export: str, output: str | None, keep_store: bool, pip_spec: str | None) -> None:
    path, root = exporters.project_relative(Path(loop))
    problem = exporters.path_problem(path)
    if problem is not None:
        fail(f"{json.dumps(path, ensure_ascii=False)}: {problem}; nothing was exported", "rename the loop file")
    if export == "github-actions":
        source = resolve_install_source(pip_spec)
        text, warnings = exporters.github_actions(model, path, keep_store=keep_store, pip_spec=source.pip_spec)
        warnings += [source.warning] if source.warning else []
    else:
        text, warnings = exporters.crontab(model, path, root)
    for warning in warnings:
        click.echo(f"loopdsl: warning: {warning}", err=True)
    write_text(text, output)
    if output:
        click.echo(f"wrote {output}", err=True)


@click.command()
@click.argument("loop")
@click.option("-n", "count", type=click.IntRange(1, 1000), default=5, show_default=True, help="How many run times.")
@click.option("--after", metavar="ISO", help="List the runs after this time (default: now).")
@click.option("--export", "export", type=click.Choice(["github-actions", "crontab", "temporal"]),
              help="Print a scheduled GitHub Actions workflow or a crontab entry instead, or create/update a "
                   "Temporal Schedule (with --temporal).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), help="Write the export to this file.")
@click.option("--no-store-cache", is_flag=True,
              help="github-actions: do not keep the run store between runs (only for `unattended: true` loops).")
@click.option("--pip-spec", metavar="SPEC",
              help="github-actions: what the workflow's `pip install` installs (default: this loopdsl, pinned "
                   "from how pip installed it; required for an editable or local-folder install).")
@connection_options
@queue_option
def schedule(loop: str, count: int, after: str | None, export: str | None, output: str | None,
             no_store_cache: bool, pip_spec: str | None, temporal: Connection | None, task_queue: str) -> None:
    """The next run times of LOOP (schedule.cron in schedule.timezone), or a scheduler export."""
    if not export and (output or no_store_cache or pip_spec):  # export options: they did nothing here
        fail("--output, --no-store-cache and --pip-spec go with --export", "add --export github-actions or crontab")
    if export == "temporal":
        if not temporal:
            fail("--export temporal needs --temporal HOST:PORT (or LOOPDSL_TEMPORAL)",
                 "e.g. loopdsl schedule loops/x.yaml --export temporal --temporal localhost:7233")
        from .temporal_commands import export_schedule

        export_schedule(loop, conn=temporal, task_queue=task_queue)
    model = load_named(loop)
    if export:
        _export(model, loop, export, output, not no_store_cache, pip_spec)
        return
    cron, tz = require_schedule(model)
    times = next_runs(cron, tz, count, parse_when(after, "--after"))
    click.echo(f"{model.name}: {cron!r} in {model.schedule.timezone}")
    for when in times:
        utc = when.astimezone(timezone.utc)
        click.echo(f"  {when.isoformat()}  ({utc.strftime('%Y-%m-%d %H:%M')} UTC)")
