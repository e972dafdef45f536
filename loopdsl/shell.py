"""Running one command: its own process group, a timeout that kills the whole group,
capped and redacted output.

The engine builds the complete environment (PATH, the `LOOPDSL_n` placeholder values,
declared secrets) and passes it in; nothing here reads `os.environ`, so what a command
sees is exactly what the loop declared.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .model import DEFAULT_OUTPUT_CAP

BASH = ("bash", "--noprofile", "--norc", "-eo", "pipefail", "-c")

# How long a stopped process group gets between SIGTERM and SIGKILL.
KILL_GRACE_S = 1.0
# After the command itself exits, how long background processes it left holding our
# pipes may keep writing before they are stopped (otherwise we would wait for them forever).
PIPE_DRAIN_GRACE_S = 0.5
_READ_CHUNK = 64 * 1024
_EXIT_POLL_S = 0.02
# Bytes kept past the cap so a secret straddling it is still seen whole and redacted.
_MIN_REDACTION_OVERLAP = 4096

EXIT_NOT_FOUND = 127
EXIT_CANNOT_RUN = 126


@dataclass
class ShellResult:
    stdout: str
    stderr: str
    # The command's exit status; a command ended by signal N reports 128 + N, as bash does.
    exit_code: int
    duration_s: float
    timed_out: bool = False
    truncated: bool = False

    def as_result(self) -> dict[str, Any]:
        """The result templates see as `<state>.stdout` etc."""
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "exit_code": self.exit_code,
            "duration_s": self.duration_s,
        }


def truncation_marker(cap: int) -> str:
    return f"\n[... truncated by loopdsl at {cap} bytes]"


class _CappedStream:
    """Reads a pipe to EOF, keeping the first `keep` bytes and counting the rest."""

    def __init__(self, keep: int):
        self.keep = keep
        self.data = bytearray()
        self.total = 0

    async def drain(self, stream: asyncio.StreamReader | None) -> None:
        if stream is None:
            return
        while True:
            chunk = await stream.read(_READ_CHUNK)
            if not chunk:
                return
            self.total += len(chunk)
            room = self.keep - len(self.data)
            if room > 0:
                self.data += chunk[:room]


def _finish_text(captured: _CappedStream, cap: int, redact: Callable[[str], str]) -> tuple[str, bool]:
    """Decode, redact, and only then cut to `cap` bytes: a secret that crosses the cap is
    replaced whole instead of leaving its first half visible."""
    text = redact(bytes(captured.data).decode("utf-8", errors="replace"))
    if captured.total <= cap:
        return text, False
    encoded = text.encode("utf-8")
    if len(encoded) > cap:
        # Cutting may split a multi-byte character: drop the partial one.
        text = encoded[:cap].decode("utf-8", errors="ignore")
    return text + truncation_marker(cap), True


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


def _live_group_members(pgid: int) -> list[int] | None:
    """Pids of the group's members that are not zombies, from /proc (Linux); None where
    /proc is not available. Zombies matter: an orphaned grandchild stays a zombie until
    init reaps it, which in some containers takes long, and `killpg(pgid, 0)` still counts it."""
    proc_root = Path("/proc")
    if not (proc_root / "self" / "stat").exists():
        return None
    members: list[int] = []
    for entry in os.scandir(proc_root):
        if not entry.name.isdigit():
            continue
        try:
            with open(os.path.join(entry.path, "stat"), "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` is still running (zombies excluded on Linux)."""
    members = _live_group_members(pgid)
    if members is not None:
        return bool(members)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _exited(proc: asyncio.subprocess.Process) -> None:
    """Wait until the process itself has exited.

    `Process.wait()` alone is not enough: asyncio wakes it only once every pipe has closed
    too, which a background grandchild holding stdout can delay forever. The return code is
    recorded as soon as the child is reaped, so poll it beside the ordinary wait."""
    waiter = asyncio.ensure_future(proc.wait())
    try:
        while proc.returncode is None:
            done, _ = await asyncio.wait({waiter}, timeout=_EXIT_POLL_S)
            if done:
                return
    finally:
        waiter.cancel()


