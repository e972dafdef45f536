from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from loopdsl.runtime.redaction import Redactor
from loopdsl.language.templates import TRUNCATION_MARKER
from loopdsl.runtime.process_tree import MARKER_VAR, new_marker
from loopdsl.runtime.shell import BASH, ShellResult, _stop_after_cancelled_spawn, run_command

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}


def run(**kwargs: Any) -> ShellResult:
    kwargs.setdefault("env", ENV)
    kwargs.setdefault("timeout", 20)
    return asyncio.run(run_command(**kwargs))


def live_members(pgid: int) -> list[str]:
    """Processes of group `pgid` that are not zombies, as `ps` sees them (independent of
    the code under test)."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return [row[0] for row in rows if int(row[1]) == pgid and not row[2].startswith("Z")]


@pytest.fixture
def pid_file(tmp_path: Path) -> Iterator[Path]:
    """Where a test's command writes its process group id; whatever is left of that group
    is killed afterwards, so a failing test leaves no stray processes behind."""
    path = tmp_path / "pgid"
    yield path
    for text in path.read_text().split() if path.exists() else ():
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.killpg(int(text), signal.SIGKILL)


def test_bash_flags_are_the_documented_ones() -> None:
    assert BASH == ("bash", "--noprofile", "--norc", "-eo", "pipefail", "-c")


def test_stdout_stderr_exit_code_and_cwd(tmp_path: Path) -> None:
    (tmp_path / "here.txt").write_text("x")
    result = run(script="ls; echo oops >&2; exit 3", cwd=tmp_path)
    assert result.stdout == "here.txt\n"
    assert result.stderr == "oops\n"
    assert result.exit_code == 3
    assert not result.timed_out and not result.truncated
    assert result.duration_s >= 0
    assert result.as_result() == {"stdout": "here.txt\n", "stderr": "oops\n", "exit_code": 3,
                                  "duration_s": result.duration_s}


def test_errexit_and_pipefail_are_on(tmp_path: Path) -> None:
    assert run(script="false | true; echo reached", cwd=tmp_path).exit_code == 1
    result = run(script="false; echo reached", cwd=tmp_path)
    assert (result.exit_code, result.stdout) == (1, "")


def test_env_is_exactly_what_was_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPDSL_TEST_LEAK", "leaked")
    env = {**ENV, "LOOPDSL_1": "it's a \"value\" $(not run)"}
    result = run(script='printf "%s|%s" "$LOOPDSL_1" "${LOOPDSL_TEST_LEAK-unset}"', cwd=tmp_path, env=env)
    assert result.stdout == "it's a \"value\" $(not run)|unset"


def test_stdin_is_empty(tmp_path: Path) -> None:
    result = run(script="cat; echo done", cwd=tmp_path, timeout=5)
    assert (result.exit_code, result.stdout) == (0, "done\n")


def test_killed_by_signal_reports_128_plus_signal(tmp_path: Path) -> None:
    assert run(script="kill -TERM $$", cwd=tmp_path).exit_code == 143


def test_big_output_on_both_streams_is_capped_without_deadlock(tmp_path: Path) -> None:
    cap = 64 * 1024
    script = "head -c 5000000 /dev/zero | tr '\\0' o & head -c 5000000 /dev/zero | tr '\\0' e >&2; wait"
    started = time.monotonic()
    result = run(script=script, cwd=tmp_path, output_cap=cap, timeout=30)
    assert time.monotonic() - started < 15
    assert result.exit_code == 0 and result.truncated
    marker = TRUNCATION_MARKER.format(cap=cap)
    assert result.stdout == "o" * cap + marker
    assert result.stderr == "e" * cap + marker


def test_output_under_the_cap_is_not_marked(tmp_path: Path) -> None:
    result = run(script="printf 'abc'", cwd=tmp_path, output_cap=3)
    assert (result.stdout, result.truncated) == ("abc", False)


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    result = run(script="printf 'a\\xffb'", cwd=tmp_path)
    assert result.stdout == "a\ufffdb"


def test_timeout_kills_the_group_including_background_grandchildren(tmp_path: Path, pid_file: Path) -> None:
    marker = tmp_path / "grandchild-survived"
    script = f"echo $$ > {pid_file}; (sleep 1; touch {marker}) & sleep 100 & echo started; sleep 100"
    started = time.monotonic()
    result = run(script=script, cwd=tmp_path, timeout=0.5)
    assert time.monotonic() - started < 5
    assert result.timed_out and result.exit_code != 0
    assert result.stdout == "started\n"
    assert "timed out after 0.5s" in result.stderr
    pgid = int(pid_file.read_text())
    assert live_members(pgid) == []
    time.sleep(1.3)
    assert not marker.exists()


def test_cancellation_kills_the_group(tmp_path: Path, pid_file: Path) -> None:
    marker = tmp_path / "grandchild-survived"
    script = f"echo $$ > {pid_file}; (sleep 1; touch {marker}) & sleep 100"

    async def scenario() -> None:
        task = asyncio.create_task(run_command(script=script, cwd=tmp_path, env=ENV, timeout=None))
        while not pid_file.exists() or not pid_file.read_text().strip():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert live_members(int(pid_file.read_text())) == []
    time.sleep(1.3)
    assert not marker.exists()


def processes_running(needle: str) -> list[str]:
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if needle in line and not line.lstrip().startswith("Z")]


def test_cancellation_at_any_moment_leaves_nothing_running(tmp_path: Path) -> None:
    # Cancelling while asyncio is still setting up the pipes is the racy case: asyncio
    # would kill only bash there, and bash's children would live on.
    tag = f"99.{os.getpid()}{time.monotonic_ns() % 10**6}"

    async def cancel_after(delay: float) -> None:
        task = asyncio.create_task(run_command(script=f"sleep {tag} & sleep {tag}", cwd=tmp_path,
                                               env=ENV, timeout=None, kill_grace=0.2))
        await asyncio.sleep(delay)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)
        assert done, f"a cancel at {delay}s did not stop the command"
        assert task.cancelled()

    try:
        for delay in (0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05):
            asyncio.run(cancel_after(delay))
            assert processes_running(tag) == [], f"left running after a cancel at {delay}s"
    finally:
        out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if f"sleep {tag}" in line:
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(line.split()[0]), signal.SIGKILL)


def test_background_process_holding_the_pipes_does_not_hang_the_command(tmp_path: Path, pid_file: Path) -> None:
    started = time.monotonic()
    result = run(script=f"echo $$ > {pid_file}; sleep 30 & echo hi", cwd=tmp_path, timeout=20)
    assert time.monotonic() - started < 5
    assert (result.exit_code, result.stdout, result.timed_out) == (0, "hi\n", False)
    assert "background processes" in result.stderr
    assert live_members(int(pid_file.read_text())) == []


def test_process_that_left_the_group_cannot_hang_the_command(tmp_path: Path, pid_file: Path) -> None:
    # `setsid` puts the sleeper in a new group we cannot signal as ours; it still holds
    # stdout. The command must return anyway (the test kills the escaped group after).
    script = f"setsid bash -c 'echo $$ >> {pid_file}; exec sleep 30' & echo hi"
    started = time.monotonic()
    result = run(script=script, cwd=tmp_path, timeout=20, kill_grace=0.3)
    assert time.monotonic() - started < 5
    assert (result.exit_code, result.stdout) == (0, "hi\n")


HOSTILE = ["; touch pwned", "$(touch pwned)", "`touch pwned`", "*", "", "a b\tc\nd", "--", "-c",
           "'\"\\", "ünïcödé ✓", "${HOME}"]


def test_argv_arrives_byte_for_byte_without_a_shell(tmp_path: Path) -> None:
    code = "import sys, json; sys.stdout.write(json.dumps(sys.argv[1:]))"
    result = run(argv=[sys.executable, "-c", code, *HOSTILE], cwd=tmp_path)
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == HOSTILE
    assert not (tmp_path / "pwned").exists()


def test_missing_program_is_exit_127_not_an_exception(tmp_path: Path) -> None:
    result = run(argv=["loopdsl-no-such-program-xyz", "arg"], cwd=tmp_path)
    assert result.exit_code == 127
    assert "command not found: loopdsl-no-such-program-xyz" in result.stderr
    in_bash = run(script="loopdsl-no-such-program-xyz", cwd=tmp_path)
    assert in_bash.exit_code == 127


def test_missing_cwd_is_a_clear_failure(tmp_path: Path) -> None:
    result = run(script="true", cwd=tmp_path / "nope")
    assert result.exit_code == 126
    assert "working directory does not exist" in result.stderr


def test_nul_byte_in_a_value_is_a_clear_failure(tmp_path: Path) -> None:
    result = run(script='echo "$LOOPDSL_1"', cwd=tmp_path, env={**ENV, "LOOPDSL_1": "a\0b"})
    assert result.exit_code == 126
    assert "environment variable LOOPDSL_1 contains a NUL byte" in result.stderr
    assert "argument 1 contains a NUL byte" in run(argv=["echo", "x\0"], cwd=tmp_path).stderr


def test_exactly_one_of_script_and_argv(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        run(script="true", argv=["true"], cwd=tmp_path)
    with pytest.raises(ValueError):
        run(cwd=tmp_path)


def test_secrets_from_the_env_are_redacted_in_both_streams(tmp_path: Path) -> None:
    secret = "hunter2-very-secret"
    env = {**ENV, "API_TOKEN": secret}
    result = run(script='echo "token=$API_TOKEN"; echo "err $API_TOKEN" >&2; exit 1', cwd=tmp_path,
                 env=env, redact=Redactor([secret]))
    assert result.stdout == "token=***\n"
    assert result.stderr == "err ***\n"


def test_secret_straddling_the_cap_is_not_half_shown(tmp_path: Path) -> None:
    secret = "SECRETVALUE123"
    result = run(script=f"printf '12345678{secret}tail'", cwd=tmp_path, output_cap=10,
                 redact=Redactor([secret]))
    assert result.truncated
    assert result.stdout.startswith("12345678**")
    assert "SE" not in result.stdout


def test_no_part_of_a_secret_survives_the_end_of_the_kept_window(tmp_path: Path) -> None:
    """Output past the cap is read into a window a little longer than the cap (to see a
    secret that crosses it whole); the window ends anywhere, often inside a secret, whose
    start a redaction of the window left, and a cut of the redacted (shorter) text kept it:
    `S3cr3tTo` reached the store. Every phase of the window's end against the secret:"""
    secret = "S3cr3tTokenValue_XYZ123"
    redactor = Redactor([secret])
    for cap in range(4000, 4000 + len(secret) + 1):
        result = run(script=f"yes '{secret}' | head -c 200000", cwd=tmp_path, output_cap=cap, redact=redactor)
        kept = result.stdout.removesuffix(TRUNCATION_MARKER.format(cap=cap))
        assert result.truncated and kept != result.stdout
        lines = kept.split("\n")
        assert set(lines[:-1]) == {"***"} and lines[-1] in ("***", ""), (cap, lines[-1])


