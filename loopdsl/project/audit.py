"""`loopdsl audit`: how ready each loop of a project is to run unattended, out of 100.

The score of a loop is the weight of the rubric's checks it passes over the weight of the
checks that apply to it (a loop without model calls is not judged on its evaluator),
scaled to 100 and rounded. The project's score is the mean of its loops' scores. Files
that other loops run as sub-loops are judged as part of their parents.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .audit_checks import CHECKS, AuditContext, CheckResult, Finding
from .audit_types import typed_path
from ..language.files import is_dir
from ..language.model import Loop
from ..lint.pipeline import Analysis, LintSession, loop_of
from .discover import loop_tree
from .rubric import RUBRIC, RULES

DEFAULT_DAYS = 7


@dataclass
class LoopAudit:
    file: Path
    name: str
    checks: list[CheckResult] = field(default_factory=list)
    load_error: str | None = None
    typed: str = ""  # the file as a suggested command, run where `audit` runs, names it

    @property
    def score(self) -> int:
        if self.load_error:
            return 0
        applicable = sum(c.weight for c in self.checks if c.applicable)
        earned = sum(c.earned for c in self.checks)
        return round(100 * earned / applicable) if applicable else 100

    @property
    def findings(self) -> list[Finding]:
        return [f for c in self.checks for f in c.findings]

    def to_json(self) -> dict[str, Any]:
        return {"file": str(self.file), "name": self.name, "score": self.score, "load_error": self.load_error,
                "checks": [c.to_json() for c in self.checks]}


@dataclass
class ProjectAudit:
    root: Path
    loops: list[LoopAudit]
    parts: list[Path]
    store_dir: Path | None

    @property
    def score(self) -> int:
        return round(sum(a.score for a in self.loops) / len(self.loops)) if self.loops else 0

    def to_json(self, threshold: int | None = None) -> dict[str, Any]:
        return {"root": str(self.root), "score": self.score, "threshold": threshold,
                "store": str(self.store_dir) if self.store_dir else None,
                "rubric": [{"rule": r.id, "weight": r.weight, "title": r.title} for r in RUBRIC],
                "loops": [a.to_json() for a in self.loops], "sub_loops": [str(p) for p in self.parts]}


def _store_runs(store_dir: Path) -> list[dict[str, Any]] | None:
    from ..adapters.store.run_store import MARKER_NAME, RunStore
    from ..runtime.errors import StoreError

    # Opening a store creates it: only read one that is already there. One that cannot be read
    # (another folder, a newer format) is said, not taken for "the loop has never run here".
    if not (store_dir / MARKER_NAME).exists():
        if is_dir(store_dir) and any(store_dir.iterdir()):
            raise StoreError(f"{store_dir} is not a loopdsl run store",
                             "pass --store DIR (or set LOOPDSL_STORE) where `loopdsl run` kept its runs")
        return None
    with RunStore(store_dir) as store:
        return store.list_runs(check=True)


class _LintedLoops:
    """Lint once per loop file for the whole audit: the loops, their findings (which checks
    map to rubric rules by rule id) and sub-loops, all from one LintSession."""

    def __init__(self) -> None:
        self.session = LintSession()
        self.analyses: dict[Path, Analysis] = {}

    def lint(self, file: Path) -> Analysis:
        """Lint a file the audit was given (always afresh, so findings name it as given)."""
        analysis = self.session.lint_file(file, str(file))
        self.analyses[file.resolve()] = analysis
        return analysis

    def load(self, file: Path) -> Loop:
        """A sub-loop's loop, reusing the analysis lint made of it while linting its parent."""
        key = file.resolve()
        if key not in self.analyses:
            self.analyses[key] = self.session.children.get(key) or self.session.lint_file(file, str(file))
        return loop_of(self.analyses[key], file)

    def tree(self, loop: Loop) -> tuple[list[Loop], list[Any]]:
        """The loop with its sub-loops, and lint's findings for every file of them."""
        tree = loop_tree(loop, self.load)
        found = [d for member in tree if member.source
                 for d in self.analyses[member.source.resolve()].diagnostics]
        return tree, found


