"""`loopdsl ARGS` through click's test runner in the test process: the same command group,
exit codes, stdout and stderr as `python -m loopdsl`, without a Python start per command.

For tests whose point is a command's answer, not the process boundary; each such file keeps
at least one real-subprocess case. An exception that is not an exit (which `python -m loopdsl`
would report as an internal error) fails the test here.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from click.testing import CliRunner

from loopdsl.cli import cli
from loopdsl.runtime import redaction


def cli_in_process(args: Sequence[str], cwd: Path | None = None, env: Mapping[str, str] | None = None,
                   *, only_env: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the command in `cwd` with `env` added to the environment (with `only_env`, `env` is
    the whole environment, as `subprocess.run(env=...)`); LOOPDSL_* variables are unset
    unless `env` sets them, as the subprocess helpers of the suite do."""
    changes: dict[str, str | None] = {
        name: None for name in os.environ if only_env or name.startswith("LOOPDSL_")}
    changes.update(env or {})
    here = Path.cwd()
    # The secrets a command reads stay in a process-wide set for its error messages; a
    # `python -m loopdsl` process ends with its command, so forget them here as it would
    # (else another test's secret redacts this command's output).
    secrets_read_before = set(redaction._READ)
    if cwd is not None:
        os.chdir(cwd)
    try:
        done = CliRunner().invoke(cli, list(args), env=changes)
    finally:
        os.chdir(here)
        redaction._READ.intersection_update(secrets_read_before)
    assert done.exception is None or isinstance(done.exception, SystemExit), done.exc_info
    return subprocess.CompletedProcess(list(args), done.exit_code, done.stdout, done.stderr)
