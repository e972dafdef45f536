"""The `Publisher` port on GitHub: one planned `publish:` write at a time, made once.

A pull request is found by its head branch (a repository has at most one open pull request
per branch): found, it is updated (a fixed `branch:` reused by every run, or a resumed run);
else it is opened. Comments, reviews and issues carry the write's hidden marker, looked up
first when a previous process may have written them (`resumed`). Labels are idempotent.
"""
from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .client import GitHubClient, Written
from .push import push_branch
from .settings import GitHubError, settings_from_env


def require_library() -> None:
    """A GitHubError unless githubkit (the `github` extra) can be imported."""
    if importlib.util.find_spec("githubkit") is None:
        raise GitHubError("this loop publishes to GitHub (`publish:`), which needs the `github` extra "
                          "(githubkit), not installed here",
                          "pip install 'loopdsl[github]' (or remove `publish:` from the loop)")


def check_ready(token_secret: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse to start a publishing run that could not publish: library, repository, token."""
    require_library()
    settings_from_env(token_secret, env)


def _result(written: Written, action: str) -> dict[str, Any]:
    return {"number": written.number, "url": written.url, "action": action}


class GitHubPublisher:
    def __init__(self, token_secret: str, repo: Path | None, env: Mapping[str, str] | None = None) -> None:
        require_library()
        self.settings = settings_from_env(token_secret, env)
        self.client = GitHubClient(self.settings)
        self.repo = repo

    def write(self, item: Mapping[str, Any], number: int | None, resumed: bool) -> dict[str, Any]:
        kind = item["kind"]
        if kind == "pull_request":
            return self._pull_request(item)
        if kind == "issue":
            found = self.client.find_issue(item["marker"]) if resumed else None
            return _result(found, "found") if found else _result(
                self.client.create_issue(item["title"], item["body"], list(item.get("labels") or [])), "created")
        assert number is not None, kind  # apply_plan resolved it
        if kind == "comment":
            found = self.client.find_comment(number, item["marker"]) if resumed else None
            return _result(found, "found") if found else _result(
                self.client.create_comment(number, item["body"]), "created")
        if kind == "review":
            found = self.client.find_review(number, item["marker"]) if resumed else None
            return _result(found, "found") if found else _result(
                self.client.create_review(number, item["event"], item["body"]), "created")
        if kind == "labels":
            if item.get("add"):
                self.client.add_labels(number, list(item["add"]))
            for label in item.get("remove") or ():
                self.client.remove_label(number, label)
            return {"number": number, "url": "", "action": "labelled",
                    "added": list(item.get("add") or []), "removed": list(item.get("remove") or [])}
        raise GitHubError(f"publish: unknown write {kind!r}")

    def _pull_request(self, item: Mapping[str, Any]) -> dict[str, Any]:
        if self.repo is None:
            raise GitHubError("publish pull_request: the run has no repository to push from",
                              "the loop needs `workspace: {worktree: true}`")
        branch = str(item["branch"])
        push_branch(self.repo, str(item["commit"]), branch, self.settings.token, force=bool(item.get("fixed")))
        existing = self.client.find_open_pull(branch)
        if existing is not None:
            return _result(self.client.update_pull(existing.number, item["title"], item["body"]), "updated")
        base = item.get("base") or self.client.default_branch()
        return _result(self.client.create_pull(item["title"], item["body"], branch, str(base)), "created")
