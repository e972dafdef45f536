"""The ports an engine runs through, its only way to reach the world: the model
(provider), the run log, the response store, the person who decides, the clock and its
sleeps, the shell runner, child runs and the notifier of `notify:` webhooks. With fakes
for all of them a loop runs in memory and deterministically (tests/runtime/test_ports_replay.py).

Passed in, never global, so that tests and the durable layer choose them: an in-memory
run log and response store for API runs, the run store for durable ones; nobody, a
terminal or a reply script for checkpoint decisions. The run log and the response store
are two ports because they have different owners: a child run logs to its own record but
keeps paid responses in its parent's store.
"""
from __future__ import annotations

import asyncio
import random
import secrets
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol, Sequence

from .process_tree import CommandRef
from .run_state import RunState
from .shell import ShellResult, confined_cwd, run_command

if TYPE_CHECKING:
    from ..language.compile import CompiledLoop
    from ..language.model import Loop


class RunLog(Protocol):
    """Where a run's state and events are committed at each commit point."""

    durable: bool  # False: commits may be skipped while the run is still going

    def commit(self, run: RunState, events: list[dict[str, Any]]) -> None: ...


class ResponseStore(Protocol):
    """Paid model responses, by run key (for replay after a crash) and by cache key."""

    def get_response(self, key: str) -> dict[str, Any] | None: ...
    def put_response(self, key: str, value: dict[str, Any]) -> None: ...
    def get_cached(self, key: str) -> dict[str, Any] | None: ...
    def put_cached(self, key: str, value: dict[str, Any]) -> None: ...


class Clock(Protocol):
    """Every reading of time the engine makes, its waits and its random draws (retry
    jitter): a test's clock makes a run deterministic and its retries instant."""

    def monotonic(self) -> float: ...  # seconds, for durations and `budget.wall_time`
    def utc_now(self) -> str: ...  # ISO-8601 stamp for events and records
    def now(self) -> datetime: ...  # aware UTC datetime, for comparing stamps
    async def sleep(self, seconds: float) -> None: ...
    def uniform(self, low: float, high: float) -> float: ...  # a random draw in [low, high]
    def token_hex(self, nbytes: int) -> str: ...  # a random id (a command's marker)


class ShellRunner(Protocol):
    """Runs one command (a `shell:` state or a shell gate); `shell.run_command` is the real
    one and documents the contract: exactly one of script/argv, never raises for a command
    that fails or cannot start, calls `on_start` once the command runs."""

    async def __call__(self, *, script: str | None = None, argv: Sequence[str] | None = None, cwd: Path,
                       env: Mapping[str, str], timeout: float | None, redact: Callable[[str], str] = ...,
                       marker: str | None = None,
                       on_start: Callable[[CommandRef], None] | None = None) -> ShellResult: ...


@dataclass(frozen=True)
class ChildLoop:
    """The loop a `loop:` state runs, compiled, with the texts of the skills it uses."""

    compiled: "CompiledLoop"
    skills: Mapping[str, str]


class ChildRuns(Protocol):
    """Opens the loop a `loop:` state names and starts a run record for it. The API
    provides it: loading a loop file goes through lint and the project's rules."""

    def open(self, parent: "Loop", ref: str) -> ChildLoop: ...
    def new_state(self, loop: "Loop", run_id: str, inputs: Mapping[str, Any], meta: Mapping[str, Any]) -> RunState: ...
    # Optional: `async run(parent_engine, ref, child, state, concurrency) -> dict | None` runs
    # the child apart (a Temporal child workflow) and returns {status, outputs, run_id, error?,
    # waiting?}, with its spending already on the parent's ledger; None runs it in the engine.


class WorkspaceGit(Protocol):
    """The run's git worktree, for agent states (adapters/git_workspace.py is the real one):
    commits and diffs through git plumbing, so no hook, filter or fsmonitor runs. Blocking
    calls: the engine runs them in a thread."""

    def visit_start(self) -> str: ...  # the commit to restore: HEAD, or a commit of uncommitted files
    def changes(self, since: str) -> tuple[list[str], str]: ...  # (changed_files, diff_stat)
    def reset(self, since: str) -> None: ...  # the files and branch as at `since`
    # Each call may instead be a coroutine function (call_port awaits it).
    # Takes the repository's git setup now; the returned check says what changed since
    # (a message for the run's failure), or None.
    def guard(self) -> Callable[[], str | None]: ...
    # The worktrees of a concurrent fan-out's items that write, one each, made (or reopened)
    # from this worktree as it is now (adapters/git_workspace.py).
    def item_worktrees(self, label: str, count: int) -> Sequence["ItemWorktree"]: ...


async def call_port(fn: Callable[..., Any], *args: Any) -> Any:
    """A `WorkspaceGit` call: a blocking one runs in a thread; a coroutine function (the
    Temporal backend's port, whose calls are activities) is awaited as it is."""
    if asyncio.iscoroutinefunction(fn):
        return await fn(*args)
    return await asyncio.to_thread(fn, *args)


