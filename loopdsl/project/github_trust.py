"""What the apply job accepts of the run job's artifact before it writes anything.

The run job runs the repository's own code (the loop's gates, the tests an agent may have
changed) as the same user that holds the run store, and that code can leave a process
behind that edits the store until the artifact is uploaded. So nothing in the artifact is
evidence of anything: a run could claim to have completed past its checkpoint, or carry
`publish:` writes the run never planned. The apply job holds the write token, so it decides
what to write from what it trusts itself: the loop file of its own checkout (which writes
the loop may make), the event GitHub hands *its* job (which run a person decided, and how),
GitHub's permission endpoint (whether that person may), and the checkpoint comments the
workflow's token posted (which run waits on a reviewed pull request). docs/github.md has
the threat and what is left of it.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..adapters.git_safe import run_git
from ..adapters.git_worktree import BRANCH_PREFIX
from ..adapters.store.run_store import RunStore
from ..api.runs import open_store
from ..api.store_access import store_copy
from ..language.model import Loop
from ..runtime.publish_apply import publish_pending
from ..runtime.redaction import find_secrets
from ..runtime.errors import StoreError
from ..runtime.run_state import RunState
from ..runtime.scratch import scratch_folder
from . import runs_branch
from .export import checkpoints
from .github_checkpoints import BUNDLE_FILE, checkpoint_runs, require_writer
from .github_event import GitHubEventError, event_number, plan, read_event

_TEXTS = ("title", "body")
_LISTS = ("labels", "add", "remove")


class ArtifactRefused(GitHubEventError):
    """The run job's artifact asks for writes its own evidence cannot justify; exit 2."""


@dataclass
class Decision:
    """A decision this workflow run's event makes, checked by the apply job itself."""

    runs: list[str]  # the run ids (or unambiguous prefixes) it may be for
    choice: str


def declared_kinds(loop: Loop) -> set[str]:
    publish = loop.publish
    if publish is None:
        return set()
    return {kind for kind in ("pull_request", "issue", "comment", "labels", "review")
            if getattr(publish, kind) is not None}


def trusted_decision(loop: Loop, env: Mapping[str, str]) -> Decision | None:
    """The decision this job's own event makes, its author's write access asked of GitHub again."""
    try:
        name, payload = read_event(env)
        todo = plan(loop, name, payload)
    except GitHubEventError:
        return None
    if todo.action not in ("decide", "review"):
        return None
    if todo.actor:
        require_writer(todo.actor)
    if todo.action == "decide":
        return Decision([todo.run_ref], todo.choice)
    return Decision([run for run, _ in checkpoint_runs(todo.number)] if todo.number else [], todo.choice)


@contextmanager
def _artifact_store(store_dir: Path) -> Iterator[RunStore | None]:
    """The artifact's run store, read from a copy (opening a store writes to it), once for all
    the checks; None when the artifact carries none."""
    if not store_dir.is_dir():
        yield None
        return
    with store_copy(store_dir) as store:
        yield store


def _due(store: RunStore) -> list[tuple[RunState, list[dict[str, Any]]]]:
    """The runs of the artifact's store with `publish:` writes still to make, with their events."""
    states = [RunState.from_json(store.load_run(r["run_id"])) for r in store.list_runs()]
    return [(s, store.events(s.run_id)) for s in states if s.status == "completed" and publish_pending(s)]


def _item_problems(item: Any, kinds: set[str], secrets: tuple[str, ...]) -> list[str]:
    if not isinstance(item, dict) or item.get("kind") not in kinds:
        kind = item.get("kind") if isinstance(item, dict) else item
        return [f"a {str(kind)[:40]!r} write the loop's `publish:` does not declare"]
    texts = [str(item.get(k) or "") for k in _TEXTS] + [str(v) for k in _LISTS for v in item.get(k) or ()]
    return [f"its {item['kind']} write holds {found}" for text in texts for found in find_secrets(text, secrets)]


def _decision_problem(state: RunState, events: list[dict[str, Any]], decision: Decision | None) -> str:
    if decision is None or not any(state.run_id.startswith(ref) for ref in decision.runs if ref):
        return "it went past a checkpoint, but the event of this workflow run decides no such run"
    made = [e.get("decision") for e in events if isinstance(e, dict) and e.get("type") == "decision"]
    if not made or made[-1] != decision.choice:
        return f"its store says it was decided {made[-1] if made else 'never'!r}; the event says {decision.choice!r}"
    return ""


def stored_run_ids(repo: Path, loop_name: str, token: str | None) -> set[str]:
    """The runs of the loop on the runs branch (only apply jobs push there): the runs that
    existed before this workflow run."""
    with scratch_folder("loopdsl-store-") as scratch:
        if not runs_branch.restore(repo, loop_name, scratch / "store", token):
            return set()
        with open_store(scratch / "store", repo, create=False) as store:
            return {str(r["run_id"]) for r in store.list_runs()}


def checkpoint_problem(loop: Loop, out_dir: Path, repo: Path, env: Mapping[str, str],
                       store: RunStore | None) -> str:
    """Why the artifact's checkpoint may not be posted: it is posted as the workflow's bot, and
    a review of that pull request then decides the run the comment names."""
    path = out_dir / "checkpoint.json"
    if not path.is_file():
        return ""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        name, payload = read_event(env)
    except (ValueError, OSError, GitHubEventError) as exc:
        return f"its checkpoint cannot be checked ({str(exc)[:200]})"
    if not isinstance(record, dict):
        return "its checkpoint is not a JSON object"
    run_id, number = str(record.get("run_id", "")), event_number(payload)
    if record.get("number") != number:
        return f"its checkpoint is for #{record.get('number')}, but this workflow run's event is about #{number}"
    if problem := _comment_problem(record, store):
        return problem
    if run_id in stored_run_ids(repo, loop.name, env.get("GITHUB_TOKEN")):
        decision = trusted_decision(loop, env)
        if decision is None or not any(run_id.startswith(ref) for ref in decision.runs if ref):
            return f"its checkpoint names run {run_id[:80]}, an earlier run this workflow run's event does not decide"
    return ""


