"""The audit's result types: a Finding per lost point, a CheckResult per rubric rule."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..language.model import Loop
from .rubric import RULES


@dataclass
class Finding:
    rule: str
    where: str
    message: str
    fix: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "where": self.where, "message": self.message, "fix": self.fix}


@dataclass
class CheckResult:
    rule: str
    applicable: bool = True
    findings: list[Finding] = field(default_factory=list)
    note: str = ""

    @property
    def weight(self) -> int:
        return RULES[self.rule].weight

    @property
    def passed(self) -> bool:
        return not self.findings

    @property
    def earned(self) -> int:
        return self.weight if (self.applicable and self.passed) else 0

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "title": RULES[self.rule].title, "weight": self.weight,
                "applicable": self.applicable, "passed": self.applicable and self.passed,
                "earned": self.earned, "note": self.note, "findings": [f.to_json() for f in self.findings]}


@dataclass
class AuditContext:
    loop: Loop
    file: Path
    tree: list[Loop]  # the loop and its sub-loops
    tests: list[Any]  # TestOutcome of the tests that run this loop (already run)
    runs: list[dict[str, Any]] | None  # store records of this loop; None: no store
    store_dir: Path | None
    days: int
    now: datetime
    lint: list[Any]  # lint's Diagnostics for this file
    # lint's Diagnostics for every file of `tree`: checks that match a lint rule take its findings by rule id
    tree_lint: list[Any] = field(default_factory=list)
    cwd: Path = field(default_factory=Path.cwd)  # where `audit` runs: suggested commands must work from here

    def typed(self, path: Path | str) -> str:
        """`path` as a command run from `cwd` takes it (relative when that is shorter, quoted)."""
        return typed_path(Path(path), self.cwd)

    @property
    def loop_arg(self) -> str:
        """The loop file as a suggested command names it."""
        return self.typed(self.loop.source or self.file)


def typed_path(path: Path, cwd: Path) -> str:
    """`path` for a command line run in `cwd`: relative to it unless absolute is shorter, shell-quoted."""
    import os
    import shlex

    absolute = path.resolve()
    try:
        relative = os.path.relpath(absolute, cwd.resolve())
    except ValueError:  # another drive
        relative = str(absolute)
    return shlex.quote(relative if len(relative) <= len(str(absolute)) else str(absolute))
