"""`loopdsl runs`, `show` and `clean`: what the run store holds."""
from __future__ import annotations

import json

import click

from ..adapters.terminal import runs_table, show_text
from ..adapters.terminal_safe import visible, visible_json
from ..api.records import clean as clean_worktrees, list_runs, show_run
from ..runtime.run_state import RunState
from .output import store_option
from .temporal_commands import namespace_option, temporal_option
from . import temporal_commands as on_temporal

LISTED = ("run_id", "loop", "status", "started_at", "ended_at", "ledger")


@click.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@temporal_option
@namespace_option
def runs(store: str | None, as_json: bool, temporal: str | None, namespace: str) -> None:
    """List the runs in the store, newest first."""
    if temporal:
        on_temporal.list_runs(temporal, namespace, as_json)
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
@temporal_option
@namespace_option
def show(run_id: str, store: str | None, as_json: bool, temporal: str | None, namespace: str) -> None:
    """Show a run: path, per-state results, gates, usage and cost, files."""
    if temporal:
        on_temporal.show_run(run_id, temporal, namespace, as_json)
        return
    view = show_run(run_id, store)
    if as_json:
        click.echo(visible_json(json.dumps({"run": view.record, "events": view.events, "children": view.children},
                                           indent=2, ensure_ascii=False, default=str)))
    else:
        click.echo(visible(show_text(RunState.from_json(view.record), view.events,
                                     [RunState.from_json(c) for c in view.children])))


@click.command()
@store_option
def clean(store: str | None) -> None:
    """Remove worktrees left by runs that did not complete (their branches stay)."""
    removed = clean_worktrees(store)
    click.echo(f"removed {len(removed)} worktree(s)" + (": " + ", ".join(removed) if removed else ""))
