"""Checkpoints reachable on GitHub, and what the write job applies.

A run that waits at a checkpoint leaves `checkpoint.json` (run id, message, choices, the
issue or pull request of its event) in the run job's output folder; the apply job posts it
as a comment there, once (a marker in the body finds an earlier post). A person answers
with `/loopdsl approve RUN`; `github-event` lets the decision through only when GitHub
says that person may write to the repository.

The message is the loop's rendered checkpoint text and may quote model output: it is posted
inside a fenced code block, where GitHub renders no markdown, so it mentions nobody, links
nothing and closes no issue.
"""
from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from ..adapters.git_safe import run_git
from ..adapters.github.push import git_token
from ..api.store_access import store_copy
from ..language.errors import LoopdslError
from ..runtime.publish_apply import publish_pending
from ..runtime.errors import StoreError
from ..runtime.redaction import hide_credentials, redact_printed
from ..runtime.run_state import RunState
from . import runs_branch, worktree_carry
from .github_event import DECISION_COMMAND, GitHubEventError

CHECKPOINT_FILE = "checkpoint.json"
BUNDLE_FILE = "branches.bundle"
STORE_FOLDER = "store"
MAX_MESSAGE_CHARS = 20_000
ACTIONS_BOT = "github-actions[bot]"  # who GitHub says posted a comment made with the workflow's token
_MARKER = re.compile(r"\A<!-- loopdsl:checkpoint ([a-z0-9][a-z0-9._-]{0,79}) ([A-Za-z0-9_.-]{1,100}) -->")
WRITERS = ("admin", "write")  # what GitHub's permission endpoint says for admin, maintain and write


def require_writer(actor: str) -> None:
    """Refuse unless `actor` has write access to GITHUB_REPOSITORY (asked of GITHUB_API_URL)."""
    from ..adapters.github import GitHubClient, settings_from_env  # deferred: the optional `github` extra

    if not actor:
        raise GitHubEventError("the comment has no author; the decision is refused")
    level = GitHubClient(settings_from_env()).permission(actor)
    if level not in WRITERS:
        raise GitHubEventError(f"{actor} may not start or decide runs: their permission on the repository is {level!r}",
                               "a person with write access must comment the command")


def checkpoint_record(run_id: str, loop_name: str, waiting: dict[str, Any], number: int | None) -> dict[str, Any]:
    return {"run_id": run_id, "loop": loop_name, "state": str(waiting.get("state", "")),
            # Posted on the issue: no secret this process read, and no credential a command printed.
            "message": hide_credentials(redact_printed(str(waiting.get("message", ""))))[:MAX_MESSAGE_CHARS],
            "choices": [str(c) for c in waiting.get("choices") or ("approve", "reject")], "number": number}


def _fence(text: str) -> str:
    """A code fence longer than any backtick run in `text`, so the text cannot close it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def checkpoint_comment(record: dict[str, Any]) -> tuple[str, str]:
    """(marker, body) of the comment that asks for a decision."""
    run_id, state = record["run_id"], record["state"]
    marker = f"<!-- loopdsl:checkpoint {run_id} {state} -->"
    fence = _fence(record["message"])
    choices = record["choices"]
    how = [f"`{DECISION_COMMAND} approve {run_id}`", f"`{DECISION_COMMAND} reject {run_id}`"] \
        if set(choices) <= {"approve", "reject"} else [f"`{DECISION_COMMAND} decide {run_id} {c}`" for c in choices]
    body = "\n".join([
        marker,
        f"**loopdsl: run `{run_id}` of `{record['loop']}` waits at checkpoint `{state}`.**",
        "", f"{fence}text", record["message"], fence, "",
        "Decide with a comment (a person with write access to this repository): " + " or ".join(how) + ".",
        "Lines after the first are kept as the decision's comment.",
    ])
    return marker, body


def checkpoint_runs(number: int) -> list[tuple[str, str]]:
    """(run id, state) of the checkpoint comments on #`number`, newest first. Only comments the
    workflow's own token posted count (GitHub names its author `github-actions[bot]`, a login no
    person can take): anyone can write a comment that looks like a marker."""
    from ..adapters.github import GitHubClient, settings_from_env  # deferred: the optional `github` extra

    found = []
    for comment in GitHubClient(settings_from_env()).comments(number):
        user = comment.get("user")
        match = _MARKER.match(str(comment.get("body") or ""))
        if match and isinstance(user, dict) and user.get("login") == ACTIONS_BOT:
            found.append((match.group(1), match.group(2)))
    return found[::-1]


def review_target(store: Any, loop_name: str, number: int, choice: str) -> tuple[str | None, str]:
    """(run id, "") of `loop_name`'s run waiting on pull request #`number` that a review's
    `choice` decides, or (None, why not). `store` is the loop's open run store."""
    for run_ref, state_name in checkpoint_runs(number):
        try:
            run_id = store.resolve(run_ref)
        except StoreError:
            continue  # another loop's run: its own workflow decides it
        state = RunState.from_json(store.load_run(run_id))
        if state.loop != loop_name or state.status != "waiting" or not state.waiting or state.waiting.get("state") != state_name:
            continue
        choices = [str(c) for c in state.waiting.get("choices") or ("approve", "reject")]
        if choice not in choices:
            return None, (f"run {run_id} waits at checkpoint {state_name!r}, whose choices ({', '.join(choices)}) "
                          f"have no {choice!r}: the review decides nothing; comment "
                          f"`{DECISION_COMMAND} decide {run_id} CHOICE` instead")
        return run_id, ""
    return None, f"no run of this loop waits on #{number}"


