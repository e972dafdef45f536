"""Running one command: its own session, a timeout that kills every process it started
(its group, and what left the group: see `proctree`), capped and redacted output.

The engine builds the complete environment (PATH, the `LOOPDSL_n` placeholder values,
declared secrets) and passes it in; nothing here reads `os.environ`, so what a command
sees is exactly what the loop declared.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..language.model import DEFAULT_OUTPUT_CAP
from ..language.templates import TRUNCATION_MARKER
from .process_tree import (
    MARKER_VAR,
    CommandRef,
    command_alive,
    kill_now,
    kill_spawned,
    new_marker,
    start_time,
    stop_command,
)

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


class CwdOutsideWorkspace(ValueError):
    """A `cwd` that names a folder outside the workspace (the message says which and why)."""


def confined_cwd(workspace: Path, cwd: str) -> Path:
    """`cwd` (relative to the workspace, as rendered) as a real path inside the workspace.

    A rendered value may come from inputs or a model: an absolute path, a `..` part, or a
    symlink that leads out would run the command elsewhere, so each is refused."""
    base = Path(workspace).resolve()
    target = (base / named_cwd(cwd)).resolve()
    if target != base and base not in target.parents:
        raise CwdOutsideWorkspace(
            f"cwd {cwd[:200]!r} leads out of the workspace {base} (to {target}, through a symlink)"
        )
    return target


def named_cwd(cwd: str) -> Path:
    """The checks `confined_cwd` makes on the name alone (no file system): where the
    command runs elsewhere (a Temporal workflow), its shell runner resolves the rest."""
    if "\0" in cwd:
        raise CwdOutsideWorkspace("cwd contains a NUL byte")
    given = Path(cwd)
    if given.is_absolute():
        raise CwdOutsideWorkspace(f"cwd {cwd[:200]!r} is an absolute path; name a folder relative to the workspace")
    if ".." in given.parts:
        raise CwdOutsideWorkspace(f"cwd {cwd[:200]!r} has a '..' part; name a folder inside the workspace")
    return given


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
    """Decode, then cut to `cap` bytes and redact in one pass: a secret that crosses the cap is
    replaced whole instead of leaving its first half visible, and the start of a secret at
    the end of the kept window (cut anywhere) is never kept."""
    text = bytes(captured.data).decode("utf-8", errors="replace")
    if captured.total <= cap:
        return redact(text), False
    # Cutting may split a multi-byte character: the partial one is dropped.
    end = len(bytes(captured.data[:cap]).decode("utf-8", errors="ignore"))
    cut = getattr(redact, "cut", None)
    kept = cut(text, end) if cut is not None else redact(text[:end])
    return kept + TRUNCATION_MARKER.format(cap=cap), True


def _exit_code(returncode: int | None) -> int:
    if returncode is None:
        return -1
    return 128 - returncode if returncode < 0 else returncode


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


async def _stop_group(proc: asyncio.subprocess.Process, ref: CommandRef, grace: float) -> None:
    """Stop every process of the command (SIGTERM, `grace` s, SIGKILL) and reap the
    direct child. Grandchildren are re-parented to init, which reaps them."""
    await stop_command(ref, grace, exited=lambda: proc.returncode is not None)
    await _exited(proc)


async def _stop_after_cancelled_spawn(spawn: asyncio.Future[asyncio.subprocess.Process], marker: str,
                                      grace: float) -> None:
    try:
        proc = await spawn
    except asyncio.CancelledError:
        spawn.add_done_callback(lambda done: kill_spawned(done, marker))
        return
    except (OSError, ValueError):
        return  # it never started
    # The pipes too: a process the command started may already have left its session,
    # cleared its environment, and lost its parent; holding our pipes is then its only link.
    ref = CommandRef(proc.pid, marker, start_time(proc.pid), _pipe_inodes(proc))
    try:
        await _stop_group(proc, ref, grace)
    except asyncio.CancelledError:
        kill_now(ref)
    finally:
        _close_pipes(proc)  # nothing reads them; left open, a finaliser closes them after the loop


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
    _close_pipes(proc)


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
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
    marker: str | None = None,
    on_start: Callable[[CommandRef], None] | None = None,
) -> ShellResult:
    """Run `script` under `BASH`, or `argv` directly, in `cwd` with exactly `env`.

    The command gets its own session (so its own process group) and no stdin. On timeout,
    and when the awaiting task is cancelled, the command is stopped (its group and the
    processes that left it, see `proctree`: SIGTERM, then SIGKILL after `kill_grace` s)
    and reaped before this returns or re-raises; on timeout
    the result has `timed_out=True` and a note at the end of stderr. Background processes
    still holding the output pipes when the command exits are stopped the same way.
    stdout/stderr are read concurrently, each kept to `output_cap` bytes (the rest drained),
    decoded as UTF-8 with replacement, passed through `redact`, and marked when cut.
    A program that cannot be found gives exit code 127, one that cannot be executed 126,
    with the reason in stderr: never an exception.
    The command's environment also gets `LOOPDSL_COMMAND_ID=<marker>` (a fresh one unless
    given), which is how its processes are found (`proctree`); `on_start(ref)` is called
    once it runs, before it is waited on (the engine records `ref` in the run store).
    """
    command = _command_line(script, argv)
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
    marker = marker or new_marker()
    proc = await _spawn(command, workdir, {**env, MARKER_VAR: marker}, marker, kill_grace)
    if isinstance(proc, tuple):
        return failed_to_start(*proc)
    # start_new_session makes the child a session and group leader: its pid is the pgid.
    ref = CommandRef(proc.pid, marker, start_time(proc.pid), _pipe_inodes(proc))
    if on_start is not None:
        try:
            on_start(ref)
        except BaseException:
            await asyncio.shield(_stop_group(proc, ref, kill_grace))
            raise
    return await _watch(proc, ref, timeout, output_cap, redact, kill_grace, started)


def _command_line(script: str | None, argv: Sequence[str] | None) -> tuple[str, ...]:
    if (script is None) == (argv is None):
        raise ValueError("run_command needs exactly one of script= or argv=")
    if argv is not None and len(argv) == 0:
        raise ValueError("run_command: argv must name a program")
    return (*BASH, script) if script is not None else tuple(argv or ())


async def _spawn(command: tuple[str, ...], workdir: Path, env: Mapping[str, str], marker: str,
                 kill_grace: float) -> asyncio.subprocess.Process | tuple[int, str]:
    """The started process, or (exit code, reason) for one that could not start."""
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
        return await asyncio.shield(spawn)
    except asyncio.CancelledError:
        await _stop_after_cancelled_spawn(spawn, marker, kill_grace)
        raise
    except FileNotFoundError:
        return EXIT_NOT_FOUND, f"command not found: {command[0]}"
    except PermissionError:
        return EXIT_CANNOT_RUN, f"permission denied: {command[0]}"
    except OSError as exc:
        return EXIT_CANNOT_RUN, f"cannot run {command[0]}: {exc.strerror or exc}"


async def _watch(proc: asyncio.subprocess.Process, ref: CommandRef, timeout: float | None, output_cap: int,
                 redact: Callable[[str], str], kill_grace: float, started: float) -> ShellResult:
    """Read a started command's output until it ends (or its timeout), into its result."""
    overlap = max(_MIN_REDACTION_OVERLAP, 4 * int(getattr(redact, "longest", 0) or 0))
    out, err = _CappedStream(output_cap + overlap), _CappedStream(output_cap + overlap)
    readers = asyncio.gather(out.drain(proc.stdout), err.drain(proc.stderr))
    timed_out, leftovers_stopped = await _supervise(proc, ref, readers, timeout, kill_grace)

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


