"""Validate data against a user's JSON Schema (llm `schema:`, `json_schema` gates)."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Mapping


class InvalidSchema(ValueError):
    """The user's schema itself is not a valid draft-07 schema."""


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    from jsonschema import Draft7Validator
    from jsonschema.exceptions import SchemaError

    schema = json.loads(schema_json)
    try:
        Draft7Validator.check_schema(schema)
    except SchemaError as exc:
        raise InvalidSchema(exc.message) from None
    return Draft7Validator(schema)


def schema_errors(schema: Mapping[str, Any], data: Any) -> list[str]:
    """Readable problems in a stable order, each naming where in the data it is
    (`$.items[0].title: ...`). Raises InvalidSchema for a schema that is not one."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(data), key=lambda e: ([str(p) for p in e.absolute_path], e.message))
    return [f"{error.json_path}: {error.message}" for error in errors]
