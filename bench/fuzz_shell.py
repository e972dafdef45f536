"""Does any shell command lint accepts run a hostile value as code?

Usage: python bench/fuzz_shell.py [--cases 10000] [--seed 1]

Generates commands with a placeholder in random bash contexts (arithmetic, names, code,
options, quoting, nested in `$( )`, functions, loops, `case`, pipes, variables that carry the
value on), then a hostile value (`a[$(touch MARKER)]`, `$(touch MARKER)`, backticks, `;`,
newlines, `--output=MARKER`, globs ...). Each case must end one of these ways:
  refused      lint (loopdsl's own compiler, the same one the engine uses) refuses it;
  run-refused  a value lint proved (an integer or enum input) is not what it claimed, and
               the engine refuses it before bash starts;
  clean        it ran under bash, through loopdsl's shell runner, and created no MARKER;
  warned       it created MARKER through an option, and lint had warned (`shell-option`).
Anything else (MARKER created by a command lint accepted without a warning) is an
injection: the case is printed and the exit status is 1.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from loopdsl.runtime.shell import run_command  # noqa: E402
from loopdsl.language.templates import InputFacts, RenderError, analyze_shell  # noqa: E402

MARKER = "MARKER"
FACTS = InputFacts(integers=frozenset({"n"}), choices=(("c", ("true", "echo ok")),))

# {P} is where the placeholder goes. Safe and unsafe places alike: lint must sort them.
CONTEXTS = [
    "printf '%s' {P} > out", 'printf "%s" "pre-{P}-post" > out', "echo {P}", "echo pre{P}post",
    'x={P}; printf "%s" "$x"', "x={P} && echo \"$x\"", "cat <<< {P}", "printf '%s' {P} | cat",
    '[[ {P} == x ]] || true', '[[ {P} != x ]] || true', '[[ {P} =~ x ]] || true', '[[ -n {P} ]]',
    '[[ -z {P} ]] || true', '[ {P} = x ] || true', '[ {P} -eq 1 ] 2>/dev/null || true',
    'test {P} = x || true', 'case {P} in x) echo x ;; *) echo y ;; esac', 'case x in {P}) ;; esac',
    "for i in {P}; do echo \"$i\"; done", 'echo "${UNSET:-{P}}"', "echo ${UNSET:-{P}}",
    'echo "${HOME#{P}}"', "echo ${HOME/{P}/x}", "a=({P}); echo \"${a[0]}\"", ": > {P}.out 2>/dev/null || true",
    "[[ {P} -eq 1 ]] || true", '[[ "{P}" -lt 1 ]] || true', "[[ -v {P} ]] || true",
    "[ -v {P} ] || true", "test -v {P} || true", "let x={P} || true", "declare -i n={P}",
    "s=abc; echo ${s:{P}}", "s=abc; echo ${s:0:{P}}", "a=(1); echo ${a[{P}]}", "a[{P}]=1",
    "a=([{P}]=1)", "echo $(( {P} + 1 ))", "(( {P} )) || true", "echo $[ {P} ]",
    "for (( i={P}; i<1; i++ )); do :; done", "printf -v {P} x", "printf {P} x", "printf -- {P}",
    "read -r {P} <<< x", "f() { local -n r={P}; echo $r; }; f", "declare {P}=1",
    "export {P}", "unset {P}", "x={P}; echo ${!x}", "compgen -W {P} || true",
    "mapfile -C {P} -c 1 x <<< y", "eval {P}", "eval \"echo {P}\"", "bash -c {P}",
    "bash -c \"echo {P}\"", "sh -c {P} _", "bash -c 'printf %s \"$1\"' _ {P}",
    "bash -c 'echo $(( $1 + 1 ))' _ {P}", "trap {P} EXIT", "source <(printf '%s' {P})",
    ". <(printf '%s' {P})", "printf '%s' {P} | bash", "printf '%s' {P} | sh", "printf '%s' {P} | xargs sh -c",
    "printf '%s\\n' {P} | xargs -I{} sh -c 'echo {}'", "find . -maxdepth 0 -exec sh -c {P} \\;",
    "find . -maxdepth 0 -exec sh -c 'echo \"$1\"' _ {P} \\;", "echo | awk {P}", "echo | awk -v x={P} '{print x}'",
    "sed -n {P} /dev/null", "python3 -c {P}", "python3 -c 'import sys; print(sys.argv[1])' {P}",
    "git -c {P} x 2>/dev/null || true", "git log {P} 2>/dev/null || true",
    "git log --end-of-options {P} 2>/dev/null || true", "sort -o out -- {P} 2>/dev/null || true",
    "sort {P} /dev/null 2>/dev/null || true", "{P}", "{P} MARKER", "env {P} MARKER", "timeout 5 {P} MARKER",
    "command {P} MARKER", "x={P}; $x MARKER", "x={P}; echo $(( x ))", "x={P}; [[ $x -eq 1 ]] || true",
    "x={P}; [[ x -eq 1 ]] || true", "x={P}; y=$x; (( y )) || true", "x=$(printf %s {P}); (( x )) || true",
    "printf '%s\\n' {P} | while read -r n; do echo $(( n )); done",
    "f() { echo $(( $1 )); }; f {P}", "set -- {P}; echo $(( $1 ))", "PS4={P}; set -x; true",
    "declare -i n; n={P}", "n={P}; declare -i n", "x={P}; declare -n r=x; echo \"$r\"",
    "r={P}; declare -n r; echo \"$r\"", "echo '{P}'", "echo $'{P}'", "echo `echo {P}`",
    "cat <<EOF\n{P}\nEOF", "echo \\{P}", "echo ${P}", "echo # {P}", "function {P} { :; }",
    "coproc {P}", "alias x={P}", "hash -p {P} x", "exec {P} MARKER", "wait -p {P} 2>/dev/null || true",
    "x=({P}); echo $(( x[0] ))", "ssh {P} true 2>/dev/null || true", "if true; then echo {P}",
    "printf '%s' {P} > {P}.txt 2>/dev/null || true", "echo {P} {P} {P}",
    "( ( echo {P} ) )", "((echo {P}) )", "x=$( (echo {P}) )", "x={P}; echo \"${x@P}\"",
    "shopt -s expand_aliases; alias e=eval\ne {P}", "set -o posix; alias e=eval\ne {P}",
    "printf -v PS4 %s {P}; set -x; :", "for PS4 in {P}; do set -x; :; set +x; done",
    "a=(1); echo ${a[@]:{P}}", "[[ -R {P} ]] || true", 'a=(1); printf "%s" "${a[{P}]}"',
    "a=(1); echo ${#a[{P}]}", "unset -v {P}", "getopts ab {P} 2>/dev/null || true",
    "select {P} in a; do break; done < /dev/null", "{P}=1", "x[{P}]+=1", 'let "x={P}"',
    "command eval {P}", "builtin eval {P}", "exec bash -c {P}", "nohup sh -c {P} > /dev/null",
    "timeout 5 bash -c {P}", "printf '%s' {P} | xargs -0 bash -c", "env -i bash -c {P}",
    "env X=1 bash -c {P}", "bash -ec {P}", "bash -o pipefail -c {P}", "sh -xc {P} 2>/dev/null",
    "bash --norc -c {P}", "bash -c -- {P}",
    "declare -A m; m[{P}]=1", "f() {{ eval \"$1\"; }}; f {P}", "printf() {{ eval \"$1\"; }}; printf {P}",
    "x={P}; y=x; (( y ))", "x={P}; [[ ${x} == 1 ]] && echo same", "IFS={P}; echo a b",
    "export PS4={P}; bash -xc true 2>/dev/null", "x={P} bash -c 'echo \"$x\"'",
    "x={P} bash -c 'echo $(( x ))'", "echo {P} | { read -r x; echo $(( x )); }",
    "mapfile -t arr <<< {P}; echo $(( arr[0] ))", "readarray arr <<< {P}; echo ${arr[0]}",
    "! (( {P} )) || true", "x={P}; ! (( x )) || true", "! declare -i n; n={P} || true",
    "builtin declare -i n; n={P}", "x=$((echo {P}) )", "! [[ {P} == x ]] || true",
    "python3 {P} 2>/dev/null || true", "perl {P} 2>/dev/null || true", "python3 -- {P} 2>/dev/null || true",
    "python3 - <<< {P} 2>/dev/null || true", "printf %s {P} | python3 2>/dev/null || true",
    "bash - <<< {P}", "perl <<< {P} 2>/dev/null || true", "x={P}; eval 'echo $(( x ))'",
    "x={P}; trap 'echo $(( x ))' EXIT", "x={P}; eval 'echo \"$x\"'",
    "NODE_OPTIONS={P} node -e 1 2>/dev/null || true", "GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=alias.x GIT_CONFIG_VALUE_0={P} git x 2>/dev/null || true",
    "while read -r n; do echo $(( n )); done <<< {P}", "bash /dev/stdin <<< {P}", "bash <(printf %s {P})",
    "python3 /dev/stdin <<< {P} 2>/dev/null || true", "sh /proc/self/fd/0 <<< {P}", "x={P}; while read -r n; do echo $(( n )); done < <(echo \"$x\")",
]
# Statements a context is wrapped in, to move it deeper into the tree.
WRAPPERS = [
    "{C}", "x=$({C})", 'echo "$({C})"', "f() {{ {C}; }}; f", "if true; then {C}; fi", "( {C} )",
    "{{ {C}; }}", "for i in 1; do {C}; done", "true && {C}", "{C} | cat", "y=$( case a in a) {C} ;; esac )",
    "while false; do :; done; {C}", "! {C} || true",
]
# Ways a value gets into a variable ({USE} is the context, reading $x or $1).
CARRIERS = [
    "x={P}; {USE}", "x=$(printf %s {P}); {USE}", "read -r x <<< {P}; {USE}",
    "printf '%s\n' {P} | while read -r x; do {USE}; done", "for x in {P}; do {USE}; done",
    "f() {{ {USE}; }}; f {P}", "set -- {P}; {USE}", "declare x={P}; {USE}", "y={P}; x=$y; {USE}",
    "x=({P}); {USE}", "printf -v x %s {P}; {USE}", "bash -c '{USE}' _ {P}", "export x={P}; {USE}",
]
VALUES = [
    "a[$(touch MARKER)]", "x[`touch MARKER`]", "$(touch MARKER)", "`touch MARKER`", "; touch MARKER",
    "& touch MARKER", "| touch MARKER", "\ntouch MARKER\n", "touch MARKER", "'touch MARKER'",
    "--output=MARKER", "-oMARKER", "-va[$(touch MARKER)]", "-v", "alias.x=!touch MARKER",
    "core.pager=touch MARKER", 'BEGIN{system("touch MARKER")}', "1e", "e touch MARKER", "*", "?",
    "[a-z]*", "{a,b}", "~", "-rf", "--help", "$((1+1))", "${x:-$(touch MARKER)}", "1; touch MARKER",
    "1)); touch MARKER; ((1", "0 ]] || touch MARKER; [[ 0", "') ; touch MARKER ; ('", '"; touch MARKER; "',
    "\\$(touch MARKER)", "import os; os.system('touch MARKER')", "-cimport os; os.system('touch MARKER')",
    "-esystem('touch MARKER')", "1", "0", "-1", "x", "MARK",
    "$(touch MARKER)\n", "a[$(touch${IFS}MARKER)]", "a[`touch MARKER`]+1", "-e", "-c", "1 -o MARKER",
]
EXPRESSIONS = ["inputs.v"] * 8 + ["inputs.n", "inputs.c", "inputs.v | int"]


def make_case(rng: random.Random) -> tuple[str, str, str]:
    """(command, expression, value)."""
    context = rng.choice(CONTEXTS)
    if rng.random() < 0.3:   # the value reaches the context through a variable
        carrier = rng.choice(CARRIERS)
        context = carrier.replace("{P}", "{P}", 1).replace("{USE}", context.replace(
            "{P}", rng.choice(("$x", '"$x"', "${x}", "x", "$1", '"$@"'))))
    for _ in range(rng.choice((0, 0, 1, 1, 2))):
        context = rng.choice(WRAPPERS).format(C=context)
    expression = rng.choice(EXPRESSIONS)
    return context.replace("{P}", "{{ " + expression + " }}"), expression, rng.choice(VALUES)


def context_for(value: str) -> dict[str, Any]:
    return {"inputs": {"v": value, "n": value, "c": value}}


def marker_created(root: Path) -> bool:
    """Only an injected payload makes a file named exactly MARKER (no value is "MARKER")."""
    return any(True for _ in root.rglob(MARKER))


async def run_case(command: str, value: str, root: Path, index: int) -> tuple[str, str]:
    """One case: (outcome, detail)."""
    compiled, errors, warnings = analyze_shell(command, FACTS)
    if errors:
        return "refused", errors[0].rule
    assert compiled is not None
    try:
        script, env = compiled.prepare(context_for(value))
    except RenderError as exc:
        return "run-refused", exc.message[:60]
    work = root / f"case{index}"
    work.mkdir()
    if "git" in command:
        subprocess.run(["git", "init", "-q"], cwd=work, check=True)
        subprocess.run(["git", "-c", "user.name=f", "-c", "user.email=f@f", "commit", "-q",
                        "--allow-empty", "-m", "x"], cwd=work, check=True)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(work), **env}
    await run_command(script=script, cwd=work, env=env, timeout=10)
    created = marker_created(root)
    shutil.rmtree(work, ignore_errors=True)
    for leftover in root.rglob(MARKER):
        leftover.unlink()
    if not created:
        return "clean", ""
    if warnings:
        return "warned", warnings[0].rule
    return "INJECTED", ""


async def fuzz(cases: int, seed: int, verbose: bool = False) -> tuple[Counter[str], list[str]]:
    rng = random.Random(seed)
    counts: Counter[str] = Counter()
    injections: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fuzz-shell-") as tmp:
        root = Path(tmp)
        for index in range(cases):
            command, expression, value = make_case(rng)
            outcome, detail = await run_case(command, value, root, index)
            counts[outcome] += 1
            if outcome == "INJECTED":
                injections.append(f"{command!r} with {expression} = {value!r}")
                if verbose:
                    print("INJECTED:", injections[-1], flush=True)
    return counts, injections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    counts, injections = asyncio.run(fuzz(args.cases, args.seed, verbose=True))
    elapsed = time.perf_counter() - started
    print(f"{args.cases} cases (seed {args.seed}) in {elapsed:.1f} s: "
          + ", ".join(f"{k} {counts[k]}" for k in ("refused", "run-refused", "clean", "warned", "INJECTED")))
    print(f"{len(CONTEXTS)} contexts x {len(WRAPPERS)} wrappers x {len(VALUES)} values")
    if injections:
        print(f"{len(injections)} injections", file=sys.stderr)
        return 1
    print("0 injections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
