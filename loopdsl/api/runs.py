"""The Python API: run, resume and decide on loops. The CLI is a thin layer over this.

    import loopdsl
    result = loopdsl.run("loops/daily-triage.yaml", inputs={"repo": "."}, script="replies.yaml")
    result.status, result.path, result.outputs, result.cost_usd, result.events
"""
from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from ..language.compile import CompiledLoop, compile_loop
from ..language.diagnostics import LoopError
from ..language.packaged_loops import child_loop_path
from ..runtime.engine import Engine, MemoryResponses, MemoryRunLog, NoHuman, Ports, utc_now
from ..runtime.ports import ChildLoop
from ..runtime.notify import notify_engine
from ..adapters.scripted import ScriptedProvider
from ..adapters.webhook import WebhookNotifier
from .agent_tools import adapter_tool_kinds, run_cli
from .publishing import check_publish_ready
from ..language.inputs import coerce_inputs
from ..language.model import Loop
from ..language.schedules import time_zone
from ..language.skills import read_skill, skill_paths
from ..runtime.run_state import COMPLETED, IN_MEMORY_PREFIX, RUNNING, WAITING, RunState
from ..adapters.otel import traced
from ..adapters.store.run_store import RunStore
from ..language.errors import LoopdslError
from ..lint.lockfile import sha256_file
from ..lint.loop_tree import loop_tree
from ..lint.registry import did_you_mean
from ..runtime.errors import ScriptError, StepFailure, StoreError
from .run_environment import ambient_credentials_of_run, command_environment, secret_values
from .store_access import UsageError, open_store

EXIT_CODES = {COMPLETED: 0, WAITING: 4}


@dataclass
class RunResult:
    state: RunState
    events: list[dict[str, Any]] = field(default_factory=list)
    store_dir: Path | None = None

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def status(self) -> str:
        return self.state.status

    @property
    def path(self) -> list[str]:
        return list(self.state.path)

    @property
    def outputs(self) -> dict[str, Any]:
        return dict(self.state.outputs)

    @property
    def usage(self) -> dict[str, dict[str, float]]:
        """Per state: tokens, cost_usd, seconds and attempts."""
        return dict(self.state.usage)

    @property
    def tokens(self) -> int:
        return int(self.state.ledger.get("tokens", 0))

    @property
    def cost_usd(self) -> float:
        return float(self.state.ledger.get("cost_usd", 0.0))

    @property
    def steps(self) -> int:
        return int(self.state.ledger.get("steps", 0))

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.status, 1)


# ---------------------------------------------------------------- loading


def load(path: str | Path) -> Loop:
    from ..lint.pipeline import load_loop

    return load_loop(path)


def resolve_loop(loop: str | Path | Loop) -> Loop:
    if isinstance(loop, Loop):
        return loop
    from ..language.packaged_loops import resolve_loop_ref

    return load(resolve_loop_ref(str(loop)))


def loop_files(loop: Loop) -> dict[str, str]:
    """Every file the run depends on (loop, imports, skills, sub-loops) -> sha256."""
    from ..lint.lockfile import dependencies

    return dependencies(loop)


def _skills(loop: Loop) -> dict[str, str]:
    texts: dict[str, str] = {}
    for skill in skill_paths(loop):
        try:
            texts[skill] = read_skill(loop.base_dir / skill)
        except OSError as exc:
            raise UsageError(f"cannot read skill {skill}: {exc}", "lint the loop: `loopdsl lint`") from None
    return texts


class LoopFileChildren:
    """The child-run port: a `loop:` state's file (or `pkg:` loop) loaded, linted and
    compiled like a top-level loop, and its run state started like one. A durable run gives
    the digests it recorded at its start (`meta.files`): a sub-loop file changed since (by a
    state of the run itself, say) is refused, as `resume` refuses one, and the record never
    claims a digest the run did not run."""

    def __init__(self, pinned: Mapping[str, str] | None = None) -> None:
        from ..lint.pipeline import LintSession  # as in `load`: the API's import does not lint

        self.pinned = pinned
        # One session for the run: a sub-loop is linted once, not again under each of its
        # ancestors (a chain of sub-loops cost the square of its depth).
        self._session = LintSession()

    def open(self, parent: Loop, ref: str) -> ChildLoop:
        try:
            path = child_loop_path(parent.base_dir, ref)
            digest = self.pinned.get(str(path)) if self.pinned is not None else None
            if digest is not None and sha256_file(path) != digest:
                raise StepFailure("parse", f"sub-loop {ref} changed since the run started; it was not run "
                                  "(`loopdsl resume --force` accepts the files as they are now)", fatal=True)
            child = self._session.loop_at(path)
        except LoopError as exc:  # a child that no longer loads fails this state, like any step
            raise StepFailure("parse", f"sub-loop {ref} does not load: {exc}") from None
        except LoopdslError as exc:  # a package that is gone
            raise StepFailure("parse", f"sub-loop {ref}: {exc.message}") from None
        return ChildLoop(compile_loop(child), _skills(child))

    def new_state(self, loop: Loop, run_id: str, inputs: Mapping[str, Any], meta: Mapping[str, Any]) -> RunState:
        return new_run_state(loop, run_id, inputs, meta)


