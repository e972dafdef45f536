"""The lint pipeline: load -> schema -> model -> imports -> semantic rules -> report.

Every problem in every file is collected and reported at once; nothing a user writes
raises. A bug in loopdsl itself becomes one `internal-error` diagnostic (exit 3) so
the other findings are still shown. This module also gives `load_loop`, the entry
point `run`, `graph` and `cost` use: the same checks, then the loop or a LoopError.
"""
from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .rules import (
    calls as rules_calls,
    graph_shape as rules_graph,
    secrets as rules_secrets,
    templates as rules_templates,
)  # noqa: F401  (importing registers their rules)
from . import salvage
from ..language.diagnostics import Diagnostic, LoopError, Severity, format_github, format_json, format_text
from ..language.imports import (
    ImportCache,
    ImportResult,
    display_path,
    is_library,
    lint_library,
    local_clashes,
    resolve_imports,
)
from ..language.files import YAML_SUFFIXES, walk
from ..language.loader import Document, load_document
from ..language.model import Loop
from ..language.model_build import build_loop
from .registry import GRAPH_RULES, RULES, LintContext

INTERNAL_ERROR = "internal-error"
# A loop file has a top-level `loopdsl:` key; a file someone meant as a loop but forgot
# the version still has `states:`. Checked on the raw text so non-loop YAML (CI configs,
# Helm charts with `{{ }}`) is never parsed at all.
_LOOP_KEY = re.compile(r"^\ufeff?[\"']?loopdsl[\"']?[ \t]*:", re.MULTILINE)
_LOOP_LIKE = re.compile(r"^\ufeff?[\"']?(loopdsl|states)[\"']?[ \t]*:", re.MULTILINE)


@dataclass
class Analysis:
    """Everything lint learned about one file."""

    path: str
    diagnostics: list[Diagnostic]
    loop: Loop | None = None
    doc: Document | None = None
    imported: ImportResult | None = None


def _internal(path: str, what: str, exc: BaseException) -> Diagnostic:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    return Diagnostic(
        path, 0, 0, Severity.ERROR, INTERNAL_ERROR,
        f"loopdsl failed while {what}: {type(exc).__name__}: {exc}{at}",
        "this is a bug in loopdsl, not in your file; please report it with the file attached",
    )


def _sort_key(primary: str):  # type: ignore[no-untyped-def]
    return lambda d: (d.path != primary, d.path, d.line, d.col, d.rule, d.message)


class LintSession:
    """One lint invocation: caches imported libraries and sub-loops across files."""

    def __init__(self) -> None:
        self.imports = ImportCache()
        self.children: dict[Path, Analysis] = {}
        self.in_progress: set[Path] = set()
        self.sources: dict[str, list[str]] = {}

    # ------------------------------------------------------------ one file
    def analyze(self, path: str, text: str | bytes, source: Path) -> Analysis:
        key = source.resolve()
        self.in_progress.add(key)
        try:
            analysis = self._analyze(path, text, source)
        except Exception as exc:  # a loopdsl bug: report it as one finding, keep going
            analysis = Analysis(path, [_internal(path, "linting this file", exc)])
        finally:
            self.in_progress.discard(key)
        unique = sorted(set(analysis.diagnostics), key=_sort_key(path))
        analysis.diagnostics = unique
        return analysis

    def _analyze(self, path: str, text: str | bytes, source: Path) -> Analysis:
        doc, diagnostics = load_document(path, text)
        if doc is None:
            return Analysis(path, diagnostics)
        self.sources[path] = doc.lines
        if is_library(doc.data):
            library = lint_library(doc, source, cache=self.imports)
            return Analysis(path, diagnostics + library.diagnostics, doc=doc, imported=library)

        from ..language import schema  # deferred: jsonschema is only needed once a file parsed

        checked = schema.check_nodes(doc)
        schema_findings = [found.diagnostic for found in checked]
        diagnostics += schema_findings
        if any(d.rule == schema.RULE_VERSION for d in schema_findings):
            return Analysis(path, diagnostics, doc=doc)  # another language version: stop here
        accepted = salvage.accepted_parts(
            doc, [found.node for found in checked if not found.about_name],
            lambda part: [found.node for found in schema.check_nodes(part) if not found.about_name],
        ) if checked else salvage.Accepted(doc, (), True)
        if accepted is None:
            return Analysis(path, diagnostics, doc=doc)  # too little the schema accepted
        try:
            loop = build_loop(accepted.doc.data, source)
        except Exception:
            if schema_findings:
                return Analysis(path, diagnostics, doc=doc)  # the data is too broken to model
            raise
        imported = resolve_imports(doc, source, cache=self.imports)
        diagnostics += imported.diagnostics
        diagnostics += local_clashes(doc, imported)
        loop = replace(
            loop,
            gates={**imported.gates, **loop.gates},
            models={**imported.models, **loop.models},
        )
        ctx = LintContext(
            doc=accepted.doc, loop=loop, path=path, source=source, imported=imported,
            analyze_child=self.analyze_child,
            child_display=lambda relative: display_path(path, relative),
            graph_complete=accepted.graph_complete,
        )
        semantic = self._semantic(ctx, graph=accepted.graph_complete, tolerant=bool(schema_findings))
        if schema_findings:
            # One finding per node. For a malformed name the name rule speaks (its id is the
            # documented one); elsewhere, and inside every part the schema rejected, the
            # schema's message wins.
            names = {(d.line, d.col) for d in semantic if d.rule == "bad-name"}
            diagnostics = [d for d in diagnostics if d.path != path or (d.line, d.col) not in names]
            taken = ({(d.line, d.col) for d in schema_findings} | accepted.hidden_positions(doc)) - names
            echoed = accepted.echoed_rules()
            semantic = [d for d in semantic
                        if d.path != path or ((d.line, d.col) not in taken and d.rule not in echoed)]
        return Analysis(path, diagnostics + semantic, loop=loop, doc=doc, imported=imported)

    def _semantic(self, ctx: LintContext, *, graph: bool, tolerant: bool) -> list[Diagnostic]:
        """Every rule's findings. `tolerant`: the schema found errors, so a rule tripping
        over what is left is not a bug worth reporting (the schema errors explain it)."""
        found: list[Diagnostic] = []
        for rule_fn in RULES:
            if not graph and rule_fn.__name__ in GRAPH_RULES:
                continue
            try:
                found.extend(rule_fn(ctx))
            except Exception as exc:
                if not tolerant:
                    found.append(_internal(ctx.path, f"running rule {rule_fn.__name__}", exc))
        return found

    def analyze_child(self, file: Path, shown: str) -> Analysis | None:
        """A sub-loop's analysis; None when it is already being linted (recursion)."""
        key = file.resolve()
        if key in self.in_progress:
            return None
        if key not in self.children:
            try:
                raw = file.read_bytes()
            except OSError as exc:
                return Analysis(shown, [Diagnostic(shown, 0, 0, Severity.ERROR, "missing-file",
                                                   f"cannot read the file: {exc.strerror or exc}")])
            self.children[key] = self.analyze(shown, raw, file)
        return self.children[key]

    def lint_file(self, path: Path, shown: str | None = None) -> Analysis:
        shown = shown if shown is not None else str(path)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return Analysis(shown, [_no_such_file(shown)])
        except OSError as exc:
            return Analysis(shown, [Diagnostic(shown, 0, 0, Severity.ERROR, "file-unreadable",
                                               f"cannot read the file: {exc.strerror or exc}",
                                               "check the path and its permissions")])
        analysis = self.analyze(shown, raw, path)
        self.children.setdefault(path.resolve(), analysis)
        return analysis