def audit_project(root: Path, *, store: Path | None = None, days: int = DEFAULT_DAYS, now: datetime | None = None,
                  on_progress: Callable[[str], None] | None = None, loops: list[Path] | None = None,
                  cwd: Path | None = None) -> ProjectAudit:
    """Audit every loop under `root` (or the given loop files); suggested commands name files
    as typed in `cwd` (default: the current folder)."""
    from ..language.diagnostics import LoopError
    from ..adapters.store.run_store import default_store_dir
    from .discover import find_loop_files, sub_loop_files

    root = root.resolve()
    cwd = cwd or Path.cwd()
    files = loops if loops is not None else find_loop_files(root)
    linted = _LintedLoops()
    loaded: dict[Path, Any] = {}
    errors: dict[Path, str] = {}
    for file in files:
        try:
            loaded[file.resolve()] = loop_of(linted.lint(file), file)
        except LoopError as exc:
            first = next((d for d in exc.diagnostics if d.is_error), exc.diagnostics[0])
            errors[file.resolve()] = f"{first.location()}: {first.message} [{first.rule}]"
    parts = sub_loop_files(loaded.values())
    top = [f for f in (p.resolve() for p in files) if f not in parts]
    store_dir = store if store is not None else default_store_dir(root)
    all_runs = _store_runs(store_dir)
    by_loop, broken = _tests_of(root, top, on_progress)
    audits = []
    for file in top:
        shown = _shown(file, root)
        if file in errors:
            audits.append(LoopAudit(Path(shown), file.stem, load_error=errors[file], typed=typed_path(file, cwd)))
            continue
        loop = loaded[file]
        tree, tree_lint = linted.tree(loop)
        ctx = AuditContext(
            loop=loop, file=Path(shown), tree=tree, tests=by_loop.get(file, []),
            runs=None if all_runs is None else [r for r in all_runs if r.get("loop") == loop.name],
            store_dir=store_dir, days=days, now=now or datetime.now(timezone.utc),
            lint=linted.analyses[file].diagnostics, tree_lint=tree_lint, cwd=cwd,
        )
        audits.append(LoopAudit(Path(shown), loop.name, [check(ctx) for check in CHECKS]))
    # A broken test file cannot say which loop it tests: report it on every loop's tests check.
    for outcome in broken:
        for audit in audits:
            for check in audit.checks:
                if check.rule == "tests-pass":
                    check.findings.append(Finding("tests-pass", outcome.label, outcome.failures[0],
                                                  "fix the test file (`loopdsl test` shows the same message)"))
    return ProjectAudit(root, audits, sorted(p for p in parts), store_dir)


def _tests_of(root: Path, top: list[Path], on_progress: Callable[[str], None] | None) -> tuple[dict[Path, list[Any]], list[Any]]:
    """Run the loop tests of the audited loops: their outcomes by loop file, and the broken test files."""
    from .looptest import collect, run_tests

    tests, broken = collect([root])
    by_loop: dict[Path, list[Any]] = {}
    wanted = [t for t in tests if t.loop.resolve() in top]
    if wanted and on_progress:
        on_progress(f"running {len(wanted)} loop test(s)...")
    for outcome in run_tests(wanted):
        by_loop.setdefault(outcome.loop.resolve(), []).append(outcome)  # type: ignore[union-attr]
    return by_loop, broken


def _shown(file: Path, root: Path) -> str:
    try:
        return str(file.relative_to(root))
    except ValueError:
        return str(file)


def format_text(report: ProjectAudit, suggest: bool) -> str:
    lines: list[str] = []
    for audit in report.loops:
        lines.append(f"{audit.file} ({audit.name}): {audit.score}/100")
        if audit.load_error:
            lines.append(f"  FAIL  the loop does not load: {audit.load_error}")
            if suggest:
                lines.append(f"        fix: `loopdsl lint {audit.typed or audit.file}` and fix its errors")
            continue
        for check in audit.checks:
            rule = RULES[check.rule]
            if not check.applicable:
                lines.append(f"  n/a   {rule.id:<21} --    {check.note}")
                continue
            mark = "pass" if check.passed else "FAIL"
            lines.append(f"  {mark}  {rule.id:<21} {check.earned:>2}/{rule.weight:<2} {check.note if check.passed else ''}".rstrip())
            for finding in check.findings:
                lines.append(f"        [{finding.rule}] {finding.where}: {finding.message}")
                if suggest:
                    lines.append(f"          fix: {finding.fix}")
    if report.parts:
        lines.append("sub-loops judged with their parents: " + ", ".join(_shown(p, report.root) for p in report.parts))
    lines.append(f"project: {report.score}/100 ({len(report.loops)} loop{'s' if len(report.loops) != 1 else ''})")
    if not suggest and any(a.findings or a.load_error for a in report.loops):
        lines.append("(--suggest shows how to win each lost point back)")
    return "\n".join(lines)
