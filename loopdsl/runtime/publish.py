"""`publish:` planned: every declared GitHub write rendered, capped, scanned and validated.

Called by the API after a run's `completed` end (and its branch commit), never by the
engine mid-run and never by the model. Everything is decided here before anything is
written: a template that fails, a number that is not one, a label too long, or a text
that holds a secret (a declared secret's value in any of its encodings, or a credential's
shape: `redaction.find_secrets`) stops the whole publish with nothing written.

The values a template prints are data: a model's words may not mention people (`@name`),
close issues (`closes #12`) or hide text in an HTML comment, alone or joined with another
value or the template's text (`_made_inert`). The template's own text is left as written:
a loop that means `Fixes #{{ n }}` writes the keyword itself. The plan is stored in the run (`meta.publish`), so a resumed
run applies the same texts (runtime/publish_apply.py).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

from ..language.errors import LoopdslError
from ..language.publish_model import RUN_BRANCH, Publish
from ..language.sandbox import values_as_data
from ..language.templates import RenderError, compile_template
from .redaction import find_secrets

if TYPE_CHECKING:
    from .engine import Engine

EXIT_PUBLISH = 6  # docs/cli.md: the run completed, its `publish:` did not (all or part)
TITLE_LIMIT = 256  # GitHub's own limit on titles
BODY_LIMIT = 60_000  # bytes; GitHub refuses bodies over 65,536 characters
LABEL_LIMIT = 50  # GitHub's limit on a label's name
ZWJ = "\u200d"  # zero-width joiner: invisible, and breaks the words GitHub acts on

_MENTION = re.compile(r"@(?=[A-Za-z0-9])")
# GitHub's closing keywords, followed by what they close: #N, owner/repo#N or an issue URL.
_CLOSING = re.compile(r"\b(clos(?:e[sd]?)|fix(?:e[sd])?|resolve[sd]?)(?=\s*:?\s+(?:[\w.-]+/[\w.-]+)?#\d"
                      r"|\s*:?\s+https?://\S+/(?:issues|pull)/\d)", re.IGNORECASE)
_HIDDEN = re.compile(r"<!--")
_NUMBER = re.compile(r"[1-9][0-9]{0,9}")


class PublishError(LoopdslError):
    """A publish that cannot be done or was not finished; the run itself is `completed`."""

    exit_code = EXIT_PUBLISH


def neutralise(text: str) -> str:
    """`text` (a value a template prints) made inert: no mention, no closing keyword, no
    hidden comment. Each is broken by a zero-width joiner, so it reads the same."""
    return _made_inert(_fenced(text))


# While a text renders, each printed value is fenced by these two private-use characters, so
# that a mention, closing keyword or `<!--` a value takes part in is found in the whole text:
# one may be made of two values (`{% for %}` over a model's list: `@` then `octocat`), or of a
# value and the template's text beside it.
_OPEN, _CLOSE = "\ue000", "\ue001"


def _fenced(value: str) -> str:
    return _OPEN + value.replace(_OPEN, "").replace(_CLOSE, "") + _CLOSE


def _made_inert(text: str) -> str:
    """The rendered text without its fences, each mention (its `@`), closing keyword or `<!--`
    that has a character of a printed value broken by a zero-width joiner after its first
    character. What the template writes whole stays, and so does a reference a value fills in
    after the template's own keyword (`Fixes #{{ inputs.issue }}`)."""
    chars: list[str] = []
    from_value: list[bool] = []
    depth = 0
    for char in text:
        if char == _OPEN:
            depth += 1
        elif char == _CLOSE:
            depth = max(0, depth - 1)
        else:
            chars.append(char)
            from_value.append(depth > 0)
    plain = "".join(chars)
    cuts = {match.start() + 1 for pattern in (_MENTION, _CLOSING, _HIDDEN) for match in pattern.finditer(plain)
            if any(from_value[match.start():match.end()])}
    for cut in sorted(cuts, reverse=True):
        plain = plain[:cut] + ZWJ + plain[cut:]
    return plain


def marker(run_id: str, kind: str) -> str:
    """The hidden line a write carries so a resumed run finds it instead of writing again."""
    return f"<!-- loopdsl:{run_id}:{kind} -->"


