"""The `loopdsl` command line: parses flags and calls the Python API, nothing more.

Exit codes (documented in docs/cli.md): 0 completed / clean, 1 findings or a run
that ended other than completed, 2 usage or lint error, 3 internal error, 4 waiting
for a person, 5 another process changed the run first (took it over, or decided).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import click

from ..adapters.terminal_safe import visible, visible_json
from ..language.files import YAML_SUFFIXES, walk

if TYPE_CHECKING:
    from ..api.durable import RunConflict

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL, EXIT_WAITING, EXIT_CHANGED = 0, 1, 2, 3, 4, 5

FORMATS = click.Choice(["text", "json", "github"])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="loopdsl")
def cli() -> None:
    """Run AI agent loops written as validated YAML state machines."""


@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True, help="Output format.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 1).")
@click.option("--locked", is_flag=True, help="Also fail when a pinned file changed since `loopdsl lock`.")
def lint(paths: Sequence[str], fmt: str, strict: bool, locked: bool) -> None:
    """Check loop files (and directories of them) for mistakes."""
    from ..lint.pipeline import run_lint_cli

    code = run_lint_cli(paths, fmt, strict)
    if locked and code in (EXIT_OK, EXIT_FINDINGS):
        code = max(code, _check_lock(paths, fmt))
    sys.exit(code)


def _loop_files(paths: Sequence[str]) -> list[Path]:
    from ..lint.pipeline import is_loop_text

    found: list[Path] = []
    for given in paths:
        path = Path(given)
        candidates = sorted(walk(path, YAML_SUFFIXES)) if path.is_dir() else [path]
        for file in candidates:
            try:
                if is_loop_text(file.read_bytes()[:65536]):
                    found.append(file)
            except OSError:
                continue
    return found


def _loadable(files: Sequence[Path]) -> list[tuple[str, Any]]:
    from ..language.diagnostics import LoopError
    from ..lint.pipeline import load_loop

    loops = []
    for file in files:
        try:
            loops.append((str(file), load_loop(file)))
        except LoopError:
            continue  # lint has reported it already
    return loops


def _check_lock(paths: Sequence[str], fmt: str) -> int:
    from ..language.diagnostics import format_github, format_json, format_text
    from ..lint.lockfile import LOCK_NAME, check_locked, find_lock

    lock = find_lock(Path(paths[0]) if Path(paths[0]).is_dir() else Path(paths[0]).parent)
    if lock is None:
        _fail(f"--locked: no {LOCK_NAME} here or in a parent folder", "run `loopdsl lock` first", EXIT_FINDINGS)
    problems = check_locked(_loadable(_loop_files(paths)), lock)  # type: ignore[arg-type]
    if problems:
        render = {"json": format_json, "github": format_github}.get(fmt)
        click.echo(render(problems) if render else format_text(problems))
        return EXIT_FINDINGS
    return EXIT_OK





@cli.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True, help="Output format.")
@click.option("--strict", is_flag=True, help="Accepted and changes nothing: validate is always strict (warnings fail).")
def validate(paths: Sequence[str], fmt: str, strict: bool) -> None:
    """Same as `lint --strict`: warnings fail too (for users of the older tool; `--strict` is accepted)."""
    from ..lint.pipeline import run_lint_cli

    sys.exit(run_lint_cli(paths, fmt, True))


# ---------------------------------------------------------------- user errors



def _fail(message: str, hint: str = "", code: int = EXIT_USAGE) -> None:
    from ..runtime.redaction import redact_printed

    click.echo(visible(redact_printed(f"loopdsl: error: {message}")), err=True)
    if hint:
        click.echo(visible(redact_printed(f"  hint: {hint}")), err=True)
    sys.exit(code)


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn every known user mistake into a message and exit 2 (never a traceback)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ..api.runs import UsageError
        from ..language.diagnostics import LoopError, format_text
        from ..language.inputs import InputError
        from ..language.packaged_loops import PackageError
        from ..adapters.store.run_store import RunChanged
        from ..runtime.errors import StoreError
        from ..adapters.git_worktree import WorkspaceError

        try:
            return fn(*args, **kwargs)
        except RunChanged as exc:  # lost the run to another process: stop, record nothing
            _fail(exc.message, exc.hint, EXIT_CHANGED)
        except LoopError as exc:
            click.echo(format_text(exc.diagnostics), err=True)
            sys.exit(EXIT_USAGE)
        except (UsageError, InputError, StoreError, WorkspaceError, PackageError) as exc:
            _fail(exc.message, getattr(exc, "hint", ""))
        except _script_errors() as exc:
            _fail(f"reply script: {exc}", "see docs/cli.md, 'Scripted replies'")

    return wrapper


def _script_errors() -> tuple[type[BaseException], ...]:
    from ..runtime.errors import ScriptError, ScriptExhausted

    return (ScriptError, ScriptExhausted)


def _parse_input_pairs(pairs: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            _fail(f"--input {pair!r} is not KEY=VALUE", "e.g. --input max_items=10")
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def _read_inputs_file(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    from ..language.loader import load_text

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        _fail(f"cannot read --inputs file {path}: {exc.strerror or exc}")
    # The loop files' own reader: its bounds (nesting, aliases, size, tags) hold for inputs too.
    doc, problems = load_text(raw, path)
    if doc is None:
        first = problems[0]
        if first.rule == "yaml-empty":
            return {}
        if first.rule == "yaml-not-mapping":
            _fail(f"--inputs file {path} must hold a mapping of input names to values")
        _fail(f"cannot read --inputs file {path}:{first.line}:{first.col}: {first.message}", first.hint)
    return dict(doc.data)


def _listeners(as_json: bool, quiet: bool, budget: dict[str, Any]) -> list[Callable[[dict[str, Any]], None]]:
    from ..adapters.terminal import Progress

    out: list[Callable[[dict[str, Any]], None]] = []
    if as_json:
        out.append(lambda e: click.echo(visible_json(json.dumps(e, ensure_ascii=False, default=str))))
    if not quiet:
        out.append(Progress(budget))
    return out


def _finish(result: Any, as_json: bool, quiet: bool) -> None:
    from ..adapters.terminal import summary

    if as_json:
        click.echo(visible_json(json.dumps({"type": "summary", "run_id": result.run_id, "status": result.status,
                                            "path": result.path, "outputs": result.outputs, "usage": result.usage,
                                            "spent": result.state.ledger}, ensure_ascii=False, default=str)))
    elif not quiet or result.status == "waiting":
        click.echo(visible(summary(result.state, result.store_dir)), err=as_json)
    sys.exit(result.exit_code)


_store_option = click.option("--store", type=click.Path(file_okay=False), envvar="LOOPDSL_STORE",
                             help="Run store directory (default: .loopdsl/ at the repository root).")
_script_option = click.option("--script", type=click.Path(exists=True, dir_okay=False),
                              help="Scripted replies (offline, no API key): state -> replies, checkpoint decisions.")


@cli.command()
@click.argument("loop")
@click.option("--input", "-i", "input_pairs", multiple=True, metavar="KEY=VALUE", help="An input (repeatable), typed per the loop's `inputs`.")
@click.option("--inputs", "inputs_file", type=click.Path(dir_okay=False), help="A YAML/JSON file of inputs.")
@_script_option
@click.option("--dry-run", is_flag=True, help="Walk the graph without side effects; print gates and the worst-case spend.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@_store_option
@click.option("--no-store", is_flag=True, help="Keep the run in memory only (it cannot be resumed).")
@click.option("--cache", is_flag=True, help="Reuse identical LLM responses across runs (cost 0 when reused).")
@_user_errors
def run(loop: str, input_pairs: Sequence[str], inputs_file: str | None, script: str | None, dry_run: bool,
        as_json: bool, quiet: bool, store: str | None, no_store: bool, cache: bool) -> None:
    """Run LOOP (a file, or pkg:NAME from an installed loop package)."""
    from ..api import runs as api

    model = api._resolve_loop(loop)
    if dry_run:
        from ..project.dry_run import dry_run as walk

        report = walk(model)
        click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.to_text())
        sys.exit(EXIT_OK)
    from ..api.durable import budget_caps

    budget = budget_caps(model)
    try:
        result = api.run(model, _read_inputs_file(inputs_file), script=script, store=False if no_store else (store or True),
                         human=None if script else _terminal_human(), cache=cache,
                         listeners=_listeners(as_json, quiet, budget), input_strings=_parse_input_pairs(input_pairs))
    except _conflict() as exc:
        click.echo(visible(f"loopdsl: {exc.message}"), err=True)
        sys.exit(EXIT_OK if exc.skipped else EXIT_FINDINGS)
    _finish(result, as_json, quiet)


def _conflict() -> type["RunConflict"]:
    from ..api.durable import RunConflict

    return RunConflict


def _terminal_human() -> Any:
    from ..adapters.humans import TerminalHuman

    return TerminalHuman()


@cli.command()
@click.argument("run_id")
@_script_option
@click.option("--force", is_flag=True, help="Resume even though the loop file (or an import or skill) changed.")
@click.option("--json", "as_json", is_flag=True, help="One JSON event per line on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr.")
@_store_option
@click.option("--cache", is_flag=True, help="Reuse identical LLM responses across runs.")
@_user_errors
def resume(run_id: str, script: str | None, force: bool, as_json: bool, quiet: bool, store: str | None, cache: bool) -> None:
    """Continue RUN_ID from its last committed state (after a crash or a decision)."""
    from ..api.durable import resume_durable
    import asyncio

    result = asyncio.run(resume_durable(run_id, store=store, script=script, force=force, cache=cache,
                                        human=None if script else _terminal_human(),
                                        listeners=_listeners(as_json, quiet, {})))
    _finish(result, as_json, quiet)


def _decide(run_id: str, choice: str, comment: str, store: str | None) -> None:
    from ..api.durable import decide

    state = decide(run_id, choice, comment, store=store)
    click.echo(f"run {state.run_id}: recorded '{choice}' by {state.decision['by']} at {state.decision['at']}")  # type: ignore[index]
    click.echo(f"continue with: loopdsl resume {state.run_id}")


@cli.command()
@click.argument("run_id")
@click.option("--comment", "-m", default="", help="Why (kept with the decision).")
@_store_option
@_user_errors
def approve(run_id: str, comment: str, store: str | None) -> None:
    """Approve the checkpoint RUN_ID is waiting at."""
    _decide(run_id, "approve", comment, store)


@cli.command()
@click.argument("run_id")
@click.option("--comment", "-m", default="", help="Why (kept with the decision).")
@_store_option
@_user_errors
def reject(run_id: str, comment: str, store: str | None) -> None:
    """Reject the checkpoint RUN_ID is waiting at."""
    _decide(run_id, "reject", comment, store)


@cli.command()
@click.argument("run_id")
@click.argument("choice")
@click.option("--comment", "-m", default="", help="Why (kept with the decision).")
@_store_option
@_user_errors
def decide(run_id: str, choice: str, comment: str, store: str | None) -> None:
    """Record CHOICE (one of the checkpoint's `choices`) for RUN_ID."""
    _decide(run_id, choice, comment, store)


@cli.command()
@click.argument("run_id")
@click.option("--reason", default="", help="Kept in the run's log.")
@_store_option
@_user_errors
def abort(run_id: str, reason: str, store: str | None) -> None:
    """End RUN_ID as aborted (its worktree, if any, is kept)."""
    from ..api.durable import abort as do_abort

    state = do_abort(run_id, store=store, reason=reason)
    click.echo(f"run {state.run_id}: aborted")


@cli.command()
@_store_option
@click.option("--json", "as_json", is_flag=True, help="JSON instead of a table.")
@_user_errors
def runs(store: str | None, as_json: bool) -> None:
    """List the runs in the store, newest first."""
    from ..api.runs import open_store
    from ..adapters.terminal import runs_table

    from ..adapters.store.run_store import default_store_dir

    where = Path(store) if store else default_store_dir(Path.cwd())
    # No store yet simply means no runs yet (and listing must not create one).
    records = [r for r in open_store(where, Path.cwd()).list_runs(check=True) if not r.get("parent")] if where.exists() else []
    if as_json:
        click.echo(visible_json(json.dumps([{**{k: r.get(k) for k in ("run_id", "loop", "status", "started_at", "ended_at", "ledger")},
                                             "interrupted": bool(r.get("interrupted")),
                                             **({"damaged": r["damaged"]} if "damaged" in r else {})} for r in records], indent=2)))
    else:
        click.echo(visible(runs_table(records)))
    for r in records:
        if r.get("status") == "damaged":
            click.echo(visible(f"loopdsl: warning: run {r['run_id']} in {where} is damaged: {r['damaged']}"), err=True)


@cli.command()
@click.argument("run_id")
@_store_option
@click.option("--json", "as_json", is_flag=True, help="The whole record and event log as JSON.")
@_user_errors
def show(run_id: str, store: str | None, as_json: bool) -> None:
    """Show a run: path, per-state results, gates, usage and cost, files."""
    from ..api.runs import open_store
    from ..adapters.terminal import show_text
    from ..runtime.run_state import RunState

    st = open_store(store, Path.cwd(), create=False)
    full = st.resolve(run_id)
    record = st.load_run(full)
    events = st.events(full)
    children = [r for r in st.list_runs(check=True) if r.get("parent") == full and r.get("status") != "damaged"]
    if as_json:
        click.echo(visible_json(json.dumps({"run": record, "events": events, "children": children}, indent=2,
                                          ensure_ascii=False, default=str)))
    else:
        click.echo(visible(show_text(RunState.from_json(record), events, [RunState.from_json(c) for c in children])))


@cli.command()
@_store_option
@_user_errors
def clean(store: str | None) -> None:
    """Remove worktrees left by runs that did not complete (their branches stay)."""
    from ..api.runs import open_store
    from ..adapters.git_worktree import clean_worktrees, find_repo_root

    repo = find_repo_root(Path.cwd())
    if repo is None:
        _fail("not inside a git repository", "run `loopdsl clean` from the repository the runs worked on")
    st = open_store(store, Path.cwd(), create=False)
    active = [r["run_id"] for r in st.list_runs() if r.get("status") in ("running", "waiting")]
    removed = clean_worktrees(repo, st.worktrees_dir, keep=active)  # type: ignore[arg-type]
    click.echo(f"removed {len(removed)} worktree(s)" + (": " + ", ".join(removed) if removed else ""))


@cli.command()
@click.argument("loop")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid", show_default=True)
@_user_errors
def graph(loop: str, fmt: str) -> None:
    """Print LOOP's state machine as Mermaid stateDiagram-v2 (or Graphviz dot)."""
    from ..api.runs import _resolve_loop
    from ..language.compile import machine_config
    from ..language.diagram import to_dot, to_mermaid

    model = _resolve_loop(loop)
    config = machine_config(model)
    click.echo(to_mermaid(model, config) if fmt == "mermaid" else to_dot(model, config), nl=False)


@cli.command()
@click.argument("paths", nargs=-1)
@_user_errors
def lock(paths: Sequence[str]) -> None:
    """Pin every file the loops under PATHS depend on (default: loops/) in loopdsl.lock."""
    from ..lint.lockfile import write_lock

    targets = list(paths) or ["loops"]
    loops = _loadable(_loop_files(targets))
    if not loops:
        _fail(f"no loadable loop files under {', '.join(targets)}", "lint them: `loopdsl lint " + " ".join(targets) + "`")
    written = write_lock([loop for _, loop in loops], Path.cwd())
    click.echo(f"wrote {written} ({len(loops)} loop(s))")


@cli.command()
def patterns() -> None:
    """List loops shipped by installed packages (entry point group loopdsl.loops)."""
    from ..language.packaged_loops import installed_loops

    found = installed_loops()
    if not found:
        click.echo("no loop packages installed (a package ships loops with an entry point in group 'loopdsl.loops')")
        return
    for item in found:
        click.echo(f"pkg:{item.name:<28} {item.distribution} {item.version}")


from .project_commands import register as _register_project_commands  # noqa: E402

_register_project_commands(cli)


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_USAGE)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # an internal bug: say so, exit 3, no traceback dump for users
        import os
        import traceback

        from ..runtime.redaction import redact_printed

        click.echo(visible(redact_printed(f"loopdsl: internal error: {type(exc).__name__}: {exc}")), err=True)
        if os.environ.get("LOOPDSL_DEBUG"):
            click.echo(redact_printed(traceback.format_exc()), err=True, nl=False)
        else:
            click.echo("  (set LOOPDSL_DEBUG=1 for the traceback; please report it)", err=True)
        sys.exit(EXIT_INTERNAL)
