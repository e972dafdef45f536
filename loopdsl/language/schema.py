"""JSON Schema validation of loop files, reported as positioned diagnostics.

The published schema (loopdsl/data/loop.schema.json, linked from schemas/) is draft-07
so editors' yaml-language-server understands it. jsonschema's raw messages are written
for schema authors ("{...} is not valid under any of the given schemas"); this module
turns each error into one plain-English Diagnostic that points at the offending key or
value, with a hint. Rule ids are part of the public contract (docs/dsl.md, "Lint rules").
"""
from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, NamedTuple

from jsonschema import Draft7Validator
from jsonschema.exceptions import ValidationError

from .diagnostics import Diagnostic, Severity
from .loader import Document
from .model import YamlPath

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
    r"^https?://": "a URL starting with http:// or https://",
}

_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "empty",
}
_SECTION_NOUNS = {"states": "state", "models": "model alias", "gates": "gate", "inputs": "input"}
_NAME_NOUNS = {
    "states": "state name", "models": "model alias name", "gates": "gate name", "inputs": "input name",
    "set": "variable name", "env": "environment variable name",
}
_MAX_SHOWN = 40


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
                return expand(_pointer(root, ref), root, expanding + (ref,))
            if ref in by_file:
                other = load_schema(by_file[ref])
                body = {k: v for k, v in other.items() if k not in ("$schema", "$id", "definitions")}
                return expand(body, other, expanding + (ref,))
        return {k: expand(v, root, expanding) for k, v in node.items()}

    inlined: dict[str, Any] = expand(schema, schema, ())
    return inlined


def _pointer(schema: dict[str, Any], ref: str) -> Any:
    """The node a local JSON pointer (`#/definitions/state_keys/properties/next`) names."""
    node: Any = schema
    for part in ref.lstrip("#/").split("/"):
        node = node.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(node, dict) else {}
    return node


def action_keys() -> tuple[str, ...]:
    """The keys that give a state its kind, in the schema's order (`state.oneOf`)."""
    return tuple(str(b["required"][0]) for b in load_schema()["definitions"]["state"]["oneOf"])


# ------------------------------------------------------------------ findings


@dataclass(frozen=True)
class _Finding:
    node: YamlPath  # the YAML node the finding is about (one finding per node)
    at_value: bool  # point at the node's value rather than its key
    rule: str
    message: str
    hint: str
    suggestion: str | None = None  # did-you-mean target, for unknown keys
    missing_one_of: tuple[str, ...] = ()  # the alternatives, when none of them is given
    about_name: bool = False  # a key (state, variable ... name) breaks a naming rule
    exclusive: tuple[str, ...] = ()  # the alternatives, when more than one of them is given


class NodeFinding(NamedTuple):
    node: YamlPath  # the node the diagnostic is about
    diagnostic: Diagnostic
    about_name: bool  # the node's name (a state, variable ... name) is wrong, not its value


def check(doc: Document, kind: str = "loop") -> list[Diagnostic]:
    """Validate `doc.data` against the schema for its kind of file (see SCHEMA_FILES);
    one diagnostic per offending node."""
    return [found.diagnostic for found in check_nodes(doc, kind)]


def check_nodes(doc: Document, kind: str = "loop") -> list[NodeFinding]:
    """`check`, each diagnostic with the YAML path of the node it is about (lint uses the
    paths to run the semantic rules on every part the schema accepted)."""
    findings: dict[YamlPath, _Finding] = {}
    for error in validator(kind).iter_errors(doc.data):
        for finding in _explain(error):
            findings.setdefault(finding.node, finding)
    kept = _drop_echoes(list(findings.values()))
    version = [f for f in kept if f.rule == RULE_VERSION]
    if version:
        # A file written for another language version may use keys this version does not
        # know: reporting them would be noise, the version is the one problem to fix.
        kept = version
    found = []
    for f in kept:
        line, col = doc.locate(f.node, value=f.at_value) if f.node else _first_key(doc)
        diagnostic = Diagnostic(path=doc.path, line=line, col=col, severity=Severity.ERROR,
                                rule=f.rule, message=f.message, hint=f.hint)
        found.append(NodeFinding(f.node, diagnostic, f.about_name))
    found.sort(key=lambda item: (item.diagnostic.line, item.diagnostic.col, item.diagnostic.rule))
    return found


