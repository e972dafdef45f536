"""Notifications: telling a `notify:` webhook that a run reached a status (docs/dsl.md, notify).

An observer of the run's status, called by the API where it commits a status (a run that
ends, starts waiting, or is aborted), never by the engine mid-run. What is sent and when
is decided here, purely; the sending goes through the `Notifier` port, which bounds each
send by its timeout. A send is recorded in the run (`meta.notified` and a `notified`
event) so a resumed run does not repeat it; a failed send is a `notify_failed` event and
never changes the run's status.
"""
from __future__ import annotations

import json
import shlex
from typing import TYPE_CHECKING, Any, Callable, Mapping
from urllib.parse import urlsplit

from ..language.model import Loop, Notify
from .ports import Delivery, Notifier
from .redaction import Redactor
from .run_state import WAITING, RunState

if TYPE_CHECKING:
    from .engine import Engine

# A model's words can be long; a notification carries the start of them.
MESSAGE_LIMIT = 2000


def transition_key(run: RunState) -> str:
    """Names the status change a notification reports: a run ends once, but may wait at
    several checkpoints (or one checkpoint several times), each a new wait."""
    if run.status == WAITING and run.waiting:
        return f"waiting:{run.waiting.get('state')}:{run.waiting.get('since')}"
    return run.status


def decide_commands(run: RunState, store_dir: str | None) -> list[str]:
    """The exact commands that decide a waiting run and continue it."""
    store = f" --store {shlex.quote(store_dir)}" if store_dir else ""
    choices = list((run.waiting or {}).get("choices") or ["approve", "reject"])
    rid = run.run_id
    if set(choices) == {"approve", "reject"}:
        lines = [f"loopdsl approve {rid}{store}", f"loopdsl reject {rid}{store}"]
    else:
        lines = [f"loopdsl decide {rid} {shlex.quote(str(c))}{store}" for c in choices]
    return [*lines, f"loopdsl resume {rid}{store}"]


def event_payload(run: RunState, store_dir: str | None) -> dict[str, Any]:
    """The generic JSON event (before redaction)."""
    ledger = run.ledger or {}
    payload: dict[str, Any] = {
        "source": "loopdsl", "run_id": run.run_id, "loop": run.loop, "status": run.status, "state": run.current,
        "spent": {k: ledger.get(k, 0) for k in ("tokens", "cost_usd", "steps")},
    }
    if run.status == WAITING and run.waiting:
        payload["message"] = str(run.waiting.get("message") or "")[:MESSAGE_LIMIT]
        payload["choices"] = list(run.waiting.get("choices") or ["approve", "reject"])
        payload["decide"] = decide_commands(run, store_dir)
    elif run.error:
        payload["message"] = str(run.error.get("message") or "")[:MESSAGE_LIMIT]
        payload["error"] = {"kind": run.error.get("kind"), "state": run.error.get("state")}
    else:
        payload["message"] = ""
    return payload


def _slack_escape(text: str) -> str:
    # Slack reads `<...>` as links and mentions (`<!channel>`): a model's words must not ping anyone.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(payload: Mapping[str, Any]) -> str:
    """A Slack-compatible message for the event: a headline, the message, how to decide."""
    esc = _slack_escape
    where = f" at `{esc(str(payload['state']))}`" if payload.get("state") else ""
    lines = [f"loopdsl: run `{esc(payload['run_id'])}` of loop *{esc(payload['loop'])}* is "
             f"*{esc(payload['status'])}*{where}"]
    if payload.get("message"):
        lines.extend("> " + esc(line) for line in str(payload["message"]).splitlines()[:20])
    for command in payload.get("decide") or ():
        lines.append(f"`{esc(command)}`")
    spent = payload.get("spent") or {}
    lines.append(f"spent: {spent.get('tokens', 0)} tokens, ${float(spent.get('cost_usd') or 0):.4f}, "
                 f"{spent.get('steps', 0)} steps")
    return "\n".join(lines)


def _target(entry: Notify, secret_values: Mapping[str, str]) -> tuple[str | None, str, str | None]:
    """(url or None, label, why it cannot be sent): the label never shows a URL's path or query."""
    if entry.secret is not None:
        label = f"secret {entry.secret}"
        url = secret_values.get(entry.secret, "")
        if not url:
            return None, label, f"secret {entry.secret} is not set in the environment"
    else:
        url = entry.webhook or ""
        try:
            parts = urlsplit(url)
            label = f"{parts.scheme}://{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
        except ValueError:
            label = "webhook"
    try:
        parts = urlsplit(url)
        valid = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
    except ValueError:
        valid = False
    return (url, label, None) if valid else (None, label, "the URL is not an http(s) URL with a host")


def notify_run(loop: Loop, run: RunState, notifier: Notifier | None, *, secret_values: Mapping[str, str],
               redact: Redactor, emit: Callable[..., None], store_dir: str | None) -> bool:
    """Send the notifications due for the run's current status; record each send or
    failure through `emit`. Returns whether anything was emitted (the caller commits)."""
    key = transition_key(run)
    done: list[str] = run.meta.setdefault("notified", [])
    due = [(i, entry) for i, entry in enumerate(loop.notify)
           if run.status in entry.on and f"{i}:{key}" not in done]
    if not due or notifier is None:
        return False
    payload = redact.redact_obj(event_payload(run, store_dir))
    if isinstance(payload.get("message"), str):
        payload["message"] = redact.error(payload["message"])
    deliveries: list[tuple[int, Delivery]] = []
    for i, entry in due:
        url, label, problem = _target(entry, secret_values)
        if url is None:
            emit("notify_failed", status=run.status, to=label, message=problem or "")
            continue
        body = {"text": slack_text(payload)} if entry.format == "slack" else payload
        deliveries.append((i, Delivery(url, json.dumps(body, ensure_ascii=False).encode("utf-8"), entry.timeout, label)))
    try:
        results = notifier.send([d for _, d in deliveries]) if deliveries else []
    except Exception as exc:  # a notifier must not raise; if one does, the run still stands
        results = [f"{type(exc).__name__}: {exc}"] * len(deliveries)
    for (i, delivery), problem in zip(deliveries, results):
        if problem is None:
            done.append(f"{i}:{key}")
            emit("notified", status=run.status, to=delivery.label, format=loop.notify[i].format)
        else:
            emit("notify_failed", status=run.status, to=delivery.label, message=problem)
    return True


def notify_engine(engine: "Engine", store_dir: Any) -> None:
    """Notify for the status an engine's run was just committed with, and commit the record."""
    if not engine.loop.notify:
        return
    if notify_run(engine.loop, engine.run, engine.ports.notifier, secret_values=engine.ports.secret_values,
                  redact=engine.redact, emit=engine.emit, store_dir=str(store_dir) if store_dir else None):
        engine.commit()
