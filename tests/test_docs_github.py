"""docs/github.md runs: its bash blocks (but the two that need GitHub) in sequence, in a fresh
folder, with real git and the `loopdsl` command; then what they left is checked: the approved
fix on the run's branch of the bare "GitHub" repository, the store on loopdsl-runs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_forked import loopdsl_bin
from test_docs_shell import shell_blocks

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "github.md"


@pytest.mark.slow
def test_the_github_walkthrough_runs(tmp_path: Path) -> None:
    text = DOC.read_text(encoding="utf-8")
    blocks = shell_blocks(text)
    assert text.count("<!-- no-test -->\n```bash") == 2 and len(blocks) == 5
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOOPDSL_", "OPENAI", "ANTHROPIC", "GITHUB_", "GIT_"))}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", PYTHONPATH=str(ROOT),
               PATH=os.pathsep.join([str(loopdsl_bin()), str(Path(sys.executable).parent), env.get("PATH", "")]))
    done = subprocess.run(["bash", "--noprofile", "--norc", "-c", "set -e\n" + "\n".join(blocks) + "\n"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "-    return sum(values) // len(values)" in done.stdout
    assert "+    return sum(values) / len(values)" in done.stdout
    origin = tmp_path / "origin.git"
    stored = subprocess.run(["git", "ls-tree", "-r", "--name-only", "loopdsl-runs"], cwd=origin, env=env,
                            capture_output=True, text=True, check=True).stdout.split()
    # The run completed: its worktree is no longer carried, its store is.
    assert "ci-sweeper/cache.db" in stored and not any("carried-worktrees" in name for name in stored)
    workflow = tmp_path / "calc-demo" / ".github" / "workflows" / "loopdsl-ci-sweeper.yml"
    assert "workflow_run:" in workflow.read_text()
    assert "pull_request_review:\n    types:\n      - submitted" in done.stdout  # a review decides the run too
