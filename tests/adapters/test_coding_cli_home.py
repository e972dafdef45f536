"""The coding-agent CLI's throwaway homes: one a killed loopdsl left (a real process made it
and died by SIGKILL) is removed by the next attempt's `make_home`; a home whose maker still
runs, or that is not clearly a dead maker's own directory, is left alone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from loopdsl.adapters.coding_cli_home import PREFIX, make_home, sweep_left_homes
from loopdsl.runtime.process_tree import start_time

# A process that makes a home, writes what a CLI would (a session log) in it, says where, waits.
MAKER = (
    "from loopdsl.adapters.coding_cli_home import make_home\n"
    "home = make_home()\n"
    "(home / 'config').mkdir()\n"
    "(home / 'config' / 'session.jsonl').write_text('the conversation')\n"
    "print(home, flush=True)\n"
    "input()\n"
)


def start_maker(tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", MAKER], env={**os.environ, "TMPDIR": str(tmp)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


@pytest.fixture
def tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    return folder


def namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def test_a_home_left_by_a_killed_maker_is_removed_by_the_next_attempt(tmp: Path) -> None:
    proc, left = start_maker(tmp)
    assert left.parent == tmp and (left / "config" / "session.jsonl").is_file()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert left.is_dir()  # nothing of the killed process removed it
    mine = make_home()
    try:
        assert not left.exists()
        assert mine.is_dir() and mine.parent == tmp and mine.stat().st_mode & 0o777 == 0o700
        assert mine.name.startswith(f"{PREFIX}{namespace()}-{os.getpid()}-{start_time(os.getpid())}-")
    finally:
        mine.rmdir()


def test_the_home_of_a_maker_that_still_runs_is_kept(tmp: Path) -> None:
    proc, home = start_maker(tmp)
    try:
        assert sweep_left_homes(tmp, namespace()) == []
        assert (home / "config" / "session.jsonl").read_text() == "the conversation"
    finally:
        proc.kill()
        proc.wait()
    assert sweep_left_homes(tmp, namespace()) == [home] and not home.exists()


def test_only_a_dead_makers_own_directories_are_removed(tmp: Path, tmp_path: Path) -> None:
    ns, pid, started = namespace(), os.getpid(), start_time(os.getpid())
    assert started is not None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(dead.stdout)  # a pid no process has now (its start time cannot match)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    kept = {
        f"{PREFIX}{ns}-{pid}-{started}-live": "dir",         # this process: alive
        f"{PREFIX}{ns + 1}-{gone}-1-othercontainer": "dir",  # another pid namespace's maker
        f"{PREFIX}{ns}-{gone}-1-link": "link",               # a symlink, never followed
        f"{PREFIX}{ns}-{gone}-1-file": "file",               # not a directory
        f"{PREFIX}not-a-home": "dir",                         # no maker in the name
    }
    for name, kind in kept.items():
        if kind == "dir":
            (tmp / name).mkdir()
        elif kind == "link":
            (tmp / name).symlink_to(target, target_is_directory=True)
        else:
            (tmp / name).write_text("x")
    reused = tmp / f"{PREFIX}{ns}-{pid}-{started - 1}-reused"  # this pid, an earlier process's start
    reused.mkdir()
    assert sweep_left_homes(tmp, ns) == [reused]
    assert sorted(p.name for p in tmp.iterdir()) == sorted(kept)
    assert (target / "keep.txt").read_text() == "mine"


def test_an_unreadable_temp_dir_sweeps_nothing(tmp_path: Path) -> None:
    assert sweep_left_homes(tmp_path / "missing", namespace()) == []
