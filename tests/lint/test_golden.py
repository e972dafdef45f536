"""Golden lint tests (actionlint's style).

Each tests/data/err/NAME.yaml has NAME.out beside it: the exact diagnostics lint must
print for it, one `path:line:col: severity: message [rule]` per line, paths relative to
the repository root. Each tests/data/ok/NAME.yaml must lint with no finding at all.
Files under the `parts/` folders are skills, libraries and sub-loops the cases use.

Regenerate the .out files with `UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`
and read every changed line before committing it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from loopdsl.language.diagnostics import format_plain
from loopdsl.lint.pipeline import LintSession

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
ERR_CASES = sorted(p.stem for p in (DATA / "err").glob("*.yaml"))
OK_CASES = sorted(p.stem for p in (DATA / "ok").glob("*.yaml"))
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def lint_lines(relative: str) -> list[str]:
    diagnostics = LintSession().lint_file(REPO / relative, relative).diagnostics
    return [format_plain(d) for d in diagnostics]


@pytest.mark.parametrize("name", ERR_CASES)
def test_err_case(name: str) -> None:
    relative = f"tests/data/err/{name}.yaml"
    got = lint_lines(relative)
    expected_file = DATA / "err" / f"{name}.out"
    if UPDATE:
        expected_file.write_text("".join(line + "\n" for line in got), encoding="utf-8")
    assert expected_file.exists(), f"{expected_file} is missing: run with UPDATE_GOLDEN=1 and review it"
    expected = expected_file.read_text(encoding="utf-8").splitlines()
    assert got == expected
    assert any(": error: " in line or ": warning: " in line for line in got), "an err case must find something"


@pytest.mark.parametrize("name", OK_CASES)
def test_ok_case(name: str) -> None:
    assert lint_lines(f"tests/data/ok/{name}.yaml") == []


def test_every_rule_has_a_failing_case() -> None:
    """Each rule id lint can report appears in at least one .out file."""
    from loopdsl.language import schema

    seen = set()
    for out in (DATA / "err").glob("*.out"):
        for line in out.read_text(encoding="utf-8").splitlines():
            seen.add(line.rsplit("[", 1)[-1].rstrip("]"))
    semantic = {
        "unknown-state", "unknown-model", "unknown-gate", "unknown-input", "unknown-secret",
        "reserved-name", "bad-name", "unreachable-state", "no-path-to-end", "unbounded-cycle",
        "expr-syntax", "template-syntax", "undefined-variable", "missing-file", "skill-sections",
        "no-default-transition", "shell-quote-single", "shell-quote-heredoc", "shell-quote-backtick",
        "shell-statement", "secret-in-command", "secret-in-prompt", "shell-unsafe-raw",
        "llm-max-tokens", "max-tokens-over-limit", "unknown-price", "checkpoint-unattended", "evaluator-mirrors-generator",
        "with-unknown-input", "with-missing-input", "with-type", "child-invalid", "child-secret",
        "gate-needs-value", "import-cycle", "import-clash", "import-invalid", "loop-recursion",
        "bad-schedule", "shell-arithmetic", "shell-escaped-placeholder", "params-cost",
        "secret-outside-env", "secret-not-passed", "secret-with-model-output",
        "cwd-outside-workspace", "shell-name", "shell-code",
        "shell-command-name", "shell-place", "shell-syntax", "shell-option",
        "unknown-tool", "tool-description", "tool-params", "tool-unknown-arg", "tool-template",
        "tool-shadows-builtin", "duplicate-tool-name", "tool-writes-without-worktree", "tool-secret-with-writer",
        "tool-approve-unattended", "agent-max-turns", "mcp-allow", "cli-max-turns", "tool-scalar-arg",
        "cli-max-cost", "cli-full-permissions", "agent-tool-choice", "agent-unreviewed", "mcp-env",
        "notify-status", "notify-url", "notify-url-credential", "notify-secret",
        "publish-token", "publish-worktree", "publish-number", "publish-branch", "publish-ends",
        "on-input-unknown", "on-event-path", "on-input-type", "on-input-missing",
    }
    loader = {
        "yaml-syntax", "yaml-duplicate-key", "yaml-tag", "yaml-anchor-bomb", "yaml-too-deep",
        "yaml-empty", "yaml-not-mapping", "yaml-multi-document", "yaml-encoding", "yaml-non-string-key",
    }
    schema_rules = set(schema.SCHEMA_RULES) - {schema.RULE_OTHER}
    missing = (semantic | loader | schema_rules) - seen
    assert not missing, f"rules without a golden case: {sorted(missing)}"


def test_every_err_case_has_a_close_passing_twin_or_is_a_file_level_case() -> None:
    twins = set(OK_CASES)
    file_level = {n for n in ERR_CASES if n.startswith(("yaml_", "schema_", "unsupported_"))}
    shared = {  # err cases whose passing twin is another ok file
        "unknown_state_start": "unknown_state", "unknown_secret": "secret_in_prompt",
        "dead_end_state": "no_path_to_end", "no_default_transition": "no_path_to_end",
        "shell_block_scalar": "shell_quote_heredoc", "skill_sections": "missing_file_skill",
        "import_cycle": "missing_file_import", "import_clash": "missing_file_import",
        "import_invalid": "missing_file_import", "with_unknown_input": "missing_file_loop",
        "with_missing_input": "missing_file_loop", "child_invalid": "missing_file_loop",
        "loop_recursion": "fan_out", "many_problems": "unknown_state",
    }
    for name in ERR_CASES:
        if name in file_level:
            continue
        assert name in twins or shared.get(name) in twins, f"{name} has no passing twin"


def test_rule_catalogue_covers_what_the_golden_cases_report() -> None:
    from loopdsl.lint.registry import RULE_DOCS

    reported = set()
    for out in (DATA / "err").glob("*.out"):
        for line in out.read_text(encoding="utf-8").splitlines():
            reported.add(line.rsplit("[", 1)[-1].rstrip("]"))
    semantic = {r for r in reported if not r.startswith(("yaml-", "schema")) and r != "unsupported-version"}
    assert semantic <= set(RULE_DOCS), sorted(semantic - set(RULE_DOCS))
