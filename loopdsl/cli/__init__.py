"""The `loopdsl` command line: parses flags, calls the API, prints.

Each command group lives in its own module, imported only when one of its commands runs
(or help lists them), so `loopdsl lint` loads neither the engine nor the project tools.
Every user mistake is a `LoopdslError` (or a `LoopError` with diagnostics), turned into
a message and its documented exit code once, in the group's `invoke`.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import Any

import click

from ..adapters.litellm_loading import claim_process
from ..language.terminal_safe import visible
from ..language.diagnostics import LoopError, format_text
from ..language.errors import LoopdslError
from ..runtime.redaction import redact_printed
from .lazy import LazyGroup
from .output import EXIT_INTERNAL, EXIT_USAGE, fail
from .summaries import SUMMARIES

_COMMANDS = {
    **{name: f"loopdsl.cli.lint_commands:{name}" for name in ("lint", "validate", "lock")},
    **{name: f"loopdsl.cli.run_commands:{name}" for name in ("run", "resume", "approve", "reject", "decide", "abort")},
    **{name: f"loopdsl.cli.store_commands:{name}" for name in ("runs", "show", "clean")},
    **{name: f"loopdsl.cli.loop_commands:{name}" for name in ("graph", "patterns")},
    "test": "loopdsl.cli.test_command:test_command",
    "audit": "loopdsl.cli.audit_command:audit",
    "cost": "loopdsl.cli.cost_command:cost",
    "schedule": "loopdsl.cli.schedule_command:schedule",
    "init": "loopdsl.cli.init_command:init",
    "ui": "loopdsl.cli.ui_command:ui",
    "worker": "loopdsl.cli.temporal_commands:worker",
    **{name: f"loopdsl.cli.github_commands:{name.replace('-', '_')}" for name in ("github-event", "github-store", "github-apply")},
}


class _LoopdslGroup(LazyGroup):
    """The `loopdsl` group: the one place a user's mistake becomes a message and an exit code
    (here rather than in `main`, so that click's test runner sees the same exit codes)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except LoopError as exc:  # the loop file has errors: the diagnostics say where and how to fix them
            click.echo(format_text(exc.diagnostics), err=True)
            sys.exit(EXIT_USAGE)
        except LoopdslError as exc:
            fail(exc.message, exc.hint, exc.exit_code)


@click.group(cls=_LoopdslGroup, lazy_commands=_COMMANDS, summaries=SUMMARIES,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="loopdsl")
def cli() -> None:
    """Run AI agent loops written as validated YAML state machines."""


def _end_on_sigterm(signum: int, _frame: Any) -> None:
    """SIGTERM (docker stop, a cancelled CI job, `timeout`): stop the commands the run has
    running and remove its temporary folders (runtime/scratch.py), then end at once with
    128 + the signal, as a shell reports it. The run is left as kill -9 leaves it (resumable;
    the store is consistent at every commit), but nothing of it runs on. `os._exit`, not the
    signal again: as a container's PID 1 the default action is ignored, and the run would go
    on with its commands killed under it."""
    from ..runtime.commands import kill_running_commands
    from ..runtime.scratch import remove_all

    kill_running_commands()
    remove_all()
    os._exit(128 + signum)


def main() -> None:
    claim_process()  # this process is loopdsl's
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _end_on_sigterm)
    try:
        os.getcwd()
    except FileNotFoundError:  # every command resolves paths against it: say so once, here
        fail("the current folder no longer exists (it was deleted or moved)", "cd to an existing folder")
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
        click.echo(visible(redact_printed(f"loopdsl: internal error: {type(exc).__name__}: {exc}")), err=True)
        if os.environ.get("LOOPDSL_DEBUG"):
            click.echo(redact_printed(traceback.format_exc()), err=True, nl=False)
        else:
            click.echo("  (set LOOPDSL_DEBUG=1 for the traceback; please report it)", err=True)
        sys.exit(EXIT_INTERNAL)


__all__ = ["cli", "main"]
