"""Checks of one tool definition shared by lint and the runtime: its `params` as a JSON
Schema, the `{{ args.X }}` its command names, and what those args prove to the shell rules."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

from .agent_model import ToolDef
from .shell_places import InputFacts
from .template_scan import ScanError, scan

# A tool's templates see only these roots (and of `run`, only id and date).
TOOL_TEMPLATE_ROOTS = frozenset({"args", "inputs", "run"})
TOOL_RUN_KEYS = frozenset({"id", "date"})


def schema_problem(tool: ToolDef) -> str | None:
    """Why the arguments' schema is not a valid JSON Schema (draft 7), or None."""
    from jsonschema import Draft7Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft7Validator.check_schema(tool.parameters_schema())
    except SchemaError as exc:
        where = ".".join(str(p) for p in list(exc.path)[1:]) or "params"
        return f"{where}: {exc.message}"
    return None


def default_problems(tool: ToolDef) -> Iterator[tuple[str, str]]:
    """(param, message) for each `default` its own schema refuses, and each `required`
    name that is not a param."""
    from jsonschema import Draft7Validator

    for name, schema in tool.params.items():
        if isinstance(schema, dict) and "default" in schema:
            sub = {k: v for k, v in schema.items() if k != "default"}
            errors = list(Draft7Validator(sub).iter_errors(schema["default"]))
            if errors:
                yield name, f'the default of param "{name}" does not match its schema: {errors[0].message}'
    for name in tool.required:
        if name not in tool.params:
            yield name, f'"{name}" is required but is not one of the params'


def names_used(source: str) -> list[tuple[str, str | None]]:
    """(root, attr) of each name a template reads; [] when it does not parse (the syntax
    check reports that)."""
    try:
        return [(u.root, u.attr) for u in scan(source).uses]
    except ScanError:
        return []


def tool_facts(facts: InputFacts, tool: ToolDef) -> InputFacts:
    """The shell rules' facts for this tool: its `integer` params may stand in arithmetic."""
    integers = frozenset(n for n, s in tool.params.items() if isinstance(s, dict) and s.get("type") == "integer")
    return replace(facts, arg_integers=integers) if integers else facts


def optional_without_default(tool: ToolDef) -> set[str]:
    """Params the model may leave out and that have no default: a command may not name them
    (the placeholder would have no value)."""
    return {n for n, s in tool.params.items()
            if n not in tool.required and not (isinstance(s, dict) and "default" in s)}
