"""Shell commands: hostile values reach real bash byte for byte and never run as code."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopdsl.language.model import DEFAULT_OUTPUT_CAP
from loopdsl.language.templates import (
    MAX_ENV_STRING,
    RenderError,
    TemplateError,
    check_shell,
    compile_shell,
    compile_template,
    to_text,
)

BASH = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]

HOSTILE = [
    "", " ", "plain", "two words", "  leading and trailing  ", "'", '"', "'\"'\"'", "it's",
    'say "hi"', ";", "; touch PWNED", "&& touch PWNED", "|| touch PWNED", "| tee PWNED",
    "& touch PWNED &", "$(touch PWNED)", "`touch PWNED`", "\"$(touch PWNED)\"",
    "'$(touch PWNED)'", "'; touch PWNED; echo '", "\"; touch PWNED; echo \"",
    "a\nb", "\ntouch PWNED\n", "line\r\nnext\r", "\r", "trailing newline\n\n", "*", "?", "[a]",
    "*.txt", "out*", "{a,b}", "~", "~root", "-rf", "--help", "-n", "-e \\n", "> PWNED",
    ">> PWNED", "< /etc/passwd", "2>&1", "$HOME", "${HOME}", "${IFS}", "$IFS", "$0", "$$",
    "$((1+1))", "$[1+1]", "a[$(touch PWNED)]", "!!", "!$", "#not a comment", "x # y",
    "\\", "\\\\", "\\n", "back\\slash\\", "\\$(touch PWNED)", "\\`touch PWNED\\`", "\t",
    "é ü 日本語 🚀", "\u200b\u202e", "\x01\x02\x1b[31m", "%s %d %n", "${x:-$(touch PWNED)}",
    "<(touch PWNED)", ">(touch PWNED)", "=(touch PWNED)", "x" * 100_000, "a b\n" * 20_000,
    "EOF", "}", "{{ x }}", "{% raw %}", ")", "(", "((", "$(", "'$'", "$'\\x41'",
]
# Each form stands for a kind of placeholder position; the value must arrive unchanged.
FORMS = [
    "printf '%s' {{ v }} > out_bare",
    "printf '%s' \"pre-{{ v }}-post\" > out_dq",
    "printf '%s' \"$(printf '%s' {{ v }})\" > out_cmdsub",
    "printf '%s' \"${LOOPDSL_UNSET:-{{ v }}}\" > out_param",
    "value={{ v }}; printf '%s' \"$value\" > out_assign",
    "printf '%s' {{ v }} | cat > out_pipe",
    "cat <<< {{ v }} > out_herestring",
    "printf '%s' pre{{ v }}post > out_glued",
]
EXPECTED = {
    "out_bare": lambda v: v, "out_dq": lambda v: f"pre-{v}-post",
    "out_cmdsub": lambda v: v.rstrip("\n"), "out_param": lambda v: v, "out_assign": lambda v: v,
    "out_pipe": lambda v: v, "out_herestring": lambda v: v + "\n",
    "out_glued": lambda v: f"pre{v}post",
}


def run_bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*BASH, script], cwd=cwd, env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, timeout=30, check=False)


def test_forms_compile_to_expected_scripts() -> None:
    assert compile_shell(FORMS[0]).script == "printf '%s' \"$LOOPDSL_1\" > out_bare"
    assert compile_shell(FORMS[1]).script == "printf '%s' \"pre-${LOOPDSL_1}-post\" > out_dq"
    assert compile_shell(FORMS[3]).script == "printf '%s' \"${LOOPDSL_UNSET:-${LOOPDSL_1}}\" > out_param"
    assert compile_shell("a {{ x }} b {{ y }}").script == 'a "$LOOPDSL_1" b "$LOOPDSL_2"'


@pytest.mark.parametrize("value", HOSTILE, ids=[repr(v)[:30] for v in HOSTILE])
def test_hostile_value_arrives_byte_for_byte(value: str, tmp_path: Path) -> None:
    command = compile_shell("\n".join(FORMS))
    env = command.environment({"v": value})
    assert set(env) == {f"LOOPDSL_{i}" for i in range(1, len(FORMS) + 1)}
    result = run_bash(command.script, env, tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(EXPECTED), "a payload made a file"
    for name, expected in EXPECTED.items():
        assert (tmp_path / name).read_bytes() == expected(value).encode(), name


def test_naive_rendering_would_have_been_injected(tmp_path: Path) -> None:
    """The payloads are real: splicing the rendered text into the script runs them."""
    naive = compile_template("printf '%s' {{ v }} > out").render({"v": "$(touch PWNED)"})
    run_bash(naive, {}, tmp_path)
    assert (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value, text", [
    ({"q": "it's \"x\"", "n": [1, None]}, '{"q":"it\'s \\"x\\"","n":[1,null]}'),
    (["$(touch PWNED)", "`id`"], '["$(touch PWNED)","`id`"]'), (None, ""), (True, "true"),
    (False, "false"), (42, "42"), (-1.5, "-1.5"),
])
def test_non_string_values_arrive_as_text(value: object, text: str, tmp_path: Path) -> None:
    command = compile_shell("printf '%s' {{ v }} > out")
    assert command.environment({"v": value}) == {"LOOPDSL_1": text} == {"LOOPDSL_1": to_text(value)}
    assert run_bash(command.script, command.environment({"v": value}), tmp_path).returncode == 0
    assert (tmp_path / "out").read_bytes() == text.encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40))
def test_any_text_arrives_unchanged(tmp_path: Path, value: str) -> None:
    command = compile_shell("printf '%s' {{ v }} > a; printf '%s' \"<{{ v }}>\" > b")
    for old in tmp_path.iterdir():
        old.unlink()
    assert run_bash(command.script, command.environment({"v": value}), tmp_path).returncode == 0
    assert (tmp_path / "a").read_bytes() == value.encode()
    assert (tmp_path / "b").read_bytes() == f"<{value}>".encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_nul_is_a_clean_render_error() -> None:
    with pytest.raises(RenderError) as err:
        compile_shell("printf '%s' {{ v }}").environment({"v": "a\x00b"})
    assert "NUL" in err.value.message and "{{ v }}" in err.value.message


def test_lone_surrogate_is_a_clean_render_error() -> None:
    with pytest.raises(RenderError) as err:
        compile_shell("printf '%s' {{ v }}").environment({"v": "a\ud800b"})
    assert "surrogate" in err.value.message


def test_undefined_placeholder_names_variable_and_placeholder() -> None:
    with pytest.raises(RenderError) as err:
        compile_shell("git -C {{ inputs.repo }} log").environment({"inputs": {}})
    assert "{{ inputs.repo }}" in err.value.message and "repo" in err.value.message


def test_value_too_big_for_one_variable_is_a_clear_error() -> None:
    with pytest.raises(RenderError) as err:
        compile_shell("printf '%s' {{ v }}").environment({"v": "x" * MAX_ENV_STRING})
    assert "environment variable" in err.value.message


def test_prepare_passes_values_up_to_the_cap(tmp_path: Path) -> None:
    big = ("é$(touch PWNED)'\"\n" * 200_000)     # > 1 MiB: truncated at the cap, then chunked
    command = compile_shell("printf '%s' {{ v }} > a; printf '%s' \"{{ w }}\" > b")
    script, env = command.prepare({"v": big, "w": "small"})
    assert all(len(k.encode()) + len(v.encode()) + 2 <= MAX_ENV_STRING for k, v in env.items())
    result = run_bash(script, env, tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    sent = (tmp_path / "a").read_bytes()
    marker = f"\n[... truncated by loopdsl at {DEFAULT_OUTPUT_CAP} bytes]".encode()
    assert sent.endswith(marker)
    assert DEFAULT_OUTPUT_CAP - 4 < len(sent) - len(marker) <= DEFAULT_OUTPUT_CAP
    assert big.encode().startswith(sent[: -len(marker)])
    assert (tmp_path / "b").read_bytes() == b"small"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    assert command.prepare({"v": "s", "w": "t"}) == (command.script, {"LOOPDSL_1": "s", "LOOPDSL_2": "t"})


# ---------------------------------------------------------------- compile-time refusals

@pytest.mark.parametrize("source, rule, offset", [
    ("echo '{{ x }}'", "shell-quote-single", 6),
    ("echo 'a' \"{{ y }}\" 'b {{ x }}'", "shell-quote-single", 22),
    ("printf '%s {{ x }}\\n'", "shell-quote-single", 11),
    ("echo $'\\'{{ x }}'", "shell-quote-single", 9),
    ("cat <<EOF\nhello {{ x }}\nEOF", "shell-quote-heredoc", 16),
    ("cat <<-EOF\n\t{{ x }}\n\tEOF", "shell-quote-heredoc", 12),
    ("cat <<'EOF'\n{{ x }}\nEOF", "shell-quote-heredoc", 12),
    ("cat <<\"EOF\" > f\na\n{{ x }}\nEOF", "shell-quote-heredoc", 18),
    ("y=$(cat <<EOF\n{{ x }}\nEOF\n)", "shell-quote-heredoc", 14),
    ("cat <<{{ x }}\nbody\n", "shell-quote-heredoc", 6),
    ("echo `echo {{ x }}`", "shell-quote-backtick", 11),
    ("echo \"`cat {{ x }}`\"", "shell-quote-backtick", 11),
    ("echo {% if x %}a{% endif %}", "shell-statement", 5),
    ("{% for f in files %}rm {{ f }}{% endfor %}", "shell-statement", 0),
    ("echo hi; {% set x = 1 %}", "shell-statement", 9),
    ("echo {{ x | unsafe_raw }}", "shell-unsafe-raw", 12),
    ("echo {{ (x | unsafe_raw) | trim }}", "shell-unsafe-raw", 13),
    ("echo $(( {{ n }} + 1 ))", "shell-arithmetic", 9),
    ("(( {{ n }} > 1 )) && echo big", "shell-arithmetic", 3),
    ("echo \\{{ x }}", "shell-escaped-placeholder", 6),
    ("echo \"\\{{ x }}\"", "shell-escaped-placeholder", 7),
    ("echo ${{ x }}", "shell-escaped-placeholder", 6),
    ("echo {{ x + }}", "template-syntax", 5),
    ("echo {{ 'open }}", "template-syntax", 5),
    ("echo {# open", "template-syntax", 5),
])
def test_template_errors_with_offsets(source: str, rule: str, offset: int) -> None:
    with pytest.raises(TemplateError) as err:
        compile_shell(source)
    assert (err.value.rule, err.value.offset) == (rule, offset), err.value.message
    assert source[offset:].startswith(("{{", "{%", "{#", "unsafe_raw"))
    assert err.value.message


@pytest.mark.parametrize("source", ["cat << EOF\nEOF2\n{{ x }}\nEOF", "cat <<A <<B\nA\n{{ x }}\nB"])
def test_heredocs_the_parser_misreads_are_refused(source: str) -> None:
    """tree-sitter-bash ends a here-document at a line that only starts with its delimiter and
    cannot read two on one line; such commands are refused, never guessed at."""
    command, errors = check_shell(source)
    assert command is None
    assert errors[0].rule == "shell-syntax"


def test_error_messages_say_how_to_fix() -> None:
    with pytest.raises(TemplateError) as err:
        compile_shell("echo '{{ x }}'")
    assert "printf %s \"{{ x }}\"" in err.value.message
    with pytest.raises(TemplateError) as err:
        compile_shell("cat <<EOF\n{{ x }}\nEOF")
    assert "<<<" in err.value.message
    with pytest.raises(TemplateError) as err:
        compile_shell("echo `{{ x }}`")
    assert "$(" in err.value.message


def test_check_shell_reports_every_problem() -> None:
    command, errors = check_shell("echo '{{ a }}' `{{ b }}` {% if c %}")
    assert command is None
    assert [(e.rule, e.offset) for e in errors] == [
        ("shell-quote-single", 6), ("shell-quote-backtick", 16), ("shell-statement", 25)]


@pytest.mark.parametrize("source, script", [
    ("echo \\'{{ x }}", "echo \\'\"$LOOPDSL_1\""),
    ("echo \"it's {{ x }}\"", "echo \"it's ${LOOPDSL_1}\""),
    ("echo 'a'\\''b' {{ x }}", "echo 'a'\\''b' \"$LOOPDSL_1\""),
    ("echo hi # it's {{ x }}", "echo hi # it's \"$LOOPDSL_1\""),
    ("echo a#'{{ x }}'", None),
    ("echo {# note #}hi {{ x }}", "echo hi \"$LOOPDSL_1\""),
    ("docker ps --format '{% raw %}{{.Names}}{% endraw %}' {{ x }}",
     "docker ps --format '{{.Names}}' \"$LOOPDSL_1\""),
    ("echo {{ \"}}\" }}", "echo \"$LOOPDSL_1\""),
    ("echo {{ {'a': {'b': 1}} }}", "echo \"$LOOPDSL_1\""),
    ("cat <<EOF\nbody 'q'\nEOF\necho '{{ '' }}'x{{ x }}", None),
    ("cat <<EOF\nbody\nEOF\necho {{ x }}", "cat <<EOF\nbody\nEOF\necho \"$LOOPDSL_1\""),
    ("echo $(( 1 << 2 )) {{ x }}", "echo $(( 1 << 2 )) \"$LOOPDSL_1\""),
    ("x={{ x }} && echo \"$x\"", "x=\"$LOOPDSL_1\" && echo \"$x\""),
    ("echo {{- x -}} y", "echo \"$LOOPDSL_1\" y"),
])
def test_quoting_contexts(source: str, script: str | None) -> None:
    command, errors = check_shell(source)
    if script is None:
        assert errors and errors[0].rule == "shell-quote-single"
    else:
        assert not errors, [e.message for e in errors]
        assert command is not None and command.script == script


@pytest.mark.parametrize("source, expected", [
    ("cat <<EOF\nliteral 'q' \"d\"\nEOF\nprintf '%s' {{ v }}", "literal 'q' \"d\"\n"),
    ("cat <<-'EOF'\n\t$(touch PWNED)\n\tEOF\nprintf '%s' \"{{ v }}\"", "$(touch PWNED)\n"),
    ("printf '%s' \"$(printf '%s' \"in {{ v }}\")\"", "in "),
    ("printf '%s' {% raw %}'{{x}}'{% endraw %}-{{ v }}", "{{x}}-"),
])
def test_commands_with_heredocs_and_raw_blocks_run(source: str, expected: str, tmp_path: Path) -> None:
    command = compile_shell(source)
    value = "$(touch PWNED) ' \""
    result = run_bash(command.script, command.environment({"v": value}), tmp_path)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode() == expected + value
    assert not (tmp_path / "PWNED").exists()
