"""docs/dsl.md, the user-facing reference, stays in step with the schema it documents."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from loopdsl.language.loader import load_text
from loopdsl.language.schema import SCHEMA_RULES, check, load_schema

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "dsl.md").read_text(encoding="utf-8")
BACKTICKED = set(re.findall(r"`([^`\n]+)`", DOC))


def property_names(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                yield from value
            yield from property_names(value)
    elif isinstance(node, list):
        for value in node:
            yield from property_names(value)


def test_every_schema_key_is_documented() -> None:
    names = set(property_names(load_schema()))
    assert len(names) > 80  # the walk really found the schema's keys
    assert sorted(n for n in names if n not in BACKTICKED) == []


def test_every_schema_rule_id_is_in_the_lint_rules_section() -> None:
    section = DOC.split("## Lint rules", 1)[1]
    rows = set(re.findall(r"^\| `([a-z-]+)` \|", section, flags=re.MULTILINE))
    assert set(SCHEMA_RULES) <= rows


def test_every_complete_loop_in_the_docs_is_schema_valid() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)
    loops = [b for b in blocks if re.search(r"^loopdsl: ", b, flags=re.MULTILINE)]
    assert loops, "the reference shows at least one complete loop"
    for text in loops:
        doc, problems = load_text(text, "docs/dsl.md")
        assert problems == [] and doc is not None
        assert check(doc) == [], text[:80]


def test_state_snippets_in_the_docs_are_schema_valid() -> None:
    """Snippets of states (`name:` then an indented state) are checked inside a minimal loop."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)
    snippets = [b for b in blocks if re.match(r"[a-z_]+:\n  (shell|llm|evaluate|checkpoint|set|loop):", b)]
    assert len(snippets) >= 5
    for snippet in snippets:
        indented = "".join("  " + line + "\n" for line in snippet.splitlines())
        text = "loopdsl: 1\nname: snippet\nstart: x\nstates:\n" + indented
        doc, problems = load_text(text, "snippet.yaml")
        assert problems == [] and doc is not None, problems
        assert check(doc) == [], snippet[:80]
