"""JSON Schema validation of loop files, reported as positioned diagnostics.

The published schema (loopdsl/data/loop.schema.json, linked from schemas/) is draft-07
so editors' yaml-language-server understands it. This module validates a document and
places each finding at `file:line:col`; schema_explain.py turns jsonschema's errors into
plain-English findings, schema_files.py holds the schemas and validators. The names other
modules import from here (rule ids, load_schema, validator ...) are re-exported below.
"""
from __future__ import annotations

from typing import NamedTuple

from .diagnostics import Diagnostic, Severity
from .loader import Document
from .model import YamlPath
from .schema_explain import (
    DURATION_PATTERN,
    GATE_REF_PATTERN,
    PATTERN_HELP,
    RULE_MISSING_KEY,
    RULE_ONE_ACTION,
    RULE_OTHER,
    RULE_TYPE,
    RULE_UNKNOWN_KEY,
    RULE_VALUE,
    RULE_VERSION,
    SCHEMA_RULES,
    SUPPORTED_VERSION,
    Finding,
    explain,
)
from .schema_files import SCHEMA_FILES, action_keys, load_schema, validator

__all__ = [
    "DURATION_PATTERN", "GATE_REF_PATTERN", "PATTERN_HELP", "RULE_MISSING_KEY", "RULE_ONE_ACTION", "RULE_OTHER",
    "RULE_TYPE", "RULE_UNKNOWN_KEY", "RULE_VALUE", "RULE_VERSION", "SCHEMA_FILES", "SCHEMA_RULES",
    "SUPPORTED_VERSION", "NodeFinding", "action_keys", "check", "check_nodes", "load_schema", "validator",
]


class NodeFinding(NamedTuple):
    node: YamlPath  # the node the diagnostic is about
    diagnostic: Diagnostic
    about_name: bool  # the node's name (a state, variable ... name) is wrong, not its value


def check(doc: Document, kind: str = "loop") -> list[Diagnostic]:
    """Validate `doc.data` against the schema for its kind of file (see SCHEMA_FILES);
    one diagnostic per offending node."""
    return [found.diagnostic for found in check_nodes(doc, kind)]


def check_nodes(doc: Document, kind: str = "loop") -> list[NodeFinding]:
    """`check`, each diagnostic with the YAML path of the node it is about (lint uses the
    paths to run the semantic rules on every part the schema accepted)."""
    findings: dict[YamlPath, Finding] = {}
    for error in validator(kind).iter_errors(doc.data):
        for finding in explain(error):
            findings.setdefault(finding.node, finding)
    kept = _drop_echoes(list(findings.values()))
    version = [f for f in kept if f.rule == RULE_VERSION]
    if version:
        # A file written for another language version may use keys this version does not
        # know: reporting them would be noise, the version is the one problem to fix.
        kept = version
    found = []
    for f in kept:
        line, col = doc.locate(f.node, value=f.at_value) if f.node else _first_key(doc)
        diagnostic = Diagnostic(path=doc.path, line=line, col=col, severity=Severity.ERROR,
                                rule=f.rule, message=f.message, hint=f.hint)
        found.append(NodeFinding(f.node, diagnostic, f.about_name))
    found.sort(key=lambda item: (item.diagnostic.line, item.diagnostic.col, item.diagnostic.rule))
    return found


def _first_key(doc: Document) -> tuple[int, int]:
    """Whole-file findings point at the first top-level key, past any leading comments."""
    top = [pos for path, pos in doc.positions.items() if len(path) == 1]
    return min(top) if top else (1, 1)


def _drop_echoes(findings: list[Finding]) -> list[Finding]:
    """A misspelt action key (`shel:`) also leaves its state without an action; the
    did-you-mean on the key already says everything, so drop the second report."""
    suggested: dict[YamlPath, set[str]] = {}
    for f in findings:
        if f.rule == RULE_UNKNOWN_KEY and f.suggestion:
            suggested.setdefault(f.node[:-1], set()).add(f.suggestion)
    findings = [f for f in findings if not (f.missing_one_of and suggested.get(f.node, set()) & set(f.missing_one_of))]
    # A state (or reply) with two actions is checked as each kind in turn, and each calls
    # the other action an unknown key: the one-action finding already says it.
    doubled = {f.node[:-1]: set(f.exclusive) for f in findings if f.rule == RULE_ONE_ACTION and not f.missing_one_of}
    return [f for f in findings
            if not (f.rule == RULE_UNKNOWN_KEY and f.node[-1] in doubled.get(f.node[:-1], set()))]
