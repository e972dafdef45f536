"""`loopdsl run`, `resume`, `approve`, `reject`, `decide` and `abort`: start, continue and steer runs."""
from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import click
from click.core import ParameterSource

from ..adapters.humans import TerminalHuman
from ..adapters.terminal import Progress, summary
from ..language.terminal_safe import visible, visible_json
from ..api import runs as api
from ..api.durable import RunConflict, abort as abort_run, budget_caps, decide as record_decision, resume_durable
from ..language.files import read_capped
from ..language.loader import load_text
from ..language.inputs import check_file_values, coerce_inputs
from ..project.dry_run import dry_run as walk
from .output import EXIT_FINDINGS, EXIT_OK, fail, script_option, store_option
from .temporal_commands import Connection, connection_options, queue_option
from . import temporal_commands as on_temporal


def _parse_input_pairs(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            fail(f"--input {pair!r} is not KEY=VALUE", "e.g. --input max_items=10")
        key, value = pair.split("=", 1)
        if key.strip() in out:  # the last one won, silently
            fail(f"--input {key.strip()!r} is given twice", f"give it once: --input {key.strip()}=VALUE")
        out[key.strip()] = value
    return out


def _read_inputs_file(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        raw = read_capped(path)
    except OSError as exc:
        fail(f"cannot read --inputs file {path}: {exc.strerror or exc}")
    # The loop files' own reader: its bounds (nesting, aliases, size, tags) hold for inputs too.
    doc, problems = load_text(raw, path)
    if doc is None:
        first = problems[0]
        if first.rule == "yaml-empty":
            return {}
        if first.rule == "yaml-not-mapping":
            fail(f"--inputs file {path} must hold a mapping of input names to values")
        fail(f"cannot read --inputs file {path}:{first.line}:{first.col}: {first.message}", first.hint)
    return dict(doc.data)


def _listeners(as_json: bool, quiet: bool, budget: dict[str, Any]) -> list[Callable[[dict[str, Any]], None]]:
    out: list[Callable[[dict[str, Any]], None]] = []
    if as_json:
        out.append(lambda e: click.echo(visible_json(json.dumps(e, ensure_ascii=False, default=str))))
    if not quiet:
        out.append(Progress(budget))
    return out


def _finish(result: api.RunResult, as_json: bool, quiet: bool) -> None:
    if as_json:
        click.echo(visible_json(json.dumps({"type": "summary", "run_id": result.run_id, "status": result.status,
                                            "path": result.path, "outputs": result.outputs, "usage": result.usage,
                                            "spent": result.state.ledger}, ensure_ascii=False, default=str)))
    elif not quiet or result.status == "waiting":
        click.echo(visible(summary(result.state, result.store_dir)), err=as_json)
    sys.exit(result.exit_code)


@click.command()
@click.argument("loop")
@click.option("--input", "-i", "input_pairs", multiple=True, metavar="KEY=VALUE", help="An input (repeatable), typed per the loop's `inputs`.")
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False), help="A YAML/JSON file of inputs.")
@script_option
@click.option("--dry-run", is_flag=True, help="Walk the graph without side effects; print gates and the worst-case spend.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@store_option
@click.option("--no-store", is_flag=True, help="Keep the run in memory only (it cannot be resumed).")
@click.option("--cache", is_flag=True, help="Reuse identical LLM responses across runs (cost 0 when reused).")
@click.option("--no-publish", is_flag=True, help="Plan the loop's `publish:` writes but make none; `resume` makes them.")
@connection_options
@queue_option
@click.option("--detach", is_flag=True, help="With --temporal: print the run id and return without following it.")
def run(loop: str, input_pairs: Sequence[str], inputs_file: str | None, script: str | None, dry_run: bool,
        as_json: bool, quiet: bool, store: str | None, no_store: bool, cache: bool, no_publish: bool,
        temporal: Connection | None, task_queue: str, detach: bool) -> None:
    """Run LOOP (a file, or pkg:NAME from an installed loop package)."""
    if no_store and store and click.get_current_context().get_parameter_source("store") == ParameterSource.COMMANDLINE:
        fail("--store and --no-store together", "keep one: --no-store keeps the run in memory, where nothing can resume it")
    if detach and not temporal:  # a local run is followed to its end: nothing to detach from
        fail("--detach is for runs on Temporal", "add --temporal HOST:PORT, or leave --detach out")
    model = api.resolve_loop(loop)
    given, strings = _read_inputs_file(inputs_file), _parse_input_pairs(input_pairs)
    if inputs_file:  # an --input given too wins over the file's value
        check_file_values(model, {k: v for k, v in given.items() if k not in strings}, inputs_file)
    if dry_run:  # the inputs are checked as a run would check them (a wrong one passed the dry run)
        coerce_inputs(model, given, strings)
        report = walk(model)
        click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.to_text())
        sys.exit(EXIT_OK)
    if temporal:
        values = coerce_inputs(model, given, strings)
        if script:  # as a local run checks it (api.run), before the workflow starts
            api.load_script(model, script)
        on_temporal.start_run(loop, values, script, conn=temporal, task_queue=task_queue,
                              detach=detach, as_json=as_json, quiet=quiet, publish=not no_publish)
    try:
        result = api.run(model, given, script=script, store=False if no_store else (store or True),
                         human=None if script else TerminalHuman(), cache=cache,
                         listeners=_listeners(as_json, quiet, budget_caps(model)),
                         input_strings=strings, publish=not no_publish)
    except RunConflict as exc:
        click.echo(visible(f"loopdsl: {exc.message}"), err=True)
        sys.exit(EXIT_OK if exc.skipped else EXIT_FINDINGS)
    _finish(result, as_json, quiet)


