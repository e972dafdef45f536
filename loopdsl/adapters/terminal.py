"""What a run shows a person: live progress on stderr, the final summary, `show` and `runs`."""
from __future__ import annotations

import json
import shlex
import sys
from typing import IO, Any, Mapping

from ..runtime.run_state import IN_MEMORY_PREFIX, RunState
from ..language.terminal_safe import visible


def _money(value: Any) -> str:
    amount = float(value or 0)
    return f"${amount:.6f}" if 0 < amount < 0.01 else f"${amount:.4f}"


class Progress:
    """One line per event that matters, on stderr, with spend against each cap.

    The figures are the ledger's, carried by the events (`spent`), never summed here: a
    call charged without a reply (a timeout) or spending restored on resume counts the same
    as in the summary. A `start` or `resume` event carries the caps."""

    def __init__(self, budget: Mapping[str, Any], stream: IO[str] | None = None):
        self.budget = dict(budget)
        self.stream = stream or sys.stderr
        self.spent: Mapping[str, Any] = {}

    def _spend(self) -> str:
        parts = []
        cap_tokens, cap_cost, cap_steps = self.budget.get("tokens"), self.budget.get("cost_usd"), self.budget.get("steps")
        spent = self.spent
        parts.append(f"tokens {int(spent.get('tokens', 0))}" + (f"/{cap_tokens}" if cap_tokens is not None else ""))
        parts.append(f"cost {_money(spent.get('cost_usd'))}" + (f"/{_money(cap_cost)}" if cap_cost is not None else ""))
        parts.append(f"steps {int(spent.get('steps', 0))}" + (f"/{cap_steps}" if cap_steps is not None else ""))
        return " | ".join(parts)

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if isinstance(event.get("caps"), Mapping):
            self.budget = dict(event["caps"])
        if isinstance(event.get("spent"), Mapping):
            self.spent = event["spent"]
        line = None
        if kind == "attempt":
            attempt = event.get("attempt", 1)
            line = f"→ {event['state']}" + (f" (attempt {attempt})" if attempt > 1 else "")
        elif kind == "llm" and event.get("failed"):
            line = f"  llm {event.get('model')}: {_charged_failure(event)}   [{self._spend()}]"
        elif kind == "llm":
            usage = event.get("usage") or {}
            note = " (replayed: already paid)" if event.get("replayed") else " (cached)" if event.get("cached") else ""
            line = f"  llm {event.get('model')}: {usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens, {_money(event.get('cost_usd'))}{note}   [{self._spend()}]"
        elif kind == "gate":
            mark = "pass" if event.get("passed") else "FAIL"
            line = f"  {event['phase']}-gate {event['gate']}: {mark}"
            if not event.get("passed"):
                # The message's first line says what failed; its tail (test output, the
                # schema error) is what a person needs to see: show a few lines of both.
                line += ": " + _some_lines(event.get("message", ""))
        elif kind == "tool_call":
            line = f"  {tool_line(event)}"
        elif kind == "cli_charge" and event.get("at_reservation"):
            line = (f"  {event.get('cli')} reached its reservation ({_money(event.get('charged_usd'))} of "
                    f"{_money(event.get('reserved_usd'))}): its process group is killed")
        elif kind == "turn_retry":
            line = f"  turn {event.get('turn')} retried in {event.get('delay_s')}s after {event.get('kind')}"
        elif kind == "retry":
            line = f"  retry in {event['delay_s']}s after {event['kind']}: {_first_line(event.get('message', ''))}"
        elif kind == "failed":
            line = f"  ✗ {event['state']} failed ({event['kind']}): {_first_line(event.get('message', ''))}"
        elif kind == "exhausted":
            line = f"  {event['state']} reached max_visits"
        elif kind == "budget_exhausted":
            line = f"  budget exhausted ({event['which']}): {event['message']}   [{self._spend()}]"
        elif kind == "waiting":
            line = f"  waiting for a person at '{event['state']}': {event['message']}"
        elif kind == "resume":
            line = f"resuming at '{event['from_state']}'   [{self._spend()}]"
        elif kind == "stopped_leftover":
            what = f"the {event['what']} command" if event.get("what") else "the command"  # runtime/commands.py
            line = f"  stopped {what} of '{event['state']}' left running (process group {event['pgid']}) before going on"
        elif kind == "loading":
            line = f"loading {event.get('what', 'model client')}..."
        elif kind in ("notified", "notify_failed"):
            line = "  " + notify_line(event)
        elif kind in PUBLISH_EVENTS:
            line = "  " + publish_line(event)
        elif kind == "child":
            inner = event.get("event", {})
            if inner.get("type") == "end":
                line = f"  sub-loop {event['run_id']} ended {inner.get('status')}"
        if line:
            print(visible(line), file=self.stream, flush=True)


