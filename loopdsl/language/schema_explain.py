"""One jsonschema error -> plain-English findings, each about one YAML node, with a hint.

jsonschema's raw messages are written for schema authors ("{...} is not valid under any of
the given schemas"); each handler here explains one kind of failed keyword in words a user
can act on. Rule ids are part of the public contract (docs/dsl.md, "Lint rules").
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError

from .model import YamlPath
from .schema_files import action_keys, load_schema, resolve, validator
from .schema_words import TYPE_WORDS, closest, description, hint_from, node_name, show, word_list

RULE_UNKNOWN_KEY = "schema-unknown-key"
RULE_MISSING_KEY = "schema-missing-key"
RULE_TYPE = "schema-type"
RULE_VALUE = "schema-value"
RULE_ONE_ACTION = "schema-one-action"
RULE_OTHER = "schema"
RULE_VERSION = "unsupported-version"
SCHEMA_RULES = (
    RULE_UNKNOWN_KEY, RULE_MISSING_KEY, RULE_TYPE, RULE_VALUE, RULE_ONE_ACTION, RULE_OTHER, RULE_VERSION,
)
SUPPORTED_VERSION = 1

# What each pattern in the schema means, in words a user can act on. A test checks that
# every pattern used by the schema has an entry here.
DURATION_PATTERN = r"^(\d+(\.\d+)?(ms|s|m|h|d))+$"
GATE_REF_PATTERN = r"^([a-z][a-z0-9_]*\.)?[a-z][a-z0-9_-]*$"
# Name patterns and the separator a suggested rename uses.
_NAME_SEPARATORS = {r"^[a-z][a-z0-9_]*$": "_", r"^[a-z][a-z0-9-]*$": "-", r"^[a-z][a-z0-9_-]*$": "-"}

PATTERN_HELP: dict[str, str] = {
    r"^[a-z][a-z0-9_]*$": "use lowercase letters, digits and '_', starting with a letter",
    r"^[a-z][a-z0-9-]*$": "use lowercase letters, digits and '-', starting with a letter",
    r"^[a-z][a-z0-9_]{0,63}$": "use lowercase letters, digits and '_', starting with a letter, at most 64 characters",
    r"^[a-z][a-z0-9_-]*$": "use lowercase letters, digits, '_' and '-', starting with a letter",
    GATE_REF_PATTERN: (
        "a gate given as a string must be `python_syntax`, `no_secrets` or the name of a gate "
        "under top-level `gates` (or `alias.name` from an import); to run a command write "
        '`{shell: "..."}`'
    ),
    DURATION_PATTERN: (
        "a duration is number+unit parts such as 30s, 5m, 1h30m, 250ms or 2d, or a number of seconds"
    ),
    r"^[A-Z_][A-Z0-9_]*$": "an environment variable name: uppercase letters, digits and '_'",
    r"^[A-Za-z_][A-Za-z0-9_]*$": "an environment variable name: letters, digits and '_', not starting with a digit",
    r"^/[A-Za-z][A-Za-z0-9_-]*$": "a comment command is '/' then a word, e.g. /triage",
    r"^https?://": "a URL starting with http:// or https://",
    r"^(?!.*\$\{\{)[^\s~^:\\\x00-\x1f]+$": (
        "a branch name or glob as GitHub matches them (`main`, `release/*`): no spaces, no `~ ^ :` or "
        "backslash, and no `${{ }}` expression (a workflow's filter cannot use one)"
    ),
}
_NAME_NOUNS = {
    "states": "state name", "models": "model alias name", "gates": "gate name", "inputs": "input name",
    "set": "variable name", "env": "environment variable name",
}


@dataclass(frozen=True)
class Finding:
    node: YamlPath  # the YAML node the finding is about (one finding per node)
    at_value: bool  # point at the node's value rather than its key
    rule: str
    message: str
    hint: str
    suggestion: str | None = None  # did-you-mean target, for unknown keys
    missing_one_of: tuple[str, ...] = ()  # the alternatives, when none of them is given
    about_name: bool = False  # a key (state, variable ... name) breaks a naming rule
    exclusive: tuple[str, ...] = ()  # the alternatives, when more than one of them is given


def explain(error: ValidationError) -> list[Finding]:
    """The findings one validation error stands for (usually one)."""
    path: YamlPath = tuple(error.absolute_path)
    handler = _HANDLERS.get(str(error.validator), _explain_other)
    return handler(error, path)


def _explain_additional(error: ValidationError, path: YamlPath) -> list[Finding]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    allowed = sorted(error.schema.get("properties", {}))
    findings = []
    for key in instance:
        if key in allowed:
            continue
        misplaced = _misplaced_state_key(path, str(key), instance)
        if misplaced is not None:
            findings.append(misplaced)
            continue
        guess = closest(str(key), allowed)
        where = node_name(path)
        message = f"unknown key `{key}` in {where}"
        later = _not_in_v11(path, str(key))
        if later is not None:
            findings.append(Finding(path + (key,), False, RULE_UNKNOWN_KEY, f"{message}: {later[0]}", later[1]))
            continue
        if guess:
            message += f"; did you mean `{guess}`?"
            hint = f"rename `{key}` to `{guess}`"
        else:
            hint = f"remove `{key}`; keys allowed here: {word_list(allowed)}"
        findings.append(Finding(path + (key,), False, RULE_UNKNOWN_KEY, message, hint, guess))
    return findings


# Keys users of other agent frameworks reach for that v1.1 leaves out on purpose (DSL.md,
# "Not in v1.1"): (where, key) -> (what is missing, what to do instead).
_LATER = {
    ("mcp", "url"): ("remote (HTTP) MCP servers are not in v1.1", "run the server over stdio with `command:`"),
    ("mcp", "transport"): ("only stdio MCP servers are in v1.1", "remove `transport` and give `command:`"),
    ("agent", "handoffs"): ("handoffs between agents are not in v1.1",
                            "make each agent a state and route between them with `next`/`transitions`"),
    ("agent", "handoff"): ("handoffs between agents are not in v1.1",
                           "make each agent a state and route between them with `next`/`transitions`"),
    ("agent", "images"): ("images to the model are not in v1.1", "describe what the model needs in the prompt"),
    ("agent", "compaction"): ("conversation compaction is not in v1.1",
                              "lower `max_turns` or `tool_output_limit`, or split the work into states"),
}


def _not_in_v11(path: YamlPath, key: str) -> tuple[str, str] | None:
    where = "mcp" if path[-1:] == ("mcp",) and path[:1] == ("tools",) else \
        "agent" if path[-1:] == ("agent",) and path[:1] == ("states",) else None
    return _LATER.get((where, key)) if where else None


def _misplaced_state_key(path: YamlPath, key: str, state: dict[str, Any]) -> Finding | None:
    """A state key that exists, but not on this kind of state: say which kinds take it."""
    definitions = load_schema()["definitions"]
    actions = action_keys()
    kind = next((a for a in actions if a in state), None)
    if not (len(path) == 2 and path[0] == "states") or kind is None or key in actions \
            or key not in definitions["state_keys"]["properties"]:
        return None
    if kind == "end":
        reason = "an `end` state is terminal: it has no action to retry, gate or route from"
    else:
        kinds = [f"`{a}`" for a in actions if key in definitions[f"state_{a}"]["properties"]]
        reason = f"only allowed on {word_list(kinds, joiner='or')} states"
    owner = node_name(path)
    return Finding(path + (key,), False, RULE_UNKNOWN_KEY, f"`{key}` is not allowed in {owner}: {reason}",
                    f"remove `{key}` from {owner}")


def _explain_required(error: ValidationError, path: YamlPath) -> list[Finding]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    missing = [k for k in error.validator_value if k not in instance]
    properties = error.schema.get("properties", {})
    keys = word_list([f"`{k}`" for k in missing])
    noun = "key" if len(missing) == 1 else "keys"
    message = f"{node_name(path)} is missing the required {noun} {keys}"
    if path == () and "loopdsl" in missing:
        hints = ["start the file with `loopdsl: 1`"]
        hints += [f"add `{k}:` ({description(properties.get(k))})" for k in missing if k != "loopdsl"]
    else:
        hints = [f"add `{k}:` ({description(properties.get(k))})" for k in missing]
    return [Finding(path, False, RULE_MISSING_KEY, message, "; ".join(hints))]


def _explain_type(error: ValidationError, path: YamlPath) -> list[Finding]:
    expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    wanted = word_list([TYPE_WORDS.get(str(t), str(t)) for t in expected], joiner="or")
    if path == () and error.schema.get("title") == load_schema()["title"]:
        message = f"a loop file must be a mapping of keys (loopdsl, name, start, states ...), not {show(error.instance)}"
        return [Finding(path, True, RULE_TYPE, message, "start from `loopdsl init` or the example in docs/dsl.md")]
    if path == ():
        message = f"a {error.schema.get('title', 'file')} must be {wanted}, not {show(error.instance)}"
        return [Finding(path, True, RULE_TYPE, message, description(error.schema))]
    message = f"{node_name(path)} must be {wanted}, not {show(error.instance)}"
    return [Finding(path, True, RULE_TYPE, message, hint_from(error.schema, path))]


def _explain_enum(error: ValidationError, path: YamlPath) -> list[Finding]:
    options = [str(o) for o in error.validator_value]
    message = f"{node_name(path)} must be one of {word_list(options, joiner='or')}, not {show(error.instance)}"
    guess = closest(str(error.instance), options) if isinstance(error.instance, str) else None
    hint = f"did you mean `{guess}`?" if guess else hint_from(error.schema, path)
    return [Finding(path, True, RULE_VALUE, message, hint)]


def _explain_const(error: ValidationError, path: YamlPath) -> list[Finding]:
    if path == ("loopdsl",):
        message = (
            f"unsupported language version {show(error.instance)}: "
            f"this loopdsl reads version {SUPPORTED_VERSION}"
        )
        hint = f"write `loopdsl: {SUPPORTED_VERSION}`"
        if isinstance(error.instance, str):
            hint += " (a number, without quotes)"
        else:
            hint += ", or upgrade loopdsl if the file was written for a newer version"
        return [Finding(path, True, RULE_VERSION, message, hint)]
    wanted = error.validator_value
    message = f"{node_name(path)} must be {show(wanted)}, not {show(error.instance)}"
    return [Finding(path, True, RULE_VALUE, message, hint_from(error.schema, path))]


def _explain_pattern(error: ValidationError, path: YamlPath) -> list[Finding]:
    pattern = str(error.validator_value)
    help_text = PATTERN_HELP.get(pattern, f"it must match {pattern}")
    if "propertyNames" in error.absolute_schema_path:
        # The offending thing is a key (a state, model, gate or input name), not a value.
        noun = _NAME_NOUNS.get(str(path[-1]) if path else "", "key")
        node = path + (error.instance,)
        message = f"{noun} `{error.instance}` is not valid: {help_text}"
        return [Finding(node, False, RULE_VALUE, message, _pattern_fix(pattern, error.instance), about_name=True)]
    message = f"{node_name(path)} {show(error.instance)} is not valid: {help_text}"
    return [Finding(path, True, RULE_VALUE, message, _pattern_fix(pattern, error.instance, path))]


def _pattern_fix(pattern: str, value: Any, path: YamlPath = ()) -> str:
    """A concrete replacement when one is obvious, else the key's documentation."""
    text = str(value)
    if pattern == DURATION_PATTERN:
        return "write e.g. `30s`, `5m`, `1h30m`, or a number of seconds such as `90`"
    if pattern == GATE_REF_PATTERN:
        return f"to run it as a command, write `{{shell: {json.dumps(text)}}}`"
    if pattern in _NAME_SEPARATORS:
        sep = _NAME_SEPARATORS[pattern]
        candidate = re.sub(r"[^a-z0-9_-]+", sep, text.strip().lower()).replace("-" if sep == "_" else "_", sep)
        candidate = re.sub(r"^[^a-z]+", "", candidate).strip(sep)
        if candidate and re.match(pattern, candidate):
            return f"rename it, e.g. to `{candidate}`"
        return "rename it"
    if pattern == r"^[A-Z_][A-Z0-9_]*$":
        candidate = re.sub(r"[^A-Z0-9_]+", "_", text.upper())
        if re.match(pattern, candidate):
            return f"use `{candidate}`"
    return hint_from(None, path)


