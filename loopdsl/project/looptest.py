"""`loopdsl test`: run loop tests offline, each in a throwaway workspace, and judge them.

Every test gets a fresh temporary directory: a copy of the test file's folder (unless
`copy: false`), then its `setup` script, then, when the loop runs in a git worktree and
the folder is not yet a repository, `git init` and one commit of everything. The run
store lives in the same temporary directory, so neither the user's repository nor their
store is ever touched. The run itself is `loopdsl.run` with the test's scripted replies.
"""
from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from ..language.files import copy_skips, exists
from ..runtime.scratch import keep_folder, make_folder, remove_folder
from .testfile import LoopTest, TestFileError, ToolCallExpectation, load_tests

SETUP_TIMEOUT_S = 120
MAX_PARALLEL_TESTS = 4
_GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Loop Tester", "GIT_AUTHOR_EMAIL": "loop-tester@example.invalid",
    "GIT_COMMITTER_NAME": "Loop Tester", "GIT_COMMITTER_EMAIL": "loop-tester@example.invalid",
}
# A fixed date for the fixture commit, so that its hash depends on the files alone.
FIXTURE_DATE = "2024-01-01T00:00:00+00:00"


@dataclass
class TestOutcome:
    __test__ = False  # not a pytest test class, despite the name
    name: str
    file: Path
    passed: bool
    failures: list[str] = field(default_factory=list)
    status: str | None = None
    seconds: float = 0.0
    loop: Path | None = None
    error: bool = False  # the test could not run (bad file, setup failed, internal error)

    @property
    def label(self) -> str:
        return f"{_shown(self.file)}::{self.name}"


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """An environment where the user's git configuration cannot leak into a test repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update({"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0", **_GIT_IDENTITY})
    env.update(extra or {})
    return env


def _git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
                          cwd=cwd, env=env or git_env(), capture_output=True, text=True)


class _NotRun(Exception):
    """The test could not reach its run (its reason is the message)."""


def _prepare(test: LoopTest, root: Path, needs_repo: bool) -> Path:
    work = root / "work"
    if test.copy:
        shutil.copytree(test.file.parent, work, symlinks=True, ignore=copy_skips)
    else:
        work.mkdir()
    if test.setup:
        try:
            done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", test.setup], cwd=work,
                                  env=git_env({"LOOPDSL_TEST_DIR": str(test.file.parent.resolve())}),
                                  capture_output=True, text=True, timeout=SETUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise _NotRun(f"setup did not finish within {SETUP_TIMEOUT_S}s") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise _NotRun(f"setup failed with exit {done.returncode}: " + " | ".join(tail))
    if needs_repo and not (work / ".git").exists():
        for args in (("init", "-q", "-b", "main"), ("add", "-A"),
                     ("commit", "-q", "--allow-empty", "-m", "loopdsl test fixture")):
            done = _git(work, *args, env=git_env({"GIT_AUTHOR_DATE": FIXTURE_DATE, "GIT_COMMITTER_DATE": FIXTURE_DATE}))
            if done.returncode != 0:
                raise _NotRun(f"git {args[0]} failed in the test workspace: {done.stderr.strip()}")
    return work


# ---------------------------------------------------------------- the run's files


class Workspace:
    """The files a finished run left: its worktree if kept, else its branch, else the folder."""

    def __init__(self, work: Path, meta: dict[str, Any]):
        self.work = work
        info = meta.get("worktree") or {}
        self.branch: str | None = None
        self.repo = Path(info["repo"]) if info.get("repo") else None
        self.root = work
        if info:
            kept = Path(info.get("path", ""))
            if info.get("kept") and kept.is_dir():
                self.root = kept
            else:
                self.branch = info.get("branch")

    def files(self) -> list[str]:
        if self.branch and self.repo:
            done = _git(self.repo, "ls-tree", "-r", "--name-only", self.branch)
            return done.stdout.splitlines() if done.returncode == 0 else []
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*")
                      if p.is_file() and ".git" not in p.relative_to(self.root).parts)

    def read(self, relative: str) -> str:
        if self.branch and self.repo:
            return _git(self.repo, "show", f"{self.branch}:{relative}").stdout
        return (self.root / relative).read_text(encoding="utf-8", errors="replace")

    def describe(self) -> str:
        return f"branch {self.branch}" if self.branch else "the workspace"


# ---------------------------------------------------------------- judging


def _same(expected: Any, actual: Any) -> bool:
    if expected == actual:
        return True
    # Outputs are rendered templates (text): `items: 5` in a test means "5".
    if isinstance(actual, str) and not isinstance(expected, str):
        return actual == (json.dumps(expected) if isinstance(expected, (bool, list, dict)) or expected is None else str(expected))
    return False


def tool_calls_made(events: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Agent state -> its tool calls in execution order (`tool_call` events, a sub-loop's
    too), each with the arguments its attempt's result recorded (None when not recorded)."""
    calls: dict[str, list[dict[str, Any]]] = {}
    # The calls of an attempt come before the event that ends it (ok, retry, failed), whose
    # result lists them with their arguments; call ids repeat across attempts, so the
    # arguments are matched to the calls still waiting for them.
    waiting: dict[tuple[str, str], list[tuple[str, dict[str, Any]]]] = {}

    def read(stream: Iterable[dict[str, Any]], run: str) -> None:
        for event in stream:
            if event.get("type") == "child" and isinstance(event.get("event"), dict):
                read([event["event"]], str(event.get("run_id")))
                continue
            state = str(event.get("state"))
            if event.get("type") == "tool_call":
                call = {"name": event.get("name"), "ok": event.get("ok"), "error": event.get("error"), "args": None}
                calls.setdefault(state, []).append(call)
                waiting.setdefault((run, state), []).append((str(event.get("id")), call))
            result = event.get("result")
            if isinstance(result, dict) and isinstance(result.get("tool_calls"), list):
                args = {str(r.get("id")): r.get("args") for r in result["tool_calls"] if isinstance(r, dict)}
                for call_id, call in waiting.pop((run, state), []):
                    call["args"] = args.get(call_id)

    read(events, "")
    return calls


