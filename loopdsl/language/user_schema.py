"""Validate data against a JSON Schema: the loop schema (lint) and a user's schemas (llm
`schema:`, `json_schema` gates), with two corrections to the `jsonschema` library.

- ECMA regular expressions, as JSON Schema specifies: `$` matches only at the very end.
  Python's `re` also lets `$` match before a final newline, so `"x\\n"` passed a name
  pattern such as `^[a-z]+$`. Patterns are translated (`$` -> `\\Z`) before matching.
- A deadline. A user's `pattern` can backtrack catastrophically (`^(a+)+$` on "aaaa...!")
  and hang the run past every timeout. Untrusted validation matches with the `regex`
  engine, whose matching stops at a timeout, and gives up with SchemaTimeout when the
  deadline for the whole validation passes.
"""
from __future__ import annotations

import json
import re
import time
from contextvars import ContextVar
from functools import lru_cache
from typing import Any, Iterator, Mapping

# Seconds one validation of untrusted data may take.
VALIDATION_TIMEOUT_S = 2.0

_DEADLINE: ContextVar[float | None] = ContextVar("loopdsl_schema_deadline", default=None)


class InvalidSchema(ValueError):
    """The user's schema itself is not a valid draft-07 schema."""


class SchemaTimeout(Exception):
    """Validation ran past its deadline (a pattern that backtracks without end)."""


def ecma_pattern(pattern: str) -> str:
    """`pattern` with every `$` anchor (outside escapes and character classes) made `\\Z`,
    so it matches only at the end of the text as in ECMA-262."""
    out: list[str] = []
    in_class = escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            out.append(r"\Z")
            continue
        out.append(char)
    return "".join(out)


@lru_cache(maxsize=1024)
def _compiled(pattern: str, untrusted: bool) -> Any:
    if untrusted:
        import regex  # the engine with a matching timeout; only untrusted data needs it

        return regex.compile(ecma_pattern(pattern))
    return re.compile(ecma_pattern(pattern))


def search(pattern: str, text: str) -> bool:
    """ECMA-style `pattern` found in `text`, within the current validation's deadline."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return _compiled(pattern, False).search(text) is not None
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise SchemaTimeout(pattern)
    try:
        return _compiled(pattern, True).search(text, timeout=remaining) is not None
    except TimeoutError:
        raise SchemaTimeout(pattern) from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not search(pattern, instance):
        shown = repr(instance) if len(instance) <= 80 else repr(instance[:80]) + "..."
        yield ValidationError(f"{shown} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Mapping[str, Any], instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator: Any, additional: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "object"):
        return
    known = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [key for key in instance
              if key not in known and not any(search(p, key) for p in patterns)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        shown = ", ".join(repr(extra) for extra in sorted(extras, key=str))
        if patterns:
            yield ValidationError(f"{shown} do not match any of the regexes: {', '.join(map(repr, sorted(patterns)))}")
        else:
            yield ValidationError(f"Additional properties are not allowed ({shown} unexpected)")


@lru_cache(maxsize=1)
def validator_class() -> Any:
    """Draft 7 with ECMA patterns under the deadline (used by lint's schema check too)."""
    from jsonschema import Draft7Validator, validators

    return validators.extend(Draft7Validator, {
        "pattern": _pattern, "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    })


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    from jsonschema.exceptions import SchemaError

    schema = json.loads(schema_json)
    cls = validator_class()
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise InvalidSchema(exc.message) from None
    return cls(schema)


def schema_errors(schema: Mapping[str, Any], data: Any, timeout: float = VALIDATION_TIMEOUT_S) -> list[str]:
    """Readable problems in a stable order, each naming where in the data it is
    (`$.items[0].title: ...`). Raises InvalidSchema for a schema that is not one (or that
    refers to a schema it cannot resolve) and SchemaTimeout past `timeout` seconds."""
    from referencing.exceptions import Unresolvable

    validator = _validator(json.dumps(schema, sort_keys=True))
    token = _DEADLINE.set(time.monotonic() + timeout)
    try:
        errors = sorted(validator.iter_errors(data), key=lambda e: ([str(p) for p in e.absolute_path], e.message))
    except Unresolvable as exc:
        raise InvalidSchema(f"cannot resolve {exc}") from None
    finally:
        _DEADLINE.reset(token)
    return [f"{error.json_path}: {error.message}" for error in errors]
