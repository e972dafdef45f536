"""Lint files and folders into one report: which files are loops, one process or forked
workers, the findings in command-line order, and how `loopdsl lint` prints them."""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..language.diagnostics import Diagnostic, format_github, format_json, format_text
from ..language.files import YAML_SUFFIXES, NotARegularFile, exists, is_dir, read_capped, read_head, walk
from .pipeline import INTERNAL_ERROR, LintSession, no_such_file

# A loop file has a top-level `loopdsl:` key; a file someone meant as a loop but forgot
# the version still has `states:`. Checked on the raw text so non-loop YAML (CI configs,
# Helm charts with `{{ }}`) is never parsed at all.
_LOOP_KEY = re.compile(r"^\ufeff?[\"']?loopdsl[\"']?[ \t]*:", re.MULTILINE)
_LOOP_LIKE = re.compile(r"^\ufeff?[\"']?(loopdsl|states)[\"']?[ \t]*:", re.MULTILINE)


@dataclass
class LintReport:
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sources: dict[str, list[str]] = field(default_factory=dict)
    files: int = 0

    @property
    def errors(self) -> int:
        return sum(1 for d in self.diagnostics if d.is_error)

    @property
    def warnings(self) -> int:
        return sum(1 for d in self.diagnostics if not d.is_error)

    def exit_code(self, strict: bool) -> int:
        if any(d.rule == INTERNAL_ERROR for d in self.diagnostics):
            return 3
        if self.errors or (strict and self.warnings):
            return 1
        return 0

    def summary(self) -> str:
        def plural(n: int, word: str) -> str:
            return f"{n} {word}{'' if n == 1 else 's'}"

        return f"{plural(self.errors, 'error')}, {plural(self.warnings, 'warning')} in {plural(self.files, 'file')}"


def is_loop_text(raw: bytes | str, *, explicit: bool = False) -> bool:
    """Whether a YAML file is meant as a loop (or, found in a folder, a versioned library).

    In folders only files with a top-level `loopdsl:` key are linted. A file named on the
    command line is linted if it has `loopdsl:` or `states:`, so a loop that forgot its
    version is still reported, while pre-commit can pass every YAML file of a repository.
    """
    text = raw.decode("utf-8", errors="replace") if isinstance(raw, bytes) else raw
    text = text.replace("\x00", "")  # UTF-16 files: let the loader explain the encoding
    return bool((_LOOP_LIKE if explicit else _LOOP_KEY).search(text))


def _collect(paths: Sequence[str | Path], report: LintReport) -> list[Path]:
    """The files to lint, in order, once each; missing paths become diagnostics."""
    chosen: list[Path] = []
    seen: set[Path] = set()
    for given in paths:
        target = Path(given)
        if not exists(target):
            report.diagnostics.append(no_such_file(str(given)))
            continue
        explicit = not is_dir(target)
        for file in [target] if explicit else walk(target, YAML_SUFFIXES):
            key = file.resolve()
            if key in seen:
                continue
            seen.add(key)
            if file.suffix.lower() in YAML_SUFFIXES or not explicit:
                try:
                    head = read_head(file)
                except NotARegularFile:
                    if not explicit:  # a FIFO or device in a folder is no loop file
                        continue
                    head = b"loopdsl:"  # one named on the command line is read as it comes
                except OSError:
                    head = b"loopdsl:"  # unreadable: lint_file reports why
                if not is_loop_text(head, explicit=explicit):
                    continue
            chosen.append(file)
    return chosen


# Below this many files one process is faster than starting workers.
PARALLEL_MIN_FILES = 24


def _lint_chunk(files: list[Path]) -> tuple[list[Diagnostic], dict[str, list[str]]]:
    session = LintSession()
    found: list[Diagnostic] = []
    for file in files:
        found.extend(session.lint_file(file, str(file)).diagnostics)
    wanted = {d.path for d in found}
    return found, {p: lines for p, lines in session.sources.items() if p in wanted}


