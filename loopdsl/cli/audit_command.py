"""`loopdsl audit`: score each loop of a project for readiness (rubric: docs/audit.md)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..project.audit import audit_project, format_text
from .output import EXIT_FINDINGS, EXIT_OK, fail


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
    report = audit_project(Path(directory), store=Path(store) if store else None, days=days,
                           on_progress=lambda m: click.echo(m, err=True) if fmt == "text" else None)
    if not report.loops:
        fail(f"no loop files under {directory}", "a loop file has a top-level `loopdsl: 1`; `loopdsl init` scaffolds one")
    if fmt == "json":
        click.echo(json.dumps(report.to_json(threshold), indent=2))
    else:
        click.echo(format_text(report, suggest))
    low = [a for a in report.loops if threshold is not None and a.score < threshold]
    if low and fmt == "text":
        click.echo(f"below the threshold {threshold}: " + ", ".join(f"{a.name} ({a.score})" for a in low), err=True)
    sys.exit(EXIT_FINDINGS if low else EXIT_OK)
