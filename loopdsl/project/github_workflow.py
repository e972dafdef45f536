"""The GitHub Actions workflow of a loop: its triggers and its two jobs.

`run` runs the loop with a read-only token (`contents: read`): the model, its tools and
the test commands it starts never hold a token that can write. It restores the run store
from the `loopdsl-runs` branch (runs_branch.py says why a branch), hands the event to
`loopdsl github-event` (which reads the payload from GITHUB_EVENT_PATH itself: no
`${{ github.event... }}` is ever pasted into a script, where a crafted issue title or branch
name would run as shell code), and uploads what the run produced as an artifact: the store,
its branches as a git bundle, the checkpoint to post.

`apply` receives only that artifact and holds the write permissions: it pushes the runs'
branches, makes the `publish:` writes the run job planned (rendered, checked and stored in
the run; the run job ran with `publish=False`), saves the store on the runs branch and posts
a waiting run's checkpoint as a comment. It runs no state of the loop and no code of the run.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

from ruamel.yaml.scalarstring import DoubleQuotedScalarString, LiteralScalarString

from ..language.github_events import GITHUB_EVENT
from ..language.model import Loop
from .github_event import DECISION_COMMAND, REVIEW_CHOICES

OUT_DIR = "loopdsl-out"
ARTIFACT = "loopdsl-run"
_SETUP = ("actions/checkout@v4", "actions/setup-python@v5")


def _dispatch_inputs() -> dict[str, Any]:
    """The manual run that decides (and resumes) a run waiting at a checkpoint."""
    return {
        "run_id": {"description": "A run waiting at a checkpoint (see the last run's log); empty starts a new run",
                   "required": False, "default": ""},
        "decision": {"description": "The decision for run_id: approve, reject, or one of the checkpoint's choices",
                     "required": False, "default": "approve"},
    }


def triggers(loop: Loop, utc_cron: str | None, waits: bool) -> dict[str, Any]:
    """The workflow's `on:`: the schedule, a manual run, and the loop's GitHub events."""
    on: dict[str, Any] = {}
    if utc_cron is not None:
        on["schedule"] = [{"cron": utc_cron}]
    on["workflow_dispatch"] = {"inputs": _dispatch_inputs()}
    for trigger in loop.on:
        event = GITHUB_EVENT[trigger.event]
        if trigger.event == "ci_failure":
            spec: dict[str, Any] = {"workflows": list(trigger.workflows), "types": ["completed"]}
        elif trigger.event == "issue_comment":
            spec = {"types": ["created"]}
        else:
            spec = {"types": list(trigger.types)} if trigger.types else {}
        if trigger.branches:
            spec["branches"] = list(trigger.branches)
        on[event] = spec or None
    if waits and "issue_comment" not in on:
        on["issue_comment"] = {"types": ["created"]}  # `/loopdsl approve RUN` decides a waiting run
    if waits and reviews_decide(loop):
        on["pull_request_review"] = {"types": ["submitted"]}  # an approving review decides it too
    return on


def reviews_decide(loop: Loop) -> bool:
    """Whether a waiting run of `loop` can wait on a pull request (its checkpoint comment is
    posted there): the loop runs on pull requests, or on failed CI runs, which may be of one."""
    return any(t.event in ("pull_request", "ci_failure") for t in loop.on)


def job_condition(loop: Loop, on: dict[str, Any]) -> str:
    """The run job's `if:`: skips events that are not for this loop before a runner starts.
    Only repository-side facts are compared; no payload text is interpolated anywhere."""
    clauses = ["github.event_name == 'schedule'", "github.event_name == 'workflow_dispatch'"]
    if "workflow_run" in on:
        clauses.append("(github.event_name == 'workflow_run' && github.event.workflow_run.conclusion == 'failure'"
                       " && github.event.workflow_run.head_repository.full_name == github.repository)")
    if "pull_request" in on:
        clauses.append("(github.event_name == 'pull_request'"
                       " && github.event.pull_request.head.repo.full_name == github.repository)")
    if "issues" in on:
        clauses.append("github.event_name == 'issues'")
    if "issue_comment" in on:
        commands = [DECISION_COMMAND] + [t.command for t in loop.on if t.command and t.command != DECISION_COMMAND]
        starts = " || ".join(f"startsWith(github.event.comment.body, '{c}')" for c in commands)
        clauses.append(f"(github.event_name == 'issue_comment' && github.event.comment.user.type != 'Bot' && ({starts}))")
    if "pull_request_review" in on:
        states = " || ".join(f"github.event.review.state == '{s}'" for s in REVIEW_CHOICES)
        clauses.append("(github.event_name == 'pull_request_review' && github.event.review.user.type != 'Bot'"
                       f" && github.event.pull_request.head.repo.full_name == github.repository && ({states}))")
    return " || ".join(clauses)


def with_github_extra(pip_spec: str) -> str:
    """`loopdsl ...` -> `loopdsl[github] ...`: the jobs talk to GitHub (permissions, comments)."""
    match = re.match(r"^(loopdsl)(\[[^\]]*\])?(?=$|[\s@=<>!~;])", pip_spec)
    if match is None:
        return pip_spec  # a spec we do not understand is installed as given
    extras = [e.strip() for e in (match.group(2) or "[]")[1:-1].split(",") if e.strip()]
    if "github" not in extras:
        extras.append("github")
    return f"loopdsl[{','.join(extras)}]{pip_spec[match.end():]}"


def _install(pip_spec: str, python: str) -> list[dict[str, Any]]:
    return [{"uses": "actions/setup-python@v5", "with": {"python-version": DoubleQuotedScalarString(python)}},
            {"name": "Install loopdsl", "run": f"python -m pip install {shlex.quote(with_github_extra(pip_spec))}"}]


def run_job(loop: Loop, loop_path: str, env_names: list[str], *, worktree: bool, pip_spec: str, python: str,
            timeout_minutes: int, keep_store: bool, condition: str, reviews: bool = False) -> dict[str, Any]:
    quoted = shlex.quote(loop_path)
    checkout: dict[str, Any] = {"fetch-depth": 0, "persist-credentials": False}
    if any(t.event == "ci_failure" for t in loop.on):
        # The failing commit, not the default branch's tip (a fixed 40-hex id from GitHub, in `with:`,
        # not in a script).
        checkout["ref"] = "${{ github.event.workflow_run.head_sha || github.sha }}"
    env = {name: f"${{{{ secrets.{name} }}}}" for name in env_names}
    env.setdefault("GITHUB_TOKEN", "${{ github.token }}")  # read-only here: reads the runs branch and permissions
    script = []
    if worktree:
        script += ['git config user.name "github-actions[bot]"',
                   'git config user.email "41898282+github-actions[bot]@users.noreply.github.com"']
    script.append(f"loopdsl github-event {quoted} --out {OUT_DIR}")
    restore = [{"name": "Restore the run store from the loopdsl-runs branch",
                "env": {"GITHUB_TOKEN": "${{ github.token }}"}, "run": f"loopdsl github-store restore {quoted}"}]
    steps = [
        {"uses": _SETUP[0], "with": checkout}, *_install(pip_spec, python), *(restore if keep_store else []),
        {"name": f"Run {loop.name} for this event", "env": env, "run": LiteralScalarString("\n".join(script) + "\n")},
        {"name": "Pack the run store and the runs' branches", "if": "always()",
         "run": f"loopdsl github-store pack {quoted} {OUT_DIR}" + ("" if keep_store else " --no-store")},
        {"name": "Hand them to the apply job", "if": "always()", "uses": "actions/upload-artifact@v4",
         "with": {"name": ARTIFACT, "path": OUT_DIR, "include-hidden-files": True, "retention-days": 1,
                  "if-no-files-found": "error"}},
    ]
    permissions = {"contents": "read"}
    if reviews:  # a review's run is found in the checkpoint comments of its pull request
        permissions["pull-requests"] = "read"
    return {"if": condition, "runs-on": "ubuntu-latest", "permissions": permissions,
            "timeout-minutes": timeout_minutes, "steps": steps}


def apply_permissions(loop: Loop, waits: bool) -> dict[str, str]:
    """What the apply job writes: the runs branch and branches always, then per `publish:` write
    and checkpoint comment, the scope that GitHub checks for it."""
    scopes = {"contents"}
    publish = loop.publish
    if publish is not None:
        if publish.pull_request is not None or publish.review is not None:
            scopes.add("pull-requests")
        if publish.issue is not None:
            scopes.add("issues")
        for write in (publish.comment, publish.labels):
            if write is not None:
                scopes.add("issues" if write.on == "issue" else "pull-requests")
    if waits:  # a checkpoint comment goes on the event's issue or pull request, whichever it is
        scopes |= {"issues", "pull-requests"}
    return {scope: "write" for scope in ("contents", "issues", "pull-requests") if scope in scopes}


def apply_job(loop: Loop, loop_path: str, *, waits: bool, pip_spec: str, python: str) -> dict[str, Any]:
    env = {"GITHUB_TOKEN": "${{ github.token }}"}
    publish = loop.publish
    if publish is not None and publish.token != "GITHUB_TOKEN":
        env[publish.token] = f"${{{{ secrets.{publish.token} }}}}"  # the loop publishes with a token of its own
    steps = [
        # Full history: the runs' branches arrive as a bundle of the commits origin lacks.
        {"uses": _SETUP[0], "with": {"fetch-depth": 0, "persist-credentials": False}}, *_install(pip_spec, python),
        {"uses": "actions/download-artifact@v4", "with": {"name": ARTIFACT, "path": OUT_DIR}},
        {"name": "Push the runs' branches, publish, save the run store, post a checkpoint", "env": env,
         "run": f"loopdsl github-apply {shlex.quote(loop_path)} {OUT_DIR}"},
    ]
    return {"needs": "run", "if": "always() && needs.run.result != 'skipped' && needs.run.result != 'cancelled'",
            "runs-on": "ubuntu-latest", "permissions": apply_permissions(loop, waits), "timeout-minutes": 15,
            "steps": steps}