def _call_problem(expected: ToolCallExpectation, actual: dict[str, Any]) -> str | None:
    if expected.name != actual["name"]:
        return f"expected {expected.name}, got {actual['name']}"
    if expected.ok is not None and expected.ok != actual["ok"]:
        why = f" ({actual['error']})" if actual["error"] else ""
        return f"{expected.name}: expected ok {str(expected.ok).lower()}, got {str(actual['ok']).lower()}{why}"
    if expected.error is not None and not re.search(expected.error, str(actual["error"] or "")):
        return f"{expected.name}: error {actual['error']!r} does not contain /{expected.error}/"
    for key, value in (expected.args or {}).items():
        args = actual["args"] if isinstance(actual["args"], dict) else {}
        if key not in args or args[key] != value:
            return f"{expected.name}: expected args.{key} = {value!r}, got {args.get(key, '(missing)')!r}"
    return None


def _judge_tool_calls(test: LoopTest, result: Any) -> list[str]:
    if not test.expect.tool_calls:
        return []
    made = tool_calls_made(result.events)
    failures = []
    for state, expected in test.expect.tool_calls.items():
        actual = made.get(state, [])
        names = ", ".join(str(c["name"]) for c in actual) or "none"
        if len(actual) != len(expected):
            wanted = ", ".join(e.name for e in expected) or "none"
            failures.append(f"tool_calls.{state}: expected {len(expected)} call(s) ({wanted}), got {len(actual)} ({names})")
            continue
        for i, (want, got) in enumerate(zip(expected, actual), start=1):
            problem = _call_problem(want, got)
            if problem is not None:
                failures.append(f"tool_calls.{state}[{i}]: {problem} (calls: {names})")
                break
    return failures


