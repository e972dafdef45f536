"""`cwd` is a folder inside the workspace, whatever a template renders it to: an absolute
path, a `..` part or a symlink that leads out fails the state (or gate) with a clear
message, and the command does not run. `loopdsl run` in-process (tests/cli_in_process.py),
and as a real process for one case of each kind."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402
from cli_forked import loopdsl_command

LOOP = """\
loopdsl: 1
name: pkg-build
description: runs a command in a package folder
inputs:
  pkg: {type: string}
budget: {steps: 5}
start: build
states:
  build:
    shell:
      cmd: pwd > "$LOOPDSL_WORKDIR/ran-in"
      cwd: "{{ inputs.pkg }}"
    gates:
      before:
        - shell: {cmd: "true", cwd: "{{ inputs.pkg }}"}
          name: pkg-gate
    next: done
  done: {end: completed}
"""


def _run(workspace: Path, pkg: str, *, gate: bool = False) -> subprocess.CompletedProcess[str]:
    text = LOOP if gate else LOOP.replace("    gates:\n      before:\n        - shell: {cmd: \"true\", cwd: \"{{ inputs.pkg }}\"}\n          name: pkg-gate\n", "")
    (workspace / "loop.yaml").write_text(text)
    args = ["run", "loop.yaml", "--no-store", "--input", f"pkg={pkg}"]
    if pkg not in ("out", "pkgs/inner"):
        return cli_in_process(args, workspace)
    env = {k: v for k, v in os.environ.items() if k != "LOOPDSL_STORE"}
    return subprocess.run([*loopdsl_command(), "run", "loop.yaml", "--no-store", "--input", f"pkg={pkg}"],
                          cwd=workspace, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "pkgs" / "a").mkdir(parents=True)
    (root / "out").symlink_to(tmp_path)  # symlinks that lead out of the workspace
    (root / "up").symlink_to("/")
    (root / "pkgs" / "inner").symlink_to(root / "pkgs" / "a")  # one that stays inside
    return root


@pytest.mark.parametrize("pkg, why", [
    ("..", "'..' part"),
    ("pkgs/../..", "'..' part"),
    ("/etc", "absolute path"),
    ("out", "leads out of the workspace"),
    ("up/tmp", "leads out of the workspace"),
])
@pytest.mark.parametrize("gate", [False, True])
def test_a_cwd_outside_the_workspace_fails_the_state(workspace: Path, pkg: str, why: str, gate: bool) -> None:
    done = _run(workspace, pkg, gate=gate)
    assert done.returncode == 1, done.stderr
    assert why in done.stdout + done.stderr and "Traceback" not in done.stderr
    assert not (workspace / "ran-in").exists()


@pytest.mark.parametrize("pkg, where", [("pkgs/a", "pkgs/a"), ("pkgs/inner", "pkgs/a"), ("", "")])
def test_a_cwd_inside_the_workspace_runs_there(workspace: Path, pkg: str, where: str) -> None:
    done = _run(workspace, pkg, gate=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path((workspace / "ran-in").read_text().strip()) == (workspace / where).resolve()
