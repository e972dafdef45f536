"""The suite's forked `loopdsl` (tests/cli_forked.py) behaves as `python -m loopdsl` does: same
output and exit code, the caller's directory and environment, signals passed on, and a command
whose client is killed is killed too."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_forked import forked, loopdsl_command

if not forked():
    pytest.skip("the forked CLI is off here (LOOPDSL_TEST_FRESH_CLI=1, or no fork, pidfd or SCM_RIGHTS)",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SLEEPER = ROOT / "tests" / "data" / "durable" / "sleeper.yaml"
FRESH = [sys.executable, "-m", "loopdsl"]


def _both(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], ...]:
    return tuple(subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
                 for command in (FRESH, loopdsl_command()))


def test_output_exit_code_directory_and_environment_are_the_fresh_processes(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("loopdsl: 1\nname: bad\nstart: nowhere\nstates: {}\n", encoding="utf-8")
    (tmp_path / "a-file").write_text("not a store\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    # lint: the caller's directory; runs: the store the caller's environment names (a file, refused).
    for args, extra, code in ((["lint", "bad.yaml"], {}, 1), (["--version"], {}, 0),
                              (["runs", "--json"], {"LOOPDSL_STORE": "a-file"}, 2), (["no-such-command"], {}, 2)):
        fresh, forked = _both(args, tmp_path, {**env, **extra})
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr), args
        assert fresh.returncode == code, (args, fresh.stderr)
    assert "No such command" in fresh.stderr


def _start_sleeper(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """A forked `loopdsl run` inside a 30 s shell state, and the pid of that loopdsl process."""
    marks = tmp_path / "marks"
    marks.mkdir()
    loop = tmp_path / "loop.yaml"
    loop.write_text(SLEEPER.read_text(encoding="utf-8").replace("mktemp {{ inputs.marks }}/nap.XXXXXX > /dev/null",
                                                                "echo $PPID > {{ inputs.marks }}/pid"), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPDSL_")}
    proc = subprocess.Popen([*loopdsl_command(), "run", str(loop), "--store", str(tmp_path / "store"), "--input",
                             f"marks={marks}", "--input", "seconds=30"], cwd=tmp_path, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (marks / "pid").exists() or not (marks / "pid").read_text().strip():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    shell_parent = int((marks / "pid").read_text())
    assert shell_parent != proc.pid  # the command runs in a process of its own, not the client
    return proc, shell_parent


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _loopdsl_ancestor(pid: int) -> int:
    """The loopdsl process above a shell state's process (the state may run under a wrapper)."""
    while pid > 1:
        command_line = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"loopdsl" in command_line or b"cli_forked" in command_line:
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise AssertionError("no loopdsl process above the shell state")


def test_ctrl_c_sent_to_the_client_reaches_the_command(tmp_path: Path) -> None:
    proc, _ = _start_sleeper(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr


def test_a_killed_client_takes_its_command_with_it(tmp_path: Path) -> None:
    proc, shell_parent = _start_sleeper(tmp_path)
    command = _loopdsl_ancestor(shell_parent)
    proc.kill()  # what a test's timeout does
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert _gone(command, within=30), f"the forked command {command} outlived its client"
