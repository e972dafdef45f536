"""Lint never crashes on deeply nested input (each case is a positioned diagnostic, exit 1),
and its graph analysis matches the textbook definition of dominators."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import cli_in_process

from loopdsl.language.dominators import DominatorTree
from cli_forked import loopdsl_command

HEAD = """\
loopdsl: 1
name: deep
models:
  m: {model: openai/gpt-4o-mini, max_tokens: 10}
budget: {cost_usd: 1}
start: a
states:
  a:
    llm: {model: m, prompt: "PROMPT"}
    transitions:
      - {to: b, when: "WHEN"}
      - {to: b}
  b:
    end: completed
"""

DEEP = {
    "70 nested parentheses": ("WHEN", "(" * 70 + "true" + ")" * 70),
    "100,000 nested parentheses": ("WHEN", "(" * 100_000 + "true" + ")" * 100_000),
    "2,000 nested ifs": ("PROMPT", "{% if x %}" * 2000 + "{% endif %}" * 2000),
    "5,000 not": ("WHEN", "not " * 5000 + "true"),
    "5,000 additions": ("WHEN", " + ".join(["1"] * 5000)),
    "3,000 filters": ("PROMPT", "{{ a.text" + " | upper" * 3000 + " }}"),
    "deep lists": ("WHEN", "[" * 3000 + "]" * 3000),
    "25 nested for loops": ("PROMPT", "{% for i in x %}" * 25 + "{% endfor %}" * 25),
}


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    """A real process: the deep cases are about a crash (stack overflow) never reaching the user."""
    return subprocess.run([*loopdsl_command(), "lint", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=120)


def lint_in_process(path: Path) -> subprocess.CompletedProcess[str]:
    """The same command's answer, for cases about what it says rather than the process."""
    return cli_in_process(["lint", "--format", "json", str(path)])


@pytest.mark.parametrize("placeholder, text", list(DEEP.values()), ids=list(DEEP))
def test_deep_templates_are_positioned_syntax_errors(tmp_path: Path, placeholder: str, text: str) -> None:
    loop = tmp_path / "deep.yaml"
    loop.write_text(HEAD.replace(placeholder, text).replace("PROMPT", "hi").replace("WHEN", "true"))
    proc = lint(loop)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    findings = json.loads(proc.stdout)
    assert [f["rule"] for f in findings] in (["expr-syntax"], ["template-syntax"]), findings
    line = 9 if placeholder == "PROMPT" else 11
    assert findings[0]["line"] == line and findings[0]["col"] > 1
    assert "nest more than" in findings[0]["message"]


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "{a: " * 3000 + "1" + "}" * 3000,
                                  "\n      " + "- " * 2000 + "x"],
                         ids=["flow-sequence", "flow-mapping", "block-sequence"])
def test_deep_yaml_is_a_diagnostic(tmp_path: Path, text: str) -> None:
    loop = tmp_path / "deep.yaml"
    loop.write_text(HEAD.replace("PROMPT", "hi").replace("WHEN", "true") + "inputs:\n  x:\n    default: " + text + "\n")
    proc = lint(loop)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert "internal-error" not in proc.stdout


def naive_dominators(start: str, edges: dict[str, list[str]]) -> dict[str, set[str]]:
    reachable, stack = set(), [start]
    while stack:
        n = stack.pop()
        if n not in reachable:
            reachable.add(n)
            stack.extend(edges[n])
    dom = {n: set(reachable) for n in reachable}
    dom[start] = {start}
    changed = True
    while changed:
        changed = False
        for n in reachable - {start}:
            preds = [p for p in reachable if n in edges[p]]
            new = set.intersection(*(dom[p] for p in preds)) | {n}
            if new != dom[n]:
                dom[n], changed = new, True
    return dom


def test_dominator_tree_matches_the_definition() -> None:
    rng = random.Random(7)
    for _ in range(300):
        names = [f"s{i}" for i in range(rng.randrange(1, 12))]
        edges = {n: rng.sample(names, rng.randrange(0, min(4, len(names)) + 1)) for n in names}
        tree = DominatorTree("s0", edges)
        expected = naive_dominators("s0", edges)
        for b in names:
            assert (b in tree) == (b in expected)
            for a in names:
                assert tree.dominates(a, b) == (b in expected and a in expected[b]), (edges, a, b)
        ends = [n for n in names if n in expected and rng.random() < 0.5]
        common = tree.common_dominator(ends)
        if ends:
            assert common is not None
            assert {a for a in names if tree.dominates(a, common)} == set.intersection(*(expected[e] for e in ends))


def test_long_chain_dominators_are_linear() -> None:
    names = [f"s{i}" for i in range(50_000)]
    edges = {n: [names[i + 1]] if i + 1 < len(names) else [] for i, n in enumerate(names)}
    tree = DominatorTree("s0", edges)
    assert tree.dominates("s0", "s49999") and not tree.dominates("s49999", "s0")


def test_names_ending_in_a_newline_are_refused(tmp_path: Path) -> None:
    """`$` in Python matches before a final newline; names must end where the text ends."""
    loop = tmp_path / "names.yaml"
    loop.write_text('loopdsl: 1\nname: "x\\n"\nstart: "a\\n"\nstates:\n  "a\\n":\n    shell: echo hi\n'
                    '    next: done\n  done:\n    end: completed\ninputs:\n  "i\\n": {type: string, default: ""}\n'
                    'secrets: ["TOK\\n"]\n')
    proc = lint_in_process(loop)
    assert proc.returncode == 1, proc.stderr
    found = {(f["line"], f["rule"]) for f in json.loads(proc.stdout)}
    assert {(2, "schema-value"), (5, "bad-name"), (11, "bad-name"), (12, "schema-value")} <= found


@pytest.mark.parametrize("key, value", [("loop", "x" * 5000 + ".yaml"), ("skill", "a/" * 3000 + "SKILL.md")])
def test_paths_too_long_for_the_system_are_missing_files(tmp_path: Path, key: str, value: str) -> None:
    """ENAMETOOLONG from a hostile path is a `missing-file` finding, not an internal error."""
    action = f"loop: {value}" if key == "loop" else f"llm: {{model: m, prompt: hi, skill: {value}}}"
    loop = tmp_path / "long.yaml"
    loop.write_text(HEAD.replace('llm: {model: m, prompt: "PROMPT"}', action).replace("WHEN", "true"))
    proc = lint_in_process(loop)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    assert [f["rule"] for f in json.loads(proc.stdout)] == ["missing-file"], proc.stdout[:2000]