def _run_date(loop: Loop) -> str:
    tz = (time_zone(loop.schedule.timezone) if loop.schedule is not None else None) or timezone.utc
    return datetime.now(tz).date().isoformat()


# ---------------------------------------------------------------- providers


def uses_model_client(script: Any, provider: Any) -> bool:
    """Whether a run calls real models through LiteLLM (no reply script, no provider given)."""
    return script is None and provider is None


async def ready_to_call_models(loop: Loop, listeners: Iterable[Callable[[dict[str, Any]], None]]) -> None:
    """Before the first state of a real run: every model it may call has its credentials
    (UsageError otherwise). Says `loading model client...` if that has to wait for LiteLLM."""
    from .credentials import check_credentials

    def loading() -> None:
        for listener in listeners:
            listener({"type": "loading", "what": "model client", "t": utc_now()})

    await check_credentials(loop, on_wait=loading)


def load_script(loop: Loop, script: str | os.PathLike[str]) -> ScriptedProvider:
    """The reply script for a run of `loop`. A key that names no state of the loop or of its
    sub-loops is a typo: its replies would never be used, and the state meant would find none."""
    scripted = ScriptedProvider.from_file(script)
    known = {name for each in loop_tree(loop) for name in each.states}
    unknown = sorted(set(scripted.states()) - known)
    if unknown:
        raise ScriptError(f"{script}: {unknown[0]!r} is not a state of loop {loop.name!r} or of its sub-loops"
                          f"{did_you_mean(unknown[0], known)}; a script's keys name the states it answers for")
    return scripted


def make_ports(
    loop: Loop,
    *,
    script: str | Path | None,
    provider: Any,
    human: Any,
    workdir: Path,
    listeners: Iterable[Callable[[dict[str, Any]], None]],
    run_log: Any = None,
    responses: Any = None,
    use_cache: bool,
    asked: Mapping[str, int] | None = None,
    real_waits: bool = True,
    tool_stubs: Mapping[str, Any] | None = None,
    notify: bool = True,  # False: none of the loop's `notify:` webhooks is sent (loop tests)
) -> Ports:
    scripted = None
    if script is not None:  # checked against the loop before (load_script): the run's start, a resume given one
        scripted = ScriptedProvider.from_file(script)
        if asked:
            scripted.skip_used(asked)
        provider = scripted
    if provider is None:
        def make_provider() -> Any:
            from ..adapters.litellm import LiteLLMProvider

            return LiteLLMProvider()
    else:

        def make_provider() -> Any:
            return provider

    if human is None:
        if scripted is not None:
            from ..adapters.humans import ScriptedHuman

            human = ScriptedHuman(scripted.decision)
        else:
            human = NoHuman()
    secrets = secret_values(loop)
    return Ports(
        provider=make_provider,
        human=human,
        workdir=workdir,
        env=command_environment(loop, secrets, workdir),
        secret_values=secrets,
        skills=_skills(loop),
        listeners=list(listeners),
        use_cache=use_cache,
        real_waits=real_waits,
        children=LoopFileChildren(),
        run_log=run_log if run_log is not None else MemoryRunLog(),
        responses=responses if responses is not None else MemoryResponses(),
        tool_kinds=stubbed_tool_kinds(adapter_tool_kinds(), tool_stubs),
        coding_cli=run_cli,
        notifier=WebhookNotifier() if notify and loop.notify else None,
        inherited_secrets=ambient_credentials_of_run(secrets),
    )


