"""The loader: plain data, exact positions, and one clean diagnostic per kind of bad input."""
from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.nodes import ScalarNode
from ruamel.yaml.resolver import VersionedResolver
from scaled import scaled

from loopdsl.language import loader as loader_module
from loopdsl.language.diagnostics import Diagnostic, Severity
from loopdsl.language.loader import MAX_DEPTH, MAX_NODES, Document, load_document, load_text, parse_text
from loopdsl.language.yaml_events import FAST_PARSER_AVAILABLE, resolve_plain_1_2

DATA = Path(__file__).parents[1] / "data"
DSL_EXAMPLE = DATA / "dsl_example.yaml"

# Fallback if the schema helper's copy of the DSL.md example is not there.
EMBEDDED_EXAMPLE = """\
loopdsl: 1
name: tiny
start: work
states:
  work:
    shell: echo hi
    next: done
  done: {end: completed}
"""

SAMPLE = """\
loopdsl: 1
name: demo
states:
  first:
    shell: echo hi
    next: second
  second:
    transitions:
      - {to: done, when: "x"}
      - to: first
        when: y
  done: {end: completed}
"""


def only_error(src: str | bytes) -> Diagnostic:
    doc, diags = load_text(src)
    assert doc is None, f"expected an error, got data {doc.data if doc else None!r}"
    assert len(diags) == 1, diags
    diag = diags[0]
    assert diag.severity is Severity.ERROR and diag.hint and diag.message
    return diag


def where(diag: Diagnostic) -> tuple[str, int, int]:
    return (diag.rule, diag.line, diag.col)


def assert_plain(value: Any) -> None:
    """Only JSON-like builtins, never ruamel's subclasses (CommentedMap, ScalarFloat, ...)."""
    assert type(value) in (dict, list, str, int, float, bool, type(None)), type(value)
    if type(value) is dict:
        for key, item in value.items():
            assert type(key) is str
            assert_plain(item)
    elif type(value) is list:
        for item in value:
            assert_plain(item)


# ------------------------------------------------------------------ good input

def test_positions_of_nested_keys_and_list_items_checked_by_hand() -> None:
    doc, diags = load_text(SAMPLE, path="demo.yaml")
    assert diags == [] and doc is not None
    assert doc.path == "demo.yaml"
    pos, val = doc.positions, doc.value_positions
    assert pos[("loopdsl",)] == (1, 1) and val[("loopdsl",)] == (1, 10)
    assert pos[("states",)] == (3, 1) and val[("states",)] == (4, 3)
    assert pos[("states", "first")] == (4, 3) and val[("states", "first")] == (5, 5)
    assert pos[("states", "first", "shell")] == (5, 5)
    assert val[("states", "first", "shell")] == (5, 12)
    trans = ("states", "second", "transitions")
    assert pos[trans] == (8, 5) and val[trans] == (9, 7)
    # a flow mapping as the first item, a block mapping as the second
    assert pos[trans + (0,)] == (9, 9)
    assert pos[trans + (0, "to")] == (9, 10) and val[trans + (0, "to")] == (9, 14)
    assert pos[trans + (0, "when")] == (9, 20) and val[trans + (0, "when")] == (9, 26)
    assert pos[trans + (1,)] == (10, 9)
    assert pos[trans + (1, "to")] == (10, 9) and val[trans + (1, "to")] == (10, 13)
    assert pos[trans + (1, "when")] == (11, 9) and val[trans + (1, "when")] == (11, 15)
    assert pos[("states", "done", "end")] == (12, 10)
    assert val[("states", "done", "end")] == (12, 15)
    # locate falls back to the longest known prefix, and to (1, 1) for the root
    assert doc.locate(("states", "first", "nope", 3)) == (4, 3)
    assert doc.locate(trans + (1, "when"), value=True) == (11, 15)
    assert doc.locate(()) == (1, 1)
    assert doc.data["states"]["second"]["transitions"] == [
        {"to": "done", "when": "x"}, {"to": "first", "when": "y"}]


