"""One walk for every command: `lint` and `lock` skip virtual environments, vendored
packages and caches alike (`lock` once pinned loops found under `.venv/`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cli_in_process import cli_in_process
from cli_forked import loopdsl_command

ROOT = Path(__file__).resolve().parents[2]
LOOP = """\
loopdsl: 1
name: solo
start: done
states:
  done: {end: completed}
"""


def _loopdsl(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*loopdsl_command(), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_lock_and_lint_skip_venvs_vendored_packages_and_caches(tmp_path: Path) -> None:
    (tmp_path / "loops").mkdir()
    (tmp_path / "loops" / "solo.yaml").write_text(LOOP)
    for hidden in (".venv/lib/pkg", "node_modules/pkg", "loops/.mypy_cache", ".hg"):
        (tmp_path / hidden).mkdir(parents=True)
        # Broken on purpose: linting any of these would report an error.
        (tmp_path / hidden / "vendored.yaml").write_text("loopdsl: 1\nname: [\n")
    locked = _loopdsl(tmp_path, "lock", ".")
    assert locked.returncode == 0, locked.stderr
    assert "(1 loop(s))" in locked.stdout
    linted = cli_in_process(["lint", "."], cwd=tmp_path)  # the answer only; `lock` above is a real process
    assert linted.returncode == 0, linted.stdout + linted.stderr
    assert "0 errors, 0 warnings in 1 file" in linted.stderr


def test_lock_never_writes_through_a_link_out_of_its_folder(tmp_path: Path) -> None:
    (tmp_path / "loops").mkdir()
    (tmp_path / "loops" / "solo.yaml").write_text(LOOP)
    precious = tmp_path.parent / f"{tmp_path.name}-precious"
    precious.write_text("mine\n")
    (tmp_path / "loopdsl.lock").symlink_to(precious)
    refused = cli_in_process(["lock", "."], cwd=tmp_path)
    assert refused.returncode == 2 and "is a symbolic link to" in refused.stderr and "nothing was written" in refused.stderr
    assert precious.read_text() == "mine\n"
    (tmp_path / "loopdsl.lock").unlink()
    assert cli_in_process(["lock", "."], cwd=tmp_path).returncode == 0
    assert '"loops/solo.yaml"' in (tmp_path / "loopdsl.lock").read_text()
