"""Where the GitHub client talks to and with which token, read from the environment.

The names are the ones GitHub Actions sets in every job: `GITHUB_API_URL` (github.com's
API, a GitHub Enterprise Server's `https://HOST/api/v3`, or a test server) and
`GITHUB_REPOSITORY` (`owner/name`). The token is the value of a secret the loop declares
(`GITHUB_TOKEN` unless the loop names another), read from the environment like every
declared secret and never stored.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...language.errors import LoopdslError

DEFAULT_API_URL = "https://api.github.com"
DEFAULT_TOKEN_SECRET = "GITHUB_TOKEN"
# GitHub's own limits on owner and repository names (letters, digits, `-`, `_`, `.`).
_REPOSITORY = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}")


class GitHubError(LoopdslError):
    """A GitHub call or setting the user can act on (exit code 2, like every usage error)."""


@dataclass(frozen=True)
class GitHubSettings:
    api_url: str
    owner: str
    repo: str
    token: str = field(repr=False)  # a secret: never in a repr, a log or an error
    token_secret: str = DEFAULT_TOKEN_SECRET

    @property
    def repository(self) -> str:
        return f"{self.owner}/{self.repo}"


def settings_from_env(token_secret: str = DEFAULT_TOKEN_SECRET,
                      env: Mapping[str, str] | None = None) -> GitHubSettings:
    """The settings of this process's environment, or a GitHubError naming what is missing."""
    env = os.environ if env is None else env
    repository = env.get("GITHUB_REPOSITORY", "").strip()
    if not repository:
        raise GitHubError("GITHUB_REPOSITORY is not set: publishing needs the repository to write to",
                          "set GITHUB_REPOSITORY=owner/name (GitHub Actions sets it in every job)")
    if not _REPOSITORY.fullmatch(repository):
        raise GitHubError(f"GITHUB_REPOSITORY is {repository[:120]!r}, not `owner/name`",
                          "set GITHUB_REPOSITORY=owner/name, e.g. octo/widgets")
    api_url = (env.get("GITHUB_API_URL") or DEFAULT_API_URL).strip().rstrip("/")
    if not re.match(r"https?://[^/\s]+", api_url):
        raise GitHubError(f"GITHUB_API_URL is {api_url[:120]!r}, not an http(s) URL",
                          f"unset it for github.com ({DEFAULT_API_URL}), or set https://HOST/api/v3")
    token = env.get(token_secret, "")
    if not token:
        raise GitHubError(f"the secret {token_secret} (the GitHub token) is not set",
                          f"export {token_secret}=... (in Actions: `env: {token_secret}: "
                          "${{ secrets.GITHUB_TOKEN }}`)")
    owner, repo = repository.split("/", 1)
    return GitHubSettings(api_url, owner, repo, token, token_secret)
