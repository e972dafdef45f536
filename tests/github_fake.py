"""A loopback fake of the GitHub REST endpoints loopdsl uses, for tests.

Real HTTP on 127.0.0.1 (a threaded `http.server`), so the real client library is exercised
end to end: authentication header, JSON bodies, status codes, rate-limit headers. State is
in memory (one repository: pull requests, issues, comments, labels, reviews, collaborator
permissions); every request is recorded in `requests`, and every write (POST, PATCH, PUT,
DELETE) that changed something in `writes`, so a test can say "exactly one PR was opened".

`rate_limit(times, status, retry_after)` makes the next `times` requests answer a secondary
rate limit (403 or 429 with `retry-after`) before they are served, the way GitHub refuses a
burst of writes; `fail_next(status)` answers one request with an error. `hold_after(method,
pattern)` makes the first such write take effect and then withholds its answer until
`release()`: `held` is set meanwhile, the moment to kill a client between a write and its
record of it.
"""
from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    status: int = 0
    raw_path: str = ""  # as sent, still percent-encoded: routes match it, as GitHub's do


@dataclass
class _Limit:
    status: int
    retry_after: int


@dataclass
class FakeState:
    default_branch: str = "main"
    next_number: int = 1
    next_id: int = 1000
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    issues: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: list[dict[str, Any]] = field(default_factory=list)
    reviews: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[int, list[str]] = field(default_factory=dict)
    permissions: dict[str, str] = field(default_factory=dict)


class FakeGitHub:
    """One repository `owner/name` behind a token; `url` is what GITHUB_API_URL points at."""

    def __init__(self, repository: str = "octo/widgets", token: str = "ghs_fake_token") -> None:
        self.repository = repository
        self.token = token
        self.state = FakeState()
        self.requests: list[Recorded] = []
        self.writes: list[Recorded] = []
        self._limits: list[_Limit] = []
        self._failures: list[int] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._hold: tuple[str, str] | None = None
        self.held = threading.Event()
        self._released = threading.Event()

    # -- test controls -------------------------------------------------------------------
    def rate_limit(self, times: int = 1, status: int = 403, retry_after: int = 1) -> None:
        with self._lock:
            self._limits.extend(_Limit(status, retry_after) for _ in range(times))

    def fail_next(self, status: int = 500) -> None:
        with self._lock:
            self._failures.append(status)

    def hold_after(self, method: str, pattern: str) -> None:
        self._hold = (method, pattern)

    def release(self) -> None:
        self._released.set()

    def maybe_hold(self, rec: Recorded) -> None:
        """Called after a request was served, before its answer is sent."""
        hold = self._hold
        if hold and rec.method == hold[0] and re.search(hold[1], rec.path) and 200 <= rec.status < 300:
            self._hold = None
            self.held.set()
            self._released.wait(60)

    def writes_to(self, method: str, pattern: str) -> list[Recorded]:
        """Recorded writes with `method` whose path matches the regex `pattern` (served, 2xx)."""
        return [w for w in self.writes if w.method == method and re.search(pattern, w.path)
                and 200 <= w.status < 300]

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FakeGitHub":
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="github-fake").start()
        return self

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeGitHub":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving -------------------------------------------------------------------------
    def handle(self, rec: Recorded, auth: str) -> tuple[int, Any, dict[str, str]]:
        with self._lock:
            self.requests.append(rec)
            if self._limits:
                limit = self._limits.pop(0)
                return limit.status, {"message": "You have exceeded a secondary rate limit."}, {
                    "retry-after": str(limit.retry_after)}
            if self._failures:
                return self._failures.pop(0), {"message": "injected failure"}, {}
            if auth not in (f"token {self.token}", f"Bearer {self.token}", f"bearer {self.token}"):
                return 401, {"message": "Bad credentials"}, {}
            status, body = _route(self, rec)
            rec.status = status
            if rec.method != "GET" and 200 <= status < 300:
                self.writes.append(rec)
            return status, body, {}

    def new_number(self) -> int:
        number, self.state.next_number = self.state.next_number, self.state.next_number + 1
        return number

    def new_id(self) -> int:
        ident, self.state.next_id = self.state.next_id, self.state.next_id + 1
        return ident


