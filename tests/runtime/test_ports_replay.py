"""The engine performs no I/O of its own: every effect goes through a port.

A run is recorded with ports that pass each call to the real thing (bash, the machine's
clock, the reply-script provider, a person's answer) and write down the call and its
answer on a tape. The same loop is then run again with ports that only read the tape, in
an empty workdir: it must make the same calls in the same order and end with the same
path, results, events (timestamps included) and commits, without running a command.
"""
from __future__ import annotations

import asyncio
import copy
import os
import textwrap
from pathlib import Path
from typing import Any, Awaitable, Callable

from loopdsl.adapters.scripted import ScriptedProvider
from loopdsl.api.runs import new_run_state
from loopdsl.language.compile import compile_loop
from loopdsl.language.model import build_loop
from loopdsl.runtime.engine import Engine, Ports
from loopdsl.runtime.model_port import LlmRequest
from loopdsl.runtime.ports import MemoryResponses, SystemClock
from loopdsl.runtime.run_state import RunState
from loopdsl.runtime.shell import run_command

import yaml

LOOP = textwrap.dedent("""\
    loopdsl: 1
    name: replayed
    models:
      m: {model: openai/gpt-4o-mini, max_tokens: 100}
    gates:
      has_file: {shell: "test -f made.txt"}
    start: ask
    states:
      ask:
        llm: {model: m, prompt: "name a file"}
        retry: {max_attempts: 2, on: [rate_limit], backoff: {initial: 0.1s}}
        next: make
      make:
        shell: "echo made > made.txt; echo {{ ask.text }}"
        gates: {after: [has_file]}
        next: approve
      approve:
        checkpoint: {message: "Keep {{ make.stdout }}?"}
        transitions:
          - {to: done, when: "approve.decision == 'approve'"}
          - {to: dropped}
      done: {end: completed, output: {said: "{{ ask.text }}", by: "{{ approve.by }}"}}
      dropped: {end: failed}
    """)
# The wait is drawn (jitter, 0.05-0.1 s) and longer than the provider's Retry-After: a replay
# waits as long as the recording did only if the draw went through the clock port.
REPLIES = {"ask": [{"error": "rate_limit", "retry_after": 0.01}, "notes"]}


class Tape:
    """Every port call of one run, in order: (port, arguments, outcome)."""

    def __init__(self, calls: list[tuple[str, Any, Any]] | None = None):
        self.replaying = calls is not None
        self.calls: list[tuple[str, Any, Any]] = [] if calls is None else calls
        self.read = 0

    def _replay(self, port: str, args: Any) -> Any:
        assert self.read < len(self.calls), f"replay made an extra call: {port}{args!r}"
        want_port, want_args, outcome = self.calls[self.read]
        self.read += 1
        assert (port, args) == (want_port, want_args), f"call {self.read}: {port}{args!r}, recorded {want_port}{want_args!r}"
        kind, value = outcome
        if kind == "raise":  # the recorded exception itself: exceptions do not all deep-copy
            raise value
        return copy.deepcopy(value)

    def call(self, port: str, args: Any, real: Callable[[], Any]) -> Any:
        if self.replaying:
            return self._replay(port, args)
        try:
            value = real()
        except Exception as exc:
            self.calls.append((port, copy.deepcopy(args), ("raise", exc)))
            raise
        self.calls.append((port, copy.deepcopy(args), ("return", copy.deepcopy(value))))
        return value

    async def acall(self, port: str, args: Any, real: Callable[[], Awaitable[Any]]) -> Any:
        if self.replaying:
            return self._replay(port, args)
        try:
            value = await real()
        except Exception as exc:
            self.calls.append((port, copy.deepcopy(args), ("raise", exc)))
            raise
        self.calls.append((port, copy.deepcopy(args), ("return", copy.deepcopy(value))))
        return value


class TapeClock:
    def __init__(self, tape: Tape):
        self.tape, self.real = tape, SystemClock()

    def monotonic(self) -> float:
        return self.tape.call("clock.monotonic", (), self.real.monotonic)

    def utc_now(self) -> str:
        return self.tape.call("clock.utc_now", (), self.real.utc_now)

    def now(self) -> Any:
        return self.tape.call("clock.now", (), self.real.now)

    async def sleep(self, seconds: float) -> None:
        await self.tape.acall("clock.sleep", (seconds,), lambda: self.real.sleep(seconds))

    def uniform(self, low: float, high: float) -> float:
        return self.tape.call("clock.uniform", (low, high), lambda: self.real.uniform(low, high))

    def token_hex(self, nbytes: int) -> str:
        return self.tape.call("clock.token_hex", (nbytes,), lambda: self.real.token_hex(nbytes))


class TapeShell:
    """Arguments are compared without `marker` (a fresh random id) and `redact`, and the
    cwd relative to the run's workdir (the replay has its own, empty one); the command
    reference the real runner reports on start is on the tape and handed on."""

    def __init__(self, tape: Tape, workdir: Path):
        self.tape, self.workdir = tape, workdir

    async def __call__(self, *, script: str | None = None, argv: Any = None, cwd: Path, env: Any,
                       timeout: float | None, on_start: Callable[[Any], None] | None = None, **rest: Any) -> Any:
        args = (script, argv, os.path.relpath(cwd, self.workdir), dict(env), timeout)
        if self.tape.replaying:
            ref, result = self.tape._replay("shell", args)
        else:
            seen: list[Any] = []

            async def real() -> Any:
                result = await run_command(script=script, argv=argv, cwd=cwd, env=env, timeout=timeout,
                                           on_start=seen.append, **rest)
                return seen[0] if seen else None, result

            ref, result = await self.tape.acall("shell", args, real)
        if on_start is not None and ref is not None:
            on_start(ref)
        return result


