"""Injection, end to end through `loopdsl.run`: hostile values from inputs and from model
output reach real bash (shell states and shell gates, placeholders bare and inside double
quotes) byte for byte and never run as code; Jinja sandbox escapes fail cleanly.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Mapping, Sequence

import pytest

import loopdsl
from loopdsl.language.diagnostics import LoopError
from loopdsl.language.model import Loop, build_loop
from loopdsl.runtime.model_port import LlmRequest, LlmResponse

SENTINEL = "PWNED"

HOSTILE = [
    "", " ", "plain", "two words", "  padded  ", "'", '"', "'\"'\"'", "it's", 'say "hi"',
    ";", "; touch PWNED", "&& touch PWNED", "|| touch PWNED", "| touch PWNED", "& touch PWNED &",
    "$(touch PWNED)", "`touch PWNED`", "\"$(touch PWNED)\"", "'$(touch PWNED)'",
    "'; touch PWNED; echo '", "\"; touch PWNED; echo \"", "a\nb", "\ntouch PWNED\n",
    "line\r\nnext\r", "trailing newlines\n\n", "*", "?", "[a-z]*", "*.yaml", "{a,b}", "~", "~root",
    "-rf", "--help", "-n", "-e \\n", "-- touch PWNED", "> PWNED", ">> PWNED", "< /etc/passwd",
    "2>&1", "$HOME", "${HOME}", "${IFS}", "$0", "$$", "$((1+1))", "$[1+1]", "a[$(touch PWNED)]",
    "!!", "!$", "#comment", "x # y", "\\", "\\\\", "\\n", "\\$(touch PWNED)", "\t", "é ü 日本語 🚀",
    "\u200b\u202e", "\x01\x02\x1b[31mred", "%s %d %n %x", "${x:-$(touch PWNED)}", "<(touch PWNED)",
    ">(touch PWNED)", "$LOOPDSL_1", "${LOOPDSL_2}", "{{ 7 * 7 }}", "{% raw %}", "$'\\x41'",
    "eval touch PWNED", "x=1 touch PWNED", "EOF\ntouch PWNED\nEOF", "x" * 50_000,
]

LOOP = """\
loopdsl: 1
name: injection
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 100}
inputs:
  v: {type: string}
start: gen
states:
  gen:
    llm: {model: m, prompt: "Repeat the value."}
    next: write
  write:
    shell: printf '%s' {{ inputs.v }} > in_bare && printf '%s' "{{ inputs.v }}" > in_dq && printf '%s' {{ gen.text }} > llm_bare && printf '%s' "<{{ gen.text }}>" > llm_dq
    gates:
      before:
        - name: inputs-gate
          shell: printf '%s' {{ inputs.v }} > gate_in_bare && printf '%s' "{{ inputs.v }}" > gate_in_dq
      after:
        - name: llm-gate
          shell: printf '%s' {{ gen.text }} > gate_llm_bare && printf '%s' "<{{ gen.text }}>" > gate_llm_dq
    next: argv
  argv:
    shell: {argv: [bash, -c, "printf '%s' \\"$1\\" > argv_out", argv0, "{{ inputs.v }}"]}
    next: envvar
  envvar:
    shell: {cmd: "printf '%s' \\"$HOSTILE\\" > env_out", env: {HOSTILE: "{{ gen.text }}"}}
    next: done
  done: {end: completed}