def _first_key(doc: Document) -> tuple[int, int]:
    """Whole-file findings point at the first top-level key, past any leading comments."""
    top = [pos for path, pos in doc.positions.items() if len(path) == 1]
    return min(top) if top else (1, 1)


def _drop_echoes(findings: list[_Finding]) -> list[_Finding]:
    """A misspelt action key (`shel:`) also leaves its state without an action; the
    did-you-mean on the key already says everything, so drop the second report."""
    suggested: dict[YamlPath, set[str]] = {}
    for f in findings:
        if f.rule == RULE_UNKNOWN_KEY and f.suggestion:
            suggested.setdefault(f.node[:-1], set()).add(f.suggestion)
    findings = [f for f in findings if not (f.missing_one_of and suggested.get(f.node, set()) & set(f.missing_one_of))]
    # A state (or reply) with two actions is checked as each kind in turn, and each calls
    # the other action an unknown key: the one-action finding already says it.
    doubled = {f.node[:-1]: set(f.exclusive) for f in findings if f.rule == RULE_ONE_ACTION and not f.missing_one_of}
    return [f for f in findings
            if not (f.rule == RULE_UNKNOWN_KEY and f.node[-1] in doubled.get(f.node[:-1], set()))]


def _explain(error: ValidationError) -> list[_Finding]:
    path: YamlPath = tuple(error.absolute_path)
    handler = _HANDLERS.get(str(error.validator), _explain_other)
    return handler(error, path)


def _explain_additional(error: ValidationError, path: YamlPath) -> list[_Finding]:
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
        guess = _closest(str(key), allowed)
        where = _where(path)
        message = f"unknown key `{key}` in {where}"
        if guess:
            message += f"; did you mean `{guess}`?"
            hint = f"rename `{key}` to `{guess}`"
        else:
            hint = f"remove `{key}`; keys allowed here: {_word_list(allowed)}"
        findings.append(_Finding(path + (key,), False, RULE_UNKNOWN_KEY, message, hint, guess))
    return findings


def _misplaced_state_key(path: YamlPath, key: str, state: dict[str, Any]) -> _Finding | None:
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
        reason = f"only allowed on {_word_list(kinds, joiner='or')} states"
    owner = _where(path)
    return _Finding(path + (key,), False, RULE_UNKNOWN_KEY, f"`{key}` is not allowed in {owner}: {reason}",
                    f"remove `{key}` from {owner}")


def _explain_required(error: ValidationError, path: YamlPath) -> list[_Finding]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    missing = [k for k in error.validator_value if k not in instance]
    properties = error.schema.get("properties", {})
    keys = _word_list([f"`{k}`" for k in missing])
    noun = "key" if len(missing) == 1 else "keys"
    message = f"{_where(path)} is missing the required {noun} {keys}"
    if path == () and "loopdsl" in missing:
        hints = ["start the file with `loopdsl: 1`"]
        hints += [f"add `{k}:` ({_description(properties.get(k))})" for k in missing if k != "loopdsl"]
    else:
        hints = [f"add `{k}:` ({_description(properties.get(k))})" for k in missing]
    return [_Finding(path, False, RULE_MISSING_KEY, message, "; ".join(hints))]


def _explain_type(error: ValidationError, path: YamlPath) -> list[_Finding]:
    expected = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    wanted = _word_list([_TYPE_WORDS.get(str(t), str(t)) for t in expected], joiner="or")
    if path == () and error.schema.get("title") == load_schema()["title"]:
        message = f"a loop file must be a mapping of keys (loopdsl, name, start, states ...), not {_show(error.instance)}"
        return [_Finding(path, True, RULE_TYPE, message, "start from `loopdsl init` or the example in docs/dsl.md")]
    if path == ():
        message = f"a {error.schema.get('title', 'file')} must be {wanted}, not {_show(error.instance)}"
        return [_Finding(path, True, RULE_TYPE, message, _description(error.schema))]
    message = f"{_where(path)} must be {wanted}, not {_show(error.instance)}"
    return [_Finding(path, True, RULE_TYPE, message, _hint_from(error.schema, path))]


def _explain_enum(error: ValidationError, path: YamlPath) -> list[_Finding]:
    options = [str(o) for o in error.validator_value]
    message = f"{_where(path)} must be one of {_word_list(options, joiner='or')}, not {_show(error.instance)}"
    guess = _closest(str(error.instance), options) if isinstance(error.instance, str) else None
    hint = f"did you mean `{guess}`?" if guess else _hint_from(error.schema, path)
    return [_Finding(path, True, RULE_VALUE, message, hint)]


