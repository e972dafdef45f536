"""How schema findings name things: a YAML path, a value, what a key is for, a list of options."""
from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from typing import Any

from .model import YamlPath
from .schema_files import resolve

TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "empty",
}
SECTION_NOUNS = {"states": "state", "models": "model alias", "gates": "gate", "inputs": "input"}
MAX_SHOWN = 40


def node_name(path: YamlPath) -> str:
    """A path as a user reads it: "state `draft`", "`llm.model` in state `draft`"."""
    if not path:
        return "the top level"
    if len(path) >= 2 and path[0] in SECTION_NOUNS and isinstance(path[1], str):
        owner = f"{SECTION_NOUNS[str(path[0])]} `{path[1]}`"
        rest = path[2:]
        return f"`{dotted(rest)}` in {owner}" if rest else owner
    return f"`{dotted(path)}`"


def dotted(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "an empty value"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        text = value if len(value) <= MAX_SHOWN else value[: MAX_SHOWN - 3] + "..."
        return json.dumps(text, ensure_ascii=False)
    return str(value)


def description(subschema: Any) -> str:
    text = resolve(subschema).get("description") if isinstance(subschema, dict) else None
    if isinstance(subschema, dict) and subschema.get("description"):
        text = subschema["description"]
    return str(text or "see docs/dsl.md").rstrip(".")


def hint_from(subschema: Any, path: YamlPath) -> str:
    """The key's own schema description, which is also what editors show on hover."""
    key = next((p for p in reversed(path) if isinstance(p, str)), "")
    described = description(subschema) if subschema is not None else "see docs/dsl.md"
    if described == "see docs/dsl.md":
        return f"see `{key}` in docs/dsl.md" if key else "see docs/dsl.md"
    return f"`{key}`: {described}" if key else described


def closest(word: str, options: Sequence[str]) -> str | None:
    by_lower = {o.lower(): o for o in options}
    if word.lower() in by_lower:
        return by_lower[word.lower()]
    found = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return found[0] if found else None


def word_list(items: Sequence[str], joiner: str = "and") -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {joiner} {items[-1]}"
