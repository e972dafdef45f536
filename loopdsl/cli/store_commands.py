"""`loopdsl runs`, `show` and `clean`: what the run store holds."""
from __future__ import annotations

import json
from pathlib import Path

import click

from ..adapters.terminal import run_status, runs_table, show_text, transcript_text
from ..language.terminal_safe import visible, visible_json
from ..adapters.store.run_store import default_store_dir
from ..api.records import clean as clean_worktrees, list_runs, show_run
from ..runtime.run_state import RunState
from .output import store_option, write_text
from .temporal_commands import Connection, connection_options
from . import temporal_commands as on_temporal

LISTED = ("run_id", "loop", "status", "started_at", "ended_at", "ledger")


@click.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@connection_options
def runs(store: str | None, as_json: bool, temporal: Connection | None) -> None:
    """List the runs in the store, newest first."""
    if temporal:
        on_temporal.list_runs(temporal, as_json)
        return
    listing = list_runs(store)
    if as_json:
        click.echo(visible_json(json.dumps([{**{k: r.get(k) for k in LISTED}, "interrupted": bool(r.get("interrupted")),
                                             **({"damaged": r["damaged"]} if "damaged" in r else {})}
                                            for r in listing.records], indent=2)))
    else:
        click.echo(visible(runs_table(listing.records)))
    for r in listing.damaged:
        click.echo(visible(f"loopdsl: warning: run {r['run_id']} in {listing.where} is damaged: {r['damaged']}"), err=True)


@click.command()
@click.argument("run_id")
@store_option
@click.option("--json", "as_json", is_flag=True, help="The whole record and event log as JSON.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False),
              help="Write the run's page (as `loopdsl ui` shows it) to this file, one static HTML file.")
@click.option("--transcript", is_flag=True,
              help="Each model call's prompt messages and reply (an agent's tool calls and results too), redacted.")
@connection_options
def show(run_id: str, store: str | None, as_json: bool, html_file: str | None, transcript: bool,
         temporal: Connection | None) -> None:
    """Show a run: path, per-state results, gates, usage and cost, files."""
    if temporal:
        on_temporal.show_run(run_id, temporal, as_json)
        return
    view = show_run(run_id, store, transcript=transcript or bool(html_file))
    if html_file:
        from ..ui.pages import run_page  # Jinja only; the web server's extra is not needed

        where = Path(store) if store else default_store_dir(Path.cwd())
        write_text(run_page(view, store=where), html_file)
        click.echo(f"wrote the page of run {view.record.get('run_id')} to {html_file}", err=True)
    elif as_json:
        shown = {"run": view.record, "events": view.events, "children": view.children}
        if transcript:
            shown["transcript"] = view.transcript
        click.echo(visible_json(json.dumps(shown, indent=2, ensure_ascii=False, default=str)))
    elif transcript:
        click.echo(visible(transcript_text(view.transcript)))
    else:
        click.echo(visible(show_text(RunState.from_json(view.record), view.events,
                                     [RunState.from_json(c) for c in view.children], status=run_status(view.record))))


@click.command()
@store_option
def clean(store: str | None) -> None:
    """Remove worktrees left by runs that did not complete (their branches stay)."""
    removed = clean_worktrees(store)
    click.echo(f"removed {len(removed)} worktree(s)" + (": " + ", ".join(removed) if removed else ""))