def _html(fake: FakeGitHub, kind: str, number: int) -> str:
    return f"https://github.example/{fake.repository}/{kind}/{number}"


def _route(fake: FakeGitHub, rec: Recorded) -> tuple[int, Any]:
    prefix = f"/repos/{fake.repository}"
    path = rec.raw_path or rec.path
    if not path.startswith(prefix):
        return 404, {"message": "Not Found"}
    rest = path[len(prefix):]
    for method, pattern, action in _ROUTES:
        match = re.fullmatch(pattern, rest)
        if match and method == rec.method:  # a label named `area/ui` arrives as one segment, `area%2Fui`
            return action(fake, rec, *(unquote(group) for group in match.groups()))
    return 404, {"message": f"Not Found: {rec.method} {rec.path}"}


def _repo(fake: FakeGitHub, rec: Recorded) -> tuple[int, Any]:
    return 200, {"full_name": fake.repository, "default_branch": fake.state.default_branch}


def _list_pulls(fake: FakeGitHub, rec: Recorded) -> tuple[int, Any]:
    state = rec.query.get("state", "open")
    head = rec.query.get("head")
    found = [p for p in fake.state.pulls.values()
             if (state == "all" or p["state"] == state)
             and (head is None or f"{fake.repository.split('/')[0]}:{p['head']['ref']}" == head)]
    return 200, found


def _create_pull(fake: FakeGitHub, rec: Recorded) -> tuple[int, Any]:
    body = rec.body or {}
    for key in ("title", "head", "base"):
        if not isinstance(body.get(key), str):
            return 422, {"message": f"Validation Failed: {key} missing"}
    head = body["head"].split(":")[-1]
    if any(p["head"]["ref"] == head and p["state"] == "open" for p in fake.state.pulls.values()):
        return 422, {"message": f"Validation Failed: A pull request already exists for {head}."}
    number = fake.new_number()
    pull = {"number": number, "id": fake.new_id(), "state": "open", "title": body["title"],
            "body": body.get("body"), "head": {"ref": head}, "base": {"ref": body["base"]},
            "html_url": _html(fake, "pull", number), "draft": bool(body.get("draft"))}
    fake.state.pulls[number] = pull
    return 201, pull


def _get_pull(fake: FakeGitHub, rec: Recorded, number: str) -> tuple[int, Any]:
    pull = fake.state.pulls.get(int(number))
    return (200, pull) if pull else (404, {"message": "Not Found"})


def _update_pull(fake: FakeGitHub, rec: Recorded, number: str) -> tuple[int, Any]:
    pull = fake.state.pulls.get(int(number))
    if pull is None:
        return 404, {"message": "Not Found"}
    for key in ("title", "body", "state"):
        if key in (rec.body or {}):
            pull[key] = rec.body[key]
    return 200, pull


def _issue_or_pull(fake: FakeGitHub, number: int) -> dict[str, Any] | None:
    return fake.state.issues.get(number) or fake.state.pulls.get(number)


def _list_comments(fake: FakeGitHub, rec: Recorded, number: str) -> tuple[int, Any]:
    if _issue_or_pull(fake, int(number)) is None:
        return 404, {"message": "Not Found"}
    return 200, [c for c in fake.state.comments if c["issue_number"] == int(number)]


def _create_comment(fake: FakeGitHub, rec: Recorded, number: str) -> tuple[int, Any]:
    if _issue_or_pull(fake, int(number)) is None:
        return 404, {"message": "Not Found"}
    if not isinstance((rec.body or {}).get("body"), str):
        return 422, {"message": "Validation Failed: body missing"}
    ident = fake.new_id()
    # Made with a workflow's GITHUB_TOKEN, as every write of the apply job is.
    comment = {"id": ident, "issue_number": int(number), "body": rec.body["body"],
               "user": {"login": "github-actions[bot]", "type": "Bot"},
               "html_url": f"{_html(fake, 'issues', int(number))}#issuecomment-{ident}"}
    fake.state.comments.append(comment)
    return 201, comment


