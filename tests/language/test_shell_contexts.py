"""The shell rule: a placeholder stands only where bash uses its value as data.

Each class of place where bash evaluates a value (arithmetic, names, code, options) is a lint
error, and the engine refuses the same command with the same message, whether the hostile
value comes from `--input`, from a model's JSON reply or from a file name fed to `for_each`:
nothing injected ever runs. The safe rewrites run end to end with the same hostile values.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_in_process import cli_in_process

import loopdsl
from loopdsl.language.diagnostics import LoopError
from loopdsl.lint.pipeline import lint_paths
from loopdsl.language.model import build_loop
from loopdsl.language.templates import InputFacts, TemplateError, analyze_shell, argv_problems, check_shell
from cli_forked import loopdsl_command

MARKER = "MARKER"
ARITH = "a[$(touch MARKER)]"
CODE = "touch MARKER"

# (id, command with V for the placeholder's expression, expected rule, hostile value)
CLASSES: list[tuple[str, str, str, str]] = [
    *[(f"test-{op}", f"[[ {{{{ V }}}} {op} 1 ]] || true", "shell-arithmetic", ARITH)
      for op in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge")],
    ("test-eq-quoted", '[[ "{{ V }}" -eq 1 ]] || true', "shell-arithmetic", ARITH),
    ("test-v", "[[ -v {{ V }} ]] || true", "shell-name", ARITH),
    ("single-bracket-v", "[ -v {{ V }} ] || true", "shell-name", ARITH),
    ("test-builtin-v", "test -v {{ V }} || true", "shell-name", ARITH),
    ("let", "let x={{ V }}", "shell-arithmetic", ARITH),
    ("declare-i", "declare -i n={{ V }}", "shell-arithmetic", ARITH),
    ("substring", "s=abc; echo ${s:{{ V }}}", "shell-arithmetic", ARITH),
    ("subscript-read", "a=(1); echo ${a[{{ V }}]}", "shell-arithmetic", ARITH),
    ("subscript-write", "a[{{ V }}]=1", "shell-arithmetic", ARITH),
    ("array-literal-index", "a=([{{ V }}]=1)", "shell-arithmetic", ARITH),
    ("dollar-bracket", "echo $[ {{ V }} ]", "shell-arithmetic", ARITH),
    ("arith-in-cmdsub", "x=$( (( {{ V }} )) ; echo )", "shell-arithmetic", ARITH),
    ("printf-v", "printf -v {{ V }} x", "shell-name", ARITH),
    ("printf-first", "printf {{ V }} x", "shell-name", "-va[$(touch MARKER)]"),
    ("read", "read -r {{ V }} <<< x", "shell-name", ARITH),
    ("local-n", "f() { local -n r={{ V }}; echo $r; }; f", "shell-name", ARITH),
    ("indirect", "x={{ V }}; echo ${!x}", "shell-name", ARITH),
    ("unset", "a=(1 2); unset {{ V }}", "shell-name", ARITH),
    ("compgen", "compgen -W {{ V }}", "shell-code", "$(touch MARKER)"),
    ("mapfile-C", "mapfile -C {{ V }} -c 1 x <<< y", "shell-code", CODE),
    ("eval", "eval {{ V }}", "shell-code", CODE),
    ("bash-c", "bash -c {{ V }}", "shell-code", CODE),
    ("bash-c-inside", 'bash -c "echo {{ V }}"', "shell-code", "; touch MARKER"),
    ("trap", "trap {{ V }} EXIT", "shell-code", CODE),
    ("source-procsub", "source <(printf '%s' {{ V }})", "shell-code", CODE),
    ("pipe-to-bash", "printf '%s' {{ V }} | bash", "shell-code", CODE),
    ("xargs-sh-c", "printf '%s' {{ V }} | xargs sh -c", "shell-code", "'touch MARKER'"),
    ("find-exec-sh-c", "find . -maxdepth 0 -exec sh -c {{ V }} \\;", "shell-code", CODE),
    ("awk-program", "echo | awk {{ V }}", "shell-code", 'BEGIN{system("touch MARKER")}'),
    ("git-c", "git -c {{ V }} x", "shell-code", "alias.x=!touch MARKER"),
    ("command-name", "{{ V }} MARKER", "shell-command-name", "touch"),
    ("env-command-name", "env {{ V }} MARKER", "shell-command-name", "touch"),
    ("carried-arith", "x={{ V }}; echo $(( x + 1 ))", "shell-arithmetic", ARITH),
    ("carried-read", "printf '%s\\n' {{ V }} | while read -r n; do echo $(( n )); done", "shell-arithmetic", ARITH),
    ("carried-function", "f() { echo $(( $1 )); }; f {{ V }}", "shell-arithmetic", ARITH),
    ("carried-bash-c-arg", "bash -c 'echo $(( $1 ))' _ {{ V }}", "shell-arithmetic", ARITH),
    ("carried-eval", 'x={{ V }}; eval "echo $x"', "shell-code", "; touch MARKER"),
    ("ps4", "PS4={{ V }}; set -x; true", "shell-code", "$(touch MARKER)"),
    ("syntax", "if true; then echo {{ V }}", "shell-syntax", CODE),
]
IDS = [c[0] for c in CLASSES]


def command(template: str, expression: str) -> str:
    return template.replace("{{ V }}", "{{ " + expression + " }}")


@pytest.mark.parametrize("name, template, rule, value", CLASSES, ids=IDS)
def test_lint_refuses_each_class(name: str, template: str, rule: str, value: str) -> None:
    cmd, errors = check_shell(command(template, "inputs.v"))
    assert cmd is None
    assert rule in {e.rule for e in errors}, [(e.rule, e.message) for e in errors]
    assert all(e.hint for e in errors if e.rule == rule), "each error says how to fix it"


@pytest.mark.parametrize("name, template, rule, value", CLASSES, ids=IDS)
def test_the_classes_are_real_injections(name: str, template: str, rule: str, value: str,
                                         tmp_path: Path) -> None:
    """Without the rule (the value quoted as "$V" in the same place), bash runs the payload."""
    if rule in ("shell-syntax",):
        pytest.skip("a command bash cannot parse runs nothing either way")
    script = command(template, "x").replace("{{ x }}", '"$V"')
    overrides = {"array-literal-index": 'a=(["$V"]=1)', "bash-c-inside": 'bash -c "echo $V"'}
    script = overrides.get(name, script)
    subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=tmp_path, timeout=20,
                   env={"PATH": "/usr/bin:/bin", "V": value}, capture_output=True, input=b"")
    assert (tmp_path / MARKER).exists(), script


def loop_with_shell(cmd: str, source: str) -> dict[str, Any]:
    """A loop whose `use` state runs `cmd` on a value from `source` (input or model)."""
    states: dict[str, Any] = {}
    if source == "model":
        states["gen"] = {"llm": {"model": "m", "prompt": "give v", "output": "json"}, "next": "use"}
        expression = "gen.json.v"
    else:
        expression = "inputs.v"
    states["use"] = {"shell": command(cmd, expression), "next": "done"}
    states["done"] = {"end": "completed"}
    return {"loopdsl": 1, "name": "ctx", "models": {"m": {"model": "openai/gpt-4o-mini", "max_tokens": 50}},
            "inputs": {"v": {"type": "string", "default": "x"}},
            "start": "gen" if source == "model" else "use", "states": states}


def replies(tmp_path: Path, value: str) -> Path:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps({"gen": [{"text": json.dumps({"v": value}),
                                         "usage": {"prompt_tokens": 3, "completion_tokens": 3}}]}))
    return path


@pytest.mark.parametrize("source", ["input", "model"])
@pytest.mark.parametrize("name, template, rule, value", CLASSES, ids=IDS)
def test_the_engine_refuses_what_lint_refuses(name: str, template: str, rule: str, value: str,
                                              source: str, tmp_path: Path) -> None:
    """Run without lint (a Loop built in code): compiling refuses it with lint's message."""
    loop = build_loop(loop_with_shell(template, source))
    _, lint_errors = check_shell(command(template, "gen.json.v" if source == "model" else "inputs.v"))
    with pytest.raises(TemplateError) as refused:
        loopdsl.run(loop, {"v": value}, script=replies(tmp_path, value), workdir=tmp_path)
    assert refused.value.message == lint_errors[0].message
    assert not list(tmp_path.rglob(MARKER))