def _explain_range(error: ValidationError, path: YamlPath) -> list[Finding]:
    v, limit, where = error.validator, error.validator_value, node_name(path)
    shown = show(error.instance)
    messages = {
        "minimum": f"{where} must be at least {limit}, not {shown}",
        "maximum": f"{where} must be at most {limit}, not {shown}",
        "exclusiveMinimum": f"{where} must be greater than {limit}, not {shown}",
        "exclusiveMaximum": f"{where} must be less than {limit}, not {shown}",
        "minItems": f"{where} must have at least {limit} item{'s' if limit != 1 else ''}",
        "maxItems": f"{where} must have at most {limit} items",
        "minLength": f"{where} must not be empty",
        "maxLength": f"{where} must be at most {limit} characters long",
        "minProperties": f"{where} must have at least {limit} entr{'ies' if limit != 1 else 'y'}",
        "uniqueItems": f"{where} lists the same value more than once",
    }
    return [Finding(path, True, RULE_VALUE, messages[str(v)], hint_from(error.schema, path))]


def _explain_not(error: ValidationError, path: YamlPath) -> list[Finding]:
    # `{"not": {}}` marks a key that is valid elsewhere but not in this kind of state
    # or gate; its description says why.
    value, described = error.validator_value, error.schema
    if isinstance(value, dict) and len(value.get("required") or ()) == 1 and set(value) <= {"required", "description"}:
        # `dependencies: {a: {not: {required: [b], description: why}}}`: b cannot be given
        # beside a. (The reason sits inside `not`, where editors do not show it on hover.)
        path, value, described = path + (str(value["required"][0]),), {}, value
    if value == {} and path:
        reason = str(described.get("description", "")).rstrip(".")
        key, owner = path[-1], node_name(path[:-1])
        message = f"`{key}` is not allowed in {owner}"
        if reason:
            message += f": {reason[0].lower()}{reason[1:]}"
        return [Finding(path, False, RULE_UNKNOWN_KEY, message, f"remove `{key}` from {owner}")]
    return _explain_other(error, path)


