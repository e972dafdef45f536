"""The commands people know from other loop tools: `validate --strict`, `init --name NAME`,
`cost --pattern NAME --cadence hourly|daily|weekly|per-pr`. The `validate` cases run as real
`loopdsl` processes; the others through the same command group in-process (tests/cli_in_process.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import cli_in_process

from loopdsl.project.init import find_pattern
from cli_forked import loopdsl_command

DATA = Path(__file__).resolve().parents[1] / "data"


def loopdsl_process(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "NO_COLOR": "1"})


def loopdsl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return cli_in_process(args, cwd, {"NO_COLOR": "1"})


def test_validate_accepts_strict_and_is_strict_either_way() -> None:
    warning_only = str(DATA / "err" / "secret_in_prompt.yaml")
    clean = str(DATA / "ok" / "unknown_state.yaml")
    for extra in ([], ["--strict"]):
        warned = loopdsl_process("validate", *extra, warning_only)
        assert warned.returncode == 1, warned.stderr
        assert "[secret-in-prompt]" in warned.stdout + warned.stderr
        ok = loopdsl_process("validate", *extra, clean)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "always strict" in loopdsl_process("validate", "--help").stdout


@pytest.mark.slow
def test_init_name_names_the_loop_its_files_and_its_test_still_passes(tmp_path: Path) -> None:
    made = loopdsl("init", "proj", "--pattern", "daily-triage", "--name", "repo-triage",
                   "--pip-spec", "loopdsl==0.1.0", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    project = tmp_path / "proj"
    loops = project / "loops"
    assert sorted(p.name for p in loops.glob("*.yaml")) == ["repo-triage.test.yaml", "repo-triage.yaml"]
    assert (loops / "scripts" / "repo-triage.replies.yaml").is_file()
    assert "\nname: repo-triage\n" in (loops / "repo-triage.yaml").read_text()
    test_text = (loops / "repo-triage.test.yaml").read_text()
    assert "\nloop: repo-triage.yaml\n" in test_text and "\nscript: scripts/repo-triage.replies.yaml\n" in test_text
    assert "--name repo-triage" in (project / "README.md").read_text()
    linted = loopdsl("lint", "--strict", "loops", cwd=project)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    tested = loopdsl("test", cwd=project)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "PASS  loops/repo-triage.test.yaml" in tested.stdout
    shown = loopdsl("schedule", "loops/repo-triage.yaml", "-n", "1", cwd=project)
    assert shown.returncode == 0 and shown.stdout.startswith("repo-triage: "), shown.stderr


def test_init_name_refuses_a_name_the_language_refuses(tmp_path: Path) -> None:
    bad = loopdsl("init", "proj", "--pattern", "daily-triage", "--name", "Repo_Triage", "--pip-spec", "loopdsl==0.1.0",
                  cwd=tmp_path)
    assert bad.returncode == 2
    assert "loopdsl: error: --name 'Repo_Triage' is not a loop name" in bad.stderr
    assert "hint:" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "proj").exists()


@pytest.mark.parametrize("cadence, runs", [("hourly", 720), ("daily", 30), ("weekly", 30 / 7)])
def test_cost_of_a_bundled_pattern_without_scaffolding(cadence: str, runs: float, tmp_path: Path) -> None:
    by_pattern = loopdsl("cost", "--pattern", "daily-triage", "--cadence", cadence, "--format", "json", cwd=tmp_path)
    assert by_pattern.returncode == 0, by_pattern.stderr
    assert list(tmp_path.iterdir()) == []  # nothing scaffolded
    by_file = loopdsl("cost", str(find_pattern("daily-triage").path), "--cadence", cadence, "--format", "json", cwd=tmp_path)
    pattern_report, file_report = json.loads(by_pattern.stdout), json.loads(by_file.stdout)
    assert pattern_report == file_report
    assert pattern_report["runs_per_month"] == pytest.approx(runs)


def test_cost_per_pr_counts_one_run_per_pull_request(tmp_path: Path) -> None:
    done = loopdsl("cost", "--pattern", "pr-babysitter", "--cadence", "per-pr", "--prs-per-month", "40",
                   "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs_per_month"] == 40
    text = loopdsl("cost", "--pattern", "pr-babysitter", "--cadence", "per-pr", "--prs-per-month", "40", cwd=tmp_path)
    assert "40 runs (--cadence per-pr, one run per pull request, 40 a month)" in text.stdout


@pytest.mark.parametrize("args, message", [
    (["--pattern", "pr-babysitter", "--cadence", "per-pr"], "--cadence per-pr and --prs-per-month N go together"),
    (["--pattern", "daily-trage"], "no bundled pattern named 'daily-trage' (did you mean 'daily-triage'?)"),
    ([], "give a loop file or --pattern NAME"),
])
def test_cost_pattern_mistakes_are_usage_errors(args: list[str], message: str, tmp_path: Path) -> None:
    done = loopdsl("cost", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert f"loopdsl: error: {message}" in done.stderr
    assert "hint:" in done.stderr and "Traceback" not in done.stderr