def _explain_const(error: ValidationError, path: YamlPath) -> list[_Finding]:
    if path == ("loopdsl",):
        message = (
            f"unsupported language version {_show(error.instance)}: "
            f"this loopdsl reads version {SUPPORTED_VERSION}"
        )
        hint = f"write `loopdsl: {SUPPORTED_VERSION}`"
        if isinstance(error.instance, str):
            hint += " (a number, without quotes)"
        else:
            hint += ", or upgrade loopdsl if the file was written for a newer version"
        return [_Finding(path, True, RULE_VERSION, message, hint)]
    wanted = error.validator_value
    message = f"{_where(path)} must be {_show(wanted)}, not {_show(error.instance)}"
    return [_Finding(path, True, RULE_VALUE, message, _hint_from(error.schema, path))]


def _explain_pattern(error: ValidationError, path: YamlPath) -> list[_Finding]:
    pattern = str(error.validator_value)
    help_text = PATTERN_HELP.get(pattern, f"it must match {pattern}")
    if "propertyNames" in error.absolute_schema_path:
        # The offending thing is a key (a state, model, gate or input name), not a value.
        noun = _NAME_NOUNS.get(str(path[-1]) if path else "", "key")
        node = path + (error.instance,)
        message = f"{noun} `{error.instance}` is not valid: {help_text}"
        return [_Finding(node, False, RULE_VALUE, message, _pattern_fix(pattern, error.instance), about_name=True)]
    message = f"{_where(path)} {_show(error.instance)} is not valid: {help_text}"
    return [_Finding(path, True, RULE_VALUE, message, _pattern_fix(pattern, error.instance, path))]


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
    return _hint_from(None, path)


def _explain_range(error: ValidationError, path: YamlPath) -> list[_Finding]:
    v, limit, where = error.validator, error.validator_value, _where(path)
    shown = _show(error.instance)
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
    return [_Finding(path, True, RULE_VALUE, messages[str(v)], _hint_from(error.schema, path))]


def _explain_not(error: ValidationError, path: YamlPath) -> list[_Finding]:
    # `{"not": {}}` marks a key that is valid elsewhere but not in this kind of state
    # or gate; its description says why.
    value, described = error.validator_value, error.schema
    if isinstance(value, dict) and len(value.get("required") or ()) == 1 and set(value) <= {"required", "description"}:
        # `dependencies: {a: {not: {required: [b], description: why}}}`: b cannot be given
        # beside a. (The reason sits inside `not`, where editors do not show it on hover.)
        path, value, described = path + (str(value["required"][0]),), {}, value
    if value == {} and path:
        reason = str(described.get("description", "")).rstrip(".")
        key, owner = path[-1], _where(path[:-1])
        message = f"`{key}` is not allowed in {owner}"
        if reason:
            message += f": {reason[0].lower()}{reason[1:]}"
        return [_Finding(path, False, RULE_UNKNOWN_KEY, message, f"remove `{key}` from {owner}")]
    return _explain_other(error, path)


def _explain_choice(error: ValidationError, path: YamlPath) -> list[_Finding]:
    branches: list[Any] = list(error.validator_value)
    exclusive = _exclusive_keys(branches)
    if exclusive is not None:
        return _explain_exclusive(error, path, exclusive)
    # Alternatives of different types (a string or a mapping, a string or a number):
    # explain the branch whose type matches what the user wrote.
    for index, branch in enumerate(branches):
        resolved = _resolve(branch)
        types = resolved.get("type")
        types = types if isinstance(types, list) else [types] if types else []
        if any(validator().is_type(error.instance, t) for t in types):
            inner = [e for e in error.context or () if e.relative_schema_path and e.relative_schema_path[0] == index]
            findings = [f for e in inner for f in _explain(e)]
            if findings:
                return findings
    wanted: list[str] = []
    for branch in branches:
        types = _resolve(branch).get("type")
        for t in types if isinstance(types, list) else [types] if types else []:
            word = _TYPE_WORDS.get(str(t), str(t))
            if word not in wanted:
                wanted.append(word)
    if error.schema.get("title") == "duration":
        message = f"{_where(path)} must be a duration such as 30s, 5m or 1h30m, or a number of seconds, " \
                  f"not {_show(error.instance)}"
        return [_Finding(path, True, RULE_TYPE, message, _pattern_fix(DURATION_PATTERN, error.instance))]
    elif wanted:
        message = f"{_where(path)} must be {_word_list(wanted, joiner='or')}, not {_show(error.instance)}"
    else:
        message = f"{_where(path)} does not have an accepted shape"
    return [_Finding(path, True, RULE_TYPE, message, _hint_from(error.schema, path))]