def stubbed_tool_kinds(kinds: dict[str, Any], stubs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tool kinds of a run, with a loop test's stubbed tools answering for themselves."""
    if not stubs:
        return kinds
    from ..runtime.tools.stubs import ToolStub, stubbed_kinds  # only loop tests stub tools

    try:
        parsed = {name: stub if isinstance(stub, ToolStub) else ToolStub.from_mapping(name, stub)
                  for name, stub in stubs.items()}
    except ValueError as exc:
        raise UsageError(str(exc), 'give each stubbed tool {"result": ...} or {"error": "..."}') from None
    return stubbed_kinds(kinds, parsed)


# ---------------------------------------------------------------- run


def new_run_state(loop: Loop, run_id: str, inputs: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> RunState:
    return RunState(
        run_id=run_id,
        loop=loop.name,
        start=loop.start,
        current=loop.start,
        path=[loop.start],
        visits={loop.start: 1},
        inputs=dict(inputs),
        started_at=utc_now(),
        date=_run_date(loop),
        meta=dict(meta or {}),
    )


def run(
    loop: str | Path | Loop,
    inputs: Mapping[str, Any] | None = None,
    *,
    script: str | Path | None = None,
    provider: Any = None,
    human: Any = None,
    store: str | Path | RunStore | None | bool = None,
    workdir: str | Path | None = None,
    cache: bool = False,
    listeners: Iterable[Callable[[dict[str, Any]], None]] = (),
    input_strings: Mapping[str, str] | None = None,
    real_waits: bool = True,
    tool_stubs: Mapping[str, Any] | None = None,
    notify: bool = True,
    publish: bool = True,
) -> RunResult:
    """Run a loop to its end (or until it waits for a person).

    `store=None` runs in memory unless the loop needs a store (a worktree);
    `store=True` uses the default store (`.loopdsl/` at the repository root);
    a path or a RunStore uses that one. `real_waits=False` (loop tests) counts the
    waits before retries against `budget.wall_time` without sleeping through them;
    `tool_stubs` (loop tests) maps an agent tool's name to what its calls answer instead
    of running (`{"result": ...}` or `{"error": ...}`, runtime/tools/stubs.py);
    `notify=False` (loop tests) sends none of the loop's `notify:` webhooks; `publish=False` plans
    the `publish:` writes and makes none (`resume` makes them). A loop that publishes is durable.
    """
    return asyncio.run(
        arun(loop, inputs, script=script, provider=provider, human=human, store=store, workdir=workdir,
             cache=cache, listeners=listeners, input_strings=input_strings, real_waits=real_waits,
             tool_stubs=tool_stubs, notify=notify, publish=publish)
    )


async def arun(
    loop: str | Path | Loop,
    inputs: Mapping[str, Any] | None = None,
    *,
    script: str | Path | None = None,
    provider: Any = None,
    human: Any = None,
    store: str | Path | RunStore | None | bool = None,
    workdir: str | Path | None = None,
    cache: bool = False,
    listeners: Iterable[Callable[[dict[str, Any]], None]] = (),
    input_strings: Mapping[str, str] | None = None,
    real_waits: bool = True,
    tool_stubs: Mapping[str, Any] | None = None,
    notify: bool = True,
    publish: bool = True,
) -> RunResult:
    listeners = list(listeners)
    model = resolve_loop(loop)
    compiled = compile_loop(model)
    values = coerce_inputs(model, inputs or {}, input_strings or {})
    if script is not None:  # before a run is recorded: a script that cannot serve the loop starts nothing
        load_script(model, script)
    check_publish_ready(model, publish)
    if uses_model_client(script, provider):
        await ready_to_call_models(model, listeners)
    where = Path(workdir).resolve() if workdir is not None else Path.cwd()
    durable = store is not None and store is not False or model.workspace.worktree or model.publish is not None
    if not durable:
        ports = make_ports(model, script=script, provider=provider, human=human, workdir=where,
                           listeners=listeners, use_cache=cache, real_waits=real_waits, tool_stubs=tool_stubs,
                           notify=notify)
        state = new_run_state(model, IN_MEMORY_PREFIX + os.urandom(4).hex(), values, {"loop_path": str(model.source or "")})
        engine = Engine(compiled, state, ports)
        with traced(engine):
            try:
                await engine.execute()
            except BaseException:  # recorded as failed, or aborted (Ctrl-C): say so, then let it out
                with contextlib.suppress(Exception):  # the run's own error matters more than a failed notice of it
                    notify_engine(engine, None)
                raise
            notify_engine(engine, None)
        return RunResult(state, engine.events)
    from .durable import run_durable

    opened = open_store(None if isinstance(store, bool) else store, where)
    try:
        return await run_durable(compiled, values, script=script, provider=provider, human=human,
                                 store=opened, workdir=where, cache=cache, listeners=listeners, real_waits=real_waits,
                                 tool_stubs=tool_stubs, notify=notify, publish=publish)
    finally:
        if opened is not store:  # ours to close; a RunStore passed in stays open for its owner
            opened.close()


def resume(run_ref: str, **kwargs: Any) -> RunResult:
    from .durable import resume_durable

    return asyncio.run(resume_durable(run_ref, **kwargs))


def compiled_for(loop: Loop) -> CompiledLoop:
    return compile_loop(loop)


__all__ = ["run", "arun", "resume", "load", "RunResult", "UsageError", "StoreError", "RUNNING"]