def _lint_parallel(files: list[Path], workers: int) -> tuple[list[Diagnostic], dict[str, list[str]]] | None:
    """Lint in forked workers (the parent has already imported and warmed everything, so a
    fork costs little); None when processes cannot be used here."""
    import multiprocessing

    try:
        context = multiprocessing.get_context("fork")
        chunks = [files[i::workers] for i in range(workers)]
        with context.Pool(workers) as pool:
            results = pool.map(_lint_chunk, chunks)
    except (OSError, ValueError, ImportError):
        return None
    by_file: dict[str, list[Diagnostic]] = {}
    sources: dict[str, list[str]] = {}
    for found, lines in results:
        for d in found:
            by_file.setdefault(d.path, []).append(d)
        sources.update(lines)
    # Back to command-line order: a file's own findings first, each file in turn.
    ordered: list[Diagnostic] = []
    for file in files:
        ordered.extend(by_file.pop(str(file), []))
    for rest in by_file.values():
        ordered.extend(rest)
    return ordered, sources


def lint_paths(paths: Sequence[str | Path]) -> LintReport:
    """Lint files and folders; see `is_loop_text` for which YAML files count as loops."""
    report = LintReport()
    files = _collect(paths, report)
    report.files = len(files)
    workers = min(os.cpu_count() or 1, 8)
    result = None
    if len(files) >= PARALLEL_MIN_FILES and workers > 1 and hasattr(os, "fork"):
        first, first_sources = _lint_chunk(files[:1])  # warms imports and caches before forking
        rest = _lint_parallel(files[1:], workers)
        if rest is not None:
            result = (first + rest[0], {**first_sources, **rest[1]})
    if result is None:
        result = _lint_chunk(files)
    report.diagnostics.extend(result[0])
    report.diagnostics = _dedupe(report.diagnostics)
    report.sources = result[1]
    return report


def _dedupe(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[Diagnostic] = set()
    out = []
    for d in diagnostics:
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _source_lines(report: LintReport, path: str) -> list[str] | None:
    if path not in report.sources:
        try:
            report.sources[path] = read_capped(path).decode("utf-8", errors="replace").splitlines()
        except OSError:
            report.sources[path] = []
    return report.sources[path]


FORMATS = ("text", "json", "github")


def run_lint_cli(paths: Sequence[str], fmt: str, strict: bool,
                 also: Callable[[], list[Diagnostic]] | None = None) -> int:
    """`loopdsl lint` / `validate`: print the findings, return the exit code
    (0 clean, 1 findings, 2 usage such as a missing path, 3 internal error). `also`: more
    findings (`--locked`'s), in the same report, counted and formatted with the others."""
    if not paths:
        print("loopdsl lint: give at least one file or folder, e.g. `loopdsl lint loops/`", file=sys.stderr)
        return 2
    if fmt not in FORMATS:
        print(f"loopdsl lint: unknown format {fmt!r}; use one of {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    missing = [p for p in paths if not exists(Path(p))]
    if missing:
        # A mistyped path is a usage error, not a finding in a file that does not exist.
        for given in missing:
            print(f"loopdsl lint: error: no such file or directory: {given}", file=sys.stderr)
        print(f"  hint: paths are relative to the current directory ({Path.cwd()}); "
              "check the spelling, or give a folder such as `loops/`", file=sys.stderr)
        return 2
    try:
        report = lint_paths(paths)
    except Exception as exc:
        print(f"loopdsl lint: internal error: {type(exc).__name__}: {exc} (please report it)", file=sys.stderr)
        return 3
    if also is not None and report.exit_code(strict) != 3:
        report.diagnostics.extend(also())
    if fmt == "json":
        print(format_json(report.diagnostics))
    elif report.diagnostics:
        if fmt == "github":
            print(format_github(report.diagnostics))
        else:
            sources = {d.path: _source_lines(report, d.path) or [] for d in report.diagnostics}
            print(format_text(report.diagnostics, sources))
    if fmt == "text":
        print(report.summary(), file=sys.stderr)
    return report.exit_code(strict)