"""
FILES = {
    "in_bare": lambda v: v, "in_dq": lambda v: v, "gate_in_bare": lambda v: v, "gate_in_dq": lambda v: v,
    "llm_bare": lambda v: v, "llm_dq": lambda v: f"<{v}>", "gate_llm_bare": lambda v: v,
    "gate_llm_dq": lambda v: f"<{v}>", "argv_out": lambda v: v, "env_out": lambda v: v,
}


@pytest.fixture(scope="module")
def injection_loop(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("loop") / "injection.yaml"
    path.write_text(LOOP, encoding="utf-8")
    return path


def test_enough_hostile_values() -> None:
    assert len(set(HOSTILE)) >= 50


@pytest.mark.parametrize("value", HOSTILE, ids=[f"{i:02d}" for i in range(len(HOSTILE))])
def test_hostile_value_arrives_byte_for_byte(value: str, injection_loop: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    script = tmp_path / "replies.json"
    script.write_text(json.dumps({"gen": [{"text": value, "usage": {"prompt_tokens": 5, "completion_tokens": 5}}]}))
    result = loopdsl.run(injection_loop, {"v": value}, script=script, workdir=work)
    assert result.status == "completed", result.state.error
    assert result.state.results["gen"]["text"] == value  # what the model "said", unchanged
    for name, expected in FILES.items():
        data = (work / name).read_bytes()
        assert data == expected(value).encode("utf-8"), name
    assert not list(work.rglob(SENTINEL)), "a hostile value ran as code"
    assert not (tmp_path / SENTINEL).exists() and not (injection_loop.parent / SENTINEL).exists()
    assert sorted(p.name for p in work.iterdir()) == sorted(FILES)


BIG_VALUE = "0123456789abcdef" * 12_500  # 200 kB


def run_big_value(tmp_path: Path, state_body: str) -> loopdsl.RunResult:
    path = tmp_path / "loop.yaml"
    path.write_text(textwrap.dedent("""\
        loopdsl: 1
        name: big
        inputs: {v: {type: string}}
        start: s
        states:
          s:
        BODY
            next: done
          done: {end: completed}
        """).replace("BODY", textwrap.indent(textwrap.dedent(state_body), "    ")), encoding="utf-8")
    return loopdsl.run(path, {"v": BIG_VALUE}, workdir=tmp_path)


def test_value_above_one_env_variable_arrives_in_a_gate(tmp_path: Path) -> None:
    """200 kB is under the 1 MiB cap on rendered values but over Linux's 128 kB limit for
    one environment string: the gate runner splits it into chunks and it still arrives."""
    result = run_big_value(tmp_path, """\
        shell: "true"
        gates:
          after: [{shell: "printf '%s' {{ inputs.v }} > out", name: big}]
        """)
    assert result.status == "completed", result.state.error
    assert (tmp_path / "out").read_text() == BIG_VALUE


def test_value_above_one_env_variable_arrives_in_a_shell_state(tmp_path: Path) -> None:
    result = run_big_value(tmp_path, """\
        shell: printf '%s' "{{ inputs.v }}" > out
        """)
    assert result.status == "completed", result.state.error
    assert (tmp_path / "out").read_text() == BIG_VALUE


# ---------------------------------------------------------------- Jinja sandbox escapes

# Expressions that try to leave the sandbox, mutate the context or exhaust memory/CPU.
SANDBOX_ESCAPES = [
    "''.__class__.__mro__[1].__subclasses__()",
    "().__class__.__base__.__subclasses__()",
    "[].__class__.__base__.__subclasses__()",
    "inputs.__class__",
    "inputs.__init__.__globals__",
    "feedback.__class__.__mro__",
    "cycler.__init__.__globals__.os.popen('touch PWNED').read()",
    "joiner.__init__.__globals__.os.popen('touch PWNED').read()",
    "namespace.__init__.__globals__.os.popen('touch PWNED').read()",
    "lipsum.__globals__['os'].popen('touch PWNED').read()",
    "range.__self__.__import__('os').popen('touch PWNED').read()",
    "self._TemplateReference__context.cycler.__init__.__globals__.os.popen('touch PWNED').read()",
    "inputs|attr('__class__')",
    "inputs|attr('\\x5f\\x5fclass\\x5f\\x5f')",
    "'{0.__class__.__init__.__globals__}'.format(inputs)",
    "'%s'|format(inputs.__class__.__init__.__globals__)",
    "inputs.update({'v': 'changed'})",
    "history.setdefault('x', 1)",
    "run.pop('id')",
    "'x' * 10**9",
    "9**99999999",
    "range(10**9)|list|length",
    "'a'.center(10**9)",
    "config.__class__.__init__.__globals__['os'].popen('touch PWNED').read()",
    "request.application.__globals__.__builtins__.__import__('os').popen('touch PWNED').read()",
    "dict.__subclasses__()",
    "inputs.items().__class__.__mro__",
]
STATEMENT_ESCAPES = [
    "{% for i in range(10**9) %}x{% endfor %}",
    "{% set g = cycler.__init__.__globals__ %}{{ g.os.popen('touch PWNED').read() }}",
    "{% include '/etc/passwd' %}",
    "{% import 'os' as os %}{{ os }}",
    "{% extends '/etc/passwd' %}",
    "{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}",
]


class CapturingProvider:
    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def complete(self, request: LlmRequest, *, state: str) -> LlmResponse:
        self.prompts.append(request.messages[-1]["content"])
        return LlmResponse(text="ok", prompt_tokens=1, completion_tokens=1, cost_usd=None, model=request.model)

    def count_tokens(self, model: str, messages: Sequence[Mapping[str, str]]) -> int:
        return 10


def escape_loop(tmp_path: Path, first_state: str) -> Path:
    path = tmp_path / "loop.yaml"
    path.write_text(textwrap.dedent("""\
        loopdsl: 1
        name: escape
        models:
          m: {model: openai/gpt-4o-mini, max_tokens: 100}
        inputs:
          v: {type: string, default: x}
        start: bad
        states:
          bad:
        FIRST
            next: after
          after: {shell: "touch after-ran", next: done}
          done: {end: completed}
        """).replace("FIRST", textwrap.indent(first_state, "    ")), encoding="utf-8")
    return path


def assert_clean_failure(path: Path | Loop, tmp_path: Path, provider: CapturingProvider) -> None:
    work = tmp_path / "work"
    work.mkdir()
    try:
        result = loopdsl.run(path, workdir=work, provider=provider)
    except LoopError as exc:  # refused by lint: each diagnostic says where
        errors = [d for d in exc.diagnostics if d.is_error]
        assert errors and all(d.line >= 1 for d in errors)
        # refused for the template itself, not because the test wrote broken YAML
        assert not any(d.rule.startswith(("yaml", "schema")) for d in errors), errors
    else:
        assert result.status == "failed", (result.status, result.state.results)
        error = result.state.error
        assert error["state"] == "bad"
        assert error["kind"] == "parse"
        assert "Traceback" not in error["message"]
        assert len(error["message"]) < 2000
        assert provider.prompts == []  # the prompt never reached a model
    assert not (work / "after-ran").exists()
    assert not list(tmp_path.rglob(SENTINEL))


def test_enough_sandbox_escapes() -> None:
    assert len(SANDBOX_ESCAPES) + len(STATEMENT_ESCAPES) >= 20


@pytest.mark.parametrize("payload", SANDBOX_ESCAPES + STATEMENT_ESCAPES)
def test_escape_written_in_a_prompt_fails_cleanly(payload: str, tmp_path: Path) -> None:
    template = payload if payload.startswith("{%") else "{{ " + payload + " }}"
    state = f"llm: {{model: m, prompt: {json.dumps('hi ' + template)}}}"
    assert_clean_failure(escape_loop(tmp_path, state), tmp_path, CapturingProvider())


@pytest.mark.parametrize("payload", SANDBOX_ESCAPES + STATEMENT_ESCAPES)
def test_escape_in_a_prompt_fails_at_run_time_even_without_lint(payload: str, tmp_path: Path) -> None:
    """Lint refuses many escapes for naming unknown variables; the sandbox must hold anyway."""
    template = payload if payload.startswith("{%") else "{{ " + payload + " }}"
    loop = build_loop({
        "loopdsl": 1, "name": "escape", "models": {"m": {"model": "openai/gpt-4o-mini", "max_tokens": 100}},
        "inputs": {"v": {"type": "string", "default": "x"}}, "start": "bad",
        "states": {"bad": {"llm": {"model": "m", "prompt": "hi " + template}, "next": "after"},
                   "after": {"shell": "touch after-ran", "next": "done"}, "done": {"end": "completed"}},
    })
    assert_clean_failure(loop, tmp_path, CapturingProvider())


@pytest.mark.parametrize("payload", SANDBOX_ESCAPES)
def test_escape_written_in_an_expression_fails_cleanly(payload: str, tmp_path: Path) -> None:
    state = f"set: {{x: {json.dumps(payload)}}}"
    assert_clean_failure(escape_loop(tmp_path, state), tmp_path, CapturingProvider())


@pytest.mark.parametrize("payload", SANDBOX_ESCAPES + STATEMENT_ESCAPES)
def test_escape_given_as_input_value_is_plain_text(payload: str, tmp_path: Path) -> None:
    value = payload if payload.startswith("{%") else "{{ " + payload + " }}"
    path = tmp_path / "loop.yaml"
    path.write_text(textwrap.dedent("""\
        loopdsl: 1
        name: escape-input
        models:
          m: {model: openai/gpt-4o-mini, max_tokens: 100}
        inputs:
          v: {type: string}
        start: ask
        states:
          ask: {llm: {model: m, prompt: "<{{ inputs.v }}>"}, next: save}
          save:
            shell: printf '%s' "{{ inputs.v }}" > saved
            next: done
          done: {end: completed, output: {echo: "{{ inputs.v }}"}}
        """), encoding="utf-8")
    provider = CapturingProvider()
    work = tmp_path / "work"
    work.mkdir()
    result = loopdsl.run(path, {"v": value}, workdir=work, provider=provider)
    assert result.status == "completed", result.state.error
    assert provider.prompts == [f"<{value}>"]
    assert (work / "saved").read_text() == value
    assert result.outputs == {"echo": value}
    assert not list(tmp_path.rglob(SENTINEL))
