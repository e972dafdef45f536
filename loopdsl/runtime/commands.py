"""The commands a run has running, recorded so that a resumed run stops what a killed
loopdsl left behind.

Every process the engine starts (a `shell:` state, a shell gate, an agent's shell tool,
an MCP server, a coding-agent CLI, the git calls that describe a worktree) is entered
here with its `CommandRef` and committed to the store before it is waited on; it leaves
when it ends (written with the next commit). After `kill -9` of loopdsl the entries of
the commands it was running are still in the store, and `resume` stops every one that
is still alive before anything runs again. The one exception is a non-idempotent
`shell:` state's command, which a person decides about (actions/checkpoint.py) before
`stop_leftover` stops it; an agent's cut-off tool call is stopped the same way
(actions/agent_resume.py).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .process_tree import CommandRef, command_pids, kill_now, new_marker, stop_command
from .run_state import RunState

# Where the entries live: run.meta, which the run store keeps with every commit.
META_KEY = "commands"
# How long a command left running by a killed loopdsl gets between SIGTERM and SIGKILL.
LEFTOVER_GRACE_S = 2.0
# Every command this process is running, for any run: what `kill_running_commands` stops
# when the process itself is told to end (SIGTERM), by marker.
_RUNNING: dict[str, CommandRef] = {}


def kill_running_commands() -> int:
    """SIGKILL every command this process runs (their whole trees), without waiting or
    committing: for a process about to die by SIGTERM (docker stop, a cancelled CI job),
    which would otherwise leave them running, orphaned, until `resume`. The store keeps
    them recorded, as after kill -9, and a resume settles them as it does then. How many."""
    refs = list(_RUNNING.values())
    for ref in refs:
        kill_now(ref)
    return len(refs)


class RunCommands:
    """The running commands of one run (`run.meta["commands"]`: marker -> ref and label)."""

    def __init__(self, run: RunState, commit: Callable[[], None],
                 token_hex: Callable[[int], str] = lambda nbytes: new_marker()) -> None:
        self.run = run
        self._commit = commit
        # The clock port's draws: in a Temporal workflow a marker must come out the same on replay.
        self._token_hex = token_hex

    def new_marker(self) -> str:
        return self._token_hex(12)

    def _entries(self) -> dict[str, Any]:
        entries = self.run.meta.get(META_KEY)
        return entries if isinstance(entries, dict) else {}

    def started(self, ref: CommandRef, what: str) -> None:
        """Committed at once: a crash from here on must find the command in the store."""
        _RUNNING[ref.marker] = ref
        self.run.meta[META_KEY] = {**self._entries(), ref.marker: {**ref.to_json(), "what": what}}
        self._commit()

    def ended(self, ref: CommandRef | None) -> None:
        """Not committed: the next commit writes it (a crash before that leaves an entry
        whose processes are gone, which `stop_leftovers` just forgets)."""
        if ref is not None:
            self._forget(ref.marker)

    def _forget(self, marker: str) -> None:
        _RUNNING.pop(marker, None)
        entries = self._entries()
        entries.pop(marker, None)
        if not entries:  # a run with nothing running keeps no trace of it
            self.run.meta.pop(META_KEY, None)

    def shell(self, run_shell: Callable[..., Awaitable[Any]], what: str) -> Callable[..., Awaitable[Any]]:
        """`run_shell` (the Ports.shell contract) recording each command it runs as `what`."""

        async def recorded(*, on_start: Callable[[CommandRef], None] | None = None,
                           marker: str | None = None, **options: Any) -> Any:
            refs: list[CommandRef] = []

            def started(ref: CommandRef) -> None:
                refs.append(ref)
                if on_start is not None:  # first: what it records goes into the commit below
                    on_start(ref)
                self.started(ref, what)

            try:
                return await run_shell(marker=marker or self.new_marker(), on_start=started, **options)
            finally:
                self.ended(refs[0] if refs else None)

        return recorded

    async def stop_leftovers(self, emit: Callable[..., None]) -> None:
        """Stop every recorded command still alive (left by a killed loopdsl), then forget
        them all. An interrupted `shell:` state's own command is left to
        `settle_interrupted_command` (a non-idempotent one waits for a person first)."""
        pending = self.run.pending or {}
        keep = (pending.get("command") or {}).get("marker") if pending.get("kind") == "shell" else None
        entries = self._entries()
        for marker, entry in list(entries.items()):
            if marker == keep:
                continue
            await self.stop_leftover(CommandRef.from_json(entry), emit, state=self.run.current, what=entry.get("what"))
            self._forget(marker)

    async def stop_leftover(self, ref: CommandRef | None, emit: Callable[..., None], *, state: str | None,
                            clock: Any = None, **shown: Any) -> list[int]:
        """Stop one command a killed loopdsl left running, if any of it still is (the one home
        of that stop: every recorded command at resume, an interrupted shell state's own once
        settled, an agent's cut-off tool call), saying so in a `stopped_leftover` event. The
        pids that were running; [] when none (or no ref). `clock`: the engine's clock port;
        `shown`: more fields of the event (`what` the command was)."""
        running = leftover_pids(ref)
        if ref is None or not running:
            return []
        emit("stopped_leftover", state=state, pgid=ref.pgid, pids=running, **shown)
        timing = {"monotonic": clock.monotonic, "sleep": clock.sleep} if clock is not None else {}
        await stop_command(ref, LEFTOVER_GRACE_S, **timing)
        return running


def leftover_pids(ref: CommandRef | None) -> list[int]:
    """The processes of a recorded command still alive ([] when none, or no ref)."""
    return (command_pids(ref) or []) if ref is not None else []
