"""GitHub: the REST client (githubkit, the optional `github` extra) and pushing a run's branch.

`settings` and `push` import nothing optional; `client` imports githubkit when a client is
built. Publishing (`publish:`) and GitHub checkpoints use these, never the library directly.
"""
from __future__ import annotations

from .client import GitHubClient, Written
from .push import push_branch, remote_sha
from .settings import DEFAULT_TOKEN_SECRET, GitHubError, GitHubSettings, settings_from_env

__all__ = ["DEFAULT_TOKEN_SECRET", "GitHubClient", "GitHubError", "GitHubSettings", "Written",
           "push_branch", "remote_sha", "settings_from_env"]