def _add_labels(fake: FakeGitHub, rec: Recorded, number: str) -> tuple[int, Any]:
    if _issue_or_pull(fake, int(number)) is None:
        return 404, {"message": "Not Found"}
    names = (rec.body or {}).get("labels", [])
    current = fake.state.labels.setdefault(int(number), [])
    current.extend(n for n in names if n not in current)
    return 200, [{"name": n} for n in current]


def _remove_label(fake: FakeGitHub, rec: Recorded, number: str, name: str) -> tuple[int, Any]:
    current = fake.state.labels.get(int(number), [])
    if name not in current:
        return 404, {"message": "Label does not exist"}
    current.remove(name)
    return 200, [{"name": n} for n in current]


def _list_reviews(fake: FakeGitHub, rec: Recorded, number: str) -> tuple[int, Any]:
    return 200, [r for r in fake.state.reviews if r["pull_number"] == int(number)]


def _create_review(fake: FakeGitHub, rec: Recorded, number: str) -> tuple[int, Any]:
    if int(number) not in fake.state.pulls:
        return 404, {"message": "Not Found"}
    body = rec.body or {}
    if body.get("event") not in ("COMMENT", "REQUEST_CHANGES", "APPROVE"):
        return 422, {"message": "Validation Failed: event"}
    review = {"id": fake.new_id(), "pull_number": int(number), "event": body["event"],
              "state": {"COMMENT": "COMMENTED", "REQUEST_CHANGES": "CHANGES_REQUESTED",
                        "APPROVE": "APPROVED"}[body["event"]],
              "body": body.get("body", ""), "html_url": _html(fake, "pull", int(number))}
    fake.state.reviews.append(review)
    return 200, review


def _list_issues(fake: FakeGitHub, rec: Recorded) -> tuple[int, Any]:
    state = rec.query.get("state", "open")
    return 200, [i for i in fake.state.issues.values() if state == "all" or i["state"] == state]


def _create_issue(fake: FakeGitHub, rec: Recorded) -> tuple[int, Any]:
    body = rec.body or {}
    if not isinstance(body.get("title"), str):
        return 422, {"message": "Validation Failed: title missing"}
    number = fake.new_number()
    issue = {"number": number, "id": fake.new_id(), "state": "open", "title": body["title"],
             "body": body.get("body"), "labels": [{"name": n} for n in body.get("labels", [])],
             "html_url": _html(fake, "issues", number)}
    fake.state.issues[number] = issue
    fake.state.labels[number] = list(body.get("labels", []))
    return 201, issue


def _permission(fake: FakeGitHub, rec: Recorded, user: str) -> tuple[int, Any]:
    level = fake.state.permissions.get(user)
    if level is None:
        return 404, {"message": f"{user} is not a user"}
    return 200, {"permission": level, "role_name": level, "user": {"login": user}}


_N = r"(\d+)"
_ROUTES = [
    ("GET", r"", _repo),
    ("GET", r"/pulls", _list_pulls),
    ("POST", r"/pulls", _create_pull),
    ("GET", rf"/pulls/{_N}", _get_pull),
    ("PATCH", rf"/pulls/{_N}", _update_pull),
    ("GET", rf"/pulls/{_N}/reviews", _list_reviews),
    ("POST", rf"/pulls/{_N}/reviews", _create_review),
    ("GET", r"/issues", _list_issues),
    ("POST", r"/issues", _create_issue),
    ("GET", rf"/issues/{_N}/comments", _list_comments),
    ("POST", rf"/issues/{_N}/comments", _create_comment),
    ("POST", rf"/issues/{_N}/labels", _add_labels),
    ("DELETE", rf"/issues/{_N}/labels/([^/]+)", _remove_label),
    ("GET", r"/collaborators/([^/]+)/permission", _permission),
]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGitHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        rec = Recorded(self.command, unquote(parts.path.rstrip("/") or "/"), query, body,
                       raw_path=parts.path.rstrip("/") or "/")
        status, answer, headers = self.fake.handle(rec, self.headers.get("Authorization", ""))
        self.fake.maybe_hold(rec)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client was killed while held
            self.close_connection = True

    do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve
