"""Every `loopdsl` command line in README.md and docs/ parses: the command exists, its flags
exist, choices are valid and required arguments are there. Blocks that cannot run in the
suite (a provider key, placeholders such as LOOP or RUN) are checked this way too; the runnable
ones also run (tests/test_docs_shell.py). A `run` of one of this repository's loop files with
`--input KEY=...` names an input that loop declares. README's two first commands are the
install-and-run one and the test one, which `.ci/run` runs verbatim.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
from test_docs_shell import _BLOCK

from loopdsl.cli import cli
from loopdsl.lint.pipeline import load_loop

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
_NOT_SHELL = {"yaml", "yml", "json", "toml", "python", "mermaid", "dot", "jinja"}
_SEGMENT = re.compile(r"&&|\|\||;|\||\$\(|`|&")


def command_lines(text: str) -> list[str]:
    """`loopdsl ...` invocations in the document's shell-like code blocks."""
    found = []
    for block in _FENCE.finditer(text):
        if block.group("lang") in _NOT_SHELL:
            continue
        body = block.group("body").replace("\\\n", " ")
        for line in body.splitlines():
            line = line.strip().removeprefix("$ ")
            for segment in _SEGMENT.split(line):
                segment = segment.strip()
                if segment.startswith("loopdsl ") and not segment.startswith("loopdsl: "):
                    found.append(segment)
    return found


def parse(line: str) -> click.Context:
    """Parse a command line as the CLI would, without running it."""
    args = shlex.split(line, comments=True)[1:]
    group = cli.make_context("loopdsl", args)
    # click >= 8.2 keeps the command name in `_protected_args` (the public name is deprecated).
    protected = getattr(group, "_protected_args", None)
    rest = [*(protected if protected is not None else group.protected_args), *group.args]
    name, command, remaining = cli.resolve_command(group, rest)
    assert command is not None and name is not None
    return command.make_context(name, remaining, parent=group)


CASES = [(doc, line) for doc in DOCUMENTS for line in command_lines(doc.read_text(encoding="utf-8"))]


def test_the_documents_have_commands_to_check() -> None:
    documents = {doc.name for doc, _ in CASES}
    assert {"README.md", "cli.md", "cost.md", "audit.md", "patterns.md"} <= documents, documents
    assert len(CASES) > 60


@pytest.mark.parametrize("doc, line", CASES, ids=[f"{d.name}: {line}" for d, line in CASES])
def test_documented_command_parses(doc: Path, line: str) -> None:
    try:
        ctx = parse(line)
    except click.BadParameter as exc:
        if "does not exist" in str(exc.message):
            return  # a placeholder path (replies.yaml, DIR): the flag itself parsed
        pytest.fail(f"{doc.name}: `{line}`: {exc.format_message()}")
    except click.UsageError as exc:
        pytest.fail(f"{doc.name}: `{line}`: {exc.format_message()}")
    if ctx.command.name == "run" and ctx.params.get("input_pairs"):
        loop_file = ROOT / str(ctx.params["loop"])
        if loop_file.is_file():
            declared = set(load_loop(loop_file).inputs)
            for pair in ctx.params["input_pairs"]:
                key = pair.split("=", 1)[0]
                assert key in declared, f"{doc.name}: `{line}`: {loop_file.name} has no input {key!r} ({sorted(declared)})"


def test_readme_leads_with_the_install_and_run_command_and_the_ci_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    first = readme.split("\n## ")[1]
    assert first.startswith("Two commands on a fresh machine")
    blocks = [m.group("body").strip() for m in _BLOCK.finditer("\n" + first)]
    assert len(blocks) == 2
    install_and_run, tests = blocks
    assert "-m venv" in install_and_run and "pip install" in install_and_run and "check.py" in install_and_run
    assert "pytest" in tests and "[test]" in tests and "-m venv" in tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests in ci, ".ci/run must run README's test command verbatim"


def test_the_scaffolds_readme_commands_parse(tmp_path: Path) -> None:
    from loopdsl.project.init import scaffold
    from loopdsl.project.install_source import from_spec

    scaffold(tmp_path, "daily-triage", install=from_spec("loopdsl @ git+https://github.com/example/loopdsl@v1"))
    lines = command_lines((tmp_path / "README.md").read_text(encoding="utf-8"))
    assert any("--export github-actions --pip-spec" in line for line in lines)
    for line in lines:
        try:
            parse(line)
        except click.UsageError as exc:
            pytest.fail(f"scaffold README: `{line}`: {exc.format_message()}")
