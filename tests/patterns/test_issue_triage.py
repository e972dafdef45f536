"""issue-triage end to end: offline from a JSON file, and through a stand-in `gh` after approval."""
from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone
from pathlib import Path

import pytest

from .conftest import branches, checkout_snapshot, git, run_loop

ISSUES = [
    {"number": 3, "title": "Crash when config file is empty", "body": "Traceback (most recent call last): ...", "labels": []},
    {"number": 7, "title": "API token printed in debug logs", "body": "Run with --debug and the token shows up.", "labels": []},
    {"number": 8, "title": "Typo in README install section", "labels": []},
    {"number": 11, "title": "How do I run this behind a proxy?", "labels": []},
]
OWNERS = {"api": "@ari", "docs": "@dana", "core": "@org/core-team"}
EXPECTED = {  # number -> (labels, area, owner), as the scripted classification and the owners map give them
    3: (["bug"], "core", "@org/core-team"),
    7: (["bug", "security"], "api", "@ari"),
    8: (["documentation"], "docs", "@dana"),
    11: (["question"], None, None),
}


def _triage_file(repo: Path, result) -> dict:
    branch = result.outputs["branch"]
    assert branch == f"loopdsl/{result.run_id}" and branch in branches(repo)
    assert git(repo, "diff", "--name-only", "main", branch).split() == [result.outputs["file"]]
    return json.loads(git(repo, "show", f"{branch}:{result.outputs['file']}"))


def _check_classification(triage: dict) -> None:
    got = {i["number"]: (i["labels"], i["area"], i["owner"]) for i in triage["issues"]}
    assert got == EXPECTED
    assert [i["number"] for i in triage["issues"]] == sorted(EXPECTED)


def test_issue_triage_from_file_writes_the_classification(scratch_repo: Path, tmp_path: Path) -> None:
    issues = tmp_path / "issues.json"
    issues.write_text(json.dumps(ISSUES))
    before = checkout_snapshot(scratch_repo)
    today = datetime.now(timezone.utc).date().isoformat()

    result = run_loop("issue-triage", scratch_repo, tmp_path / "store", {"issues_file": str(issues), "owners": OWNERS})

    assert result.status == "completed", result.events[-3:]
    assert result.path == ["fetch", "source", "classify", "write", "done"]  # no checkpoint: nothing applied
    # Attempt 1 left out #11 (and used a label not on the list): refused, then fixed.
    failed = [e for e in result.events if e["type"] == "gate" and not e["passed"]]
    assert [e["gate"] for e in failed] == ["every-issue-exactly-once"]
    assert result.outputs["issues"] == 4
    triage = _triage_file(scratch_repo, result)
    assert triage["source"] == "file"
    assert triage["date"] in {today, datetime.now(timezone.utc).date().isoformat()}  # a run across midnight
    assert result.outputs["file"] == f"triage/issues-{triage['date']}.json"
    _check_classification(triage)
    assert checkout_snapshot(scratch_repo) == before


def _fake_gh(tmp_path: Path, logged_in: bool = True) -> Path:
    """A stand-in `gh` on PATH: logs its arguments, serves ISSUES, accepts edits."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    issues = tmp_path / "gh-issues.json"
    issues.write_text(json.dumps(ISSUES))
    log = tmp_path / "gh.log"
    script = bin_dir / "gh"
    script.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\n' \"$*\" >> '{log}'\n"
        'case "$1 $2" in\n'
        f"  'auth status') exit {0 if logged_in else 1} ;;\n"
        f"  'issue list') cat '{issues}' ;;\n"
        "  'issue edit') exit 0 ;;\n"
        "  *) echo \"unexpected gh call: $*\" >&2; exit 9 ;;\n"
        "esac\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return log


def test_issue_triage_with_gh_applies_edits_after_approval(scratch_repo: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    log = _fake_gh(tmp_path)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    before = checkout_snapshot(scratch_repo)

    result = run_loop("issue-triage", scratch_repo, tmp_path / "store", {"owners": OWNERS})

    assert result.status == "completed", result.events[-3:]
    assert result.path == ["fetch", "source", "classify", "write", "approve", "apply", "done"]
    decisions = [e["result"]["decision"] for e in result.events if e["type"] == "ok" and e["state"] == "approve"]
    assert decisions == ["approve"]
    calls = log.read_text().splitlines()
    assert calls[:2] == ["auth status", "issue list --state open --limit 50 --json number,title,body,labels"]
    # Labels always; a person (@login) is assigned, a team (@org/team) or nobody is not.
    assert calls[2:] == [
        # The number comes last, after `--`: a value from the model is never read as an option.
        "issue edit --add-label bug -- 3",
        "issue edit --add-label bug,security --add-assignee ari -- 7",
        "issue edit --add-label documentation --add-assignee dana -- 8",
        "issue edit --add-label question -- 11",
    ]
    triage = _triage_file(scratch_repo, result)
    assert triage["source"] == "gh"
    _check_classification(triage)
    assert checkout_snapshot(scratch_repo) == before


def test_issue_triage_without_file_or_gh_explains_what_to_do(scratch_repo: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    log = _fake_gh(tmp_path, logged_in=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")

    result = run_loop("issue-triage", scratch_repo, tmp_path / "store", {})

    assert result.status == "failed" and result.path == ["fetch"]
    assert "give --input issues_file=FILE.json, or install gh and run gh auth login" in json.dumps(result.events)
    assert log.read_text().splitlines() == ["auth status"]  # nothing listed, nothing edited
