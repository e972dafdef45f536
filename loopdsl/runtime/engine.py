"""The asyncio engine: runs a compiled loop, one state at a time, durably.

The compiled loop's routing table dispatches (`CompiledLoop.fire`, the `transitions`
machine's rule on the same edges); every action runs here, through ports the engine is given
(provider, human, run log, response store, clock). Commit points, in order, are what makes a run
resumable after kill -9 at any moment:
  - entering a state (current state, visit counts, results so far, budget spent);
  - before a side effect that must not be repeated blindly (an LLM call's
    reservation, a non-idempotent shell command): the `pending` marker;
  - a run ending or starting to wait for a person.
"""
from __future__ import annotations

import asyncio
from typing import Any

from ..language.compile import EXHAUST, FAIL, NEXT, ROUTE, CompiledLoop, CompiledState, input_facts
from ..language.model import State
from ..language.templates import RenderError
from .actions.checkpoint import Waiting, checkpoint, resume_waiting, settle_interrupted_command
from .actions.command import run_shell_state
from .actions.llm import LlmCaller, run_llm_state
from .attempt import bounded_attempt, set_values
from .budget import BudgetExceeded, Ledger
from .commands import RunCommands
from .context import build_context
from .errors import ScriptError, ScriptExhausted, StepFailure, StoreError
from .gates import GateRunner
from .outputs import render_outputs
from .ports import Human, MemoryResponses, MemoryRunLog, NoHuman, Ports, ResponseStore, RunLog, utc_now
from .recovery import account_for_crash, settle_completed_call
from .redaction import Redactor
from .retry import backoff_delay
from .run_state import ABORTED, BUDGET_EXHAUSTED, COMPLETED, FAILED, RUNNING, WAITING, RunState

# A key that is missing or refused does not come right by waiting: fail fast, even if `retry.on` lists it.
NEVER_RETRIED = frozenset({"auth"})

__all__ = ["Engine", "Human", "MemoryResponses", "MemoryRunLog", "NoHuman", "Ports", "ResponseStore", "RunLog", "utc_now"]