def test_missing_program_message_is_redacted_too(tmp_path: Path) -> None:
    result = run(argv=["secret-program-name"], cwd=tmp_path, redact=Redactor(["secret-program-name"]))
    assert result.exit_code == 127 and "secret-program-name" not in result.stderr


def _alive(pid: int) -> bool:
    """Running and not a zombie, as `ps` sees it (independent of the code under test)."""
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False).stdout
    return bool(out.strip()) and not out.strip().startswith("Z")


def _kill_listed(path: Path) -> None:
    for text in path.read_text().split() if path.exists() else ():
        with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
            os.kill(int(text), signal.SIGKILL)


@pytest.mark.parametrize("how", ["timeout", "cancel", "leftover"])
def test_processes_that_left_the_group_are_stopped_too(tmp_path: Path, how: str) -> None:
    # One child leaves with setsid (keeps the environment), one with setsid and `env -i`
    # (a new session and an empty environment: found as a descendant of bash).
    pids = tmp_path / "pids"
    script = (f"setsid bash -c 'echo $$ >> {pids}; exec sleep 60' & "
              f"setsid env -i bash -c 'echo $$ >> {pids}; exec sleep 61' & "
              "while [ $(wc -l < " + str(pids) + " 2>/dev/null || echo 0) -lt 2 ]; do sleep 0.01; done; "
              "echo ready; " + ("exit 0" if how == "leftover" else "sleep 100"))
    try:
        if how == "cancel":
            async def scenario() -> None:
                task = asyncio.create_task(run_command(script=script, cwd=tmp_path, env=ENV, timeout=None, kill_grace=0.3))
                while len(pids.read_text().split() if pids.exists() else ()) < 2:
                    await asyncio.sleep(0.01)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            asyncio.run(scenario())
        else:
            result = run(script=script, cwd=tmp_path, timeout=1.5 if how == "timeout" else 20, kill_grace=0.3)
            assert result.stdout == "ready\n"
            assert result.timed_out == (how == "timeout")
        escaped = [int(p) for p in pids.read_text().split()]
        assert len(escaped) == 2
        deadline = time.monotonic() + 15  # a bound, not a speed target: CI machines are loaded
        while any(_alive(p) for p in escaped) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in escaped if _alive(p)] == []
    finally:
        _kill_listed(pids)


def test_a_stop_after_a_cancelled_spawn_finds_what_holds_only_the_pipes(tmp_path: Path) -> None:
    # A cancellation that lands while asyncio is still wiring the pipes is followed by a stop
    # of its own. By then a child may have left the session, cleared its environment and
    # lost its parent (the command exited): the output pipe it holds is its only link.
    pid_file = tmp_path / "pid"
    script = (f"setsid env -i bash -c 'echo $$ > {pid_file}; exec sleep 61' & "
              f"while [ ! -s {pid_file} ]; do sleep 0.01; done")
    marker = new_marker()

    async def scenario() -> None:
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *BASH, script, env={**ENV, MARKER_VAR: marker}, start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        proc = await spawn
        while proc.returncode is None:  # the command itself exits; its child lives on
            await asyncio.sleep(0.01)
        await _stop_after_cancelled_spawn(spawn, marker, 0.3)

    try:
        asyncio.run(scenario())
        child = int(pid_file.read_text())
        deadline = time.monotonic() + 15  # a bound, not a speed target
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        _kill_listed(pid_file)