class _Renderer:
    """Renders `publish:` texts with one run's context; collects every problem."""

    def __init__(self, context: Mapping[str, Any], secrets: tuple[str, ...]) -> None:
        self.context = context
        self.secrets = secrets
        self.problems: list[str] = []

    def text(self, where: str, source: str, cap: int, data: bool = True) -> str:
        """`source` rendered (its printed values neutralised when `data`), cut at `cap` bytes."""
        try:
            template = compile_template(source)
            if data:
                with values_as_data(_fenced):
                    out = _made_inert(template.render(self.context, cap=cap))
            else:
                out = template.render(self.context, cap=cap)
        except RenderError as exc:
            self.problems.append(f"{where}: {exc}")
            return ""
        for found in find_secrets(out, self.secrets):
            self.problems.append(f"{where} holds {found}")
        return out

    def title(self, where: str, source: str) -> str:
        failed = len(self.problems)
        out = " ".join(self.text(where, source, TITLE_LIMIT * 4).split())  # a title is one line
        if not out and len(self.problems) == failed:
            self.problems.append(f"{where} rendered empty")
        return out if len(out) <= TITLE_LIMIT else out[:TITLE_LIMIT - 1] + "…"

    def number(self, where: str, source: str | None) -> int | None:
        if source is None:
            return None
        failed = len(self.problems)
        out = self.text(where, source, 64, data=False).strip()
        if _NUMBER.fullmatch(out):
            return int(out)
        if len(self.problems) == failed:
            self.problems.append(f"{where} rendered {out[:40]!r}, not an issue or pull request number")
        return None

    def labels(self, where: str, sources: tuple[str, ...]) -> list[str]:
        names = []
        for i, source in enumerate(sources):
            name = self.text(f"{where}[{i}]", source, LABEL_LIMIT * 4, data=False).strip()
            if not name or len(name) > LABEL_LIMIT or any(ord(c) < 32 for c in name):
                self.problems.append(f"{where}[{i}] rendered {name[:60]!r}: a label is 1-{LABEL_LIMIT} "
                                     "characters on one line")
            elif name not in names:
                names.append(name)
        return names


def plan_items(publish: Publish, context: Mapping[str, Any], secrets: tuple[str, ...],
               run_id: str, worktree: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The writes to make, in order, rendered; a PublishError lists every problem found.
    `worktree` is the run's `meta.worktree`: its branch, and the commit made at its end."""
    r = _Renderer(context, secrets)
    items: list[dict[str, Any]] = []
    # A run that changed nothing has nothing to propose: no pull request, nor what refers to it.
    unchanged = bool(worktree.get("branch")) and not worktree.get("commit")
    if (pr := publish.pull_request) is not None and not unchanged:
        fixed = pr.branch != RUN_BRANCH
        items.append({"kind": "pull_request", "title": r.title("pull_request.title", pr.title),
                      "body": r.text("pull_request.body", pr.body, BODY_LIMIT),
                      "branch": pr.branch if fixed else worktree.get("branch"), "fixed": fixed,
                      "base": pr.base, "commit": worktree.get("commit")})
        if not worktree.get("branch"):
            r.problems.append("pull_request: the run has no branch (it needs `workspace: {worktree: true}`)")
    if (issue := publish.issue) is not None:
        items.append({"kind": "issue", "title": r.title("issue.title", issue.title),
                      "body": r.text("issue.body", issue.body, BODY_LIMIT),
                      "labels": r.labels("issue.labels", issue.labels)})
    if (comment := publish.comment) is not None:
        items.append({"kind": "comment", "on": comment.on, "number": r.number("comment.number", comment.number),
                      "body": r.text("comment.body", comment.body, BODY_LIMIT)})
    if (labels := publish.labels) is not None:
        items.append({"kind": "labels", "on": labels.on, "number": r.number("labels.number", labels.number),
                      "add": r.labels("labels.add", labels.add), "remove": r.labels("labels.remove", labels.remove)})
    if (review := publish.review) is not None:
        items.append({"kind": "review", "on": "pull_request", "number": r.number("review.number", review.number),
                      "event": review.event, "body": r.text("review.body", review.body, BODY_LIMIT)})
    if r.problems:
        raise PublishError("publish: nothing was written to GitHub: " + "; ".join(r.problems[:8]),
                           "fix the loop's `publish:` templates (or what they print), then "
                           f"`loopdsl resume {run_id} --force` publishes the completed run")
    if unchanged and publish.pull_request is not None:  # what would have gone on that pull request
        items = [i for i in items if not (i.get("on") == "pull_request" and i.get("number") is None)]
    for item in items:
        item["marker"] = marker(run_id, item["kind"])
        if "body" in item:
            item["body"] = f"{item['body'].rstrip()}\n\n{item['marker']}\n".lstrip()
    return items


def plan_for(engine: "Engine") -> list[dict[str, Any]]:
    """The run's publish plan, rendered with the context its outputs were rendered with."""
    run = engine.run
    context = engine._refresh_context(run.current, 1)
    return plan_items(engine.loop.publish, context, engine.redact.values, run.run_id,
                      run.meta.get("worktree") or {})