class TapeProvider:
    def __init__(self, tape: Tape, real: Any):
        self.tape, self.real = tape, real

    async def complete(self, request: LlmRequest, *, state: str) -> Any:
        return await self.tape.acall("model.complete", (state, request.canonical()),
                                     lambda: self.real.complete(request, state=state))

    def count_tokens(self, model: str, messages: Any) -> int:
        return self.tape.call("model.count_tokens", (model, list(messages)),
                              lambda: self.real.count_tokens(model, messages))


class TapeHuman:
    def __init__(self, tape: Tape):
        self.tape = tape

    async def decide(self, state: str, message: str, choices: tuple[str, ...]) -> Any:
        async def real() -> Any:
            return {"decision": "approve", "comment": "ok", "by": "reviewer"}

        return await self.tape.acall("human.decide", (state, message, choices), real)


class TapeRunLog:
    durable = True

    def __init__(self, tape: Tape):
        self.tape = tape

    def commit(self, run: RunState, events: list[dict[str, Any]]) -> None:
        record = _without_markers(copy.deepcopy(run.to_json()))
        self.tape.call("run_log.commit", (record, copy.deepcopy(events)), lambda: None)


class TapeResponses:
    def __init__(self, tape: Tape):
        self.tape, self.real = tape, MemoryResponses()

    def get_response(self, key: str) -> Any:
        return self.tape.call("responses.get", (key,), lambda: self.real.get_response(key))

    def put_response(self, key: str, value: Any) -> None:
        self.tape.call("responses.put", (key, value), lambda: self.real.put_response(key, value))

    def get_cached(self, key: str) -> Any:
        return self.tape.call("responses.get_cached", (key,), lambda: self.real.get_cached(key))

    def put_cached(self, key: str, value: Any) -> None:
        self.tape.call("responses.put_cached", (key, value), lambda: self.real.put_cached(key, value))


def _without_markers(value: Any) -> Any:
    """A shell command's marker is drawn at random before the runner is called."""
    if isinstance(value, dict):
        return {k: _without_markers(v) for k, v in value.items() if k != "marker"}
    if isinstance(value, list):
        return [_without_markers(v) for v in value]
    return value


def drive(tape: Tape, workdir: Path, start: dict[str, Any]) -> tuple[RunState, list[dict[str, Any]]]:
    compiled = compile_loop(build_loop(yaml.safe_load(LOOP)))
    provider = TapeProvider(tape, ScriptedProvider.from_data(REPLIES))
    ports = Ports(provider=lambda: provider, run_log=TapeRunLog(tape), responses=TapeResponses(tape),
                  human=TapeHuman(tape), clock=TapeClock(tape), shell=TapeShell(tape, workdir), workdir=workdir,
                  env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    state = RunState.from_json(copy.deepcopy(start))
    engine = Engine(compiled, state, ports)
    asyncio.run(engine.execute())
    return state, engine.events


def test_a_run_replayed_from_its_port_calls_takes_the_same_path(tmp_path: Path) -> None:
    loop = build_loop(yaml.safe_load(LOOP))
    start = new_run_state(loop, "replayed-1", {}).to_json()
    recorded_dir, replay_dir = tmp_path / "recorded", tmp_path / "replay"
    recorded_dir.mkdir()
    replay_dir.mkdir()

    tape = Tape()
    first, first_events = drive(tape, recorded_dir, start)
    assert first.status == "completed", first.error
    assert first.path == ["ask", "make", "approve", "done"]
    assert first.outputs == {"said": "notes", "by": "reviewer"}
    ports_used = {port for port, _, _ in tape.calls}
    assert {"clock.sleep", "clock.uniform", "shell", "model.complete", "human.decide", "run_log.commit",
            "responses.put"} <= ports_used, ports_used
    assert (recorded_dir / "made.txt").exists()

    # The replay hands out deep copies of what it read, so the recorded tape stays as it was.
    replay = Tape(list(tape.calls))
    again, again_events = drive(replay, replay_dir, start)
    assert replay.read == len(tape.calls), "the replay stopped short of the recorded calls"
    assert again.path == first.path
    assert again.status == first.status and again.outputs == first.outputs
    assert again.results == first.results
    assert again_events == first_events
    assert not (replay_dir / "made.txt").exists(), "the replay ran a command itself"


def test_a_replay_that_strays_from_the_record_is_caught(tmp_path: Path) -> None:
    """The tape compares each call: a replay asked for a different command fails."""
    loop = build_loop(yaml.safe_load(LOOP))
    start = new_run_state(loop, "replayed-2", {}).to_json()
    tape = Tape()
    drive(tape, tmp_path, start)
    changed = [(port, (("echo other",) + args[1:]) if port == "shell" else args, outcome)
               for port, args, outcome in tape.calls]
    try:
        drive(Tape(changed), tmp_path, start)
    except AssertionError as exc:
        assert "shell" in str(exc)
    else:
        raise AssertionError("a replay with a different recorded command went unnoticed")
