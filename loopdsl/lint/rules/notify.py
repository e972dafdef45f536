"""Lint rules for `notify:` webhooks (docs/dsl.md, notify).

A webhook URL is often a credential in itself (anyone who has a Slack incoming-webhook
URL can post to the channel), and the loop file is committed and shared: a literal URL
that looks like it carries one must move into a declared secret.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import parse_qsl, urlsplit

from ...language.diagnostics import Diagnostic
from ...language.model import NOTIFY_STATUSES
from ..registry import LintContext, did_you_mean, quoted_list, rule

# Hosts and paths whose URLs are secret by design: the path is the token.
_SECRET_URLS = re.compile(
    r"^(hooks\.slack\.com/(services|workflows|triggers)/"
    r"|(discord|discordapp)\.com/api/webhooks/"
    r"|[a-z0-9-]+\.webhook\.office\.com/"
    r"|outlook\.office(365)?\.com/webhook"
    r"|api\.telegram\.org/bot"
    r"|chat\.googleapis\.com/)",
    re.IGNORECASE,
)
# Query keys that carry credentials (`?token=`, `?api_key=`, `?sig=` ...).
_SECRET_KEY = re.compile(r"token|key|secret|sig|pass|pwd|auth|credential|code", re.IGNORECASE)
# A path part that looks generated (long, letters and digits): a token in the path.
_TOKEN_PART = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_\-.~]{24,}$")


def credential_in_url(url: str) -> str | None:
    """What in a literal URL looks like a credential, in words; None if nothing does."""
    try:
        parts = urlsplit(url)
        if parts.username or parts.password:
            return "a user name or password (user:password@)"
    except ValueError:
        return None
    if _SECRET_URLS.match(f"{parts.hostname or ''}{parts.path}"):
        return f"a token in its path ({parts.hostname} webhook URLs are credentials)"
    for key, _ in parse_qsl(parts.query, keep_blank_values=True):
        if _SECRET_KEY.search(key):
            return f"a credential in its query (`{key}=`)"
    if any(_TOKEN_PART.match(part) for part in parts.path.split("/")):
        return "what looks like a token in its path"
    return None


def _bad_url(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"is not a URL ({exc})"
    if "{{" in url or "{%" in url:
        return "is a template; `webhook` takes a literal URL"
    if parts.scheme.lower() not in ("http", "https"):
        return f"has scheme '{parts.scheme}'" if parts.scheme else "has no scheme"
    if not parts.hostname:
        return "has no host"
    return None


@rule
def notify_status(ctx: LintContext) -> Iterator[Diagnostic]:
    for entry in ctx.loop.notify:
        for j, status in enumerate(entry.on):
            if status in NOTIFY_STATUSES:
                continue
            hint = ("a run is `running` from its start to its end; name the statuses it stops in"
                    if status == "running" else f"statuses: {', '.join(NOTIFY_STATUSES)}")
            yield ctx.diag("notify-status", f'notify on unknown status "{status}"{did_you_mean(status, NOTIFY_STATUSES)}',
                           (*entry.yaml_path, "on", j), value=True, hint=hint)


@rule
def notify_url(ctx: LintContext) -> Iterator[Diagnostic]:
    for entry in ctx.loop.notify:
        if entry.webhook is None:
            continue
        path = (*entry.yaml_path, "webhook")
        problem = _bad_url(entry.webhook)
        if problem is not None:
            hint = ("to read the URL from a secret write `secret: NAME` instead of `webhook:`"
                    if "{{" in entry.webhook else "a webhook is an http:// or https:// URL")
            yield ctx.diag("notify-url", f"webhook URL {problem}", path, value=True, hint=hint)
            continue
        credential = credential_in_url(entry.webhook)
        if credential is not None:
            yield ctx.diag("notify-url-credential", f"webhook URL carries {credential}; the loop file would share it",
                           path, value=True,
                           hint="declare a secret (`secrets: [WEBHOOK_URL]`), write `secret: WEBHOOK_URL` instead of "
                                "`webhook:`, and set WEBHOOK_URL in the environment that runs the loop")


@rule
def notify_secret(ctx: LintContext) -> Iterator[Diagnostic]:
    declared = set(ctx.loop.secrets)
    for entry in ctx.loop.notify:
        if entry.secret is not None and entry.secret not in declared:
            yield ctx.diag("notify-secret",
                           f"notify reads its URL from secret {entry.secret}, which is not declared"
                           f"{did_you_mean(entry.secret, declared)}",
                           (*entry.yaml_path, "secret"), value=True,
                           hint=f"add it to `secrets:` (declared: {quoted_list(declared)})")
