"""OpenTelemetry traces of a run, asked for by the standard `OTEL_*` environment variables.

A run's events (the same ones its run log receives) become spans: this module only decides
whether tracing is on and builds the tracer; `otel_spans` turns events into spans. Nothing of
OpenTelemetry is imported unless an OTLP endpoint is configured, so `loopdsl` without the
`otel` extra, and every run without the variables, pays nothing.

The trace id is derived from the run id, so the process that resumes a run after a crash or
a decision adds its spans to the same trace without having to find the first one's.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from typing import TYPE_CHECKING, Iterator, Mapping

if TYPE_CHECKING:
    from ..language.model import Loop
    from ..runtime.engine import Engine
    from ..runtime.redaction import Redactor
    from .otel_spans import RunTracer

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# How long the end of a run waits for its last spans to reach the collector, unless
# OTEL_BSP_EXPORT_TIMEOUT says otherwise: a dead collector must not hold up a run's end.
DEFAULT_FLUSH_MS = 2000.0

_log = logging.getLogger("loopdsl.otel")


def traces_requested(env: Mapping[str, str]) -> bool:
    """Whether the environment asks for OTLP traces: an endpoint is set, the SDK is not
    disabled and the traces exporter is not switched off or set to something else."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    if "otlp" not in exporters:
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def trace_id_for(run_id: str) -> int:
    """The 128-bit trace id of a run: the same in every process that advances the run."""
    digest = hashlib.sha256(f"loopdsl-trace:{run_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1  # 0 is the invalid trace id


def flush_seconds(env: Mapping[str, str]) -> float:
    """The bound on the final export at the end of a run, in seconds."""
    raw = env.get("OTEL_BSP_EXPORT_TIMEOUT", "").strip()
    try:
        millis = float(raw) if raw else DEFAULT_FLUSH_MS
    except ValueError:
        millis = DEFAULT_FLUSH_MS
    return max(millis, 0.0) / 1000.0


def start_run_tracing(run_id: str, loop: "Loop", redactor: "Redactor", *, resumed: bool,
                      env: Mapping[str, str] | None = None) -> "RunTracer | None":
    """A tracer for this process's part of a run, or None when no traces are asked for
    (or the `otel` extra is missing: the run goes on, with one warning)."""
    env = os.environ if env is None else env
    if not traces_requested(env):
        return None
    try:
        # Imported here only: the SDK and its exporter load in a few hundred milliseconds.
        from .otel_spans import RunTracer
    except ImportError as exc:
        _log.warning("OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed (%s); "
                     "the run is not traced. Install it with: pip install 'loopdsl[otel]'", exc.name or exc)
        return None
    try:
        return RunTracer(run_id, loop, redactor, trace_id=trace_id_for(run_id), resumed=resumed,
                         flush_s=flush_seconds(env))
    except Exception as exc:  # noqa: BLE001 - a tracing setup the SDK rejects must not stop the run
        _log.warning("the run is not traced: OpenTelemetry could not be set up (%s: %s)", type(exc).__name__, exc)
        return None



@contextlib.contextmanager
def traced(engine: "Engine", *, resumed: bool = False) -> Iterator[None]:
    """While the engine advances the run, its events also become spans when the `OTEL_*`
    variables ask for traces; on the way out the spans are flushed (bounded). The API wraps
    every engine it drives in this, a `resume` with resumed=True."""
    tracer = start_run_tracing(engine.run.run_id, engine.loop, engine.redact, resumed=resumed)
    if tracer is None:
        yield
        return
    engine.ports.listeners.append(tracer.on_event)
    try:
        yield
    finally:
        engine.ports.listeners.remove(tracer.on_event)
        tracer.close(engine.run.status, engine.run.error)