@pytest.mark.parametrize("name, template, rule, value", CLASSES[:12] + CLASSES[-8:],
                         ids=IDS[:12] + IDS[-8:])
def test_a_shell_gate_refuses_it_at_run_time(name: str, template: str, rule: str, value: str,
                                             tmp_path: Path) -> None:
    loop = build_loop({
        "loopdsl": 1, "name": "gate", "inputs": {"v": {"type": "string"}}, "start": "s",
        "states": {"s": {"shell": "true", "gates": {"after": [{"shell": command(template, "inputs.v"),
                                                                "name": "g"}]},
                         "next": "done"}, "done": {"end": "completed"}}})
    result = loopdsl.run(loop, {"v": value}, workdir=tmp_path)
    assert result.status == "failed"
    _, lint_errors = check_shell(command(template, "inputs.v"))
    assert lint_errors[0].message in result.state.error["message"]
    assert not list(tmp_path.rglob(MARKER))


CHILD = """\
loopdsl: 1
name: child
inputs: {v: {type: string}}
start: use
states:
  use:
    shell: CMD
    next: done
  done: {end: completed}
"""
PARENT = """\
loopdsl: 1
name: parent
start: listing
states:
  listing:
    shell: ls names
    next: fan
  fan:
    loop: child.yaml
    for_each: "listing.stdout.strip().split('\\n')"
    with: {v: "{{ item }}"}
    tolerate_failures: 100
    next: done
  done: {end: completed}
"""


