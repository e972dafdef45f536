"""The one walk over a project's files: every command that looks for loops, tests or
dependencies skips the same folders (version control, virtual environments, vendored
packages, caches and loopdsl's own store)."""
from __future__ import annotations

import os
from pathlib import Path

# Folders that never hold a project's own loops, tests or their dependencies.
SKIPPED_DIRS = frozenset({
    ".git", ".hg", ".svn",  # version control
    ".venv", "venv", ".tox", "node_modules",  # installed packages
    "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".hypothesis",  # caches
    ".loopdsl",  # the run store
})
YAML_SUFFIXES = (".yaml", ".yml")


def walk(root: Path, suffixes: tuple[str, ...] = ()) -> list[Path]:
    """Every file under `root` (only names ending in `suffixes`, if given), folders and
    files in sorted order, skipping SKIPPED_DIRS at any depth."""
    found: list[Path] = []
    for here, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        found.extend(Path(here) / f for f in sorted(files) if not suffixes or f.endswith(suffixes))
    return found
