"""Templates and expressions: strict undefined, the sandbox, size bounds, variables()."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from loopdsl.language import templates

from loopdsl.language.model import DEFAULT_OUTPUT_CAP
from loopdsl.language.templates import (
    RenderError,
    TemplateError,
    compile_expression,
    compile_template,
    to_text,
    truncate_text,
    variables,
)

CONTEXT = {
    "draft": {"json": {"items": [1, 2, 3]}, "text": "hello"},
    "review": {"verdict": "accept", "score": 7},
    "inputs": {"repo": "/tmp/repo", "names": ["a", "b"]},
    "run": {"attempt": 2, "date": "2024-05-01"},
    "x": "value",
}
MARKER = "\n[... truncated by loopdsl at 1048576 bytes]"


# ---------------------------------------------------------------- evaluation

@pytest.mark.parametrize("source, expected", [
    ("draft.json | length > 0", True),
    ("review.verdict == 'accept'", True),
    ("review.verdict == 'reject'", False),
    ("review.score >= 5 and run.attempt < 3", True),
    ("draft.json['items'] | sum", 6),
    ("inputs.names | map('upper') | list", ["A", "B"]),
    ("inputs.names | map('upper')", ["A", "B"]),      # lazy map is materialised
    ("missing is defined", False),
    ("missing | default('fallback')", "fallback"),
    ("'{\"a\": [1, 2]}' | fromjson", {"a": [1, 2]}),
    ("{'k': 'v'} | tojson", '{"k": "v"}'),
    ("x | unsafe_raw", "value"),
    ("[1, 2] + [3]", [1, 2, 3]),
    ("', '.join(inputs.names)", "a, b"),
    ("'-'.join(inputs.names | map('upper'))", "A-B"),
])
def test_expressions_evaluate_on_nested_contexts(source: str, expected: object) -> None:
    assert compile_expression(source)(CONTEXT) == expected


def test_expression_is_compiled_once_and_reusable() -> None:
    when = compile_expression("review.score > limit")
    assert when.source == "review.score > limit"
    assert when({**CONTEXT, "limit": 5}) is True
    assert when({**CONTEXT, "limit": 9}) is False


@pytest.mark.parametrize("source, expected", [
    ("Draft: {{ draft.text }} ({{ review.verdict }})", "Draft: hello (accept)"),
    ("{% for n in inputs.names %}{{ loop.index }}={{ n }};{% endfor %}", "1=a;2=b;"),
    ("{{ draft.json | tojson }}", '{"items": [1, 2, 3]}'),
    ("line\n", "line\n"),                                # keep_trailing_newline
    ("{{ '<b>' }}", "<b>"),                              # no autoescape
    (("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
      "{% endfor %}{{ ns.n }}"), "3"),
])
def test_templates_render(source: str, expected: str) -> None:
    assert compile_template(source).render(CONTEXT) == expected


@pytest.mark.parametrize("source, name", [
    ("{{ reviw.verdict }}", "reviw"),
    ("{{ draft.nope }}", "nope"),
    ("{{ draft.json.missing_key | length }}", "missing_key"),
    ("{% for x in nothing %}{% endfor %}", "nothing"),
    ("{{ 'a' ~ ghost }}", "ghost"),
    # Inside a printed list or mapping: these printed the word "Undefined".
    ("{{ [draft.nope] }}", "nope"),
    ("{{ {'k': draft.nope} }}", "nope"),
    ("{{ [draft] | map(attribute='nope') | list }}", "nope"),
])
def test_strict_undefined_names_the_variable(source: str, name: str) -> None:
    with pytest.raises(RenderError) as err:
        compile_template(source).render(CONTEXT)
    assert name in err.value.message


@pytest.mark.parametrize("source, name", [("ghost", "ghost"), ("[1, ghost]", "ghost"),
                                          ("review.nope", "nope"), ("ghost == 1", "ghost")])
def test_expression_yielding_undefined_raises(source: str, name: str) -> None:
    with pytest.raises(RenderError) as err:
        compile_expression(source)(CONTEXT)
    assert name in err.value.message


@pytest.mark.parametrize("source, rule_offset", [
    ("{{ x +}}", 0), ("ok\n{{ x | }}", 3), ("a\nb\n{% if %}", 4), ("{{ x | nosuchfilter }}", 0),
    ("{% for %}", 0), ("{{ 'unclosed }}", 0),
])
def test_template_syntax_errors_have_rule_and_offset(source: str, rule_offset: int) -> None:
    with pytest.raises(TemplateError) as err:
        compile_template(source)
    assert err.value.rule == "template-syntax"
    assert err.value.offset == rule_offset
    assert err.value.message


@pytest.mark.parametrize("source", ["x ==", "a b", "x }}", "", "x |"])
def test_expression_syntax_errors(source: str) -> None:
    with pytest.raises(TemplateError) as err:
        compile_expression(source)
    assert err.value.rule == "template-syntax"


def test_variables() -> None:
    assert variables("{{ draft.text }} {% set c = 1 %}{{ c }} {{ d | default(e) }}") == {
        "draft", "d", "e"}
    assert variables("{% for item in inputs.names %}{{ item }}{{ loop.index }}{% endfor %}") == {
        "inputs"}
    assert variables("review.verdict == 'accept' and run.attempt < 3", expression=True) == {
        "review", "run"}
    assert variables("plain text") == set()
    with pytest.raises(TemplateError):
        variables("{{ x +")
    with pytest.raises(TemplateError):
        variables("a ==", expression=True)


@pytest.mark.parametrize("value, text", [
    ("a b", "a b"), (None, ""), (True, "true"), (False, "false"), (3, "3"), (2.5, "2.5"),
    ({"a": [1, "é"]}, '{"a":[1,"é"]}'), ([1, None, True], "[1,null,true]"), ("", ""),
])
def test_to_text(value: object, text: str) -> None:
    assert to_text(value) == text


# ---------------------------------------------------------------- size bounds

def test_rendered_result_is_capped_with_marker() -> None:
    out = compile_template("{% for i in range(100) %}{{ 'y' * 100000 }}{% endfor %}").render({})
    assert out.endswith(MARKER)
    assert len(out.encode()) == DEFAULT_OUTPUT_CAP + len(MARKER)
    assert set(out[: -len(MARKER)]) == {"y"}


def test_truncation_never_splits_a_character() -> None:
    text = "é" * DEFAULT_OUTPUT_CAP                  # 2 bytes each
    cut = truncate_text(text)
    assert cut.endswith(MARKER)
    body = cut[: -len(MARKER)]
    assert set(body) == {"é"} and len(body.encode()) == DEFAULT_OUTPUT_CAP
    assert truncate_text("short") == "short"


def test_large_context_value_is_capped_when_rendered() -> None:
    out = compile_template("{{ big }}").render({"big": "z" * (3 * DEFAULT_OUTPUT_CAP)})
    assert out == "z" * DEFAULT_OUTPUT_CAP + MARKER


@pytest.mark.parametrize("source", [
    "'x' * 10**9", "10**9 * 'x'", "[0] * 10**9", "['x' * 1000000] * 1000", "2 ** (10**9)",
    "range(10**9) | list", "'{:>999999999}'.format(1)", "'{:{w}}'.format(1, w=5)",
    "'%999999999d' % 1", "'%*d' % (10**9, 1)", "'x' | center(10**9)", "'x'.ljust(10**9)",
    "'x'.zfill(10**9)", "'a\\tb'.expandtabs(10**9)", "'%999999999s' | format(1)",
    "'x' | indent(10**9)", "[1] | batch(10**9, 'x') | list", "[1] | slice(10**9) | list",
    "'aaaa'.replace('a', 'b' * 1000000)", "'aaaa' | replace('a', 'b' * 1000000)",
    "(1).to_bytes(10**9, 'big')", "{'a': 1} | tojson(indent=10**9)",
    "(['x' * 1000] * 1000) | join('-' * 1000)", "(['x' * 100000] * 10) ~ ('y' * 1000000)",
    "('-' * 1000000).join(['x'] * 10)", "[[0] * 1000000] * 2 | sum(start=[])",
])
def test_size_bombs_fail_fast(source: str) -> None:
    # A bound, not a speed target: the bomb is refused long before it could build its value
    # (seconds of CPU and gigabytes). CPU time, so that a loaded machine does not fail it.
    start = time.process_time()
    with pytest.raises(RenderError):
        compile_expression(source)(CONTEXT)
    assert time.process_time() - start < 5.0


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}{{ ns.s | length }}"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
     "{% endfor %}"),
    "{% set ns = namespace(n=2) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "{% set b %}{% for i in range(100000) %}{{ 'y' * 100000 }}{% endfor %}{% endset %}{{ b|length }}",
    "{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}",
    "{% macro f(n) %}{% for i in range(10) %}{{ f(n + 1) }}{% endfor %}{% endmacro %}{{ f(0) }}",
])
def test_cpu_and_memory_bombs_in_templates_fail_fast(source: str) -> None:
    start = time.monotonic()
    with pytest.raises(RenderError):
        compile_template(source).render({})
    assert time.monotonic() - start < 5.0


def test_ordinary_work_stays_within_the_budget() -> None:
    rows = [{"name": f"n{i}", "ok": i % 2 == 0} for i in range(20000)]
    out = compile_template(
        "{% for r in rows if r.ok %}{{ r.name | upper }},{% endfor %}").render({"rows": rows})
    assert out.count(",") == 10000
    assert compile_expression("'-' * 80")({}) == "-" * 80
    assert compile_expression("rows | selectattr('ok') | list | length")({"rows": rows}) == 10000


# ---------------------------------------------------------------- sandbox escapes

SANDBOX_PAYLOADS = [
    "{{ config }}",
    "{{ request.application }}",
    "{{ lipsum.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ namespace.__init__ }}",
    "{{ 'a'.__add__ }}",
    "{{ '{0.__class__}'.format(x) }}",
    "{{ x|attr('__class__') }}",
    "{{ ().__class__.__bases__[0] }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__()[0] }}",
    "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ (1).__class__.__base__.__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('touch SENTINEL').read() }}",
    "{{ cycler.__init__.__globals__.__builtins__.__import__('os').system('touch SENTINEL') }}",
    "{{ joiner.__init__.__globals__.os.system('touch SENTINEL') }}",
    "{{ namespace.__init__.__globals__.os.system('touch SENTINEL') }}",
    "{{ lipsum.__globals__['os'].popen('touch SENTINEL').read() }}",
    "{{ range.__globals__.os.system('touch SENTINEL') }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch SENTINEL') }}",
    "{{ self.__init__.__globals__.__builtins__ }}",
    "{{ config.__class__.__init__.__globals__['os'].popen('touch SENTINEL') }}",
    "{{ request.application.__globals__.__builtins__.__import__('os').popen('touch SENTINEL') }}",
    "{{ '{0.__class__.__init__.__globals__}'.format(x) }}",
    "{{ '{0.__init__.__globals__[os]}'.format(cycler) }}",
    "{{ '{a.__class__}'.format_map({'a': x}) }}",
    "{{ '%s' % x.__class__ }}",
    "{{ 'a'.__add__('b') }}",
    "{{ x | attr('__class__') | attr('__mro__') }}",
    "{{ x | attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ x | attr('__cla' ~ 'ss__') }}",
    "{{ (x | attr('__init__'))['__globals__'] }}",
    "{{ x['__class__']['__mro__'] }}",
    "{{ dict.mro()[1].__subclasses__() }}",
    "{{ namespace(a=1).__dict__ }}",
    "{{ {}.update(a=1) }}{{ [].append(1) }}",
    "{{ [].pop.__self__ }}",
    "{{ x.__len__() }}",
    "{{ x.__reduce_ex__(2) }}",
    "{% for c in ''.__class__.__mro__ %}{{ c }}{% endfor %}",
    "{% set g = cycler.__init__.__globals__ %}{{ g.os.system('touch SENTINEL') }}",
    "{% import 'os' as os %}{{ os.system('touch SENTINEL') }}",
    "{% include '/etc/passwd' %}",
    "{% extends '/etc/passwd' %}",
    "{{ loop.cycle.__globals__ }}",
    "{{ x.encode('utf-8').__class__ }}",
]


@pytest.mark.parametrize("payload", SANDBOX_PAYLOADS)
def test_sandbox_escapes_fail_cleanly(payload: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sentinel = tmp_path / "SENTINEL"
    try:
        out = compile_template(payload).render({"x": "value"})
    except (RenderError, TemplateError):
        out = ""
    for leak in ("<class", "<function", "<module", "<built-in", "__globals__", "root:"):
        assert leak not in out
    assert not sentinel.exists()


def test_payload_sentinel_check_can_detect_an_escape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sentinel really is what an escape would create: an unsandboxed Jinja runs it."""
    import jinja2

    monkeypatch.chdir(tmp_path)
    jinja2.Environment().from_string(
        "{{ cycler.__init__.__globals__.os.popen('touch SENTINEL').read() }}").render()
    assert (tmp_path / "SENTINEL").exists()