def fan_out(tmp_path: Path, cmd: str, names: list[str]) -> Path:
    (tmp_path / "names").mkdir()
    for name in names:
        (tmp_path / "names" / name).write_text("")
    (tmp_path / "child.yaml").write_text(CHILD.replace("CMD", json.dumps(cmd)))
    parent = tmp_path / "parent.yaml"
    parent.write_text(PARENT)
    return parent


@pytest.mark.parametrize("name, template, rule, value",
                         [c for c in CLASSES if "/" not in c[3] and c[0] != "syntax"],
                         ids=[c[0] for c in CLASSES if "/" not in c[3] and c[0] != "syntax"])
def test_a_file_name_given_to_for_each_never_runs(name: str, template: str, rule: str, value: str,
                                                  tmp_path: Path) -> None:
    parent = fan_out(tmp_path, command(template, "inputs.v"), [value])
    # Lint in this process (the CLI's output is test_lint_reports_the_rule_with_file_line_and_column's
    # to check): a process per case cost more than the rest of the case.
    lint = lint_paths([parent])
    assert lint.exit_code(strict=False) != 0 and any(d.rule == "child-invalid" for d in lint.diagnostics)
    work = tmp_path / "work"
    work.mkdir()
    (work / "names").mkdir()
    (work / "names" / value).write_text("")
    try:   # without lint of the parent: the engine loads (and checks) the child itself
        result = loopdsl.run(build_loop(_load(parent)), workdir=work)
        assert result.status != "completed" or result.state.results["fan"]["failures"]
    except (TemplateError, LoopError) as refused:
        assert str(refused)
    assert not list(tmp_path.rglob(MARKER))


def _load(path: Path) -> dict[str, Any]:
    from ruamel.yaml import YAML

    data = YAML(typ="safe").load(path.read_text())
    data["states"]["fan"]["loop"] = str(path.parent / "child.yaml")
    return data


# ---------------------------------------------------------------- the safe rewrites run

HOSTILE = [ARITH, "$(touch MARKER)", "`touch MARKER`", "; touch MARKER", "a\ntouch MARKER",
           "--output=MARKER", "-va[$(touch MARKER)]", "*", "' \" \\", "-rf"]
SAFE = """\
[[ {{ V }} == "$EXPECT" ]] && printf 'eq\\n' >> out
[[ -n {{ V }} && -z "" ]] && printf 'n\\n' >> out
printf '%s' {{ V }} > value
bash -c 'printf "%s" "$1" > inner' _ {{ V }}
x=$(case {{ V }} in '*') echo star ;; *) printf '%s' {{ V }} ;; esac); printf '%s' "$x" > cased
printf -v copy '%s' {{ V }}; printf '%s' "$copy" > copied
git log --oneline --end-of-options {{ V }} > /dev/null 2>&1 || true
cat -- {{ V }} 2> /dev/null || true
"""