async def _supervise(proc: asyncio.subprocess.Process, ref: CommandRef, readers: asyncio.Future[Any],
                     timeout: float | None, kill_grace: float) -> tuple[bool, bool]:
    """Wait for the command and its output; stop it on timeout, cancellation, or when
    leftover processes keep its pipes open. Returns (timed out, leftovers stopped)."""
    timed_out = leftovers_stopped = False
    try:
        try:
            await asyncio.wait_for(_exited(proc), timeout)
        except asyncio.TimeoutError:
            timed_out = True
            await _stop_group(proc, ref, kill_grace)
        else:
            try:
                await asyncio.wait_for(asyncio.shield(readers), PIPE_DRAIN_GRACE_S)
            except asyncio.TimeoutError:
                # Only a live process of the command can still be holding the pipes; a
                # busy event loop alone can also make the readers late.
                if command_alive(ref):
                    leftovers_stopped = True
                    await _stop_group(proc, ref, kill_grace)
        await _await_readers(proc, readers, kill_grace + PIPE_DRAIN_GRACE_S)
    except asyncio.CancelledError:
        # Stop the command even if we are cancelled again meanwhile: the SIGKILL in the
        # fallback means no process outlives a cancelled step.
        try:
            await asyncio.shield(_stop_group(proc, ref, kill_grace))
        except asyncio.CancelledError:
            kill_now(ref)
        if not readers.done():
            _abandon(proc, readers)
        raise
    return timed_out, leftovers_stopped


def _pipe_inodes(proc: asyncio.subprocess.Process) -> tuple[int, ...]:
    """Inodes of our read ends of the command's stdout/stderr: a process still holding
    one is the command's, whatever session or environment it has."""
    transport = getattr(proc, "_transport", None)
    inodes = []
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        handle = pipe.get_extra_info("pipe") if pipe is not None else None
        if handle is not None:
            with contextlib.suppress(OSError, ValueError):
                inodes.append(os.fstat(handle.fileno()).st_ino)
    return tuple(inodes)


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
