"""daily-triage end to end on a scratch repository, offline with its scripted replies."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from .conftest import (
    LOOPS_DIR,
    ROOT,
    branches,
    checkout_snapshot,
    commit_file,
    git,
    run_loop,
)
from cli_forked import loopdsl_command

OWNED_LOOPS = ["daily-triage", "changelog-drafter", "post-merge-cleanup", "issue-triage"]
SINCE = "2024-03-09T00:00:00+00:00"


def _utc_date() -> str:
    return datetime.now(timezone.utc).date().isoformat()


def write_issues(path: Path) -> Path:
    path.write_text(json.dumps([{"number": 12, "title": "Login fails with SSO", "labels": [{"name": "bug"}]},
                                {"number": 15, "title": "Add dark mode", "labels": [{"name": "enhancement"}]}]))
    return path


def build_triage_repo(repo: Path) -> dict[str, str]:
    """An older commit with a TODO, then 'yesterday' (2024-03-09): a fix with a FIXME and a docs commit."""
    old = commit_file(repo, "src/app.py", "def main():\n    # TODO: validate the config path before opening it\n    return 0\n",
                      "add app entry point", date="2024-03-01T10:00:00+00:00")
    fix = commit_file(repo, "src/config.py", "def load(path):\n    # FIXME: crashes on an empty file\n    return open(path).read()\n",
                      "fix: read config lazily", date="2024-03-09T08:30:00+00:00")
    docs = commit_file(repo, "docs/setup.md", "# Setup\nRun make.\n", "docs: setup guide", date="2024-03-09T15:00:00+00:00")
    return {"old": old, "fix": fix, "docs": docs}


def _results(result, state: str) -> list[dict]:
    return [e["result"] for e in result.events if e["type"] == "ok" and e["state"] == state]


def test_daily_triage_publishes_reviewed_list_on_run_branch(scratch_repo: Path, tmp_path: Path) -> None:
    shas = build_triage_repo(scratch_repo)
    # The reply file cites the fix commit by its short sha; the scratch history is fully determined.
    assert shas["fix"].startswith("7adb3de"), f"scratch history changed: fix is {shas['fix']}, replies expect 7adb3de"
    issues = write_issues(tmp_path / "issues.json")  # outside the repository, like a file the user exported
    (scratch_repo / "scratch.txt").write_text("the user's uncommitted work\n")
    before = checkout_snapshot(scratch_repo)
    date_before = _utc_date()

    result = run_loop("daily-triage", scratch_repo, tmp_path / "store", {"since": SINCE, "issues_file": str(issues)})

    assert result.status == "completed", result.events[-3:]
    assert result.path == ["commits", "todos", "issues", "draft", "review", "draft", "review", "approve", "publish", "done"]
    # Only 'yesterday's' commits were collected, newest first; the older one is out of range.
    commits = _results(result, "commits")[0]["stdout"].splitlines()
    assert [line.split()[0] for line in commits] == [shas["docs"][:7], shas["fix"][:7]]
    todos = _results(result, "todos")[0]["stdout"]
    assert "src/app.py:2:" in todos and "src/config.py:2:" in todos
    # The first draft cited a commit that does not exist: the grounding gate refused it.
    failed = [e for e in result.events if e["type"] == "gate" and not e["passed"]]
    assert [e["gate"] for e in failed] == ["commit-refs-exist"]

    date = result.outputs["report"].removeprefix("triage/").removesuffix(".md")
    assert date in {date_before, _utc_date()}
    branch = result.outputs["branch"]
    assert branch == f"loopdsl/{result.run_id}" and branch in branches(scratch_repo)
    # One commit on the run's branch, on top of the user's HEAD, adding only the report.
    assert git(scratch_repo, "rev-parse", f"{branch}~1").strip() == shas["docs"]
    assert git(scratch_repo, "diff", "--name-status", "main", branch).split() == ["A", f"triage/{date}.md"]
    report = git(scratch_repo, "show", f"{branch}:triage/{date}.md")
    assert report.startswith(f"# Triage {date}\n")
    rows = [line for line in report.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[1] for row in rows] == ["P0", "P1", "P2", "P2", "P3"]
    assert "| 1 | P0 | Stop the crash on empty config files | todo `src/config.py:2` |" in report
    assert f"commit `{shas['fix'][:7]}`" in report and "issue `#12`" in report
    # The user's checkout: same HEAD, branch, index, status and files (the untracked one too).
    assert checkout_snapshot(scratch_repo) == before
    assert not (scratch_repo / "triage").exists()


def test_daily_triage_rejected_publishes_nothing(scratch_repo: Path, tmp_path: Path) -> None:
    import loopdsl

    build_triage_repo(scratch_repo)
    script = tmp_path / "reject.yaml"
    replies = (LOOPS_DIR / "scripts" / "daily-triage.replies.yaml").read_text()
    script.write_text(replies.replace("decision: approve", "decision: reject"))
    before = checkout_snapshot(scratch_repo)

    issues = write_issues(tmp_path / "issues.json")
    result = loopdsl.run(LOOPS_DIR / "daily-triage.yaml", {"since": SINCE, "issues_file": str(issues)}, script=script,
                         store=tmp_path / "store", workdir=scratch_repo)

    assert result.status == "failed"
    assert result.path[-2:] == ["approve", "rejected"]
    branch = f"loopdsl/{result.run_id}"
    # The kept branch has no commit of its own: nothing was published.
    assert git(scratch_repo, "rev-parse", branch) == git(scratch_repo, "rev-parse", "main")
    assert checkout_snapshot(scratch_repo) == before


def test_lint_strict_passes_on_the_four_pattern_loops() -> None:
    files = [str(LOOPS_DIR / f"{name}.yaml") for name in OWNED_LOOPS]
    done = subprocess.run([*loopdsl_command(), "lint", "--strict", *files],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors, 0 warnings in 4 files" in done.stdout + done.stderr