@pytest.mark.parametrize("value", HOSTILE)
def test_safe_forms_pass_lint_and_keep_values_intact(value: str, tmp_path: Path) -> None:
    cmd, errors, warnings = analyze_shell(command(SAFE, "inputs.v"))
    assert errors == [] and warnings == [] and cmd is not None
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    loop = build_loop(loop_with_shell(SAFE, "model"))
    loop.states["use"].action.env["EXPECT"] = value  # type: ignore[union-attr]
    result = loopdsl.run(loop, {}, script=replies(tmp_path, value), workdir=tmp_path)
    assert result.status == "completed", result.state.error
    assert (tmp_path / "value").read_text() == value
    assert (tmp_path / "inner").read_text() == value
    assert (tmp_path / "copied").read_text() == value
    assert (tmp_path / "cased").read_text() == ("star" if value == "*" else value.rstrip("\n"))
    assert (tmp_path / "out").read_text() == "eq\nn\n"
    assert not list(tmp_path.rglob(MARKER))


def test_integer_inputs_may_stand_in_arithmetic_and_are_checked_again() -> None:
    facts = InputFacts(integers=frozenset({"n"}))
    cmd, errors = check_shell("[[ {{ inputs.n }} -eq 1 ]] && echo $(( {{ inputs.n }} + {{ run.attempt }} ))", facts)
    assert errors == [] and cmd is not None
    for ok in ("{{ inputs.v | int }}", "{{ 3 }}", "{{ run.attempt }}"):
        assert check_shell(f"echo $(( {ok} + 1 ))")[1] == []
    with pytest.raises(Exception) as refused:
        cmd.environment({"inputs": {"n": ARITH}, "run": {"attempt": 1}})
    assert "not an integer" in str(refused.value)


def test_enum_inputs_may_stand_in_code_and_are_checked_again() -> None:
    facts = InputFacts(choices=(("test_command", ("make test", "npm test")),))
    cmd, errors = check_shell("bash -c {{ inputs.test_command }}", facts)
    assert errors == [] and cmd is not None
    assert cmd.environment({"inputs": {"test_command": "npm test"}}) == {"LOOPDSL_1": "npm test"}
    with pytest.raises(Exception) as refused:
        cmd.environment({"inputs": {"test_command": CODE}})
    assert "enum" in str(refused.value)


def test_a_proven_integer_does_not_taint_the_variable_it_is_assigned_to() -> None:
    facts = InputFacts(integers=frozenset({"n"}))
    assert check_shell("n={{ inputs.n }}; echo $(( n + 1 ))", facts)[1] == []
    assert check_shell("n={{ inputs.s }}; echo $(( n + 1 ))", facts)[1] != []


@pytest.mark.parametrize("argv, rule", [
    (["sh", "-c", "echo {{ inputs.v }}"], "shell-code"),
    (["bash", "-lc", "{{ inputs.v }}"], "shell-code"),
    (["env", "{{ inputs.v }}"], "shell-command-name"),
    (["{{ inputs.v }}", "x"], "shell-command-name"),
    (["python3", "-c", "{{ inputs.v }}"], "shell-code"),
])
def test_argv_running_a_value_as_code_is_refused(argv: list[str], rule: str, tmp_path: Path) -> None:
    errors, _ = argv_problems(argv)
    assert [p.rule for _, p in errors] == [rule]
    loop = build_loop({"loopdsl": 1, "name": "argv", "inputs": {"v": {"type": "string"}}, "start": "s",
                       "states": {"s": {"shell": {"argv": argv}, "next": "done"}, "done": {"end": "completed"}}})
    with pytest.raises(TemplateError):
        loopdsl.run(loop, {"v": CODE}, workdir=tmp_path)
    assert not (tmp_path / MARKER).exists()


def test_argv_passing_a_value_after_a_literal_script_is_fine() -> None:
    assert argv_problems(["sh", "-c", 'printf "%s" "$1"', "_", "{{ inputs.v }}"]) == ([], [])


@pytest.mark.parametrize("cmd, warned", [
    ("git log {{ inputs.v }}", True),
    ("rm -f {{ inputs.v }}", True),
    ("grep x {{ inputs.v }}", True),
    ("git log --end-of-options {{ inputs.v }}", False),
    ("rm -f -- {{ inputs.v }}", False),
    ("git -C {{ inputs.v }} status", False),
    ("cat ./{{ inputs.v }}", False),
    ("echo {{ inputs.v }}", False),
])
def test_option_operands_without_double_dash_are_warned(cmd: str, warned: bool) -> None:
    command_, errors, warnings = analyze_shell(cmd)
    assert errors == [] and command_ is not None
    assert [w.rule for w in warnings] == (["shell-option"] if warned else [])