class ItemWorktree(Protocol):
    """One fan-out item's worktree; `path` and `git` are None when it was finished before a crash."""

    branch: str
    path: Path | None
    git: WorkspaceGit | None

    # Commits and removes a completed item's worktree, keeps another's (blocking); returns
    # what the item's result says of it: {branch, commit} or {branch, worktree[, error]}.
    def finish(self, completed: bool, message: str, secrets: Iterable[str]) -> dict[str, Any]: ...


class Human(Protocol):
    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class Delivery:
    """One POST: where, what, how long it may take, and how events name it (never the URL)."""

    url: str
    body: bytes
    timeout: float
    label: str


class Notifier(Protocol):
    """Sends deliveries together and returns, for each, None (sent) or why it failed. It
    returns within the longest timeout (plus a moment) whatever the receivers do, and
    never raises."""

    def send(self, deliveries: Sequence[Delivery]) -> list[str | None]: ...


class Publisher(Protocol):
    """Makes one planned `publish:` write (runtime/publish.py) and answers what it did:
    {"number", "url", "action"}. `resumed`: a previous process may have made this write
    already (its intent is recorded, its result is not), so it is looked up first. Raises
    a LoopdslError the user can act on."""

    def write(self, item: Mapping[str, Any], number: int | None, resumed: bool) -> dict[str, Any]: ...


class MemoryRunLog:
    """Counts commits and keeps nothing; for runs that need no durability (tests, API)."""

    durable = False

    def __init__(self) -> None:
        self.commits = 0

    def commit(self, run: RunState, events: list[dict[str, Any]]) -> None:
        self.commits += 1


class MemoryResponses:
    """Keeps paid responses in memory for the life of the process."""

    def __init__(self) -> None:
        self.responses: dict[str, dict[str, Any]] = {}

    def get_response(self, key: str) -> dict[str, Any] | None:
        return self.responses.get(key)

    def put_response(self, key: str, value: dict[str, Any]) -> None:
        self.responses[key] = value

    get_cached = get_response
    put_cached = put_response


class NoHuman:
    """No one to ask: a checkpoint makes the run wait (exit 4) for `loopdsl approve`."""

    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> dict[str, Any] | None:
        return None


_last_stamp: list[Any] = [0, ""]


def utc_now() -> str:
    """ISO-8601 UTC to the millisecond; formatting is cached per millisecond because a
    fast loop stamps several events within one."""
    now = time.time()
    ms = int(now * 1000)
    if ms != _last_stamp[0]:
        _last_stamp[0] = ms
        _last_stamp[1] = datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")
    return str(_last_stamp[1])


class SystemClock:
    """The machine's clocks, asyncio's sleep and the `random` module's draws. The two
    readings the engine makes at every step are the plain functions, so the port adds no
    call to its hot path."""

    monotonic = staticmethod(time.monotonic)
    utc_now = staticmethod(utc_now)

    # Rare draws, so methods: a module-level reference to `random`'s functions is refused at
    # import by Temporal's workflow sandbox, which runs the engine in its strict mode.
    def uniform(self, low: float, high: float) -> float:
        return random.uniform(low, high)

    def token_hex(self, nbytes: int) -> str:
        return secrets.token_hex(nbytes)

    def now(self) -> datetime:
        return datetime.now(timezone.utc)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass
class Ports:
    provider: Callable[[], Any]  # returns a providers.Provider; called on the first LLM call only
    run_log: RunLog = field(default_factory=MemoryRunLog)
    responses: ResponseStore = field(default_factory=MemoryResponses)
    human: Human = field(default_factory=NoHuman)
    workdir: Path = field(default_factory=Path.cwd)
    env: Mapping[str, str] = field(default_factory=dict)  # complete environment for commands
    secret_values: Mapping[str, str] = field(default_factory=dict)
    # Values redacted in the run's records but never given to it: the secrets of the loops above
    # a child loop, and the undeclared credentials of loopdsl's own environment.
    inherited_secrets: tuple[str, ...] = ()
    skills: Mapping[str, str] = field(default_factory=dict)  # skill path -> text
    listeners: list[Callable[[dict[str, Any]], None]] = field(default_factory=list)
    clock: Clock = field(default_factory=SystemClock)
    shell: ShellRunner = run_command
    # A `shell:` state's rendered `cwd` as a folder of the workspace (CwdOutsideWorkspace if
    # it leads out); a runner on another host (Temporal) checks the name here, the rest there.
    confine_cwd: Callable[[Path, str], Path] = confined_cwd
    children: ChildRuns | None = None  # None: the loop has no `loop:` states to run
    # False (loop tests): retry waits are counted against wall_time but not slept through.
    real_waits: bool = True
    use_cache: bool = False
    keep_events: bool = True
    # Tool kinds served outside the runtime (MCP servers, from adapters/): kind -> factory
    # (runtime/tools/registry.py); the runtime's own kinds need no entry.
    tool_kinds: Mapping[str, Any] = field(default_factory=dict)
    # Runs a coding-agent CLI for an `agent: {cli: ...}` state (api/agent_tools.run_cli);
    # None: such states cannot run.
    coding_cli: Callable[..., Any] | None = None
    # Sends `notify:` webhooks (adapters/webhook.py) when the API commits a run's status
    # (runtime/notify.py); None: the loop has none.
    notifier: Notifier | None = None
    # The run's git worktree (api/durable.py); None: the run has none.
    git: WorkspaceGit | None = None
