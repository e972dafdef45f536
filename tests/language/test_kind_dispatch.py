"""Lint's validator goes straight to a state's kind definition (language.kind_dispatch)
instead of through the editors' if/then dispatcher: it must find exactly the same problems,
in the same order, as the published schema checked as written."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scaled import scaled

from loopdsl.language import schema
from loopdsl.language.schema_explain import explain
from loopdsl.language.kind_dispatch import KEYWORD, with_kind_shortcuts
from loopdsl.language.loader import load_text

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("loop", "test", "replies")
# The property tests below run scaled(N) examples: N under the `thorough` profile, half under `ci`.


def findings(kind: str, data: Any, shortcuts: bool) -> list[Any]:
    """Every finding the schema module derives from the validator's errors, in order."""
    errors = schema.validator(kind, shortcuts=shortcuts).iter_errors(data)
    return [finding for error in errors for finding in explain(error)]


def same(kind: str, data: Any) -> None:
    assert findings(kind, data, True) == findings(kind, data, False)


def test_the_shortcut_is_in_place_for_states_and_replies() -> None:
    loop = schema.validator("loop").schema
    assert KEYWORD in loop["properties"]["states"]["additionalProperties"]
    assert KEYWORD in schema.validator("replies").schema["definitions"]["entry_object"]
    assert KEYWORD not in schema.validator("loop", shortcuts=False).schema["properties"]["states"]["additionalProperties"]


def test_a_dispatcher_of_another_shape_is_left_alone() -> None:
    extra_key = {"type": "object", "required": ["a"], "oneOf": [{"required": ["a"]}],
                 "allOf": [{"if": {"required": ["a"]}, "then": {}}]}
    missing_kind = {"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
                    "allOf": [{"if": {"required": ["a"]}, "then": {}}]}
    other_if = {"type": "object", "oneOf": [{"required": ["a"]}],
                "allOf": [{"if": {"required": ["a"]}, "then": {}}, {"if": {"type": "string"}, "then": {}}]}
    for node in (extra_key, missing_kind, other_if):
        assert with_kind_shortcuts(node) == node


def test_every_yaml_file_of_the_repository_gets_the_same_findings() -> None:
    checked = 0
    for path in sorted(ROOT.glob("**/*.yaml")) + sorted(ROOT.glob("**/*.yml")):
        if {".git", ".venv", "node_modules"} & set(path.relative_to(ROOT).parts):
            continue  # not the repository's own: a local venv's and npm's packages (122 and 10 files)
        doc, _ = load_text(path.read_bytes(), str(path))
        if doc is None:
            continue
        for kind in KINDS:  # each file against every kind: many wrong-kind errors to compare
            same(kind, doc.data)
        checked += 1
    assert checked > 50


_STATE_KEYS = sorted(schema.load_schema()["definitions"]["state_keys"]["properties"])
_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["", "x", "s0", "done", "1m", "completed", "BAD NAME"]),
    st.lists(st.sampled_from([{"to": "s0"}, {"to": "done", "when": "x"}, {"when": 1}, "x"]), max_size=3),
    st.dictionaries(st.sampled_from(["cmd", "model", "prompt", "before", "after", "max", "x"]),
                    st.sampled_from(["x", 1, None, ["a"], {"shell": "true"}]), max_size=3),
)
_STATES = st.one_of(
    st.dictionaries(st.sampled_from(_STATE_KEYS + ["shel", "nxt", "extra"]), _VALUES, max_size=5),
    _VALUES,
)


@settings(max_examples=scaled(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["s0", "s1", "Bad", "done"]), _STATES, max_size=4))
def test_random_states_get_the_same_findings(states: dict[str, Any]) -> None:
    same("loop", {"loopdsl": 1, "name": "x", "start": "s0", "states": states})


_REPLY_KEYS = ["text", "error", "decision", "json", "usage", "comment", "cost_usd", "model", "tool_calls", "x"]


@settings(max_examples=scaled(200), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["draft", "review"]),
                       st.one_of(_VALUES, st.lists(st.dictionaries(st.sampled_from(_REPLY_KEYS), _VALUES,
                                                                   max_size=3), max_size=3))))
def test_random_replies_get_the_same_findings(replies: dict[str, Any]) -> None:
    same("replies", replies)


_TOOL_CALLS = st.one_of(
    _VALUES,
    st.lists(st.dictionaries(st.sampled_from(["name", "args", "id", "x"]),
                             st.sampled_from(["read_file", "Bad Name", 1, None, {"path": "a"}, "{not json", []]),
                             max_size=3), max_size=3),
)
_TOOL_REPLY = st.dictionaries(st.sampled_from(["tool_calls", "text", "usage", "error", "decision", "x"]),
                              st.one_of(_TOOL_CALLS, st.sampled_from([{"prompt_tokens": 1, "completion_tokens": 2}])),
                              max_size=4)


@settings(max_examples=scaled(300), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["draft", "fix"]), st.lists(_TOOL_REPLY, max_size=3), max_size=2))
def test_random_tool_call_replies_get_the_same_findings(replies: dict[str, Any]) -> None:
    same("replies", replies)


def test_the_replies_shortcut_covers_tool_turns_and_the_other_kinds() -> None:
    spec = schema.validator("replies").schema["definitions"]["entry_object"][KEYWORD]
    assert sorted(spec["kinds"]) == ["decision", "error", "text", "tool_calls"]
