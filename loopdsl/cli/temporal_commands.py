"""The `--temporal` side of the run commands, and `loopdsl worker`: runs as Temporal workflows.

`temporalio` is an optional extra: it is imported here at function level, only when a
command is given `--temporal` (or LOOPDSL_TEMPORAL is set), so the rest of the CLI never
needs it.
"""
from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, NoReturn, Sequence

import click

from ..adapters.terminal import Progress, summary
from ..language.terminal_safe import visible, visible_json
from ..language.errors import LoopdslError
from ..adapters.temporal import connection
from ..adapters.temporal.connection import ADDRESS_ENV, API_KEY_ENV, NAMESPACE_ENV, TLS_ENV, Connection
from ..adapters.temporal.wire import DEFAULT_HEARTBEAT_S, MAX_HEARTBEAT_S, MIN_HEARTBEAT_S
from ..runtime.run_state import RunState
from .output import EXIT_INTERNAL, EXIT_USAGE, print_error

_CONNECTION_OPTIONS = (
    click.option("--temporal", "temporal", envvar=ADDRESS_ENV, metavar="HOST:PORT",
                 help=f"Act on runs kept by this Temporal server (env {ADDRESS_ENV})."),
    click.option("--namespace", default="default", envvar=NAMESPACE_ENV, show_default=True,
                 help=f"Temporal namespace (env {NAMESPACE_ENV})."),
    click.option("--tls-cert", envvar=TLS_ENV["tls_cert"], metavar="PEM",
                 help="mTLS client certificate for --temporal (env LOOPDSL_TEMPORAL_TLS_CERT)."),
    click.option("--tls-key", envvar=TLS_ENV["tls_key"], metavar="PEM",
                 help="Its private key (env LOOPDSL_TEMPORAL_TLS_KEY)."),
    click.option("--tls-ca", envvar=TLS_ENV["tls_ca"], metavar="PEM",
                 help="CA that signed the server's certificate (default: the system's; env LOOPDSL_TEMPORAL_TLS_CA)."),
    click.option("--tls-server-name", metavar="NAME", help="Server name to verify, when it differs from the host."),
    click.option("--tls/--no-tls", "tls", default=None,
                 help=f"TLS to the server (default: on with any TLS option or {API_KEY_ENV}, which holds a "
                      "Temporal Cloud API key: it is read from the environment only)."),
)


def connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The Temporal connection options of every `--temporal` command, given to the command
    as one `temporal` argument: a Connection, or None (no --temporal: the local backend)."""

    @functools.wraps(command)
    def wrapper(*args: Any, temporal: str | None, namespace: str, tls_cert: str | None, tls_key: str | None,
                tls_ca: str | None, tls_server_name: str | None, tls: bool | None, **kwargs: Any) -> Any:
        conn = connection.build(temporal, namespace, tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca,
                                tls_server_name=tls_server_name, tls=tls)
        return command(*args, temporal=conn, **kwargs)

    for option in reversed(_CONNECTION_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


queue_option = click.option("--task-queue", "task_queue", default="loopdsl", envvar="LOOPDSL_TASK_QUEUE",
                            show_default=True, help="Temporal task queue the workers poll.")
EXIT_CODES = {"completed": 0, "waiting": 4}
# How long a decision waits for a worker to accept it before saying none is polling.
DECIDE_WAIT_S = 20.0


def _adapter(name: str) -> ModuleType:
    try:
        # Optional dependency: only `--temporal` commands need the SDK.
        import importlib

        return importlib.import_module(f"loopdsl.adapters.temporal.{name}")
    except ImportError as exc:
        if "temporalio" not in str(exc):
            raise
        raise LoopdslError("the Temporal backend needs the `temporal` extra (the temporalio SDK is not installed)",
                           "pip install 'loopdsl[temporal]'", exit_code=EXIT_USAGE) from None


def _run(main: Any) -> Any:
    """Runs a client coroutine. A process that used the Temporal client ends through
    `leave`: the SDK's native threads can abort an interpreter that finalizes under them."""
    try:
        return asyncio.run(main)
    except LoopdslError as exc:
        _fail(exc.message, exc.hint, exc.exit_code)
    except Exception as exc:
        from temporalio.service import RPCError  # the client's own error type (an optional extra)

        if not isinstance(exc, RPCError):
            _fail(f"internal error: {type(exc).__name__}: {exc}", "please report it", EXIT_INTERNAL)
        # The server refused what it was asked: a namespace it does not have, a task queue name
        # or an input over its limits.
        _fail(f"the Temporal server refused: {exc.message}",
              "check the address, the namespace and the task queue, and what the run was given", EXIT_USAGE)


