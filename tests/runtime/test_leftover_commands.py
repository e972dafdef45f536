"""A command outlives `kill -9` of the loopdsl running it; `resume` must not start a second
copy beside it. Its process group and marker are in the store before it is waited on: an
idempotent step's leftover is stopped (with the `setsid` child it started) before the step
runs again; a non-idempotent one waits for a person, and is stopped once they approve.
Also: a `setsid` child does not survive the wall-time stop of a run. Real processes are
killed; the commands after a kill run in-process but in the first test.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import crash_torture as ct

sys.path.insert(0, str(Path(__file__).parents[1]))
from cli_in_process import cli_in_process  # noqa: E402

import loopdsl
from loopdsl.adapters.store.run_store import MARKER_NAME, RunStore
from loopdsl.runtime.errors import StoreError

DATA = Path(__file__).parents[1] / "data" / "durable"


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command after the kill, in this process (tests/cli_in_process.py): what it does
    to the leftover is the point, not its process; the first test resumes in a real one."""
    return cli_in_process(args, cwd, {"LOOPDSL_USER": "crash-tester"})


def _run_id(store: Path, cwd: Path) -> str:
    listed = _cli(["runs", "--store", str(store), "--json"], cwd)
    assert listed.returncode == 0, listed.stderr
    return str(json.loads(listed.stdout)[0]["run_id"])


def _alive(pid: int) -> bool:
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True, check=False).stdout
    return bool(out.strip()) and not out.strip().startswith("Z")


def _escaped(marks: Path) -> list[int]:
    return [int(p.read_text()) for p in marks.glob("escaped.*") if p.read_text().strip()]


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    yield path
    # Whatever a failing test left running: the escaped children, and every process whose
    # environment names this test's folder (the commands get it as a placeholder value).
    needle = f"={path}".encode()
    leftovers = set(_escaped(path))
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and any(v.endswith(needle) for v in (entry / "environ").read_bytes().split(b"\0")):
                leftovers.add(int(entry.name))
    for pid in leftovers - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _recorded(store: Path) -> bool:
    """The running command's process group is in the store (what `resume` relies on)."""
    if not (store / MARKER_NAME).exists():
        return False  # not created yet (opening it now would race its creation)
    try:
        with RunStore(store) as probe:
            runs = probe.list_runs()
    except StoreError:
        return False
    return bool(runs) and bool(((runs[0].get("pending") or {}).get("command") or {}).get("pgid"))


def _start_and_kill(tmp_path: Path, marks: Path, idempotent: bool) -> tuple[Path, str]:
    loop = tmp_path / "leftover.yaml"
    loop.write_text((DATA / "leftover.yaml").read_text().replace("idempotent: true", f"idempotent: {str(idempotent).lower()}"))
    store = tmp_path / "store"
    proc = ct.launch(["run", str(loop), "--store", str(store), "--input", f"marks={marks}"], tmp_path)
    try:
        ct.wait_until(lambda: (marks / "first").exists() and len(_escaped(marks)) == 1 and _recorded(store), proc,
                      what="the command's start, recorded in the store", timeout=30)
    finally:
        killed = ct.kill(proc)
    assert killed  # kill -9 landed while the command ran
    return store, _run_id(store, tmp_path)


