"""Loop test files (`*.test.yaml`): parsing and checking their shape.

A test file holds one test (a mapping with `loop:`) or several (`tests: [...]`):

    loop: ../loops/daily-triage.yaml     # relative to this file
    inputs: {since: yesterday}
    script: scripts/daily-triage.replies.yaml   # or the replies inline, as a mapping
    setup: |                              # optional shell, run in the test's workspace first
      git init -q -b main && ...
    copy: true                            # copy this file's folder into the workspace (default)
    tools:                                # optional: what an agent's tool answers instead of running
      issues__get_issue: {result: {number: 7, title: "crash on start"}}
    expect:
      status: completed
      path_prefix: [commits, todos]
      outputs: {items: "5"}
      files: ["triage/*.md", {path: "triage/*.md", matches: "P0"}]
      spend: {tokens: 20000, cost_usd: 0.05, steps: 12}
      tool_calls: {fix: [read_file, {name: run_tests, ok: true}]}   # per agent state, in order

The shape is checked by schemas/test.schema.json (the schema editors use, with every
problem at file:line:col); this module checks what a schema cannot: that the loop and
script files exist, that `files` stay inside the workspace, that `matches` are regular
expressions and that test names differ. Mistakes raise TestFileError: a test runner
reports them as failed tests and carries on with the others.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..language.diagnostics import Diagnostic
from ..language.files import is_file
from ..language.loader import Document
from ..language.model import YamlPath
from ..language.checked_files import describe, load_checked



class TestFileError(Exception):
    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, file: Path, line: int, message: str, hint: str = "", col: int = 0,
                 problems: tuple[Diagnostic, ...] = ()) -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.col = col
        self.message = message
        self.hint = hint
        self.problems = problems  # every schema finding, when the file breaks its schema

    @classmethod
    def from_diagnostics(cls, file: Path, problems: list[Diagnostic]) -> TestFileError:
        first = problems[0]
        return cls(file, first.line, first.message, first.hint, first.col, tuple(problems))

    def __str__(self) -> str:
        if self.problems:
            return describe(list(self.problems))
        where = f"{self.file}:{self.line}:{self.col}" if self.col else f"{self.file}:{self.line}"
        return f"{where}: {self.message}" + (f" (hint: {self.hint})" if self.hint else "")


@dataclass(frozen=True)
class FileExpectation:
    pattern: str  # a path or glob, relative to the run's workspace
    matches: str | None = None  # a regular expression one matching file must contain


@dataclass(frozen=True)
class ToolCallExpectation:
    name: str
    ok: bool | None = None  # None: either
    error: str | None = None  # a regular expression the call's error must contain
    args: Mapping[str, Any] | None = None  # arguments the call must have had (others may be there too)


@dataclass(frozen=True)
class Expect:
    status: str | None = None
    path: tuple[str, ...] | None = None
    path_prefix: tuple[str, ...] | None = None
    outputs: Mapping[str, Any] = field(default_factory=dict)
    files: tuple[FileExpectation, ...] = ()
    spend: Mapping[str, float] = field(default_factory=dict)
    # agent state -> its tool calls in execution order, over all visits and attempts
    tool_calls: Mapping[str, tuple[ToolCallExpectation, ...]] = field(default_factory=dict)


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
    tool_stubs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # tool name -> {result}|{error}

    @property
    def label(self) -> str:
        return f"{self.file}::{self.name}"


def _fail(doc: Document, file: Path, at: YamlPath, message: str, hint: str = "") -> TestFileError:
    line, col = doc.locate(at, value=True)
    return TestFileError(file, line, message, hint, col)


def _files(doc: Document, file: Path, node: Any, at: YamlPath) -> tuple[FileExpectation, ...]:
    if isinstance(node, Mapping):
        items = [(k, v, at + (k,)) for k, v in node.items()]
    else:
        items = [(item, None, at + (i,)) if isinstance(item, str) else (item["path"], item.get("matches"), at + (i,))
                 for i, item in enumerate(node)]
    out = []
    for pattern, regex, where in items:
        if Path(pattern).is_absolute() or ".." in Path(pattern).parts:
            raise _fail(doc, file, where, f"expect.files entry {pattern!r} must be a relative path inside the workspace")
        if regex is not None:
            try:
                re.compile(regex)
            except re.error as exc:
                raise _fail(doc, file, where, f"`matches` of {pattern} is not a valid regular expression: {exc}") from None
        out.append(FileExpectation(pattern, regex))
    return tuple(out)


def _tool_calls(doc: Document, file: Path, node: Mapping[str, Any], at: YamlPath) -> dict[str, tuple[ToolCallExpectation, ...]]:
    out = {}
    for state, calls in node.items():
        items = []
        for i, call in enumerate(calls):
            if isinstance(call, str):
                items.append(ToolCallExpectation(call))
                continue
            error = call.get("error")
            if error is not None:
                try:
                    re.compile(error)
                except re.error as exc:
                    raise _fail(doc, file, at + (state, i, "error"),
                                f"`error` of tool call {i + 1} of {state} is not a valid regular expression: {exc}") from None
            items.append(ToolCallExpectation(call["name"], call.get("ok"), error, call.get("args")))
        out[str(state)] = tuple(items)
    return out


def _expect(doc: Document, file: Path, node: Mapping[str, Any] | None, at: YamlPath) -> Expect:
    if not node:
        return Expect()
    spend = node.get("spend") or {}
    return Expect(
        status=node.get("status"),
        path=tuple(node["path"]) if "path" in node else None,
        path_prefix=tuple(node["path_prefix"]) if "path_prefix" in node else None,
        outputs=dict(node.get("outputs") or {}),
        files=_files(doc, file, node["files"], at + ("files",)) if "files" in node else (),
        spend={str(k): float(v) for k, v in spend.items()},
        tool_calls=_tool_calls(doc, file, node["tool_calls"], at + ("tool_calls",)) if "tool_calls" in node else {},
    )


def _one(doc: Document, file: Path, node: Mapping[str, Any], at: YamlPath, default_name: str) -> LoopTest:
    loop = node["loop"]
    loop_path = (file.parent / loop).resolve()
    if not is_file(loop_path):
        raise _fail(doc, file, at + ("loop",), f"loop file {loop} does not exist (looked at {loop_path})",
                    "paths in a test file are relative to the test file")
    script = node.get("script")
    script_path = None
    if isinstance(script, str):
        script_path = (file.parent / script).resolve()
        if not is_file(script_path):
            raise _fail(doc, file, at + ("script",), f"reply script {script} does not exist (looked at {script_path})",
                        "give a path relative to the test file, or the replies inline as a mapping")
    return LoopTest(name=str(node.get("name", default_name)), file=file, loop=loop_path,
                    inputs=dict(node.get("inputs") or {}),
                    script_data=script if isinstance(script, Mapping) else None,
                    script_path=script_path, setup=node.get("setup"), copy=node.get("copy", True),
                    expect=_expect(doc, file, node.get("expect"), at + ("expect",)),
                    tool_stubs={str(k): dict(v) for k, v in (node.get("tools") or {}).items()})


def test_name_for(file: Path) -> str:
    name = file.name
    for suffix in (".test.yaml", ".test.yml"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return file.stem


def load_tests(file: Path) -> list[LoopTest]:
    """The tests in one file; TestFileError for any mistake (every schema problem, with
    its line and column)."""
    doc, problems = load_checked(file, "test")
    if problems or doc is None:
        raise TestFileError.from_diagnostics(file, problems)
    base = test_name_for(file)
    if "tests" not in doc.data:
        return [_one(doc, file, doc.data, (), base)]
    tests = [_one(doc, file, item, ("tests", i), f"{base}[{i}]") for i, item in enumerate(doc.data["tests"])]
    names = [t.name for t in tests]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _fail(doc, file, ("tests",), f"duplicate test name(s): {', '.join(dupes)}", "give each test its own `name`")
    return tests
