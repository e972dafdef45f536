"""Loop test files (`*.test.yaml`): parsing and checking their shape.

A test file holds one test (a mapping with `loop:`) or several (`tests: [...]`):

    loop: ../loops/daily-triage.yaml     # relative to this file
    inputs: {since: yesterday}
    script: scripts/daily-triage.replies.yaml   # or the replies inline, as a mapping
    setup: |                              # optional shell, run in the test's workspace first
      git init -q -b main && ...
    copy: true                            # copy this file's folder into the workspace (default)
    expect:
      status: completed
      path_prefix: [commits, todos]
      outputs: {items: "5"}
      files: ["triage/*.md", {path: "triage/*.md", matches: "P0"}]
      spend: {tokens: 20000, cost_usd: 0.05, steps: 12}

Mistakes raise TestFileError with the file, line and a hint: a test runner reports them as
failed tests and carries on with the others.
"""
from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEST_KEYS = ("name", "loop", "inputs", "script", "setup", "copy", "expect", "description")
EXPECT_KEYS = ("status", "path", "path_prefix", "outputs", "files", "spend")
SPEND_KEYS = ("tokens", "cost_usd", "steps")
RUN_STATUSES = ("completed", "failed", "escalated", "budget_exhausted", "aborted", "waiting")


class TestFileError(Exception):
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, file: Path, line: int, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.file}:{self.line}: {self.message}"
        return text + (f" (hint: {self.hint})" if self.hint else "")


@dataclass(frozen=True)
class FileExpectation:
    pattern: str  # a path or glob, relative to the run's workspace
    matches: str | None = None  # a regular expression one matching file must contain


@dataclass(frozen=True)
class Expect:
    status: str | None = None
    path: tuple[str, ...] | None = None
    path_prefix: tuple[str, ...] | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    files: tuple[FileExpectation, ...] = ()
    spend: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LoopTest:
    name: str
    file: Path
    loop: Path
    inputs: Mapping[str, Any]
    script_data: Any = None  # inline replies
    script_path: Path | None = None
    setup: str | None = None
    copy: bool = True
    expect: Expect = field(default_factory=Expect)

    @property
    def label(self) -> str:
        return f"{self.file}::{self.name}"


def _line(node: Any, key: Any = None) -> int:
    """1-based line of a ruamel node (or of `key` inside it); 1 when unknown."""
    lc = getattr(node, "lc", None)
    try:
        if lc is not None and key is not None:
            return int(lc.key(key)[0]) + 1 if isinstance(key, str) else int(lc.item(key)[0]) + 1
        if lc is not None:
            return int(lc.line) + 1
    except (KeyError, IndexError, TypeError):
        pass
    return 1


