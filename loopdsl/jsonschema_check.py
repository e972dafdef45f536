"""Validate data against a user's JSON Schema (llm `schema:`, `json_schema` gates)."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Mapping


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    from jsonschema import Draft7Validator

    return Draft7Validator(json.loads(schema_json))


def schema_errors(schema: Mapping[str, Any], data: Any) -> list[str]:
    """Readable problems, each naming where in the data it is (`$.items[0].title: ...`)."""
    validator = _validator(json.dumps(schema, sort_keys=True))
    problems = []
    for error in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path)):
        problems.append(f"{error.json_path}: {error.message}")
    return problems
