"""Lint rules for `publish:`, the GitHub writes a loop declares (docs/dsl.md, publish).

The templates themselves are checked as template sites (syntax, names, secrets); these
rules check what only `publish` means: the token is a declared secret, a pull request has
a branch to push, every write knows which issue or pull request it goes to, and a fixed
branch (force-pushed by each run) can never be the branch it merges into.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

from ...language.diagnostics import Diagnostic
from ...language.publish_model import RUN_BRANCH, Publish
from ..registry import LintContext, did_you_mean, quoted_list, rule

# What `git check-ref-format --branch` refuses, checked without running git.
_BAD_REF = re.compile(r"(^[-/.]|[/.]$|\.\.|//|@\{|[\x00-\x20\x7f~^:?*\[\\]|\.lock(/|$)|/\.)")
_PROTECTED = ("main", "master", "trunk", "develop", "HEAD")


def _publish(ctx: LintContext) -> Publish | None:
    return ctx.loop.publish if isinstance(ctx.loop.publish, Publish) else None


@rule
def publish_token(ctx: LintContext) -> Iterator[Diagnostic]:
    publish = _publish(ctx)
    if publish is None or publish.token in ctx.loop.secrets:
        return
    declared = set(ctx.loop.secrets)
    written = "token" in (ctx.doc.data.get("publish") or {})
    yield ctx.diag("publish-token",
                   f"publish authenticates with secret {publish.token}, which is not declared"
                   f"{did_you_mean(publish.token, declared)}",
                   ("publish", "token") if written else ("publish",), value=written,
                   hint=f"add {publish.token} to `secrets:` (declared: {quoted_list(declared)}); "
                        "a declared secret is read from the environment and redacted everywhere")


@rule
def publish_worktree(ctx: LintContext) -> Iterator[Diagnostic]:
    publish = _publish(ctx)
    if publish is None or publish.pull_request is None or ctx.loop.workspace.worktree:
        return
    yield ctx.diag("publish-worktree", "publish opens a pull request, but the run has no branch to push",
                   ("publish", "pull_request"),
                   hint="add `workspace: {worktree: true}`: the run works on its own branch, committed at a "
                        "`completed` end, which publish pushes")


@rule
def publish_number(ctx: LintContext) -> Iterator[Diagnostic]:
    publish = _publish(ctx)
    if publish is None:
        return
    opened = {"pull_request": publish.pull_request is not None, "issue": publish.issue is not None}
    parts = (("comment", publish.comment, getattr(publish.comment, "on", "")),
             ("labels", publish.labels, getattr(publish.labels, "on", "")),
             ("review", publish.review, "pull_request"))
    for key, part, on in parts:
        if part is None or part.number is not None or opened.get(on):
            continue
        what = "pull request" if on == "pull_request" else "issue"
        yield ctx.diag("publish-number", f"publish {key} does not say which {what} it goes to",
                       ("publish", key),
                       hint=f'add `number: "{{{{ inputs.{"pr" if on == "pull_request" else "issue"} }}}}"` '
                            f"(an input the trigger fills), or open the {what} in the same publish "
                            f"(`{on}:`), which it then refers to")


@rule
def publish_branch(ctx: LintContext) -> Iterator[Diagnostic]:
    publish = _publish(ctx)
    if publish is None or publish.pull_request is None or publish.pull_request.branch == RUN_BRANCH:
        return
    pr = publish.pull_request
    path = ("publish", "pull_request", "branch")
    if "{{" in pr.branch or "{%" in pr.branch:
        yield ctx.diag("publish-branch", "publish branch is a template; it is `run` or a fixed name", path,
                       value=True, hint="write `branch: run` for a branch per run, or a literal name the loop owns")
    elif _BAD_REF.search(pr.branch) or pr.branch.startswith("refs/"):
        yield ctx.diag("publish-branch", f'"{pr.branch}" is not a valid branch name', path, value=True,
                       hint="a branch name like loopdsl/ci-sweeper: no spaces, `..`, `~^:?*[\\`, leading `-`")
    elif pr.branch in {pr.base, ctx.loop.workspace.base, *_PROTECTED}:
        yield ctx.diag("publish-branch",
                       f'publish branch "{pr.branch}" is force-pushed by every run; it cannot be a branch people '
                       "merge into", path, value=True,
                       hint="name a branch the loop owns (e.g. loopdsl/NAME), or write `branch: run`")


@rule
def publish_ends(ctx: LintContext) -> Iterator[Diagnostic]:
    publish = _publish(ctx)
    if publish is None:
        return
    completed = {name for name, state in ctx.loop.states.items() if state.end == "completed"}
    for i, name in enumerate(publish.ends):
        if name not in completed:
            what = "is not a state" if name not in ctx.loop.states else "is not an `end: completed` state"
            yield ctx.diag("publish-ends", f'publish after "{name}", which {what}{did_you_mean(name, completed)}',
                           ("publish", "ends", i), value=True,
                           hint=f"publish happens only at a completed end: {quoted_list(completed)}")
