"""Project commands (init, audit, cost, schedule, test), registered on the main CLI group."""
from __future__ import annotations

import click


def register(group: click.Group) -> None:
    """Add the project commands to `group` (filled in by the project-tools work)."""