def _fail(message: str, hint: str, code: int) -> NoReturn:
    print_error(message, hint)
    leave(code)


def leave(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def repo_root(start: Path) -> Path:
    """A worker serves the repository it is started in; a client names loop files relative to it."""
    from ..adapters.git_worktree import find_repo_root

    return find_repo_root(start) or start.resolve()


def _connect(conn: Connection) -> Any:
    return _adapter("client").connect(conn)


def serve_worker(conn: Connection, task_queue: str, heartbeat_sticky_s: float, models: bool = True,
                 grace_s: float = 0.0) -> None:
    from ..api.run_environment import command_environment

    worker = _adapter("worker")
    root = repo_root(Path.cwd())

    def base_env() -> dict[str, str]:
        return command_environment(None, {}, root)  # type: ignore[arg-type]  # no loop: no declared secrets

    def ready() -> None:
        click.echo(f"loopdsl worker: serving {root} on task queue '{task_queue}' at {conn.describe()}; "
                   "Ctrl-C or SIGTERM stops it", err=True)

    def stopping(why: str) -> None:
        finish = f"running states get up to {grace_s:g} s to finish" if grace_s else "running states are cut off"
        click.echo(f"loopdsl worker: stopping ({why}): no new work is taken; {finish}", err=True)

    async def main() -> None:
        client = await _connect(conn)
        await worker.serve(client, task_queue, root, base_env, sticky_timeout_s=heartbeat_sticky_s, ready=ready,
                           stopping=stopping, models=models, grace_s=grace_s)

    try:
        _run(main())
    except KeyboardInterrupt:
        pass
    leave(0)


def _print_events(as_json: bool, quiet: bool, caps: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    progress = None if quiet or as_json else Progress(caps)

    def show(event: dict[str, Any]) -> None:
        if as_json:
            click.echo(visible_json(json.dumps(event, ensure_ascii=False, default=str)))
        elif progress is not None:
            progress(event)

    return show


def finish(record: dict[str, Any], as_json: bool, address: str) -> None:  # address: for the hint it prints
    state = RunState.from_json(record)
    if as_json:
        click.echo(visible_json(json.dumps({"type": "summary", "run_id": state.run_id, "status": state.status,
                                            "path": state.path, "outputs": state.outputs, "usage": state.usage,
                                            "spent": state.ledger}, ensure_ascii=False, default=str)))
    else:
        lines = [line for line in summary(state).splitlines() if "loopdsl resume" not in line and "decide with" not in line]
        if state.status == "waiting":
            lines.append(f"  decide with: loopdsl approve {state.run_id} --temporal {address}  |  "
                         f"loopdsl reject {state.run_id} --temporal {address}  (the run continues by itself)")
        click.echo(visible("\n".join(lines)))
    published = state.meta.get("publish")
    if state.status == "completed" and isinstance(published, dict) and published.get("status") == "failed":
        from ..runtime.publish import EXIT_PUBLISH

        click.echo(visible(f"loopdsl: {published.get('error') or 'publish failed'} (the run completed; its branch "
                           "is kept)"), err=True)
        leave(EXIT_PUBLISH)
    leave(EXIT_CODES.get(state.status, 1))


def _resolve(loop_ref: str) -> Any:
    from ..api.runs import resolve_loop

    return resolve_loop(loop_ref)


def _request(model: Any, loop_ref: str, script: str | None, values: dict[str, Any], root: Path, *,
             force: bool) -> dict[str, Any]:
    """What a worker needs to start the run: paths relative to the repository, the file hashes."""
    from ..api.runs import _run_date

    loops = _adapter("loops")
    loop_path = loops.relative(model.source, root) if model.source else loop_ref
    script_path = loops.relative(script, root) if script else None
    loops.set_root(root)
    try:
        files = dict(loops.load(loop_path, script_path).files)
    except loops.OutsideRoot as exc:  # the workers would refuse it: say so before starting anything
        raise LoopdslError(str(exc), "run it from the repository that holds it, or copy it into this one") from None
    return {"loop_path": loop_path, "script": script_path, "inputs": values, "files": files,
            "date": _run_date(model), "force": force,
            "heartbeat_s": _env_number("LOOPDSL_TEMPORAL_HEARTBEAT_S", DEFAULT_HEARTBEAT_S, MIN_HEARTBEAT_S,
                                       MAX_HEARTBEAT_S),
            # Events a history holds before the run continues as new (default in the workflow).
            "max_history_events": int(_env_number("LOOPDSL_TEMPORAL_HISTORY_EVENTS", 0, 0, 1_000_000)) or None}


def _env_number(name: str, default: float, low: float, high: float) -> float:
    """A number from the environment within [low, high] (a NaN or negative heartbeat once left
    a started run failing every workflow task, for good)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # NaN too
        raise LoopdslError(f"{name}={raw[:40]!r} is not a number from {low:g} to {high:g}",
                           f"unset it for the default ({default:g})")
    return value


def start_run(loop_ref: str, values: dict[str, Any], script: str | None, *, conn: Connection,
              task_queue: str, detach: bool, as_json: bool, quiet: bool, force: bool = False,
              publish: bool = True) -> None:
    from ..api.durable import budget_caps

    client_mod = _adapter("client")
    model = _resolve(loop_ref)
    request = {**_request(model, loop_ref, script, values, repo_root(Path.cwd()), force=force), "publish": publish}

    async def main() -> dict[str, Any] | None:
        client = await _connect(conn)
        run_id = client_mod.new_run_id(model.name)
        await client_mod.start(client, request, task_queue=task_queue, run_id=run_id)
        click.echo(f"run {run_id} started on task queue '{task_queue}'", err=True)
        if detach:
            click.echo(run_id)
            return None
        return await client_mod.follow(client, run_id, _print_events(as_json, quiet, budget_caps(model)))

    record = _run(main())
    if record is not None:
        finish(record, as_json, conn.address)
    leave(0)


def export_schedule(loop_ref: str, *, conn: Connection, task_queue: str) -> None:
    from ..project.schedule import require_schedule

    schedules = _adapter("schedules")
    model = _resolve(loop_ref)
    require_schedule(model)
    root = repo_root(Path.cwd())
    request = _request(model, loop_ref, None, {}, root, force=False)
    request.pop("date")  # each scheduled run takes its own date, in the schedule's time zone
    request["timezone"] = model.schedule.timezone

    async def main() -> tuple[str, bool]:
        return await schedules.export(await _connect(conn), model, request, task_queue, root.name)

    sid, created = _run(main())
    click.echo(f"{'created' if created else 'updated'} Temporal schedule {sid}: {model.schedule.cron!r} in "
               f"{model.schedule.timezone}, task queue '{task_queue}'")
    leave(0)


def decide_run(run_id: str, choice: str, comment: str, *, conn: Connection, force: bool = False) -> None:
    from ..adapters.humans import who

    client_mod = _adapter("client")

    async def main() -> dict[str, Any]:
        client = await _connect(conn)
        try:
            return await asyncio.wait_for(client_mod.decide(client, run_id, choice, comment, who(), force), DECIDE_WAIT_S)
        except asyncio.TimeoutError:
            raise LoopdslError(f"run {run_id}: no worker accepted the decision within {DECIDE_WAIT_S:g}s",
                               "start a worker on the run's task queue: `loopdsl worker --temporal ...`",
                               exit_code=EXIT_USAGE) from None

    out = _run(main())
    click.echo(f"run {run_id}: recorded '{out['decision']}' by {out['by']} at {out['at']}; the run continues on its worker")
    leave(0)


def abort_run(run_id: str, *, conn: Connection, reason: str = "") -> None:
    client_mod = _adapter("client")

    async def main() -> None:
        await client_mod.abort(await _connect(conn), run_id, reason)

    _run(main())
    click.echo(f"run {run_id}: abort requested (cancellation); it ends as aborted")
    leave(0)


def list_runs(conn: Connection, as_json: bool) -> None:
    client_mod = _adapter("client")

    async def main() -> list[dict[str, Any]]:
        return await client_mod.list_runs(await _connect(conn))

    rows = _run(main())
    if as_json:
        click.echo(visible_json(json.dumps(rows, indent=2)))
    else:
        click.echo(f"{'ID':<32} {'LOOP':<20} {'STATUS':<17} STARTED")
        for r in rows:
            click.echo(visible(f"{r['run_id']:<32} {r.get('loop', '')[:20]:<20} {r['status']:<17} {r['started']}"))
    leave(0)


def show_run(run_id: str, conn: Connection, as_json: bool) -> None:
    from ..adapters.terminal import show_text

    client_mod = _adapter("client")

    async def main() -> dict[str, Any]:
        return await client_mod.snapshot(await _connect(conn), run_id)

    view = _run(main())
    if as_json:
        click.echo(visible_json(json.dumps(view, indent=2, ensure_ascii=False, default=str)))
    elif not view["run"]:  # its worker is still loading the loop (the `prepare` activity)
        click.echo(visible(f"run {run_id}: starting (a worker is loading its loop)"))
    else:
        children = [RunState(run_id=c["run_id"], loop=c.get("loop") or "", start="", status=c.get("status") or "",
                             path=list(c.get("path") or []), ledger=dict(c.get("ledger") or {}))
                    for c in view.get("children") or []]
        click.echo(visible(show_text(RunState.from_json(view["run"]), view["events"], children)))
    leave(0)


def _seconds(value: float, low: float, high: float) -> float:
    """A number of seconds the SDK can take (a NaN, a negative or an infinite one failed inside it)."""
    if not low <= value <= high:  # NaN too
        raise click.BadParameter(f"{value:g} is not a number of seconds from {low:g} to {high:g}")
    return value


@click.command()
@connection_options
@queue_option
@click.option("--sticky-timeout", "sticky_s", type=float, default=10.0, show_default=True,
              callback=lambda _c, _p, value: _seconds(value, 0.1, 86_400.0),
              help="Seconds before another worker takes over a run whose worker stopped answering.")
@click.option("--no-models", is_flag=True,
              help="Make no model calls (runs started with --script and loops without models are served): starts "
                   "in a fraction of the time, as LiteLLM is never imported; a real model call fails.")
@click.option("--grace", "grace_s", type=float, default=0.0, show_default=True,
              callback=lambda _c, _p, value: _seconds(value, 0.0, 86_400.0),
              help="On SIGTERM or Ctrl-C, seconds the states running here get to finish before they are cut off "
                   "(set it below the time your service manager waits before it kills).")
def worker(temporal: Connection | None, task_queue: str, sticky_s: float, no_models: bool, grace_s: float) -> None:
    """Run loops from Temporal in this repository (loop files, commands and worktrees are here)."""
    if not temporal:
        raise LoopdslError("`loopdsl worker` needs --temporal HOST:PORT (or LOOPDSL_TEMPORAL)",
                           "e.g. loopdsl worker --temporal localhost:7233")
    serve_worker(temporal, task_queue, sticky_s, models=not no_models, grace_s=grace_s)


__all__: Sequence[str] = ["worker", "start_run", "decide_run", "abort_run", "list_runs", "show_run",
                          "connection_options", "queue_option"]
