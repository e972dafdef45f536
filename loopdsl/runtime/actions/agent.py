"""One attempt of an `agent` state: turns of model calls and the tool calls they ask for.

Durability is replay: the first request (messages and tool definitions) is stored before
turn 1, each turn's reply is stored before its tool calls run (agent_turns.py), and each
tool call is recorded `started` before it runs and `done` with what the model saw after.
A resumed attempt runs the same loop again from the stored first request: stored replies
are not paid again, finished calls are not run again, and a call that was started but
never finished is killed if still running, then run again only if its tool is idempotent;
otherwise a person decides (rerun, skip, fail), or in an unattended loop the attempt fails
with kind `interrupted`. A recorded call whose arguments differ from the stored reply's
fails the run (agent_resume.py).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...language import bounded_json
from ..run_state import checked_response
from ...language.agent_model import AgentAction, ToolDef, ToolUse, resolve_tool
from ...language.compile import CompiledState, input_facts
from ..budget import BudgetExceeded
from ..errors import StepFailure
from ..tools.base import ToolBox, ToolOutcome, ToolSpec, safe_output
from ..tools.registry import ToolEnv, factory_for, group_by_kind
from .agent_turns import TurnCaller, agent_key
from .agent_resume import args_hash, cut_off, same_call
from .agent_workspace import AttemptWorkspace
from .checkpoint import wait_for_person
from .llm import llm_result, render_or_fail

if TYPE_CHECKING:
    from ..engine import Engine


class AgentAttempt:
    def __init__(self, engine: "Engine", cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> None:
        action = cs.state.action
        assert isinstance(action, AgentAction)
        self.engine, self.cs, self.ctx, self.action = engine, cs, ctx, action
        self.state = cs.state
        self.ids = {"run": engine.run.run_id, "state": cs.state.name, "visit": visit, "attempt": attempt}
        self.store = engine.ports.responses
        self.turns = TurnCaller(engine, action, self.ids)
        self.messages: list[dict[str, Any]] = []
        self.definitions: list[dict[str, Any]] = []
        self.boxes: dict[str, ToolBox] = {}
        self.specs: dict[str, ToolSpec] = {}
        self.uses: dict[str, ToolUse] = {}
        self.owners: dict[str, tuple[ToolDef, ToolUse]] = {}  # offered name -> its tool and listing
        self.calls: list[dict[str, Any]] = []
        self.usage = {"prompt_tokens": 0, "completion_tokens": 0}
        self.cost = 0.0
        self.models: list[str] = []
        self.turn = 0
        self.text = ""
        self.ready = False  # `_tools_ready` has run

    # ------------------------------------------------------------ the attempt
    async def run(self) -> dict[str, Any]:
        opened: list[ToolBox] = []
        try:
            stored = self._stored(agent_key("start", **self.ids), "agent_start")
            await self._open_tools(opened, None if stored is None else stored["tools"])
            self._first_request(stored)
            return await self._conversation()
        finally:
            for box in opened:
                try:
                    await box.aclose()
                except Exception:  # noqa: BLE001 - closing a tool must not hide the attempt's own outcome
                    pass

    async def _conversation(self) -> dict[str, Any]:
        reasked = False
        max_turns = self.action.max_turns or 1
        while self.turn < max_turns:
            self.turn += 1
            reply = await self._paid_turn()
            calls = reply.get("tool_calls") or []
            self.messages.append(_assistant_message(reply))
            if calls:
                await self._run_calls(calls, run=self.turn < max_turns)
                continue
            if reply.get("finish_reason") == "length":
                raise StepFailure("parse", "the answer was cut off at max_tokens", result=self.result("error"))
            try:
                parsed = llm_result(self.action, reply)  # type: ignore[arg-type]  (an agent answers like `llm`)
            except StepFailure as failure:
                if reasked or self.turn >= max_turns:
                    failure.result = self.result("error")
                    raise
                reasked = True  # once: the error goes back to the model, using a turn
                self.messages.append({"role": "user", "content": f"{failure.message}. Answer again, correctly."})
                continue
            result = self.result("answer")
            result["json"] = parsed.get("json")
            return result
        raise StepFailure("max_turns", f"agent '{self.state.name}' used all {max_turns} turns without a final answer",
                          result=self.result("max_turns"))

    async def _paid_turn(self) -> dict[str, Any]:
        engine = self.engine
        before = (engine.ledger.tokens_spent, engine.ledger.cost_spent)
        try:
            reply = await self.turns.turn(self.turn, self.messages, self.definitions)
        except StepFailure as failure:
            tokens, cost = engine.ledger.tokens_spent - before[0], engine.ledger.cost_spent - before[1]
            if tokens > 0 or cost > 0:  # charged though it failed (a timeout): shown beside the paid turns
                engine.emit("llm", state=self.state.name, attempt=self.ids["attempt"], turn=self.turn, failed=failure.kind,
                            model=self.turns.chain[self.turns.start], charged={"tokens": tokens, "cost_usd": cost},
                            usage=None, cost_usd=cost, spent=engine.ledger.spent())
                self.cost += cost
            failure.result = self.result("error")
            raise
        usage = reply.get("usage") or {}
        for key in self.usage:
            self.usage[key] += int(usage.get(key, 0))
        self.cost += float(reply.get("cost_usd") or 0.0)
        model = str(reply.get("model") or self.turns.chain[self.turns.start])
        self.models.append(model)
        self.text = str(reply.get("text") or "")
        engine.emit("llm", state=self.state.name, attempt=self.ids["attempt"], turn=self.turn, model=model,
                    usage=reply.get("usage"), cost_usd=reply.get("cost_usd"), replayed=bool(reply.get("replayed")),
                    cached=False, tool_calls=len(reply.get("tool_calls") or []), spent=engine.ledger.spent(),
                    key=self.turns.key(self.turn, int(reply.get("fallback", self.turns.start))))
        return reply

    def result(self, stop: str) -> dict[str, Any]:
        return {"text": self.text, "json": None, "stop": stop, "turns": self.turn,
                "model": self.models[-1] if self.models else self.turns.chain[self.turns.start],
                "models": list(dict.fromkeys(self.models)), "usage": dict(self.usage),
                "cost_usd": round(self.cost, 12), "tool_calls": list(self.calls)}

    # ------------------------------------------------------------ first request
    def _first_request(self, stored: dict[str, Any] | None) -> None:
        """Stored before turn 1; a resumed attempt reads it back and never renders again."""
        key = agent_key("start", **self.ids)
        if stored is not None:
            self.messages = [dict(m) for m in stored["messages"]]
            self.definitions = [dict(d) for d in stored["tools"]]
            return
        cs, engine = self.cs, self.engine
        assert cs.prompt is not None
        prompt = render_or_fail(cs.prompt, self.ctx, f"rendering the prompt of '{self.state.name}'")
        system = render_or_fail(cs.system, self.ctx, "rendering the system text") if cs.system else None
        skill = engine.ports.skills.get(self.action.skill, "") if self.action.skill else ""
        self.messages = [dict(m) for m in engine.llm.messages(self.action, prompt, system, skill)]  # type: ignore[arg-type]
        self.definitions = [spec.definition() for spec in self.specs.values()]
        record = {"messages": self.messages, "tools": self.definitions}
        self.store.put_response(key, engine.redact.redact_obj(record) if engine.redact else record)
        engine.commit()

    async def _open_tools(self, opened: list[ToolBox], stored: list[dict[str, Any]] | None) -> None:
        engine, loop = self.engine, self.engine.loop
        listed = []
        for use in self.action.tools:
            tool = resolve_tool(loop.tools, use.name)
            if tool is None:  # lint's unknown-tool, again for a loop that reached the engine unlinted
                raise StepFailure("parse", f"agent '{self.state.name}' lists unknown tool '{use.name}'")
            listed.append((tool, use))
            self.uses[use.name] = use
        env = self._tool_env(stored)
        for kind, group in group_by_kind(listed).items():
            factory = factory_for(kind, engine.ports.tool_kinds)
            if factory is None:
                raise StepFailure("parse", f"tools of kind '{kind}' cannot run here ({', '.join(t.name for t, _ in group)})")
            box = await factory(group, env)
            opened.append(box)
            for spec in box.specs():
                if spec.name in self.specs:  # lint's duplicate-tool-name, for a loop that reached the engine unlinted
                    raise StepFailure("parse", f"agent '{self.state.name}' is offered two tools named '{spec.name}'")
                self.boxes[spec.name] = box
                self.specs[spec.name] = spec
            for tool, use in group:  # which listing each offered name comes from (MCP: `<entry>__<tool>`)
                for offered in tool.offered_names():
                    self.owners[offered] = (tool, use)

    def _tool_env(self, stored: list[dict[str, Any]] | None) -> ToolEnv:
        engine = self.engine
        return ToolEnv(
            workdir=engine.ports.workdir, env=engine.ports.env, secret_values=engine.ports.secret_values,
            redact=engine.redact if engine.redact else (lambda text: text),
            output_limit=self.action.tool_output_limit, action=self.action, worktree=engine.loop.workspace.worktree,
            inputs=engine.run.inputs, run={"id": engine.run.run_id, "date": engine.run.date},
            shell=engine.commands.shell(engine.ports.shell, "tool"), commands=engine.commands,
            facts=input_facts(engine.loop), on_process=self._process_started, redactor=engine.redact,
            stored_definitions=stored, engine=engine, ids=self.ids)

    # ------------------------------------------------------------ tool calls
    async def _run_calls(self, calls: list[dict[str, Any]], *, run: bool) -> None:
        """One tool message per call id, in the reply's order, whatever became of the others."""
        in_turn = 0
        for call in calls:
            attempt_calls = sum(1 for c in self.calls if c.get("error") not in ("not_run", "limit"))
            if not run:
                record, content = self._unrun(call, "not_run")
            elif in_turn >= self.action.max_tool_calls_per_turn or attempt_calls >= self.action.max_tool_calls:
                record, content = self._unrun(call, "limit")
            else:
                in_turn += 1
                record, content = await self._call_tool(call)
            self.calls.append(record)
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})

    def _unrun(self, call: dict[str, Any], why: str) -> tuple[dict[str, Any], str]:
        record = _record(call, self.turn, None, ToolOutcome.failure(why))
        return record, json.dumps({"error": why})

    def _stored(self, key: str, kind: str) -> dict[str, Any] | None:
        return checked_response(self.store.get_response(key), kind, self.ids["run"])

    def _tool_key(self, call_id: str) -> str:
        return agent_key("tool", **self.ids, turn=self.turn, call=call_id)

    async def _call_tool(self, call: dict[str, Any]) -> tuple[dict[str, Any], str]:
        key = self._tool_key(call["id"])
        stored = self._stored(key, "agent_tool")
        if stored is not None:
            await same_call(self, stored, call)
            if stored.get("status") == "done":
                return dict(stored["record"]), str(stored["content"])
        name = str(call.get("name"))
        args, problem = _parse_args(call.get("arguments"))
        box = self.boxes.get(name)
        if box is None:
            problem = f"unknown tool {name!r}; the tools are: {', '.join(self.specs)}"
        if problem is not None:
            return self._finish_call(key, call, args, ToolOutcome.failure(problem))
        if stored is not None:
            settled = await cut_off(self, stored, name, call)
            if settled == "skip":
                return self._finish_call(key, call, args, ToolOutcome.failure("interrupted"))
            if settled == "done":  # an edit_file the crash cut off after it wrote the file
                done = {"path": str((args or {}).get("path")), "sha256": stored["edit_sha256"]}
                return self._finish_call(key, call, args, ToolOutcome(ok=True, result=done))
        if stored is None and self._needs_approval(name):
            refused = await self._approval(name, call, args)
            if refused is not None:
                return self._finish_call(key, call, args, ToolOutcome.failure(refused))
        await self._tools_ready()
        started = {"status": "started", "args_hash": args_hash(call)}
        planned = getattr(box, "planned_edit", None) if name == "edit_file" else None
        if planned is not None:  # the file's hash once this edit is done: a resume can tell it happened
            started["edit_sha256"] = planned(args)
        self.store.put_response(key, started)
        self.engine.run.pending = {"kind": "agent_tool", "state": self.state.name, "visit": self.ids["visit"],
                                   "attempt": self.ids["attempt"], "step_taken": True, "call": call["id"]}
        self.engine.emit("tool_started", state=self.state.name, attempt=self.ids["attempt"], turn=self.turn,
                         id=call["id"], name=name, args_hash=started["args_hash"],
                         **({"edit_sha256": started["edit_sha256"]} if started.get("edit_sha256") else {}))
        self.engine.commit()
        assert args is not None and box is not None
        owner = self.owners.get(name)
        timeout = owner[0].timeout if owner is not None else 120.0
        try:
            outcome = await box.call(name, args, call_id=call["id"], timeout=timeout)
        except BudgetExceeded:
            raise  # a sub-loop tool's child ran out of the shared budget: the run ends
        except Exception as exc:  # noqa: BLE001 - a tool's bug goes back to the model, never crashes the run
            outcome = ToolOutcome.failure(f"{name} failed: {type(exc).__name__}: {exc}")
        return self._finish_call(key, call, args, outcome)

    async def _tools_ready(self) -> None:
        """Before the attempt's first tool runs, what its tools take at the start is taken
        (the workspace tools' git listing runs behind the first turn)."""
        if self.ready:
            return
        for box in {id(b): b for b in self.boxes.values()}.values():
            ready = getattr(box, "ready", None)
            if ready is not None:
                await ready()
        self.ready = True

    def _needs_approval(self, name: str) -> bool:
        tool, use = self.owners.get(name, (None, None))
        return bool((use is not None and use.approve) or (tool is not None and tool.kind != "builtin" and tool.approve))

    async def _approval(self, name: str, call: dict[str, Any], args: Any) -> str | None:
        """None when a person approved the call; else the error the model is told."""
        engine = self.engine
        decision = engine.run.decision
        if decision is None or decision.get("decision") not in ("approve", "reject"):
            shown = json.dumps(engine.redact.redact_obj(args) if engine.redact else args, ensure_ascii=False)
            message = (f"agent '{self.state.name}' asks to call {name} (call {call['id']}) with "
                       f"{shown[:2000]}; approve to run it, reject to tell the model no")
            asked = engine._monotonic()
            decision = await engine.ports.human.decide(self.state.name, message, ("approve", "reject"))
            engine._segment_start += engine._monotonic() - asked  # a person's time is not run time
            if decision is None:
                wait_for_person(engine, self.state, reason="tool_approval", message=message,
                                choices=("approve", "reject"), timeout=None)
        engine.run.decision = None
        assert decision is not None
        engine.emit("decided", state=self.state.name, decision=decision.get("decision"), call=call["id"],
                    comment=decision.get("comment", ""), by=decision.get("by") or "unknown")
        if decision.get("decision") == "approve":
            return None
        return f"rejected: {decision.get('comment') or 'a person declined this call'}"

    def _process_started(self, call_id: str, ref: dict[str, Any]) -> None:
        key = self._tool_key(call_id)
        record = self._stored(key, "agent_tool") or {"status": "started"}
        record["process"] = ref
        self.store.put_response(key, record)

    def _finish_call(self, key: str, call: dict[str, Any], args: Any, outcome: ToolOutcome) -> tuple[dict[str, Any], str]:
        engine = self.engine
        redact = engine.redact if engine.redact else (lambda text: text)
        content, cut = safe_output(tool_content(outcome), limit=2 * self.action.tool_output_limit, redact=redact)
        outcome.truncated = outcome.truncated or cut
        record = _record(call, self.turn, engine.redact.redact_obj(args) if engine.redact else args, outcome)
        self.store.put_response(key, {"status": "done", "args_hash": args_hash(call), "record": record, "content": content})
        engine.emit("tool_call", state=self.state.name, attempt=self.ids["attempt"], turn=self.turn, id=record["id"],
                    name=record["name"], summary=_summary(record["args"]), ok=record["ok"], error=record["error"],
                    truncated=record["truncated"], duration_s=record["duration_s"])
        engine.commit()
        return record, content

def tool_content(outcome: ToolOutcome) -> str:
    """What the model reads: the result, or `{"error": ...}` (with the output, when the
    tool produced some before failing, e.g. a test run's exit code and log)."""
    if outcome.ok or outcome.result is None:
        return outcome.message_content()
    detail = outcome.result if isinstance(outcome.result, dict) else {"result": outcome.result}
    return json.dumps({"error": outcome.error, **detail}, ensure_ascii=False)


def _parse_args(raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    try:
        args = bounded_json.loads(raw if isinstance(raw, str) else json.dumps(raw))
    except (ValueError, bounded_json.JsonLimitError) as exc:
        return None, f"the arguments are not valid JSON: {exc}"
    if not isinstance(args, dict):
        return None, "the arguments must be a JSON object"
    if bounded_json.has_lone_surrogate(args):  # no tool could be given such text (a pipe, a file, a server)
        return None, "the arguments hold a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text"
    return args, None


def _record(call: dict[str, Any], turn: int, args: Any, outcome: ToolOutcome) -> dict[str, Any]:
    return {"id": str(call.get("id")), "turn": turn, "name": str(call.get("name")), "args": args,
            "ok": outcome.ok, "error": outcome.error, "result": outcome.result if outcome.ok else None,
            "truncated": outcome.truncated, "duration_s": round(outcome.duration_s, 4)}


def _summary(args: Any) -> str:
    """The first string argument, shortened, for progress lines (`tool read_file src/x.py ok`)."""
    if isinstance(args, dict):
        for value in args.values():
            if isinstance(value, str):
                return value if len(value) <= 60 else value[:57] + "..."
    return ""


def _assistant_message(reply: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("text") or None}
    calls = reply.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return message


async def run_agent(engine: "Engine", cs: CompiledState, ctx: dict[str, Any], visit: int, attempt: int) -> dict[str, Any]:
    ids = {"run": engine.run.run_id, "state": cs.state.name, "visit": visit, "attempt": attempt}
    workspace = AttemptWorkspace(engine, ids, cs.state.retry.reset_workspace)
    await workspace.begin()
    if cs.state.action.cli is not None:  # type: ignore[union-attr]
        from .agent_cli import run_cli_agent

        return await workspace.around(run_cli_agent(engine, cs, ctx, visit, attempt))
    return await workspace.around(AgentAttempt(engine, cs, ctx, visit, attempt).run())
