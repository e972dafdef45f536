"""The `loopdsl` command line: parses flags, calls the API, prints."""
from __future__ import annotations

from .commands import main

__all__ = ["main"]