def _ruamel_positions(node: Any, path: tuple[Any, ...], keys: dict[Any, Any],
                      values: dict[Any, Any]) -> None:
    if isinstance(node, CommentedMap):
        for key in node:
            keys[path + (key,)] = (node.lc.key(key)[0] + 1, node.lc.key(key)[1] + 1)
            values[path + (key,)] = (node.lc.value(key)[0] + 1, node.lc.value(key)[1] + 1)
            _ruamel_positions(node[key], path + (key,), keys, values)
    elif isinstance(node, CommentedSeq):
        for index, item in enumerate(node):
            keys[path + (index,)] = (node.lc.item(index)[0] + 1, node.lc.item(index)[1] + 1)
            _ruamel_positions(item, path + (index,), keys, values)


def example_text() -> str:
    return DSL_EXAMPLE.read_text() if DSL_EXAMPLE.exists() else EMBEDDED_EXAMPLE


def test_dsl_example_loads_clean_and_positions_match_ruamel_round_trip() -> None:
    text = example_text()
    doc, diags = load_document(DSL_EXAMPLE if DSL_EXAMPLE.exists() else "x.yaml", text)
    assert diags == [] and doc is not None
    assert_plain(doc.data)
    reference = YAML(typ="rt").load(text)
    keys: dict[Any, Any] = {}
    values: dict[Any, Any] = {}
    _ruamel_positions(reference, (), keys, values)
    assert len(keys) > 10
    assert {p: doc.positions.get(p) for p in keys} == keys
    assert {p: doc.value_positions.get(p) for p in values} == values
    assert set(doc.positions) == set(keys)


def test_dsl_example_from_disk_keeps_the_path_as_given() -> None:
    if not DSL_EXAMPLE.exists():
        pytest.fail("tests/data/dsl_example.yaml is missing")
    doc, diags = load_document(DSL_EXAMPLE)
    assert diags == [] and doc is not None
    assert doc.path == str(DSL_EXAMPLE) and isinstance(doc.path, str)
    states = doc.data["states"]
    assert states["draft"]["retry"]["max_attempts"] == 3
    assert states["draft"]["retry"]["backoff"]["jitter"] is True
    assert doc.data["budget"]["cost_usd"] == 0.5
    assert doc.lines[doc.positions[("states", "review")][0] - 1].strip() == "review:"


def test_scalars_become_plain_json_like_values() -> None:
    doc, diags = load_text(
        "a: .nan\nb: -.inf\nc: 0x1F\nd: 1_000\ne: 2024-01-01\nf: yes\ng: ~\nh: 1e3\n"
        "i: true\nj: '1'\nk: \"null\"\nl:\nm: 0o17\nn: -12\n")
    assert diags == [] and doc is not None
    assert_plain(doc.data)
    d = doc.data
    assert math.isnan(d["a"]) and d["b"] == -math.inf
    assert (d["c"], d["d"], d["m"], d["n"]) == (31, 1000, 15, -12)
    assert d["e"] == "2024-01-01"  # timestamps stay the text written
    assert d["f"] == "yes" and d["i"] is True  # YAML 1.2: only true/false are booleans
    assert d["g"] is None and d["l"] is None and d["h"] == 1000.0
    assert d["j"] == "1" and d["k"] == "null"
    # an empty value points at its key; a real one at itself
    assert doc.value_positions[("l",)] == (12, 1)
    assert doc.value_positions[("g",)] == (7, 4)


def test_yaml_1_1_directive_is_honoured() -> None:
    doc, diags = load_text("%YAML 1.1\n---\na: yes\nb: 010\n")
    assert diags == [] and doc is not None
    assert doc.data == {"a": True, "b": 8}


def test_small_anchors_aliases_and_merge_keys_are_accepted() -> None:
    doc, diags = load_text(
        "base: &b {model: m, max_tokens: 10}\nx:\n  <<: *b\n  max_tokens: 20\ny: *b\n")
    assert diags == [] and doc is not None
    assert doc.data["x"] == {"model": "m", "max_tokens": 20}
    assert doc.data["y"] == {"model": "m", "max_tokens": 10}
    assert doc.positions[("x", "model")] == (3, 3)  # merged keys point at the `<<`


def test_utf8_bom_and_bytes_input_are_fine() -> None:
    doc, diags = load_text("\ufeffname: caf\u00e9\n".encode("utf-8"))
    assert diags == [] and doc is not None
    assert doc.data == {"name": "caf\u00e9"} and doc.positions[("name",)] == (1, 1)
    assert not doc.text.startswith("\ufeff")


