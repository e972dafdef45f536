"""The lint pipeline: load -> schema -> model -> imports -> semantic rules -> report.

Every problem in every file is collected and reported at once; nothing a user writes
raises. A bug in loopdsl itself becomes one `internal-error` diagnostic (exit 3) so
the other findings are still shown. This module also gives `load_loop`, the entry
point `run`, `graph` and `cost` use: the same checks, then the loop or a LoopError.
Linting files and folders into one report, and printing it, is in lint/report.py (its
public names are importable from here too).
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .rules import (
    agents as rules_agents,
    calls as rules_calls,
    graph_shape as rules_graph,
    notify as rules_notify,
    publish as rules_publish,
    secrets as rules_secrets,
    sub_loops as rules_sub_loops,
    templates as rules_templates,
    triggers as rules_triggers,
)  # noqa: F401  (importing registers their rules)
from . import salvage
from ..language.diagnostics import Diagnostic, LoopError, Severity
from ..language.files import read_capped
from ..language.imports import (
    ImportCache,
    ImportResult,
    display_path,
    is_library,
    lint_library,
    local_clashes,
    resolve_imports,
)
from ..language.loader import Document, load_document
from ..language.model import Loop
from ..language.model_build import build_loop
from .registry import GRAPH_RULES, RULES, LintContext

if TYPE_CHECKING:
    from .report import FORMATS, PARALLEL_MIN_FILES, LintReport, is_loop_text, lint_paths, run_lint_cli

INTERNAL_ERROR = "internal-error"
# Deeper than any loop needs; shallow enough that linting the chain stays far from Python's
# recursion limit (a 120-deep chain buried a RecursionError in its findings).
MAX_SUB_LOOP_DEPTH = 32


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

    def loop_at(self, path: Path) -> Loop:
        """`load_loop` within this session: a file it already linted (as a sub-loop of another,
        say) is not linted again. `loopdsl lock` of a 30-deep chain of sub-loops linted each
        child once per ancestor: 15.7 s, where `lint` took 0.4 s."""
        analysis = self.children.get(path.resolve())
        return loop_of(analysis if analysis is not None else self.lint_file(path, str(path)), path)

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
            tools={**imported.tools, **loop.tools},
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
        if len(self.in_progress) >= MAX_SUB_LOOP_DEPTH:  # each level is a few Python frames deep
            return Analysis(shown, [Diagnostic(shown, 0, 0, Severity.ERROR, "child-invalid",
                                               f"sub-loops nest more than {MAX_SUB_LOOP_DEPTH} levels deep here",
                                               "flatten the chain of `loop:` states")])
        if key not in self.children:
            try:
                raw = read_capped(file)
            except OSError as exc:
                return Analysis(shown, [Diagnostic(shown, 0, 0, Severity.ERROR, "missing-file",
                                                   f"cannot read the file: {exc.strerror or exc}")])
            self.children[key] = self.analyze(shown, raw, file)
        return self.children[key]

    def lint_file(self, path: Path, shown: str | None = None) -> Analysis:
        shown = shown if shown is not None else str(path)
        try:
            raw = read_capped(path)
        except FileNotFoundError:
            return Analysis(shown, [no_such_file(shown)])
        except OSError as exc:
            return Analysis(shown, [Diagnostic(shown, 0, 0, Severity.ERROR, "file-unreadable",
                                               f"cannot read the file: {exc.strerror or exc}",
                                               "check the path and its permissions")])
        analysis = self.analyze(shown, raw, path)
        self.children.setdefault(path.resolve(), analysis)
        return analysis


def no_such_file(shown: str) -> Diagnostic:
    """A path given to lint that does not exist."""
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


def load_loop(path: str | Path) -> Loop:
    """The loop at `path` with its imports merged; LoopError if lint finds any error."""
    return loop_of(LintSession().lint_file(Path(path), str(path)), path)


def loop_of(analysis: Analysis, path: str | Path) -> Loop:
    """`load_loop` for an analysis a caller's own LintSession made: the loop, or LoopError."""
    errors = [d for d in analysis.diagnostics if d.is_error]
    if errors:
        raise LoopError(errors + [d for d in analysis.diagnostics if not d.is_error])
    if analysis.loop is None:
        raise LoopError([Diagnostic(str(path), 1, 1, Severity.ERROR, "not-a-loop",
                                    "this file has no `states`: it is an import library, not a loop",
                                    "run a loop file; libraries are used through `imports:`")])
    return analysis.loop


# Moved to report.py, which builds on this module: looked up on first use, so importing them
# from here keeps working without an import cycle.
_IN_REPORT = ("FORMATS", "PARALLEL_MIN_FILES", "LintReport", "is_loop_text", "lint_paths", "run_lint_cli")


def __getattr__(name: str) -> Any:
    if name in _IN_REPORT:
        from . import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
