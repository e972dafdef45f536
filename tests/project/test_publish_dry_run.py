"""`loopdsl run --dry-run` says what a loop would publish to GitHub, and after which ends."""
from __future__ import annotations

from pathlib import Path

from loopdsl.lint.pipeline import load_loop
from loopdsl.project.dry_run import dry_run


def test_the_dry_run_names_the_writes_and_when() -> None:
    loop = load_loop(Path(__file__).resolve().parents[1] / "data" / "ok" / "publish.yaml")
    report = dry_run(loop)
    assert report.to_json()["publish"] == ["pull request of branch loopdsl/fixes", "issue", "comment on issue",
                                           "labels on pull request", "review (COMMENT)"]
    assert "publishes to GitHub after done (not in a dry run): pull request of branch loopdsl/fixes; issue" \
        in report.to_text()
