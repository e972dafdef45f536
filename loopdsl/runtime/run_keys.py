"""Names in the run store: run ids (checked, and derived for sub-loops), the keys of a
run's rows, the key of a paid LLM response, and where the store is by default."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .errors import StoreError

_MAX_RUN_ID = 64


def _record_key(run_id: str) -> str:
    return f"run/{run_id}/record"


def _count_key(run_id: str) -> str:
    return f"run/{run_id}/n"


def _event_key(run_id: str, index: int) -> str:
    # Zero-padded so keys sort in event order too.
    return f"run/{run_id}/event/{index:010d}"


# A run's path grows by one state a step, so a record holding all of it made every commit
# re-encode and rewrite the whole history (its cost grew with the run). Full chunks of
# PATH_CHUNK states live in rows of their own, written once; the record keeps the rest and
# the number of chunks in `path_chunks` (format 2 of the store).
PATH_CHUNK = 64


def _path_key(run_id: str, index: int) -> str:
    return f"run/{run_id}/path/{index:06d}"


def _check_run_id(run_id: str) -> None:
    ok = (
        isinstance(run_id, str)
        and 0 < len(run_id) <= _MAX_RUN_ID
        and all(c.isascii() and (c.isalnum() or c in "._-") for c in run_id)
    )
    if not ok:
        raise StoreError(
            f"invalid run id {run_id!r}",
            "run ids are 1-64 characters of letters, digits, '.', '_' or '-'",
        )


def child_run_id(display_id: str) -> str:
    """The store id of a sub-loop run: its display id ('<parent>/<state>[@visit][/<index>]')
    with '.' for '/' and '@'. One longer than a run id may be keeps its head (so it still
    starts with its parent's id) and ends with a hash of the whole: always valid, unique."""
    flat = display_id.replace("/", ".").replace("@", ".")
    if len(flat) <= _MAX_RUN_ID:
        return flat
    digest = hashlib.sha256(display_id.encode("utf-8")).hexdigest()[:16]
    return f"{flat[: _MAX_RUN_ID - len(digest) - 1]}.{digest}"


def agent_key(what: str, **parts: Any) -> str:
    """A store key for a piece of an agent attempt, from its position in the run only
    (never from rendered text, which may change across a crash)."""
    body = json.dumps({"agent": what, **parts}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def default_store_dir(start: Path) -> Path:
    """LOOPDSL_STORE if set, else `.loopdsl/` at the enclosing git root, else `start/.loopdsl`."""
    configured = os.environ.get("LOOPDSL_STORE")
    if configured:
        return Path(configured).expanduser()
    start = Path(start).resolve()
    for candidate in (start, *start.parents):
        # `.git` is a directory in a clone and a file in a worktree or submodule.
        if (candidate / ".git").exists():
            return candidate / ".loopdsl"
    return start / ".loopdsl"
