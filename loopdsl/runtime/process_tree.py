"""The processes of one command, found through /proc, and stopping all of them.

A command runs in its own session, so its process group holds what it starts, except
what leaves the group: a `setsid` child, a daemon that double-forks. Each command is
therefore started with a random marker in its environment (`LOOPDSL_COMMAND_ID`),
which children inherit across `setsid` and `fork`; the command's processes are

  - the members of its process group (when that group is still the command's: the
    leader's start time, from /proc/PID/stat, rules out a reused process id),
  - every process of ours whose environment (/proc/PID/environ) carries the marker,
  - every process holding one of the command's output pipes open (/proc/PID/fd),
  - and every descendant of those (by parent pid), for a child that cleared its
    environment while its parent lives.

Stopping first freezes the command (SIGSTOP, looking again until nothing new shows up),
so the tree is whole before a signal kills a parent and orphans its children; each
process found stays a target until it is gone.

proc(5) documents the files read here. Where /proc is missing (not Linux) only the
process group is known, and `killpg` is all there is. What none of these find is a
process that left the session, cleared its environment, closed the pipes and lost its
parent: a daemon in the full sense, which only a cgroup could follow.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

MARKER_VAR = "LOOPDSL_COMMAND_ID"
_PROC = Path("/proc")
# A few rounds of SIGKILL catch processes forked while the previous round was sent.
_KILL_ROUNDS = 5
# Looks at a freezing command: each stops what the previous one found, forked meanwhile.
_FREEZE_ROUNDS = 5


def new_marker() -> str:
    return secrets.token_hex(12)


@dataclass(frozen=True)
class CommandRef:
    """What identifies a command's processes, also after the loopdsl that ran it died."""

    pgid: int
    marker: str
    start: int | None = None  # the leader's start time (clock ticks after boot)
    # Inode numbers of the output pipes, while the loopdsl that reads them runs.
    pipes: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"pgid": self.pgid, "marker": self.marker, "start": self.start}

    @classmethod
    def from_json(cls, data: Any) -> CommandRef | None:
        if not isinstance(data, dict) or not isinstance(data.get("marker"), str):
            return None
        pgid, start = data.get("pgid"), data.get("start")
        if not isinstance(pgid, int) or isinstance(pgid, bool) or pgid <= 1:
            return None
        return cls(pgid, data["marker"], start if isinstance(start, int) else None)


@dataclass(frozen=True)
class _Proc:
    pid: int
    ppid: int
    pgrp: int
    start: int
    live: bool  # not a zombie


