"""The pre-commit hooks, run for real by pre-commit on a scratch git repository.

pre-commit installs the hook repository into a fresh virtualenv (pip, with the whole
dependency set: about 70 s here even from pip's cache). The hook repository is a
committed copy of this checkout's working tree, so the test checks the files as they
are now, committed or not. `pre-commit try-repo` keeps its environments in a temporary
store of its own (it ignores PRE_COMMIT_HOME) and so reinstalls on every call; we run it
once, as a user trying the hooks would, and do the other runs through a
.pre-commit-config.yaml, which reuses the environment installed under PRE_COMMIT_HOME.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from outer_env import sitecustomize_dir

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
pytestmark = pytest.mark.slow

# What the hook repository needs to install; tests and benchmarks are left out.
_SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "tests", "bench", "__pycache__", "*.egg-info", ".loopdsl",
                               ".pytest_cache")


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"})


def snapshot_of_this_checkout(target: Path) -> Path:
    shutil.copytree(REPO, target, ignore=_SKIP)
    git(target, "init", "-q")
    git(target, "add", "-A")
    git(target, "commit", "-q", "-m", "snapshot")
    return target


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("pre-commit") is None:
        pytest.fail("pre-commit is not installed (pip install pre-commit): it is a test dependency")
    return snapshot_of_this_checkout(tmp_path_factory.mktemp("hook") / "loopdsl")


def pre_commit(project: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The hook environment is a real virtualenv with our package pip-installed into it, as
    # for any user; its dependencies come from the site-packages of the interpreter running
    # the tests (installed with `pip install .[test]`; a sitecustomize.py on PYTHONPATH adds
    # them after the hook environment's own, see tests/outer_env.py) instead of PyPI, which
    # turns a multi-minute install of LiteLLM's dependency tree into seconds. The package is
    # built without build isolation (pip reads PIP_NO_BUILD_ISOLATION=0 as --no-build-isolation),
    # with the outer setuptools, as tests/project/test_install_source.py installs it: an isolated
    # build installed setuptools afresh for each environment (3 of its 14 CPU-s).
    env = {**os.environ, "PRE_COMMIT_HOME": str(home), "PRE_COMMIT_COLOR": "never", "PIP_NO_DEPS": "1",
           "PIP_NO_BUILD_ISOLATION": "0", "PYTHONPATH": str(sitecustomize_dir(home.parent / "outer-site"))}
    env.pop("VIRTUAL_ENV", None)
    env.pop("VIRTUALENV_SYSTEM_SITE_PACKAGES", None)
    return subprocess.run(["pre-commit", *args], cwd=project, capture_output=True, text=True, env=env, timeout=900)


def configure(project: Path, hook_repo: Path) -> None:
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=hook_repo, capture_output=True, text=True,
                         check=True).stdout.strip()
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {hook_repo}\n    rev: {rev}\n    hooks:\n"
        "      - id: loopdsl-lint\n      - id: loopdsl-validate\n"
    )


def test_hooks_fail_on_a_bad_loop_and_pass_once_fixed(tmp_path: Path, hook_repo: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    git(project, "init", "-q")
    (project / "loops").mkdir()
    shutil.copy(DATA / "ok" / "unknown_state.yaml", project / "loops" / "good.yaml")
    shutil.copy(DATA / "err" / "unknown_state.yaml", project / "loops" / "bad.yaml")
    # YAML that is not a loop must not trip the hook.
    (project / "ci.yml").write_text("on: push\njobs: {test: {runs-on: ubuntu-latest}}\n")
    (project / "chart.yaml").write_text("image: {{ .Values.image }}\n")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "loops")
    home = tmp_path / "pre-commit-home"

    failing = pre_commit(project, home, "try-repo", str(hook_repo), "loopdsl-lint", "--all-files")
    output = failing.stdout + failing.stderr
    assert failing.returncode == 1, output
    assert 'loops/bad.yaml:10:11: error: next of state "draft" names unknown state "dnoe"' in output
    assert "good.yaml:" not in output and "ci.yml:" not in output and "chart.yaml:" not in output

    configure(project, hook_repo)
    shutil.copy(DATA / "ok" / "unknown_state.yaml", project / "loops" / "bad.yaml")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "fix")
    passing = pre_commit(project, home, "run", "loopdsl-lint", "--all-files")
    assert passing.returncode == 0, passing.stdout + passing.stderr
    assert "Passed" in passing.stdout

    # validate is lint --strict: a warning (a secret in a prompt) fails it, not lint.
    shutil.copy(DATA / "err" / "secret_in_prompt.yaml", project / "loops" / "warn.yaml")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "warning")
    assert pre_commit(project, home, "run", "loopdsl-lint", "--all-files").returncode == 0
    strict = pre_commit(project, home, "run", "loopdsl-validate", "--all-files")
    assert strict.returncode == 1 and "[secret-in-prompt]" in strict.stdout + strict.stderr
