"""What `loopdsl github-event` does with the event GitHub Actions hands a job.

GitHub writes the event's payload to the file GITHUB_EVENT_PATH and its name to
GITHUB_EVENT_NAME. The payload is hostile data (an issue's title, a comment's body, a
branch name are typed by anyone): it is read here as JSON, within bounds, matched against
the loop's `on:` triggers and turned into typed inputs by their declared paths, and never
reaches a shell or a workflow expression. The workflow's own `if:` filters the same way,
but that is a saving of runner minutes, not the check: this one is the one tested.
"""
from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from ..language import bounded_json
from ..language.errors import LoopdslError
from ..language.github_events import DEFAULT_TYPES, path_parts, read_path
from ..language.inputs import coerce_inputs
from ..language.model import Loop, Trigger

DECISION_COMMAND = "/loopdsl"
MAX_EVENT_BYTES = 8 * 1024 * 1024  # GitHub caps webhook payloads at 25 MB; real ones are far smaller
_RUN_REF = re.compile(r"^[a-z0-9][a-z0-9._-]{0,79}$")
# A pull request review's state (lower case in webhook payloads) -> the decision it makes.
REVIEW_CHOICES = {"approved": "approve", "changes_requested": "reject"}
_CHOICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


class GitHubEventError(LoopdslError):
    """An event that cannot be read or acted on; exit 2."""


@dataclass
class Plan:
    """What to do: `run` the loop with `inputs`, `decide` a waiting run, decide the run waiting on
    pull request `number` by a `review`, or `ignore` the event."""

    action: str
    reason: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    run_ref: str = ""
    choice: str = ""
    comment: str = ""
    actor: str = ""  # who must have write access for the plan to go ahead ("" when GitHub checked it)
    by: str = ""  # who decides, as the decision records it
    number: int | None = None  # the issue or pull request the event is about, if any