def write_checkpoint(out_dir: Path, record: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CHECKPOINT_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")


def post_checkpoint(out_dir: Path) -> str:
    """Post the waiting run's checkpoint comment (once); what was done, in words."""
    path = out_dir / CHECKPOINT_FILE
    if not path.is_file():
        return "no run waits"
    record = json.loads(path.read_text(encoding="utf-8"))
    number = record.get("number")
    if not isinstance(number, int) or isinstance(number, bool):
        return (f"run {record.get('run_id')} waits at {record.get('state')}; the event has no issue or pull request "
                "to comment on: decide it by running the workflow by hand with run_id and decision")
    from ..adapters.github import GitHubClient, settings_from_env  # deferred: the optional `github` extra

    client = GitHubClient(settings_from_env())
    marker, body = checkpoint_comment(record)
    if client.find_comment(number, marker) is not None:
        return f"the checkpoint comment of run {record['run_id']} is already on #{number}"
    client.create_comment(number, body)
    return f"posted the checkpoint of run {record['run_id']} on #{number}"


def pack(repo: Path, store_dir: Path, out_dir: Path, keep_store: bool) -> tuple[int, int]:
    """Copy the store and bundle the runs' branches (loopdsl/*) into `out_dir`: (files, branches)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = 0
    if keep_store:
        # Worktrees carried in by the restore are carried out afresh: only those of runs still waiting.
        files = runs_branch.copy_store(store_dir, out_dir / STORE_FOLDER, frozenset({worktree_carry.CARRY_DIR}))
        files += 2 * len(worktree_carry.carry_out(repo, store_dir, out_dir / STORE_FOLDER))
    refs = run_git(repo, "for-each-ref", "--format=%(refname)", "refs/heads/loopdsl/").stdout.split()
    if refs:
        bundle = str((out_dir / BUNDLE_FILE).resolve())
        # Only the commits origin lacks (the apply job has a full clone); a branch with no new
        # commit makes that bundle empty, which git refuses: then the whole history goes.
        if run_git(repo, "bundle", "create", "--quiet", bundle, *refs, "--not", "--remotes=origin",
                   check=False).returncode != 0:
            run_git(repo, "bundle", "create", "--quiet", bundle, *refs)
    # Never an empty folder: the artifact upload treats one as a broken run job.
    (out_dir / "manifest.json").write_text(json.dumps({"store_files": files, "branches": refs}), encoding="utf-8")
    return files, len(refs)


def publish_pending_runs(store_dir: Path) -> tuple[list[str], list[LoopdslError]]:
    """Make the `publish:` writes the run job planned and left (it held no write token): each
    completed run whose writes are not all made is resumed, which makes only those. Returns
    the runs published and the errors of those that could not be (their store records why)."""
    from ..api.durable import resume_durable

    if not store_dir.is_dir():
        return [], []
    # Read from a copy: opening a store writes to its database, and an untouched store must
    # stay byte-for-byte the same so that saving it adds no commit.
    with store_copy(store_dir) as store:
        due = [r["run_id"] for r in store.list_runs() if r.get("status") == "completed"
               and publish_pending(RunState.from_json(store.load_run(r["run_id"])))]
    done, failed = [], []
    for run_id in due:
        try:
            asyncio.run(resume_durable(run_id, store=store_dir))
            done.append(run_id)
        except LoopdslError as exc:
            failed.append(exc)
    return done, failed


def push_run_branches(repo: Path, out_dir: Path, token: str | None) -> list[str]:
    """Push the branches of the bundle (only loopdsl/* ones) to origin; their names."""
    bundle = out_dir / BUNDLE_FILE
    if not bundle.is_file():
        return []
    run_git(repo, "fetch", "--no-tags", "--quiet", str(bundle.resolve()), "+refs/heads/loopdsl/*:refs/loopdsl-runs-in/*")
    refs = run_git(repo, "for-each-ref", "--format=%(refname)", "refs/loopdsl-runs-in/").stdout.split()
    names = [ref.removeprefix("refs/loopdsl-runs-in/") for ref in refs]
    if names:
        with git_token(token) as config:
            pushed = run_git(repo, "push", "--porcelain", "origin",
                             *[f"{ref}:refs/heads/loopdsl/{name}" for ref, name in zip(refs, names)],
                             check=False, config=config)
        if pushed.returncode != 0:
            raise runs_branch.push_failure("pushing the runs' branches", f"{pushed.stdout} {pushed.stderr}", token)
    return [f"loopdsl/{name}" for name in names]