def test_load_text_default_path() -> None:
    doc, _ = load_text("a: 1\n")
    assert doc is not None and doc.path == "<string>"
    _, diags = load_text("- 1\n")
    assert diags[0].path == "<string>"


# ------------------------------------------------------------------ each error kind

@pytest.mark.parametrize(("src", "line", "col"), [
    ("a: 1\nb: [1, 2\nc: 3\n", 3, 2),
    ("a: 1\n b: 2\n", 2, 3),
    ("a:\n\tb: 1\n", 2, 1),
    ("a: 'open\n", 2, 1),
    ("a: *nowhere\n", 1, 4),
])
def test_yaml_syntax_is_positioned_where_ruamel_says(src: str, line: int, col: int) -> None:
    assert where(only_error(src)) == ("yaml-syntax", line, col)


def test_duplicate_keys_point_at_the_second_and_relate_the_first() -> None:
    doc, diags = load_text("a: 1\nb:\n  c: 1\n  c: 2\na: 3\n", path="dup.yaml")
    assert doc is None
    assert [where(d) for d in diags] == [("yaml-duplicate-key", 4, 3),
                                         ("yaml-duplicate-key", 5, 1)]
    assert diags[0].related[0][:3] == ("dup.yaml", 3, 3)
    assert diags[1].related[0][:3] == ("dup.yaml", 1, 1)
    assert "`a`" in diags[1].message


def test_duplicate_key_in_a_flow_mapping() -> None:
    diag = only_error("s: {x: 1, y: 2, x: 3}\n")
    assert where(diag) == ("yaml-duplicate-key", 1, 17)
    assert diag.related[0][1:3] == (1, 5)


@pytest.mark.parametrize("src", [
    "a: !!python/object/apply:os.system ['echo pwned']\n",
    "a: !!python/object/new:subprocess.check_output [[ls]]\n",
    "a: !!python/name:os.system\n",
    "a: !foo bar\n",
    "a: !!str 1\n",
    "a: !<tag:yaml.org,2002:str> x\n",
    "a: ! x\n",
    "a: !!map {b: 1}\n",
    "%TAG !e! tag:example.com,2000:\n---\na: !e!thing x\n",
])
def test_every_explicit_tag_is_rejected(src: str) -> None:
    diag = only_error(src)
    assert diag.rule == "yaml-tag" and diag.col == 4
    assert diag.line == (3 if src.startswith("%TAG") else 1)


def test_tags_are_all_reported_in_one_run() -> None:
    doc, diags = load_text("a: !x 1\nb:\n  - !!python/object:os.system {}\n")
    assert doc is None
    assert [where(d) for d in diags] == [("yaml-tag", 1, 4), ("yaml-tag", 3, 5)]


