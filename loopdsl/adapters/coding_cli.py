"""Running a coding-agent CLI (Claude Code or Codex) for an `agent: {cli: ...}` state.

The API, for the agent action:

    spec = CliSpec(kind="claude-code", binary="claude", extra_args=(), model=None,
                   max_turns=8, permissions="read", api_key_env="ANTHROPIC_API_KEY")
    result = await run_coding_cli(
        spec, prompt=text, workspace=path, reservation_usd=2.0, worst_call_usd=0.5,
        prices=TokenPrices.from_entry(model_info(...)), redactor=run_redactor,
        base_env={"PATH": ..., "LANG": ...}, api_key=secret_value, timeout=600.0,
        charge=ledger_charge, on_event=log, on_start=record_ref)
    result.as_result()  # {text, stop, kind, error, cost_usd, overspend_usd, usage, turns, ...}

What it guarantees:
- The CLI runs in `workspace` in its own session, with the prompt on stdin, a fresh config
  home for this attempt only (a temp dir as HOME and CLAUDE_CONFIG_DIR / CODEX_HOME, removed
  afterwards), no user or project settings (`--setting-sources ""`, `--strict-mcp-config`) and
  exactly PATH, LANG, TERM, TMPDIR (taken from `base_env`) plus its own API key. Nothing here
  reads `os.environ`.
- The CLI's own cap is the reservation minus one worst-case call (`--max-budget-usd`; codex
  takes none), so it stops itself before loopdsl has to. A reservation that cannot cover one
  worst-case call is refused before anything starts (`budget_exhausted`).
- Spend is charged as events arrive: `charge(delta_usd)` for each increase of what the
  events say was spent (tokens priced by class with `prices`, or the CLI's cumulative cost,
  whichever is higher). `charge` returning False means the reservation is reached: the whole
  process group is killed at once. Deltas still arriving afterwards are charged too (spend is
  spend); what was spent past the reservation is `overspend_usd`, never hidden.
- At the end, at the timeout, at a budget kill, on cancellation, or when a callback raises,
  the process group (and whatever left it, see `process_tree`) is killed before returning.
- Every event goes to `on_event` redacted (large ones reduced to a capped excerpt);
  `on_start(ref)` gets the `CommandRef` (pgid, marker, start time) once the CLI runs, to be
  committed so a resumed run can kill it. The result's text and errors are redacted.
- `kind` (when the run did not answer): `max_turns`, `auth`, `budget_exhausted`, `timeout`,
  `shell_exit` (any other failure, non-zero exit included).
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..runtime.process_tree import MARKER_VAR, CommandRef, kill_now, new_marker, start_time, stop_command
from ..runtime.redaction import Redactor
from ..runtime.tools.base import safe_output
from .coding_cli_events import (
    CLAUDE,
    CODEX,
    KINDS,
    Meter,
    StreamState,
    TokenPrices,
    looks_like_auth,
    parse_line,
    reader_for,
)
from .coding_cli_stream import LineSplitter, TailBuffer

__all__ = ["CliSpec", "CliResult", "TokenPrices", "run_coding_cli", "build_argv", "build_env",
           "cli_cap_usd", "PERMISSIONS", "DEFAULT_KEY_ENV"]

PERMISSIONS = ("read", "edit", "full")
DEFAULT_KEY_ENV = {CLAUDE: "ANTHROPIC_API_KEY", CODEX: "OPENAI_API_KEY"}
_ENV_PASSED = ("PATH", "LANG", "TERM", "TMPDIR")
_CONFIG_DIR_VAR = {CLAUDE: "CLAUDE_CONFIG_DIR", CODEX: "CODEX_HOME"}
# Claude Code tool names per permission level: reading ones only, or those plus editing.
_READ_TOOLS = ("Read", "Glob", "Grep", "LS")
_EDIT_TOOLS = (*_READ_TOOLS, "Edit", "MultiEdit", "Write", "NotebookEdit")
_CLAUDE_MODE = {"read": "default", "edit": "acceptEdits", "full": "bypassPermissions"}
_CODEX_SANDBOX = {"read": "read-only", "edit": "workspace-write", "full": "danger-full-access"}
KILL_GRACE_S = 1.0
EVENT_LIMIT = 8 * 1024  # bytes of one event passed whole to on_event; larger ones are cut
STDERR_KEEP = 16 * 1024


@dataclass(frozen=True)
class CliSpec:
    """Which CLI, how to start it (from the model alias) and what it may do (from the state)."""

    kind: str  # "claude-code" | "codex"
    binary: str  # the alias's `cli_path` (a name on PATH or a path)
    extra_args: tuple[str, ...] = ()  # the alias's extra args, placed before loopdsl's flags
    model: str | None = None
    max_turns: int | None = None  # claude only; codex has no turn cap
    permissions: str = "read"
    api_key_env: str | None = None  # default: DEFAULT_KEY_ENV[kind]

    def key_env(self) -> str:
        return self.api_key_env or DEFAULT_KEY_ENV[self.kind]


@dataclass
class CliResult:
    text: str | None
    stop: str  # "answer" | "max_turns" | "error"
    kind: str | None  # None when answered; else an error kind (see the module docstring)
    error: str | None
    cost_usd: float
    overspend_usd: float
    usage: dict[str, int]
    turns: int
    exit_code: int | None
    duration_s: float
    cap_usd: float | None = None  # what the CLI was given as its own cap
    reported_cost_usd: float | None = None
    stderr: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_result(self) -> dict[str, Any]:
        return {"text": self.text, "stop": self.stop, "kind": self.kind, "error": self.error,
                "cost_usd": self.cost_usd, "overspend_usd": self.overspend_usd, "usage": dict(self.usage),
                "turns": self.turns, "exit_code": self.exit_code, "duration_s": self.duration_s,
                "cap_usd": self.cap_usd}


def cli_cap_usd(reservation_usd: float, worst_call_usd: float) -> float | None:
    """The cap handed to the CLI: the reservation minus one worst-case call (the CLI checks
    its cap only between calls, so one call may cross it), rounded down to a cent; None when
    nothing is left."""
    left = math.floor((reservation_usd - max(worst_call_usd, 0.0)) * 100) / 100
    return left if left > 0 else None


def build_argv(spec: CliSpec, cap_usd: float | None) -> list[str]:
    """The command line. Loopdsl's flags come after the alias's extra args so that, where a
    flag is given twice, ours (the last) decide permissions, caps and settings."""
    if spec.kind not in KINDS:
        raise ValueError(f"unknown coding-agent CLI {spec.kind!r}; expected one of {', '.join(KINDS)}")
    if spec.permissions not in PERMISSIONS:
        raise ValueError(f"permissions must be one of {', '.join(PERMISSIONS)}, not {spec.permissions!r}")
    model = ["--model", spec.model] if spec.model else []
    if spec.kind == CODEX:
        # `-` makes codex read the prompt from stdin.
        return [spec.binary, "exec", *spec.extra_args, "--json", "--sandbox",
                _CODEX_SANDBOX[spec.permissions], "--skip-git-repo-check", *model, "-"]
    argv = [spec.binary, *spec.extra_args, "-p", "--output-format", "stream-json", "--verbose"]
    if spec.max_turns is not None:
        argv += ["--max-turns", str(int(spec.max_turns))]
    if cap_usd is not None:
        argv += ["--max-budget-usd", f"{cap_usd:.2f}"]
    argv += ["--permission-mode", _CLAUDE_MODE[spec.permissions]]
    if spec.permissions != "full":
        argv += ["--allowedTools", ",".join(_READ_TOOLS if spec.permissions == "read" else _EDIT_TOOLS)]
    return argv + ["--strict-mcp-config", "--setting-sources", "", *model]


def build_env(spec: CliSpec, base_env: Mapping[str, str], home: Path, api_key: str | None) -> dict[str, str]:
    """PATH LANG TERM TMPDIR from `base_env`, HOME and the CLI's config dir in `home`, and
    its own API key: nothing else (no other secret, no user config)."""
    env = {name: base_env[name] for name in _ENV_PASSED if name in base_env}
    env["HOME"] = str(home)
    env.setdefault("TMPDIR", str(home))
    env[_CONFIG_DIR_VAR[spec.kind]] = str(home / "config")
    if api_key:
        env[spec.key_env()] = api_key
    return env


class _Run:
    """The state of one CLI process being read: what was said, spent and decided."""

    def __init__(self, spec: CliSpec, reservation_usd: float, prices: TokenPrices | None,
                 redactor: Redactor, charge: Callable[[float], bool],
                 on_event: Callable[[dict[str, Any]], Any] | None) -> None:
        self.spec, self.reservation_usd = spec, reservation_usd
        self.reader = reader_for(spec.kind)
        self.meter = Meter(prices)
        self.redactor, self.charge, self.on_event = redactor, charge, on_event
        self.budget_hit = asyncio.Event()
        self.events = 0
        self.skipped = 0

    @property
    def state(self) -> StreamState:
        return self.reader.state

    def line(self, raw: bytes, oversized: bool) -> None:
        event = None if oversized else parse_line(raw)
        if event is None:
            self.skipped += 1
            return
        self.events += 1
        self.reader.feed(event)
        delta = self.meter.take_delta(self.state)
        if self.on_event is not None:
            self.on_event(self._for_log(event, len(raw)))
        if delta > 0:
            allowed = self.charge(delta)
            if allowed is False or self.meter.charged_usd >= self.reservation_usd:
                self.budget_hit.set()

    def _for_log(self, event: dict[str, Any], size: int) -> dict[str, Any]:
        if size <= EVENT_LIMIT:
            logged = self.redactor.redact_obj(event)
        else:
            excerpt, _ = safe_output(str(event), limit=EVENT_LIMIT, redact=self.redactor)
            logged = {"type": str(event.get("type"))[:100], "excerpt": excerpt, "cut": True}
        return {"cli": self.spec.kind, "event": logged, "spent_usd": self.meter.charged_usd}


async def run_coding_cli(
    spec: CliSpec,
    *,
    prompt: str,
    workspace: Path,
    reservation_usd: float,
    worst_call_usd: float,
    prices: TokenPrices | None,
    redactor: Redactor,
    base_env: Mapping[str, str],
    api_key: str | None,
    timeout: float | None,
    charge: Callable[[float], bool],
    on_event: Callable[[dict[str, Any]], Any] | None = None,
    on_start: Callable[[CommandRef], Any] | None = None,
    kill_grace: float = KILL_GRACE_S,
) -> CliResult:
    """Run the CLI once (one attempt) and say how it ended; see the module docstring.
    Failures of the CLI are in the result, never raised; a raising callback is re-raised
    after the CLI's group is killed."""
    started = time.monotonic()
    redact = Redactor([*redactor.values, *([api_key] if api_key else [])])
    cap = cli_cap_usd(reservation_usd, worst_call_usd) if spec.kind == CLAUDE else reservation_usd
    if cap is None or reservation_usd <= 0:
        return _refused(f"max_cost_usd ${reservation_usd:.2f} does not cover one worst-case call "
                        f"(${worst_call_usd:.2f}); raise max_cost_usd", started)
    argv = build_argv(spec, cap if spec.kind == CLAUDE else None)
    run = _Run(spec, reservation_usd, prices, redact, charge, on_event)
    home = Path(tempfile.mkdtemp(prefix="loopdsl-cli-"))
    try:
        (home / "config").mkdir(mode=0o700)
        env = build_env(spec, base_env, home, api_key)
        outcome = await _supervised(argv, env, workspace, prompt, run, timeout, kill_grace, on_start)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return _result(run, outcome, cap, redact, started)


