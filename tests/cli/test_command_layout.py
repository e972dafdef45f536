"""The CLI's shape: commands load lazily, user errors form one family, caught in one place."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from loopdsl.adapters.git_worktree import SecretInCommit, WorkspaceError
from loopdsl.adapters.store.lock import RunChanged
from loopdsl.adapters.store.run_store import RunLocked
from loopdsl.api.runs import UsageError
from loopdsl.cli import cli
from loopdsl.cli.summaries import SUMMARIES
from loopdsl.language.errors import LoopdslError
from loopdsl.language.inputs import InputError
from loopdsl.language.packaged_loops import PackageError
from loopdsl.project.export import ExportError
from loopdsl.project.init import InitError
from loopdsl.project.install_source import InstallSourceError
from loopdsl.project.schedule import ScheduleError
from loopdsl.runtime.errors import ScriptError, ScriptExhausted, StoreError
from cli_forked import loopdsl_command

ROOT = Path(__file__).resolve().parents[2]
LOOP = ROOT / "tests" / "data" / "project" / "strong" / "loops" / "notes.yaml"

PROBE = """import sys
from loopdsl.cli import main
try:
    main()
except SystemExit:
    pass
print(__import__("json").dumps(sorted(m for m in sys.modules if m.startswith(("loopdsl", "litellm")))), file=sys.stderr)
"""


def _modules_loaded_by(*args: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_lint_loads_no_engine_api_or_project_module() -> None:
    loaded = _modules_loaded_by("lint", str(LOOP))
    assert "loopdsl.lint.pipeline" in loaded
    heavy = [m for m in loaded if m.startswith(("loopdsl.runtime.engine", "loopdsl.api.runs", "loopdsl.api.durable",
                                                "loopdsl.project", "loopdsl.cli.run_commands", "litellm"))]
    assert heavy == []


def test_graph_loads_neither_the_engine_nor_litellm() -> None:
    loaded = _modules_loaded_by("graph", str(LOOP))
    assert "loopdsl.cli.loop_commands" in loaded
    assert [m for m in loaded if m.startswith(("loopdsl.runtime.engine", "litellm"))] == []


def test_show_loads_neither_the_engine_nor_templates(tmp_path: Path) -> None:
    loaded = _modules_loaded_by("show", "no-such-run", "--store", str(tmp_path))
    assert "loopdsl.api.records" in loaded
    assert [m for m in loaded if m.startswith(("loopdsl.runtime.engine", "loopdsl.api.runs", "loopdsl.runtime.actions",
                                               "loopdsl.language.templates", "litellm"))] == []


def test_every_lazy_command_resolves_under_its_own_name() -> None:
    commands = cli.all_commands()
    assert set(commands) == set(cli.lazy_commands)
    for name, command in commands.items():
        assert isinstance(command, click.Command)
        assert command.name == name


def test_every_summary_shortens_to_its_commands_own_help() -> None:
    """`loopdsl --help` lists commands from SUMMARIES: at every width it must read exactly as
    click would list the imported command."""
    commands = cli.all_commands()
    assert set(SUMMARIES) == set(commands)
    for name, command in commands.items():
        assert not command.hidden and not command.deprecated and not command.short_help
        for limit in (10, 25, 45, 60, 80, 120, 400):
            assert click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit) == \
                command.get_short_help_str(limit), (name, limit)


def test_help_lists_every_command_without_importing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    done = subprocess.run([sys.executable, "-c", PROBE, "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert [m for m in loaded if m.startswith("loopdsl.cli.") and m.endswith(("_command", "_commands"))] == []
    assert "loopdsl.language.model" not in loaded
    listed = done.stdout.split("Commands:\n", 1)[1]
    cli.all_commands()  # every command imported: click lists them from their docstrings
    monkeypatch.setenv("COLUMNS", "80")  # the same width as the child's
    context = click.Context(cli)
    formatter = context.make_formatter()
    cli.format_commands(context, formatter)
    assert listed == formatter.getvalue().split("Commands:\n", 1)[1]


def test_every_user_error_is_a_loopdsl_error_with_its_exit_code() -> None:
    for kind in (UsageError, InputError, PackageError, StoreError, RunLocked, WorkspaceError, SecretInCommit,
                 ScheduleError, ExportError, InstallSourceError, InitError):
        error = kind("what happened", "how to fix it")
        assert isinstance(error, LoopdslError)
        assert (error.message, error.hint, error.exit_code) == ("what happened", "how to fix it", 2)
    assert RunChanged("moved on").exit_code == 5
    for kind in (ScriptError, ScriptExhausted):
        error = kind("replies.yaml: no reply for 'draft'")
        assert isinstance(error, LoopdslError) and str(error) == "replies.yaml: no reply for 'draft'"
        assert error.message == "reply script: replies.yaml: no reply for 'draft'"
    assert isinstance(ScriptError("x"), ValueError)


def test_a_user_error_from_any_command_is_a_message_not_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([*loopdsl_command(), "lock", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith(f"loopdsl: error: no loop files under {tmp_path}\n  hint: a loop file is")
    assert "Traceback" not in done.stderr


def test_lock_says_which_path_is_missing_and_which_loops_do_not_load(tmp_path: Path) -> None:
    from cli_in_process import cli_in_process

    gone = cli_in_process(["lock", "nope"], tmp_path)
    assert gone.returncode == 2 and "no such file or folder: nope" in gone.stderr, gone.stderr
    (tmp_path / "broken.yaml").write_text("loopdsl: 1\nname: b\n")
    broken = cli_in_process(["lock", "broken.yaml"], tmp_path)
    assert broken.returncode == 2 and "no loadable loop files under broken.yaml" in broken.stderr
    assert "hint: lint them: `loopdsl lint broken.yaml`" in broken.stderr
