"""`publish:`: the GitHub writes a loop declares (docs/dsl.md, publish), as frozen data.

Every text is a template source, rendered by the runtime after a `completed` end; the
model never writes to GitHub itself. `number` is a template too (`{{ inputs.issue }}`), or
None where the write refers to what the same `publish` opens.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .model import YamlPath

DEFAULT_TOKEN_SECRET = "GITHUB_TOKEN"
RUN_BRANCH = "run"  # `branch: run`: the run's own branch, loopdsl/<run-id>
Target = Literal["issue", "pull_request"]


@dataclass(frozen=True)
class PublishPullRequest:
    title: str
    body: str = ""
    branch: str = RUN_BRANCH
    base: str | None = None


@dataclass(frozen=True)
class PublishComment:
    on: Target
    body: str
    number: str | None = None


@dataclass(frozen=True)
class PublishLabels:
    on: Target
    add: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    number: str | None = None


@dataclass(frozen=True)
class PublishReview:
    event: Literal["COMMENT", "REQUEST_CHANGES"]
    body: str
    number: str | None = None


@dataclass(frozen=True)
class PublishIssue:
    title: str
    body: str = ""
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class Publish:
    token: str = DEFAULT_TOKEN_SECRET
    ends: tuple[str, ...] = ()  # the completed ends that publish; empty: every one
    pull_request: PublishPullRequest | None = None
    comment: PublishComment | None = None
    labels: PublishLabels | None = None
    review: PublishReview | None = None
    issue: PublishIssue | None = None
    yaml_path: YamlPath = ("publish",)


def _text(raw: Mapping[str, Any], key: str, default: str = "") -> str:
    value = raw.get(key)
    return default if value is None else str(value)


def _number(raw: Mapping[str, Any]) -> str | None:
    value = raw.get("number")
    return None if value is None else str(value)


def _names(raw: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = raw.get(key)
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _target(raw: Mapping[str, Any]) -> Target:
    return "issue" if raw.get("on") == "issue" else "pull_request"


def build_publish(raw: Any) -> Publish | None:
    """Schema-valid `publish:` data -> Publish (None when the loop has none)."""
    if not isinstance(raw, Mapping):
        return None
    part = {k: v for k, v in raw.items() if isinstance(v, Mapping)}
    pr, comment, labels, review, issue = (part.get(k) for k in
                                          ("pull_request", "comment", "labels", "review", "issue"))
    return Publish(
        token=_text(raw, "token", DEFAULT_TOKEN_SECRET),
        ends=_names(raw, "ends"),
        pull_request=PublishPullRequest(_text(pr, "title"), _text(pr, "body"), _text(pr, "branch", RUN_BRANCH),
                                        pr.get("base") and str(pr["base"])) if pr is not None else None,
        comment=PublishComment(_target(comment), _text(comment, "body"), _number(comment))
        if comment is not None else None,
        labels=PublishLabels(_target(labels), _names(labels, "add"), _names(labels, "remove"), _number(labels))
        if labels is not None else None,
        review=PublishReview("REQUEST_CHANGES" if review.get("event") == "REQUEST_CHANGES" else "COMMENT",
                             _text(review, "body"), _number(review)) if review is not None else None,
        issue=PublishIssue(_text(issue, "title"), _text(issue, "body"), _names(issue, "labels"))
        if issue is not None else None,
    )