def test_harmless_introspection_renders_without_internals() -> None:
    assert compile_template("{{ self }}").render({}) == "<TemplateReference None>"
    assert compile_template("{{ x.upper() }}").render({"x": "a"}) == "A"


# ------------------------------------------------ lint's checks without compiling (issue 10)

_CHECKED_EXPRESSIONS = [
    "a.b == 1", "x | nosuchfilter", "x is nosuchtest", "x |", "[1, 2] | map('upper') | list",
    "range(3) | sum", "a if b else c", "x | unsafe_raw", "loop.index", "{'a': 1}.a", "(",
]
_CHECKED_TEMPLATES = [
    "{{ a.b }}", "{{ x | nosuchfilter }}", "{% for i in x %}{{ i }}{% endfor %}", "{% if %}",
    "{% set loop = 1 %}", "{% for loop in x %}{% endfor %}", "{% macro m() %}{% endmacro %}{{ m() }}",
    "{{ x is nosuchtest }}", "{% block b %}{% endblock %}{% block b %}{% endblock %}",
]
_CHECKED_COMMANDS = [
    "echo {{ x }}", "echo {{ x | nosuchfilter }}", "echo {{ x | unsafe_raw }}", "echo '{{ x }}'",
    "echo {{ x | unsafe_raw | nosuchfilter }}", "echo {{ ( }}", "echo {% if x %}y{% endif %}",
]


def _raised(call: Any, source: str) -> tuple[str, str, Any] | None:
    try:
        call(source)
    except templates.TemplateError as exc:
        return exc.message, exc.rule, exc.offset
    return None


@pytest.mark.parametrize("source", _CHECKED_EXPRESSIONS)
def test_check_expression_raises_what_compiling_raises(source: str) -> None:
    assert _raised(templates.check_expression, source) == _raised(templates.compile_expression, source)


@pytest.mark.parametrize("source", _CHECKED_TEMPLATES)
def test_check_template_raises_what_compiling_raises(source: str) -> None:
    assert _raised(templates.check_template, source) == _raised(templates.compile_template, source)


@pytest.mark.parametrize("source", _CHECKED_COMMANDS)
def test_shell_problems_are_what_compiling_finds(source: str) -> None:
    def key(errors: list[templates.TemplateError]) -> list[tuple[str, str, Any]]:
        return [(e.message, e.rule, e.offset) for e in errors]

    command, errors, warnings = templates.analyze_shell(source)
    checked, checked_warnings = templates.shell_problems(source)
    assert (key(checked), key(checked_warnings)) == (key(errors), key(warnings))
    assert (command is None) == bool(errors)
