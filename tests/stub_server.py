"""A loopback OpenAI-compatible chat-completions server for tests.

Each request pops the next scripted `StubReply` from a queue, so a test decides
exactly what the "provider" answers (text and usage, no or garbage usage, 429 with
Retry-After, 500, a malformed body, a connection dropped after the request was read,
a reply slower than the client's timeout) and can count the
requests it received: every request body is recorded, which is how tests prove
that one `complete()` call is exactly one paid HTTP request.

The server binds 127.0.0.1 on a free port and serves only between `start()` and
`stop()`; a delayed reply waits on an event that `stop()` sets, so shutting down
never hangs on a sleeping handler.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


@dataclass
class StubReply:
    """One scripted answer. `raw_body` (bytes) replaces the JSON body entirely."""

    status: int = 200
    text: str = "stub reply"
    prompt_tokens: int = 11
    completion_tokens: int = 7
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    delay_s: float = 0.0
    error_message: str = "stub error"
    omit_usage: bool = False  # a 200 without a `usage` object
    drop: bool = False  # read the request, then close the connection without answering


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when the body was not JSON


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up (the timeout tests) resets its connection; that is
        # expected here and not worth a traceback on stderr.
        return


class StubServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._queue: list[StubReply] = []
        self._stopping = threading.Event()
        self.requests: list[RecordedRequest] = []
        # Requests that arrived with nothing queued: a test that sees these made
        # more calls than it scripted (e.g. a hidden retry).
        self.unscripted = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> StubServer:
        handler = _make_handler(self)
        self._server = _QuietServer((self._host, self._port), handler)
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="stub-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> StubServer:  # noqa: PYI034 - also runs on Python 3.10 (no typing.Self)
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "stub server not started"
        return int(self._server.server_address[1])

    @property
    def api_base(self) -> str:
        return f"http://{self._host}:{self.port}/v1"

    # -- programming the replies -------------------------------------------
    def enqueue(self, *replies: StubReply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def reply_text(self, text: str, prompt_tokens: int = 11, completion_tokens: int = 7) -> None:
        self.enqueue(StubReply(text=text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens))

    def reply_rate_limit(self, retry_after: str | None = "7") -> None:
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        self.enqueue(StubReply(status=429, headers=headers, error_message="rate limited by stub"))

    def reply_status(self, status: int, message: str = "stub error") -> None:
        self.enqueue(StubReply(status=status, error_message=message))

    def reply_malformed(self) -> None:
        self.enqueue(StubReply(raw_body=b'{"id": "x", "choices": [ this is not json'))

    def reply_without_usage(self, text: str = "no usage here") -> None:
        self.enqueue(StubReply(text=text, omit_usage=True))

    def reply_drop(self) -> None:
        self.enqueue(StubReply(drop=True))

    def reply_slow(self, delay_s: float, text: str = "too late") -> None:
        self.enqueue(StubReply(text=text, delay_s=delay_s))

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.unscripted = 0

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- serving -------------------------------------------------------------
    def _next_reply(self, request: RecordedRequest) -> StubReply | None:
        with self._lock:
            self.requests.append(request)
            if self._queue:
                return self._queue.pop(0)
            self.unscripted += 1
            return None

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


def _completion_body(reply: StubReply, model: str) -> bytes:
    payload = {
        "id": f"chatcmpl-stub-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.text},
                "finish_reason": "stop",
            }
        ],
    }
    if not reply.omit_usage:
        payload["usage"] = {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
    return json.dumps(payload).encode()


def _error_body(reply: StubReply) -> bytes:
    kind = "rate_limit_exceeded" if reply.status == 429 else "server_error"
    return json.dumps({"error": {"message": reply.error_message, "type": kind, "code": reply.status}}).encode()


def _make_handler(stub: StubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body: Any = json.loads(raw or b"null")
            except ValueError:
                body = raw.decode("utf-8", "replace")
            if self.path not in CHAT_PATHS:
                self._send(404, b'{"error": {"message": "not found"}}', {})
                return
            recorded = RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            reply = stub._next_reply(recorded)
            if reply is None:
                reply = StubReply(status=500, error_message="stub: no reply queued for this request")
            if reply.delay_s:
                stub._wait(reply.delay_s)
            if reply.drop:  # the request arrived (and may be billed); the answer never does
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            model = body.get("model", "stub") if isinstance(body, dict) else "stub"
            if reply.raw_body is not None:
                payload = reply.raw_body
            elif reply.status == 200:
                payload = _completion_body(reply, model)
            else:
                payload = _error_body(reply)
            self._send(reply.status, payload, reply.headers)

        def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up (timeout test): nothing left to tell it.
                pass

    return Handler