@click.command()
@click.argument("run_id")
@script_option
@click.option("--force", is_flag=True, help="Resume even though the loop file (or an import or skill) changed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@store_option
@click.option("--cache", is_flag=True, help="Reuse identical LLM responses across runs.")
def resume(run_id: str, script: str | None, force: bool, as_json: bool, quiet: bool, store: str | None, cache: bool) -> None:
    """Continue RUN_ID from its last committed state (after a crash or a decision)."""
    result = asyncio.run(resume_durable(run_id, store=store, script=script, force=force, cache=cache,
                                        human=None if script else TerminalHuman(),
                                        listeners=_listeners(as_json, quiet, {})))
    _finish(result, as_json, quiet)


def _decide(run_id: str, choice: str, comment: str, store: str | None, temporal: Connection | None = None,
            force: bool = False) -> None:
    if temporal:
        on_temporal.decide_run(run_id, choice, comment, conn=temporal, force=force)
        return
    if force:  # locally the files are checked when the run resumes, not when it is decided
        fail("--force on a decision is for runs on Temporal (--temporal)",
             f"locally: record the decision, then `loopdsl resume {run_id} --force`")
    state = record_decision(run_id, choice, comment, store=store)
    by, at = state.decision["by"], state.decision["at"]  # type: ignore[index]
    click.echo(visible(f"run {state.run_id}: recorded '{choice}' by {by} at {at}"))
    where = f" --store {shlex.quote(store)}" if store else ""  # the same store, or the resume finds none
    click.echo(f"continue with: loopdsl resume {state.run_id}{where}")


_comment_option = click.option("--comment", "-m", default="", help="Why (kept with the decision).")
_force_option = click.option("--force", is_flag=True, help="With --temporal: go on even though the loop file (or an "
                             "import or skill) changed on the worker since the run started.")


@click.command()
@click.argument("run_id")
@_comment_option
@store_option
@connection_options
@_force_option
def approve(run_id: str, comment: str, store: str | None, temporal: Connection | None, force: bool) -> None:
    """Approve the checkpoint RUN_ID is waiting at."""
    _decide(run_id, "approve", comment, store, temporal, force)


@click.command()
@click.argument("run_id")
@_comment_option
@store_option
@connection_options
@_force_option
def reject(run_id: str, comment: str, store: str | None, temporal: Connection | None, force: bool) -> None:
    """Reject the checkpoint RUN_ID is waiting at."""
    _decide(run_id, "reject", comment, store, temporal, force)


@click.command()
@click.argument("run_id")
@click.argument("choice")
@_comment_option
@store_option
@connection_options
@_force_option
def decide(run_id: str, choice: str, comment: str, store: str | None, temporal: Connection | None, force: bool) -> None:
    """Record CHOICE (one of the checkpoint's `choices`) for RUN_ID."""
    _decide(run_id, choice, comment, store, temporal, force)


@click.command()
@click.argument("run_id")
@click.option("--reason", default="", help="Kept in the run's log.")
@store_option
@connection_options
def abort(run_id: str, reason: str, store: str | None, temporal: Connection | None) -> None:
    """End RUN_ID as aborted (its worktree, if any, is kept)."""
    if temporal:
        on_temporal.abort_run(run_id, conn=temporal, reason=reason)
        return
    state = abort_run(run_id, store=store, reason=reason)
    click.echo(f"run {state.run_id}: aborted")
