"""The rows of runs beside the record: the chunks of a long path, and which run id a typed
prefix names.

`RunRows` is what a store remembers between the commits of one run, so a commit writes and
reads only what changed: the chunks of the path already in rows of their own, and the
number of event batches (see `RunStore.commit`).

Both are a process's own memory, never the store's truth: a commit that cannot vouch for
them (a new list for the path, another lock) falls back to comparing or reading.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...runtime.errors import StoreError
from ...runtime.run_keys import PATH_CHUNK, _path_key

_MAX_CANDIDATES_SHOWN = 10


class RunRows:
    def __init__(self) -> None:
        # Per run: the path list last committed and a copy of its states in chunk rows.
        self._paths: dict[str, tuple[list[str], list[str]]] = {}
        # Per run: (lock token, event batches) after this process's last commit under that
        # lock. Every writer of a run holds its lock, so while the owner check passes for
        # the same token nobody else has appended, and the count need not be read again.
        self._counts: dict[str, tuple[str, int]] = {}

    def forget(self, run_id: str) -> None:
        """A run created, or ended (it commits little more; a long-lived process runs many)."""
        self._paths.pop(run_id, None)
        self._counts.pop(run_id, None)

    def split_path(self, run_id: str, record: dict[str, Any]) -> list[tuple[int, list[str]]]:
        """Move the full chunks of a long path out of `record` and return the chunk rows
        still to write. A path only grows, so a chunk written before is written again only
        if its states differ (a caller that rewrote it). The engine appends to one list for
        the life of a run: while the record holds that same list, the written head is
        taken as unchanged without comparing it, which would cost a step the run's length."""
        path = record.get("path")
        if not isinstance(path, list) or len(path) < PATH_CHUNK:
            return []
        full = len(path) // PATH_CHUNK
        known, written = self._paths.get(run_id) or (None, [])
        if known is path and len(path) >= len(written) or path[:len(written)] == written:
            start = len(written) // PATH_CHUNK
        else:
            start = 0
        record["path"], record["path_chunks"] = path[full * PATH_CHUNK:], full
        return [(i, path[i * PATH_CHUNK:(i + 1) * PATH_CHUNK]) for i in range(start, full)]

    def path_committed(self, run_id: str, path: Any, chunks: list[tuple[int, list[str]]]) -> None:
        """After a commit of `path` (the record's list) that wrote `chunks`."""
        if not isinstance(path, list) or len(path) < PATH_CHUNK:
            self._paths.pop(run_id, None)
            return
        known = self._paths.get(run_id)
        if chunks or known is None or known[0] is not path:
            self._paths[run_id] = (path, path[:len(path) // PATH_CHUNK * PATH_CHUNK])

    def known_count(self, run_id: str, token: str | None) -> int | None:
        """The run's event batches as this process last committed them under the lock with
        `token` (asked after the owner check), or None when the store must be read."""
        known = self._counts.get(run_id)
        if token is None or known is None or known[0] != token:
            return None
        return known[1]

    def count_committed(self, run_id: str, token: str | None, count: int) -> None:
        if token is not None:
            self._counts[run_id] = (token, count)


def join_path(record: Any, get: Callable[[str], Any], run_id: str,
              damaged: Callable[[str], Exception]) -> Any:
    """A stored record with the chunks of its path put back (see `RunRows.split_path`);
    `get` reads a row, `damaged(problem)` is the error to raise."""
    if not isinstance(record, dict) or "path_chunks" not in record:
        return record
    full, tail = record.pop("path_chunks"), record.get("path")
    if not isinstance(full, int) or isinstance(full, bool) or full < 0 or not isinstance(tail, list):
        raise damaged("its path is not a list of state names")
    path: list[Any] = []
    for index in range(full):
        chunk = get(_path_key(run_id, index))
        if not isinstance(chunk, list):
            raise damaged(f"part {index} of its path is missing")
        path.extend(chunk)
    record["path"] = path + tail
    return record


def match_run_ref(ids: Sequence[str], ref: str, directory: Path) -> str:
    """The run id among `ids` that `ref` (a whole id or a prefix) names, else a StoreError."""
    ref = ref.strip()
    if ref in ids:
        return ref
    matches = [run_id for run_id in ids if ref and run_id.startswith(ref)]
    # A sub-loop's record ('<parent>.<state>...') shares its parent's prefix: a prefix
    # means the top-level run unless the child's own id was typed out.
    top_level = [run_id for run_id in matches if "." not in run_id]
    if top_level and "." not in ref:
        matches = top_level
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise StoreError(
            f"no run matches {ref[:80]!r} in {directory}",
            "`loopdsl runs` lists the runs of this store; --store (or LOOPDSL_STORE) selects another",
        )
    shown = ", ".join(sorted(matches)[:_MAX_CANDIDATES_SHOWN])
    more = len(matches) - _MAX_CANDIDATES_SHOWN
    raise StoreError(
        f"run prefix {ref[:80]!r} is ambiguous: it matches {shown}" + (f" and {more} more" if more > 0 else ""),
        "type more characters of the run id",
    )