def test_lint_reports_the_rule_with_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text(textwrap.dedent("""\
        loopdsl: 1
        name: ctx
        inputs: {v: {type: string}}
        start: s
        states:
          s:
            shell: "[[ {{ inputs.v }} -eq 1 ]]"
            next: done
          done: {end: completed}
        """))
    done = subprocess.run([*loopdsl_command(), "lint", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert f"{path}:7:16: error:" in done.stdout and "[shell-arithmetic]" in done.stdout
    assert "type: integer" in done.stdout and "Traceback" not in done.stdout + done.stderr


def test_tree_sitter_is_imported_only_to_compile_a_command(tmp_path: Path) -> None:
    probe = ("import sys, loopdsl.cli, loopdsl.language.templates, loopdsl.language.compile, loopdsl.lint.pipeline\n"
             "print('tree_sitter' in sys.modules)\n"
             "loopdsl.language.templates.compile_shell('echo {{ v }}')\n"
             "print('tree_sitter_bash' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr


@pytest.mark.parametrize("name", ["test--eq", "printf-v", "bash-c-inside", "carried-arith", "source-procsub"])
def test_loopdsl_run_with_a_hostile_input_refuses_and_runs_nothing(name: str, tmp_path: Path) -> None:
    """Through the CLI: `loopdsl run LOOP --input v=PAYLOAD` stops at lint (exit 2)."""
    _, template, rule, value = next(c for c in CLASSES if c[0] == name)
    path = tmp_path / "loop.yaml"
    path.write_text(json.dumps(loop_with_shell(template, "input")))
    args = ["run", str(path), "--input", f"v={value}"]
    if name == "test--eq":  # one case through a real `python -m loopdsl`; the others in process
        done = subprocess.run([*loopdsl_command(), *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
    else:
        done = cli_in_process(args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"[{rule}]" in done.stdout + done.stderr
    assert not list(tmp_path.rglob(MARKER))


@pytest.mark.parametrize("cmd, env, rule", [
    ("echo $(( N + 1 ))", {"N": "{{ inputs.v }}"}, "shell-arithmetic"),
    ('[[ -v "$N" ]] || true', {"N": "{{ inputs.v }}"}, "shell-name"),
    ("set -x; true", {"PS4": "{{ inputs.v }}"}, "shell-code"),
    ("true", {"BASH_ENV": "{{ inputs.v }}"}, "shell-code"),
])
def test_env_values_are_values_too(cmd: str, env: dict[str, str], rule: str, tmp_path: Path) -> None:
    """`env:` values reach bash as variables: the same rule follows them, in lint and at run time."""
    loop = {"loopdsl": 1, "name": "env", "inputs": {"v": {"type": "string"}}, "start": "s",
            "states": {"s": {"shell": {"cmd": cmd, "env": env}, "next": "done"}, "done": {"end": "completed"}}}
    path = tmp_path / "loop.yaml"
    path.write_text(_yaml(loop))
    done = cli_in_process(["lint", str(path)])
    assert done.returncode == 1 and f"[{rule}]" in done.stdout, done.stdout + done.stderr
    (tmp_path / "evil.sh").write_text("touch MARKER\n")
    value = str(tmp_path / "evil.sh") if "BASH_ENV" in env else "$(touch MARKER)" if "PS4" in env else ARITH
    with pytest.raises(TemplateError):
        loopdsl.run(build_loop(loop), {"v": value}, workdir=tmp_path)
    assert not list(tmp_path.rglob(MARKER))


def test_env_values_used_as_data_are_fine(tmp_path: Path) -> None:
    loop = {"loopdsl": 1, "name": "env", "inputs": {"v": {"type": "string"}}, "start": "s",
            "states": {"s": {"shell": {"cmd": 'printf "%s" "$N" > out', "env": {"N": "{{ inputs.v }}"}},
                             "next": "done"}, "done": {"end": "completed"}}}
    result = loopdsl.run(build_loop(loop), {"v": ARITH}, workdir=tmp_path)
    assert result.status == "completed" and (tmp_path / "out").read_text() == ARITH


def _yaml(data: dict[str, Any]) -> str:
    import io

    from ruamel.yaml import YAML

    out = io.StringIO()
    YAML(typ="safe", pure=True).dump(data, out)
    return out.getvalue()
