"""A run's events as OpenTelemetry spans, exported over OTLP/HTTP (the `otel` extra).

Imported only by `adapters.otel` once the `OTEL_*` variables ask for traces. The tracer is
one more listener of the engine's events (the ones the run log receives), so the engine
knows nothing of tracing. Spans of one process's part of a run:

    run <loop>                      one per process (a resumed run adds another, same trace)
      state <name>                  one per attempt: status, error kind, budget left
        gate <name>                 from its measured duration
        chat <model>                a model call, GenAI semantic conventions, loopdsl.cost_usd
        execute_tool <name>         an agent's tool call
        shell                       the command of a `shell:` state
        loop <child loop>           a `loop:` state's child run, its own states beneath

Events carry no start time for model calls: a call's span starts where the attempt's
previous span ended (or the attempt began), which covers the prompt's rendering too.
Every string attribute, span name and status text goes through the run's redactor.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from ..language.model import Loop
from ..runtime.redaction import Redactor

_INT64 = 2 ** 63
TEXT_LIMIT = 2048  # characters of one string attribute; messages can be whole command outputs
FAILED_ENDS = ("failed", "budget_exhausted", "aborted", "escalated")

_log = logging.getLogger("loopdsl.otel")
# Once a run's final export outlasted its bound, later runs in the same process (the cases of
# `loopdsl test`, API callers) wait only this long: a dead collector costs its bound once.
LATER_FLUSH_S = 0.2
_slow_collector = threading.Event()


class _RunTraceIds(RandomIdGenerator):
    """Root spans get the run's trace id; span ids stay random."""

    def __init__(self, trace_id: int):
        self._trace_id = trace_id

    def generate_trace_id(self) -> int:
        return self._trace_id