def billion_laughs(levels: int) -> str:
    lines = ["l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for n in range(1, levels):
        refs = ", ".join([f"*l{n - 1}"] * 10)
        lines.append(f"l{n}: &l{n} [{refs}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_quickly() -> None:
    started = time.perf_counter()
    diag = only_error(billion_laughs(10))  # 10**10 nodes if expanded
    assert time.perf_counter() - started < 1.0
    # levels 0..3 expand to ~1,111 + 11,110 nodes; level 4 (line 5) crosses 100,000
    assert diag.rule == "yaml-anchor-bomb" and diag.line == 5
    assert f"{MAX_NODES:,}" in diag.message


def test_moderate_alias_use_under_the_budget_is_fine() -> None:
    doc, diags = load_text(billion_laughs(3))
    assert diags == [] and doc is not None
    assert len(doc.data["l2"]) == 10 and doc.data["l2"][0][0] == ["lol"] * 10


def test_recursive_alias_is_refused() -> None:
    assert where(only_error("a: &x [1, *x]\n")) == ("yaml-anchor-bomb", 1, 11)


def test_nesting_limit() -> None:
    ok = "a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    doc, diags = load_text(ok)
    assert diags == [] and doc is not None
    too_deep = "a: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n"
    assert where(only_error(too_deep)) == ("yaml-too-deep", 1, 3 + MAX_DEPTH)
    block = "".join("  " * i + f"k{i}:\n" for i in range(200))
    assert where(only_error(block)) == ("yaml-too-deep", MAX_DEPTH + 1, 2 * MAX_DEPTH + 1)


def test_huge_flow_nesting_does_not_recurse_or_hang() -> None:
    started = time.perf_counter()
    assert only_error("a: " + "[" * 100_000).rule == "yaml-too-deep"
    assert time.perf_counter() - started < 5.0


@pytest.mark.parametrize("src", ["", "   \n\n", "# only\n# comments\n", "---\n", "---\n...\n"])
def test_empty_files(src: str) -> None:
    assert only_error(src).rule == "yaml-empty"
    assert only_error(src).line >= 1


@pytest.mark.parametrize(("src", "line"), [
    ("- a\n- b\n", 1), ("just text\n", 1), ("# c\n\n- a\n", 3), ("42\n", 1), ("null\n", 1),
    ("&a [1]\n", 1),
])
def test_root_must_be_a_mapping(src: str, line: int) -> None:
    assert where(only_error(src)) == ("yaml-not-mapping", line, 1)


def test_more_than_one_document() -> None:
    assert where(only_error("a: 1\n---\nb: 2\n")) == ("yaml-multi-document", 2, 1)
    assert where(only_error("---\na: 1\n...\n---\nb: 2\n")) == ("yaml-multi-document", 4, 1)


def test_invalid_utf8_reports_the_byte_offset_as_line_col() -> None:
    diag = only_error(b"a: 1\nb: caf\xe9\n")
    assert where(diag) == ("yaml-encoding", 2, 7)
    assert "byte offset 11" in diag.message and "0xe9" in diag.message


def test_nul_byte_in_bytes_and_in_text() -> None:
    assert where(only_error(b"a: 1\nb: x\x00y\n")) == ("yaml-encoding", 2, 5)
    assert where(only_error("a: 1\n\nc: \x00\n")) == ("yaml-encoding", 3, 4)


def test_utf16_with_bom_from_a_real_file(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_bytes("loopdsl: 1\n".encode("utf-16"))
    doc, diags = load_document(path)
    assert doc is None and [where(d) for d in diags] == [("yaml-encoding", 1, 1)]
    assert diags[0].path == str(path)
    assert "UTF-16" in diags[0].message


def test_utf16_without_bom_is_caught_by_its_nul_bytes() -> None:
    assert only_error("a: 1\n".encode("utf-16-le")).rule == "yaml-encoding"


def test_control_characters_are_encoding_errors() -> None:
    diag = only_error("a: 1\nb: \x07\n")
    assert where(diag) == ("yaml-encoding", 2, 4) and "U+0007" in diag.message


@pytest.mark.parametrize(("src", "line", "col"), [
    ("1: x\n", 1, 1), ("true: x\n", 1, 1), ("null: x\n", 1, 1), ("~: x\n", 1, 1),
    ("a: 1\n3.5: x\n", 2, 1), ("? [a, b]\n: x\n", 1, 3), ("{? {a: 1} : x}\n", 1, 4),
    ("s:\n  2: x\n", 2, 3),
])
def test_non_string_keys(src: str, line: int, col: int) -> None:
    assert where(only_error(src)) == ("yaml-non-string-key", line, col)


def test_quoted_number_keys_and_nan_values_are_fine() -> None:
    doc, diags = load_text("'1': .nan\n\"true\": .inf\n")
    assert diags == [] and doc is not None and set(doc.data) == {"1", "true"}


def test_unreadable_file_is_a_diagnostic(tmp_path: Path) -> None:
    doc, diags = load_document(tmp_path / "missing.yaml")
    assert doc is None and diags[0].rule == "file-unreadable" and diags[0].line == 0
    doc, diags = load_document(tmp_path)  # a directory
    assert doc is None and diags[0].rule == "file-unreadable"


def test_document_dataclass_contract_is_unchanged() -> None:
    doc = Document(path="p", text="", data={})
    assert doc.positions == {} and doc.value_positions == {} and doc.locate(("x",)) == (1, 1)


@pytest.mark.parametrize("src", ['a: "x\\0y"\n', 'a: "\\ud800"\n', 'a: "\\ud83d\\ude00"\n',
                                 'a: "\\x00"\n'])
def test_escapes_that_make_nul_or_surrogates_are_encoding_errors(src: str) -> None:
    assert where(only_error(src)) == ("yaml-encoding", 1, 4)


def test_escaped_emoji_is_fine() -> None:
    doc, diags = load_text('a: "\\U0001F600 \\u00e9"\n')
    assert diags == [] and doc is not None and doc.data["a"] == "\U0001F600 \u00e9"


def test_lone_surrogate_in_str_input() -> None:
    assert where(only_error("a: 1\nb: x\ud800\n")) == ("yaml-encoding", 2, 5)


def test_bad_utf8_after_multibyte_characters_counts_columns_as_characters() -> None:
    diag = only_error("x: 1\r\nname: caf\u00e9 ".encode() + b"\xff\n")
    assert where(diag) == ("yaml-encoding", 2, 12) and "byte offset 18" in diag.message


def test_old_mac_line_endings_position_control_characters() -> None:
    assert where(only_error("a: 1\rb: \x07\r")) == ("yaml-encoding", 2, 4)


def test_oversized_input_is_refused_without_reading_it_all(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(11 * 1024 * 1024)  # sparse: 11 MiB of NULs, cheap to create
    doc, diags = load_document(big)
    assert doc is None and diags[0].rule == "file-unreadable" and "10 MiB" in diags[0].message


# ------------------------------------------------------------------ fast (libyaml) and reference parsers
#
# A clean file is read from libyaml's events (ruamel.yaml.clib); anything else goes to
# ruamel's pure-Python parser. Whatever path a file takes, the result must be exactly
# what the reference parser alone gives: same data, same positions, same diagnostics.

def outcome(result: tuple[Document | None, list[Diagnostic]]) -> tuple[Any, ...]:
    doc, diags = result
    if doc is None:
        return ("errors", [(d.rule, d.line, d.col, d.message, d.related) for d in diags])
    # repr keeps types (1 / 1.0 / True) and key order, and compares NaN by its text
    return ("doc", repr(doc.data), list(doc.positions.items()),
            list(doc.value_positions.items()))


def assert_same_both_ways(text: str) -> tuple[Any, ...]:
    fast = outcome(parse_text("f.yaml", text, fast=True))
    reference = outcome(parse_text("f.yaml", text, fast=False))
    assert fast == reference, text
    return fast


def test_the_c_parser_is_installed_and_clean_files_never_reach_the_reference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert FAST_PARSER_AVAILABLE, "ruamel.yaml.clib is a dependency: pip install -e ."
    calls: list[str] = []
    real = loader_module.reference_events

    def counting(text: str) -> Any:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(loader_module, "reference_events", counting)
    doc, diags = load_text(example_text())
    assert diags == [] and doc is not None and calls == []
    # a finding, a %YAML directive, a tag: the reference parser decides
    for text in ("a: 1\na: 2\n", "%YAML 1.1\n---\na: yes\n", "a: !!str 1\n", "a: [1\n"):
        load_text(text)
    assert len(calls) == 4
    # nesting past the limit: the fast walk's finding is the reference's, so it stands
    calls.clear()
    for text in ("a: " + "[" * 100 + "]" * 100 + "\n", "a: 1\na: 1\nb: " + "[" * 100 + "]" * 100 + "\n"):
        assert outcome(parse_text("f.yaml", text)) == outcome(parse_text("f.yaml", text, fast=False))
    assert len(calls) == 2  # each once, from fast=False


CORPUS = [
    SAMPLE,
    EMBEDDED_EXAMPLE,
    # scalar styles, chomping and indentation indicators, folds
    "a: |\n  one\n  two\n\n  three\nb: |-\n  x\nc: |+\n  y\n\nd: |2\n    indented\n",
    "a: >\n  one\n  two\n\n  three\n   more\nb: >-\n  x\n  y\nc: >+\n  z\n\n",
    'a: "one\n  two\n\n  three"\nb: \'it\'\'s\n  folded\'\nc: plain\n  continued\n  lines\n',
    'a: "esc \\t \\n \\\\ \\" \\u00e9 \\U0001F600 \\x41 \\/"\nb: "line\\\n  joined"\n',
    # YAML 1.2 core types, and what 1.1 would read differently
    ("a: yes\nb: on\nc: 017\nd: 0o17\ne: 0x1f\nf: 1:20\ng: 1_000\nh: .5\ni: 1.\nj: +1\n"
     "k: -0\nl: 1e3\nm: 1E+3\nn: .Inf\no: -.inf\np: .NaN\nq: ~\nr: Null\ns: TRUE\nt: 0b101\n"),
    "a: 2024-01-01\nb: 2024-01-01T10:00:00Z\nc: 12:30\nd: '12:30'\ne: =\nf: <<\n",
    # anchors, aliases and merge keys
    ("base: &b {x: 1, y: [a, b]}\nmore: &m\n  z: 2\nc:\n  <<: [*b, *m]\n  x: 3\nd: *b\n"
     "e: &s text\nf: [*s, *s]\n"),
    # layouts: flow in block, block in block, explicit keys, empty values, comments
    "a:\n- 1\n- - 2\n  - 3\n-\n- {b: [c, {d: e}], f: }\nb: [ , ]\n",
    "? a\n: 1\n? b\n:\nc: # comment\n  - x # trailing\n  # between\n  - y\n",
    "---\na: 1\n...\n",
    "--- # comment\na: 1\n",
    "a: 1\r\nb:\r\n  - x\r\n  - y\r\n",
    "a: 1\rb: 2\r",
    "k\u00e9y: v\u00e4lue \U0001F600\n\U0001F600: [\u00e9, \u4e2d\u6587]\nz: {\u00fc: 1}\n",
    "a: " + "x" * 5000 + "\n" + "b" * 300 + ": 1\n",
    "a: [1, 2, 3]\n" * 1 + "".join(f"k{i}: {{v: {i}}}\n" for i in range(200)),
    # characters the parsers read differently: these go to the reference parser
    "a: b\tc\n", "a:\tb\n", "a: b\t\n", "a: |\n  x\ty\n", "a: b\x85c: d\n",
    "a: b\u2028c: d\n", 'a: "x\u2029y"\nq: 1\n', "a: {t\ufeffz: Europe/Paris, b: 1}\n",
    "a: {b: 12:30}\n", "a: [12:30]\n",
    # every kind of finding
    "a: 1\na: 2\n", "1: x\n", "a: !!str 1\n", "a: !x y\n", "%TAG !e! tag:e.com,2000:\n---\na: !e!x y\n",
    "%YAML 1.1\n---\na: yes\nb: 010\n", "%YAML 1.2\n---\na: yes\n", "a: 1\n---\nb: 2\n", "",
    "# only\n", "- a\n", "a: [1\n", "a: 1\n b: 2\n", "a:\n\tb: 1\n", "a: *nowhere\n",
    "a: &x [1, *x]\n", "a: " + "[" * 70 + "]" * 70 + "\n", "a: \x07\n", 'a: "\\0"\n',
    "<<: {a: 1}\nb: 2\n", "a:\n  <<: 3\n", "a: 0x" + "f" * 5000 + "\n",
]


@pytest.mark.parametrize("text", CORPUS, ids=range(len(CORPUS)))
def test_fast_and_reference_parsers_agree_on_the_corpus(text: str) -> None:
    assert_same_both_ways(text)


def test_folded_block_scalars_have_no_fold_marks() -> None:
    # ruamel's round-trip scanner marks folds with BEL for its own constructor
    text = "a: >\n  one\n  two\n\n  three\nb: >-\n  x\n  y\n"
    for fast in (True, False):
        doc, _ = parse_text("f.yaml", text, fast=fast)
        assert doc is not None and doc.data == {"a": "one two\nthree\n", "b": "x y"}


def _fuzz_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "fuzz_lint_for_loader", Path(__file__).resolve().parents[2] / "bench" / "fuzz_lint.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_fast_and_reference_parsers_agree_on_fuzzed_loops() -> None:
    fuzz = _fuzz_module()
    seeds = fuzz.seed_texts()
    kinds: dict[str, int] = {"doc": 0, "errors": 0}
    for index in range(scaled(400)):  # 400 under the `thorough` hypothesis profile, 200 under `ci`
        raw = fuzz.make_case(20260, index, seeds)
        text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
        text = text.replace("\x00", "").lstrip("\ufeff")
        text = text.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates
        kinds[assert_same_both_ways(text)[0]] += 1
    assert kinds["doc"] > 50 and kinds["errors"] > 50, kinds  # both paths were exercised


def _random_value(rng: random.Random, depth: int) -> Any:
    words = ["a", "yes", "on", "null", "~", "1", "0x1F", "017", "1:20", "2024-01-01", ".inf",
             "a: b", "a #b", "x\ny", "é", "\U0001F600", "{{ x }}", "'q'", '"d"', "[x]", "-", "",
             " lead", "trail ", "a,b", "<<", "=", "? k", "*no", "&no", "!no", "%", "@", "`"]
    roll = rng.random()
    if depth > 3 or roll < 0.4:
        scalar = rng.choice(words + [None, True, False, 0, -3, 1.5, 10**20])
        if isinstance(scalar, str) and rng.random() < 0.2:
            scalar = " ".join(rng.choice(words[:12]) for _ in range(rng.randint(4, 30)))
        return scalar
    if roll < 0.65:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {f"k{rng.randrange(30)}": _random_value(rng, depth + 1) for _ in range(rng.randint(0, 5))}


def test_fast_and_reference_parsers_agree_on_dumped_data_in_many_styles() -> None:
    """Valid YAML of every shape: random data written by ruamel's emitter with random
    flow styles, widths (folded long strings) and indentation."""
    docs = 0
    for index in range(150):
        rng = random.Random(index)
        yaml = YAML(typ="safe", pure=True)
        yaml.default_flow_style = rng.choice([False, None, True])
        yaml.width = rng.choice([20, 60, 4096])
        yaml.allow_unicode = rng.random() < 0.5
        mapping = rng.choice([2, 4])
        yaml.indent(mapping=mapping, sequence=mapping + 2, offset=mapping)
        yaml.explicit_start = rng.random() < 0.3
        stream = io.StringIO()
        yaml.dump({f"top{n}": _random_value(rng, 0) for n in range(rng.randint(1, 6))}, stream)
        docs += assert_same_both_ways(stream.getvalue())[0] == "doc"
    assert docs > 100


@pytest.mark.parametrize("value", [
    "", "a", "yes", "No", "ON", "true", "True", "TRUE", "tRUE", "null", "Null", "~", "1", "-1", "+1",
    "0", "017", "0o17", "0x1F", "0b1", "1_000", "1:20", "1.5", ".5", "5.", "1e3", "1E-3", ".inf",
    "-.Inf", ".NaN", "2024-01-01", "2024-01-01 10:00:00", "<<", "=", "0.", "-", "1__0", "_1",
])
def test_the_fast_resolver_is_ruamels_yaml_1_2_resolver(value: str) -> None:
    expected = str(VersionedResolver().resolve(ScalarNode, value, (True, False)))
    assert resolve_plain_1_2(value, (True, False)) == expected
    assert resolve_plain_1_2(value, (True, False)) == expected  # remembered, still right
    assert resolve_plain_1_2(value, (False, True)) == "tag:yaml.org,2002:str"


CHECK_SCRIPT = """\
import json
from loopdsl.language import yaml_events
from loopdsl.language.loader import load_text
doc, diags = load_text(open("loop.yaml").read())
print(json.dumps({"fast": yaml_events.FAST_PARSER_AVAILABLE, "data": doc.data if doc else None,
                  "positions": sorted(map(list, doc.positions.values())) if doc else None,
                  "rules": [d.rule for d in diags]}))
"""


@pytest.mark.parametrize(("stub", "why"), [
    ("raise ImportError('simulated: no C extension')\n", "missing"),
    ("class CParser:\n    pass\nclass ScalarEvent:\n    pass\n", "built for another ruamel"),
])
def test_without_a_usable_c_extension_the_reference_parser_does_everything(
        tmp_path: Path, stub: str, why: str) -> None:
    (tmp_path / "stub").mkdir()
    (tmp_path / "stub" / "_ruamel_yaml.py").write_text(stub)
    (tmp_path / "loop.yaml").write_text(SAMPLE + "extra: >\n  folded\n  text\n")
    (tmp_path / "check.py").write_text(CHECK_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "stub"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "check.py"], cwd=tmp_path, env=env, check=False,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["fast"] is False, why
    doc, _ = load_text(SAMPLE + "extra: >\n  folded\n  text\n")  # this process: libyaml
    assert doc is not None and found["rules"] == []
    assert found["data"] == doc.data
    assert found["positions"] == sorted(map(list, doc.positions.values()))
