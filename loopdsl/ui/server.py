"""`loopdsl ui`: the ASGI app (Starlette) and how it is served (uvicorn).

Reads go through the same API functions as `loopdsl runs` / `show`, and a decision through
the same `decide` as `loopdsl approve` / `reject` / `decide` (who: `--as NAME`, else the
same person the CLI would name). Bound to anything but loopback, every request must carry
the token (header, or the cookie that `?token=` sets once); a decision is a POST that must
carry the page's CSRF token and, when the browser sends one, a same-origin Origin.
"""
from __future__ import annotations

import hmac
import ipaddress
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs, quote, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from ..api.durable import decide
from ..api.records import runs_page, show_run
from ..language.errors import LoopdslError
from . import pages

TOKEN_COOKIE = "loopdsl_ui_token"
TOKEN_HEADER = "x-loopdsl-token"
PAGE_SIZE = 50
FORM_LIMIT = 64 * 1024  # bytes of a decision form read; a comment longer than this is refused
# same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with the
# page's own form posts, which the Origin check below must refuse.
HEADERS = {"Content-Security-Policy": pages.CSP + "; frame-ancestors 'none'", "X-Content-Type-Options": "nosniff",
           "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "Cache-Control": "no-store"}


@dataclass
class UiSettings:
    store: Path
    token: str | None = None
    by: str | None = None  # who decides; None: as the CLI would name them
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode("utf-8"))


def _html(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=HEADERS)


def _refuse(message: str, status: int) -> PlainTextResponse:
    return PlainTextResponse(message + "\n", status_code=status, headers=HEADERS)


class TokenGate:
    """ASGI middleware: with a token set, nothing is served to a request that lacks it;
    without one, nothing to a request that names a host other than loopback."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Awaitable[Any]],
                       send: Callable[..., Awaitable[Any]]) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        send = _with_security_headers(send)
        request = Request(scope)
        if not self.token:
            # Without a token only loopback names may reach it: a web page whose domain was
            # re-pointed at 127.0.0.1 (DNS rebinding) arrives with its own name as Host.
            host = urlsplit("//" + request.headers.get("host", "")).hostname or ""
            if is_loopback(host):
                return await self.app(scope, receive, send)
            return await _refuse(f"403: this loopdsl ui answers only to a loopback address, not {host[:100]!r}",
                                 403)(scope, receive, send)
        if _same(request.query_params.get("token"), self.token):
            # Once, from the link the user was given: a cookie carries it from now on, and the
            # token leaves the address bar (and the history) at once.
            rest = "&".join(f"{quote(k)}={quote(v)}" for k, v in request.query_params.multi_items() if k != "token")
            path = "/" + request.url.path.lstrip("/")  # never '//host': that would leave this server
            response: Response = RedirectResponse(path + ("?" + rest if rest else ""), status_code=303)
            response.set_cookie(TOKEN_COOKIE, self.token, httponly=True, samesite="strict", path="/")
        else:
            auth = request.headers.get("authorization", "")
            given = (request.headers.get(TOKEN_HEADER) or (auth[7:] if auth.lower().startswith("bearer ") else None)
                     or request.cookies.get(TOKEN_COOKIE))
            if _same(given, self.token):
                return await self.app(scope, receive, send)
            response = _refuse("401: this loopdsl ui needs its token: open the link with ?token=TOKEN once, or send "
                               f"the {TOKEN_HEADER} header", 401)
        await response(scope, receive, send)


def _with_security_headers(send: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`send` that gives every response the security headers it lacks: the web stack's own
    (its 404, 405 and 500, a redirect) as well as the pages'."""
    async def sending(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers") or [])
            present = {name.lower() for name, _ in headers}
            headers += [(k.lower().encode(), v.encode()) for k, v in HEADERS.items() if k.lower().encode() not in present]
            message = {**message, "headers": headers}
        await send(message)

    return sending


def _list(settings: UiSettings) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        status = request.query_params.get("status", "")[:64]
        loop = request.query_params.get("loop", "")[:200]
        try:
            offset = max(0, min(10**9, int(request.query_params.get("offset", "0"))))
        except ValueError:
            offset = 0
        try:
            page = await run_in_threadpool(runs_page, settings.store, status=status or None, loop=loop or None,
                                           offset=offset, limit=PAGE_SIZE)
        except LoopdslError as exc:  # the store went bad under the server (replaced, damaged)
            return _refuse(f"500: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else ""), 500)
        return _html(pages.runs_page(page, status=status, loop=loop))

    return endpoint


def _render_run(settings: UiSettings, run_id: str, notice: str = "", error: str = "", status: int = 200) -> Response:
    try:
        view = show_run(run_id, settings.store, transcript=True)
    except LoopdslError as exc:
        return _refuse(f"404: {exc.message}", 404)
    record = view.record
    if notice and not (record.get("status") == "waiting" and record.get("decision")):
        notice = ""  # `?decided=1` is anyone's to type: the notice only shows what the record says
    return _html(pages.run_page(view, store=settings.store, csrf=settings.csrf, notice=notice, error=error), status)


def _run(settings: UiSettings) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        notice = "decision recorded; continue with `loopdsl resume`" if request.query_params.get("decided") else ""
        return await run_in_threadpool(_render_run, settings, request.path_params["run_id"], notice)

    return endpoint


def _same_origin(request: Request) -> bool:
    """A browser names the page a POST comes from: it must be this server (a sandboxed
    frame's "null" is refused too). Clients that send no Origin (curl) pass on the token."""
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host", "")


def _decide(settings: UiSettings) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_LIMIT:
                return _refuse("413: the decision form is too large", 413)
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True).items()}
        if not _same(form.get("csrf"), settings.csrf) or not _same_origin(request):
            return _refuse("403: the decision was refused: the form's CSRF token is missing or wrong "
                           "(reload the run page and decide again)", 403)
        try:
            state = await run_in_threadpool(decide, run_id, form.get("choice", ""), form.get("comment", ""),
                                            store=settings.store, by=settings.by)
        except LoopdslError as exc:
            message = exc.message + (f" ({exc.hint})" if exc.hint else "")
            return await run_in_threadpool(_render_run, settings, run_id, "", message, 409)
        return RedirectResponse(f"/runs/{quote(state.run_id)}?decided=1", status_code=303)

    return endpoint


async def _no_icon(request: Request) -> Response:
    return Response(status_code=204, headers=HEADERS)


def create_app(settings: UiSettings) -> Any:
    """The ASGI app (wrapped in the token gate when a token is set)."""
    app = Starlette(routes=[
        Route("/", _list(settings)),
        Route("/runs/{run_id}", _run(settings)),
        Route("/runs/{run_id}/decide", _decide(settings), methods=["POST"]),
        Route("/favicon.ico", _no_icon),
    ])
    return TokenGate(app, settings.token)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so that a port in use is a message, not uvicorn's exit."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise LoopdslError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                           "choose another --port (or stop what uses this one), or another --host") from None
    return sock


def serve(settings: UiSettings, host: str, port: int, on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted (uvicorn handles Ctrl-C)."""
    import uvicorn

    sock = listen(host, port)
    config = uvicorn.Config(create_app(settings), log_level="warning", access_log=False, server_header=False,
                            proxy_headers=False)
    if on_ready is not None:
        bound = sock.getsockname()[1]
        on_ready(f"http://[{host.strip('[]')}]:{bound}/" if ":" in host else f"http://{host}:{bound}/")
    uvicorn.Server(config).run(sockets=[sock])


__all__ = ["UiSettings", "create_app", "serve", "is_loopback", "TOKEN_COOKIE", "TOKEN_HEADER"]
