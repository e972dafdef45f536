"""The GitHub Actions export of loops with `on:` triggers: actionlint on all seven patterns,
triggers and filters per event, least privilege per job, no event text in any script."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from test_schedule import PIP_SPEC, actionlint, invoke, lint_workflow, lint_workflows  # noqa: F401  (actionlint is a fixture)


ROOT = Path(__file__).resolve().parents[2]
PATTERNS = sorted(p.stem for p in (ROOT / "loops").glob("*.yaml") if not p.name.endswith(".test.yaml"))


def export(loop: Path, target: Path) -> dict:
    code, _, err = invoke("schedule", str(loop), "--export", "github-actions", "--pip-spec", PIP_SPEC, "-o", str(target))
    assert code == 0, err
    return YAML(typ="safe").load(target.read_text())


def scripts(workflow: dict) -> list[str]:
    return [step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]


def test_the_seven_patterns_export_workflows_that_pass_actionlint(tmp_path: Path, actionlint: Path) -> None:  # noqa: F811
    assert len(PATTERNS) == 7, PATTERNS
    targets = [tmp_path / f"{name}.yml" for name in PATTERNS]
    workflows = [export(ROOT / "loops" / f"{name}.yaml", target) for name, target in zip(PATTERNS, targets)]
    for name, workflow, found in zip(PATTERNS, workflows, lint_workflows(actionlint, targets)):
        assert found == [], name
        assert workflow["permissions"] == {}, name
        # Reading a review's pull request comments is the one read beyond the code.
        reviews = "pull_request_review" in workflow["on"]
        assert workflow["jobs"]["run"]["permissions"] == {"contents": "read", **({"pull-requests": "read"} if reviews else {})}, name
        assert set(workflow["jobs"]["apply"]["permissions"]) <= {"contents", "issues", "pull-requests"}, name
        for script in scripts(workflow):  # no expression of any kind reaches a shell
            assert "${{" not in script, (name, script)
            assert subprocess.run(["bash", "-n", "-c", script], capture_output=True).returncode == 0, script


def test_each_trigger_becomes_its_github_event_with_its_filter(tmp_path: Path) -> None:
    sweeper = export(ROOT / "loops" / "ci-sweeper.yaml", tmp_path / "a.yml")
    header = (tmp_path / "a.yml").read_text().split("\nname:", 1)[0]
    # GitHub gives every job its GITHUB_TOKEN: the header asks only for the provider keys.
    assert "secrets to create (Settings > Secrets and variables > Actions): OPENAI_API_KEY, ANTHROPIC_API_KEY" in header
    assert sweeper["on"]["workflow_run"] == {"workflows": ["CI"], "types": ["completed"]}
    condition = sweeper["jobs"]["run"]["if"]
    assert "github.event.workflow_run.conclusion == 'failure'" in condition
    assert "github.event.workflow_run.head_repository.full_name == github.repository" in condition  # no fork code
    checkout = sweeper["jobs"]["run"]["steps"][0]["with"]
    assert checkout["ref"] == "${{ github.event.workflow_run.head_sha || github.sha }}"
    # ci-sweeper waits at `approve`: comments can decide it, and the apply job may comment.
    assert sweeper["on"]["issue_comment"] == {"types": ["created"]}
    assert "startsWith(github.event.comment.body, '/loopdsl')" in condition
    assert sweeper["jobs"]["apply"]["permissions"] == {"contents": "write", "issues": "write", "pull-requests": "write"}
    # Its checkpoint comment may be on a pull request: a review there decides the run too, and
    # only a person's approving or changes-requesting review on a pull request of this repository.
    assert sweeper["on"]["pull_request_review"] == {"types": ["submitted"]}
    assert ("(github.event_name == 'pull_request_review' && github.event.review.user.type != 'Bot'"
            " && github.event.pull_request.head.repo.full_name == github.repository"
            " && (github.event.review.state == 'approved' || github.event.review.state == 'changes_requested'))") in condition
    assert sweeper["jobs"]["run"]["permissions"] == {"contents": "read", "pull-requests": "read"}

    babysitter = export(ROOT / "loops" / "pr-babysitter.yaml", tmp_path / "b.yml")
    assert babysitter["on"]["pull_request"] == {"types": ["opened", "synchronize"]}
    assert "github.event.pull_request.head.repo.full_name == github.repository" in babysitter["jobs"]["run"]["if"]
    triage = export(ROOT / "loops" / "issue-triage.yaml", tmp_path / "c.yml")
    assert triage["on"]["issues"] == {"types": ["opened"]}
    assert "schedule" in triage["on"]


def test_a_loop_with_only_events_needs_no_schedule_and_its_command_filters_comments(tmp_path: Path, actionlint: Path) -> None:  # noqa: F811
    loop = tmp_path / "commented.yaml"
    loop.write_text(
        "loopdsl: 1\nname: commented\nunattended: true\n"
        "inputs:\n  title: {default: ''}\n"
        "on:\n  issue_comment: {command: /summarise, inputs: {title: event.issue.title}}\n"
        "  issues: {types: [opened, labeled]}\n  pull_request: {branches: [main]}\n"
        "start: say\nstates:\n  say: {shell: echo hi, next: done}\n  done: {end: completed}\n")
    target = tmp_path / "commented.yml"
    workflow = export(loop, target)
    assert lint_workflow(actionlint, target) == []
    assert "schedule" not in workflow["on"]
    assert workflow["on"]["issue_comment"] == {"types": ["created"]}
    assert workflow["on"]["issues"] == {"types": ["opened", "labeled"]}
    assert workflow["on"]["pull_request"] == {"branches": ["main"]}
    condition = workflow["jobs"]["run"]["if"]
    assert "startsWith(github.event.comment.body, '/summarise')" in condition
    assert "github.event.comment.user.type != 'Bot'" in condition  # our own checkpoint comments start nothing
    assert workflow["jobs"]["apply"]["permissions"] == {"contents": "write"}  # no checkpoint: no comment rights


@pytest.mark.parametrize("name", PATTERNS)
def test_event_text_reaches_the_loop_only_through_the_payload_file(name: str, tmp_path: Path) -> None:
    """Script injection: `${{ github.event.issue.title }}` in a `run:` would be pasted into bash
    before it runs. The only expressions in the workflow are in `if:`, `with:` and `env:`, and
    the `env:` ones are secrets and the job's token, never event fields."""
    workflow = export(ROOT / "loops" / f"{name}.yaml", tmp_path / "w.yml")
    for job in workflow["jobs"].values():
        for step in job["steps"]:
            for value in (step.get("env") or {}).values():
                assert re.fullmatch(r"\$\{\{ (secrets\.[A-Z0-9_]+|github\.token) \}\}", value), value
            for value in (step.get("with") or {}).values():
                assert "github.event" not in str(value) or value == "${{ github.event.workflow_run.head_sha || github.sha }}"