def notify_line(event: Mapping[str, Any]) -> str:
    """A `notify:` send or its failure (the event names the target, never its URL)."""
    if event.get("type") == "notified":
        return f"notified {event.get('to')} ({event.get('status')})"
    return f"notify {event.get('to')} FAILED ({event.get('status')}): {_first_line(str(event.get('message', '')))}"


def _publish_summary(state: Any) -> list[str]:
    """What the run's `publish:` wrote (meta.publish, runtime/publish_apply.py), or has left to write."""
    record = state.meta.get("publish")
    if not isinstance(record, dict) or state.status != "completed":
        return []
    done = [(item, result) for item, result in zip(record.get("items") or [], record.get("results") or []) if result]
    lines = [f"published {item['kind']}" + (f" #{result['number']}" if result.get("number") else "")
             + f" ({result.get('action')}) {result.get('url') or ''}".rstrip() for item, result in done]
    if record.get("status") == "failed":
        lines.append(f"publish FAILED: {_first_line(str(record.get('error', '')), 400)}")
    if record.get("status") != "done":
        lines.append(f"publish not finished: loopdsl resume {state.run_id} makes the writes left")
    return lines


PUBLISH_EVENTS = ("publish_planned", "publish_intent", "published", "publish_failed")


def publish_line(event: Mapping[str, Any]) -> str:
    """One step of `publish:` (runtime/publish_apply.py): planned, about to write, written, failed."""
    kind = event.get("type")
    if kind == "publish_planned":
        return f"publish planned: {', '.join(map(str, event.get('writes') or []))}"
    if kind == "publish_intent":
        on = f" on #{event['number']}" if event.get("number") else ""
        return f"publishing {event.get('kind')}{on}..."
    if kind == "published":
        where = f" #{event['number']}" if event.get("number") else ""
        return f"published {event.get('kind')}{where} ({event.get('action')}) {event.get('url') or ''}".rstrip()
    message = str(event.get("message", "")).removeprefix("publish: ")
    return f"publish {event.get('kind') or ''} FAILED: {_first_line(message)}".replace("  ", " ")


def _delivery_sections(events: list[dict[str, Any]]) -> list[str]:
    """`show`'s `notifications:` and `publish:` sections: what the run told and wrote outside."""
    lines: list[str] = []
    notes = [e for e in events if e.get("type") in ("notified", "notify_failed")]
    if notes:
        lines.append("notifications:")
        lines.extend(f"  {notify_line(e)}" for e in notes)
    published = [e for e in events if e.get("type") in PUBLISH_EVENTS[1:]]
    if published:
        lines.append("publish:")
        lines.extend(f"  {publish_line(e)}" for e in published)
    return lines


def tool_line(event: Mapping[str, Any]) -> str:
    """`tool read_file src/x.py ok 0.01s`: one agent tool call, for progress and `show`."""
    outcome = "ok" if event.get("ok") else f"failed ({_first_line(str(event.get('error') or ''), 80)})"
    # The name and the arguments are the model's: a line break in them would print a line of its own.
    summary = f" {_inline(event['summary'])}" if event.get("summary") else ""
    return f"tool {_inline(event.get('name'))}{summary} {outcome} {float(event.get('duration_s') or 0):.2f}s"


def _inline(value: Any, limit: int = 160) -> str:
    """`value` as text on one line: line breaks shown as escapes, cut to `limit`."""
    text = str(value).replace("\r", "\\r").replace("\n", "\\n").replace("\u2028", "\\u2028")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _charged_failure(event: Mapping[str, Any]) -> str:
    """A model call that failed yet was charged (an `llm` event with `failed`), for progress and `show`."""
    charged = event.get("charged") or {}
    return f"failed ({event['failed']}), charged {int(charged.get('tokens', 0))} tokens, {_money(charged.get('cost_usd'))}"


def _some_lines(text: str, count: int = 6, limit: int = 160) -> str:
    lines = [ln.rstrip() for ln in (text or "").strip().splitlines() if ln.strip()]
    if len(lines) > count:
        lines = lines[:1] + ["…"] + lines[-(count - 2):]
    clipped = [ln if len(ln) <= limit else ln[: limit - 1] + "…" for ln in lines]
    return "\n      ".join(clipped)