def _provider(trace_id: int) -> TracerProvider:
    resource = Resource.create({})
    if resource.attributes.get("service.name", "").startswith("unknown_service"):
        # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win; without them the service is loopdsl.
        resource = resource.merge(Resource({"service.name": "loopdsl"}))
    # shutdown_on_exit=False: the run's end flushes within a bound; an exit hook could hang on a dead collector.
    provider = TracerProvider(resource=resource, id_generator=_RunTraceIds(trace_id), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class _Attrs:
    """Sets attributes with every string redacted and bounded."""

    def __init__(self, redactor: Redactor):
        self.redactor = redactor

    def text(self, value: Any) -> str:
        text = str(value)
        if self.redactor:
            text = self.redactor.error(text)  # error texts may quote a secret cut short
        return text[:TEXT_LIMIT]

    def set(self, span: Span, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            if value is None:
                continue
            if isinstance(value, (bool, float)) or (isinstance(value, int) and -_INT64 <= value < _INT64):
                span.set_attribute(key, value)
            else:  # text, and integers OTLP's int64 cannot carry (a hostile provider's usage)
                span.set_attribute(key, self.text(value))

    def fail(self, span: Span, kind: Any, message: Any) -> None:
        self.set(span, {"error.type": kind or "error", "loopdsl.error.kind": kind})
        span.set_status(Status(StatusCode.ERROR, self.text(message or kind or "failed")))


def _now() -> int:
    return time.time_ns()


def _seconds_ago(seconds: Any, end: int, floor: int) -> int:
    try:
        start = end - int(float(seconds) * 1e9)
    except (TypeError, ValueError):
        return floor
    return max(start, floor)


class _Scope:
    """The spans of one run record: the top run, or a child run of a `loop:` state."""

    def __init__(self, tracer: trace.Tracer, attrs: _Attrs, parent: Span, loop: Loop | None, budget: Any):
        self.tracer, self.attrs, self.parent, self.loop, self.budget = tracer, attrs, parent, loop, budget
        self.attempts: dict[str, Span] = {}
        self.last_end: dict[str, int] = {}  # state -> end of its attempt's latest child span
        self.tools: dict[str, int] = {}  # call id -> start
        self.children: dict[str, _Scope] = {}
        self.spent: dict[str, Any] = {}
        self.ended: dict[str, Any] | None = None
        self.open_attempt: Span | None = None
        self.failure: tuple[Any, Any] | None = None  # (kind, message) of the latest failure
        self.own: Span | None = None  # a child run's span, ended by the child's `end`

    # ---------------------------------------------------------------- helpers
    def _under(self, span: Span | None) -> Context:
        return trace.set_span_in_context(span if span is not None else self.parent)

    def child(self, name: str, state: str, start: int, kind: SpanKind = SpanKind.INTERNAL) -> Span:
        parent = self.attempts.get(state)
        return self.tracer.start_span(self.attrs.text(name), context=self._under(parent), kind=kind, start_time=start)

    def budget_attrs(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for key in ("tokens", "cost_usd", "steps"):
            spent = self.spent.get(key)
            if spent is None:
                continue
            values[f"loopdsl.budget.spent.{key}"] = spent
            cap = getattr(self.budget, key, None) if self.budget is not None else None
            if cap is not None:
                values[f"loopdsl.budget.remaining.{key}"] = max(round(cap - spent, 9), 0)
        return values

    def _state_kind(self, name: str) -> str | None:
        state = self.loop.states.get(name) if self.loop is not None else None
        return state.kind if state is not None else None

    def request_model(self, name: str) -> str | None:
        state = self.loop.states.get(name) if self.loop is not None else None
        alias = getattr(state.action, "model", None) if state is not None else None
        model = self.loop.models.get(alias) if alias and self.loop is not None else None
        return model.model if model is not None else None

    def gate_kind(self, name: str, label: str) -> str | None:
        state = self.loop.states.get(name) if self.loop is not None else None
        for gate in (*state.gates_before, *state.gates_after) if state is not None else ():
            if gate.label == label:
                shared = self.loop.gates.get(str(gate.ref)) if gate.kind == "ref" and self.loop is not None else None
                return shared.kind if shared is not None else gate.kind
        return None

    def end_attempt(self, name: str, now: int, outcome: Callable[[Span], None]) -> None:
        span = self.attempts.pop(name, None)
        if span is None:
            return
        outcome(span)
        self.attrs.set(span, self.budget_attrs())
        span.end(end_time=now)
        if self.open_attempt is span:
            self.open_attempt = None

    def close(self, now: int) -> None:
        """Ends what the events left open (a run waiting, or stopped by an exception)."""
        for scope in self.children.values():
            scope.close(now)
        for name in list(self.attempts):
            self.end_attempt(name, now, lambda span: None)
        if self.own is not None and self.ended is None:  # a child still running or waiting
            self.own.end(end_time=now)
            self.own = None

    # ---------------------------------------------------------------- events
    def handle(self, event: Mapping[str, Any], now: int) -> None:
        spent = event.get("spent")
        if isinstance(spent, Mapping):
            self.spent.update({k: v for k, v in spent.items() if isinstance(v, (int, float))})
        handler = _HANDLERS.get(str(event.get("type")))
        if handler is not None:
            handler(self, event, now)

    def on_attempt(self, e: Mapping[str, Any], now: int) -> None:
        name = str(e.get("state"))
        self.end_attempt(name, now, lambda span: None)  # never two open spans for one state
        span = self.tracer.start_span(self.attrs.text(f"state {name}"), context=self._under(None), start_time=now)
        self.attrs.set(span, {"loopdsl.state": name, "loopdsl.state.kind": self._state_kind(name),
                              "loopdsl.visit": e.get("visit"), "loopdsl.attempt": e.get("attempt")})
        self.attempts[name] = span
        self.last_end[name] = now
        self.open_attempt = span

    def on_ok(self, e: Mapping[str, Any], now: int) -> None:
        name = str(e.get("state"))
        self._shell(name, e.get("result"), now, None)
        self.end_attempt(name, now, lambda span: span.set_status(Status(StatusCode.OK)))

    def on_failure(self, e: Mapping[str, Any], now: int) -> None:
        """`retry` (another attempt follows) and `failed` (the state failed for good)."""
        name = str(e.get("state"))
        kind, message = e.get("kind"), e.get("message")
        self.failure = (kind, message)
        self._shell(name, e.get("result"), now, kind)

        def failed(span: Span) -> None:
            self.attrs.fail(span, kind, message)
            self.attrs.set(span, {"loopdsl.retried": e.get("type") == "retry"})

        self.end_attempt(name, now, failed)

    def _shell(self, name: str, result: Any, now: int, failed: Any) -> None:
        """The command of a `shell:` state, from the duration its result records."""
        if self._state_kind(name) != "shell" or not isinstance(result, Mapping) or "duration_s" not in result:
            return
        start = _seconds_ago(result.get("duration_s"), now, self.last_end.get(name, now))
        span = self.child("shell", name, start)
        code = result.get("exit_code")
        self.attrs.set(span, {"process.exit.code": code if isinstance(code, int) else None,
                              "loopdsl.shell.duration_s": result.get("duration_s")})
        if failed:
            self.attrs.fail(span, failed, f"{failed}: exit code {code}")
        else:
            span.set_status(Status(StatusCode.OK))
        span.end(end_time=now)

    def on_gate(self, e: Mapping[str, Any], now: int) -> None:
        name, label = str(e.get("state")), str(e.get("gate"))
        start = _seconds_ago(e.get("duration_s"), now, self.last_end.get(name, now))
        span = self.child(f"gate {label}", name, start)
        self.attrs.set(span, {"loopdsl.gate": label, "loopdsl.gate.phase": e.get("phase"),
                              "loopdsl.gate.kind": self.gate_kind(name, label), "loopdsl.gate.passed": bool(e.get("passed"))})
        if e.get("passed"):
            span.set_status(Status(StatusCode.OK))
        else:
            self.attrs.fail(span, "gate", e.get("message"))
        span.end(end_time=now)
        self.last_end[name] = now

    def on_llm(self, e: Mapping[str, Any], now: int) -> None:
        name = str(e.get("state"))
        requested = self.request_model(name) or e.get("model")
        span = self.child(f"chat {requested or 'model'}", name, self.last_end.get(name, now), SpanKind.CLIENT)
        provider = str(requested).split("/", 1)[0] if requested and "/" in str(requested) else None
        usage = e.get("usage") if isinstance(e.get("usage"), Mapping) else {}
        self.attrs.set(span, {
            "gen_ai.operation.name": "chat", "gen_ai.system": provider, "gen_ai.provider.name": provider,
            "gen_ai.request.model": requested, "gen_ai.response.model": e.get("model"),
            "gen_ai.usage.input_tokens": usage.get("prompt_tokens"),
            "gen_ai.usage.output_tokens": usage.get("completion_tokens"),
            "loopdsl.cost_usd": e.get("cost_usd"), "loopdsl.turn": e.get("turn"),
            "loopdsl.replayed": e.get("replayed"), "loopdsl.cached": e.get("cached"),
            "loopdsl.tool_calls": e.get("tool_calls"), **self.budget_attrs()})
        if e.get("failed"):
            self.attrs.fail(span, e.get("failed"), f"the model call failed ({e.get('failed')}) and was charged")
        else:
            span.set_status(Status(StatusCode.OK))
        span.end(end_time=now)
        self.last_end[name] = now

    def on_tool_started(self, e: Mapping[str, Any], now: int) -> None:
        self.tools[str(e.get("id"))] = now

    def on_tool_call(self, e: Mapping[str, Any], now: int) -> None:
        name = str(e.get("state"))
        start = self.tools.pop(str(e.get("id")), None)
        if start is None:  # a call refused before it ran, or started by the process that crashed
            start = _seconds_ago(e.get("duration_s"), now, self.last_end.get(name, now))
        span = self.child(f"execute_tool {e.get('name')}", name, start)
        self.attrs.set(span, {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": e.get("name"),
                              "gen_ai.tool.call.id": e.get("id"), "loopdsl.tool.summary": e.get("summary"),
                              "loopdsl.turn": e.get("turn"), "loopdsl.tool.truncated": e.get("truncated")})
        if e.get("ok"):
            span.set_status(Status(StatusCode.OK))
        else:
            self.attrs.fail(span, "tool", e.get("error"))
        span.end(end_time=now)
        self.last_end[name] = now

    def on_waiting(self, e: Mapping[str, Any], now: int) -> None:
        def waiting(span: Span) -> None:
            self.attrs.set(span, {"loopdsl.waiting": True, "loopdsl.waiting.reason": e.get("reason")})

        self.end_attempt(str(e.get("state")), now, waiting)

    def on_stop(self, e: Mapping[str, Any], now: int) -> None:
        """`budget_exhausted` and `stopped`: the open attempts end with the run's reason."""
        kind = "budget" if e.get("type") == "budget_exhausted" else e.get("kind")
        self.failure = (kind, e.get("message"))
        for name in list(self.attempts):
            self.end_attempt(name, now, lambda span: self.attrs.fail(span, kind, e.get("message")))

    def on_end(self, e: Mapping[str, Any], now: int) -> None:
        self.ended = dict(e)
        self.close(now)
        if self.own is not None:  # a child run's span ends with the child
            status = str(e.get("status"))
            self.attrs.set(self.own, {"loopdsl.status": status, **self.budget_attrs()})
            if status in FAILED_ENDS:
                kind, message = self.failure or (status, status)
                self.attrs.fail(self.own, kind, message)
            elif status == "completed":
                self.own.set_status(Status(StatusCode.OK))
            self.own.end(end_time=now)
            self.own = None

    def on_child(self, e: Mapping[str, Any], now: int) -> None:
        inner = e.get("event")
        if not isinstance(inner, Mapping):
            return
        run_id = str(e.get("run_id"))
        scope = self.children.get(run_id)
        if scope is None:
            parent = self.open_attempt or self.parent
            own = self.tracer.start_span("child run", context=trace.set_span_in_context(parent), start_time=now)
            self.attrs.set(own, {"loopdsl.run_id": run_id})
            scope = self.children[run_id] = _Scope(self.tracer, self.attrs, own, None, None)
            scope.own = own
        scope.handle(inner, now)


_HANDLERS: dict[str, Callable[[_Scope, Mapping[str, Any], int], None]] = {
    "attempt": _Scope.on_attempt, "ok": _Scope.on_ok, "retry": _Scope.on_failure, "failed": _Scope.on_failure,
    "gate": _Scope.on_gate, "llm": _Scope.on_llm, "tool_started": _Scope.on_tool_started,
    "tool_call": _Scope.on_tool_call, "waiting": _Scope.on_waiting, "budget_exhausted": _Scope.on_stop,
    "stopped": _Scope.on_stop, "end": _Scope.on_end, "child": _Scope.on_child,
}


class RunTracer:
    """One process's part of a run as a trace: a listener of the run's events, closed
    (its spans flushed within `flush_s`) when the process is done with the run."""

    def __init__(self, run_id: str, loop: Loop, redactor: Redactor, *, trace_id: int, resumed: bool, flush_s: float):
        self.trace_id = trace_id
        self.flush_s = flush_s
        self.provider = _provider(trace_id)
        tracer = self.provider.get_tracer("loopdsl")
        self.attrs = _Attrs(redactor)
        # An empty context: the run is its own trace even inside a caller's traced code.
        self.root = tracer.start_span(self.attrs.text(f"run {loop.name}"), context=Context(), start_time=_now())
        self.attrs.set(self.root, {"loopdsl.run_id": run_id, "loopdsl.loop": loop.name,
                                   "loopdsl.segment": "resume" if resumed else "start"})
        self.scope = _Scope(tracer, self.attrs, self.root, loop, loop.budget)

    def on_event(self, event: dict[str, Any]) -> None:
        try:
            self.scope.handle(event, _now())
        except Exception as exc:  # noqa: BLE001 - a tracing fault must never stop the run it watches
            _log.debug("tracing skipped a %s event: %s", event.get("type"), exc)

    def close(self, status: str, error: Mapping[str, Any] | None) -> None:
        """Ends the open spans, the run's span with the run's status, and flushes."""
        try:
            now = _now()
            self.scope.close(now)
            self.attrs.set(self.root, {"loopdsl.status": status, **self.scope.budget_attrs()})
            if status in FAILED_ENDS:
                error = error or {}
                self.attrs.fail(self.root, error.get("kind") or status, error.get("message") or status)
            elif status == "completed":
                self.root.set_status(Status(StatusCode.OK))
            self.root.end(end_time=now)
        finally:
            self.flush()

    def flush(self) -> None:
        """Exports what is left, waiting at most `flush_s`: the exporter retries a dead
        collector for longer, so it runs on a daemon thread the process does not wait for."""
        worker = threading.Thread(target=self.provider.shutdown, name="loopdsl-otel-flush", daemon=True)
        worker.start()
        worker.join(min(self.flush_s, LATER_FLUSH_S) if _slow_collector.is_set() else self.flush_s)
        if worker.is_alive():  # the next runs of this process (`loopdsl test`) wait less for it
            _slow_collector.set()