def _explain_exclusive(error: ValidationError, path: YamlPath, keys: list[str]) -> list[_Finding]:
    instance = error.instance if isinstance(error.instance, dict) else {}
    present = [k for k in keys if k in instance]
    is_state = len(path) == 2 and path[0] == "states"
    options = _word_list([f"`{k}`" for k in keys], joiner="or")
    if not present:
        if is_state:
            message = f"state `{path[1]}` has no action: give exactly one of {options}"
            hint = "add an action key (e.g. `shell: make test`), or `end: completed` for a terminal state"
        else:
            message = f"{_where(path)} needs exactly one of {options}"
            hint = f"add one of {options}"
        return [_Finding(path, False, RULE_ONE_ACTION, message, hint, missing_one_of=tuple(keys))]
    listed = _word_list([f"`{k}`" for k in present])
    what = f"state `{path[1]}`" if is_state else _where(path)
    message = f"{what} must have exactly one of {options}, but has {listed}"
    hint = "split the work into one state per action, linked with `next`" if is_state else \
        f"keep one of {listed}"
    return [_Finding(path + (present[1],), False, RULE_ONE_ACTION, message, hint, exclusive=tuple(keys))]


def _explain_other(error: ValidationError, path: YamlPath) -> list[_Finding]:
    text = error.message if len(error.message) <= 120 else error.message[:117] + "..."
    message = f"{_where(path)}: {text}"
    return [_Finding(path, True, RULE_OTHER, message, _hint_from(error.schema, path))]


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


# ------------------------------------------------------------------ helpers


def _exclusive_keys(branches: Sequence[Any]) -> list[str] | None:
    """`oneOf: [{required: [a]}, {required: [b]}]` means "exactly one of a, b"."""
    keys = []
    for b in branches:
        if not (isinstance(b, dict) and set(b) == {"required"} and len(b["required"]) == 1):
            return None
        keys.append(str(b["required"][0]))
    return keys


def _resolve(subschema: Any) -> dict[str, Any]:
    """Follow a local `#/definitions/...` reference (the only kind the schema uses)."""
    seen = 0
    while isinstance(subschema, dict) and "$ref" in subschema and seen < 10:
        subschema, seen = _pointer(load_schema(), str(subschema["$ref"])), seen + 1
    return subschema if isinstance(subschema, dict) else {}


def _where(path: YamlPath) -> str:
    """A path as a user reads it: "state `draft`", "`llm.model` in state `draft`"."""
    if not path:
        return "the top level"
    if len(path) >= 2 and path[0] in _SECTION_NOUNS and isinstance(path[1], str):
        owner = f"{_SECTION_NOUNS[str(path[0])]} `{path[1]}`"
        rest = path[2:]
        return f"`{_dotted(rest)}` in {owner}" if rest else owner
    return f"`{_dotted(path)}`"


def _dotted(path: Iterable[Any]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "an empty value"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        text = value if len(value) <= _MAX_SHOWN else value[: _MAX_SHOWN - 3] + "..."
        return json.dumps(text, ensure_ascii=False)
    return str(value)


def _description(subschema: Any) -> str:
    text = _resolve(subschema).get("description") if isinstance(subschema, dict) else None
    if isinstance(subschema, dict) and subschema.get("description"):
        text = subschema["description"]
    return str(text or "see docs/dsl.md").rstrip(".")


def _hint_from(subschema: Any, path: YamlPath) -> str:
    """The key's own schema description, which is also what editors show on hover."""
    key = next((p for p in reversed(path) if isinstance(p, str)), "")
    described = _description(subschema) if subschema is not None else "see docs/dsl.md"
    if described == "see docs/dsl.md":
        return f"see `{key}` in docs/dsl.md" if key else "see docs/dsl.md"
    return f"`{key}`: {described}" if key else described


def _closest(word: str, options: Sequence[str]) -> str | None:
    by_lower = {o.lower(): o for o in options}
    if word.lower() in by_lower:
        return by_lower[word.lower()]
    found = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return found[0] if found else None


def _word_list(items: Sequence[str], joiner: str = "and") -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {joiner} {items[-1]}"
