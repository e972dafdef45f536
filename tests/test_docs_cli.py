"""docs/cli.md documents every command and every flag the CLI has."""
from __future__ import annotations

from pathlib import Path

import click

from loopdsl.cli import cli

DOC = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text(encoding="utf-8")


def test_every_command_and_flag_is_documented() -> None:
    missing = []
    for name, command in sorted(cli.commands.items()):
        if f"loopdsl {name}" not in DOC:
            missing.append(f"command {name}")
        for param in command.params:
            if isinstance(param, click.Option):
                flags = [f for f in param.opts if f.startswith("--")]
                if flags and not any(f in DOC for f in flags):
                    missing.append(f"{name} {flags[0]}")
    assert missing == [], "undocumented in docs/cli.md: " + ", ".join(missing)
