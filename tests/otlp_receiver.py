"""A loopback OTLP/HTTP trace receiver for tests: what a collector (Jaeger, Tempo, the
OpenTelemetry Collector) would receive from `loopdsl run`, decoded with opentelemetry-proto.

It binds 127.0.0.1 on a free port and keeps every request body as received (so a test can
search the raw bytes for a secret) and every span flattened into a `Span`.
"""
from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from cli_forked import loopdsl_command

STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Span:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str
    parent: str  # "" for a root span
    attributes: dict[str, Any]
    status: str  # UNSET | OK | ERROR
    status_message: str
    start_ns: int
    end_ns: int
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
    return getattr(any_value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def decode(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                  _attributes(s.attributes), STATUS_NAMES[s.status.code], s.status.message,
                                  s.start_time_unix_nano, s.end_time_unix_nano, resource))
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[Span] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                body = gzip.decompress(raw) if encoding == "gzip" else zlib.decompress(raw) if encoding == "deflate" else raw
                with receiver._lock:
                    receiver.paths.append(self.path)
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                    receiver.bodies.append(body)
                    receiver.spans.extend(decode(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "OtlpReceiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def snapshot(self) -> list[Span]:
        with self._lock:
            return list(self.spans)


# ---------------------------------------------------------------- for the tests that use it


def otel_env(endpoint: str | None, **extra: str) -> dict[str, str]:
    """This environment without its OTEL_* variables, then tracing to `endpoint` (None: off)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(PYTHONPATH=str(ROOT), **extra)
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    return env


def run_loopdsl(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=180)


def only(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, (name, [s.name for s in spans])
    return found[0]


def dead_port() -> int:
    """A loopback port nothing listens on any more: connections to it are refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return int(port)