def test_sigterm_stops_the_running_command_and_leaves_the_run_to_resume(tmp_path: Path, marks: Path) -> None:
    """SIGTERM (docker stop, a cancelled CI job) once ended loopdsl alone, as kill -9 does, and
    the state's command ran on, orphaned, until a resume. Now the command's whole tree (the
    setsid child too) is stopped first; the run is left resumable, and the resume finds
    nothing left to stop."""
    loop = tmp_path / "leftover.yaml"
    loop.write_text((DATA / "leftover.yaml").read_text())
    store = tmp_path / "store"
    proc = ct.launch(["run", str(loop), "--store", str(store), "--input", f"marks={marks}"], tmp_path)
    try:
        ct.wait_until(lambda: (marks / "first").exists() and len(_escaped(marks)) == 1 and _recorded(store), proc,
                      what="the command's start, recorded in the store", timeout=30)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        ct.kill(proc)
    assert proc.returncode == 128 + signal.SIGTERM  # ended at once, as a shell reports a SIGTERM
    escaped = _escaped(marks)[0]
    deadline = time.monotonic() + 10
    while _alive(escaped) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(escaped)  # the command's setsid child did not outlive loopdsl
    run_id = _run_id(store, tmp_path)
    # `show` says what `runs` says of a run no process drives (it said `running`).
    assert f"run {run_id}: interrupted (resume {run_id})" in _cli(["show", run_id, "--store", str(store)], tmp_path).stdout
    done = _cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (marks / "log").read_text() == "start\nstart\nend\n"  # the idempotent step ran again, once
    shown = _cli(["show", run_id, "--store", str(store), "--json"], tmp_path)
    assert '"stopped_leftover"' not in shown.stdout  # nothing was left to stop


def test_resume_stops_an_idempotent_steps_leftover_before_running_it_again(tmp_path: Path, marks: Path) -> None:
    store, run_id = _start_and_kill(tmp_path, marks, idempotent=True)
    first_escaped = _escaped(marks)[0]
    assert _alive(first_escaped)  # kill -9 of loopdsl left the command running
    done = ct.cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert done.returncode == 0, done.stderr
    # The first copy was stopped before the second started: it never wrote its "end".
    assert (marks / "log").read_text() == "start\nstart\nend\n"
    assert not _alive(first_escaped)
    shown = ct.cli(["show", run_id, "--store", str(store), "--json"], tmp_path)
    assert '"stopped_leftover"' in shown.stdout