def _explain_choice(error: ValidationError, path: YamlPath) -> list[Finding]:
    branches: list[Any] = list(error.validator_value)
    exclusive = _exclusive_keys(branches)
    if exclusive is not None:
        return _explain_exclusive(error, path, exclusive)
    # Alternatives of different types (a string or a mapping, a string or a number):
    # explain the branch whose type matches what the user wrote.
    for index, branch in enumerate(branches):
        resolved = resolve(branch)
        types = resolved.get("type")
        types = types if isinstance(types, list) else [types] if types else []
        if any(validator().is_type(error.instance, t) for t in types):
            inner = [e for e in error.context or () if e.relative_schema_path and e.relative_schema_path[0] == index]
            findings = [f for e in inner for f in explain(e)]
            if findings:
                return findings
    wanted: list[str] = []
    for branch in branches:
        types = resolve(branch).get("type")
        for t in types if isinstance(types, list) else [types] if types else []:
            word = TYPE_WORDS.get(str(t), str(t))
            if word not in wanted:
                wanted.append(word)
    if error.schema.get("title") == "duration":
        message = f"{node_name(path)} must be a duration such as 30s, 5m or 1h30m, or a number of seconds, " \
                  f"not {show(error.instance)}"
        return [Finding(path, True, RULE_TYPE, message, _pattern_fix(DURATION_PATTERN, error.instance))]
    elif wanted:
        message = f"{node_name(path)} must be {word_list(wanted, joiner='or')}, not {show(error.instance)}"
    else:
        message = f"{node_name(path)} does not have an accepted shape"
    return [Finding(path, True, RULE_TYPE, message, hint_from(error.schema, path))]


