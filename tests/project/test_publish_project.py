"""`publish:` in the project tools: `run --dry-run` says what a loop would publish and after
which ends; `loopdsl test` renders and checks a loop's writes (never makes them)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from loopdsl.lint.pipeline import load_loop
from loopdsl.project.dry_run import dry_run
from cli_forked import loopdsl_command


def test_the_dry_run_names_the_writes_and_when() -> None:
    loop = load_loop(Path(__file__).resolve().parents[1] / "data" / "ok" / "publish.yaml")
    report = dry_run(loop)
    assert report.to_json()["publish"] == ["pull request of branch loopdsl/fixes", "issue", "comment on issue",
                                           "labels on pull request", "review (COMMENT)"]
    assert "publishes to GitHub after done (not in a dry run): pull request of branch loopdsl/fixes; issue" \
        in report.to_text()


LOOP = """\
loopdsl: 1
name: reporter
secrets: [GITHUB_TOKEN]
start: look
states:
  look:
    shell: "echo '{\\"count\\": 3}'"
    next: done
  done: {end: completed}
publish:
  issue: {title: "TITLE", body: "counted by a loop"}
"""


def test_loop_tests_check_the_publish_templates_and_write_nothing(tmp_path: Path) -> None:
    for name, title in (("good", "{{ look.stdout | trim }} things"), ("bad", "{{ look.json_missing.count }}")):
        (tmp_path / f"{name}.yaml").write_text(LOOP.replace("TITLE", title))
        (tmp_path / f"{name}.test.yaml").write_text(f"loop: {name}.yaml\nexpect: {{status: completed}}\n")
    # No GITHUB_REPOSITORY nor token: a test never reaches GitHub, so it needs neither.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([*loopdsl_command(), "test", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines()[-1] == "1 passed, 1 failed", done.stdout + done.stderr
    [good] = [line for line in done.stdout.splitlines() if "good.test.yaml" in line]
    [bad] = [line for line in done.stdout.splitlines() if "bad.test.yaml" in line]
    assert good.startswith("PASS") and bad.startswith("FAIL")
    assert "error: publish: nothing was written to GitHub: issue.title: undefined" in done.stdout
    assert "internal error" not in done.stdout