def _stat(pid: int | str) -> _Proc | None:
    try:
        with open(_PROC / str(pid) / "stat", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    # Fields after the parenthesised command name (which may itself hold ')' or spaces):
    # state(3) ppid(4) pgrp(5) ... starttime(22).
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) < 20:
        return None
    return _Proc(int(pid), int(fields[1]), int(fields[2]), int(fields[19]), fields[0] not in (b"Z", b"X"))


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot, or None (gone, or no /proc)."""
    found = _stat(pid)
    return found.start if found is not None else None


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(_PROC / str(pid) / "environ", "rb") as handle:
            return needle in handle.read().split(b"\0")
    except OSError:  # gone, or another user's process
        return False


def _holds_pipe(pid: int, links: frozenset[str]) -> bool:
    try:
        with os.scandir(_PROC / str(pid) / "fd") as entries:  # closed also on an early return
            for entry in entries:
                with contextlib.suppress(OSError):
                    if os.readlink(entry.path) in links:
                        return True
    except OSError:
        pass
    return False


def _find(ref: CommandRef, known: dict[int, int] | None = None) -> dict[int, int] | None:
    """The live processes of the command (pid -> start time), or None where /proc cannot
    tell. `known` holds processes seen in an earlier look: one still running (same start
    time, so not a reused id) stays the command's, with its descendants, even after the
    parent that linked it to the command has died."""
    if not (_PROC / "self" / "stat").exists():
        return None
    procs = [p for p in (_stat(e.name) for e in os.scandir(_PROC) if e.name.isdigit()) if p is not None]
    by_pid = {p.pid: p for p in procs}
    leader = by_pid.get(ref.pgid)
    # A live leader with another start time is a new process that got the same id.
    group_is_ours = ref.start is None or leader is None or not leader.live or leader.start == ref.start
    needle = f"{MARKER_VAR}={ref.marker}".encode()
    links = frozenset(f"pipe:[{inode}]" for inode in ref.pipes)
    known = known or {}
    me = os.getpid()

    def started_with_it(p: _Proc) -> bool:
        # Only a process started with or after the command's leader can be in its group (not
        # a reused group id), carry its fresh marker or have inherited its pipes; the costly
        # reads of environ and fd/ skip all the others (a machine's hundreds of processes,
        # looked at every 20 ms while a command stops).
        return ref.start is None or p.start >= ref.start

    found = {
        p.pid for p in procs
        if p.live and p.pid != me
        and (known.get(p.pid) == p.start
             or (started_with_it(p)
                 and ((group_is_ours and p.pgrp == ref.pgid)
                      or _carries(p.pid, needle) or (links and _holds_pipe(p.pid, links)))))
    }
    children: dict[int, list[int]] = {}
    for p in procs:
        if p.live:
            children.setdefault(p.ppid, []).append(p.pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found and child != me:
                found.add(child)
                todo.append(child)
    return {pid: by_pid[pid].start for pid in found}


def command_pids(ref: CommandRef) -> list[int] | None:
    """The live processes of the command, or None where /proc cannot tell."""
    found = _find(ref)
    return sorted(found) if found is not None else None


def command_alive(ref: CommandRef, known: dict[int, int] | None = None) -> bool:
    found = _find(ref, known)
    if found is not None:
        if known is not None:
            known.update(found)
        return bool(found)
    try:
        os.killpg(ref.pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _send(pid: int, sig: int, group: bool = False) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


def signal_command(ref: CommandRef, sig: int, known: dict[int, int] | None = None) -> None:
    """Send `sig` to the command's group and to each of its processes outside it.

    The processes are looked up before any is signalled: a parent killed first takes with
    it the only link to a child that left the session and cleared its environment (the
    child is re-parented to init at once). `known`, when given, gathers what was found."""
    found = _find(ref, known)
    if known is not None and found:
        known.update(found)
    _send(ref.pgid, sig, group=True)
    for pid in found or ():
        _send(pid, sig)


def _freeze(ref: CommandRef) -> dict[int, int]:
    """SIGSTOP the command's group and each of its processes, looking again until no new
    one shows up: a stopped process neither dies nor forks, so the tree seen is complete
    before any signal that kills. Returns what was stopped (pid -> start time)."""
    _send(ref.pgid, signal.SIGSTOP, group=True)
    stopped: dict[int, int] = {}
    for _ in range(_FREEZE_ROUNDS):
        found = _find(ref, stopped)
        new = {pid: start for pid, start in (found or {}).items() if pid not in stopped}
        for pid in new:
            _send(pid, signal.SIGSTOP)
        stopped.update(new)
        if not new:
            break
    return stopped


async def stop_command(ref: CommandRef, grace: float, *, exited: Any = None,
                       monotonic: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """SIGTERM every process of the command, give them `grace` seconds, then SIGKILL
    whatever is left (in rounds, for processes forked meanwhile). `exited()`, when given,
    says whether the direct child has been reaped (the caller's own child). The engine
    passes its clock port's `monotonic` and `sleep`; the shell runner (itself a port) the
    machine's. Every process found along the way stays a target until it is gone, so one
    whose parent died first is not lost."""
    known = _freeze(ref)
    signal_command(ref, signal.SIGTERM, known)
    # Stopped processes act on the SIGTERM (their handlers, their exit) once continued.
    signal_command(ref, signal.SIGCONT, known)
    deadline = monotonic() + grace
    while monotonic() < deadline:
        if (exited is None or exited()) and not command_alive(ref, known):
            break
        await sleep(0.02)
    # Unconditional: a process that ignores SIGTERM, or one we could not observe.
    for _ in range(_KILL_ROUNDS):
        signal_command(ref, signal.SIGKILL, known)
        if not _find(ref, known):
            break
        await sleep(0.01)


def kill_now(ref: CommandRef) -> None:
    """SIGKILL at once, without waiting (a cancelled step that is cancelled again)."""
    known = _freeze(ref)
    signal_command(ref, signal.SIGKILL, known)


async def spawn_in_session(argv: Any, *, marker: str, env: dict[str, str],
                           **options: Any) -> asyncio.subprocess.Process:
    """Start `argv` as the leader of a new session, carrying `marker` in its environment.

    Shielded: a cancellation that lands while asyncio is still wiring the pipes would leave
    the new process running (or make asyncio kill only the direct child); here the whole
    command is killed as soon as the spawn completes, and the cancellation goes on."""
    spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
        *argv, env={**env, MARKER_VAR: marker}, start_new_session=True, **options))
    try:
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        spawn.add_done_callback(lambda done: kill_spawned(done, marker))
        raise


def kill_spawned(spawn: "asyncio.Future[asyncio.subprocess.Process]", marker: str) -> None:
    """Done-callback of a cancelled spawn: kill what it started, if it started."""
    if not spawn.cancelled() and spawn.exception() is None:
        kill_now(CommandRef(spawn.result().pid, marker))
