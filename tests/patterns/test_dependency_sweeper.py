"""dependency-sweeper end to end: bumps one at a time; an agent (scripted, with real tools on the
run's worktree) repairs what one bump breaks and declines another, which is reverted; the rest committed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

import loopdsl

from .conftest import (
    LOOPS_DIR,
    checkout_snapshot,
    commit_file,
    git,
    run_loop,
)
from cli_forked import loopdsl_command

LOOP = LOOPS_DIR / "dependency-sweeper.yaml"
CHILD = LOOPS_DIR / "parts" / "dependency-bump.yaml"
TEST_COMMAND = "python3 check_pins.py"

REQUIREMENTS = "# runtime\nrequests==2.31.0\nsix==1.15.0\nidna==3.4  # transitive, pinned\ntinyfmt==1.0.0\npytest>=7\n"
# The project's "test suite": no network, no install; it refuses a requests major it cannot
# use, then runs the app with the pinned tinyfmt (vendored, one folder per version).
CHECK_PINS = '''"""This project uses requests 2.x APIs: refuse any other major version. Then the app must
work with the pinned tinyfmt."""
import re
import sys

pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\\S+)", open("requirements.txt").read(), re.M))
if int(pins["requests"].split(".")[0]) != 2:
    sys.exit(f"requests {pins['requests']} is not supported: this project needs requests 2.x")
sys.path.insert(0, f"vendor/tinyfmt-{pins['tinyfmt']}")
import app  # noqa: E402

assert app.price_label(1999) == "Price: $19.99", app.price_label(1999)
print("pins ok:", ", ".join(f"{k}=={v}" for k, v in sorted(pins.items())))
'''
APP = 'from tinyfmt import fmt_money\n\n\ndef price_label(cents):\n    return "Price: " + fmt_money(cents)\n'
TINYFMT_1 = 'def fmt_money(cents):\n    return "$%.2f" % (cents / 100)\n'
# 2.0.0 renamed fmt_money: bumping it breaks app.py until app.py is adapted.
TINYFMT_2 = 'def format_money(cents, currency="$"):\n    return "%s%.2f" % (currency, cents / 100)\n'
OUTDATED = [
    {"name": "requests", "current": "2.31.0", "latest": "3.0.0"},
    {"name": "six", "current": "1.15.0", "latest": "1.16.0"},
    {"name": "IDNA", "current": "3.4", "latest": "3.7"},      # name spelt differently: still matched
    {"name": "tinyfmt", "current": "1.0.0", "latest": "2.0.0"},
    {"name": "flask", "current": "2.0.0", "latest": "3.0.0"},  # not in the manifest: ignored
]


def pinned_project(repo: Path) -> str:
    commit_file(repo, "requirements.txt", REQUIREMENTS, "pin dependencies")
    commit_file(repo, "vendor/tinyfmt-1.0.0/tinyfmt.py", TINYFMT_1, "vendor tinyfmt 1.0.0")
    commit_file(repo, "vendor/tinyfmt-2.0.0/tinyfmt.py", TINYFMT_2, "vendor tinyfmt 2.0.0")
    commit_file(repo, "app.py", APP, "price labels")
    commit_file(repo, "check_pins.py", CHECK_PINS, "check the pins")
    return git(repo, "rev-parse", "HEAD").strip()


def repair_calls(result: Any) -> list[tuple[str, str, bool]]:
    """(child run, tool, ok) of every repair tool call, from the events sub-loops forward."""
    return [(e["run_id"].rsplit("/", 1)[-1], e["event"]["name"], e["event"]["ok"]) for e in result.events
            if e["type"] == "child" and e["event"]["type"] == "tool_call"]


def test_failing_bump_is_reverted_and_the_rest_committed(scratch_repo: Path, tmp_path: Path) -> None:
    base = pinned_project(scratch_repo)
    # An untracked file in the user's checkout, found through the main checkout's path.
    (scratch_repo / "outdated.json").write_text(json.dumps(OUTDATED))
    before = checkout_snapshot(scratch_repo)

    result = run_loop("dependency-sweeper", scratch_repo, tmp_path / "store",
                      {"outdated_file": "outdated.json", "test_command": TEST_COMMAND})

    assert result.status == "completed", result.state.error
    assert result.path == ["find_outdated", "plan", "bump_each", "tally", "tidy", "summarise", "approve", "done"]
    assert (result.outputs["kept"], result.outputs["repaired"], result.outputs["reverted"]) == (
        "six idna tinyfmt", "tinyfmt", "requests")
    assert "Not kept (reverted): requests 2.31.0 -> 3.0.0" in result.outputs["summary"]
    children = result.state.results["bump_each"]["items"]
    assert [(c["status"], c["outputs"]["name"], c["outputs"]["kept"], c["outputs"]["repaired"]) for c in children] == [
        ("completed", "requests", "no", "no"), ("completed", "six", "yes", "no"), ("completed", "idna", "yes", "no"),
        ("completed", "tinyfmt", "yes", "yes")]
    assert "this project needs requests 2.x" in children[0]["outputs"]["detail"]
    assert "The agent: check_pins.py refuses requests 3.x on purpose" in children[0]["outputs"]["detail"]
    assert "after the agent's repair: tinyfmt 2.0.0 renamed fmt_money" in children[3]["outputs"]["detail"]
    # The agent ran only where the tests failed, and its tools really ran in the worktree.
    assert repair_calls(result) == [("0", "read_file", True), ("3", "search_files", True), ("3", "read_file", True),
                                    ("3", "edit_file", True), ("3", "edit_file", True), ("3", "run_tests", True)]

    run_branch = f"loopdsl/{result.run_id}"
    assert git(scratch_repo, "rev-list", "--parents", "-n", "1", run_branch).split()[1] == base
    assert git(scratch_repo, "diff", "--name-only", base, run_branch).split() == ["app.py", "requirements.txt"]
    assert git(scratch_repo, "show", f"{run_branch}:requirements.txt") == (
        "# runtime\nrequests==2.31.0\nsix==1.16.0\nidna==3.7  # transitive, pinned\ntinyfmt==2.0.0\npytest>=7\n")
    assert git(scratch_repo, "show", f"{run_branch}:app.py") == APP.replace("fmt_money", "format_money")
    # The committed pins and the repair pass the project's check; the reverted one would not.
    exported = tmp_path / "branch"
    exported.mkdir()
    archive = subprocess.run(["git", "archive", run_branch], cwd=scratch_repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(exported)], input=archive, check=True)
    assert subprocess.run(TEST_COMMAND.split(), cwd=exported, capture_output=True, check=False).returncode == 0
    assert git(scratch_repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert checkout_snapshot(scratch_repo) == before


def test_pip_format_with_every_bump_failing_keeps_nothing(scratch_repo: Path, tmp_path: Path) -> None:
    base = pinned_project(scratch_repo)
    # pip list --outdated --format json, as outdated_command would print it (the command is an
    # enum of pip invocations, so the test hands the same JSON over as a file).
    pip_json = tmp_path / "outdated.json"
    pip_json.write_text(json.dumps([{"name": "requests", "version": "2.31.0", "latest_version": "3.1.0",
                                     "latest_filetype": "wheel"}]))
    script = tmp_path / "replies.yaml"
    YAML(typ="safe").dump({"repair": ['{"repaired": false, "summary": "requests 3 is refused by policy"}'],
                           "summarise": [{"text": "Kept (tests pass): none.\nNot kept (reverted): requests "
                                          "2.31.0 -> 3.1.0: needs requests 2.x."}]}, script)
    before = checkout_snapshot(scratch_repo)

    result = loopdsl.run(LOOP, {"outdated_file": str(pip_json), "test_command": TEST_COMMAND},
                         script=script, store=tmp_path / "store", workdir=scratch_repo, publish=False)

    assert result.status == "completed", result.state.error
    assert result.path == ["find_outdated", "plan", "bump_each", "tally", "tidy", "summarise", "nothing_kept"]
    assert (result.outputs["kept"], result.outputs["reverted"]) == ("", "requests")
    assert git(scratch_repo, "rev-parse", f"loopdsl/{result.run_id}").strip() == base   # nothing committed
    assert checkout_snapshot(scratch_repo) == before


def test_a_repair_that_undoes_the_bump_is_reverted_with_every_edit(scratch_repo: Path, tmp_path: Path) -> None:
    base = pinned_project(scratch_repo)
    (tmp_path / "outdated.json").write_text(json.dumps([OUTDATED[3]]))
    script = tmp_path / "replies.yaml"
    YAML(typ="safe").dump({
        "repair": [
            # Attempt 1: edits app.py, then "repairs" by pinning tinyfmt back: the pin-kept gate refuses.
            {"tool_calls": [{"name": "edit_file", "args": {"path": "app.py", "old": "Price: ", "new": "Cost: "}},
                            {"name": "edit_file", "args": {"path": "requirements.txt", "old": "tinyfmt==2.0.0",
                                                           "new": "tinyfmt==1.0.0"}},
                            {"name": "run_tests", "args": {}}]},
            '{"repaired": true, "summary": "pinned tinyfmt back"}',
        ],
        "summarise": [{"text": "Kept (tests pass): none.\nNot kept (reverted): tinyfmt 1.0.0 -> 2.0.0."}],
    }, script)
    before = checkout_snapshot(scratch_repo)

    result = loopdsl.run(LOOP, {"outdated_file": str(tmp_path / "outdated.json"), "test_command": TEST_COMMAND},
                         script=script, store=tmp_path / "store", workdir=scratch_repo, publish=False)

    assert result.status == "completed", result.state.error
    assert (result.outputs["kept"], result.outputs["reverted"]) == ("", "tinyfmt")
    assert repair_calls(result) == [("0", "edit_file", True), ("0", "edit_file", True), ("0", "run_tests", False)]
    child = result.state.results["bump_each"]["items"][0]
    assert child["outputs"]["kept"] == "no"
    # The failed repair's edits went with the bump: nothing of it is left to commit.
    assert git(scratch_repo, "rev-parse", f"loopdsl/{result.run_id}").strip() == base
    assert checkout_snapshot(scratch_repo) == before


def test_up_to_date_pins_end_without_a_model_call(scratch_repo: Path, tmp_path: Path) -> None:
    pinned_project(scratch_repo)
    current = [{"name": "six", "current": "1.15.0", "latest": "1.15.0"}]
    (tmp_path / "outdated.json").write_text(json.dumps(current))
    result = run_loop("dependency-sweeper", scratch_repo, tmp_path / "store",
                      {"outdated_file": str(tmp_path / "outdated.json"), "test_command": TEST_COMMAND})
    assert result.status == "completed"
    assert result.path == ["find_outdated", "plan", "up_to_date"]
    assert result.tokens == 0


def test_a_missing_manifest_is_a_clear_failure(scratch_repo: Path, tmp_path: Path) -> None:
    pinned_project(scratch_repo)
    result = run_loop("dependency-sweeper", scratch_repo, tmp_path / "store",
                      {"manifest": "requirements/base.txt", "outdated_file": "x.json"})
    assert result.status == "failed" and result.path == ["find_outdated"]
    assert "manifest 'requirements/base.txt' is not in the repository" in result.state.error["message"]


def test_lint_passes_with_one_known_warning() -> None:
    """The repair agent's failure path reverts the bump (a shell state lint cannot see into)
    before the child completes; the sweeper's own checkpoint comes after every bump."""
    completed = subprocess.run([*loopdsl_command(), "lint", str(LOOP), str(CHILD)],
                               capture_output=True, text=True, check=False)
    out = completed.stdout + completed.stderr
    assert completed.returncode == 0, out
    assert "0 errors, 1 warning in 2 files" in out and "[agent-unreviewed]" in out
