"""The published loop schema and its positioned diagnostics (loopdsl/language/schema.py)."""
from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scaled import scaled
from jsonschema import Draft7Validator

from loopdsl.language.diagnostics import Diagnostic, Severity
from loopdsl.language.loader import Document, load_text
from loopdsl.language.model import build_loop
from loopdsl.language.schema import PATTERN_HELP, SCHEMA_RULES, action_keys, check, load_schema, validator

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"
PACKAGE_SCHEMA = ROOT / "loopdsl" / "data" / "loop.schema.json"
PUBLISHED_SCHEMA = ROOT / "schemas" / "loop.schema.json"

# Objects whose keys are the user's own (JSON Schemas, assigned values, child inputs ...).
FREE_FORM = {"schema", "json_schema", "set", "with", "outputs", "output", "params", "logit_bias", "default"}


def lint(text: str) -> list[Diagnostic]:
    doc, problems = load_text(textwrap.dedent(text).lstrip("\n"), "loop.yaml")
    assert doc is not None, problems
    return check(doc)


def walk(node: Any, where: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Every subschema of the schema, with the path of keywords leading to it."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from walk(value, where + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, where + (i,))


# ------------------------------------------------------------- the schema itself


def test_schema_is_valid_draft07() -> None:
    schema = json.loads(PACKAGE_SCHEMA.read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    Draft7Validator.check_schema(schema)
    assert schema["title"] and schema["description"]
    # Draft 2019+/2020 keywords that yaml-language-server mishandles must not creep in.
    text = PACKAGE_SCHEMA.read_text(encoding="utf-8")
    for keyword in ("unevaluatedProperties", "prefixItems", "dependentRequired", "$dynamicRef"):
        assert keyword not in text


def test_every_property_has_a_description() -> None:
    missing = [
        ".".join(map(str, where + (name,)))
        for where, sub in walk(load_schema())
        if isinstance(sub.get("properties"), dict) and where[-1:] != ("properties",)
        for name, prop in sub["properties"].items()
        if not (isinstance(prop, dict) and str(_target(prop).get("description", "")).strip())
    ]
    assert missing == []
    for name, definition in load_schema()["definitions"].items():
        assert definition.get("description"), name


def test_every_fixed_object_refuses_unknown_keys() -> None:
    loose = []
    for where, sub in walk(load_schema()):
        is_object = sub.get("type") == "object" or "object" in (sub.get("type") or []) or "properties" in sub
        if not is_object or where[-1:] == ("properties",) or where[:1] == ("examples",) or "if" in where or "then" in where:
            continue
        if "examples" in where or "default" in where[-1:]:
            continue
        if where and where[-1] in FREE_FORM:
            continue
        if "additionalProperties" not in sub and not _dispatches_to_closed_kinds(sub):
            loose.append(".".join(map(str, where)))
    assert loose == []


def _target(prop: dict[str, Any]) -> dict[str, Any]:
    """A property given as a `$ref` is described where it points."""
    node: Any = load_schema()
    if "$ref" not in prop:
        return prop
    for part in prop["$ref"].lstrip("#/").split("/"):
        node = node[part]
    return node


def _dispatches_to_closed_kinds(sub: dict[str, Any]) -> bool:
    """The `state` definition only picks a kind (`if` action key `then` that kind), and every
    kind refuses unknown keys itself."""
    branches = sub.get("allOf") or []
    return bool(branches) and "properties" not in sub and all(
        set(b) == {"if", "then"} and "additionalProperties" in _target(b["then"]) for b in branches
    )


def test_every_pattern_has_plain_english_help() -> None:
    patterns = {sub["pattern"] for _, sub in walk(load_schema()) if isinstance(sub.get("pattern"), str)}
    assert patterns and patterns <= set(PATTERN_HELP)


def test_published_schema_is_a_relative_link_to_the_package_copy() -> None:
    assert PUBLISHED_SCHEMA.is_symlink()
    target = os.readlink(PUBLISHED_SCHEMA)
    assert not os.path.isabs(target)
    assert PUBLISHED_SCHEMA.resolve() == PACKAGE_SCHEMA.resolve()
    assert json.loads(PUBLISHED_SCHEMA.read_text(encoding="utf-8")) == load_schema()


def test_the_run_record_schema_is_published_and_knows_every_status() -> None:
    from loopdsl.runtime.run_state import STATUSES, record_problem

    published = ROOT / "schemas" / "run-record.schema.json"
    assert published.is_symlink() and published.resolve() == (ROOT / "loopdsl" / "data" / "run-record.schema.json").resolve()
    schema = json.loads(published.read_text(encoding="utf-8"))
    Draft7Validator.check_schema(schema)
    assert tuple(schema["properties"]["status"]["enum"]) == STATUSES
    assert record_problem({"loop": "x", "status": "waiting", "waiting": {"state": "a", "choices": ["go", 1]}}) == (
        "'waiting.choices.1' is a JSON integer, not a string")
    assert record_problem({"loop": "x", "status": "done\x1b[2J"}) == (
        "'status' 'done\\x1b[2J' is not one of " + ", ".join(STATUSES))  # the stored value shown escaped
    assert record_problem({"status": "running"}) == "the record has no 'loop'"
    assert record_problem([]) == "the record is a JSON array, not an object"


@pytest.mark.parametrize("kind", ["test", "replies"])
def test_test_and_reply_schemas_are_published_like_the_loop_schema(kind: str) -> None:
    published = ROOT / "schemas" / f"{kind}.schema.json"
    package = ROOT / "loopdsl" / "data" / f"{kind}.schema.json"
    assert published.is_symlink() and not os.path.isabs(os.readlink(published))
    assert published.resolve() == package.resolve()
    schema = json.loads(package.read_text(encoding="utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#" and schema == load_schema(kind)
    Draft7Validator.check_schema(schema)
    assert schema["title"] and schema["description"]


def test_every_state_kind_has_its_own_definition_chosen_by_its_action_key() -> None:
    """Editors complete from the one definition whose `if` matches, so each kind lists
    exactly its keys (by reference to the catalogue, `state_keys`), and nothing else."""
    definitions = load_schema()["definitions"]
    catalogue = definitions["state_keys"]["properties"]
    actions = action_keys()
    assert actions == ("shell", "llm", "agent", "evaluate", "checkpoint", "set", "loop", "end")
    chosen = {b["if"].get("required", [None])[0]: b["then"]["$ref"] for b in definitions["state"]["allOf"]}
    for kind in actions:
        assert chosen[kind] == f"#/definitions/state_{kind}"
        own = definitions[f"state_{kind}"]
        assert own["required"] == [kind] and own["additionalProperties"] is False
        for key, prop in own["properties"].items():
            assert prop == {"$ref": f"#/definitions/state_keys/properties/{key}"}, (kind, key)
            assert key in catalogue
        assert not (set(own["properties"]) & set(actions)) - {kind}, kind
    covered = set().union(*(definitions[f"state_{k}"]["properties"] for k in actions))
    assert covered == set(catalogue)  # every key of the catalogue is valid on some kind
    assert chosen[None] == "#/definitions/state_keys"  # no action yet: every key


def test_every_property_is_titled_with_its_own_name() -> None:
    """yaml-language-server's hover shows the nearest title: without one it names the parent."""
    untitled = [
        ".".join(map(str, where + (name,)))
        for where, sub in walk(load_schema())
        if isinstance(sub.get("properties"), dict) and where[-1:] != ("properties",)
        and not {"if", "then", "else", "examples"} & set(map(str, where))
        for name, prop in sub["properties"].items()
        if isinstance(prop, dict) and "$ref" not in prop and prop.get("title") != name
    ]
    assert untitled == []


def test_a_key_of_another_kind_of_state_says_which_kind_takes_it() -> None:
    found = lint(
        """
        loopdsl: 1
        name: demo
        start: a
        states:
          a: {llm: {model: m, prompt: p}, idempotent: true, with: {x: 1}, next: b}
          b: {end: completed, output: {x: "1"}, retry: {max_attempts: 2}}
        """
    )
    messages = [d.message for d in found]
    assert messages == [
        "`idempotent` is not allowed in state `a`: only allowed on `shell` or `agent` states",
        "`with` is not allowed in state `a`: only allowed on `loop` states",
        "`retry` is not allowed in state `b`: an `end` state is terminal: it has no action to retry, gate or route from",
    ]


def test_schema_and_validator_are_built_once() -> None:
    assert load_schema() is load_schema()
    assert validator() is validator()
    assert validator().format_checker is not None


# Keys DSL.md names, by where they live; each must be a property in the schema.
DSL_KEYS = """
loopdsl name description schedule cron timezone inputs type default minimum secrets models model
temperature max_tokens fallbacks price input_per_mtok output_per_mtok api_base timeout budget
tokens cost_usd steps wall_time workspace worktree base imports path as gates start states shell
cmd argv cwd env ok_exit llm prompt system skill output schema evaluate criteria checkpoint message
choices set loop with end next transitions to when before after expr json_schema ref retry
max_attempts backoff initial factor max jitter on on_failure max_visits on_exhausted idempotent
on_timeout for_each concurrency tolerate_failures unattended group on_conflict outputs
""".split()


def test_every_key_of_the_language_is_in_the_schema() -> None:
    names = {n for _, sub in walk(load_schema()) for n in (sub.get("properties") or {})}
    assert sorted(set(DSL_KEYS) - names) == []


# ------------------------------------------------------------- valid files


def test_dsl_example_is_valid_and_builds() -> None:
    text = (DATA / "dsl_example.yaml").read_text(encoding="utf-8")
    doc, problems = load_text(text, "dsl_example.yaml")
    assert problems == [] and doc is not None
    assert check(doc) == []
    loop = build_loop(doc.data)
    assert loop.states["draft"].retry.max_attempts == 3
    assert loop.models["critic"].fallbacks == ("openai/gpt-4o-mini",)


KITCHEN_SINK = """
loopdsl: 1
name: every-key
description: uses every key at least once
schedule: {cron: "*/5 * * * *", timezone: Europe/Paris}
inputs:
  repo: {type: string, default: ".", description: the repository}
  count: {type: integer, default: 3, minimum: 1, maximum: 9}
  ratio: {type: number, required: false}
  mode: {enum: [fast, slow]}
  flags: {type: array, default: []}
  extra: {type: object, default: {}}
  dry: {type: boolean, default: false}
  bare:
secrets: [GITHUB_TOKEN, API_KEY]
models:
  local:
    model: openai/llama3.2
    api_base: http://127.0.0.1:11434/v1
    api_key_env: OLLAMA_API_KEY
    max_tokens: 500
    price: {input_per_mtok: 0, output_per_mtok: 0}
    timeout: 2m
    top_p: 0.9
    seed: 7
    stop: ["END"]
    params: {num_ctx: 8192}
    description: a local model
  judge: {model: anthropic/claude-haiku-4-5, temperature: 0, max_tokens: 300, fallbacks: [openai/gpt-4o-mini]}
budget: {tokens: 5000, cost_usd: 0.1, steps: 30, wall_time: 1h30m}
workspace: {worktree: true, base: main}
imports: [shared/gates.yaml, {path: shared/models.yaml, as: common}]
gates:
  tests-pass: {shell: {argv: [python, -m, pytest, -q], ok_exit: [0, 5]}, timeout: 5m, name: tests}
  syntax: python_syntax
  safe: {builtin: no_secrets, value: "{{ write.text }}"}
  shaped: {json_schema: {type: object}}
  again: {ref: tests-pass}
start: prepare
unattended: false
concurrency: {group: "triage-{{ inputs.repo }}", on_conflict: skip}
outputs: {summary: "{{ write.text }}"}
states:
  prepare:
    set: {limit: "inputs.count * 2", label: triage, fixed: 3}
    next: fetch
  fetch:
    shell: {cmd: "git log -n 3", cwd: ., env: {PAGER: cat}, timeout: 30s}
    idempotent: true
    description: read history
    next: write
  write:
    llm:
      model: local
      system: be brief
      skill: ../skills/x/SKILL.md
      prompt: "Summarise {{ fetch.stdout }}"
      output: json
      schema: {type: object}
      max_tokens: 200
      temperature: 0.2
    gates:
      before: [python_syntax, common.lint, {shell: "test -d .git"}]
      after: [safe, {expr: "write.json is mapping", name: is-object, timeout: 1s}, {ref: shaped}]
    retry:
      max_attempts: 3
      on: [rate_limit, parse]
      backoff: {initial: 250ms, factor: 1.5, max: 2d, jitter: false}
    on_failure: stuck
    timeout: 90
    max_visits: 3
    on_exhausted: stuck
    next: judge
  judge:
    evaluate: {model: judge, prompt: "{{ write.text }}", criteria: [short, clear], system: strict, max_tokens: 100, temperature: 0}
    transitions:
      - {to: ask, when: "judge.verdict == 'accept'"}
      - {to: write}
  ask:
    checkpoint: {message: Ship it?, choices: [ship, hold], timeout: 24h}
    on_timeout: stuck
    transitions: [{to: fan, when: "ask.decision == 'ship'"}, {to: stuck}]
  fan:
    loop: child.yaml
    with: {text: "{{ item }}"}
    for_each: "write.json['items']"
    concurrency: 4
    tolerate_failures: 1
    next: done
  pause:
    checkpoint:
    next: done
  done: {end: completed, output: {note: done}, description: the end}
  stuck: {end: escalated}
"""


def test_every_key_is_accepted_and_read_by_the_model() -> None:
    assert lint(KITCHEN_SINK) == []
    doc, _ = load_text(textwrap.dedent(KITCHEN_SINK).lstrip("\n"), "sink.yaml")
    assert doc is not None
    loop = build_loop(doc.data)
    local = loop.models["local"]
    assert local.api_key_env == "OLLAMA_API_KEY" and local.timeout == 120.0
    assert local.params == {"num_ctx": 8192, "top_p": 0.9, "seed": 7, "stop": ["END"]}
    assert loop.gates["tests-pass"].shell is not None and loop.gates["tests-pass"].shell.ok_exit == (0, 5)
    assert loop.gates["syntax"].kind == "builtin" and loop.gates["again"].kind == "ref"
    assert loop.states["write"].retry.backoff.max == 2 * 86400
    assert [g.kind for g in loop.states["write"].gates_before] == ["builtin", "ref", "shell"]
    assert loop.states["fan"].action.concurrency == 4  # type: ignore[union-attr]
    assert loop.inputs["bare"].required is True and loop.inputs["repo"].required is False
    assert loop.concurrency is not None and loop.concurrency.on_conflict == "skip"


# ------------------------------------------------------------- invalid files

BASE = """\
loopdsl: 1
name: demo
start: a
states:
"""

CASES = [
    # (id, text after BASE or whole file, rule, line, col, words the message must contain)
    ("unknown state key", "  a:\n    shell: make\n    nxt: b\n", "schema-unknown-key", 7, 5, ["`nxt`", "did you mean `next`"]),
    ("unknown top key", None, "schema-unknown-key", 2, 1, ["`nmae`", "did you mean `name`"]),
    ("unknown llm key", "  a:\n    llm: {model: m, prompt: p, max_token: 5}\n", "schema-unknown-key", 6, 32, ["max_tokens"]),
    ("misplaced with", "  a:\n    shell: make\n    with: {x: 1}\n", "schema-unknown-key", 7, 5, ["`with`", "`loop` states"]),
    ("next beside transitions", "  a:\n    shell: make\n    next: b\n    transitions: [{to: b}]\n",
     "schema-unknown-key", 8, 5, ["`transitions`", "`next`"]),
    ("end with next", "  a: {end: failed, next: b}\n", "schema-unknown-key", 5, 20, ["`next`", "terminal"]),
    ("missing prompt", "  a:\n    llm: {model: m}\n", "schema-missing-key", 6, 5, ["`prompt`"]),
    ("missing transition target", "  a:\n    shell: make\n    transitions:\n      - {when: x}\n",
     "schema-missing-key", 8, 9, ["`to`"]),
    ("no action", "  a:\n    next: b\n", "schema-one-action", 5, 3, ["state `a` has no action"]),
    ("two actions", "  a:\n    shell: make\n    set: {x: 1}\n", "schema-one-action", 7, 5, ["`shell` and `set`"]),
    ("gate with two kinds", "  a:\n    shell: make\n    gates: {after: [{expr: x, ref: y}]}\n",
     "schema-one-action", 7, 31, ["`expr` and `ref`"]),
    ("shell object without cmd", "  a:\n    shell: {cwd: src}\n", "schema-one-action", 6, 5, ["`cmd` or `argv`"]),
    ("bad end status", "  a: {end: done}\n", "schema-value", 5, 12, ["completed, failed or escalated", '"done"']),
    ("bad duration", "  a:\n    shell: make\n    timeout: 5 minutes\n", "schema-value", 7, 14, ["duration"]),
    ("duration of wrong type", "  a:\n    shell: make\n    timeout: [5]\n", "schema-type", 7, 14, ["duration", "a list"]),
    ("negative duration", "  a:\n    shell: make\n    timeout: -5\n", "schema-value", 7, 14, ["at least 0"]),
    ("bad state name", "  Draft:\n    end: completed\n", "schema-value", 5, 3, ["state name `Draft`"]),
    ("max_attempts zero", "  a:\n    shell: make\n    retry: {max_attempts: 0}\n", "schema-value", 7, 27, ["at least 1"]),
    ("unknown error kind", "  a:\n    shell: make\n    retry: {on: [rate_limits]}\n", "schema-value", 7, 18, ['"rate_limits"']),
    ("state is a string", "  a: make\n", "schema-type", 5, 6, ["state `a` must be a mapping"]),
    ("idempotent not bool", "  a:\n    shell: make\n    idempotent: yes please\n", "schema-type", 7, 17, ["true or false"]),
    ("command as a gate name", "  a:\n    shell: make\n    gates: {after: [make test]}\n", "schema-value", 7, 21,
     ["gate given as a string"]),
    ("output text with schema", "  a:\n    llm: {model: m, prompt: p, output: text, schema: {type: object}}\n",
     "schema-value", 6, 40, ['must be "json"']),
    ("input default of the wrong type", None, "schema-type", 3, 38, ["must be an integer"]),
    ("version 2", None, "unsupported-version", 1, 10, ["this loopdsl reads version 1"]),
    ("version as a string", None, "unsupported-version", 1, 10, ['"1"']),
    ("missing loopdsl", None, "schema-missing-key", 2, 1, ["`loopdsl`"]),
    ("lowercase secret", None, "schema-value", 3, 11, ["environment variable"]),
    ("bad import", None, "schema-type", 3, 11, ["a string or a mapping"]),
]

WHOLE_FILES = {
    "unknown top key": "loopdsl: 1\nnmae: demo\nname: demo\nstart: a\nstates: {a: {end: completed}}\n",
    "input default of the wrong type": (
        "loopdsl: 1\nname: demo\ninputs: {n: {type: integer, default: many}}\nstart: a\nstates: {a: {end: completed}}\n"
    ),
    "version 2": "loopdsl: 2\nname: demo\nstart: a\nstates: {a: {end: completed}}\n",
    "version as a string": 'loopdsl: "1"\nname: demo\nstart: a\nstates: {a: {end: completed}}\n',
    "missing loopdsl": "# yaml-language-server: $schema=loop.schema.json\nname: demo\nstart: a\nstates: {a: {end: completed}}\n",
    "lowercase secret": "loopdsl: 1\nname: demo\nsecrets: [api_key]\nstart: a\nstates: {a: {end: completed}}\n",
    "bad import": "loopdsl: 1\nname: demo\nimports: [3]\nstart: a\nstates: {a: {end: completed}}\n",
}


@pytest.mark.parametrize(("text", "rule", "line", "col", "words"),
                         [pytest.param(t, r, ln, c, w, id=i) for i, t, r, ln, c, w in CASES])
def test_invalid_snippet_is_reported_at_the_offending_node(
    request: pytest.FixtureRequest, text: str | None, rule: str, line: int, col: int, words: list[str]
) -> None:
    source = WHOLE_FILES[request.node.callspec.id] if text is None else BASE + text
    diags = lint(source)
    assert len(diags) == 1, [d.message for d in diags]
    d = diags[0]
    assert (d.rule, d.line, d.col) == (rule, line, col), d
    for word in words:
        assert word in d.message + " " + d.hint, (word, d.message, d.hint)
    assert d.severity is Severity.ERROR and d.hint and d.path == "loop.yaml"


def test_missing_keys_of_one_mapping_are_one_diagnostic() -> None:
    diags = lint(BASE + "  a:\n    llm: {}\n")
    assert len(diags) == 1
    assert "`model` and `prompt`" in diags[0].message


def test_misspelt_action_is_reported_once_with_a_suggestion() -> None:
    diags = lint(BASE + "  a:\n    shel: make\n    next: b\n")
    assert [(d.rule, d.line, d.col) for d in diags] == [("schema-unknown-key", 6, 5)]
    assert "did you mean `shell`" in diags[0].message


def test_a_misspelt_routing_key_does_not_hide_a_missing_action() -> None:
    diags = lint(BASE + "  a:\n    nxt: b\n")
    assert [(d.rule, d.line, d.col) for d in diags] == [("schema-one-action", 5, 3), ("schema-unknown-key", 6, 5)]


def test_every_problem_of_a_file_is_reported_in_order() -> None:
    diags = lint(
        """
        loopdsl: 1
        name: Bad Name
        budget: {tokens: lots, steps: 0}
        start: a
        states:
          a: {shell: make, retry: {max_attempts: 2, backof: {}}}
          b: {end: complete}
        """
    )
    got = [(d.line, d.rule) for d in diags]
    assert got == [(2, "schema-value"), (3, "schema-type"), (3, "schema-value"),
                   (6, "schema-unknown-key"), (7, "schema-value")]
    assert "rename it, e.g. to `bad-name`" in diags[0].hint
    assert "did you mean `backoff`" in diags[3].message


def test_another_version_is_the_only_finding() -> None:
    diags = lint("loopdsl: 2\nname: demo\nstart: a\nstates: {a: {end: completed, later_key: 1}}\nnew_feature: {}\n")
    assert [(d.rule, d.line, d.col) for d in diags] == [("unsupported-version", 1, 10)]


def test_long_values_are_truncated_in_messages() -> None:
    diags = lint(BASE + f"  a: {{end: {'x' * 500}}}\n")
    assert len(diags) == 1 and len(diags[0].message) < 200 and "..." in diags[0].message


# ------------------------------------------------------------- properties

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(-1, 1, allow_nan=False),
                    st.sampled_from(["", "x", "5m", "make", "Bad Name", "completed", "python_syntax"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["to", "when", "cmd", "model", "shell", "next", "x", "end"]), inner, max_size=3),
), max_leaves=6)


def _paths(node: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [where]
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, where + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, where + (i,))
    return found


def _example_data() -> dict[str, Any]:
    doc, _ = load_text((DATA / "dsl_example.yaml").read_text(encoding="utf-8"), "x.yaml")
    assert doc is not None
    return doc.data  # type: ignore[no-any-return]


@settings(max_examples=scaled(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])  # half under `ci`
@given(data=st.data())
def test_any_mutation_is_reported_plainly_or_builds(data: st.DataObject) -> None:
    """Break the example at a random node: check() agrees with jsonschema on validity, reports
    with stable rule ids and plain messages, and whatever it accepts, build_loop can read."""
    loop_data = json.loads(json.dumps(_example_data()))
    paths = [p for p in _paths(loop_data) if p]
    target = data.draw(st.sampled_from(paths))
    parent = loop_data
    for part in target[:-1]:
        parent = parent[part]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[target[-1]]
    else:
        parent[target[-1]] = data.draw(VALUES)
    doc = Document(path="m.yaml", text="", data=loop_data)
    diags = check(doc)
    assert (diags == []) == validator().is_valid(loop_data)
    nodes = set()
    for d in diags:
        assert d.rule in SCHEMA_RULES and d.hint and d.line >= 1 and d.col >= 1
        assert len(d.message) < 400 and "valid under" not in d.message and "{'" not in d.message
        nodes.add((d.line, d.col, d.message))
    assert len(nodes) == len(diags)
    if not diags:
        build_loop(loop_data)


@pytest.mark.parametrize("name", ["loop", "replies", "run-record", "test"])
def test_no_published_schema_names_a_key_twice(name: str) -> None:
    """A JSON parser keeps the last of two equal keys without a word; an editor flags it."""
    path = Path(__file__).resolve().parents[2] / "schemas" / f"{name}.schema.json"

    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), sorted({k for k in keys if keys.count(k) > 1})
        return dict(pairs)

    json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=once)
