"""`loopdsl test`: loop tests run offline in throwaway workspaces and are judged like a test runner."""
from __future__ import annotations

import os

import shutil
import subprocess
from pathlib import Path
from xml.etree import ElementTree

import pytest
from click.testing import CliRunner

from loopdsl.cli import cli
from loopdsl.project.testfile import TestFileError, load_tests

DATA = Path(__file__).parents[1] / "data" / "project" / "looptest"


def run_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def project(tmp_path: Path) -> Path:
    target = tmp_path / "project"
    shutil.copytree(DATA, target)
    return target


def test_passing_and_failing_tests_are_reported_with_reasons(project: Path) -> None:
    code, out, _ = run_cli("test", str(project))
    lines = out.strip().splitlines()
    assert code == 1
    assert lines[-1] == "1 passed, 1 failed"
    assert lines[0].startswith("PASS  ") and "greets-after-a-retry" in lines[0] and "(completed," in lines[0]
    fail = next(i for i, line in enumerate(lines) if line.startswith("FAIL"))
    assert "wrong-expectations" in lines[fail]
    reasons = [line.strip() for line in lines[fail + 1:-1]]
    assert reasons == [
        "status: expected failed, got completed",
        "path_prefix: expected the path to start facts -> save, got facts -> draft -> save -> done",
        "outputs.who: expected 'nobody', got 'world'",
        "outputs.missing: missing (outputs: chars, who)",
        "files: no file matches nothing.txt in the workspace",
        "files: greeting.txt does not contain /^bye/",
        "spend.steps: 3 is over the expected maximum 1",
    ]
    # The runs happened in temporary copies: the project folder gained nothing.
    assert sorted(p.name for p in project.iterdir()) == ["facts.txt", "greet.test.yaml", "greet.yaml"]


def test_a_fifo_or_a_venv_beside_the_tests_is_not_copied(project: Path) -> None:
    """The copy of a test's folder leaves special files out (a FIFO failed every test of the
    folder as an internal error) and the folders the project walk skips."""
    text = (project / "greet.test.yaml").read_text()
    (project / "greet.test.yaml").write_text(text.split("  - name: wrong-expectations")[0])
    os.mkfifo(project / "pipe")
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "python").write_text("not copied\n")
    code, out, err = run_cli("test", str(project))
    assert code == 0, out + err
    assert out.strip().splitlines()[-1] == "1 passed, 0 failed"


def test_a_path_that_does_not_exist_is_a_usage_error(project: Path) -> None:
    code, out, err = run_cli("test", str(project / "nope"))
    assert code == 2, out + err  # it was one failed test named after the path, exit 1
    assert f"no such file or folder: {project / 'nope'}" in err


def test_exit_zero_when_all_pass_and_junit_xml(project: Path, tmp_path: Path) -> None:
    text = (project / "greet.test.yaml").read_text()
    (project / "greet.test.yaml").write_text(text.split("  - name: wrong-expectations")[0])
    report = tmp_path / "junit.xml"
    code, out, _ = run_cli("test", str(project), "--format", "junit", "--output", str(report))
    assert code == 0
    assert out.strip().splitlines()[-1] == "1 passed, 0 failed"
    suite = ElementTree.parse(report).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "0"
    case = suite.find("testcase")
    assert case is not None and case.get("name") == "greets-after-a-retry" and case.find("failure") is None


def test_junit_to_stdout_keeps_the_report_on_stderr(project: Path) -> None:
    code, out, err = run_cli("test", str(project / "greet.test.yaml"), "--format", "junit")
    assert code == 1
    root = ElementTree.fromstring(out)  # stdout is only the XML
    suite = root.find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures")) == ("2", "1")
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["wrong-expectations"]
    assert "status: expected failed, got completed" in (failed[0].find("failure").text or "")  # type: ignore[union-attr]
    assert err.strip().splitlines()[-1] == "1 passed, 1 failed"


def test_a_broken_test_file_is_a_failure_with_line_and_hint(project: Path) -> None:
    (project / "typo.test.yaml").write_text("loop: greet.yaml\nexpect:\n  stauts: completed\n")
    with pytest.raises(TestFileError) as info:
        load_tests(project / "typo.test.yaml")
    assert info.value.line == 3 and "did you mean `status`" in str(info.value)
    code, out, _ = run_cli("test", str(project / "typo.test.yaml"))
    assert code == 1
    assert "typo.test.yaml:3:3: unknown key `stauts` in `expect`; did you mean `status`?" in out
    assert out.strip().splitlines()[-1] == "0 passed, 1 failed"


def test_a_test_file_is_checked_by_the_published_schema_with_every_problem_positioned(project: Path) -> None:
    (project / "shape.test.yaml").write_text(
        "loop: greet.yaml\nexpect:\n  status: complete\n  spend: {tokens: -5}\n"
        "script:\n  greet: [{error: explode}]\n"
    )
    with pytest.raises(TestFileError) as info:
        load_tests(project / "shape.test.yaml")
    lines = str(info.value).splitlines()
    assert [line.split(": ", 1)[0].rsplit(".yaml:", 1)[1] for line in lines] == ["3:11", "4:19", "6:19"]
    assert "`expect.status` must be one of completed," in lines[0] and "did you mean `completed`?" in lines[0]
    assert "`expect.spend.tokens` must be at least 0" in lines[1]
    assert "`script.greet[0].error` must be one of rate_limit" in lines[2]


