"""What changed in a run's files since it started: the check `loopdsl resume` makes before it
goes on, and the diff it shows of the loop file."""
from __future__ import annotations

import difflib

from ..language.files import read_capped
from ..runtime.run_state import RunState
from .runs import load, loop_files


def changed_files(state: RunState) -> list[str]:
    """Files the run depends on whose content differs from when it started."""
    recorded: dict[str, str] = state.meta.get("files", {})
    try:
        current = loop_files(load(state.meta["loop_path"]))
    except Exception:
        current = {}
    return [path for path, digest in recorded.items() if current.get(path, "missing") != digest]


def diff_summary(state: RunState, changed: list[str]) -> str:
    lines = [f"changed since run {state.run_id} started: {', '.join(changed)}"]
    loop_path = state.meta.get("loop_path")
    if loop_path in changed and state.meta.get("loop_text"):
        try:
            now = read_capped(loop_path).decode("utf-8")
        except OSError:
            now = ""
        diff = list(difflib.unified_diff(state.meta["loop_text"].splitlines(), now.splitlines(),
                                         "at start", "now", lineterm="", n=1))
        lines.extend(diff[:40] + (["..."] if len(diff) > 40 else []))
    return "\n".join(lines)
