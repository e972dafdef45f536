"""A click group that imports a command's module only when that command runs (or its own
help is asked for), so `loopdsl lint` starts without loading the engine, the store or the
project tools, and `loopdsl --help` lists the commands from their summaries alone."""
from __future__ import annotations

import importlib
from typing import Any

import click


class LazyGroup(click.Group):
    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None,
                 summaries: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})  # name -> "module:attribute"
        self.summaries = dict(summaries or {})  # name -> its docstring's first paragraph

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands and cmd_name not in self.commands:
            module_name, attribute = self.lazy_commands[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, in which a command not imported yet is shortened from its summary
        (the same text click would shorten from the docstring) rather than imported."""
        listed = [(name, command) for name in self.list_commands(ctx)
                  if (command := self._listed(ctx, name)) is not None and not command.hidden]
        if listed:
            limit = formatter.width - 6 - max(len(name) for name, _ in listed)
            with formatter.section("Commands"):
                formatter.write_dl([(name, command.get_short_help_str(limit)) for name, command in listed])

    def _listed(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.commands or name not in self.summaries:
            return self.get_command(ctx, name)
        return click.Command(name, help=self.summaries[name])

    def all_commands(self) -> dict[str, click.Command]:
        """Every command by name, importing each (for help and documentation checks)."""
        ctx = click.Context(self)
        return {name: command for name in self.list_commands(ctx) if (command := self.get_command(ctx, name))}