def _plain(node: Any) -> Any:
    if isinstance(node, Mapping):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _unknown(file: Path, node: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in node:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"allowed here: {', '.join(allowed)}"
            raise TestFileError(file, _line(node, key), f"unknown key `{key}` in {where}", hint)


def _names(file: Path, node: Any, key: str, parent: Any) -> tuple[str, ...]:
    if not isinstance(node, list) or not all(isinstance(n, str) for n in node):
        raise TestFileError(file, _line(parent, key), f"expect.{key} must be a list of state names",
                            f"e.g. {key}: [collect, draft, done]")
    return tuple(node)


def _files(file: Path, node: Any, parent: Any) -> tuple[FileExpectation, ...]:
    import re

    items: list[tuple[Any, Any]] = []
    if isinstance(node, Mapping):
        items = [(k, v) for k, v in node.items()]
    elif isinstance(node, list):
        for item in node:
            if isinstance(item, str):
                items.append((item, None))
            elif isinstance(item, Mapping) and "path" in item and set(item) <= {"path", "matches"}:
                items.append((item["path"], item.get("matches")))
            else:
                raise TestFileError(file, _line(node), "each entry of expect.files is a path or {path, matches}",
                                    'e.g. files: ["out/report.md", {path: "out/*.md", matches: "^# Report"}]')
    else:
        raise TestFileError(file, _line(parent, "files"), "expect.files must be a list (or a mapping of path to regex)")
    out = []
    for pattern, regex in items:
        if not isinstance(pattern, str) or not pattern or Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise TestFileError(file, _line(parent, "files"), f"expect.files entry {pattern!r} must be a relative path inside the workspace")
        if regex is not None:
            if not isinstance(regex, str):
                raise TestFileError(file, _line(parent, "files"), f"`matches` of {pattern} must be a regular expression string")
            try:
                re.compile(regex)
            except re.error as exc:
                raise TestFileError(file, _line(parent, "files"), f"`matches` of {pattern} is not a valid regular expression: {exc}") from None
        out.append(FileExpectation(pattern, regex))
    return tuple(out)


def _expect(file: Path, node: Any, parent: Any) -> Expect:
    if node is None:
        return Expect()
    if not isinstance(node, Mapping):
        raise TestFileError(file, _line(parent, "expect"), "`expect` must be a mapping", f"keys: {', '.join(EXPECT_KEYS)}")
    _unknown(file, node, EXPECT_KEYS, "expect")
    status = node.get("status")
    if status is not None and status not in RUN_STATUSES:
        raise TestFileError(file, _line(node, "status"), f"expect.status {status!r} is not a run status",
                            f"one of {', '.join(RUN_STATUSES)}")
    outputs = node.get("outputs") or {}
    if not isinstance(outputs, Mapping):
        raise TestFileError(file, _line(node, "outputs"), "expect.outputs must be a mapping of output names to values")
    spend = node.get("spend") or {}
    if not isinstance(spend, Mapping):
        raise TestFileError(file, _line(node, "spend"), "expect.spend must be a mapping", "e.g. spend: {tokens: 5000, cost_usd: 0.01, steps: 10}")
    _unknown(file, spend, SPEND_KEYS, "expect.spend")
    for key, value in spend.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise TestFileError(file, _line(spend, key), f"expect.spend.{key} must be a non-negative number")
    return Expect(
        status=status,
        path=_names(file, node["path"], "path", node) if "path" in node else None,
        path_prefix=_names(file, node["path_prefix"], "path_prefix", node) if "path_prefix" in node else None,
        outputs=_plain(outputs),
        files=_files(file, node["files"], node) if "files" in node else (),
        spend={str(k): float(v) for k, v in spend.items()},
    )


def _one(file: Path, node: Any, default_name: str) -> LoopTest:
    if not isinstance(node, Mapping):
        raise TestFileError(file, _line(node), "a loop test is a mapping with at least `loop:`")
    _unknown(file, node, TEST_KEYS, "a loop test")
    loop = node.get("loop")
    if not isinstance(loop, str) or not loop:
        raise TestFileError(file, _line(node), "a loop test needs `loop:` (the loop file, relative to the test file)",
                            "e.g. loop: daily-triage.yaml")
    loop_path = (file.parent / loop).resolve()
    if not loop_path.is_file():
        raise TestFileError(file, _line(node, "loop"), f"loop file {loop} does not exist (looked at {loop_path})",
                            "paths in a test file are relative to the test file")
    inputs = node.get("inputs") or {}
    if not isinstance(inputs, Mapping):
        raise TestFileError(file, _line(node, "inputs"), "`inputs` must be a mapping of input names to values")
    script = node.get("script")
    script_path = None
    script_data = None
    if isinstance(script, str):
        script_path = (file.parent / script).resolve()
        if not script_path.is_file():
            raise TestFileError(file, _line(node, "script"), f"reply script {script} does not exist (looked at {script_path})",
                                "give a path relative to the test file, or the replies inline as a mapping")
    elif isinstance(script, Mapping):
        script_data = _plain(script)
    elif script is not None:
        raise TestFileError(file, _line(node, "script"), "`script` is a path to a reply file or a mapping of state names to replies")
    setup = node.get("setup")
    if setup is not None and not isinstance(setup, str):
        raise TestFileError(file, _line(node, "setup"), "`setup` is a shell script (a string)")
    copy = node.get("copy", True)
    if not isinstance(copy, bool):
        raise TestFileError(file, _line(node, "copy"), "`copy` is true or false")
    name = node.get("name", default_name)
    return LoopTest(name=str(name), file=file, loop=loop_path, inputs=_plain(inputs), script_data=script_data,
                    script_path=script_path, setup=setup, copy=copy, expect=_expect(file, node.get("expect"), node))


def test_name_for(file: Path) -> str:
    name = file.name
    for suffix in (".test.yaml", ".test.yml"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return file.stem


def load_tests(file: Path) -> list[LoopTest]:
    """The tests in one file; TestFileError for any mistake (with its line)."""
    from ruamel.yaml import YAML, YAMLError

    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TestFileError(file, 1, f"cannot read the test file: {exc}") from None
    try:
        data = YAML(typ="rt", pure=True).load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise TestFileError(file, (mark.line + 1) if mark else 1, f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, Mapping):
        raise TestFileError(file, 1, "a test file is a mapping: one test (with `loop:`) or `tests: [...]`")
    base = test_name_for(file)
    if "tests" in data:
        _unknown(file, data, ("tests",), "a test file with `tests:`")
        items = data["tests"]
        if not isinstance(items, list) or not items:
            raise TestFileError(file, _line(data, "tests"), "`tests` must be a non-empty list of tests")
        tests = [_one(file, item, f"{base}[{i}]") for i, item in enumerate(items)]
        names = [t.name for t in tests]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TestFileError(file, _line(data, "tests"), f"duplicate test name(s): {', '.join(dupes)}")
        return tests
    return [_one(file, data, base)]