def _refused(message: str, started: float) -> CliResult:
    return CliResult(text=None, stop="error", kind="budget_exhausted", error=message, cost_usd=0.0,
                     overspend_usd=0.0, usage={}, turns=0, exit_code=None,
                     duration_s=time.monotonic() - started)


@dataclass
class _Outcome:
    exit_code: int | None
    stderr: str
    timed_out: bool = False
    budget_killed: bool = False
    start_error: str | None = None


async def _supervised(argv: Sequence[str], env: dict[str, str], workspace: Path, prompt: str, run: _Run,
                      timeout: float | None, grace: float,
                      on_start: Callable[[CommandRef], Any] | None) -> _Outcome:
    marker = new_marker()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=str(workspace), env={**env, MARKER_VAR: marker}, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    except FileNotFoundError:
        return _Outcome(127, "", start_error=f"{argv[0]}: command not found (set the alias's cli_path)")
    except OSError as exc:
        return _Outcome(126, "", start_error=f"cannot run {argv[0]}: {exc.strerror or exc}")
    # start_new_session makes the CLI a session and group leader: its pid is the pgid.
    ref = CommandRef(proc.pid, marker, start_time(proc.pid))
    stderr = TailBuffer(STDERR_KEEP)
    err_reader = asyncio.ensure_future(stderr.drain(proc.stderr))
    exited = lambda: proc.returncode is not None  # noqa: E731
    reader: asyncio.Future[None] | None = None
    try:
        if on_start is not None:
            on_start(ref)
        reader = asyncio.ensure_future(_read_stdout(proc, run))
        outcome = await _watch(proc, run, reader, prompt, timeout, grace)
        # Whatever it left behind (a background child, a process holding the pipes) goes too;
        # at a budget kill nobody waits for a polite exit.
        await stop_command(ref, 0.0 if outcome.budget_killed else grace, exited=exited)
        await _until_exited(proc, grace + 1.0)
        # Events already written before the kill are spend too: read what the pipe still holds.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), 1.0)
    except BaseException:
        try:
            await asyncio.shield(stop_command(ref, grace, exited=exited))
        except asyncio.CancelledError:
            kill_now(ref)
        err_reader.cancel()
        raise
    finally:
        if reader is not None:
            reader.cancel()
    with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
        await asyncio.wait_for(err_reader, 1.0)
    outcome.exit_code = proc.returncode
    outcome.stderr = stderr.text()
    return outcome


