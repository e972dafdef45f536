"""A run's model calls as people read them: each call's prompt messages and reply, and an
agent's tool calls with their results. One home for `loopdsl show RUN --transcript`, its
`--json` and the web UI's run page.

The texts live in the response store (the run log keeps only figures): an `llm`/`evaluate`
response holds the request's messages beside the reply (records written before that have
none: shown as not stored); an agent attempt keeps its first request, each turn's reply
and each tool call's result. Everything there was redacted when stored; it is redacted
again of the secrets this process knows before anyone sees it. Terminal and HTML escaping
are the printer's and the template's job.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..runtime.run_keys import agent_key
from ..runtime.redaction import redact_printed

TEXT_LIMIT = 50_000  # characters of one message shown; the rest is counted


def _text(value: Any, limit: int = TEXT_LIMIT) -> str:
    text = value if isinstance(value, str) else "" if value is None else str(value)
    if len(text) > limit:
        text = text[:limit] + f"\n... ({len(text) - limit} more characters)"
    return redact_printed(text)


def _messages(value: Any) -> list[dict[str, str]] | None:
    """Stored messages as role/content texts; None when the record kept none (older stores)."""
    if not isinstance(value, list):
        return None
    out = []
    for message in value:
        if isinstance(message, Mapping):
            out.append({"role": _text(message.get("role"), 40), "content": _text(message.get("content"))})
    return out


def _get(store: Any, key: Any) -> dict[str, Any] | None:
    if not isinstance(key, str):
        return None
    found = store.get_response(key)
    return found if isinstance(found, dict) else None


def _tool_calls(reply: Mapping[str, Any]) -> list[dict[str, str]]:
    calls = reply.get("tool_calls") if isinstance(reply.get("tool_calls"), list) else []
    return [{"id": _text(c.get("id"), 200), "name": _text(c.get("name"), 200), "arguments": _text(c.get("arguments"))}
            for c in calls if isinstance(c, Mapping)]


def model_calls(store: Any, run_id: str, events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each model call of the run, in order: {state, attempt, turn, model, kind, messages, reply,
    tool_calls, tool_results, stored, replayed}. `messages` is None where the prompt was not stored."""
    calls: list[dict[str, Any]] = []
    visits: dict[Any, Any] = {}  # state -> its current visit (from the `attempt` events)
    turns: dict[tuple[Any, Any, Any], dict[str, Any]] = {}  # (state, attempt, turn) -> agent turn call
    # A coding-agent CLI's tool uses come before its one `llm` event (emitted when it ends);
    # its answer is in the state's `ok`/`failed` event after it.
    cli_tools: dict[tuple[Any, Any], list[Mapping[str, Any]]] = {}
    cli_open: dict[Any, dict[str, Any]] = {}
    for event in events:
        kind, state, attempt = event.get("type"), event.get("state"), event.get("attempt")
        if kind == "attempt":
            visits[state] = event.get("visit")
        elif kind == "llm":
            calls.append(_call(store, run_id, event, visits.get(state)))
            if event.get("turn") is not None:
                turns[(state, attempt, event.get("turn"))] = calls[-1]
            if event.get("cli"):
                _cli_call(calls[-1], cli_tools.pop((state, attempt), []))
                cli_open[state] = calls[-1]
        elif kind in ("ok", "failed") and state in cli_open:
            result = event.get("result") if isinstance(event.get("result"), Mapping) else {}
            cli_open.pop(state)["reply"] = _text(result.get("text"))
        elif kind == "tool_call" and event.get("cli"):
            cli_tools.setdefault((state, attempt), []).append(event)
        elif kind == "tool_call":
            call = turns.get((state, attempt, event.get("turn")))
            if call is not None:
                ids = {"run": run_id, "state": state, "visit": visits.get(state), "attempt": attempt}
                done = _get(store, agent_key("tool", **ids, turn=event.get("turn"), call=event.get("id"))) or {}
                call["tool_results"].append({"id": _text(event.get("id"), 200), "name": _text(event.get("name"), 200),
                                             "ok": bool(event.get("ok")), "content": _text(done.get("content"))})
    return calls


def _call(store: Any, run_id: str, event: Mapping[str, Any], visit: Any) -> dict[str, Any]:
    state, attempt, turn = event.get("state"), event.get("attempt"), event.get("turn")
    reply = _get(store, event.get("key"))
    messages = _messages(reply.get("messages")) if reply else None
    if turn is not None and messages is None and turn == 1:  # an agent's first request is kept on its own
        ids = {"run": run_id, "state": state, "visit": visit, "attempt": attempt}
        start = _get(store, agent_key("start", **ids))
        messages = _messages(start.get("messages")) if start else None
    return {"state": _text(state, 200), "attempt": attempt, "turn": turn, "model": _text(event.get("model"), 200),
            "kind": "agent turn" if turn is not None else "llm", "failed": _text(event.get("failed"), 64),
            "replayed": bool(event.get("replayed")),  # the reply stored before a crash, read back: not paid again
            "messages": messages, "reply": _text(reply.get("text")) if reply else "",
            "stored": reply is not None, "tool_calls": _tool_calls(reply) if reply else [], "tool_results": []}


def _cli_call(call: dict[str, Any], tools: list[Mapping[str, Any]]) -> None:
    """A coding-agent CLI's run as one call: its prompt and steps are not kept, its tool uses
    are (from their events: what the CLI ran and a capped, redacted excerpt of the result)."""
    call["kind"] = f"coding-agent CLI {_text(call['model'], 200)}"
    call["stored"] = True
    call["messages"] = call["messages"] or []  # not "not stored yet": a CLI's prompt is never kept
    call["tool_calls"] = [{"id": _text(e.get("id"), 200), "name": _text(e.get("name"), 200),
                           "arguments": _text(e.get("summary"), 200)} for e in tools]
    call["tool_results"] = [{"id": _text(e.get("id"), 200), "name": _text(e.get("name"), 200), "ok": bool(e.get("ok")),
                             "content": _text(e.get("output") if e.get("ok") else e.get("error"))} for e in tools]


__all__ = ["model_calls"]
