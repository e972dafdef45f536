"""The throwaway home of one coding-agent CLI attempt, and the homes a killed loopdsl left.

Each attempt gets a fresh directory as HOME and config dir (coding_cli.py), removed when the
attempt ends. A loopdsl killed during the attempt (`kill -9`, a lost machine, a Temporal
worker that dies) never reaches that removal, and the home stays behind in the temp dir
with whatever the CLI wrote there: its settings and, for Codex, the session log with the
conversation. So the name of a home says who made it (pid namespace, pid, and that
process's start time), and every new attempt first removes the homes whose maker is gone, as
does the resume of a run a kill cut off during an attempt (api/durable.py).

A home is removed only when all of this holds: its name has that form, it is a real
directory (not a symlink) owned by this user, its maker ran in this pid namespace (another
container sharing the temp dir sees other pids), and no process with that pid and start
time exists. Where /proc is missing (not Linux), nothing is swept.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from pathlib import Path

from ..runtime.process_tree import start_time
from ..runtime.scratch import make_folder

PREFIX = "loopdsl-cli-"
# PREFIX, then the maker's pid namespace inode, pid and start time, then mkdtemp's random part.
_NAME = re.compile(r"loopdsl-cli-(\d+)-(\d+)-(\d+)-[A-Za-z0-9_]+")


def _namespace() -> int | None:
    """This process's pid namespace (the inode /proc/self/ns/pid names), or None."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def make_home() -> Path:
    """A new private home for one attempt (mode 0700), after sweeping the homes left by
    makers that are gone; the caller removes it when the attempt ends."""
    namespace, pid = _namespace(), os.getpid()
    started = start_time(pid)
    if namespace is None or started is None:
        return make_folder(PREFIX)
    sweep_left_homes(Path(tempfile.gettempdir()), namespace)
    return make_folder(f"{PREFIX}{namespace}-{pid}-{started}-")


def sweep_dead_makers_homes() -> list[Path]:
    """The sweep `make_home` does first, on its own: for a resumed run whose CLI attempt a kill
    cut off, when the person then skips or fails the state and no new attempt starts."""
    namespace = _namespace()
    return sweep_left_homes(Path(tempfile.gettempdir()), namespace) if namespace is not None else []


def sweep_left_homes(folder: Path, namespace: int) -> list[Path]:
    """Remove the homes in `folder` whose maker (of `namespace`) is gone; the ones removed."""
    removed: list[Path] = []
    try:
        names = [entry.name for entry in os.scandir(folder) if entry.name.startswith(PREFIX)]
    except OSError:  # an unreadable temp dir: nothing to sweep, and no reason to fail the attempt
        return removed
    for name in names:
        found = _NAME.fullmatch(name)
        if found is None or int(found.group(1)) != namespace:
            continue
        pid, started = int(found.group(2)), int(found.group(3))
        if start_time(pid) == started:  # its maker still runs: the home may be in use
            continue
        home = folder / name
        try:
            info = os.lstat(home)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        shutil.rmtree(home, ignore_errors=True)
        removed.append(home)
    return removed


__all__ = ["PREFIX", "make_home", "sweep_dead_makers_homes", "sweep_left_homes"]
