"""The JSON Schemas shipped in the package (schemas/ links to them) and the validators lint
builds from them."""
from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Iterator

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
    which editors resolve next to the referring file) are replaced by what they name.

    A reference used in many places is expanded once and shared (the result is a DAG, not a
    tree; ~10x fewer nodes to build). Its expansion depends on the chain of references being
    expanded around it only where that chain holds a reference its body can reach again (a
    recursive one, which stays a `$ref`), so that part of the chain is the memo's key."""
    by_file = {name: kind for kind, name in SCHEMA_FILES.items()}
    reach = _reachable_refs(schema, by_file)
    done: dict[tuple[int, str, frozenset[str]], Any] = {}

    def expand(node: Any, root: dict[str, Any], expanding: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [expand(v, root, expanding) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and len(node) == 1 and ref not in expanding:  # a recursive ref stays
            if ref.startswith("#/definitions/") or ref in by_file:
                key = (id(root), ref, frozenset(expanding) & reach[id(root), ref])
                if key not in done:
                    body, where = _target(root, ref, by_file)
                    done[key] = expand(body, where, expanding + (ref,))
                return done[key]
        return {k: expand(v, root, expanding) for k, v in node.items()}

    inlined: dict[str, Any] = expand(schema, schema, ())
    return inlined


def _target(root: dict[str, Any], ref: str, by_file: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """What a local or sibling-file reference names, and the schema its own refs resolve in."""
    if ref in by_file:
        other = load_schema(by_file[ref])
        return {k: v for k, v in other.items() if k not in ("$schema", "$id", "definitions")}, other
    return pointer(root, ref), root


def _reachable_refs(schema: dict[str, Any], by_file: dict[str, str]) -> dict[tuple[int, str], frozenset[str]]:
    """For each reference (by the schema it is resolved in): every reference its expansion
    can meet, however deep."""
    direct: dict[tuple[int, str], set[tuple[int, str]]] = {}
    roots = {id(schema): schema}
    pending = [(id(schema), ref) for ref in _refs_in(schema)]
    while pending:
        item = pending.pop()
        if item in direct or not (item[1].startswith("#/definitions/") or item[1] in by_file):
            continue
        body, where = _target(roots[item[0]], item[1], by_file)
        roots[id(where)] = where
        direct[item] = {(id(where), ref) for ref in _refs_in(body)}
        pending.extend(direct[item])
    reach = {item: {ref for _, ref in targets} for item, targets in direct.items()}
    changed = True
    while changed:  # a fixed point: the graph has cycles (recursive definitions)
        changed = False
        for item, targets in direct.items():
            grown = reach[item].union(*(reach.get(t, set()) for t in targets))
            if grown != reach[item]:
                reach[item], changed = grown, True
    return {item: frozenset(refs) for item, refs in reach.items()}


def _refs_in(node: Any) -> Iterator[str]:
    """Every `$ref` string under `node` (a superset of the refs expansion replaces)."""
    if isinstance(node, list):
        for item in node:
            yield from _refs_in(item)
    elif isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from _refs_in(value)


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
