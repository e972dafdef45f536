"""The JSON Schemas shipped in the package (schemas/ links to them) and the validators lint
builds from them."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from jsonschema import Draft7Validator

# The schemas loopdsl publishes (schemas/ links to these package copies), by kind of file.
SCHEMA_FILES = {"loop": "loop.schema.json", "test": "test.schema.json", "replies": "replies.schema.json"}


@lru_cache(maxsize=None)
def load_schema(kind: str = "loop") -> dict[str, Any]:
    """A schema shipped inside the package. Shared and cached: do not mutate it."""
    text = resources.files("loopdsl").joinpath("data").joinpath(SCHEMA_FILES[kind]).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@lru_cache(maxsize=None)
def validator(kind: str = "loop", shortcuts: bool = True) -> Draft7Validator:
    """One validator per kind for the process, built from the schema with its `$ref`s inlined:
    jsonschema resolves a reference on every visit, and inlining makes lint ~20% faster.
    Patterns match as JSON Schema says (ECMA `$`: a name never ends in a newline).
    `shortcuts`: go straight to a state's (or reply's) kind definition instead of through
    the editors' `if/then` dispatcher (language.kind_dispatch; same errors, half the time)."""
    from jsonschema import validators

    from .kind_dispatch import KEYWORD, by_kind, with_kind_shortcuts
    from .user_schema import validator_class

    inlined = _inline_refs(load_schema(kind))
    if not shortcuts:
        plain: Draft7Validator = validator_class()(inlined, format_checker=Draft7Validator.FORMAT_CHECKER)
        return plain
    fast = validators.extend(validator_class(), {KEYWORD: by_kind})
    built: Draft7Validator = fast(with_kind_shortcuts(inlined), format_checker=Draft7Validator.FORMAT_CHECKER)
    return built


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Local refs (`#/definitions/...`) and refs to a sibling schema file (`replies.schema.json`,
    which editors resolve next to the referring file) are replaced by what they name."""
    by_file = {name: kind for kind, name in SCHEMA_FILES.items()}

    def expand(node: Any, root: dict[str, Any], expanding: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [expand(v, root, expanding) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and len(node) == 1 and ref not in expanding:  # a recursive ref stays
            if ref.startswith("#/definitions/"):
                return expand(pointer(root, ref), root, expanding + (ref,))
            if ref in by_file:
                other = load_schema(by_file[ref])
                body = {k: v for k, v in other.items() if k not in ("$schema", "$id", "definitions")}
                return expand(body, other, expanding + (ref,))
        return {k: expand(v, root, expanding) for k, v in node.items()}

    inlined: dict[str, Any] = expand(schema, schema, ())
    return inlined


def pointer(schema: dict[str, Any], ref: str) -> Any:
    """The node a local JSON pointer (`#/definitions/state_keys/properties/next`) names."""
    node: Any = schema
    for part in ref.lstrip("#/").split("/"):
        node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
    return node


def action_keys() -> tuple[str, ...]:
    """The keys that give a state its kind, in the schema's order (`state.oneOf`)."""
    return tuple(str(b["required"][0]) for b in load_schema()["definitions"]["state"]["oneOf"])


def resolve(subschema: Any) -> dict[str, Any]:
    """Follow a local `#/definitions/...` reference (the only kind the schema uses)."""
    seen = 0
    while isinstance(subschema, dict) and "$ref" in subschema and seen < 10:
        subschema, seen = pointer(load_schema(), str(subschema["$ref"])), seen + 1
    return subschema if isinstance(subschema, dict) else {}