def read_event(env: Mapping[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """(event name, payload) from GITHUB_EVENT_NAME and the file at GITHUB_EVENT_PATH."""
    env = os.environ if env is None else env
    name = env.get("GITHUB_EVENT_NAME", "").strip()
    where = env.get("GITHUB_EVENT_PATH", "").strip()
    if not name or not where:
        raise GitHubEventError("GITHUB_EVENT_NAME and GITHUB_EVENT_PATH must be set (GitHub Actions sets both)",
                               "run this in a workflow job, or set them to an event name and a payload file")
    try:
        with open(where, "rb") as handle:
            raw = handle.read(MAX_EVENT_BYTES + 1)
    except OSError as exc:
        raise GitHubEventError(f"cannot read the event payload {where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_EVENT_BYTES:
        raise GitHubEventError(f"the event payload {where} is over {MAX_EVENT_BYTES // (1024 * 1024)} MB")
    try:
        payload = bounded_json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise GitHubEventError(f"the event payload {where} is not JSON ({str(exc)[:200]})") from None
    if not isinstance(payload, dict):
        raise GitHubEventError(f"the event payload {where} is not a JSON object")
    return name, payload


def _trigger(loop: Loop, event: str) -> Trigger | None:
    return next((t for t in loop.on if t.event == event), None)


def _text(payload: Any, *parts: str) -> str:
    value = read_path(payload, list(parts))
    return value if isinstance(value, str) else ""


def event_number(payload: Mapping[str, Any]) -> int | None:
    """The issue or pull request the event is about (a failed CI run: its first pull request)."""
    pulls = read_path(payload, ["workflow_run", "pull_requests"])
    first = pulls[0] if isinstance(pulls, list) and pulls else None
    for value in (read_path(payload, ["issue", "number"]), read_path(payload, ["pull_request", "number"]),
                  read_path(first, ["number"])):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def map_inputs(loop: Loop, trigger: Trigger | None, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The run's inputs: each declared path's value (a missing or null one keeps the default),
    checked like `--input`."""
    values: dict[str, Any] = {}
    for name, path in (trigger.inputs if trigger else {}).items():
        spec, parts = loop.inputs.get(name), path_parts(path)
        if spec is None or parts is None:
            continue  # lint reports both; an event run does not guess
        value = read_path(payload, parts)
        if value is None:
            continue
        if spec.type == "string" and isinstance(value, (bool, int, float)):
            value = str(value).lower() if isinstance(value, bool) else str(value)
        values[name] = value
    try:
        return coerce_inputs(loop, values)
    except LoopdslError as exc:
        raise GitHubEventError(f"the event's payload does not make valid inputs: {exc.message}",
                               "check the `on:` input mappings against the event") from None


def _same_repository(payload: Mapping[str, Any], *head: str) -> bool:
    own = _text(payload, "repository", "full_name")
    return bool(own) and _text(payload, *head) == own


def _branch_ok(trigger: Trigger, branch: str) -> bool:
    return not trigger.branches or any(fnmatch.fnmatchcase(branch, pattern) for pattern in trigger.branches)


def plan(loop: Loop, name: str, payload: Mapping[str, Any]) -> Plan:
    """What the event asks of this loop."""
    if name == "schedule":
        return Plan("run", inputs=map_inputs(loop, None, payload)) if loop.schedule else Plan("ignore", "no `schedule`")
    if name == "workflow_dispatch":
        run_ref = _text(payload, "inputs", "run_id").strip()
        if run_ref:
            choice = _text(payload, "inputs", "decision").strip() or "approve"
            sender = _text(payload, "sender", "login")
            # Only people with write access can dispatch a workflow: GitHub checked already.
            return _decision(run_ref, choice, "workflow_dispatch", actor="", by=f"github:{sender}", number=None)
        return Plan("run", inputs=map_inputs(loop, None, payload))
    if name == "issue_comment":
        return _comment(loop, payload)
    if name == "pull_request_review":
        return _review(payload)
    event = {"workflow_run": "ci_failure", "pull_request": "pull_request", "issues": "issues"}.get(name)
    trigger = _trigger(loop, event) if event else None
    if trigger is None:
        return Plan("ignore", f"{loop.name} has no `on:` trigger for {name} events")
    action = _text(payload, "action")
    if event == "ci_failure":
        problem = _ci_failure_problem(trigger, payload, action)
    else:
        types = trigger.types or DEFAULT_TYPES[event]
        problem = "" if action in types else f"action {action!r} is not one of {', '.join(types)}"
        if not problem and event == "pull_request":
            if not _same_repository(payload, "pull_request", "head", "repo", "full_name"):
                problem = "the pull request comes from a fork (its code is not run with the loop's secrets)"
            elif not _branch_ok(trigger, _text(payload, "pull_request", "base", "ref")):
                problem = "the pull request's base branch is not one of `branches`"
    if problem:
        return Plan("ignore", problem)
    return Plan("run", inputs=map_inputs(loop, trigger, payload), number=event_number(payload))


def _ci_failure_problem(trigger: Trigger, payload: Mapping[str, Any], action: str) -> str:
    run_name = _text(payload, "workflow_run", "name")
    if action != "completed" or _text(payload, "workflow_run", "conclusion") != "failure":
        return "the workflow run did not end in failure"
    if run_name not in trigger.workflows:
        return f"workflow {run_name!r} is not one of {', '.join(trigger.workflows)}"
    if not _same_repository(payload, "workflow_run", "head_repository", "full_name"):
        return "the failed run was of a fork's code (it is not run with the loop's secrets)"
    if not _branch_ok(trigger, _text(payload, "workflow_run", "head_branch")):
        return "the failed run's branch is not one of `branches`"
    return ""


def _comment(loop: Loop, payload: Mapping[str, Any]) -> Plan:
    if _text(payload, "action") != "created":
        return Plan("ignore", "only new comments are commands")
    body = _text(payload, "comment", "body")
    first, _, rest = body.strip().partition("\n")
    words = first.split()
    actor = _text(payload, "comment", "user", "login")
    number = event_number(payload)
    if not words:
        return Plan("ignore", "an empty comment")
    if words[0] == DECISION_COMMAND and len(words) >= 3 and words[1] in ("approve", "reject", "decide"):
        choice = words[3] if words[1] == "decide" and len(words) > 3 else words[1]
        if words[1] == "decide" and len(words) < 4:
            raise GitHubEventError("`/loopdsl decide` needs a run and a choice: /loopdsl decide RUN CHOICE")
        return _decision(words[2], choice, rest.strip()[:2000], actor=actor, by=f"github:{actor}", number=number)
    trigger = _trigger(loop, "issue_comment")
    if trigger is None or words[0] != trigger.command:
        return Plan("ignore", "the comment is not a command for this loop")
    return Plan("run", inputs=map_inputs(loop, trigger, payload), actor=actor, number=number)


def _review(payload: Mapping[str, Any]) -> Plan:
    """A submitted review decides the run waiting on its pull request: which run is found later,
    from the checkpoint comment the apply job posted there (never from text the review holds)."""
    if _text(payload, "action") != "submitted":
        return Plan("ignore", "only a submitted review decides a run")
    state = _text(payload, "review", "state").lower()
    choice = REVIEW_CHOICES.get(state)
    if choice is None:
        return Plan("ignore", f"a review that is {state or 'without a state'!r} decides nothing "
                              "(approved approves, changes_requested rejects)")
    number = event_number(payload)
    if number is None:
        return Plan("ignore", "the review names no pull request")
    actor = _text(payload, "review", "user", "login")
    return Plan("review", choice=choice, comment=_text(payload, "review", "body").strip()[:2000], actor=actor,
                by=f"github:{actor}", number=number)


def _decision(run_ref: str, choice: str, comment: str, *, actor: str, by: str, number: int | None) -> Plan:
    if not _RUN_REF.match(run_ref):
        raise GitHubEventError(f"{run_ref[:80]!r} is not a run id", "write /loopdsl approve RUN with the id the checkpoint comment shows")
    if not _CHOICE.match(choice):
        raise GitHubEventError(f"{choice[:80]!r} is not a choice", "a choice is a word such as approve, reject or one of the checkpoint's choices")
    return Plan("decide", run_ref=run_ref, choice=choice, comment=comment, actor=actor, by=by, number=number)


def event_file(directory: Path) -> Path:
    """Where `github-event --out DIR` leaves what the apply job needs (the checkpoint to post)."""
    return directory / "checkpoint.json"