def test_a_non_idempotent_steps_leftover_waits_for_a_person(tmp_path: Path, marks: Path) -> None:
    store, run_id = _start_and_kill(tmp_path, marks, idempotent=False)
    first_escaped = _escaped(marks)[0]
    waiting = _cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert waiting.returncode == 4, waiting.stderr
    assert "still running" in waiting.stdout + waiting.stderr
    assert _alive(first_escaped) and (marks / "log").read_text() == "start\n"  # neither stopped nor re-run
    assert _cli(["approve", run_id, "--store", str(store)], tmp_path).returncode == 0
    done = _cli(["resume", run_id, "--store", str(store)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (marks / "log").read_text() == "start\nstart\nend\n"
    assert not _alive(first_escaped)


def test_a_setsid_child_does_not_survive_the_wall_time_stop(tmp_path: Path, marks: Path) -> None:
    loop = tmp_path / "slow.yaml"
    loop.write_text(
        "loopdsl: 1\nname: slow\ndescription: outlives its wall time\ninputs:\n  marks: {type: string}\n"
        "budget: {steps: 5, wall_time: 1.5}\nstart: work\nstates:\n  work:\n"
        "    shell: (setsid sleep 300 & echo $! > {{ inputs.marks }}/escaped.$$) && sleep 300\n"
        "    idempotent: true\n    next: done\n  done: {end: completed}\n"
    )
    started = time.monotonic()
    result = loopdsl.run(loop, {"marks": str(marks)})
    assert result.status == "budget_exhausted" and time.monotonic() - started < 10
    escaped = _escaped(marks)
    assert len(escaped) == 1 and not _alive(escaped[0])


# ---------------------------------------------------------------- gates, tools, MCP servers
# Every command a run starts is recorded the same way (runtime/commands.py). The command
# below blocks the first time; a later copy notes "overlap" if the first copy (its shell or
# its setsid child) is still alive when it starts, so the log proves the order.
SLOW_COMMAND = """\
m=$1
echo start >> "$m/log"
(setsid sleep 300 & echo $! > "$m/escaped.$$")
if [ ! -e "$m/first" ]; then
  echo "$$ $(cat "$m/escaped.$$")" > "$m/first"
  sleep 300
fi
for p in $(cat "$m/first"); do
  [ "$p" = "$$" ] && continue
  case "$(ps -o stat= -p "$p")" in ""|Z*) ;; *) echo "overlap $p" >> "$m/log" ;; esac
done
kill "$(cat "$m/escaped.$$")"
echo end >> "$m/log"
"""
HEAD = "loopdsl: 1\nname: {name}\ndescription: A long command outlives kill -9.\ninputs:\n  marks: {{type: string}}\n"
RUN_SLOW = "bash -- {{ inputs.marks }}/slow.sh {{ inputs.marks }}"


def _running_commands(store: Path) -> list[dict]:
    """The run's record of the commands it has running (runtime/commands.py)."""
    if not (store / MARKER_NAME).exists():
        return []
    try:
        with RunStore(store) as probe:
            runs = probe.list_runs()
    except StoreError:
        return []
    return list(((runs[0].get("meta") or {}).get("commands") or {}).values()) if runs else []


def _recorded_as(store: Path, what: str) -> bool:
    return any(entry.get("what", "").startswith(what) for entry in _running_commands(store))


def _kill_mid_command(tmp_path: Path, marks: Path, loop_text: str, what: str, *extra: str) -> tuple[Path, str, list[int]]:
    (marks / "slow.sh").write_text(SLOW_COMMAND)
    loop = tmp_path / "loop.yaml"
    loop.write_text(loop_text)
    store = tmp_path / "store"
    proc = ct.launch(["run", str(loop), "--store", str(store), "--input", f"marks={marks}", *extra], tmp_path)
    try:
        ct.wait_until(lambda: (marks / "first").exists() and len((marks / "first").read_text().split()) == 2
                      and _recorded_as(store, what), proc, what=f"the {what} command, recorded", timeout=60)
    finally:
        killed = ct.kill(proc)
    assert killed
    first = [int(p) for p in (marks / "first").read_text().split()]
    assert all(_alive(p) for p in first)  # kill -9 of loopdsl left the command and its setsid child running
    return store, _run_id(store, tmp_path), first


def _resume_and_check(tmp_path: Path, marks: Path, store: Path, run_id: str, first: list[int], *extra: str) -> None:
    done = _cli(["resume", run_id, "--store", str(store), *extra], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The first copy was stopped before the second started: no overlap, and it never wrote "end".
    assert (marks / "log").read_text() == "start\nstart\nend\n"
    assert not any(_alive(p) for p in first)
    shown = _cli(["show", run_id, "--store", str(store), "--json"], tmp_path)
    assert '"stopped_leftover"' in shown.stdout


def test_resume_stops_a_gate_command_left_running_before_the_gate_runs_again(tmp_path: Path, marks: Path) -> None:
    text = HEAD.format(name="gated") + (
        "budget: {steps: 20}\nstart: work\nstates:\n  work:\n    shell: echo work\n"
        f"    gates:\n      before: [{{name: slow, shell: \"{RUN_SLOW}\"}}]\n"
        "    next: done\n  done: {end: completed}\n")
    store, run_id, first = _kill_mid_command(tmp_path, marks, text, "gate")
    _resume_and_check(tmp_path, marks, store, run_id, first)


def test_resume_stops_an_agent_tool_command_left_running_before_the_call_reruns(tmp_path: Path, marks: Path) -> None:
    text = HEAD.format(name="tooled") + (
        "models:\n  m: {model: openai/gpt-4o-mini, max_tokens: 50, price: {input_per_mtok: 1, output_per_mtok: 2}}\n"
        f"tools:\n  slow:\n    description: Wait a long time.\n    shell: {RUN_SLOW}\n    idempotent: true\n"
        "budget: {steps: 20}\nstart: work\nstates:\n  work:\n"
        "    agent: {model: m, prompt: Call slow once., tools: [slow], max_turns: 3}\n"
        "    next: done\n  done: {end: completed}\n")
    script = tmp_path / "replies.yaml"
    script.write_text("work:\n  - tool_calls: [{name: slow, args: {}}]\n  - Done.\n")
    store, run_id, first = _kill_mid_command(tmp_path, marks, text, "tool", "--script", str(script))
    _resume_and_check(tmp_path, marks, store, run_id, first, "--script", str(script))


MCP_SERVER = Path(__file__).resolve().parents[1] / "adapters" / "mcp_server.py"


@pytest.mark.slow  # mostly a wait: started early, beside tests that compute
def test_resume_stops_the_mcp_server_of_a_killed_agent_run(tmp_path: Path, marks: Path) -> None:
    pytest.importorskip("mcp")
    # A server started by a wrapper that outlives it (the server itself exits once its stdin
    # ends): what is left after kill -9 is the wrapper's process group.
    loop = tmp_path / "loop.yaml"
    loop.write_text(HEAD.format(name="mcp-agent") + (
        "models:\n  m: {model: openai/gpt-4o-mini, max_tokens: 50, price: {input_per_mtok: 1, output_per_mtok: 2}}\n"
        f"tools:\n  srv:\n    description: A test server.\n"
        f"    mcp: {{command: [bash, -c, \"{sys.executable} {MCP_SERVER}; sleep 300\"], env: {{MARKS: \"{marks}\"}}}}\n"
        "    allow: [slow]\n    idempotent: true\n"
        "budget: {steps: 20}\nstart: work\nstates:\n  work:\n"
        "    agent: {model: m, prompt: Call slow once., tools: [srv], max_turns: 3}\n"
        "    next: done\n  done: {end: completed}\n"))
    script = tmp_path / "replies.yaml"
    script.write_text("work:\n  - tool_calls: [{name: srv__slow, args: {seconds: 6}}]\n  - Done.\n")
    store = tmp_path / "store"
    proc = ct.launch(["run", str(loop), "--store", str(store), "--input", f"marks={marks}", "--script", str(script)],
                     tmp_path)
    try:
        ct.wait_until(lambda: _recorded_as(store, "mcp srv"), proc, what="the MCP server, recorded", timeout=60)
        time.sleep(1.0)  # in the slow call
    finally:
        assert ct.kill(proc)
    [server] = [entry["pgid"] for entry in _running_commands(store) if entry["what"] == "mcp srv"]
    time.sleep(1.0)  # the server itself has seen its stdin end
    assert _alive(server)
    run_id = _run_id(store, tmp_path)
    done = _cli(["resume", str(run_id), "--store", str(store), "--script", str(script)], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not _alive(server)
    shown = _cli(["show", str(run_id), "--store", str(store), "--json"], tmp_path)
    assert '"stopped_leftover"' in shown.stdout and '"mcp srv"' in shown.stdout


FAKE_CLI = Path(__file__).resolve().parents[1] / "data" / "fake_cli" / "claude"


def test_resume_stops_a_coding_agent_cli_left_running_before_it_runs_again(tmp_path: Path) -> None:
    loop = tmp_path / "cli.yaml"
    loop.write_text(
        "loopdsl: 1\nname: cli-agent\n"
        f"models:\n  claude: {{model: anthropic/claude-sonnet-4-5, max_tokens: 1000, cli_path: {FAKE_CLI},\n"
        "           price: {input_per_mtok: 0.3, output_per_mtok: 1.5}}\n"
        "budget: {cost_usd: 5}\nstart: review\nstates:\n"
        "  review:\n    agent: {cli: claude-code, model: claude, prompt: 'scenario once', max_turns: 4, "
        "max_cost_usd: 1}\n    idempotent: true\n    next: done\n  done: {end: completed}\n")
    store, pid_file = tmp_path / "store", tmp_path / "cli.pid"
    proc = ct.launch(["run", str(loop), "--store", str(store)], tmp_path)
    try:
        ct.wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "" and _recorded_as(store, "cli"),
                      proc, what="the CLI, recorded", timeout=60)
    finally:
        assert ct.kill(proc)
    first = int(pid_file.read_text())
    try:
        assert _alive(first)
        run_id = _run_id(store, tmp_path)
        done = _cli(["resume", str(run_id), "--store", str(store)], tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not _alive(first)
        shown = _cli(["show", str(run_id), "--store", str(store), "--json"], tmp_path)
        assert '"stopped_leftover"' in shown.stdout and "All done: fixed a.py." in shown.stdout  # not "overlap"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(first, signal.SIGKILL)
