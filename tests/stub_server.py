"""A loopback model server for tests: OpenAI chat completions and Anthropic Messages.

Each request pops the next scripted `StubReply` from a queue, so a test decides
exactly what the "provider" answers (text and usage, tool calls, no or garbage usage,
429 with Retry-After, 500, a malformed body, a connection dropped after the request
was read, a reply slower than the client's timeout). With the queue empty, a
`responder` (a function of the parsed request, i.e. the conversation so far) may
decide the reply, which is how a multi-turn tool conversation is served.

The same server speaks the wire formats, chosen by the path: `/v1/chat/completions`
(OpenAI; `api_base`) and `/v1/messages` (Anthropic, with `tool_use`/`tool_result`
content blocks and `input_tokens`/`output_tokens`; `anthropic_api_base`, for models
`anthropic/...`), so LiteLLM's translation of one request to each is exercised; a request
with `stream: true` to `/v1/messages`, and any to `/v1/responses` (the OpenAI Responses
API), is answered as server-sent events (`stub_streams`), which the real coding-agent
CLIs need.
Every request body is recorded (one `complete()` must be one paid HTTP request) and
the usage returned is summed in `billed` (what a provider would charge).

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
from typing import Any, Callable

from stub_formats import anthropic_body, anthropic_error_body, openai_body, openai_error_body
from stub_streams import anthropic_stream, responses_body, responses_stream

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
ANTHROPIC_PATHS = ("/v1/messages", "/messages")
RESPONSES_PATHS = ("/v1/responses", "/responses")  # the OpenAI Responses API (codex)


@dataclass
class StubReply:
    """One scripted answer. `raw_body` (bytes) replaces the JSON body entirely."""

    status: int = 200
    text: str | None = "stub reply"  # None: `content: null` (a tool turn without text)
    prompt_tokens: int = 11
    completion_tokens: int = 7
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None
    delay_s: float = 0.0
    error_message: str = "stub error"
    omit_usage: bool = False  # a 200 without a `usage` object
    drop: bool = False  # read the request, then close the connection without answering
    # OpenAI-format calls: [{"id", "type": "function", "function": {"name", "arguments"}}],
    # sent as given (garbage included); `tool_call()` builds a well-formed one.
    tool_calls: Any = None
    finish_reason: Any = None  # None: "tool_calls" when there are tool calls, else "stop"
    # Prompt-cache usage, reported by the streamed formats only (stub_streams), on top of the
    # uncached `prompt_tokens`; summed in `billed_cache`.
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def billed_usage(self) -> tuple[int, int] | None:
        """(prompt, completion) tokens this reply reports, when it is a 200 that reports any."""
        if self.status != 200 or self.raw_body is not None or self.omit_usage or self.drop:
            return None
        return self.prompt_tokens, self.completion_tokens


def tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """One OpenAI-format tool call; a non-string `arguments` is sent as its JSON text."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"call_stub_{time.monotonic_ns()}", "type": "function",
            "function": {"name": name, "arguments": text}}


Responder = Callable[[Any], "StubReply | None"]


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when the body was not JSON


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog (socketserver's default is 5). Clients open hundreds of connections at
    # once (bench/fanout.py: 200 children); past the backlog Linux drops the connection attempt
    # (TcpExt ListenOverflows) and the client retries after 1, 3, 7 ... s, or, once the
    # handshake had completed on its side, gets the connection reset (a failed call). Under
    # load, when this thread accepts slowly, that made fan-out times swing 5x and failed calls.
    request_queue_size = 1024

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gives up (the timeout tests) resets its connection; that is
        # expected here and not worth a traceback on stderr.
        return


class StubServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, responder: Responder | None = None) -> None:
        self._host = host
        self._port = port
        self._lock = threading.Lock()
        self._queue: list[StubReply] = []
        self._stopping = threading.Event()
        self.requests: list[RecordedRequest] = []
        # Asked with the parsed request body when nothing is queued; None: not answered.
        self.responder = responder
        # Requests that arrived with nothing queued and no responder answer: a test that
        # sees these made more calls than it scripted (e.g. a hidden retry).
        self.unscripted = 0
        self.responder_errors: list[BaseException] = []
        # Usage the stub reported in its 200 replies, summed: what a provider would bill.
        self.billed = {"prompt_tokens": 0, "completion_tokens": 0}
        self.billed_cache = {"cache_read_tokens": 0, "cache_write_tokens": 0}
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

    @property
    def anthropic_api_base(self) -> str:
        # LiteLLM appends /v1/messages to an Anthropic api_base.
        return f"http://{self._host}:{self.port}"

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

    def reply_tool_calls(self, *calls: dict[str, Any], text: str | None = None, prompt_tokens: int = 11,
                         completion_tokens: int = 7) -> None:
        self.enqueue(StubReply(text=text, tool_calls=list(calls), prompt_tokens=prompt_tokens,
                               completion_tokens=completion_tokens))

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.unscripted = 0
            self.billed = {"prompt_tokens": 0, "completion_tokens": 0}
            self.billed_cache = {"cache_read_tokens": 0, "cache_write_tokens": 0}

    @property
    def billed_tokens(self) -> int:
        with self._lock:
            return self.billed["prompt_tokens"] + self.billed["completion_tokens"]

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    # -- serving -------------------------------------------------------------
    def _next_reply(self, request: RecordedRequest) -> StubReply | None:
        with self._lock:
            self.requests.append(request)
            reply = self._queue.pop(0) if self._queue else None
            responder = self.responder
        if reply is None and responder is not None:
            try:
                reply = responder(request.body)  # outside the lock: it may take its time
            except Exception as exc:  # noqa: BLE001 - a test's bug: answer 500 and keep it for the test
                self.responder_errors.append(exc)
                reply = StubReply(status=500, error_message=f"stub responder failed: {exc!r}")
        with self._lock:
            if reply is None:
                self.unscripted += 1
                return None
            usage = reply.billed_usage()
            if usage is not None:
                self.billed["prompt_tokens"] += usage[0]
                self.billed["completion_tokens"] += usage[1]
                self.billed_cache["cache_read_tokens"] += reply.cache_read_tokens
                self.billed_cache["cache_write_tokens"] += reply.cache_write_tokens
            return reply

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


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
            path = self.path.split("?", 1)[0]  # Claude Code asks for /v1/messages?beta=true
            anthropic = path in ANTHROPIC_PATHS
            if path not in CHAT_PATHS + RESPONSES_PATHS and not anthropic:
                self._send(404, b'{"error": {"message": "not found"}}', {})
                return
            recorded = RecordedRequest(path, {k.lower(): v for k, v in self.headers.items()}, body)
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
            stream = isinstance(body, dict) and body.get("stream") is True
            content_type = "application/json"
            if reply.raw_body is not None:
                payload = reply.raw_body
            elif reply.status != 200:
                payload = (anthropic_error_body if anthropic else openai_error_body)(reply)
            elif path in RESPONSES_PATHS:
                payload = (responses_stream(reply, model) if stream
                           else json.dumps(responses_body(reply, model)).encode())
            elif anthropic and stream:
                payload = anthropic_stream(reply, model)
            else:
                payload = (anthropic_body if anthropic else openai_body)(reply, model)
            if stream and reply.status == 200 and reply.raw_body is None and (anthropic or path in RESPONSES_PATHS):
                content_type = "text/event-stream"
            self._send(reply.status, payload, reply.headers, content_type)

        def _send(self, status: int, payload: bytes, headers: dict[str, str],
                  content_type: str = "application/json") -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                # The client gave up (timeout test): nothing left to tell it.
                pass

    return Handler