async def _stop_group(proc: asyncio.subprocess.Process, pgid: int, grace: float) -> None:
    """SIGTERM the whole group, give it `grace` seconds, then SIGKILL whatever is left,
    and reap the direct child. Grandchildren are re-parented to init, which reaps them."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.returncode is not None and not group_alive(pgid):
            break
        await asyncio.sleep(0.02)
    # Unconditional: a member that ignores SIGTERM, or a zombie-free group that we merely
    # could not observe, gets the same treatment. Signalling an empty group is harmless.
    _signal_group(pgid, signal.SIGKILL)
    await _exited(proc)


async def _stop_after_cancelled_spawn(spawn: asyncio.Future[asyncio.subprocess.Process], grace: float) -> None:
    try:
        proc = await spawn
    except asyncio.CancelledError:
        spawn.add_done_callback(_kill_spawned_group)
        return
    except (OSError, ValueError):
        return  # it never started
    try:
        await _stop_group(proc, proc.pid, grace)
    except asyncio.CancelledError:
        _signal_group(proc.pid, signal.SIGKILL)


def _kill_spawned_group(spawn: asyncio.Future[asyncio.subprocess.Process]) -> None:
    if not spawn.cancelled() and spawn.exception() is None:
        _signal_group(spawn.result().pid, signal.SIGKILL)


async def _await_readers(proc: asyncio.subprocess.Process, readers: asyncio.Future[Any], timeout: float) -> None:
    """Give the pipe readers `timeout` seconds to reach EOF, then abandon them (a process
    that left our group with setsid could hold the pipe open indefinitely)."""
    try:
        await asyncio.wait_for(asyncio.shield(readers), timeout)
    except asyncio.TimeoutError:
        _abandon(proc, readers)
        with contextlib.suppress(asyncio.CancelledError):
            await readers


def _abandon(proc: asyncio.subprocess.Process, readers: asyncio.Future[Any]) -> None:
    readers.cancel()
    # asyncio has no public way to close a subprocess's pipes early; left open, the
    # transport is closed by its finaliser after the event loop is gone, which warns.
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        transport.close()


async def run_command(
    *,
    script: str | None = None,
    argv: Sequence[str] | None = None,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float | None,
    output_cap: int = DEFAULT_OUTPUT_CAP,
    redact: Callable[[str], str] = lambda s: s,
    kill_grace: float = KILL_GRACE_S,
) -> ShellResult:
    """Run `script` under `BASH`, or `argv` directly, in `cwd` with exactly `env`.

    The command gets its own session (so its own process group) and no stdin. On timeout,
    and when the awaiting task is cancelled, the whole group is stopped (SIGTERM, then
    SIGKILL after `kill_grace` s) and reaped before this returns or re-raises; on timeout
    the result has `timed_out=True` and a note at the end of stderr. Background processes
    still holding the output pipes when the command exits are stopped the same way.
    stdout/stderr are read concurrently, each kept to `output_cap` bytes (the rest drained),
    decoded as UTF-8 with replacement, passed through `redact`, and marked when cut.
    A program that cannot be found gives exit code 127, one that cannot be executed 126,
    with the reason in stderr: never an exception.
    """
    if (script is None) == (argv is None):
        raise ValueError("run_command needs exactly one of script= or argv=")
    if argv is not None and len(argv) == 0:
        raise ValueError("run_command: argv must name a program")
    command: tuple[str, ...] = (*BASH, script) if script is not None else tuple(argv or ())
    started = time.monotonic()

    def failed_to_start(code: int, message: str) -> ShellResult:
        return ShellResult(
            stdout="", stderr=redact(f"loopdsl: {message}\n"), exit_code=code,
            duration_s=time.monotonic() - started,
        )

    nul_in = _nul_byte_in(command, env)
    if nul_in:
        # The OS cannot pass a NUL byte in an argument or environment value (a rendered
        # template can contain one); say which instead of raising from deep in subprocess.
        return failed_to_start(EXIT_CANNOT_RUN, f"cannot run the command: {nul_in} contains a NUL byte")
    workdir = Path(cwd)
    if not workdir.is_dir():
        return failed_to_start(EXIT_CANNOT_RUN, f"working directory does not exist: {workdir}")
    spawn = asyncio.ensure_future(
        asyncio.create_subprocess_exec(
            *command,
            cwd=str(workdir),
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    )
    try:
        # Shielded: a cancellation that lands while asyncio is still wiring the pipes would
        # make asyncio kill only the direct child, leaving its own children running.
        proc = await asyncio.shield(spawn)
    except asyncio.CancelledError:
        await _stop_after_cancelled_spawn(spawn, kill_grace)
        raise
    except FileNotFoundError:
        return failed_to_start(EXIT_NOT_FOUND, f"command not found: {command[0]}")
    except PermissionError:
        return failed_to_start(EXIT_CANNOT_RUN, f"permission denied: {command[0]}")
    except OSError as exc:
        return failed_to_start(EXIT_CANNOT_RUN, f"cannot run {command[0]}: {exc.strerror or exc}")

    # start_new_session makes the child a session and group leader: its pid is the pgid.
    pgid = proc.pid
    overlap = max(_MIN_REDACTION_OVERLAP, 4 * int(getattr(redact, "longest", 0) or 0))
    out, err = _CappedStream(output_cap + overlap), _CappedStream(output_cap + overlap)
    readers = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))
    timed_out = False
    leftovers_stopped = False
    try:
        try:
            await asyncio.wait_for(_exited(proc), timeout)
        except asyncio.TimeoutError:
            timed_out = True
            await _stop_group(proc, pgid, kill_grace)
        else:
            try:
                await asyncio.wait_for(asyncio.shield(readers), PIPE_DRAIN_GRACE_S)
            except asyncio.TimeoutError:
                # Only a live group member can still be holding the pipes; a busy event
                # loop alone can also make the readers late.
                if group_alive(pgid):
                    leftovers_stopped = True
                    await _stop_group(proc, pgid, kill_grace)
        await _await_readers(proc, readers, kill_grace + PIPE_DRAIN_GRACE_S)
    except asyncio.CancelledError:
        # Stop the group even if we are cancelled again meanwhile: the SIGKILL in the
        # fallback means no process outlives a cancelled step.
        try:
            await asyncio.shield(_stop_group(proc, pgid, kill_grace))
        except asyncio.CancelledError:
            _signal_group(pgid, signal.SIGKILL)
        if not readers.done():
            _abandon(proc, readers)
        raise

    stdout, out_cut = _finish_text(out, output_cap, redact)
    stderr, err_cut = _finish_text(err, output_cap, redact)
    if timed_out:
        stderr += f"\nloopdsl: timed out after {_seconds(timeout)}; the command's process group was stopped\n"
    elif leftovers_stopped:
        stderr += "\nloopdsl: background processes still holding the command's output were stopped\n"
    return ShellResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=_exit_code(proc.returncode),
        duration_s=time.monotonic() - started,
        timed_out=timed_out,
        truncated=out_cut or err_cut,
    )


def _nul_byte_in(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    for index, arg in enumerate(command):
        if "\0" in arg:
            return "the script" if command[: len(BASH)] == BASH and index == len(BASH) else f"argument {index}"
    for key, value in env.items():
        if "\0" in key or "\0" in value:
            return f"environment variable {key.replace(chr(0), '')}"
    return None


def _seconds(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:g}s"