class Engine:
    def __init__(self, compiled: CompiledLoop, run: RunState, ports: Ports, ledger: Ledger | None = None,
                 parent: "Engine | None" = None):
        self.parent = parent  # the engine of the loop whose `loop:` state runs this one
        self.compiled = compiled
        self.loop = compiled.loop
        self.run = run
        self.ports = ports
        if ledger is None:
            ledger = Ledger.from_json(self.loop.budget, run.ledger) if run.ledger else Ledger(self.loop.budget)
        self.ledger = ledger
        # A child loop also hides its ancestors' secrets: a value handed down through `with:`
        # (or derived from one) must not reach the child's records in clear.
        self.redact = Redactor([*ports.secret_values.values(), *ports.inherited_secrets])
        self.events: list[dict[str, Any]] = []
        self._unsaved: list[dict[str, Any]] = []
        self._provider: Any = None
        # Bound once: the engine reads the clock at every step and event.
        self._monotonic = ports.clock.monotonic
        self._stamp = ports.clock.utc_now
        self._segment_start = self._monotonic()
        # An in-memory run keeps the ledger's JSON up to date only when it ends or waits.
        self.durable = getattr(ports.run_log, "durable", True)
        # Commands get no declared secret unless their own `env:` passes it (`{X: "{{ secrets.X }}"}`):
        # a command that runs model-written code must not see credentials it was not given.
        self.command_env = {k: v for k, v in ports.env.items() if k not in ports.secret_values}
        # Every command this run starts is recorded there first (commands.py), for `resume`.
        self.commands = RunCommands(run, self.commit, ports.clock.token_hex)
        self.gates = GateRunner(
            self.loop.gates,
            run_shell=self.commands.shell(ports.shell, "gate"),
            monotonic=self._monotonic,
            base_env=self.command_env,
            cwd=ports.workdir,
            redactor=self.redact,
            secret_values=self.redact.values,
            input_facts=input_facts(self.loop),
        )
        self.llm = LlmCaller(
            self.loop, self.ledger, self._get_provider, ports.responses, self._commit_pending, ports.env, ports.use_cache,
            redact=self.redact.redact_obj if self.redact else (lambda value: value),
            count_asked=self._count_asked,
        )
        self.context: dict[str, Any] = {}
        build_context(self)
        settle_completed_call(self)
        account_for_crash(self)

    # ------------------------------------------------------------ plumbing
    def _get_provider(self) -> Any:
        if self._provider is None:
            self._provider = self.ports.provider()
        return self._provider

    def emit(self, type_: str, **data: Any) -> None:
        self.run.seq += 1
        event = {"seq": self.run.seq, "t": self._stamp(), "type": type_, **data}
        if self.redact:
            event = self.redact.redact_obj(event)
            if isinstance(event.get("message"), str):  # error text may quote a secret cut short
                event["message"] = self.redact.error(event["message"])
        if self.ports.keep_events:
            self.events.append(event)
        self._unsaved.append(event)
        for listener in self.ports.listeners:
            listener(event)

    def _active_seconds(self) -> float:
        return self.run.active_s + (self._monotonic() - self._segment_start)

    def commit(self) -> None:
        now = self._monotonic()
        self.run.active_s += now - self._segment_start
        self._segment_start = now
        if self.durable or self.run.status != RUNNING:
            self.run.ledger = self.ledger.to_json()
        # Results were redacted as they were stored (_store_result), events as emitted.
        self.ports.run_log.commit(self.run, self._unsaved)
        self._unsaved = []

    def _commit_pending(self, pending: dict[str, Any] | None) -> None:
        self.run.pending = pending
        self.commit()

    def _count_asked(self, state: str) -> None:
        """How many replies/decisions each state has asked for: a scripted resume skips them."""
        asked = self.run.meta.setdefault("asked", {})
        asked[state] = asked.get(state, 0) + 1
        if self.parent is not None:  # one reply script serves the parent and its children
            self.parent._count_asked(state)

    def _refresh_context(self, state: str, attempt: int) -> dict[str, Any]:
        ctx = self.context
        ctx["feedback"] = self.run.feedback
        ctx["error"] = self.run.error
        ctx["run"] = {"id": self.run.run_id, "date": self.run.date, "attempt": attempt, "visits": self.run.visits.get(state, 0)}
        return ctx

    # ------------------------------------------------------------ the run
    async def execute(self) -> RunState:
        """Run until the loop ends or has to wait; returns the (committed) run state."""
        run = self.run
        await self.commands.stop_leftovers(self.emit)  # what a killed loopdsl left running
        if run.status == WAITING:
            if not resume_waiting(self):
                return run
        try:
            while run.status == RUNNING:
                cstate = self.compiled.states[run.current]
                state = cstate.state
                if state.is_end:
                    self._finish(state.end or FAILED, cstate)
                    break
                if state.max_visits is not None and run.visits.get(state.name, 0) > state.max_visits:
                    self.emit("exhausted", state=state.name, visits=run.visits[state.name])
                    if not self._follow(EXHAUST, state.on_exhausted):
                        self._finish(FAILED, None, error={"state": state.name, "kind": "exhausted",
                                                          "message": f"state '{state.name}' reached max_visits {state.max_visits}"})
                    continue
                await self._run_state(cstate)
        except BudgetExceeded as exc:
            self.emit("budget_exhausted", which=exc.which, message=exc.message, spent=self.ledger.spent())
            self.run.pending = None
            self._finish(BUDGET_EXHAUSTED, None, error={"state": run.current, "kind": "budget", "which": exc.which,
                                                        "message": exc.message})
        except Waiting:
            pass
        except (asyncio.CancelledError, KeyboardInterrupt):
            self._end_abruptly(ABORTED, "interrupted", "the run was interrupted (Ctrl-C or a signal)")
            raise
        except StoreError:
            # The store cannot be read or written (a damaged response, another process took
            # the run over, a full disk): nothing more is written to it; the run is left as
            # its last commit says, for a person to look at, resume or abort.
            raise
        except Exception as exc:
            kind = "reply_script" if isinstance(exc, (ScriptError, ScriptExhausted)) else "internal"
            self._end_abruptly(FAILED, kind, f"{type(exc).__name__}: {exc}")
            raise
        return run

    def _end_abruptly(self, status: str, kind: str, message: str) -> None:
        """Record the end of a run stopped by an exception, so the store never says `running`
        for a run no process drives. Best effort: a failing commit (a full disk, a lost lock)
        must not hide the exception that stopped the run."""
        if self.run.is_final:
            return
        self.run.pending = None
        try:
            self.emit("stopped", state=self.run.current, kind=kind, message=message)
            self._finish(status, None, error={"state": self.run.current, "kind": kind, "message": message})
        except Exception:
            pass

    def _enter(self, dest: str) -> None:
        run = self.run
        run.current = dest
        run.path.append(dest)
        run.visits[dest] = run.visits.get(dest, 0) + 1
        run.pending = None
        self.emit("enter", state=dest, visit=run.visits[dest])
        self.commit()

    def _follow(self, trigger: str, target: str | None) -> bool:
        if target is None:
            return False
        dest = self.compiled.fire(self.run.current, trigger)
        assert dest is not None, f"'{trigger}' from '{self.run.current}' has an unconditional edge"
        self._enter(dest)
        return True

    async def _run_state(self, cs: CompiledState) -> None:
        state = cs.state
        run = self.run
        visit = run.visits.get(state.name, 1)
        pending = run.pending if run.pending and run.pending.get("state") == state.name else None
        attempt = int(pending["attempt"]) if pending else 1
        if pending and pending.get("kind") == "shell":
            await settle_interrupted_command(self, state, pending)
        calls_model = state.kind in ("llm", "evaluate") or (state.kind == "agent" and getattr(state.action, "cli", None) is None)
        if calls_model:
            await self._wait_for_model_client()
        while True:
            if not (pending and pending.get("step_taken") and attempt == int(pending["attempt"])):
                self.ledger.take_step()
                await self.ledger.hold(calls_model=calls_model)
            pending = None
            wall = self.loop.budget.wall_time
            if wall is not None:
                self.ledger.check_wall_time(self._active_seconds())
            ctx = self._refresh_context(state.name, attempt)
            started = self._monotonic()
            spent_before = (self.ledger.tokens_spent, self.ledger.cost_spent)
            self.emit("attempt", state=state.name, visit=visit, attempt=attempt, spent=self.ledger.spent())
            try:
                result = await bounded_attempt(self, cs, ctx, visit, attempt)
            except StepFailure as failure:
                self._account(state.name, started, spent_before)
                if self.redact:  # a template or command error may quote a secret, whole or cut short
                    failure.message = self.redact.error(failure.message)
                if failure.fatal:
                    self._fail_state(state, failure, recoverable=False)
                    return
                retried = failure.kind in state.retry.on and failure.kind not in NEVER_RETRIED
                if retried and attempt + failure.in_place < state.retry.max_attempts:
                    run.feedback = self.redact(failure.message) if self.redact else failure.message
                    delay = backoff_delay(state.retry, attempt, failure.retry_after, self.ports.clock)
                    failed = self._failed_result(failure)
                    run.history.setdefault(state.name, []).append(failed)
                    self.emit("retry", state=state.name, attempt=attempt, kind=failure.kind,
                              message=failure.message, delay_s=round(delay, 3), result=failed,
                              spent=self.ledger.spent())
                    await self._sleep(delay)
                    attempt += 1
                    continue
                self._fail_state(state, failure)
                return
            self._account(state.name, started, spent_before)
            result["ok"] = True
            result["error"] = None
            self._store_result(state.name, result)
            self.emit("ok", state=state.name, attempt=attempt, result=self.run.results[state.name])
            self._route(cs, ctx)
            return

    async def _wait_for_model_client(self) -> None:
        """Wait for the provider's client library (LiteLLM's import, started in the background)
        before the state's clock starts: the wait is charged to neither the state's `timeout`
        and time nor `budget.wall_time`, which pauses for it."""
        provider = self._get_provider()
        loaded = getattr(provider, "loaded", None)
        if loaded is None or loaded():
            return
        self.emit("loading", what="model client")
        paused = self._monotonic()
        await provider.wait_until_loaded()
        self._segment_start += self._monotonic() - paused

    async def _sleep(self, seconds: float) -> None:
        wall = self.loop.budget.wall_time
        if wall is not None and self._active_seconds() + seconds > wall:
            raise BudgetExceeded("wall_time", f"waiting {seconds:.1f}s to retry would pass the wall_time budget of {wall:g}s")
        if self.ports.real_waits:
            await self.ports.clock.sleep(seconds)
        else:
            self._segment_start -= seconds  # not slept, but on the run's clock as if it had been

    def _account(self, name: str, started: float, spent_before: tuple[int, float]) -> None:
        """Per-state totals from the ledger's own movement: covers model calls, sub-loops'
        spending and reservations charged for killed calls alike."""
        totals = self.run.usage.setdefault(name, {"tokens": 0, "cost_usd": 0.0, "seconds": 0.0, "attempts": 0})
        totals["attempts"] += 1
        totals["seconds"] = round(totals["seconds"] + self._monotonic() - started, 6)
        totals["tokens"] += self.ledger.tokens_spent - spent_before[0]
        totals["cost_usd"] = round(totals["cost_usd"] + self.ledger.cost_spent - spent_before[1], 12)

    def _store_result(self, name: str, result: dict[str, Any]) -> None:
        if self.redact:
            result = self.redact.redact_obj(result)
        self.run.results[name] = result
        self.run.history.setdefault(name, []).append(result)
        self.context[name] = result

    def _failed_result(self, failure: StepFailure) -> dict[str, Any]:
        result = dict(failure.result or {})
        result.update(ok=False, error={"kind": failure.kind, "message": failure.message})
        return self.redact.redact_obj(result) if self.redact else result

    def _fail_state(self, state: State, failure: StepFailure, *, recoverable: bool = True) -> None:
        run = self.run
        if self.redact:
            failure.message = self.redact.error(failure.message)
        error = {"state": state.name, "kind": failure.kind, "message": failure.message}
        if self.redact:
            error = self.redact.redact_obj(error)
        self._store_result(state.name, self._failed_result(failure))
        run.error = error
        run.feedback = self.redact(failure.message) if self.redact else failure.message
        self.emit("failed", **error, result=self.run.results[state.name], spent=self.ledger.spent())
        if not recoverable or not self._follow(FAIL, state.on_failure):
            self._finish(FAILED, None, error=error)

    def _route(self, cs: CompiledState, ctx: dict[str, Any]) -> None:
        state = cs.state
        run = self.run
        if state.next:
            trigger = NEXT
        elif state.transitions:
            trigger = ROUTE
        else:
            self._fail_state(state, StepFailure("no_transition", f"state '{state.name}' has no next state"), recoverable=False)
            return
        try:
            dest = self.compiled.fire(run.current, trigger, ctx)
        except RenderError as exc:
            self._fail_state(state, StepFailure("no_transition", f"a `when` guard of '{state.name}' failed: {exc}"))
            return
        if dest is None:  # DSL: no matching guard ends the run failed
            self._fail_state(state, StepFailure("no_transition", f"no `when` of '{state.name}' matched and it has no default"),
                             recoverable=False)
            return
        run.feedback = run.results[state.name].get("feedback", "") if state.kind == "evaluate" else ""
        run.error = None
        self._enter(dest)

    # ------------------------------------------------------------ attempts
    async def _action(self, cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> dict[str, Any]:
        state = cs.state
        kind = state.kind
        if kind == "set":
            return set_values(cs, ctx)
        if kind == "shell":
            return await run_shell_state(self, cs, ctx, visit, attempt)
        if kind in ("llm", "evaluate"):
            return await run_llm_state(self, cs, ctx, visit, attempt)
        if kind == "agent":
            from .actions.agent import run_agent  # agent states are rare: most runs never load the turn loop

            return await run_agent(self, cs, ctx, visit, attempt)
        if kind == "checkpoint":
            return await checkpoint(self, cs, ctx)
        if kind == "loop":
            from .actions.subloop import run_child_state

            return await run_child_state(self, cs, ctx, attempt)
        raise StepFailure("no_transition", f"state kind '{kind}' cannot run")

    # ------------------------------------------------------------ ending
    def _finish(self, status: str, cs: CompiledState | None, error: dict[str, Any] | None = None) -> None:
        run = self.run
        run.status = status
        if error is not None:
            run.error = error
        run.outputs, problems = render_outputs(self, cs)
        if problems and status == COMPLETED:
            status = run.status = FAILED
            run.error = {"state": run.current, "kind": "output", "message": "; ".join(problems)}
            if self.redact:
                run.error = self.redact.redact_obj(run.error)
        if self.redact:
            run.outputs = self.redact.redact_obj(run.outputs)
        run.ended_at = self._stamp()
        self.emit("end", status=status, state=run.current, outputs=run.outputs, spent=self.ledger.spent())
        self.commit()