def judge(test: LoopTest, result: Any, work: Path) -> list[str]:
    """Every way the run missed the test's expectations (empty: passed)."""
    exp = test.expect
    failures: list[str] = []
    if exp.status is not None and result.status != exp.status:
        why = ""
        error = getattr(result.state, "error", None)
        if error:
            why = f" ({error.get('state', '?')}: {error.get('kind', '?')}: {str(error.get('message', ''))[:200]})"
        failures.append(f"status: expected {exp.status}, got {result.status}{why}")
    path = list(result.path)
    if exp.path is not None and path != list(exp.path):
        failures.append(f"path: expected {' -> '.join(exp.path)}, got {' -> '.join(path)}")
    if exp.path_prefix is not None and path[: len(exp.path_prefix)] != list(exp.path_prefix):
        failures.append(f"path_prefix: expected the path to start {' -> '.join(exp.path_prefix)}, got {' -> '.join(path)}")
    for key, value in exp.outputs.items():
        if key not in result.outputs:
            failures.append(f"outputs.{key}: missing (outputs: {', '.join(sorted(result.outputs)) or 'none'})")
        elif not _same(value, result.outputs[key]):
            failures.append(f"outputs.{key}: expected {value!r}, got {result.outputs[key]!r}")
    if exp.files:
        space = Workspace(work, result.state.meta)
        present = space.files()
        for item in exp.files:
            matched = [f for f in present if fnmatch.fnmatchcase(f, item.pattern)]
            if not matched:
                failures.append(f"files: no file matches {item.pattern} in {space.describe()}")
            elif item.matches is not None and not any(
                    re.search(item.matches, space.read(f), re.MULTILINE) for f in matched):
                failures.append(f"files: {', '.join(matched[:3])} does not contain /{item.matches}/")
    spent = {"tokens": float(result.tokens), "cost_usd": float(result.cost_usd), "steps": float(result.steps)}
    for key, cap in exp.spend.items():
        if spent[key] > cap:
            failures.append(f"spend.{key}: {spent[key]:g} is over the expected maximum {cap:g}")
    return failures + _judge_tool_calls(test, result)


def _loop_needs_repo(loop_path: Path) -> bool:
    from ..language.diagnostics import LoopError
    from ..lint.pipeline import load_loop

    try:
        return load_loop(loop_path).workspace.worktree
    except LoopError:
        return False  # the run reports the lint errors


def run_test(test: LoopTest, keep: bool = False) -> TestOutcome:
    """Run one test in a fresh temporary directory; never raises for user mistakes."""
    import loopdsl

    from ..api.runs import UsageError
    from ..language.diagnostics import LoopError, format_plain
    from ..language.inputs import InputError
    from ..language.packaged_loops import PackageError
    from ..runtime.errors import ScriptError, ScriptExhausted
    from ..runtime.errors import StoreError
    from ..runtime.publish import PublishError
    from ..adapters.git_worktree import WorkspaceError

    started = time.monotonic()
    outcome = TestOutcome(test.name, test.file, False, loop=test.loop)
    root = make_folder("loopdsl-test-")
    try:
        work = _prepare(test, root, _loop_needs_repo(test.loop))
        script: Path | None = test.script_path
        if test.script_data is not None:
            script = root / "replies.json"
            script.write_text(json.dumps(test.script_data), encoding="utf-8")
        # Offline there is nothing to wait for: retry waits count against wall_time, unslept;
        # and nobody to tell: a test never posts to the loop's `notify:` webhooks, and never
        # writes to GitHub (its `publish:` is planned, so its templates are checked, not applied).
        result = loopdsl.run(test.loop, dict(test.inputs), script=script, store=root / "store", workdir=work,
                             real_waits=False, tool_stubs=test.tool_stubs or None,
                             notify=False, publish=False)
        outcome.status = result.status
        outcome.failures = judge(test, result, work)
        outcome.passed = not outcome.failures
    except _NotRun as exc:
        outcome.failures, outcome.error = [str(exc)], True
    except LoopError as exc:
        outcome.failures, outcome.error = ["the loop does not lint: " + "; ".join(format_plain(d) for d in exc.diagnostics if d.is_error)], True
    except (UsageError, InputError, StoreError, WorkspaceError, PackageError, PublishError) as exc:
        outcome.failures, outcome.error = [f"error: {exc.message}"], True
    except (ScriptError, ScriptExhausted) as exc:
        outcome.failures, outcome.error = [f"reply script: {exc}"], True
    except Exception as exc:  # an interpreter bug must not stop the other tests
        outcome.failures, outcome.error = [f"internal error: {type(exc).__name__}: {exc}"], True
    finally:
        outcome.seconds = time.monotonic() - started
        if keep:
            keep_folder(root)
            outcome.failures.append(f"(workspace kept in {root})")
        else:
            remove_folder(root)
    return outcome