def _no_such_file(shown: str) -> Diagnostic:
    return Diagnostic(shown, 0, 0, Severity.ERROR, "no-such-file", "no such file or directory",
                      "check the path (it is relative to the current directory)")


# ================================================================ public API


def lint_source(path: str, text: str | bytes) -> list[Diagnostic]:
    """Lint one loop's text (shown as `path`; relative paths inside resolve against it)."""
    try:
        return LintSession().analyze(path, text, Path(path)).diagnostics
    except Exception as exc:  # pragma: no cover - analyze already guards; belt and braces
        return [_internal(path, "linting this file", exc)]


def lint_file(path: Path) -> list[Diagnostic]:
    return LintSession().lint_file(Path(path)).diagnostics


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
        if not target.exists():
            report.diagnostics.append(_no_such_file(str(given)))
            continue
        explicit = not target.is_dir()
        for file in [target] if explicit else walk(target, YAML_SUFFIXES):
            key = file.resolve()
            if key in seen:
                continue
            seen.add(key)
            if file.suffix.lower() in YAML_SUFFIXES or not explicit:
                try:
                    head = file.read_bytes()
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
            report.sources[path] = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            report.sources[path] = []
    return report.sources[path]


FORMATS = ("text", "json", "github")


def run_lint_cli(paths: Sequence[str], fmt: str, strict: bool) -> int:
    """`loopdsl lint` / `validate`: print the findings, return the exit code
    (0 clean, 1 findings, 2 usage such as a missing path, 3 internal error)."""
    if not paths:
        print("loopdsl lint: give at least one file or folder, e.g. `loopdsl lint loops/`", file=sys.stderr)
        return 2
    if fmt not in FORMATS:
        print(f"loopdsl lint: unknown format {fmt!r}; use one of {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    missing = [p for p in paths if not Path(p).exists()]
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


def load_loop(path: str | Path) -> Loop:
    """The loop at `path` with its imports merged; LoopError if lint finds any error."""
    file = Path(path)
    analysis = LintSession().lint_file(file, str(path))
    errors = [d for d in analysis.diagnostics if d.is_error]
    if errors:
        raise LoopError(errors + [d for d in analysis.diagnostics if not d.is_error])
    if analysis.loop is None:
        raise LoopError([Diagnostic(str(path), 1, 1, Severity.ERROR, "not-a-loop",
                                    "this file has no `states`: it is an import library, not a loop",
                                    "run a loop file; libraries are used through `imports:`")])
    return analysis.loop
