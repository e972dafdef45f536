"""A shortcut through the schema's per-kind dispatcher, for lint's own validator.

The published loop schema picks a state's definition by its action key with one `if/then`
per kind, because that is the form editors understand. jsonschema evaluates every `if` of
every state: eight sub-validations per state, about half of lint's time on a large file.
When a mapping has exactly one of the kind keys, the dispatcher's `oneOf` passes, only that
kind's `if` holds, and the errors it yields are exactly the errors of that kind's
definition, in the same order. So lint's validator goes straight to the definition in that
case and keeps the whole dispatcher for every other one (no kind key, two of them, not a
mapping): the diagnostics are the same either way, only cheaper to find.
"""
from __future__ import annotations

from typing import Any, Iterator

KEYWORD = "loopdsl_by_kind"

# The only keys a dispatcher node may have for the shortcut to be exact: `type: object` is
# satisfied by any mapping, and the rest are annotations.
_DISPATCHER_KEYS = {"type", "title", "description", "oneOf", "allOf"}
_REQUIRED_KEYS = {"type", "oneOf", "allOf"}
# A gated dispatcher (replies): one kind tested first by `if`, the others under `else`.
_GATE_KEYS = {"if", "then", "else"}


def with_kind_shortcuts(schema: Any, _done: dict[int, Any] | None = None) -> Any:
    """A copy of `schema` in which every per-kind dispatcher is wrapped in KEYWORD. A node
    shared by several parents (inlined references are) is copied once and stays shared."""
    done: dict[int, Any] = {} if _done is None else _done
    if isinstance(schema, (list, dict)) and id(schema) in done:
        return done[id(schema)]
    if isinstance(schema, list):
        done[id(schema)] = [with_kind_shortcuts(item, done) for item in schema]
        return done[id(schema)]
    if not isinstance(schema, dict):
        return schema
    done[id(schema)] = _wrapped({key: with_kind_shortcuts(value, done) for key, value in schema.items()})
    return done[id(schema)]


def _wrapped(copied: dict[str, Any]) -> dict[str, Any]:
    """`copied` (children already done), its dispatcher moved under KEYWORD if it is one."""
    kinds = _kinds(copied)
    if not kinds:
        return copied
    # The wrapper keeps `type` and the annotations where they were (an enclosing `oneOf` looks
    # at its branches' types, hints read the description); the dispatcher itself moves under
    # KEYWORD, without the `type` the wrapper already checks.
    wrapper = {key: value for key, value in copied.items() if key not in ("oneOf", "allOf", *_GATE_KEYS)}
    wrapper[KEYWORD] = {"kinds": kinds, "whole": {key: value for key, value in copied.items() if key != "type"}}
    return wrapper


def _kinds(node: dict[str, Any]) -> dict[str, Any] | None:
    """{kind key: its definition} when `node` is a dispatcher of one of the expected shapes,
    else None."""
    if node.get("type") != "object" or set(node) - _DISPATCHER_KEYS - _GATE_KEYS:
        return None
    order = list(node)
    rest = [order.index(key) for key in ("oneOf", "allOf", "if") if key in node]
    if rest and order.index("type") > min(rest):
        return None  # the wrapper checks `type` first, as the node itself must
    if "if" in node:
        return _gated_kinds(node)
    if _REQUIRED_KEYS - set(node) or set(node) & _GATE_KEYS:
        return None
    return _plain_kinds(node, ())


def _gated_kinds(node: dict[str, Any]) -> dict[str, Any] | None:
    """`if: {required: [g]}, then: G, else: <dispatcher without type>`: the replies' form,
    where a tool turn (`tool_calls`, which may carry `text`) is checked before the one-of-
    the-others dispatcher. With exactly one kind key present the `if` decides alone: `g`
    present -> G's errors; absent -> `else`, whose `oneOf` passes, so only that kind's `if`."""
    if set(node) & {"oneOf", "allOf"} or _GATE_KEYS - set(node):
        return None
    gate, inner = _single_required(node["if"]), node["else"]
    if gate is None or not isinstance(inner, dict) or set(inner) != {"oneOf", "allOf"}:
        return None
    kinds = _plain_kinds(inner, (gate,))
    if kinds is None or gate in kinds:
        return None
    return {gate: node["then"], **kinds}


def _plain_kinds(node: dict[str, Any], outer: tuple[str, ...]) -> dict[str, Any] | None:
    """`oneOf: [{required: [k]} ...]` and `allOf: [{if: {required: [k]}, then: ...} ...]`,
    plus at most one entry for "none of the keys" (false whenever one key is present; under a
    gate it may also name the gate's key, which is absent there anyway)."""
    one_of, all_of = node.get("oneOf"), node.get("allOf")
    if not (isinstance(one_of, list) and isinstance(all_of, list)):
        return None
    keys = [_single_required(branch) for branch in one_of]
    if any(key is None for key in keys) or len(set(keys)) != len(keys):
        return None
    kinds: dict[str, Any] = {}
    none_of = [{"allOf": [{"not": {"required": [key]}} for key in keys + list(extra)]}
               for extra in {(), outer}]
    for entry in all_of:
        if not (isinstance(entry, dict) and set(entry) == {"if", "then"}):
            return None
        key = _single_required(entry["if"])
        if key in keys and key not in kinds:
            kinds[key] = entry["then"]
        elif not any(_same_conditions(entry["if"], expected) for expected in none_of):
            return None
    return kinds if set(kinds) == set(keys) else None


def _single_required(node: Any) -> str | None:
    if isinstance(node, dict) and set(node) == {"required"} and isinstance(node["required"], list) \
            and len(node["required"]) == 1 and isinstance(node["required"][0], str):
        return str(node["required"][0])
    return None


def _same_conditions(node: Any, expected: dict[str, Any]) -> bool:
    """`node` is `allOf` of the same `not: {required: [k]}` terms as `expected`, in any order."""
    if not (isinstance(node, dict) and set(node) == {"allOf"} and isinstance(node["allOf"], list)):
        return False
    return sorted(map(repr, node["allOf"])) == sorted(map(repr, expected["allOf"]))


def by_kind(validator: Any, spec: dict[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    """KEYWORD's check: the kind's own definition when exactly one kind key is given."""
    if isinstance(instance, dict):
        present = [key for key in spec["kinds"] if key in instance]
        if len(present) == 1:
            yield from validator.descend(instance, spec["kinds"][present[0]])
            return
    yield from validator.descend(instance, spec["whole"])