def collect(paths: Sequence[str | Path]) -> tuple[list[LoopTest], list[TestOutcome]]:
    """Tests from the files under `paths`, and a failed outcome per unreadable test file."""
    from .discover import find_test_files

    tests: list[LoopTest] = []
    broken: list[TestOutcome] = []
    for file in find_test_files(paths or ["."]):
        if not exists(file):
            broken.append(TestOutcome(file.name, file, False, [f"{file}: no such file"], error=True))
            continue
        try:
            tests.extend(load_tests(file))
        except TestFileError as exc:
            broken.append(TestOutcome(file.name, file, False, [str(exc)], error=True))
    return tests, broken


def run_tests(tests: Iterable[LoopTest], on_result: Callable[[TestOutcome], None] | None = None,
              keep: bool = False) -> list[TestOutcome]:
    """Run the tests a few at a time (each mostly waits on git and shell commands, and has its
    own folder and store); outcomes come back, and reach `on_result`, in the tests' order."""
    from concurrent.futures import ThreadPoolExecutor

    tests = list(tests)
    outcomes = []
    with ThreadPoolExecutor(max_workers=max(1, min(len(tests), MAX_PARALLEL_TESTS))) as pool:
        for future in [pool.submit(run_test, test, keep=keep) for test in tests]:
            outcome = _waited(future)
            outcomes.append(outcome)
            if on_result:
                on_result(outcome)
    return outcomes


def _waited(future: Future[TestOutcome]) -> TestOutcome:
    """The test's outcome, waited for in short slices. Python runs a signal's handler in the
    main thread only, between bytecodes: a SIGTERM the kernel handed a test's thread left the
    main thread blocked in an endless wait until that test ended (minutes, seen in CI)."""
    while True:
        try:
            return future.result(timeout=0.2)
        except FutureTimeout:
            continue


# ---------------------------------------------------------------- reports


def result_lines(outcome: TestOutcome) -> list[str]:
    detail = f"{outcome.status}, {outcome.seconds:.1f}s" if outcome.status else f"{outcome.seconds:.1f}s"
    lines = [f"{'PASS' if outcome.passed else 'FAIL'}  {outcome.label}  ({detail})"]
    lines.extend(f"      {failure}" for failure in outcome.failures)
    return lines


def tally(outcomes: Sequence[TestOutcome]) -> str:
    passed = sum(1 for o in outcomes if o.passed)
    return f"{passed} passed, {len(outcomes) - passed} failed"


def junit_xml(outcomes: Sequence[TestOutcome]) -> str:
    failures = sum(1 for o in outcomes if not o.passed and not o.error)
    errors = sum(1 for o in outcomes if o.error)
    total = sum(o.seconds for o in outcomes)
    suites = ElementTree.Element("testsuites", name="loopdsl test", tests=str(len(outcomes)),
                                 failures=str(failures), errors=str(errors), time=f"{total:.3f}")
    suite = ElementTree.SubElement(suites, "testsuite", name="loopdsl", tests=str(len(outcomes)),
                                   failures=str(failures), errors=str(errors), time=f"{total:.3f}")
    for o in outcomes:
        case = ElementTree.SubElement(suite, "testcase", classname=_shown(o.file), name=o.name, time=f"{o.seconds:.3f}")
        if not o.passed:
            tag = "error" if o.error else "failure"
            node = ElementTree.SubElement(case, tag, message=(o.failures[0] if o.failures else "failed")[:500])
            node.text = "\n".join(o.failures)
        if o.status:
            ElementTree.SubElement(case, "system-out").text = f"status: {o.status}"
    ElementTree.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(suites, encoding="unicode") + "\n"
