"""changelog-drafter end to end: commits since the last tag -> a CHANGELOG.md section on the run's branch."""
from __future__ import annotations

import json
from pathlib import Path

import loopdsl
from loopdsl.adapters.litellm import ScriptedProvider

from .conftest import LOOPS_DIR, branches, checkout_snapshot, commit_file, git, run_loop

PREVIOUS = "# Changelog\n\n## v0.1.0 (2024-01-05)\n\n### Added\n\n- First release.\n"


def _dated(when: str) -> dict[str, str]:
    return {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}


def build_release_repo(repo: Path) -> dict[str, str]:
    """v0.1.0 tagged; then a feat and a fix on main, and a perf commit merged from a branch."""
    released = commit_file(repo, "CHANGELOG.md", PREVIOUS, "feat: first release", date="2024-01-05T10:00:00+00:00")
    git(repo, "tag", "-a", "v0.1.0", "-m", "v0.1.0", env=_dated("2024-01-05T10:00:00+00:00"))
    feat = commit_file(repo, "src/export.py", "def to_csv(rows):\n    return rows\n", "feat: export reports as CSV",
                       date="2024-02-01T10:00:00+00:00")
    fix = commit_file(repo, "src/parse.py", "def parse(text):\n    return text or ''\n", "fix: handle empty input",
                      date="2024-02-02T10:00:00+00:00")
    git(repo, "checkout", "-q", "-b", "topic")
    perf = commit_file(repo, "src/cache.py", "CACHE = {}\n", "perf: cache parsed config", date="2024-02-03T10:00:00+00:00")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge branch 'topic'", "topic", env=_dated("2024-02-04T10:00:00+00:00"))
    return {"released": released, "feat": feat, "fix": fix, "perf": perf}


def _new_section(changelog: str) -> str:
    """The text between the title and the previous release's heading."""
    return changelog.split("## v0.1.0")[0]


def test_changelog_lists_every_commit_since_the_tag(scratch_repo: Path, tmp_path: Path) -> None:
    shas = build_release_repo(scratch_repo)
    replies = (LOOPS_DIR / "scripts" / "changelog-drafter.replies.yaml").read_text()
    for name in ("feat", "fix", "perf"):
        assert shas[name] in replies, f"scratch history changed: {name} is {shas[name]}, not in the reply file"
    before = checkout_snapshot(scratch_repo)
    merge_head = before["head"]

    result = run_loop("changelog-drafter", scratch_repo, tmp_path / "store", {"version": "v0.2.0"})

    assert result.status == "completed", result.events[-3:]
    assert result.path == ["last_tag", "commits", "draft", "review", "write", "done"]
    assert result.outputs["since"] == "v0.1.0" and result.outputs["commits"] == 3
    # Attempt 1 forgot the merged branch's commit; the gate named it, and that became feedback.
    failed = [e for e in result.events if e["type"] == "gate" and not e["passed"]]
    assert [e["gate"] for e in failed] == ["every-commit-exactly-once"]
    assert f"commits missing from the notes: {shas['perf']}" in failed[0]["message"]

    branch = result.outputs["branch"]
    assert branch == f"loopdsl/{result.run_id}" and branch in branches(scratch_repo)
    assert git(scratch_repo, "rev-parse", f"{branch}~1").strip() == merge_head
    assert git(scratch_repo, "diff", "--name-only", "main", branch).split() == ["CHANGELOG.md"]
    changelog = git(scratch_repo, "show", f"{branch}:CHANGELOG.md")
    section = _new_section(changelog)
    assert section.startswith("# Changelog\n\n## v0.2.0 (")
    for name in ("feat", "fix", "perf"):
        assert f"({shas[name][:7]})" in section, f"{name} commit missing from the section"
    assert shas["released"][:7] not in changelog  # before the tag: not part of this release
    assert [line for line in section.splitlines() if line.startswith("### ")] == ["### Added", "### Changed", "### Fixed"]
    # The previous release is kept, unchanged, below the new section.
    assert changelog.endswith(PREVIOUS.removeprefix("# Changelog\n"))
    assert checkout_snapshot(scratch_repo) == before


def test_changelog_without_tags_covers_the_whole_history(scratch_repo: Path, tmp_path: Path) -> None:
    first = git(scratch_repo, "rev-parse", "HEAD").strip()
    second = commit_file(scratch_repo, "src/main.py", "print('hi')\n", "feat: say hi", date="2024-02-01T10:00:00+00:00")
    notes = {"highlights": "", "groups": [
        {"title": "Added", "entries": [{"text": "The program greets you.", "commits": [second]}]},
        {"title": "Internal", "entries": [{"text": "Project set up.", "commits": [first]}]}]}
    provider = ScriptedProvider.from_data({"draft": [json.dumps(notes)],
                                           "review": ['{"verdict": "accept", "feedback": "fine"}']})
    before = checkout_snapshot(scratch_repo)

    result = loopdsl.run(LOOPS_DIR / "changelog-drafter.yaml", {}, provider=provider,
                         store=tmp_path / "store", workdir=scratch_repo, publish=False)

    assert result.status == "completed", result.events[-3:]
    assert result.outputs["since"] == "" and result.outputs["commits"] == 2
    changelog = git(scratch_repo, "show", f"{result.outputs['branch']}:CHANGELOG.md")
    assert changelog.startswith("# Changelog\n\n## Unreleased (")
    assert f"({second[:7]})" in changelog and f"({first[:7]})" in changelog
    assert checkout_snapshot(scratch_repo) == before