def _explain_exclusive(error: ValidationError, path: YamlPath, keys: list[str]) -> list[Finding]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    present = [k for k in keys if k in instance]
    is_state = len(path) == 2 and path[0] == "states"
    options = word_list([f"`{k}`" for k in keys], joiner="or")
    if not present:
        if is_state:
            message = f"state `{path[1]}` has no action: give exactly one of {options}"
            hint = "add an action key (e.g. `shell: make test`), or `end: completed` for a terminal state"
        else:
            message = f"{node_name(path)} needs exactly one of {options}"
            hint = f"add one of {options}"
        return [Finding(path, False, RULE_ONE_ACTION, message, hint, missing_one_of=tuple(keys))]
    listed = word_list([f"`{k}`" for k in present])
    what = f"state `{path[1]}`" if is_state else node_name(path)
    message = f"{what} must have exactly one of {options}, but has {listed}"
    hint = "split the work into one state per action, linked with `next`" if is_state else \
        f"keep one of {listed}"
    return [Finding(path + (present[1],), False, RULE_ONE_ACTION, message, hint, exclusive=tuple(keys))]


def _explain_other(error: ValidationError, path: YamlPath) -> list[Finding]:
    text = error.message if len(error.message) <= 120 else error.message[:117] + "..."
    message = f"{node_name(path)}: {text}"
    return [Finding(path, True, RULE_OTHER, message, hint_from(error.schema, path))]


_HANDLERS = {
    "additionalProperties": _explain_additional,
    "required": _explain_required,
    "type": _explain_type,
    "enum": _explain_enum,
    "const": _explain_const,
    "pattern": _explain_pattern,
    "not": _explain_not,
    "oneOf": _explain_choice,
    "anyOf": _explain_choice,
    **{
        v: _explain_range
        for v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems",
                  "minLength", "maxLength", "minProperties", "uniqueItems")
    },
}


def _exclusive_keys(branches: Sequence[Any]) -> list[str] | None:
    """`oneOf: [{required: [a]}, {required: [b]}]` means "exactly one of a, b"."""
    keys = []
    for b in branches:
        if not (isinstance(b, dict) and set(b) == {"required"} and len(b["required"]) == 1):
            return None
        keys.append(str(b["required"][0]))
    return keys