# What the comment puts in markdown beside the message: names as the run store and lint make them.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")


def _comment_problem(record: dict[str, Any], store: RunStore | None) -> str:
    """Why the checkpoint comment may not be posted as it is: the bot posts it on the issue, so
    its names must be names (a choice could close its code span and post live markdown), its
    message may hold no credential (the run job's scan is not evidence), and it must be the
    wait of a run in the artifact's store, when it carries one."""
    choices = record.get("choices")
    names = [record.get("run_id"), record.get("loop"), record.get("state"),
             *(choices if isinstance(choices, list) else [None])]
    if not all(isinstance(name, str) and _NAME.fullmatch(name) for name in names):
        return "its checkpoint names a run, loop, state or choice that is not a plain name"
    found = find_secrets(str(record.get("message", "")))
    if found:
        return f"its checkpoint's message holds {found[0]}"
    if store is None:  # only checkpoint.json was handed over (no `github-store pack`)
        return ""
    try:
        waiting = RunState.from_json(store.load_run(str(record["run_id"]))).waiting or {}
    except StoreError:
        waiting = {}
    if waiting.get("state") != record["state"]:
        return (f"its checkpoint names run {record['run_id']} at {record['state']}, which its store has not "
                "waiting there")
    return ""


def verify_artifact(loop: Loop, out_dir: Path, repo: Path, env: Mapping[str, str] | None = None) -> int:
    """Refuse (ArtifactRefused) unless every run with writes due may make them and the checkpoint
    to post is this event's; how many runs have writes due."""
    env = os.environ if env is None else env
    with _artifact_store(out_dir / "store") as store:
        problems = [problem] if (problem := checkpoint_problem(loop, out_dir, repo, env, store)) else []
        problems += _branch_problems(loop, out_dir, repo, env, store)
        due = _due(store) if store is not None else []
    if due:
        problems += _run_problems(loop, due, env)
    if problems:
        raise ArtifactRefused(
            "the run job's artifact was refused, nothing was pushed, published or saved: " + "; ".join(problems[:6]),
            "code the run job ran (a gate, a test) may have changed the run store; read that job's log, and "
            "decide the run again from a clean commit")
    return len(due)


def _branch_problems(loop: Loop, out_dir: Path, repo: Path, env: Mapping[str, str],
                     store: RunStore | None) -> list[str]:
    """The bundle's branches the apply job would push: each must be the branch of a run in the
    artifact's store (when it carries one), and one origin already has (an earlier run's) only
    of the run this workflow run's event decides; new commits on any other would reach origin."""
    bundle = out_dir / BUNDLE_FILE
    if not bundle.is_file():
        return []
    listed = run_git(repo, "bundle", "list-heads", str(bundle.resolve()), check=False)
    if listed.returncode != 0:
        return ["its bundle of branches cannot be read"]
    heads = _heads(listed.stdout, "refs/heads/" + BRANCH_PREFIX)
    runs = {str(r["run_id"]) for r in store.list_runs()} if store is not None else None
    origin = _heads(run_git(repo, "for-each-ref", "--format=%(objectname) %(refname)",
                            "refs/remotes/origin/" + BRANCH_PREFIX).stdout, "refs/remotes/origin/" + BRANCH_PREFIX)
    # Origin's branches the bundle moves (the same commit again is a re-run of this job: a no-op).
    moved = {name for name, sha in heads.items() if name in origin and origin[name] != sha}
    decision = trusted_decision(loop, env) if moved else None
    decided = [ref for ref in (decision.runs if decision else []) if ref]
    problems = []
    for name in heads:
        shown = f"branch {BRANCH_PREFIX}{name[:80]}"
        if runs is not None and name not in runs:
            problems.append(f"its bundle holds {shown}, of no run in its store")
        elif name in moved and not any(name.startswith(ref) for ref in decided):
            problems.append(f"its bundle adds commits to {shown}, an earlier run's this workflow run's event does "
                            "not decide")
    return problems


def _heads(listing: str, prefix: str) -> dict[str, str]:
    """{name: commit} of `<sha> <ref>` lines whose ref starts with `prefix`."""
    pairs = [line.split()[:2] for line in listing.splitlines()]
    return {ref[len(prefix):]: sha for sha, ref in (p for p in pairs if len(p) == 2) if ref.startswith(prefix)}


def _run_problems(loop: Loop, due: list[tuple[RunState, list[dict[str, Any]]]], env: Mapping[str, str]) -> list[str]:
    kinds = declared_kinds(loop)
    token_names = ["GITHUB_TOKEN"] + ([loop.publish.token] if loop.publish is not None else [])
    secrets = tuple(env[name] for name in token_names if env.get(name))
    waits = bool(checkpoints(loop))
    decision = trusted_decision(loop, env) if waits else None
    problems = []
    for state, events in due:
        found = [] if state.loop == loop.name else [f"it is a run of {state.loop!r}"]
        found += [p for item in state.meta["publish"].get("items") or [] for p in _item_problems(item, kinds, secrets)]
        if waits and (problem := _decision_problem(state, events, decision)):
            found.append(problem)
        problems += [f"run {state.run_id}: {p}" for p in found]
    return problems
