"""The GitHub REST calls publishing and checkpoints need, over githubkit.

githubkit (the optional `github` extra) is imported when a client is built, never by
`lint`: its import and its typed models cost time a lint run must not pay. Its answers are
read as plain JSON (`.json()`), not as its pydantic models, so a GitHub Enterprise version
or a test server that omits fields we never read is still understood.

Retries: a secondary rate limit (403/429 with `retry-after`, or a "secondary rate" message)
is waited out and retried, a few times, when the wait is short; a primary rate limit (the
hourly quota) fails at once with when it resets, since waiting could take an hour. A
server error is retried only for a read: a write that answered 502 may have happened, and
the publisher's own lookup (by branch, by marker) decides whether to write again.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from .settings import GitHubError, GitHubSettings

MAX_RATE_LIMIT_RETRIES = 3
MAX_RETRY_WAIT = timedelta(seconds=120)
_TIMEOUT_S = 30.0
_PAGES = 5  # at most this many pages of 100 when looking a marker up


@dataclass(frozen=True)
class Written:
    """What GitHub answered for a created or found object: its number or id, and its page."""

    number: int
    url: str
    key: str = ""  # what it was found or made by: a pull request's head branch, a body's marker


def _retry_decision(max_wait: timedelta) -> Any:
    from githubkit.exception import (PrimaryRateLimitExceeded, RequestFailed,  # optional extra
                                     SecondaryRateLimitExceeded)
    from githubkit.retry import RetryOption

    def decide(exc: Exception, count: int) -> RetryOption:
        if isinstance(exc, SecondaryRateLimitExceeded) and count < MAX_RATE_LIMIT_RETRIES:
            if exc.retry_after <= max_wait:
                # githubkit sleeps 60 s for a zero wait ("retry-after: 0" is falsy): ask for 1 s
                return RetryOption(True, max(exc.retry_after, timedelta(seconds=1)))
        if isinstance(exc, PrimaryRateLimitExceeded):
            return RetryOption(False)
        if (isinstance(exc, RequestFailed) and exc.response.status_code >= 500
                and exc.request.method == "GET" and count < 2):
            return RetryOption(True, timedelta(seconds=count + 1))
        return RetryOption(False)

    return decide


def _github(settings: GitHubSettings, max_wait: timedelta) -> Any:
    try:
        from githubkit import GitHub  # optional extra; its import is not paid by lint
    except ImportError:
        raise GitHubError("publishing to GitHub needs the `github` extra (githubkit), which is not installed",
                          "pip install 'loopdsl[github]'") from None
    return GitHub(settings.token, base_url=settings.api_url + "/", http_cache=False,
                  timeout=_TIMEOUT_S, auto_retry=_retry_decision(max_wait), user_agent="loopdsl")


def path_segment(value: str) -> str:
    """`value` percent-encoded as one URL path segment: no `/`, `?`, `#` of its own, and `.` or
    `..` (which an HTTP client resolves against the path before it) written as `%2E`."""
    encoded = quote(value, safe="")
    return encoded.replace(".", "%2E") if set(value) == {"."} else encoded


def _failure(action: str, exc: Exception, settings: GitHubSettings) -> GitHubError:
    from githubkit.exception import PrimaryRateLimitExceeded, RequestFailed, RequestError  # optional extra

    if isinstance(exc, PrimaryRateLimitExceeded):
        return GitHubError(f"GitHub: {action} hit the API rate limit of the token (resets in "
                           f"{int(exc.retry_after.total_seconds())} s)",
                           "wait for the reset, then `loopdsl resume RUN` publishes what is left")
    if isinstance(exc, RequestFailed):
        status = exc.response.status_code
        try:
            detail = str(exc.response.json().get("message", ""))[:300]
        except Exception:  # a non-JSON error page: its status says enough
            detail = ""
        hint = {401: f"check the token in {settings.token_secret}",
                403: f"give the token in {settings.token_secret} the permission this needs "
                     "(contents, pull-requests or issues: write)",
                404: f"check GITHUB_REPOSITORY={settings.repository} and that the token can see it"}
        return GitHubError(f"GitHub: {action} failed with HTTP {status}: {detail}".rstrip(": "),
                           hint.get(status, "see the message above; `loopdsl resume RUN` retries"))
    if isinstance(exc, RequestError):
        return GitHubError(f"GitHub: {action} could not reach {settings.api_url}: {type(exc.exc).__name__}",
                           "check GITHUB_API_URL and the network; `loopdsl resume RUN` retries")
    return GitHubError(f"GitHub: {action} failed: {type(exc).__name__}: {str(exc)[:200]}")


class GitHubClient:
    """One repository's pull requests, issues, comments, labels, reviews and permissions."""

    def __init__(self, settings: GitHubSettings, max_wait: timedelta = MAX_RETRY_WAIT) -> None:
        self.settings = settings
        self._gh = _github(settings, max_wait)
        self._rest = self._gh.rest

    def _call(self, action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from githubkit.exception import GitHubException  # optional extra

        try:
            return fn(self.settings.owner, self.settings.repo, *args, **kwargs).json()
        except GitHubException as exc:
            raise _failure(action, exc, self.settings) from None

    def default_branch(self) -> str:
        return str(self._call("reading the repository", self._rest.repos.get)["default_branch"])

    # -- pull requests ---------------------------------------------------------------------
    def find_open_pull(self, branch: str) -> Written | None:
        """The open pull request whose head is `branch` of this repository, if there is one."""
        found = self._call(f"listing pull requests of {branch}", self._rest.pulls.list,
                           state="open", head=f"{self.settings.owner}:{branch}", per_page=10)
        for pull in found if isinstance(found, list) else []:
            if pull.get("head", {}).get("ref") == branch:
                return Written(int(pull["number"]), str(pull["html_url"]), branch)
        return None

    def create_pull(self, title: str, body: str, head: str, base: str) -> Written:
        pull = self._call("opening a pull request", self._rest.pulls.create,
                          data={"title": title, "body": body, "head": head, "base": base})
        return Written(int(pull["number"]), str(pull["html_url"]), head)

    def update_pull(self, number: int, title: str, body: str) -> Written:
        pull = self._call(f"updating pull request #{number}", self._rest.pulls.update, number,
                          data={"title": title, "body": body})
        return Written(int(pull["number"]), str(pull["html_url"]), str(pull.get("head", {}).get("ref", "")))

    def create_review(self, pull: int, event: str, body: str) -> Written:
        review = self._call(f"reviewing pull request #{pull}", self._rest.pulls.create_review, pull,
                            data={"event": event, "body": body})
        return Written(int(review["id"]), str(review.get("html_url", "")))

    def find_review(self, pull: int, marker: str) -> Written | None:
        reviews = self._call(f"listing reviews of #{pull}", self._rest.pulls.list_reviews, pull, per_page=100)
        return _with_marker(reviews, marker, "id")

    # -- issues, comments, labels ----------------------------------------------------------
    def create_comment(self, number: int, body: str) -> Written:
        comment = self._call(f"commenting on #{number}", self._rest.issues.create_comment, number,
                             data={"body": body})
        return Written(int(comment["id"]), str(comment["html_url"]))

    def find_comment(self, number: int, marker: str) -> Written | None:
        """A comment on issue or PR `number` whose body holds `marker` (the newest pages first)."""
        for page in range(1, _PAGES + 1):
            comments = self._call(f"listing comments of #{number}", self._rest.issues.list_comments,
                                  number, per_page=100, page=page)
            found = _with_marker(comments, marker, "id")
            if found or not isinstance(comments, list) or len(comments) < 100:
                return found
        return None

    def comments(self, number: int) -> list[dict[str, Any]]:
        """The comments of issue or PR `number` (at most _PAGES pages of 100), oldest first."""
        found: list[dict[str, Any]] = []
        for page in range(1, _PAGES + 1):
            comments = self._call(f"listing comments of #{number}", self._rest.issues.list_comments,
                                  number, per_page=100, page=page)
            found += [c for c in comments if isinstance(c, dict)] if isinstance(comments, list) else []
            if not isinstance(comments, list) or len(comments) < 100:
                break
        return found

    def add_labels(self, number: int, labels: list[str]) -> None:
        self._call(f"labelling #{number}", self._rest.issues.add_labels, number, data={"labels": labels})

    def remove_label(self, number: int, label: str) -> None:
        """Remove `label` from #`number`; a label that is not there is already removed."""
        from githubkit.exception import RequestFailed  # optional extra

        try:
            # One path segment whatever the name holds: githubkit puts it in the URL as it is,
            # and `../../git/refs/heads/main` made this a DELETE of the main branch.
            self._rest.issues.remove_label(self.settings.owner, self.settings.repo, number, path_segment(label))
        except RequestFailed as exc:
            if exc.response.status_code != 404:
                raise _failure(f"removing label {label!r} from #{number}", exc, self.settings) from None
        except Exception as exc:
            raise _failure(f"removing label {label!r} from #{number}", exc, self.settings) from None

    def create_issue(self, title: str, body: str, labels: list[str]) -> Written:
        issue = self._call("opening an issue", self._rest.issues.create,
                           data={"title": title, "body": body, "labels": labels})
        return Written(int(issue["number"]), str(issue["html_url"]))

    def find_issue(self, marker: str) -> Written | None:
        """A recent issue (newest 100, open or closed) whose body holds `marker`."""
        issues = self._call("listing issues", self._rest.issues.list_for_repo, state="all",
                            sort="created", direction="desc", per_page=100)
        return _with_marker(issues, marker, "number")

    # -- people ----------------------------------------------------------------------------
    def permission(self, user: str) -> str:
        """`admin`, `write`, `read` or `none`: what `user` may do in this repository."""
        from githubkit.exception import RequestFailed  # optional extra

        try:
            answer = self._rest.repos.get_collaborator_permission_level(
                self.settings.owner, self.settings.repo, path_segment(user)).json()
        except RequestFailed as exc:
            if exc.response.status_code == 404:  # not a user, or not a collaborator at all
                return "none"
            raise _failure(f"reading the permission of {user}", exc, self.settings) from None
        except Exception as exc:
            raise _failure(f"reading the permission of {user}", exc, self.settings) from None
        level = answer.get("permission") if isinstance(answer, dict) else None
        return level if level in ("admin", "write", "read") else "none"


def _with_marker(items: Any, marker: str, key: str) -> Written | None:
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and marker in str(item.get("body") or ""):
            return Written(int(item[key]), str(item.get("html_url", "")), marker)
    return None