def _first_line(text: str, limit: int = 160) -> str:
    first = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def summary(state: RunState, store_dir: Any = None, status: str | None = None) -> str:
    """`status`: how to say it, when more is known than the record's (`run_status`)."""
    lines = [f"run {state.run_id}: {status or state.status}"]
    lines.append("path: " + " -> ".join(state.path))
    ledger = state.ledger or {}
    lines.append(f"spent: {ledger.get('tokens', 0)} tokens, {_money(ledger.get('cost_usd', 0))}, {ledger.get('steps', 0)} steps, {state.active_s:.2f}s")
    if state.usage:
        lines.append("per state:")
        width = max(len(n) for n in state.usage)
        for name, u in state.usage.items():
            lines.append(f"  {name:<{width}}  {int(u.get('attempts', 0))} attempt(s)  {int(u.get('tokens', 0)):>7} tokens  {_money(u.get('cost_usd'))}  {float(u.get('seconds', 0)):.2f}s")
    if state.error and state.status != "completed":
        lines.append(f"error: {state.error.get('kind')} in '{state.error.get('state')}': {_first_line(state.error.get('message', ''), 400)}")
    if state.outputs:
        lines.append("outputs: " + json.dumps(state.outputs, ensure_ascii=False)[:2000])
    wt = state.meta.get("worktree")
    if wt:
        if wt.get("kept"):
            lines.append(f"worktree kept for inspection: {wt['path']} (branch {wt['branch']})")
        elif wt.get("commit"):
            lines.append(f"changes committed to branch {wt['branch']} ({wt['commit'][:12]})")
        else:
            lines.append(f"no changes to commit; branch {wt['branch']} left at its base")
    lines.extend(_publish_summary(state))
    if state.status == "waiting" and state.waiting:
        w = state.waiting
        choices = w.get("choices") or ["approve", "reject"]
        lines.append(f"waiting at '{w['state']}': {w.get('message', '')}")
        if state.run_id.startswith(IN_MEMORY_PREFIX):  # nothing kept it: no command can decide it later
            lines.append("  this run was kept in memory only (--no-store): run it with a store to decide it later")
            return "\n".join(lines)
        store = f" --store {shlex.quote(str(store_dir))}" if store_dir else ""  # a line to paste as it is
        decided = state.decision if isinstance(state.decision, dict) else None
        if decided is not None:  # recorded, not yet acted on: another decision would be refused
            lines.append(visible(f"  decided: '{decided.get('decision')}' by {decided.get('by')} "
                                 f"at {decided.get('at')}"))
        elif set(choices) == {"approve", "reject"}:
            lines.append(f"  decide with: loopdsl approve {state.run_id}{store} [--comment TEXT]  |  loopdsl reject {state.run_id}{store}")
        else:
            lines.append(f"  decide with: loopdsl decide {state.run_id} CHOICE{store}   (choices: {', '.join(choices)})")
        lines.append(f"  then:        loopdsl resume {state.run_id}{store}")
    return "\n".join(lines)


def run_status(record: Mapping[str, Any]) -> str:
    """A run's status as a person should read it: a `running` run that no live process
    drives (the store marks it `interrupted`) says how to continue it."""
    if record.get("interrupted"):
        return f"interrupted (resume {record.get('run_id', '')})"
    published = (record.get("meta") or {}).get("publish")
    if record.get("status") == "completed" and isinstance(published, dict) and published.get("status") != "done":
        return f"completed, publish pending (resume {record.get('run_id', '')})"
    return str(record.get("status", ""))


def runs_table(records: list[dict[str, Any]]) -> str:
    statuses = [run_status(r) for r in records]
    width = max([17, *(len(s) for s in statuses)])
    header = f"{'ID':<10} {'LOOP':<24} {'STATUS':<{width}} {'STARTED':<20} {'SPENT':>10}"
    rows = [header]
    for r, status in zip(records, statuses):
        ledger = r.get("ledger") or {}
        started = (r.get("started_at") or "")[:19].replace("T", " ")
        rows.append(f"{r.get('run_id', ''):<10} {r.get('loop', '')[:24]:<24} {status:<{width}} {started:<20} {_money(ledger.get('cost_usd')):>10}")
    return "\n".join(rows)


def show_text(state: RunState, events: list[dict[str, Any]], children: list[RunState] | None = None,
              status: str | None = None) -> str:
    lines = [summary(state, status=status)]
    lines.append("")
    lines.append("states:")
    for name, result in state.results.items():
        ok = "ok" if result.get("ok") else f"failed ({(result.get('error') or {}).get('kind')})"
        lines.append(f"  {name}: {ok}")
        for key in ("exit_code", "verdict", "decision", "model"):
            if key in result and result[key] is not None:
                lines.append(f"    {key}: {result[key]}")
        for key in ("stdout", "text"):
            if result.get(key):
                lines.append(f"    {key}: {_first_line(str(result[key]), 200)}")
    gates = [e for e in events if e.get("type") == "gate"]
    if gates:
        lines.append("gates:")
        for e in gates:
            lines.append(f"  {e.get('state')} {e.get('phase')}-gate {e.get('gate')}: {'pass' if e.get('passed') else 'FAIL'} ({e.get('duration_s', 0)}s)")
    # `decision`: recorded by approve/reject/decide; `decided`: taken by the run (also from a
    # reply script or a prompt). One decision appears as both once the run resumed.
    decided = list({(e.get("state"), e.get("decision"), e.get("by"), e.get("at")): e
                    for e in events if e.get("type") in ("decision", "decided")}.values())
    if decided:
        lines.append("decisions:")
        for e in decided:
            comment = f': "{_first_line(str(e["comment"]))}"' if e.get("comment") else ""
            lines.append(f"  {e.get('state')}: {e.get('decision')} by {e.get('by') or 'unknown'} at {e.get('at')}{comment}")
    calls = [e for e in events if e.get("type") == "llm"]
    if calls:
        lines.append("llm calls:")
        for e in calls:
            if e.get("failed"):
                lines.append(f"  {e['state']} #{e.get('attempt')} {e.get('model')}: {_charged_failure(e)}")
                continue
            usage = e.get("usage") or {}
            cost = 0.0 if e.get("cached") else e.get("cost_usd")
            tag = " cached" if e.get("cached") else " replayed" if e.get("replayed") else ""
            lines.append(f"  {e.get('state')} #{e.get('attempt')} {e.get('model')}: {usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens {_money(cost)}{tag}")
    tool_calls = [e for e in events if e.get("type") == "tool_call"]
    if tool_calls:
        lines.append("tool calls:")
        lines.extend(f"  {e.get('state')} #{e.get('attempt')} turn {e.get('turn')}: {tool_line(e)}" for e in tool_calls)
    lines.extend(_delivery_sections(events))
    files = state.meta.get("files") or {}
    if files:
        lines.append("files:")
        for path, digest in files.items():
            lines.append(f"  {digest[:16]}  {path}")
    if children:
        lines.append("sub-loops:")
        for child in sorted(children, key=lambda c: c.run_id):
            ledger = child.ledger or {}
            lines.append(f"  {child.run_id}: {child.status}  path {' -> '.join(child.path)}  "
                         f"{ledger.get('tokens', 0)} tokens {_money(ledger.get('cost_usd'))}")
    return "\n".join(lines)


def transcript_text(calls: list[dict[str, Any]]) -> str:
    """`loopdsl show RUN --transcript`: each model call (from `api.transcript.model_calls`)
    with its prompt messages, reply and tool calls; the caller makes it terminal-safe."""
    if not calls:
        return "no model calls in this run"
    lines: list[str] = []
    for n, call in enumerate(calls, 1):
        where = f"{call['state']} attempt {call['attempt']}" + (f" turn {call['turn']}" if call["turn"] is not None else "")
        failed = f" (failed: {call['failed']})" if call["failed"] else ""
        replayed = " (replayed after a resume, not paid again)" if call.get("replayed") else ""
        lines.append(f"=== call {n}: {where}, {call['kind']}, model {call['model']}{failed}{replayed}")
        if call["messages"] is None:
            if call["turn"] in (None, 1):
                lines.append("--- prompt: not stored (recorded before prompts were kept)")
        else:
            for message in call["messages"]:
                lines.append(f"--- {message['role']}")
                lines.append(message["content"])
        lines.append("--- reply" if call["stored"] else "--- reply: not stored")
        if call["reply"]:
            lines.append(call["reply"])
        for tool in call["tool_calls"]:
            lines.append(f"--- tool call {tool['name']} ({tool['id']}): {tool['arguments']}")
        for result in call["tool_results"]:
            lines.append(f"--- tool result {result['name']} ({result['id']}, {'ok' if result['ok'] else 'error'})")
            lines.append(result["content"])
        lines.append("")
    return "\n".join(lines).rstrip("\n")