def test_missing_loop_and_script_are_explained(project: Path) -> None:
    (project / "a.test.yaml").write_text("loop: nope.yaml\n")
    (project / "b.test.yaml").write_text("loop: greet.yaml\nscript: replies/none.yaml\n")
    code, out, _ = run_cli("test", str(project / "a.test.yaml"), str(project / "b.test.yaml"))
    assert code == 1
    assert "loop file nope.yaml does not exist" in out
    assert "reply script replies/none.yaml does not exist" in out


def test_no_tests_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = run_cli("test", str(tmp_path))
    assert code == 2
    assert "no loop tests (*.test.yaml)" in err


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout


def test_worktree_loop_runs_in_a_copy_and_never_touches_the_users_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(DATA, repo / "loops")
    loop = (repo / "loops" / "greet.yaml").read_text().replace("start: facts", "workspace: {worktree: true}\nstart: facts")
    (repo / "loops" / "greet.yaml").write_text(loop)
    (repo / "loops" / "greet.test.yaml").write_text(
        "loop: greet.yaml\nscript: {draft: ['hello from a worktree']}\n"
        "expect:\n  status: completed\n  files: [{path: greeting.txt, matches: worktree}, facts.txt]\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "project")
    before = (_git(repo, "for-each-ref"), _git(repo, "status", "--porcelain"), _git(repo, "worktree", "list"))

    code, out, _ = run_cli("test", str(repo / "loops"))

    assert code == 0, out
    assert out.strip().splitlines()[-1] == "1 passed, 0 failed"
    after = (_git(repo, "for-each-ref"), _git(repo, "status", "--porcelain"), _git(repo, "worktree", "list"))
    assert after == before  # no run branch, no worktree, no store in the user's repository
    assert not (repo / ".loopdsl").exists()


def test_setup_builds_the_workspace_and_its_failure_is_reported(project: Path) -> None:
    (project / "facts.txt").unlink()
    (project / "setup.test.yaml").write_text(
        "tests:\n"
        "  - name: built\n    loop: greet.yaml\n    copy: false\n"
        "    setup: printf 'made by setup\\n' > facts.txt\n"
        "    script: {draft: ['hello: made by setup']}\n"
        "    expect: {status: completed, files: [{path: greeting.txt, matches: made by setup}]}\n"
        "  - name: broken-setup\n    loop: greet.yaml\n    setup: 'echo nope >&2; exit 3'\n"
        "    expect: {status: completed}\n")
    code, out, _ = run_cli("test", str(project / "setup.test.yaml"))
    assert code == 1
    assert "PASS  " in out and "built" in out
    assert "setup failed with exit 3: nope" in out


def test_retry_waits_count_against_wall_time_but_are_not_slept(project: Path) -> None:
    # Offline there is nothing to wait for: a 40 s backoff is not slept through, yet it is
    # on the run's clock, so a second one passes the 1-minute wall_time as it would online.
    loop = project / "greet.yaml"
    loop.write_text(loop.read_text().replace(
        "retry: {max_attempts: 2, backoff: {initial: 0s}}",
        "retry: {max_attempts: 3, backoff: {initial: 40s, factor: 1, jitter: false}}"))
    (project / "greet.test.yaml").write_text(
        "tests:\n"
        "  - name: one-wait-fits\n    loop: greet.yaml\n"
        "    script: {draft: ['good day', 'hello there']}\n"
        "    expect: {status: completed}\n"
        "  - name: two-waits-do-not\n    loop: greet.yaml\n"
        "    script: {draft: ['good day', 'good night', 'hello']}\n"
        "    expect: {status: budget_exhausted}\n")
    code, out, _ = run_cli("test", str(project))
    assert code == 0, out
    seconds = [float(line.rsplit(", ", 1)[1].rstrip("s)")) for line in out.splitlines() if line.startswith("PASS")]
    assert len(seconds) == 2 and max(seconds) < 30, out


def test_sigterm_leaves_no_workspace_behind(tmp_path: Path) -> None:
    """SIGTERM ends loopdsl with os._exit (cli/__init__.py), which runs no `finally`: the
    test's workspace, made in the temp dir, was left there with whatever the loop wrote.
    A real process is stopped while its test's shell state runs, with TMPDIR under tmp_path."""
    import os
    import signal
    import sys
    import time

    project, tmp = tmp_path / "project", tmp_path / "tmp"
    project.mkdir()
    tmp.mkdir()
    (project / "wait.yaml").write_text(
        "loopdsl: 1\nname: wait\nbudget: {steps: 5}\nstart: work\nstates:\n"
        "  work:\n    shell: touch started && sleep 300\n    timeout: 600s\n    next: done\n"
        "  done:\n    end: completed\n")
    (project / "wait.test.yaml").write_text("tests:\n  - name: waits\n    loop: wait.yaml\n    expect: {status: completed}\n")
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "loopdsl", "test", str(project)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp.glob("loopdsl-test-*/**/started")):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        # To a thread that runs the test, not the main one: the kernel may hand a process's
        # signal to any of its threads, and the main thread, blocked in an endless wait for the
        # test's outcome, then never ran the handler (seen in CI).
        threads = [int(t.name) for t in Path(f"/proc/{proc.pid}/task").iterdir() if int(t.name) != proc.pid]
        import ctypes

        assert ctypes.CDLL(None, use_errno=True).tgkill(proc.pid, threads[-1], signal.SIGTERM) == 0
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM
    assert list(tmp.iterdir()) == []  # the workspace and its store are gone
