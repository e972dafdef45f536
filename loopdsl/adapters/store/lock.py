"""Run locks: a cross-process lock on a run, kept alive by a heartbeat thread.

The lock is a row `lock/<name>` of the store that expires unless refreshed; taking it
is `RunStore.lock` (atomic `add`, or a takeover of a dead holder's row). Taking it also
writes the taker's token to `owner/<name>`, which never expires: it is the fencing token
every commit under the lock checks, so a holder that was suspended past its ttl (and
replaced) can never write again, even after the new holder released the lock.
"""
from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any

import diskcache

from ...language.errors import EXIT_CHANGED
from ...runtime.errors import StoreError

if TYPE_CHECKING:
    from .run_store import RunStore


class RunChanged(StoreError):
    """Another process changed the run under us (took over its lock, or decided first):
    this process must stop and record nothing more (exit 5)."""

    exit_code = EXIT_CHANGED


class RunLocked(StoreError):
    """Another live process holds the run."""


def _lock_key(name: str) -> str:
    return f"lock/{name}"


def _owner_key(name: str) -> str:
    return f"owner/{name}"


def _holder_is_dead(holder: dict[str, Any]) -> bool:
    """A holder on this host whose process no longer exists (killed, crashed): its lock
    would only expire after its ttl; resuming right after a kill -9 need not wait."""
    if holder.get("host") != socket.gethostname():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A zombie (killed, not yet reaped by its parent) still answers signal 0.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return False


def add_lock(cache: diskcache.Cache, name: str, mine: dict[str, Any], ttl: float) -> bool:
    """Take a free lock and become the run's owner, in one transaction."""
    with cache.transact():
        # `add` treats an expired row as absent: one winner per key.
        if not cache.add(_lock_key(name), mine, expire=ttl):
            return False
        cache.set(_owner_key(name), mine["token"])
        return True


def acquire(cache: diskcache.Cache, name: str, mine: dict[str, Any], ttl: float, wait: float) -> None:
    """Take the lock `name` for the holder `mine` (a free one, or a dead holder's), polling
    for up to `wait` seconds; else raise RunLocked saying who holds it."""
    deadline = time.monotonic() + wait
    reread = False
    while True:
        if add_lock(cache, name, mine, ttl):
            return
        # Empty when the holder expired between our add and this read: try once more.
        current = cache.get(_lock_key(name))
        holder = current if isinstance(current, dict) else {}
        if not holder and not reread:
            reread = True
            continue
        if _holder_is_dead(holder) and take_over(cache, name, holder, mine, ttl):
            return
        if time.monotonic() >= deadline:
            raise RunLocked(
                f"run {name} is in use by process {holder.get('pid', '?')} on host "
                f"{holder.get('host', '?')} since {holder.get('since', '?')}",
                "wait for that process to finish or stop it; if it was killed, its lock "
                f"expires within {holder.get('ttl', ttl):g} s",
            )
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def take_over(cache: diskcache.Cache, name: str, dead: dict[str, Any], mine: dict[str, Any], ttl: float) -> bool:
    """Replace a dead holder's lock, atomically: only if it is still that holder's."""
    with cache.transact():
        current = cache.get(_lock_key(name))
        if not isinstance(current, dict) or current.get("token") != dead.get("token"):
            return False
        cache.set(_lock_key(name), mine, expire=ttl)
        cache.set(_owner_key(name), mine["token"])
        return True


def check_owner(cache: diskcache.Cache, lock: RunLock) -> None:
    """Inside a commit's transaction: raise RunChanged unless `lock` still owns its run."""
    if cache.get(_owner_key(lock.name)) != lock.token:
        raise RunChanged(
            f"another process took over run {lock.name} while this one was suspended or "
            f"stalled past its lock's {lock.ttl:g} s; this process stopped and recorded "
            "nothing more",
            f"`loopdsl show {lock.name}` shows the run as the other process left it",
        )


# --------------------------------------------------------------------------- locks


class RunLock:
    """A held cross-process lock on a run; a daemon thread refreshes it every ttl/3.

    Returned by `RunStore.lock` already acquired. Use as a context manager or call
    `release()`. If the holder is killed, the lock expires within `ttl`.
    """

    def __init__(self, store: RunStore, name: str, ttl: float, holder: dict[str, Any]) -> None:
        self._store = store
        self.name = name
        self.ttl = ttl
        self.token: str = holder["token"]
        self._holder = holder
        self._stop = threading.Event()
        self._lost = False
        self._released = False
        self._thread = threading.Thread(
            target=self._heartbeat, name=f"loopdsl-lock-{name}", daemon=True
        )
        self._thread.start()

    @property
    def lost(self) -> bool:
        """True when a refresh found the lock taken over (e.g. this process was suspended)."""
        return self._lost

    def _heartbeat(self) -> None:
        cache = self._store._cache
        try:
            while not self._stop.wait(self.ttl / 3):
                try:
                    with cache.transact():
                        if not self._refresh(cache):
                            self._lost = True
                            return
                except (diskcache.Timeout, sqlite3.Error):
                    continue  # busy store: the next beat retries well before expiry
        finally:
            cache.close()  # closes only this thread's SQLite connection

    def _refresh(self, cache: diskcache.Cache) -> bool:
        """Inside a transaction: extend the lock; False when another process owns the run."""
        if cache.get(_owner_key(self.name)) != self.token:
            return False
        holder = cache.get(_lock_key(self.name))
        if isinstance(holder, dict) and holder.get("token") == self.token:
            cache.touch(_lock_key(self.name), expire=self.ttl)
        else:  # a late beat let the row expire, and nobody took it: still ours
            cache.set(_lock_key(self.name), self._holder, expire=self.ttl)
        return True

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self._stop.set()
        self._thread.join()
        self._store._release(self)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()