async def _until_exited(proc: asyncio.subprocess.Process, limit: float) -> None:
    """Wait (at most `limit` s) for the process itself to be reaped. Polled: asyncio's
    `wait()` also waits for every pipe to close, which a leftover grandchild can delay."""
    deadline = time.monotonic() + limit
    while proc.returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


async def _watch(proc: asyncio.subprocess.Process, run: _Run, reader: asyncio.Future[None], prompt: str,
                 timeout: float | None, grace: float) -> _Outcome:
    """Feed the prompt and read the events until the CLI closes its stdout (then give it
    `grace` s to exit), the budget is hit, or time runs out; the caller kills the group."""
    deadline = None if timeout is None else time.monotonic() + timeout
    feeder = asyncio.ensure_future(_feed(proc, prompt))
    budget = asyncio.ensure_future(run.budget_hit.wait())
    outcome = _Outcome(None, "")
    try:
        done, _ = await asyncio.wait({reader, budget}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if reader in done:
            reader.result()  # a raising callback propagates from here
        if run.budget_hit.is_set():
            outcome.budget_killed = True
        elif not done:
            outcome.timed_out = True
        else:
            left = grace if deadline is None else max(0.0, min(grace, deadline - time.monotonic()))
            await _until_exited(proc, left)
    finally:
        feeder.cancel()
        budget.cancel()
    return outcome


async def _feed(proc: asyncio.subprocess.Process, prompt: str) -> None:
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(prompt.encode("utf-8", errors="replace"))
        await proc.stdin.drain()
        proc.stdin.close()


async def _read_stdout(proc: asyncio.subprocess.Process, run: _Run) -> None:
    if proc.stdout is None:
        return
    splitter = LineSplitter()
    while True:
        chunk = await proc.stdout.read(64 * 1024)
        for line, oversized in splitter.feed(chunk):
            run.line(line, oversized)
        if not chunk:
            return


def _result(run: _Run, outcome: _Outcome, cap: float, redact: Redactor, started: float) -> CliResult:
    state = run.state
    cost = run.meter.charged_usd
    kind, error = _classify(run, outcome, redact)
    text = redact(state.text) if state.text is not None else None
    stop = "answer" if kind is None else ("max_turns" if kind == "max_turns" else "error")
    return CliResult(
        text=text, stop=stop, kind=kind, error=error, cost_usd=cost,
        overspend_usd=max(0.0, cost - run.reservation_usd), usage=dict(state.usage), turns=state.turns,
        exit_code=outcome.exit_code, duration_s=time.monotonic() - started, cap_usd=cap,
        reported_cost_usd=state.reported_cost_usd, stderr=redact(outcome.stderr),
        extra={"events": run.events, "skipped_lines": run.skipped})


def _classify(run: _Run, outcome: _Outcome, redact: Redactor) -> tuple[str | None, str | None]:
    """(error kind, message) of how the run ended; (None, None) for an answer."""
    state = run.state
    said = [*state.errors, outcome.stderr[-4000:]]
    if outcome.start_error is not None:
        return "shell_exit", outcome.start_error
    if outcome.budget_killed or state.subtype == "error_max_budget_usd":
        return "budget_exhausted", (f"spent ${run.meter.charged_usd:.4f} of the ${run.reservation_usd:.2f} "
                                    "reserved; the CLI's process group was killed")
    if outcome.timed_out:
        return "timeout", "the CLI did not finish in time; its process group was killed"
    if state.subtype == "error_max_turns":
        return "max_turns", f"the CLI used its {run.spec.max_turns} turns without finishing"
    failed = outcome.exit_code != 0 or state.is_error or not state.finished
    if failed and looks_like_auth(said):
        return "auth", redact.error(f"the CLI could not authenticate (check {run.spec.key_env()}): "
                                    f"{_last(said)}")
    if outcome.exit_code != 0:
        return "shell_exit", redact.error(f"the CLI exited with status {outcome.exit_code}: {_last(said)}")
    if state.is_error or not state.finished or state.text is None:
        return "shell_exit", redact.error(f"the CLI ended without a final answer: {_last(said)}")
    return None, None


def _last(texts: list[str]) -> str:
    for text in reversed(texts):
        if text.strip():
            return text.strip()[-1000:]
    return "(no message)"

