"""docs/cli.md documents every command and every flag the CLI has."""
from __future__ import annotations

import re
from pathlib import Path

import click

from loopdsl.cli import cli

DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text(encoding="utf-8")


def test_every_command_and_flag_is_documented() -> None:
    missing = []
    for name, command in sorted(cli.all_commands().items()):
        if f"loopdsl {name}" not in DOC:
            missing.append(f"command {name}")
        for param in command.params:
            if isinstance(param, click.Option):
                flags = [f for f in param.opts if f.startswith("--")]
                if flags and not any(f in DOC for f in flags):
                    missing.append(f"{name} {flags[0]}")
    assert missing == [], "undocumented in docs/cli.md: " + ", ".join(missing)


def _sections(name: str) -> str:
    """The text of the docs/cli.md sections whose heading names the command."""
    parts = DOC.split("\n## ")
    return "\n".join(part for part in parts
                     if f"`loopdsl {name}" in part.splitlines()[0] or f"`{name}`" in part.splitlines()[0])


def test_every_flag_is_documented_in_its_own_command_section() -> None:
    missing = []
    for name, command in sorted(cli.all_commands().items()):
        section = _sections(name)
        if not section:
            missing.append(f"section for {name}")
            continue
        for param in command.params:
            if isinstance(param, click.Option):
                flags = [f for f in param.opts if f.startswith("--")]
                if flags and not any(re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", section) for f in flags):
                    missing.append(f"{name} {flags[0]}")
    assert missing == [], "not in their command's section of docs/cli.md: " + ", ".join(missing)
