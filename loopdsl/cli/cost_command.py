"""`loopdsl cost`: worst-case and typical cost of a loop, per run and per month (docs/cost.md)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..adapters.store.run_store import default_store_dir
from ..project.cost import estimate, format_text
from ..project.init import find_pattern
from .loading import load_named
from .output import fail, parse_when


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
    if (loop is None) == (pattern is None):
        fail("give a loop file or --pattern NAME (one of them)",
             "e.g. `loopdsl cost loops/daily-triage.yaml` or `loopdsl cost --pattern daily-triage --cadence daily`")
    if (cadence == "per-pr") != (prs_per_month is not None):
        fail("--cadence per-pr and --prs-per-month N go together",
             "say how many pull requests a month the loop runs for, e.g. --cadence per-pr --prs-per-month 40")
    model = load_named(loop if loop is not None else str(find_pattern(pattern or "").path))
    where = Path(store) if store else default_store_dir(model.base_dir)
    report = estimate(model, cadence=cadence, window_start=parse_when(window_start, "--window-start"),
                      store_dir=where, prs_per_month=prs_per_month)
    click.echo(json.dumps(report.to_json(), indent=2) if fmt == "json" else format_text(report))
