"""An `agent: {cli: claude-code | codex}` attempt: a coding-agent CLI run in the workspace
instead of the turn loop (DSL.md, v1.1 precise rules, "Coding-agent CLIs").

The CLI spends on its own key before it reports, so the cap is kept by reservation:
`max_cost_usd` is reserved (and committed) before the CLI starts; its spend is charged as
its events arrive, and reaching the reservation kills its process group. Spend reported
past the reservation is recorded as `overspend_usd` and ends the run `budget_exhausted`.
The CLI itself runs through the `coding_cli` port (adapters/coding_cli.py, given by the API).

A CLI cut off by a crash is never resumed mid-way (its session is not ours to continue):
its spend stands (the reservation left open in the saved ledger is charged in full on
reload, which covers every usage event committed before the kill), what is left of its
process group is killed, and it runs again only when the state is `idempotent: true`;
otherwise a person chooses `rerun`, `skip` (the state completes with no answer, `stop:
interrupted`) or `fail`, and an `unattended` loop fails the attempt with kind `interrupted`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...language.agent_model import AgentAction
from ...language.compile import CompiledState
from ..budget import BudgetExceeded
from ..errors import StepFailure
from .checkpoint import wait_for_person
from .llm import render_or_fail

if TYPE_CHECKING:
    from ..engine import Engine


async def run_cli_agent(engine: "Engine", cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> dict[str, Any]:
    action = cs.state.action
    assert isinstance(action, AgentAction) and cs.prompt is not None
    runner = engine.ports.coding_cli
    if runner is None or action.max_cost_usd is None:
        raise StepFailure("parse", f"agent '{cs.state.name}': a `cli:` agent needs `max_cost_usd` and a CLI runner")
    cut_off = await _settle_cut_off(engine, cs, visit, attempt)
    if cut_off is not None:
        return cut_off
    prompt = render_or_fail(cs.prompt, ctx, f"rendering the prompt of '{cs.state.name}'")
    reservation = engine.ledger.reserve(0, action.max_cost_usd, label=f"{cs.state.name}#{visit}.{attempt} {action.cli}")
    pending = {"kind": "cli", "state": cs.state.name, "visit": visit, "attempt": attempt, "step_taken": True,
               "reserved": {"tokens": 0, "cost_usd": action.max_cost_usd}}
    engine._commit_pending(pending)
    log = CliLog(engine, cs.state.name, attempt, str(action.cli))
    charged = [0.0]

    def charge(delta_usd: float) -> bool:
        delta = max(float(delta_usd), 0.0)
        charged[0] += delta
        within = charged[0] < action.max_cost_usd  # type: ignore[operator]
        if delta > 0:  # committed as it arrives: a crash cannot make a reported charge vanish
            pending["charged_usd"] = round(charged[0], 12)
            log.charged(delta, charged[0], action.max_cost_usd, within)  # type: ignore[arg-type]
            engine._commit_pending(dict(pending))  # the charge event with it, in one commit
        return within

    refs: list[Any] = []

    def on_start(ref: Any) -> None:
        refs.append(ref)
        pending["command"] = ref.to_json()
        engine.run.pending = dict(pending)
        engine.commands.started(ref, "cli")  # commits both

    try:
        result = await runner(action=action, alias=engine.loop.models.get(action.model), prompt=prompt,
                              workspace=engine.ports.workdir, redactor=engine.redact, env=engine.ports.env,
                              timeout=cs.state.timeout, charge=charge, on_start=on_start,
                              on_event=log.on_event)
    except BaseException:
        engine.ledger.charge_reservation(reservation)  # it may have spent all of it
        raise
    finally:
        engine.commands.ended(refs[0] if refs else None)
    return _settle(engine, cs, attempt, reservation, result, log.calls)


def _settle(engine: "Engine", cs: CompiledState, attempt: int, reservation: Any, result: dict[str, Any],
            calls: list[dict[str, Any]]) -> dict[str, Any]:
    usage = result.get("usage") or {}
    tokens = int(usage.get("prompt_tokens", 0)) + int(usage.get("completion_tokens", 0))
    engine.ledger.settle(reservation, tokens, float(result.get("cost_usd") or 0.0))
    engine.emit("llm", state=cs.state.name, attempt=attempt, model=result.get("model") or cs.state.action.cli,  # type: ignore[union-attr]
                usage={"prompt_tokens": usage.get("prompt_tokens", 0), "completion_tokens": usage.get("completion_tokens", 0)},
                cost_usd=result.get("cost_usd"), cli=True, spent=engine.ledger.spent(),
                error_kind=result.get("kind"),
                **{k: result.get(k) for k in ("stop", "turns", "exit_code", "duration_s") if k in result})
    shaped = {"text": result.get("text") or "", "json": None, "stop": result.get("stop"), "turns": result.get("turns", 0),
              "model": result.get("model"), "usage": usage, "cost_usd": result.get("cost_usd"),
              "overspend_usd": result.get("overspend_usd", 0.0), "tool_calls": calls}
    overspend = float(result.get("overspend_usd") or 0.0)
    if result.get("kind") == "budget_exhausted" or overspend > 0:
        if overspend > 0:  # the one documented way past a cap: recorded and shown, never hidden
            engine.run.meta["overspend_usd"] = round(float(engine.run.meta.get("overspend_usd", 0.0)) + overspend, 12)
            engine.emit("overspend", state=cs.state.name, overspend_usd=overspend, cost_usd=result.get("cost_usd"))
        note = f" (overspend ${overspend:.6f})" if overspend > 0 else ""
        raise BudgetExceeded("cost_usd", f"agent '{cs.state.name}' ({cs.state.action.cli}): "  # type: ignore[union-attr]
                             f"{result.get('error') or 'the CLI reached its max_cost_usd'}{note}")
    if result.get("kind"):
        raise StepFailure(str(result["kind"]), str(result.get("error") or result["kind"]), result=shaped)
    return shaped


class CliLog:
    """The CLI's progress in the run's event log, shaped as an agent's own: `tool_started`
    and `tool_call` for each tool use (the port hands them over already redacted and capped,
    see adapters/coding_cli_tools.py), and `cli_charge` for each charge of its spend."""

    def __init__(self, engine: "Engine", state: str, attempt: int, cli: str) -> None:
        self.engine, self.state, self.attempt, self.cli = engine, state, attempt, cli
        self.calls: list[dict[str, Any]] = []  # the result's `tool_calls`, in an agent's record shape

    def on_event(self, payload: dict[str, Any]) -> None:
        notes = payload.get("tools") if isinstance(payload.get("tools"), list) else []
        finished = False
        for note in notes:
            kind = note.get("type")
            if kind not in ("tool_started", "tool_call"):
                continue
            fields = {k: v for k, v in note.items() if k != "type"}
            self.engine.emit(kind, state=self.state, attempt=self.attempt, cli=self.cli, **fields)
            if kind == "tool_call":
                finished = True
                self.calls.append({"id": note.get("id"), "turn": note.get("turn"), "name": note.get("name"),
                                   "args": None, "ok": bool(note.get("ok")), "error": note.get("error"),
                                   "result": None, "truncated": bool(note.get("truncated")),
                                   "duration_s": note.get("duration_s")})
        if finished:  # a finished tool use is kept at once, as an agent's own are
            self.engine.commit()

    def charged(self, delta_usd: float, total_usd: float, reserved_usd: float, within: bool) -> None:
        """Emitted before the caller commits the charge, so both are kept or neither."""
        self.engine.emit("cli_charge", state=self.state, attempt=self.attempt, cli=self.cli,
                         delta_usd=round(delta_usd, 12), charged_usd=round(total_usd, 12),
                         reserved_usd=reserved_usd, **({} if within else {"at_reservation": True}))


CUT_OFF_CHOICES = ("rerun", "skip", "fail")


async def _settle_cut_off(engine: "Engine", cs: CompiledState, visit: int, attempt: int) -> dict[str, Any] | None:
    """Before a CLI attempt that a crash cut off runs again (its leftover process group is
    already stopped: RunCommands.stop_leftovers, when the resumed run starts): rerun (None),
    or a person's `skip` (the result to complete with) or `fail` (raises)."""
    prior = engine.run.pending
    if not (prior and prior.get("kind") == "cli" and prior.get("state") == cs.state.name
            and prior.get("visit") == visit and prior.get("attempt") == attempt):
        return None
    if cs.state.idempotent:
        return None
    action = cs.state.action
    message = (f"agent '{cs.state.name}': its {getattr(action, 'cli', 'CLI')} run was cut off by a crash "
               f"(${float(prior.get('charged_usd') or 0.0):.6f} reported before it; its reservation stays spent) "
               "and the state is not idempotent; rerun it, skip it (the state completes with no answer) or fail")
    decision = engine.run.decision
    if decision is None or decision.get("decision") not in CUT_OFF_CHOICES:
        if engine.loop.unattended:
            raise StepFailure("interrupted", message)
        wait_for_person(engine, cs.state, reason="cli_interrupted", message=message, choices=CUT_OFF_CHOICES, timeout=None)
    engine.run.decision = None
    assert decision is not None
    if decision["decision"] == "fail":
        raise StepFailure("interrupted", f"agent '{cs.state.name}': a person chose to fail after its CLI run was cut off")
    if decision["decision"] == "rerun":
        return None
    return {"text": "", "json": None, "stop": "interrupted", "turns": 0, "model": None, "usage": {},
            "cost_usd": None, "overspend_usd": 0.0, "tool_calls": []}
