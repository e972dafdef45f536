"""The GitHub events a loop's `on:` can name, and the payload fields its `inputs` may read.

One table for lint (a path the event does not have is an error before anything runs) and
for `loopdsl github-event` (the same path, read from the payload GitHub wrote to
GITHUB_EVENT_PATH). The shapes list the fields of GitHub's webhook payloads that a loop
plausibly wants, not every one: a field that is missing here is a lint error with the
known ones as hints, which is better than a silent empty input at run time.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Trigger name in a loop file -> the GitHub Actions event that carries it.
GITHUB_EVENT = {"ci_failure": "workflow_run", "pull_request": "pull_request", "issues": "issues",
                "issue_comment": "issue_comment"}
DEFAULT_TYPES = {"pull_request": ("opened", "synchronize", "reopened"), "issues": ("opened",)}

_USER = {"login": "string", "id": "integer", "type": "string"}
_LABEL = {"name": "string"}
_REPOSITORY = {"full_name": "string", "name": "string", "owner": {"login": "string"}, "default_branch": "string",
               "html_url": "string", "clone_url": "string", "private": "boolean"}
_ISSUE = {"number": "integer", "title": "string", "body": "string", "state": "string", "html_url": "string",
          "user": _USER, "labels": "array", "author_association": "string"}
_COMMON = {"action": "string", "repository": _REPOSITORY, "sender": _USER}

# Each event's payload: a mapping of field -> type name, or -> a nested mapping.
PAYLOADS: dict[str, Mapping[str, Any]] = {
    "ci_failure": {**_COMMON, "workflow_run": {
        "id": "integer", "name": "string", "head_branch": "string", "head_sha": "string", "conclusion": "string",
        "event": "string", "html_url": "string", "run_number": "integer", "run_attempt": "integer",
        "display_title": "string", "path": "string", "head_repository": {"full_name": "string"},
        "head_commit": {"id": "string", "message": "string"}}, "workflow": {"name": "string", "path": "string"}},
    "pull_request": {**_COMMON, "number": "integer", "pull_request": {
        "number": "integer", "title": "string", "body": "string", "state": "string", "draft": "boolean",
        "html_url": "string", "user": _USER, "labels": "array", "author_association": "string",
        "head": {"ref": "string", "sha": "string", "repo": {"full_name": "string"}},
        "base": {"ref": "string", "sha": "string"}}, "label": _LABEL},
    "issues": {**_COMMON, "issue": _ISSUE, "label": _LABEL},
    "issue_comment": {**_COMMON, "issue": {**_ISSUE, "pull_request": {"url": "string", "html_url": "string"}},
                      "comment": {"id": "integer", "body": "string", "html_url": "string", "user": _USER,
                                  "author_association": "string"}},
}
# Which JSON types of a payload field can become an input of each declared type.
COMPATIBLE = {"string": {"string", "integer", "number", "boolean"}, "integer": {"integer"},
              "number": {"integer", "number"}, "boolean": {"boolean"}, "array": {"array"}, "object": {"object"}}
_PATH = re.compile(r"^event(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def path_parts(path: str) -> list[str] | None:
    """`event.pull_request.number` -> ["pull_request", "number"]; None when not such a path."""
    return path.split(".")[1:] if _PATH.match(path) else None


def field_type(trigger: str, parts: list[str]) -> tuple[str | None, list[str]]:
    """(the JSON type of the field, []) or (None, the field names known where the path left the table)."""
    node: Any = PAYLOADS[trigger]
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return None, sorted(node) if isinstance(node, Mapping) else []
        node = node[part]
    return ("object" if isinstance(node, Mapping) else str(node)), []


def read_path(payload: Any, parts: list[str]) -> Any:
    """The value at `parts` in a payload, or None when any step is missing (or null)."""
    node = payload
    for part in parts:
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node
